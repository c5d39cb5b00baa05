"""Cost of one plan evaluation in-process and of the whole `trainplan plan --json` command.

Targets: under 1 ms per in-process evaluation (resolve, the memory model for every stage,
the step-time model and the training-run figures), and
under 0.5 s for the command (start-up included). Prints measured figures side by side.

    .venv/bin/python benchmarks/plan_speed.py
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

from trainplan.estimate.memory import estimate_memory
from trainplan.plan import make_plan, resolve
from trainplan.report import evaluate

CASES = {
    "llama-3-70b 64xH100 tp8 pp4 zero1": dict(model="llama-3-70b", gpus=64, tp=8, pp=4, zero=1, sp=True,
                                              recompute="selective", gbs=128),
    "llama-3.1-405b 16384xH100 tp8 pp16": dict(model="llama-3.1-405b", gpus=16384, tp=8, pp=16, gbs=2048),
    "deepseek-v3 2048xH800 pp16 ep64": dict(model="deepseek-v3", gpu="H800", gpus=2048, pp=16, ep=64, zero=1,
                                            gbs=4096),
}


def per_call(fn, n=2000):
    fn()
    best = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best.append((time.perf_counter() - t0) / n)
    return min(best)


def main() -> None:
    print(f"{'case':<40s} {'plan: memory+time+run (ms)':>27s} {'memory model only (ms)':>24s}")
    for name, kw in CASES.items():
        plan = make_plan(**kw)
        layout = resolve(plan)
        full = per_call(lambda plan=plan: evaluate(plan), n=500)
        mem = per_call(lambda layout=layout: estimate_memory(layout), n=500)
        print(f"{name:<40s} {full * 1e3:>27.3f} {mem * 1e3:>24.3f}")
    exe = Path(sys.executable).with_name("trainplan")
    cmd = [str(exe), "plan", "--model", "llama-3-70b", "--gpus", "64", "--tp", "8", "--pp", "4", "--json"]
    subprocess.run(cmd, check=True, capture_output=True)
    times = []
    for _ in range(7):
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        times.append(time.perf_counter() - t0)
    print(f"{'trainplan plan --json (command, median of 7)':<40s} {statistics.median(times) * 1e3:>14.1f} ms"
          f"   target < 500 ms")
    print("target per in-process evaluation: < 1 ms")


if __name__ == "__main__":
    main()
