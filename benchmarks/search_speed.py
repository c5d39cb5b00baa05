"""Search speed: layouts evaluated per second (one process) and wall time of whole searches.

Targets: at least 1,000,000 plans per second per core, and each search under 10 s wall.
(a) GPT-3 175B on 1024 A100, (b) Llama-3.1-405B on 16384 H100, with TP, PP, CP, DP,
micro-batch, recompute, ZeRO and schedule all free.

    .venv/bin/python benchmarks/search_speed.py
"""

from __future__ import annotations

import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

from trainplan.plan import load_model, make_plan  # noqa: E402
from trainplan.search import CHUNK, default_space, enumerate_layouts, evaluate_bulk, search  # noqa: E402

CASES = {
    "GPT-3 175B on 1024 x A100": dict(model="gpt3-175b", gpu="A100-80GB-SXM", gpus=1024, gbs=1536, seq_len=2048),
    "Llama-3.1-405B on 16384 x H100": dict(model="llama-3.1-405b", gpu="H100-SXM", gpus=16384, gbs=2048,
                                           seq_len=8192),
}


def _rate(plan, lay, gpus, model, fitting_only: bool) -> tuple[float, int]:
    """Layouts per second through `evaluate_bulk` in cache-sized batches, as `search` runs it."""
    n = len(lay["tp"])
    fits = 0
    t0 = time.perf_counter()
    for start in range(0, n, CHUNK):
        res = evaluate_bulk(plan, {k: v[start:start + CHUNK] for k, v in lay.items()}, gpus, model,
                            fitting_only=fitting_only)
        fits += int(res["fits"].sum())
    return n / (time.perf_counter() - t0), fits


def main() -> None:
    print("plans/s (all timed): memory and step time of every layout")
    print("plans/s (search):    memory of every layout, step time of those that fit (what `search` ranks)")
    print(f"{'case':<32s} {'layouts':>10s} {'fit':>8s} {'enumerate s':>12s} {'plans/s (all timed)':>20s} "
          f"{'plans/s (search)':>17s} {'search wall s':>14s}")
    for name, kw in CASES.items():
        plan = make_plan(**kw)
        model = load_model(plan)
        space = default_space(plan, set(), kw["gpus"], model.layers, 8, model.is_moe)
        t0 = time.perf_counter()
        lay = enumerate_layouts(plan, space, kw["gpus"])
        enum_s = time.perf_counter() - t0
        n = len(lay["tp"])
        evaluate_bulk(plan, {k: v[:CHUNK] for k, v in lay.items()}, kw["gpus"], model)  # warm caches
        rate_all, fits = _rate(plan, lay, kw["gpus"], model, fitting_only=False)
        rate_search, _ = _rate(plan, lay, kw["gpus"], model, fitting_only=True)
        t2 = time.perf_counter()
        out = search(plan, set(), top=5)
        wall = time.perf_counter() - t2
        print(f"{name:<32s} {n:>10,d} {fits:>8,d} {enum_s:>12.3f} {rate_all:>20,.0f} {rate_search:>17,.0f} "
              f"{wall:>14.2f}")
        best = out["best"][0]["parallel"]
        print(f"   best: TP {best['tp']} PP {best['pp']} DP {best['dp']} CP {best['cp']} ZeRO {best['zero']} "
              f"mbs {best['mbs']} {best['recompute']} {best['schedule']} v{best['vpp']}")
    print("targets: >= 1,000,000 plans/s per core; each search < 10 s wall")


if __name__ == "__main__":
    main()
