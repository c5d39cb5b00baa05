"""Attention forward, causal: the materialised softmax(QKᵀ/√d)V that writes the S x S scores
and probabilities to memory, our Triton FlashAttention forward (online softmax, seed 004's
algorithm: the scores live only in on-chip blocks), and PyTorch's
`scaled_dot_product_attention` (forward, and forward + backward: the kernel a training step
runs, whose efficiency a profile gives the time model). Time and, on a GPU, the peak memory
above the inputs, over sequence lengths at a constant number of tokens, so the materialised
variant's memory grows with S (S² per sequence) and the blocked ones' stays flat (S per
sequence). Outputs are checked against float64 on sampled query rows of the first and last
heads."""

from __future__ import annotations

from ..estimate.flops import ATTN_BWD_FUSED
from . import triton_support
from .check import relative_error
from .gemm import torch_dtype

HEADS, HEAD_DIM, TOKENS = 16, 128, 16384  # batch = TOKENS / seq
SEQS = (512, 1024, 2048, 4096, 8192, 16384)
QUICK = (2, 64, 256, (64, 128, 256))  # heads, head_dim, tokens, seqs
CPU = (4, 64, 2048, (128, 256, 512, 1024))  # a host's memory and an interpreted kernel
TOLERANCE = {"fp32": 1e-5, "fp16": 5e-3, "bf16": 3e-2}  # relative Frobenius error of the checked rows
GRAD_TOLERANCE = {"fp32": 1e-5, "fp16": 1e-2, "bf16": 6e-2}  # dQ, dK, dV of one head
CHECK_ROWS = 128  # query rows checked at each end of the sequence


def per_head_bytes(seq: int, head_dim: int, itemsize: int) -> tuple[int, int]:
    """(bytes of one head's S x S score matrix, bytes of its Q, K and V): what the materialised
    and the blocked variants hold per head (seed 004: S = 4096, d = 64, fp32 -> 67.1 MB vs 3.1 MB)."""
    return seq * seq * itemsize, 3 * seq * head_dim * itemsize


def materialized(q, k, v, causal: bool = True):
    import torch

    scores = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
    if causal:
        s = q.shape[-2]
        scores.masked_fill_(torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype) @ v


def flops(batch: int, heads: int, seq: int, head_dim: int, causal: bool = True) -> float:
    """QKᵀ and PV, 2·S²·d each per head; causal attention needs half (FlashAttention's count)."""
    return 4 * batch * heads * seq * seq * head_dim / (2 if causal else 1)


def _check_grads(q, k, v, dout, dtype: str) -> float:
    """dQ, dK, dV of the first head against float64 autograd of the materialised formula."""

    leaves = [t[0, 0].detach().double().requires_grad_() for t in (q, k, v)]
    ref = materialized(*(t[None, None] for t in leaves))
    ref.backward(dout[0, 0].double()[None, None])
    err = max(relative_error(t.grad[0, 0], leaf.grad) for t, leaf in zip((q, k, v), leaves, strict=True))
    if not err <= GRAD_TOLERANCE[dtype]:
        raise RuntimeError(f"sdpa backward is wrong: relative gradient error {err:.2e} > {GRAD_TOLERANCE[dtype]:.0e}")
    return err


def _check(out, q, k, v, dtype: str, label: str) -> float:
    import torch

    s = q.shape[-2]
    rows = sorted(set(range(min(CHECK_ROWS, s))) | set(range(max(0, s - CHECK_ROWS), s)))
    idx = torch.tensor(rows)
    errs = []
    for head in {0, q.shape[1] - 1}:
        q64, k64, v64 = (t[0, head].double().cpu() for t in (q, k, v))
        scores = (q64[idx] @ k64.T) / q.shape[-1] ** 0.5
        scores.masked_fill_(idx[:, None] < torch.arange(s)[None, :], float("-inf"))
        ref = torch.softmax(scores, dim=-1) @ v64
        got = out[0, head].double().cpu()[idx]
        errs.append(relative_error(got, ref))
    err = max(errs)
    if not err <= TOLERANCE[dtype]:  # NaN (the poison survived) fails too
        raise RuntimeError(f"{label} attention is wrong: relative error {err:.2e} > {TOLERANCE[dtype]:.0e}")
    return err


