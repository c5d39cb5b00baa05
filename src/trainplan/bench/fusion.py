"""Fusion: the element-wise tail of a transformer MLP, residual + dropout(gelu(x + bias)),
run as PyTorch's eager chain of kernels, as one `torch.compile`d kernel and as our fused
Triton kernel. Eager writes every intermediate to memory and reads it back; a fused kernel
reads x and the residual once and writes the output once (seed 002, operator fusion), so
on a bandwidth-bound op the time should follow the bytes.

Dropout is random, so each output element is checked against both of its possible float64
values, residual (dropped) or residual + gelu(x + bias)/(1 - p) (kept), and the kept
share against the binomial spread around 1 - p."""

from __future__ import annotations

import math

from . import triton_support

P = 0.1
SHAPE = (16384, 8192)  # tokens x hidden: 128 Mi elements, 256 MiB per bf16 tensor
QUICK_SHAPE = (256, 1024)
CPU_SHAPE = (4096, 4096)
# per element, relative to the chain's scale: four roundings of eager's intermediates (unit
# roundoff fp32 6e-8, fp16 5e-4, bf16 4e-3) with margin; a missing 1/(1 - p) is 10% off
TOLERANCE = {"fp32": 1e-5, "fp16": 5e-3, "bf16": 3e-2}


def eager_chain(x, bias, residual, p: float = P, out=None):
    import torch
    import torch.nn.functional as F

    return torch.add(residual, F.dropout(F.gelu(x + bias), p, training=True), out=out)


def bytes_moved(variant: str, elements: int, itemsize: int) -> int:
    """HBM bytes of each variant (the bias, one row, is negligible): eager reads and writes
    once per op (add 2, gelu 2, dropout 2 plus a one-byte mask, add 3 tensor passes); fused
    reads x and the residual and writes the output (3)."""
    if variant == "eager":
        return 9 * elements * itemsize + elements
    return 3 * elements * itemsize


def check(out, x, bias, residual, p: float, dtype: str) -> tuple[float, float]:
    """(worst relative error against the nearer of the two float64 candidates, kept share);
    raises when either is out of bounds."""
    import torch

    x64, r64, out64 = x.double().cpu(), residual.double().cpu(), out.double().cpu()
    h = x64 + bias.double().cpu()
    scaled = torch.nn.functional.gelu(h) / (1 - p)
    err_dropped, err_kept = (out64 - r64).abs(), (out64 - r64 - scaled).abs()
    # the rounding scale of the chain: its inputs' magnitudes (1 + erf(h/√2) cancels for h << 0)
    scale = r64.abs() + scaled.abs() + h.abs() + 1e-30
    worst = float((torch.minimum(err_dropped, err_kept) / scale).max())  # NaN (poison left) compares False
    share = float((err_kept < err_dropped).double().mean())
    n = out.numel()
    spread = 6 * math.sqrt(p * (1 - p) / n) + 2 / n
    if not worst <= TOLERANCE[dtype]:
        raise RuntimeError(f"fused-op output is wrong: relative error {worst:.2e} > {TOLERANCE[dtype]:.0e}")
    if not abs(share - (1 - p)) <= spread:
        raise RuntimeError(f"dropout kept {share:.4f} of the elements, expected {1 - p:.4f} ± {spread:.4f}")
    return worst, share


def run(device: str, quick: bool, progress=None) -> list[dict]:
    import torch

    from .gemm import torch_dtype
    from .timing import median_seconds

    dtype = "bf16" if device == "cuda" else "fp32"  # Triton's interpreter has no bf16
    rows_, cols = QUICK_SHAPE if quick else SHAPE if device == "cuda" else CPU_SHAPE
    gen = torch.Generator(device="cpu").manual_seed(3)
    x, residual = (torch.randn(rows_, cols, generator=gen).to(device, torch_dtype(dtype)) for _ in range(2))
    bias = torch.randn(cols, generator=gen).to(device, torch_dtype(dtype))
    out = torch.full_like(x, float("nan"))
    n, size = x.numel(), x.element_size()

    variants = [("eager", lambda: eager_chain(x, bias, residual, out=out), None)]
    kernels, reason = triton_support.kernels_or_reason(device)
    seeds = iter(range(1, 1 << 30))  # a fresh dropout mask per call, as eager and compiled draw
    block = 1024 if device == "cuda" else 1 << 16  # interpreted: each program instance costs Python time
    fused = ((lambda: kernels.bias_gelu_dropout_residual(x, bias, residual, P, next(seeds), out=out, block=block))
             if kernels else None)
    triton_variant = ("triton fused", fused, reason)
    # torch.compile second: it may import Triton, which must first know whether to interpret
    try:
        compiled = torch.compile(eager_chain, dynamic=False)
        variants.append(("torch.compile", lambda: compiled(x, bias, residual), None))
    except Exception as exc:  # pragma: no cover - torch without a compiler backend
        variants.append(("torch.compile", None, f"unavailable: {exc}"))
    variants.append(triton_variant)

    rows = []
    with torch.no_grad():
        for name, fn, note in variants:
            if progress:
                progress(f"fusion {name}")
            row = {"variant": name, "elements": n, "dtype": dtype, "seconds": None, "gbs": None, "rel_error": None,
                   "kept": None, "bytes": bytes_moved("eager" if name == "eager" else "fused", n, size), "note": note}
            if fn is not None:
                try:
                    out.fill_(float("nan"))
                    result = fn()  # the first call also compiles
                except Exception as exc:  # inductor needs a C++ compiler on the CPU
                    row["note"] = f"unavailable: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
                    rows.append(row)
                    continue
                row["rel_error"], row["kept"] = check(result, x, bias, residual, P, dtype)
                if name == "triton fused" and not triton_support.timed(device):
                    row["note"] = "interpreted: not timed"
                else:
                    row["seconds"] = median_seconds(fn, device)
                    row["gbs"] = row["bytes"] / row["seconds"] / 1e9
            rows.append(row)
    eager = rows[0]["seconds"]
    for r in rows:
        r["speedup"] = eager / r["seconds"] if r["seconds"] else None
    return rows
