#!/usr/bin/env bash
# Regenerate the lock files from pyproject.toml with uv (pip install uv):
#   requirements/dev.lock      every extra CI installs (dev + answer): README's commands and .ci/run
#   requirements/runtime.lock  what the images need (answer): Dockerfile, Dockerfile.cuda
# torch is pinned to its CPU build (requirements/torch-cpu.txt); /opt/wheels is where this
# workplace keeps that wheel (elsewhere: --extra-index-url https://download.pytorch.org/whl/cpu).
set -euo pipefail
cd "$(dirname "$0")/.."
uv=${UV:-uv}
common=(pyproject.toml --python-version 3.11 --python-platform x86_64-unknown-linux-gnu
        --constraint requirements/torch-cpu.txt --find-links /opt/wheels --quiet)
"$uv" pip compile "${common[@]}" --extra dev --extra answer -o requirements/dev.lock
"$uv" pip compile "${common[@]}" --extra answer -o requirements/runtime.lock
echo "wrote requirements/dev.lock ($(grep -c '==' requirements/dev.lock) pins) and requirements/runtime.lock ($(grep -c '==' requirements/runtime.lock) pins)"
