"""Collectives on a plan's hardware and what data-parallel sharding exposes (DESIGN §3).

`collective` prices NCCL calls over a group of ranks placed some GPUs apart, each at the
algorithm and protocol NCCL's tuner picks (estimate/comm.py); `link` gives a group's bus
bandwidth and ring latency. `overlapped` is what a collective adds beside compute, and
`zero3_exposed` what ZeRO-3 / FSDP's unit-by-unit gathers and reduce-scatters leave exposed.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from . import comm
from .gemm_rates import layer_gemms
from .hardware import Hardware
from .scalars import floats, maximum, minimum, values, where


def _scalar(x) -> bool:
    """np.ndim(x) == 0, without numpy's conversion for a Python number."""
    return isinstance(x, (int, float)) or np.ndim(x) == 0


def link(hw: Hardware, kind: int, n, stride, gpn, sharp=False) -> tuple:
    """(bus bandwidth, latency of one call) of a collective over n ranks placed `stride` GPUs
    apart (NCCL's ring model; an all-reduce done in the network, NVLS; conventions.toml
    [efficiency.nccl_latency_us]): the group's placement worked out once for both; one
    layout's (scalars) memoised."""
    if _scalar(n) and _scalar(stride):
        return _one_link(hw.nvlink, hw.nic, hw.latency, kind, float(n), float(stride), gpn, bool(sharp))
    return _link(hw.nvlink, hw.nic, hw.latency, kind, n, stride, gpn, sharp)


@lru_cache(maxsize=4096)
def _one_link(nvlink, nic, latency, kind, n, stride, gpn, sharp):
    return tuple(float(x) for x in _link(nvlink, nic, latency, kind, n, stride, gpn, sharp))


def _link(nvlink, nic, latency, kind, n, stride, gpn, sharp):
    per_node = comm.ranks_per_node(n, stride, gpn)
    nodes = comm.group_nodes(n, stride, gpn, per_node)
    lat = comm.ring_latency(kind, n, nodes, *latency[:3])
    if kind == comm.ALL_REDUCE and sharp:  # done in the network: NCCL's NVLS
        lat = comm.nvls_latency(nodes, *latency[3:])
    return comm.group_busbw(n, stride, gpn, nvlink, nic, per_node), lat


def collective(hw: Hardware, kind: int, nbytes, n, stride, gpn, sharp=False, calls=1.0):
    """Seconds of `calls` NCCL calls over n ranks placed `stride` GPUs apart that together move
    `nbytes` per rank, each call at the algorithm and protocol NCCL picks for its size
    (comm.nccl_call)."""
    return collective_terms(hw, kind, nbytes, n, stride, gpn, sharp, calls)[0]


def collective_terms(hw: Hardware, kind: int, nbytes, n, stride, gpn, sharp=False, calls=1.0) -> tuple:
    """`collective`'s (seconds, algorithm code, protocol code, latency of one call); one
    layout's (scalars) memoised."""
    if _scalar(nbytes) and _scalar(n) and _scalar(stride) and _scalar(calls):
        return _one_collective(hw.nvlink, hw.nic, hw.nccl, kind, float(nbytes), float(n), float(stride), gpn,
                               bool(sharp), float(calls))
    return _collective(hw.nvlink, hw.nic, hw.nccl, kind, nbytes, n, stride, gpn, sharp, calls)


def collective_choice(hw: Hardware, kind: int, nbytes, n, stride, gpn, sharp=False, calls=1.0) -> str:
    """The algorithm and protocol NCCL runs one of those calls with, e.g. "ring/LL128" (one
    layout; `plan --explain`)."""
    _, algo, proto, _ = collective_terms(hw, kind, float(nbytes), float(n), float(stride), gpn, sharp, float(calls))
    return f"{comm.ALGORITHMS[algo]}/{comm.PROTOCOLS[proto]}" if n > 1 else "none"


@lru_cache(maxsize=4096)
def _one_collective(nvlink, nic, nccl, kind, nbytes, n, stride, gpn, sharp, calls):
    """`_collective` of one layout's numbers, memoised, as plain numbers."""
    secs, algo, proto, lat = _collective(nvlink, nic, nccl, kind, nbytes, n, stride, gpn, sharp, calls)
    return float(secs), int(algo), int(proto), float(lat)


def _collective(nvlink, nic, nccl, kind, nbytes, n, stride, gpn, sharp, calls):
    per_node = comm.ranks_per_node(n, stride, gpn)
    nodes = comm.group_nodes(n, stride, gpn, per_node)
    busbw = comm.group_busbw(n, stride, gpn, nvlink, nic, per_node)
    calls = maximum(floats(calls), 1e-9)
    secs, algo, proto, lat = comm.nccl_call(kind, floats(nbytes) / calls, n, nodes, per_node,
                                            busbw, nccl, sharp)
    return calls * secs, algo, proto, lat


def overlapped(comm_s, compute_s, slowdown):
    """Seconds a collective adds when run beside `compute_s` of compute: what outlasts the
    compute, plus the compute it overlaps slowed by `slowdown` (NCCL's kernels take SMs and
    memory bandwidth from the GEMMs beside them: 18.9% on average over A100/H100/MI250/MI210
    runs of GPT and Llama models, arXiv 2507.03114; conventions.toml [efficiency])"""
    return maximum(0.0, comm_s - compute_s) + slowdown * minimum(comm_s, compute_s)


