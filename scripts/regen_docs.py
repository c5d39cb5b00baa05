"""Regenerate the example outputs embedded in README.md from the real CLI.

Each block between `<!-- BEGIN name -->` and `<!-- END name -->` is replaced by the output
of its command. Run: .venv/bin/python scripts/regen_docs.py
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXE = Path(sys.executable).with_name("trainplan")

BLOCKS = {
    "plan-example": "trainplan plan --model llama-3-70b --gpu H100-SXM --gpus 64 --tp 8 --pp 4 --zero 1 "
                    "--sp --recompute selective --gbs 256 --seq-len 8192",
    "qlora-example": "trainplan plan --model llama-3-8b --gpu RTX-4090 --gpus 1 --finetune qlora "
                     "--seq-len 2048 --recompute full",
    "explain-example": "trainplan plan --model gpt2-xl --gpu V100 --gpus 1 --precision fp32 --attention eager --explain",
    "data-example": "trainplan plan --model gpt2 --gpu V100 --precision fp16 --attention eager --gpus 32 --gbs 1024 --mbs 16 "
                    "--seq-len 1024 --tokenize-rate 500000 --data-workers 1 --no-prefetch --h2d-gbs 15.75",
    "search-example": "trainplan search --model llama-3-70b --gpus 64 --gbs 256 --top 5",
    "compare-example": "trainplan search --model llama-3-70b --gpus 64 --gbs 512 --seq-len 8192 --objective cost "
                       "--compare-gpus H100-SXM,H200-SXM,B200,MI300X,A100-80GB-SXM,RTX-4090",
    "maxmodel-example": "trainplan search --max-model --gpu A100-80GB-SXM --gpus 8 --seq-len 2048 --recompute full",
    "export-example": "trainplan export --to torchtitan --model llama-3.1-8b --gpus 8 --zero 3 --gbs 64",
    "import-example": "trainplan plan --from tests/data/imports/megatron_train_mixtral_8x7b_distributed.sh --gpus 64 "
                      "--gpu H100-SXM",
    "bench-example": "trainplan bench gemm memory alignment recompute --quick --device cpu --gpu A100-80GB-SXM --model gpt2 --tokens 256 --no-save",
    "bench-kernels-example": "trainplan bench memory fusion tiling attention collectives --quick --device cpu --no-save",
    "validate-example": "trainplan validate --model llama-3-70b --gpus 2 --zero 3 --framework fsdp "
                        "--recompute full --device cpu",
}


def run(cmd: str) -> str:
    args = shlex.split(cmd)
    res = subprocess.run([str(EXE), *args[1:]], capture_output=True, text=True,
                         env={"COLUMNS": "140", "PATH": "/usr/bin:/bin", "TERM": "dumb"})
    if res.returncode not in (0,):
        raise SystemExit(f"{cmd} failed: {res.stderr}")
    return res.stdout.rstrip()


def main() -> None:
    readme = ROOT / "README.md"
    text = readme.read_text()
    for name, cmd in BLOCKS.items():
        body = f"```console\n$ {cmd}\n{run(cmd)}\n```"
        pattern = re.compile(rf"(<!-- BEGIN {name} -->\n)(?:.*?\n)?(<!-- END {name} -->)", re.S)
        if not pattern.search(text):
            raise SystemExit(f"README.md has no block {name}")
        text = pattern.sub(lambda m, body=body: m.group(1) + body + "\n" + m.group(2), text)
    readme.write_text(text)
    print(f"regenerated {len(BLOCKS)} blocks in README.md")


if __name__ == "__main__":
    main()
