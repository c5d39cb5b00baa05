"""Search speed in layouts per CPU-second (one process, OMP_NUM_THREADS=1), this tree against a
baseline revision, alternating rounds in fresh interpreters, the median of each (each round
repeats a call for SECONDS of CPU time):

* search: a whole `search` call (enumeration, the memory of every layout, the step time of
  those that fit, ranking and the top five plans' JSON), layouts listed / its CPU time;
* evaluation: `evaluate_bulk` over every listed layout in `search`'s batches, as `search`
  runs it (step time only where the layout fits).

Problems: GPT-3 175B on 1,024 A100 and Llama-3.1-405B on 16,384 H100, with TP, PP, CP, DP,
micro-batch, recompute, ZeRO, schedule and interleaving all free. Each tree lists its own
layouts (a tree that lists more interleavings evaluates more).

Target: at least 1,500,000 layouts per CPU-second.

    .venv/bin/python benchmarks/search_speed.py [--baseline REV] [--rounds 5]
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from sidebyside import alternate, parse_args, print_comparison, run_worker, trees  # noqa: E402

CASES = {
    "GPT-3 175B on 1024 x A100": dict(model="gpt3-175b", gpu="A100-80GB-SXM", gpus=1024, gbs=1536, seq_len=2048),
    "Llama-3.1-405B on 16384 x H100": dict(model="llama-3.1-405b", gpu="H100-SXM", gpus=16384, gbs=2048,
                                           seq_len=8192),
}
TARGET = 1_500_000
SECONDS = 0.3  # CPU seconds of repeated calls per figure per round (one call is 15-40 ms)


def per_call(fn) -> float:
    """CPU seconds per call of `fn`, over at least SECONDS of calls (one call alone swings with the
    machine's load)."""
    n, t0 = 0, time.process_time()
    while time.process_time() - t0 < SECONDS:
        fn()
        n += 1
    return (time.process_time() - t0) / n


def worker() -> None:
    from trainplan.plan import load_model, make_plan
    from trainplan.search import batches, default_space, enumerate_layouts, evaluate_bulk, search

    out = {}
    for name, kw in CASES.items():
        plan = make_plan(**kw)
        model = load_model(plan)
        search(plan, set(), top=5)  # warm caches
        res = search(plan, set(), top=5)
        out[name + " search"] = res["evaluated"] / per_call(lambda plan=plan: search(plan, set(), top=5))
        best = res["best"][0]["parallel"]
        out[name + " best"] = (f"TP {best['tp']} PP {best['pp']} DP {best['dp']} CP {best['cp']} ZeRO {best['zero']} "
                               f"mbs {best['mbs']} {best['recompute']} {best['schedule']} v{best['vpp']}")
        space = default_space(plan, set(), kw["gpus"], model.layers, 8, model.is_moe)
        lay = enumerate_layouts(plan, space, kw["gpus"], model)
        n = len(lay["tp"])

        def evaluation(plan=plan, lay=lay, n=n, gpus=kw["gpus"], model=model):
            for part in batches(n):
                evaluate_bulk(plan, {k: v[part] for k, v in lay.items()}, gpus, model, fitting_only=True)

        out[name + " evaluation"] = n / per_call(evaluation)
        out[name + " layouts"] = n
    print(json.dumps(out))


def main() -> None:
    args = parse_args(__doc__)
    if args.worker:
        worker()
        return
    with trees(args) as (srcs, label):
        results = alternate(args.rounds, srcs, lambda src: run_worker(Path(__file__), "search", src))
    print(f"layouts per CPU-second, median of {args.rounds} alternating rounds, one process"
          + (f"; baseline {label}" if label else ""))
    print_comparison(results, label, [(name, what) for name in CASES for what in ("search", "evaluation")],
                     ("problem", 32, 11, ",.0f"))
    for name in CASES:
        for tree, rows in results.items():
            print(f"   {name}, {tree}: {rows[0][name + ' layouts']:,} layouts; best {rows[0][name + ' best']}")
    print(f"target: >= {TARGET:,} layouts per CPU-second")


if __name__ == "__main__":
    main()
