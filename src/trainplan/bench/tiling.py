"""Tiling: the same matmul by a kernel that reuses nothing on chip (one row of C at a time,
so B is read once per row of A), by our tiled Triton kernel over a sweep of block sizes (a
BM x BK tile of A and a BK x BN tile of B feed BM·BN·BK multiply-adds, so each byte fetched
serves ~BM or ~BN FLOPs: seed 002's "tiling"), and by `torch.matmul` (the vendor library).
Every product is checked against float64 first; on a CPU our kernels run in Triton's
interpreter, checked but not timed."""

from __future__ import annotations

from . import triton_support
from .check import relative_error
from .gemm import TOLERANCE, torch_dtype

SIZES = (1024, 4096)
QUICK_SIZES = (96,)  # not a multiple of the blocks: the edge masks are exercised
# (BM, BN, BK, GROUP_M, warps, stages): from small tiles (little reuse) to Hopper-sized ones
BLOCKS = ((32, 32, 32, 8, 4, 2), (64, 64, 32, 8, 4, 3), (128, 128, 32, 8, 4, 4), (128, 128, 64, 8, 8, 3),
          (128, 256, 64, 8, 8, 3), (256, 128, 64, 8, 8, 3))
QUICK_BLOCKS = ((16, 16, 16, 2, 4, 2), (32, 32, 32, 2, 4, 2), (64, 64, 32, 2, 4, 2))
CPU_SIZES = (96, 256)  # interpreted: checked only, so small


def run(device: str, quick: bool, progress=None) -> list[dict]:
    dtype = "bf16" if device == "cuda" else "fp16"  # Triton's interpreter has no bf16
    kernels, reason = triton_support.kernels_or_reason(device)
    rows = []
    gpu = device == "cuda" and not quick
    for n in SIZES if gpu else QUICK_SIZES if quick else CPU_SIZES:
        rows += _measure_size(n, dtype, device, kernels, reason, BLOCKS if gpu else QUICK_BLOCKS, progress)
    return rows


def _measure_size(n, dtype, device, kernels, reason, blocks, progress) -> list[dict]:
    """torch.matmul, the reuse-free kernel and each block size at n³: checked, then timed
    where timing means something."""
    import torch

    from .timing import median_seconds

    timed = triton_support.timed(device)
    gen = torch.Generator(device="cpu").manual_seed(n)
    a = torch.randn(n, n, generator=gen).to(device, torch_dtype(dtype))
    b = torch.randn(n, n, generator=gen).to(device, torch_dtype(dtype))
    out = torch.empty(n, n, device=device, dtype=torch_dtype(dtype))
    ref = a.double() @ b.double()
    candidates = [("torch.matmul", "", lambda: torch.matmul(a, b, out=out), True)]
    if kernels is not None:
        candidates.append(("row at a time (no reuse)", "BN 128, BK 32", lambda: kernels.rowwise_matmul(a, b, out=out),
                           timed))
        for bm, bn, bk, group, warps, stages in blocks:
            candidates.append(("tiled", f"{bm}x{bn}x{bk}",
                               lambda bm=bm, bn=bn, bk=bk, g=group, w=warps, s=stages: kernels.tiled_matmul(
                                   a, b, out=out, bm=bm, bn=bn, bk=bk, group_m=g, num_warps=w, num_stages=s),
                               timed))
    rows = []
    for kernel, label, fn, timeable in candidates:
        if progress:
            progress(f"tiling {n}^3 {kernel} {label}")
        out.fill_(float("nan"))  # poisoned
        fn()
        err = relative_error(out, ref)
        if not err <= TOLERANCE[dtype]:
            raise RuntimeError(f"{kernel} {label} matmul {n}^3 is wrong: relative error {err:.2e} > "
                               f"{TOLERANCE[dtype]:.0e}")
        seconds = None
        if timeable:
            slow = kernel.startswith("row")  # the reuse-free kernel is slow by design: fewer repeats
            seconds = median_seconds(fn, device, warmup=1 if slow else 3, repeats=3 if slow else 15)
        rows.append({"n": n, "dtype": dtype, "kernel": kernel, "blocks": label, "seconds": seconds,
                     "tflops": 2 * n**3 / seconds / 1e12 if seconds else None, "rel_error": err,
                     "note": None if timeable else "interpreted: not timed"})
    if kernels is None:
        rows.append({"n": n, "dtype": dtype, "kernel": "triton", "blocks": "", "seconds": None, "tflops": None,
                     "rel_error": None, "note": reason})
    library = rows[0]["seconds"]  # torch.matmul: the speed of the vendor library
    for r in rows:
        r["vs_torch"] = library / r["seconds"] if r["seconds"] else None
    return rows
