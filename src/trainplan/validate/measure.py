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
