"""Measurements on a real PyTorch model: bytes saved for backward (distinct storages,
parameters excluded, attributed to the region of the model that saved them) through
`torch.autograd.graph.saved_tensors_hooks`, and FLOPs through `FlopCounterMode`."""

from __future__ import annotations

import torch


def _local(t):
    """The plain tensor holding the data: a DTensor's local shard, the result inside an
    asynchronous collective's wrapper (`AsyncCollectiveTensor.elem`); plain tensors unchanged."""
    if hasattr(t, "to_local"):
        t = t.to_local()
    while hasattr(t, "elem") and isinstance(t.elem, torch.Tensor):
        t = t.elem
    return t


def _key(storage) -> int:
    """Identity of a storage: its StorageImpl, which the recorder keeps alive. (A data
    pointer is not an identity: FSDP2 frees gathered parameters during the forward and the
    allocator hands their addresses to later activations.)"""
    return storage._cdata


class SavedTensors:
    """Context manager recording every tensor autograd saves during a forward.

    Storages are deduplicated; parameters' storages are excluded. `bytes_alive()` sums
    each storage's size when called (after the forward): storages a framework frees after
    the forward (FSDP2 reshards its gathered parameters to zero bytes) then count zero.
    Regions: "embedding" until the first block runs, "layer i" inside block i, and
    "head_and_loss" after the last block.
    """

    def __init__(self, model=None, exclude=(), blocks=None, tail=None):
        self.model = model
        self.blocks = blocks if blocks is not None else getattr(model, "blocks", None)
        self.tail = tail if tail is not None else getattr(model, "norm", None)
        params = list(model.parameters()) if model is not None else []
        self.excluded = {_key(_local(t).untyped_storage()) for t in (*params, *exclude)}
        self.storages: dict[int, tuple[object, str]] = {}
        self.packed_sizes: dict[int, tuple] = {}
        self.region = "embedding"
        self._handles = []
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def _pack(self, t):
        st = _local(t).untyped_storage()
        ptr = _key(st)
        if ptr not in self.excluded and ptr not in self.storages:
            self.storages[ptr] = (st, self.region)
            # (bytes, shape, dtype, this rank's shape, a DTensor's placements)
            self.packed_sizes[ptr] = (st.nbytes(), tuple(t.shape), str(t.dtype), tuple(_local(t).shape),
                                      str(tuple(t.placements)) if hasattr(t, "placements") else "")
        return t

    def _set(self, name):
        def hook(module, args):
            self.region = name
        return hook

    def __enter__(self):
        if self.blocks is not None:
            for i, blk in enumerate(self.blocks):
                self._handles.append(blk.register_forward_pre_hook(self._set(f"layer {i}")))
            if self.tail is not None:
                self._handles.append(self.tail.register_forward_pre_hook(self._set("head_and_loss")))
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def bytes_alive(self) -> int:
        return sum(st.nbytes() for st, _ in self.storages.values())

    def by_region(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for st, region in self.storages.values():
            out[region] = out.get(region, 0) + st.nbytes()
        return out


def tensor_bytes(tensors) -> int:
    """Bytes of the distinct storages behind `tensors` (local shards of DTensors)."""
    seen, total = set(), 0
    for t in tensors:
        if t is None:
            continue
        st = _local(t).untyped_storage()
        if _key(st) not in seen:
            seen.add(_key(st))
            total += st.nbytes()
    return total


def saved_tensor_bytes(fn, exclude) -> tuple[int, object]:
    """Run `fn()` (a forward pass) and return the bytes of the distinct storages autograd
    saved for backward, not counting the storages of `exclude` (parameters, inputs), and
    fn's result."""
    rec = SavedTensors(exclude=list(exclude))
    with rec:
        out = fn()
    return rec.bytes_alive(), out


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
    grouped = getattr(aten, "_grouped_mm", None)
    if grouped is not None:
        mapping[grouped] = grouped_mm_flops
    return mapping  # FlopCounterMode passes shapes to custom formulas itself


def grouped_mm_flops(a, b, *args, out_shape=None, **kwargs) -> int:
    """FLOPs of `torch._grouped_mm(a, b, offs)` (transformers' grouped experts), which
    `torch.utils.flop_counter` does not count: every row of the 2-D operand is multiplied in
    exactly one group, so it is a plain matrix product over the whole operand. Shapes: (M, K) x
    (E, K, N) forward, (M, N) x (E, N, K) and (K, M) x (M, N) -> (E, K, N) backward."""
    if len(a) == 2 and len(b) == 2:
        return 2 * a[0] * a[1] * b[1]
    if len(a) == 2:
        return 2 * a[0] * a[1] * b[2]
    if len(b) == 2:
        return 2 * a[1] * a[2] * b[1]
    return 2 * a[0] * a[1] * a[2] * b[2]


class _NoModules:
    """Stands in for FlopCounterMode's module tracker: every FLOP counts under "Global" only.
    (The tracker's backward hooks fail inside `torch.autograd.grad` over part of a graph, which
    the split backward of zero-bubble pipeline schedules runs.)"""

    parents = ("Global",)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


def counted_flops(fn, per_module: bool = True) -> tuple[int, object]:
    """FLOPs of `fn()` (forward and backward inside it) by `FlopCounterMode`, with the CPU
    flash-attention kernels counted like their CUDA versions and grouped GEMMs counted;
    per_module=False counts without tracking modules (see `_NoModules`)."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False, custom_mapping=_cpu_flash_mapping())
    if not per_module:
        counter.mod_tracker = _NoModules()
    with counter:
        out = fn()
    return counter.get_total_flops(), out
