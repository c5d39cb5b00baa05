#!/usr/bin/env bash
# Set up a virtual environment with the test extras and run the linter and the test suite.
# Usage: bash scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# Browser tests drive Debian's Chromium (never a downloaded browser); CJK and emoji fonts make
# the Chinese screenshots legible. Installed when missing and this user may (CI runs as root),
# alongside the Python packages below (waited for before the tests).
apt_pid=
if [ ! -x /usr/bin/chromium ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  { apt-get update -qq >/dev/null && apt-get install -y -qq chromium fonts-noto-cjk fonts-noto-color-emoji >/dev/null; } &
  apt_pid=$!
fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
# PyTorch for the measured-activation tests: without a GPU its CPU build, from PyTorch's CPU
# wheel index (the default index's Linux wheel is the multi-GB CUDA build), unless pip is
# configured with a source of its own (find-links or an index: a local build, a mirror), which
# is used as it is. TORCH_SPEC overrides the requirement, TORCH_INDEX_URL the index.
torch_from=()
if ! { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }; then
  if [ -n "${TORCH_INDEX_URL:-}" ]; then
    torch_from=(--index-url "$TORCH_INDEX_URL")
  # (pip's listing read whole before it is searched: `grep -q` stopping at the first match
  # would end pip with SIGPIPE, which pipefail reads as "no configuration")
  elif ! grep -qE '(find-links|index-url)=' <<<"$(.venv/bin/python -m pip config list 2>/dev/null)"; then
    torch_from=(--index-url https://download.pytorch.org/whl/cpu)
  fi
fi
# The installs are skipped when this virtual environment already has them for this
# pyproject.toml, this PyTorch requirement and this script's install commands (a stamp written
# after both succeed).
stamp=$(cat pyproject.toml scripts/test.sh <(echo "${TORCH_SPEC:-torch==2.13.0} ${torch_from[*]+"${torch_from[*]}"}") | sha256sum)
if [ "$(cat .venv/.trainplan-installed 2>/dev/null)" != "$stamp" ]; then
  .venv/bin/python -m pip install -q --disable-pip-version-check ${torch_from[@]+"${torch_from[@]}"} "${TORCH_SPEC:-torch==2.13.0}"
  # The frameworks the exports are checked against; DeepSpeed's CUDA ops stay unbuilt (DS_BUILD_OPS=0).
  DS_BUILD_OPS=0 .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[dev,hf,webtest,plot,triton,frameworks]'
  echo "$stamp" > .venv/.trainplan-installed
fi
.venv/bin/ruff check src tests benchmarks scripts
[ -z "$apt_pid" ] || wait "$apt_pid"
# Tests run on every core (pytest-xdist; PYTEST_WORKERS=1 runs them in one process); slow
# ones (browser, PyTorch) are marked `slow` and run too (-m "not slow" leaves them out).
# pytest exits 5 when it collects no tests: that fails this script like any other failure.
.venv/bin/python -m pytest -q -p no:cacheprovider -n "${PYTEST_WORKERS:-auto}" --dist worksteal "$@"
