"""Memory bandwidth: device copy (read + write) and STREAM triad a = b + s·c (two reads, one
write), in bytes moved per second, on buffers several times larger than the last-level
cache so the cache cannot serve them; coalesced vs strided access (the same useful bytes,
read contiguously or one element in every STRIDE, so each fetched 32-byte sector carries
4 useful bytes: seed 002's "coalescing"); and host->device copies from pageable vs pinned
host memory (a pageable copy is staged through a pinned bounce buffer by the driver)."""

from __future__ import annotations

ELEMENTS = 1 << 26  # fp32: 256 MiB per buffer, above every catalogued L2 (H200: 50 MB)
QUICK_ELEMENTS = 1 << 23  # 32 MiB
STRIDE = 16


def run(device: str, quick: bool, progress=None) -> list[dict]:
    import torch

    from .check import relative_error
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
    err = relative_error(a, ref)
    if not err <= 1e-6:
        raise RuntimeError(f"triad is wrong: relative error {err:.2e} > 1e-06")
    seconds = median_seconds(lambda: torch.add(b, c, alpha=scale, out=a), device)
    rows.append({"kernel": "triad", "bytes": 3 * 4 * n, "seconds": seconds, "gbs": 3 * 4 * n / seconds / 1e9})
    rows += _coalescing(n // 4, device, progress)
    rows += _host_to_device(b, device, progress)
    return rows


def _coalescing(useful: int, device: str, progress=None) -> list[dict]:
    """Copy `useful` elements read contiguously, then the same count read at a stride of
    STRIDE elements (from a buffer STRIDE times larger): bandwidth in useful bytes."""
    import torch

    from .timing import median_seconds

    gen = torch.Generator(device="cpu").manual_seed(2)
    src = torch.randn(useful * STRIDE, generator=gen).to(device)
    strided = src.view(-1, STRIDE)[:, 0]
    contiguous = src[: strided.numel()]
    dest = torch.empty(strided.numel(), device=device)
    rows = []
    for kernel, view in (("copy, contiguous reads", contiguous), (f"copy, stride {STRIDE} reads", strided)):
        if progress:
            progress(f"memory {kernel}")
        dest.fill_(float("nan"))
        dest.copy_(view)
        if not torch.equal(dest, view):
            raise RuntimeError(f"{kernel} is wrong: the destination differs from the source")
        seconds = median_seconds(lambda v=view: dest.copy_(v), device)
        useful = 2 * 4 * dest.numel()
        rows.append({"kernel": kernel, "bytes": useful, "seconds": seconds, "gbs": useful / seconds / 1e9})
    return rows


def _host_to_device(src, device: str, progress=None) -> list[dict]:
    """Host->device copies of the buffer from pageable and from pinned host memory (GPU only)."""
    import torch

    from .timing import median_seconds

    if device != "cuda":
        return [{"kernel": f"host->device, {kind}", "bytes": None, "seconds": None, "gbs": None,
                 "note": "needs a CUDA device"} for kind in ("pageable", "pinned")]
    host = src.cpu()
    rows = []
    for kind, buffer in (("pageable", host), ("pinned", host.pin_memory())):
        if progress:
            progress(f"memory host->device {kind}")
        dest = torch.full_like(src, float("nan"))
        dest.copy_(buffer, non_blocking=kind == "pinned")
        if not torch.equal(dest.cpu(), host):
            raise RuntimeError(f"host->device ({kind}) copy is wrong")
        seconds = median_seconds(lambda b=buffer, d=dest, k=kind: d.copy_(b, non_blocking=k == "pinned"), device)
        size = 4 * src.numel()  # bytes over the link (read on the host, written on the device)
        rows.append({"kernel": f"host->device, {kind}", "bytes": size, "seconds": seconds, "gbs": size / seconds / 1e9})
    return rows
