"""How a measured kernel is judged correct: its relative Frobenius error against a float64
reference computed from the same inputs (NaN, from a poisoned output left unwritten, never
passes a `<=` bound)."""

from __future__ import annotations


def relative_error(out, ref) -> float:
    """||out - ref|| / ||ref||, with `out` moved to the reference's device and dtype."""
    import torch

    return float(torch.linalg.norm(out.to(ref.device, ref.dtype) - ref) / torch.linalg.norm(ref))
