"""Alignment: the same GEMM with an innermost dimension that is a multiple of 64 and one that
is not. Padding GPT-2's vocabulary 50257 -> 50304 (a multiple of 64) made nanoGPT about 25%
faster (Karpathy, nanoGPT); SwiGLU's 8/3·h = 10922 for h = 4096 is rounded to 10944 for
the same reason. Each pair is timed side by side, the padded one doing *more* FLOPs."""

from __future__ import annotations

from .gemm import gemm_point

# (name, tokens, hidden (the k dimension), unaligned n, aligned n)
CASES = (
    ("GPT-2 logits: vocab 50257 vs 50304", 2048, 768, 50257, 50304),
    ("SwiGLU up: ffn 10922 vs 10944", 2048, 4096, 10922, 10944),
)
QUICK_CASES = (
    ("GPT-2 logits: vocab 50257 vs 50304", 256, 768, 50257, 50304),
    ("SwiGLU up: ffn 10922 vs 10944 (h 1024)", 256, 1024, 10922, 10944),
)


def run(device: str, quick: bool, progress=None) -> list[dict]:
    dtype = "bf16"
    rows = []
    for name, tokens, hidden, odd, even in QUICK_CASES if quick or device != "cuda" else CASES:
        if progress:
            progress(f"alignment {name}")
        a = gemm_point(odd, dtype, device, m=tokens, k=hidden)
        b = gemm_point(even, dtype, device, m=tokens, k=hidden)
        rows.append({"case": name, "dtype": dtype, "unaligned_s": a["seconds"], "aligned_s": b["seconds"],
                     "speedup": a["seconds"] / b["seconds"], "unaligned_tflops": a["tflops"],
                     "aligned_tflops": b["tflops"]})
    return rows
