#!/usr/bin/env bash
# Run every `trainplan bench` suite at full size on a CUDA machine and write what the docs
# quote: docs/bench-<gpu>.md (the report), a calibrated profile, the figure, the JSON results,
# the SQLite store and, on a Hopper card, docs/accuracy-calibrated.md (the published H100 runs
# predicted with the measured profile). Uses the machine's own python3 with its CUDA PyTorch and Triton;
# trainplan runs from this checkout. pydantic, if that python lacks it, is installed from
# wheels in ./wheels (fetch them elsewhere first:
#   pip download pydantic --only-binary :all: --python-version 3.12 \
#       --platform manylinux2014_x86_64 -d wheels).
# Usage: bash scripts/bench_gpu.sh [CATALOG_GPU] [OUTPUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
GPU=${1:-H200-SXM}
OUT_DIR=${2:-${OUT:-bench-out}}
NAME=$(echo "$GPU" | tr '[:upper:]' '[:lower:]' | sed 's/-sxm$//')
PY=${PYTHON:-python3}
mkdir -p "$OUT_DIR" docs
if ! "$PY" -c "import pydantic" 2>/dev/null; then
  "$PY" -m pip install -q --no-index --find-links wheels pydantic
fi
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT_DIR/nvidia-smi.csv"
PYTHONPATH=src "$PY" -m trainplan bench --device cuda --gpu "$GPU" --model llama-3-8b --tokens 8192 \
  --report "docs/bench-$NAME.md" --profile "$OUT_DIR/$NAME.toml" --plot "$OUT_DIR/bench-$NAME.png" \
  --db "$OUT_DIR/bench.sqlite" --json > "$OUT_DIR/bench-$NAME.json"
cp "docs/bench-$NAME.md" "$OUT_DIR/"
# the published H100 runs predicted with this card's profile (Hopper cards share the H100's
# chip; a profile holds fractions of its own datasheet)
case "$GPU" in
  H100-SXM|H200-SXM|H800-SXM)
    PYTHONPATH=src "$PY" scripts/accuracy_report.py --profile "H100-SXM=$OUT_DIR/$NAME.toml"
    cp docs/accuracy-calibrated.md "$OUT_DIR/" ;;
esac
sed -n '/## Headline/,/^## gemm$/p' "docs/bench-$NAME.md"