def run(device: str, quick: bool, progress=None) -> list[dict]:
    heads, head_dim, tokens, seqs = QUICK if quick else (HEADS, HEAD_DIM, TOKENS, SEQS) if device == "cuda" else CPU
    dtype = "bf16" if device == "cuda" else "fp32"  # Triton's interpreter has no bf16
    kernels, reason = triton_support.kernels_or_reason(device)
    rows = []
    for seq in seqs:
        rows += _measure_seq(seq, max(1, tokens // seq), heads, head_dim, dtype, device, kernels, reason, progress)
    return rows


def _measure_seq(seq, batch, heads, head_dim, dtype, device, kernels, reason, progress) -> list[dict]:
    """Every variant at one sequence length: checked, then timed where timing means something."""
    import torch
    import torch.nn.functional as F

    from .timing import median_seconds

    gen = torch.Generator(device="cpu").manual_seed(seq)
    q, k, v, dout = (torch.randn(batch, heads, seq, head_dim, generator=gen).to(device, torch_dtype(dtype))
                     for _ in range(4))
    out = torch.empty_like(q)  # written in place by our kernel, poisoned before each check
    qg, kg, vg = (t.detach().clone().requires_grad_() for t in (q, k, v))

    def fwd_bwd():
        for t in (qg, kg, vg):
            t.grad = None
        result = F.scaled_dot_product_attention(qg, kg, vg, is_causal=True)
        result.backward(dout)
        return result.detach()

    variants = [("materialized", lambda: materialized(q, k, v), True),
                ("sdpa", lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), True),
                ("sdpa fwd+bwd", fwd_bwd, True)]
    if kernels is not None:
        variants.append(("triton flash", lambda: kernels.flash_attention(q, k, v, causal=True, out=out),
                         triton_support.timed(device)))
    rows = []
    for name, fn, timeable in variants:
        if progress:
            progress(f"attention seq {seq} {name}")
        row = {"seq": seq, "batch": batch, "heads": heads, "head_dim": head_dim, "dtype": dtype, "variant": name,
               "seconds": None, "tflops": None, "peak_bytes": None, "rel_error": None, "grad_error": None,
               "note": None}
        rows.append(row)
        try:
            out.fill_(float("nan"))
            result, row["peak_bytes"] = _peak_above_inputs(fn, device)
        except torch.cuda.OutOfMemoryError:  # the name older PyTorch releases have too
            torch.cuda.empty_cache()
            row["note"] = "out of memory"
            continue
        row["rel_error"] = _check(result, q, k, v, dtype, name)
        del result
        work = flops(batch, heads, seq, head_dim)
        if name == "sdpa fwd+bwd":
            row["grad_error"] = _check_grads(qg, kg, vg, dout, dtype)
            work *= 1 + ATTN_BWD_FUSED  # the time model's backward / forward ratio
        if timeable:
            row["seconds"] = median_seconds(fn, device, warmup=2, repeats=10)
            row["tflops"] = work / row["seconds"] / 1e12
        else:
            row["note"] = "interpreted: not timed"
    if kernels is None:
        rows.append({**rows[0], "variant": "triton flash", "seconds": None, "tflops": None, "peak_bytes": None,
                     "rel_error": None, "note": reason})
    sdpa = rows[1]["seconds"]
    for r in rows:
        forward = r["variant"] != "sdpa fwd+bwd"
        r["vs_sdpa"] = sdpa / r["seconds"] if forward and r["seconds"] and sdpa else None
    return rows


def _peak_above_inputs(fn, device: str):
    """(`fn()`, peak bytes allocated while it ran beyond what was allocated before: the inputs
    and the output buffer). The peak is measured on CUDA only; the CPU allocator keeps no
    such counter."""
    import torch

    if device != "cuda":
        return fn(), None
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    result = fn()
    torch.cuda.synchronize()
    return result, torch.cuda.max_memory_allocated() - before
