#!/usr/bin/env bash
# Run every test on its own, in its own pytest process (no state from any other test), and list
# the ones that fail. Slow (about 40 minutes on 2 cores: every module fixture starts again for
# each test), so not part of CI; run it after changing fixtures or test order assumptions.
#   bash scripts/each_test_alone.sh [PYTEST SELECTION ...]      e.g. tests/unit  or  -m slow
set -uo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
mapfile -t ids < <("$python" -m pytest --collect-only -q -p no:randomly "$@" | grep '::')
failed=()
for id in "${ids[@]}"; do
    if ! "$python" -m pytest -q -p no:randomly -x "$id" > /tmp/each_test_alone.log 2>&1; then
        failed+=("$id")
        echo "FAILED alone: $id"
        tail -20 /tmp/each_test_alone.log
    fi
done
echo "each test alone: ${#ids[@]} run, ${#failed[@]} failed"
[ ${#failed[@]} -eq 0 ]
