"""Cost of one plan in process, in CPU milliseconds: the full plan (`make_plan` + `evaluate` +
`to_json`, the figures `plan --json` prints) of a plan the process has not made before (`full`:
the case's layout with a new global batch each time, the estimators' memos warm from the
others, as in a script's sweep or the explorer), the same plan asked again (`again`), a plan
with every memo emptied first (`cold`: the first in a process) and `evaluate` alone, this tree against a
baseline revision (alternating rounds in fresh interpreters; the median of each), and
llm-analysis's `training()` on the first case, side by side, when the benchmark environment
has it (scripts/bench_setup.sh).

Target: a full plan in at most 0.25 ms, faster than llm-analysis on the same machine.

    .venv/bin/python benchmarks/plan_speed.py [--baseline REV] [--rounds 5]
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sidebyside import ROOT, alternate, median_of, parse_args, print_comparison, run_worker, trees  # noqa: E402

CASES = {
    "llama-2-70b 64xH100 tp8 pp4 zero1": dict(model="llama-2-70b", gpus=64, tp=8, pp=4, zero=1, sp=True,
                                              recompute="selective", gbs=128, seq_len=4096),
    "llama-3.1-405b 16384xH100 tp8 pp16": dict(model="llama-3.1-405b", gpus=16384, tp=8, pp=16, gbs=2048),
    "deepseek-v3 2048xH800 pp16 ep64": dict(model="deepseek-v3", gpu="H800", gpus=2048, pp=16, ep=64, zero=1,
                                            gbs=4096),
}
PEER_PYTHON = ROOT / ".venv-bench" / "bin" / "python"
PEER_SCRIPT = Path(__file__).resolve().parent / "peers" / "llm_analysis_plan.py"
TARGET_MS = 0.25
SECONDS = 0.4  # CPU seconds per figure per round
# the primes from 4,099 to 24,000 (2,000 and more): a case's global batch times one stays within
# trainplan.limits.MAX_BATCH
NEW_FACTORS = [p for p in range(4099, 24000, 2) if all(p % d for d in range(3, int(p ** 0.5) + 1, 2))]


def cpu_ms(fn) -> float:
    """CPU milliseconds per call of `fn`, over some SECONDS of calls after a warm-up."""
    for _ in range(20):
        fn()
    n, t0 = 0, time.process_time()
    while time.process_time() - t0 < SECONDS:
        for _ in range(20):
            fn()
        n += 20
    return (time.process_time() - t0) / n * 1e3


def worker() -> None:
    from trainplan.plan import make_plan
    from trainplan.report import evaluate, to_json

    def memos() -> list:
        """Every memo of the estimators and the report, alike in both trees: the ones this tree
        registers (`estimate.memo`; an older tree has none) and every lru_cache of theirs."""
        try:
            from trainplan.estimate.memo import _ALL as registered
        except ImportError:
            registered = []
        return [value for mod_name, module in list(sys.modules.items())
                if mod_name.startswith("trainplan.estimate.") or mod_name == "trainplan.report"
                for value in list(vars(module).values())
                if callable(getattr(value, "cache_clear", None))] + list(registered)

    def clear():
        for cache in caches:
            (getattr(cache, "cache_clear", None) or cache.clear)()

    def cold(kw):
        clear()
        return to_json(evaluate(make_plan(**kw)))

    for kw in CASES.values():  # every estimator module loaded
        to_json(evaluate(make_plan(**kw)))
    caches = memos()
    def new(kw, counter):
        """A plan this process has not made before: the case's layout with a global batch never
        asked for (gbs x p for the primes p above 4,096 in turn), so no memo of a whole plan can
        answer it; each has as many candidate micro-batch sizes (p a new prime factor above
        the largest size tried), so the work per plan does not drift with the number of calls."""
        counter[0] += 1
        return to_json(evaluate(make_plan(**{**kw, "gbs": kw["gbs"] * NEW_FACTORS[counter[0] % len(NEW_FACTORS)]})))

    out = {}
    for name, kw in CASES.items():
        plan = make_plan(**kw)
        out[name + " full"] = cpu_ms(lambda kw=kw, counter=[-1]: new(kw, counter))
        out[name + " again"] = cpu_ms(lambda kw=kw: to_json(evaluate(make_plan(**kw))))
        out[name + " cold"] = cpu_ms(lambda kw=kw: cold(kw))
        out[name + " evaluate"] = cpu_ms(lambda plan=plan: evaluate(plan))
    print(json.dumps(out))


def peer() -> dict | None:
    if not PEER_PYTHON.exists():
        return None
    res = subprocess.run([str(PEER_PYTHON), str(PEER_SCRIPT), str(SECONDS)], capture_output=True, text=True)
    if res.returncode != 0:
        print(f"llm-analysis failed: {res.stderr.strip()[-500:]}", file=sys.stderr)
        return None
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    args = parse_args(__doc__)
    if args.worker:
        worker()
        return
    peers: list[dict] = []
    with trees(args) as (srcs, label):
        def measure(src):
            got = run_worker(Path(__file__), "plan", src)
            if src == srcs["this tree"]:
                p = peer()  # the peer alternates with this tree, in the same rounds
                if p:
                    peers.append(p)
            return got

        results = alternate(args.rounds, srcs, measure)
    print(f"CPU ms per plan, median of {args.rounds} alternating rounds"
          + (f"; baseline {label}" if label else ""))
    print_comparison(results, label, [(name, what) for name in CASES for what in ("full", "again", "cold", "evaluate")],
                     ("case", 36, 10, ".3f"))
    first = next(iter(CASES)) + " full"
    ours = median_of(results["this tree"], first)
    if peers:
        theirs = statistics.median(p["ms_per_plan"] for p in peers)
        print(f"llm-analysis {peers[0]['version']} training(), the first case: {theirs:.3f} ms; trainplan's full "
              f"plan {ours:.3f} ms = {ours / theirs:.2f}x llm-analysis's time")
    else:
        print("llm-analysis: not installed (bash scripts/bench_setup.sh creates .venv-bench with it)")
    print(f"target: a full plan <= {TARGET_MS} ms and faster than llm-analysis")


if __name__ == "__main__":
    main()
