"""GEMM throughput: TFLOP/s of C = A @ B by dtype and square size, and the share of the
accelerator's dense peak it reaches (the efficiency curve the time model calibrates)."""

from __future__ import annotations

# Relative Frobenius error allowed against a float64 product of the same (rounded) inputs:
# about 20x the output rounding of each dtype (unit roundoff fp32 6e-8, tf32 inputs 5e-4,
# fp16 5e-4, bf16 4e-3), so a wrong kernel fails and a correct one passes at any size here.
TOLERANCE = {"fp32": 1e-5, "tf32": 1e-2, "fp16": 1e-2, "bf16": 5e-2}
SIZES = (256, 512, 1024, 2048, 4096, 8192, 16384)
QUICK_SIZES = (128, 256, 512)
CPU_SIZES = (256, 512, 1024, 2048, 4096)  # a CPU core would need minutes per 16384^3 product
# The inner-dimension sweep: m = n fixed and large enough that tile and wave quantization do not
# change with k; only the number of k-steps per output tile does.
DEPTHS = {"cuda": (8192, (256, 512, 1024, 2048, 4096, 8192, 16384)),
          "cpu": (512, (64, 128, 256, 512, 1024, 2048)), "quick": (128, (32, 64, 128, 256))}


def torch_dtype(name: str):
    import torch

    return {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[name]


def supported_dtypes(device: str) -> list[str]:
    """fp32 and bf16 everywhere; tf32 and fp16 on CUDA (CPU fp16 matmul is an emulation)."""
    return ["fp32", "tf32", "bf16", "fp16"] if device == "cuda" else ["fp32", "bf16"]


def gemm_point(n: int, dtype: str, device: str, seed: int = 0, m: int | None = None, k: int | None = None) -> dict:
    """One GEMM (m x k) @ (k x n), square unless m or k is given: checked against float64,
    then timed."""
    import torch

    from .check import relative_error
    from .timing import median_seconds

    m, k = m or n, k or n
    gen = torch.Generator(device="cpu").manual_seed(seed + n)
    a = torch.randn(m, k, generator=gen).to(device=device, dtype=torch_dtype(dtype))
    b = torch.randn(k, n, generator=gen).to(device=device, dtype=torch_dtype(dtype))
    out = torch.full((m, n), float("nan"), device=device, dtype=torch_dtype(dtype))  # poisoned
    tf32_before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
    try:
        torch.matmul(a, b, out=out)
        ref = a.double() @ b.double()  # float64 on the same device (a GPU's fp64 units are fast)
        err = relative_error(out, ref)
        if not err <= TOLERANCE[dtype]:  # also catches NaN: the poison survived
            raise RuntimeError(f"{dtype} GEMM {m}x{k}x{n} is wrong: relative error {err:.2e} > "
                               f"{TOLERANCE[dtype]:.0e}")
        seconds = median_seconds(lambda: torch.matmul(a, b, out=out), device)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32_before
    return {"m": m, "n": n, "k": k, "dtype": dtype, "seconds": seconds, "tflops": 2 * m * n * k / seconds / 1e12,
            "rel_error": err}


def run(device: str, quick: bool, peak_tflops: dict[str, float] | None = None, progress=None) -> list[dict]:
    """The square sweep for every supported dtype; `pct_of_peak` when the peak is known
    (tf32 against the tf32 peak, the others against their own)."""
    rows = []
    for dtype in supported_dtypes(device):
        for n in QUICK_SIZES if quick else SIZES if device == "cuda" else CPU_SIZES:
            if progress:
                progress(f"gemm {dtype} {n}^3")
            row = gemm_point(n, dtype, device)
            peak = (peak_tflops or {}).get(dtype)
            row["pct_of_peak"] = 100 * row["tflops"] / peak if peak else None
            rows.append(row)
    return rows


def run_depth(device: str, quick: bool, peak_tflops: dict[str, float] | None = None, progress=None) -> list[dict]:
    """bf16 (m x k) @ (k x n) with m = n fixed, over the inner dimension k: how efficiency
    depends on k alone (narrow layers and tensor-parallel shards have short k)."""
    mn, depths = DEPTHS["quick" if quick else "cuda" if device == "cuda" else "cpu"]
    rows = []
    for k in depths:
        if progress:
            progress(f"gemm bf16 {mn}x{k}x{mn}")
        row = gemm_point(mn, "bf16", device, m=mn, k=k)
        peak = (peak_tflops or {}).get("bf16")
        row["pct_of_peak"] = 100 * row["tflops"] / peak if peak else None
        rows.append(row)
    return rows


def model_shapes(model, tokens: int) -> list[tuple[str, int, int, int]]:
    """(name, m, k, n) of the forward GEMMs of one layer of `model` on `tokens` tokens (no
    tensor parallelism; a routed expert gets its average share top_k·tokens/experts) and of
    the output head: QKV, attention out, MLP up/gate/down, logits."""
    index = model.first_layer(False) or 0
    shapes = []
    for lin in model.layer_linears(index):
        m = max(1, tokens * model.top_k // lin.count) if lin.expert else tokens
        shapes.append((lin.name, m, lin.fan_in, lin.fan_out))
    shapes.append(("logits", tokens, model.hidden, model.vocab))
    return shapes


def run_model(model, tokens: int, device: str, dtype: str = "bf16", progress=None) -> list[dict]:
    """The model's GEMM shapes, measured and next to the time model's predicted efficiency
    for the same shape (tile and wave quantization, alignment)."""
    rows = []
    for name, m, k, n in model_shapes(model, tokens):
        if progress:
            progress(f"gemm {model.name} {name} {m}x{k}x{n}")
        row = gemm_point(n, dtype, device, m=m, k=k)
        rows.append({**row, "model": model.name, "gemm": name})
    return rows
