#!/usr/bin/env bash
# The Debian packages the test suite runs for real, installed when missing (and nothing else):
#   chromium      the status page's browser test (tests/integration/test_status_page.py)
#   etcd-server   the cluster state's real server (clusterstate; tests start it on free ports)
# As root it runs apt-get itself; otherwise through sudo. The README's test command and .ci/run
# call it first, so the test command alone installs what the tests need on a fresh machine.
set -euo pipefail
missing=()
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-system-deps: ${missing[*]} missing and there is no apt-get: install them by hand" >&2
  exit 1
fi
sudo_=$([ "$(id -u)" = 0 ] || echo sudo)
echo "install-system-deps: installing ${missing[*]} (Debian packages) ..." >&2
# the package scripts must not try to start services (no init system in containers and CI)
export DEBIAN_FRONTEND=noninteractive
$sudo_ apt-get update -qq >/dev/null
$sudo_ apt-get install -y -qq "${missing[@]}" >/dev/null