# ZeRO-3/FSDP backward prefetch: the next layer's gather before the current layer's gradients
# (overlapped), after them (FSDP1 BACKWARD_POST: the gather exposed) or on demand (no prefetch:
# gather and reduce-scatter exposed; PyTorch FSDP docs, BackwardPrefetch)
BACKWARD_PREFETCH_CODE = {"pre": 0, "post": 1, "none": 2}


def modules_per_layer(model, r=None) -> float:
    """The calls DeepSpeed's ZeRO-3 gathers a layer in: one per submodule with parameters, its
    linears (the first dense layer's, else the first layer's; q, k and v one module where the
    model fuses them) and its two norms; one per parameter (`r.zero3_parameter_calls`: a weight,
    its bias, a LayerNorm's weight and bias each)."""
    return _modules_per_layer(model, r is not None and bool(r.zero3_parameter_calls))


@lru_cache(maxsize=256)
def _modules_per_layer(model, parameter_calls: bool) -> float:
    g = layer_gemms(model, model.first_layer(False) is None)
    lins = [lin for lin in model.layer_linears(model.first_layer(False) or 0)]
    fused = 2 * bool(model.fused_qkv)
    if parameter_calls:
        biases = sum(lin.bias for lin in lins) - (fused if any(lin.bias for lin in lins[:3]) else 0)
        return float(g.fan_in.size - fused + biases + 2 * (2 if model.norm == "layernorm" else 1))
    return float(g.fan_in.size - fused + 2)


def recompute_regathered(r, recompute, zero, unit_params):
    """The share of a unit's parameters ZeRO-3 gathers again in its recomputed forward (full
    recomputation): DeepSpeed keeps a gathered parameter only if it is used again within
    stage3_max_reuse_distance R elements of other parameters. A parameter's recomputed use and
    its backward use are 2 x (the unit's parameters after it) apart, so those in the first
    P - R/2 elements of a P-element unit are gathered a third time; FSDP recomputes inside the
    unit's backward, after its gather (R infinite: none)."""
    share = maximum(unit_params - r.zero3_max_reuse_distance / 2, 0.0) / maximum(unit_params, 1.0)
    return where((values(recompute) == 2) & (values(zero) >= 3), share, 0.0)


def zero3_exposed(gather, scatter, units, compute, recompute, regathered, backward_gathers, backward_prefetch,
                  overlap, slowdown, gathers_overlap=True):
    """Seconds ZeRO-3 / FSDP adds to one micro-batch gathering and reduce-scattering unit by unit
    (`gather`, `scatter`: one unit's, all its calls; `compute`: the micro-batch's compute over
    `units` units). Each unit's gather is prefetched one unit ahead (DeepSpeed's prefetch bucket,
    FSDP's forward and backward prefetch of the next unit; with the previous unit's parameters
    and this one's held, no deeper), so it hides behind ONE unit's compute, and a gather longer
    than a unit's compute is exposed by the difference: forward, the previous unit's forward;
    a recomputed forward (`regathered` share gathered again), the same; backward, the unit's
    gather and the previous unit's reduce-scatter share the data-parallel communicator (one NCCL
    stream: serialized) behind one unit's backward. The first unit's gather has nothing before
    it to hide behind. A unit's forward : backward : recomputed forward compute is 1 : 2 : 1
    (full recomputation) or 1 : 2. Backward prefetch "post" exposes the backward gathers,
    "none" the reduce-scatters too (BACKWARD_PREFETCH_CODE); not overlapped, all of it. Where the
    engine synchronizes the device before each gather (`gathers_overlap` false: DeepSpeed
    v0.3.13-v0.5.5) the gathers are exposed and only the reduce-scatters overlap the backward."""
    if not gathers_overlap:
        back = where(backward_gathers, gather, 0.0)
        bwd_scatter = where(backward_prefetch >= 2, scatter, overlapped(scatter, 2 * compute / units /
                                                                           (3 + where(values(recompute) == 2,
                                                                                         1.0, 0.0)), slowdown))
        return units * ((1 + regathered) * gather + back + where(overlap, bwd_scatter, scatter))
    rec = where(values(recompute) == 2, 1.0, 0.0)
    per_unit = compute / units / (3 + rec)  # one unit's forward
    back_gather = where(backward_gathers, gather, 0.0)
    hidden_bwd = where(backward_prefetch >= 1, 0.0, back_gather) + where(backward_prefetch >= 2, 0.0, scatter)
    exposed_bwd = back_gather + scatter - hidden_bwd
    hide = lambda c, comp: overlapped(c, comp, slowdown)  # noqa: E731
    overlapped_s = units * (hide(gather, per_unit) + hide(regathered * gather, rec * per_unit)
                            + hide(hidden_bwd, 2 * per_unit) + exposed_bwd) + gather - hide(gather, per_unit)
    return where(overlap, overlapped_s, units * ((1 + regathered) * gather + back_gather + scatter))
