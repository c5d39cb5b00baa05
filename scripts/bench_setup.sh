#!/usr/bin/env bash
# The benchmarks' peer tools in an environment of their own (.venv-bench): llm-analysis pins
# huggingface-hub<0.15, which cannot share an environment with transformers 5.
# Usage: bash scripts/bench_setup.sh   (then: .venv/bin/python benchmarks/plan_speed.py)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv-bench/bin/python ] || "$PY" -m venv .venv-bench
.venv-bench/bin/python -m pip install -q --disable-pip-version-check 'llm-analysis==0.2.2'
