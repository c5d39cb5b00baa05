"""Attention kernel rates (DESIGN §3): FlashAttention's achieved fraction of peak by the
sequence one kernel call spans (a curve where one is published or measured; FlashAttention in
Triton at its published share of FlashAttention-2) and the head dimension each kernel pads to.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .gemm_rates import log_curve
from .scalars import floats, maximum, values

if TYPE_CHECKING:
    from .hardware import Hardware

def triton_attention_curve(flash: float, flash_curve: dict | None, triton: dict, forward: bool = False) -> dict:
    """FlashAttention in Triton by sequence length: the FA2 forward + backward efficiency (its
    curve, else its single figure) at each length the published Triton/FA2 ratio was measured
    at, times that ratio; `forward`, the Triton forward alone over the same FA2 figure
    (conventions.toml [efficiency.flash_attention_triton])."""
    seq = floats(triton["seq"])
    fa2 = np.interp(np.log2(seq), *flash_curve_points(flash_curve)) if flash_curve else np.full(seq.shape, flash)
    ratio = triton["forward_ratio" if forward else "ratio"]
    return {"seq": triton["seq"], "fraction": (fa2 * values(ratio)).tolist()}


def flash_head_dim(d, kernel: str, multiple: int):
    """The head dimension a FlashAttention kernel computes for a head of `d`, padded columns
    included: FA2 is compiled for multiples of `multiple` (conventions.toml
    flash_head_dim_multiple); the Triton kernel's tiles span the next power of two, at least 16
    (flash_attn_triton.py: BLOCK_HEADDIM = max(next_power_of_2(d), 16)); cuDNN's attention is
    priced at the head dimension as given (no published padding rule)."""
    d = maximum(floats(d), 1.0)
    if kernel == "triton":
        return maximum(2.0 ** np.ceil(np.log2(d)), 16.0)
    if kernel == "cudnn":
        return d
    return np.ceil(d / multiple) * multiple


def flash_curve_points(curve: dict | None) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    """(log2 sequence length, fraction of peak) from {"seq": [...], "fraction": [...]}."""
    return log_curve(tuple(curve["seq"]), tuple(curve["fraction"])) if curve else None


def flash_efficiency(hw: Hardware, seq, forward: bool = False):
    """FlashAttention's achieved fraction of peak for kernel calls over `seq` tokens, forward +
    backward (or, `forward`, the forward alone where published): the measured curve
    log-interpolated (flat beyond its ends), else the single figure. Short sequences give each
    thread block fewer key blocks to amortise its start over."""
    curve = hw.flash_fwd_curve if forward and hw.flash_fwd_curve is not None else hw.flash_curve
    if curve is None:
        return hw.flash_eff
    return np.interp(np.log2(maximum(floats(seq), 1.0)), *curve)
