"""Memory bandwidth: device copy (read + write) and STREAM triad a = b + s·c (two reads, one
write), in bytes moved per second, on buffers several times larger than the last-level
cache so the cache cannot serve them."""

from __future__ import annotations

ELEMENTS = 1 << 26  # fp32: 256 MiB per buffer, above every catalogued L2 (H200: 50 MB)
QUICK_ELEMENTS = 1 << 23  # 32 MiB


def run(device: str, quick: bool, progress=None) -> list[dict]:
    import torch

    from .timing import median_seconds

    n = QUICK_ELEMENTS if quick else ELEMENTS
    gen = torch.Generator(device="cpu").manual_seed(1)
    b = torch.randn(n, generator=gen).to(device)
    c = torch.randn(n, generator=gen).to(device)
    a = torch.full((n,), float("nan"), device=device)  # poisoned
    scale = 3.0
    rows = []
    if progress:
        progress("memory copy")
    a.copy_(b)
    if not torch.equal(a, b):
        raise RuntimeError("device copy is wrong: the destination differs from the source")
    seconds = median_seconds(lambda: a.copy_(b), device)
    rows.append({"kernel": "copy", "bytes": 2 * 4 * n, "seconds": seconds, "gbs": 2 * 4 * n / seconds / 1e9})
    if progress:
        progress("memory triad")
    a.fill_(float("nan"))
    torch.add(b, c, alpha=scale, out=a)
    ref = b.double() + scale * c.double()
    err = float(torch.linalg.norm(a.double() - ref) / torch.linalg.norm(ref))
    if not err <= 1e-6:
        raise RuntimeError(f"triad is wrong: relative error {err:.2e} > 1e-06")
    seconds = median_seconds(lambda: torch.add(b, c, alpha=scale, out=a), device)
    rows.append({"kernel": "triad", "bytes": 3 * 4 * n, "seconds": seconds, "gbs": 3 * 4 * n / seconds / 1e9})
    return rows
