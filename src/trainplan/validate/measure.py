"""Measurements on a real PyTorch model: bytes saved for backward (deduplicated by storage,
parameters excluded) through `torch.autograd.graph.saved_tensors_hooks`."""

from __future__ import annotations

import torch


def saved_tensor_bytes(fn, params) -> tuple[int, object]:
    """Run `fn()` (a forward pass) and return the bytes of distinct storages autograd saved
    for backward (not counting the parameters' own storages), and fn's result."""
    param_storages = {p.untyped_storage().data_ptr() for p in params}
    storages: dict[int, int] = {}

    def pack(t):
        st = t.untyped_storage()
        ptr = st.data_ptr()
        if ptr not in param_storages:
            storages[ptr] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return sum(storages.values()), out


def _cpu_flash_mapping() -> dict:
    """FLOP formulas for PyTorch's CPU flash-attention kernels, which
    `torch.utils.flop_counter` does not register (its CUDA siblings are): the same counts
    torch uses for `_scaled_dot_product_flash_attention` forward and backward."""
    from torch.utils import flop_counter as fc

    aten = torch.ops.aten
    mapping = {}
    fwd = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    bwd = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)
    if fwd is not None:
        def fwd_flops(q, k, v, *args, out_shape=None, **kwargs):
            return fc.sdpa_flop_count(q, k, v)
        mapping[fwd] = fwd_flops
    if bwd is not None:
        def bwd_flops(grad_out, q, k, v, *args, out_shape=None, **kwargs):
            return fc.sdpa_backward_flop_count(grad_out, q, k, v)
        mapping[bwd] = bwd_flops
    return mapping  # FlopCounterMode passes shapes to custom formulas itself


def counted_flops(fn) -> tuple[int, object]:
    """FLOPs of `fn()` (forward and backward inside it) by `FlopCounterMode`, with the CPU
    flash-attention kernels counted like their CUDA versions."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False, custom_mapping=_cpu_flash_mapping()) as counter:
        out = fn()
    return counter.get_total_flops(), out
