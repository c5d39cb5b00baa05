#!/usr/bin/env bash
# Set up a virtual environment with the test extras and run the linter and the test suite.
# Usage: bash scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
# The CPU build of PyTorch for the measured-activation tests; override TORCH_SPEC elsewhere.
.venv/bin/python -m pip install -q --disable-pip-version-check "${TORCH_SPEC:-torch==2.13.0}"
# The frameworks the exports are checked against; DeepSpeed's CUDA ops stay unbuilt (DS_BUILD_OPS=0).
DS_BUILD_OPS=0 .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[dev,hf,webtest,plot,triton,frameworks]'
# Browser tests drive Debian's Chromium (never a downloaded browser); CJK and emoji fonts make
# the Chinese screenshots legible. Installed when missing and this user may (CI runs as root).
if [ ! -x /usr/bin/chromium ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  apt-get update -qq >/dev/null && apt-get install -y -qq chromium fonts-noto-cjk fonts-noto-color-emoji >/dev/null
fi
.venv/bin/ruff check src tests benchmarks scripts
# pytest exits 5 when it collects no tests: that fails this script like any other failure.
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
