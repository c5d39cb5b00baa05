"""Run the validation matrix and write docs/validation.md (predicted vs measured).

    .venv/bin/python scripts/validation_report.py
    .venv/bin/python scripts/validation_report.py --only-transformers   # that section only
"""

from __future__ import annotations

import platform
import sys
import time
from pathlib import Path

import torch

from trainplan.plan import make_plan
from trainplan.validate.matrix import sharded_plans, single_process_plans
from trainplan.validate.run import validate

TERMS = ("params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "flops")
HEAD = "| case | params | grads | optimizer | activations | FLOPs |\n|---|---:|---:|---:|---:|---:|\n"


def fmt(err):
    return "—" if err is None else f"{err * 100:+.2f}%"


def row(label, case):
    return f"| {label} | " + " | ".join(fmt(case["rel_error"].get(t)) for t in TERMS) + " |\n"


ASSUMPTIONS = [
    "\n## What the memory model assumes (and these runs confirm)\n\n",
    "See [memory-model.md](memory-model.md). Implementation details that matter, each found by\n",
    "these measurements: PyTorch's SDPA output is reused by the output projection (no copy);\n",
    "eager RMSNorm (transformers, `F.rms_norm` on CPU) upcasts and keeps fp32 copies; under\n",
    "`torch.autocast` every linear keeps its own 16-bit cast of a shared input and the weight\n",
    "casts are saved, except inside fully recomputed layers; on the CPU dropout masks have the\n",
    "input's dtype and, with dropout, attention runs materialised (no CPU kernel takes dropout);\n",
    "an eager `index_add` MoE combine keeps its source, transformers' grouped experts neither that\n",
    "nor autocast's casts; an activation function written as separate ops (`gelu_new`, `gelu_fast`)\n",
    "keeps a tensor per op; DTensor's vocabulary-parallel embedding returns a replicated gradient.\n",
]


def transformers_section() -> list[str]:
    """The `--impl transformers` section (empty without transformers): each catalog model built as
    a transformers model of its family, and the config.json files of tests/data/hf as written."""
    try:
        import transformers
    except ImportError:
        return []
    rows = []
    for model in ("llama-3-8b", "qwen2.5-7b", "gpt2", "gpt-neox-20b", "mixtral-8x7b", "qwen1.5-moe-a2.7b"):
        for attention in ("flash", "eager"):
            kw = dict(model=model, gpus=1, attention=attention, precision="fp32", framework="torch")
            case = validate(make_plan(**kw), device="cpu", impl="transformers")["cases"][0]
            rows.append(row(f"{model} · {attention} · fp32", case))
    data = Path(__file__).resolve().parents[1] / "tests" / "data" / "hf"
    for name in ("gpt2-xl", "gpt-neox-20b", "mixtral-8x7b", "qwen1.5-moe-a2.7b", "qwen3-30b-a3b"):
        kw = dict(model=str(data / f"{name}.json"), gpus=1, precision="fp32", framework="torch")
        case = validate(make_plan(**kw), device="cpu", impl="transformers")["cases"][0]
        rows.append(row(f"{name} config.json · flash · fp32", case))
    return [f"\n## Hugging Face transformers {transformers.__version__} models (`--impl transformers`)\n\n",
            "The same comparison for `AutoModelForCausalLM.from_config` models with random weights: the\n",
            "catalog models as a config of their family, and published config.json files as written\n",
            "(sizes scaled). Each runs its own activation function (GPT-2 `gelu_new`, GPT-NeoX\n",
            "`gelu_fast` with its parallel residual) and the library's default experts implementation\n",
            "(`grouped_mm`), called for training without the inference KV cache. The remaining gaps are\n",
            "implementation details of transformers not in the memory model: its eager attention builds\n",
            "float masks, and GPT-NeoX rotates only a quarter of each head (`rotary_pct`), priced as a\n",
            "full rotation.\n\n", HEAD, *rows]


def only_transformers(path: Path) -> None:
    """Rewrite the transformers section (and the closing notes) of an existing report, leaving the
    matrices as they are."""
    t0 = time.time()
    text = path.read_text()
    start = text.index("\n## Hugging Face transformers")
    path.write_text(text[:start] + "".join(transformers_section()) + "".join(ASSUMPTIONS))
    print(f"rewrote the transformers section of {path} ({time.time() - t0:.0f} s)")


def main() -> None:
    path = Path(__file__).resolve().parents[1] / "docs" / "validation.md"
    if "--only-transformers" in sys.argv[1:]:
        only_transformers(path)
        return
    t0 = time.time()
    single, worst = [], {t: 0.0 for t in TERMS}
    for kw in single_process_plans():
        case = validate(make_plan(**kw), device="cpu")["cases"][0]
        label = f"{kw['model']} · {kw['attention']} · recompute {kw['recompute']} · {kw['precision']}/{kw['framework']}"
        single.append(row(label, case))
        for t, e in case["rel_error"].items():
            worst[t] = max(worst[t], abs(e))
    sharded, notes = [], set()
    for label, kw in sharded_plans():
        for i, case in enumerate(validate(make_plan(**kw), device="cpu")["cases"]):
            sharded.append(row(f"{kw['model']} · {label} · rank {i}", case))
            notes.update(case.get("notes", []))
    hf = transformers_section()
    elapsed = time.time() - t0
    out = [
        "# Validation: predicted vs measured\n\n",
        "Generated by `scripts/validation_report.py` (do not edit by hand). Each case builds the\n",
        "plan's model in PyTorch (scaled down to 2 layers, hidden 256, vocabulary 512, sequence 256,\n",
        "at most 8 experts; same structure), runs one training step on the CPU and compares the\n",
        "planner's per-GPU prediction with what was measured: parameter, gradient and optimizer-state\n",
        "bytes after a real optimizer step, bytes saved for backward (distinct storages,\n",
        "parameters excluded, logits and loss included), and FLOPs from `FlopCounterMode`.\n",
        "Error = predicted / measured − 1.\n\n",
        f"Machine: {platform.machine()} CPU, torch {torch.__version__}; {len(single)} single-process cases\n",
        f"and {len(sharded)} sharded rank results in {elapsed:.0f} s.\n\n",
        "Largest |error| over the single-process matrix: "
        + ", ".join(f"{t.replace('_bytes', '')} {worst[t] * 100:.2f}%" for t in TERMS) + ".\n\n",
        "## One process: architecture x attention x recompute x precision recipe\n\n", HEAD, *single,
        "\n## Sharded layouts (local gloo processes, one row per rank)\n\n", HEAD, *sharded, "\n",
        *[f"* {n}\n" for n in sorted(notes)],
        *hf,
        *ASSUMPTIONS,
    ]
    path.write_text("".join(out))
    print(f"wrote {path} ({len(single)} + {len(sharded)} rows, {elapsed:.0f} s)")
    # the pipelines' section (scripts/pipeline_report.py)
    from pipeline_report import main as pipelines

    pipelines()
    # sequence and context parallelism (scripts/sp_cp_report.py)
    from sp_cp_report import main as sequence_and_context

    sequence_and_context()
    # context parallelism with torch's ring attention (scripts/cp_report.py)
    from cp_report import main as context_parallel

    context_parallel()
    # expert parallelism across ranks and ZeRO-2 as DeepSpeed and Megatron run it
    from ep_zero2_report import main as ep_zero2

    ep_zero2()
    # multi-head latent attention, LoRA through peft, QLoRA's base (scripts/mla_lora_report.py)
    from mla_lora_report import main as mla_lora

    mla_lora()


if __name__ == "__main__":
    main()
