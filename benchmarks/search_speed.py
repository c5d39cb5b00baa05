"""Search speed: layouts evaluated per second (one process) and wall time of whole searches.

Targets: at least 1,000,000 plans per second per core, and each search under 10 s wall.
(a) GPT-3 175B on 1024 A100, (b) Llama-3.1-405B on 16384 H100, with TP, PP, CP, DP,
micro-batch, recompute, ZeRO and schedule all free.

    .venv/bin/python benchmarks/search_speed.py
"""

from __future__ import annotations

import os
import time

import numpy as np

os.environ.setdefault("OMP_NUM_THREADS", "1")

from trainplan.plan import load_model, make_plan  # noqa: E402
from trainplan.search import CHUNK, batches, default_space, enumerate_layouts, evaluate_bulk, search  # noqa: E402

CASES = {
    "GPT-3 175B on 1024 x A100": dict(model="gpt3-175b", gpu="A100-80GB-SXM", gpus=1024, gbs=1536, seq_len=2048),
    "Llama-3.1-405B on 16384 x H100": dict(model="llama-3.1-405b", gpu="H100-SXM", gpus=16384, gbs=2048,
                                           seq_len=8192),
}


REPEATS = 5  # each rate is the median of this many passes over all layouts (one core is noisy)


def _rate(plan, lay, gpus, model, fitting_only: bool) -> tuple[float, float, int]:
    """Median and best layouts per second through `evaluate_bulk` in cache-sized batches, as
    `search` runs it, over REPEATS passes; and how many layouts fit."""
    n = len(lay["tp"])
    rates = []
    for _ in range(REPEATS):
        fits = 0
        t0 = time.perf_counter()
        for part in batches(n):
            res = evaluate_bulk(plan, {k: v[part] for k, v in lay.items()}, gpus, model,
                                fitting_only=fitting_only)
            fits += int(res["fits"].sum())
        rates.append(n / (time.perf_counter() - t0))
    return float(np.median(rates)), max(rates), fits


def main() -> None:
    print("plans/s (all timed): memory and step time of every layout")
    print("plans/s (search):    memory of every layout, step time of those that fit (what `search` ranks)")
    print("end to end:          layouts / wall time of the whole `search` call (enumeration, evaluation, ranking)")
    print(f"rates: median (best) of {REPEATS} passes, one process, OMP_NUM_THREADS=1")
    print(f"{'case':<32s} {'layouts':>8s} {'fit':>7s} {'enum s':>7s} {'plans/s (all timed)':>22s} "
          f"{'plans/s (search)':>22s} {'search wall s':>14s} {'end to end':>11s}")
    for name, kw in CASES.items():
        plan = make_plan(**kw)
        model = load_model(plan)
        space = default_space(plan, set(), kw["gpus"], model.layers, 8, model.is_moe)
        t0 = time.perf_counter()
        lay = enumerate_layouts(plan, space, kw["gpus"])
        enum_s = time.perf_counter() - t0
        n = len(lay["tp"])
        evaluate_bulk(plan, {k: v[:CHUNK] for k, v in lay.items()}, kw["gpus"], model)  # warm caches
        all_med, all_best, fits = _rate(plan, lay, kw["gpus"], model, fitting_only=False)
        search_med, search_best, _ = _rate(plan, lay, kw["gpus"], model, fitting_only=True)
        t2 = time.perf_counter()
        out = search(plan, set(), top=5)
        wall = time.perf_counter() - t2
        print(f"{name:<32s} {n:>8,d} {fits:>7,d} {enum_s:>7.3f} {all_med:>11,.0f} ({all_best:>8,.0f}) "
              f"{search_med:>11,.0f} ({search_best:>8,.0f}) {wall:>14.3f} {n / wall:>11,.0f}")
        best = out["best"][0]["parallel"]
        print(f"   best: TP {best['tp']} PP {best['pp']} DP {best['dp']} CP {best['cp']} ZeRO {best['zero']} "
              f"mbs {best['mbs']} {best['recompute']} {best['schedule']} v{best['vpp']}")
    print("targets: >= 1,000,000 plans/s per core; each search < 10 s wall")


if __name__ == "__main__":
    main()
