"""The largest model of a Llama-style family each sharding strategy trains on a cluster."""

from __future__ import annotations

import numpy as np

from ..errors import PlanError
from ..plan import Plan, resolve, zero_stages

STRATEGIES = {
    "DDP": {"zero": 0, "tp": 1, "pp": 1},
    "ZeRO-1": {"zero": 1, "tp": 1, "pp": 1},
    "ZeRO-2": {"zero": 2, "tp": 1, "pp": 1},
    "ZeRO-3 / FSDP": {"zero": 3, "tp": 1, "pp": 1},
}


def family_model(hidden: int, vocab: int = 128256):
    """A Llama-style model of a given width: 128-wide heads, 8 KV groups, SwiGLU with
    ffn = 8/3·h rounded to 256, and depth h/128 (Kaplan et al. 2020's aspect ratio
    d_model/n_layers ≈ 128 is near-optimal across scales)."""
    from ..specs.model import ModelSpec

    heads = max(1, hidden // 128)
    return ModelSpec(name=f"llama-style h{hidden}", source="family scaling rule", layers=max(1, hidden // 128),
                     hidden=hidden, heads=heads, kv_heads=max(1, heads // 8) if heads % 8 == 0 else heads,
                     ffn=int(round(8 * hidden / 3 / 256) * 256), vocab=vocab, max_position=8192)


def max_model(plan: Plan, strategies: dict | None = None, hidden_step: int = 128, max_hidden: int = 65536) -> dict:
    """For each strategy, the widest family model whose plan fits (seed 000's question: how
    large a model can DDP and ZeRO-1/2/3 train on this cluster?). Memory grows with width, so
    a binary search over widths in steps of `hidden_step` finds it."""
    from ..estimate.memory import estimate_memory

    strategies = strategies or STRATEGIES
    gpus = plan.gpus or 8

    def fits(k: int, dims: dict) -> bool:
        spec = family_model(k * hidden_step)
        p = plan.model_copy(update={"gpus": gpus, "dp": None, "gbs": None, "stage_layers": None, **dims})
        try:
            layout = resolve(p, spec)
        except PlanError:
            return False
        return float(np.max(estimate_memory(layout)["total"])) <= layout.gpu.capacity_bytes

    out = []
    for name, dims in strategies.items():
        if dims.get("zero", plan.zero) not in zero_stages(plan.framework):
            continue  # a strategy the framework does not offer (FSDP has no ZeRO-1)
        lo, hi = 1, max_hidden // hidden_step
        if not fits(lo, dims):
            out.append({"strategy": name, "params": 0, "hidden": None, "layers": None})
            continue
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if fits(mid, dims):
                lo = mid
            else:
                hi = mid - 1
        best = family_model(lo * hidden_step)
        out.append({"strategy": name, "params": best.params, "hidden": best.hidden, "layers": best.layers})
    return {"gpus": gpus, "gpu": plan.gpu, "results": out}
