"""Timing a kernel: warm-up, then the median of many runs, with device events on a GPU."""

from __future__ import annotations

import statistics
import time


def median_seconds(fn, device: str, warmup: int = 3, repeats: int = 15) -> float:
    """Median wall seconds of `fn()` after `warmup` calls. On CUDA each run is bracketed by
    events on the current stream (host timing would measure the launch, not the kernel)."""
    import torch

    for _ in range(warmup):
        fn()
    times = []
    if device == "cuda":
        torch.cuda.synchronize()
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
    else:
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)
