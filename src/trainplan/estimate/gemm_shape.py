"""What a GEMM costs beyond its FLOPs, fitted to a table of measured matmul times.

A measured GEMM time on Hopper follows

    t = 2·m·n·k / R  +  m·n·b  +  t0

to within a few per cent over m, n, k from 256 to 4096 (benchmarks/data/h100_matmul_xla.toml,
OpenXLA's measured H100 table: 1.7% mean, 9.9% worst): the main loop at a rate R, each output
element's write-back after its tile's main loop (b seconds per element) and a fixed time per
kernel t0 (launch, prologue, tail). The write-back acts as k0 = b·R/2 extra steps of the inner
dimension, so the main loop's share is k / (k + k0): short inner dimensions (row-parallel
GEMMs under tensor parallelism, narrow experts) run well below the best shape. Wave
quantization is not visible in that table (cuBLAS picks tile sizes and splits for small
outputs), so a fitted shape switches it off.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class GemmShape:
    """The fitted shape terms of one accelerator, as `gemm_efficiency` and `_gemm_time` use a
    measured curve: a multiplier on the main-loop efficiency and a time per kernel."""

    k0: float  # inner-dimension steps the output write-back costs
    overhead_s: float  # fixed seconds per GEMM kernel
    waves = False  # no wave quantization on top of the fit

    def __call__(self, m, n, k):
        return k / (k + self.k0)


def fit_gemm_shape(m, n, k, seconds, peak: float) -> dict:
    """(mainloop fraction of `peak`, k0, overhead µs) that minimise the squared relative error
    of 2mnk/R + m·n·b + t0 over measured GEMM times (linear least squares in 1/R, b, t0), and
    the fit's mean and worst relative error over those times."""
    m, n, k, t = (np.asarray(x, dtype=float) for x in (m, n, k, seconds))
    design = np.stack([2 * m * n * k, m * n, np.ones_like(t)], axis=1) / t[:, None]
    terms, *_ = np.linalg.lstsq(design, np.ones_like(t), rcond=None)
    inv_rate, per_output, overhead = terms
    error = np.abs(design @ terms - 1)  # predicted / measured - 1
    rate = 1.0 / inv_rate
    return {"mainloop": rate / peak, "k0": per_output * rate / 2, "overhead_us": overhead * 1e6,
            "mean_error": float(error.mean()), "worst_error": float(error.max())}
