"""The accelerator as the time model sees it (DESIGN §3): the catalog's spec sheet times the
achieved fractions (conventions.toml [efficiency], or a calibrated profile), NCCL's tuning
constants, and the GEMM and attention curves of the plan's kernels.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..plan import Layout, conventions
from . import comm
from .attention_rates import flash_curve_points, triton_attention_curve
from .gemm_rates import GemmResiduals, gemm_residuals, gemm_shape, gemm_training_fraction
from .gemm_shape import GemmShape
from .memo import Memo, cached_hash


def efficiencies(layout: Layout, profile: dict | None = None) -> dict:
    """Achieved fractions for this accelerator: a calibrated profile's values when given,
    else the documented defaults in conventions.toml [efficiency]."""
    eff = conventions()["efficiency"]
    name = layout.gpu.name
    shape = eff["gemm_shape"].get(name)
    out = {
        "gemm": eff["gemm"][name] * gemm_training_fraction(name) if name in eff["gemm"] else eff["gemm_default"],
        "gemm_shape": shape,
        "flash": eff["flash_attention"].get(name, eff["flash_attention_default"]),
        "flash_curve": eff["flash_attention_curve"].get(name),
        "flash_forward_curve": eff["flash_attention_forward_curve"].get(name),
        "hbm": eff["hbm"],
        "nvlink": eff["nvlink_ring"],
        "nic": eff["nic"],
        "latency": tuple(eff["nccl_latency_us"][k] * 1e-6
                         for k in ("base", "nvlink_step", "net_step", "nvls", "nvls_tree_net_step")),
        "flash_head_dim_multiple": eff["flash_head_dim_multiple"],
        "overlap_slowdown": eff["overlap_compute_slowdown"],
        "nccl": nccl_tuning(name, float(layout.gpu.nic_gbps or 0.0)),
        "a2a_nvlink": eff["all_to_all"]["nvlink"],
    }
    if profile:
        out.update({k: v for k, v in profile.items() if k in out})
        if "gemm_shape" not in profile and any(k in profile for k in ("gemm", "gemm_curve", "gemm_k_curve")):
            out["gemm_shape"] = None  # GEMMs measured on this machine replace the catalog's fit
        if "gemm" in profile:
            # a profile's GEMM figure is the best measured matmul (like the catalog's MAMF):
            # training GEMMs reach the same share of it
            out["gemm"] = profile["gemm"] * gemm_training_fraction(name)
        if "flash" in profile and "flash_curve" not in profile:
            out["flash_curve"] = None  # a measured figure replaces the catalog's published curve
        if "flash" in profile or "flash_curve" in profile:
            out["flash_forward_curve"] = None  # the published split belongs to the published total
    if out["gemm_shape"]:  # a fitted main-loop rate: its write-back and kernel time are priced apart
        out["gemm"] = out["gemm_shape"]["mainloop"] * gemm_training_fraction(name)
    out["gemm_16"] = out["gemm"]
    if layout.plan.precision == "fp8" and layout.gpu.peak("fp8") and name in eff["gemm_fp8"] and name in eff["gemm"]:
        # fp8 GEMMs reach a smaller share of their (twice as high) peak: the published MAMF ratio
        out["gemm"] *= eff["gemm_fp8"][name] / eff["gemm"][name]
    if layout.plan.attention == "triton":
        fa2, triton = (out["flash"], out["flash_curve"]), eff["flash_attention_triton"]
        out["flash_curve"] = triton_attention_curve(*fa2, triton)
        out["flash_forward_curve"] = triton_attention_curve(*fa2, triton, forward=True)
    if layout.plan.attention == "cudnn" and name in eff["cudnn_attention_curve"]:
        out["flash_curve"] = eff["cudnn_attention_curve"][name]  # published; a profile measures SDPA's FA2
        out["flash_forward_curve"] = eff["cudnn_attention_forward_curve"].get(name)
    return out


@lru_cache(maxsize=64)
def nccl_tuning(gpu_name: str, nic_gbps: float = 0.0) -> comm.NcclTuning:
    """NCCL's tuning constants for this accelerator (conventions.toml [efficiency.nccl] and
    [efficiency.nccl_latency_us]), in seconds and bytes/s; `nic_gbps`, its NIC's line rate, sets
    the per-channel ceilings of calls that cross nodes (`channel_caps`)."""
    eff = conventions()["efficiency"]
    c, lat = eff["nccl"], eff["nccl_latency_us"]
    us = lambda key: tuple(x * 1e-6 for x in c[key])  # noqa: E731
    ll_max = [x * 1e9 for x in c["ll_max_busbw_gbs"]]
    ll_max[0] = c["ll_max_busbw_node_gbs"].get(gpu_name, c["ll_max_busbw_gbs"][0]) * 1e9
    return comm.NcclTuning(
        ring_base=us("ring_base_us"), tree_base=us("tree_base_us"), ring_nvlink=us("ring_nvlink_us"),
        tree_nvlink=us("tree_nvlink_us"), ring_net=us("ring_net_us"), tree_net=us("tree_net_us"),
        net_overhead=c["net_overhead_us_by_gpu"].get(gpu_name, c["net_overhead_us"]) * 1e-6, simple_overhead_factor=c["simple_overhead_factor"],
        ring_plateau=c["ring_allreduce_plateau"], ll_share=c["ll_share"], ll_max_bw=tuple(ll_max),
        ll128_share=c["ll128_share"], ll128_across_nodes=bool(c["ll128_across_nodes"]), tree_share=c["tree_share"], tree_ll_share=c["tree_ll_share"],
        tree_ll128_share=c["tree_ll128_share"], tree_correction=tuple(tuple(r) for r in c["tree_correction"]),
        pat_base=c["pat_base_us"] * 1e-6, pat_per_rank=c["pat_per_rank_us"] * 1e-6,
        pat_net_divisor=c["pat_net_divisor"], pat_share=c["pat_share"], nvls=lat["nvls"] * 1e-6,
        nvls_tree_net=lat["nvls_tree_net_step"] * 1e-6, **channel_caps(c, gpu_name, nic_gbps))


def channel_caps(c: dict, gpu_name: str, nic_gbps: float) -> dict:
    """The shares of a channel's network speed NCCL's per-channel ceilings leave ring LL128, the
    tree and tree LL128 on calls that cross nodes (conventions.toml [efficiency.nccl]
    *_channel_max_gbs): each ceiling over the speed NCCL's search gives a channel through one
    NIC, the highest of its speeds the NIC's line rate reaches; the tree's at two nodes and at
    more. None where the accelerator has no NCCL generation or no NIC (no ceiling)."""
    gen = c["generation"].get(gpu_name)
    if gen is None or nic_gbps <= 0:
        return {}
    speeds = c["net_channel_speeds_gbs"].get(gen, c["net_channel_speeds_gbs"]["default"])
    line = nic_gbps / 8
    speed = max((s for s in speeds if s <= line), default=min(speeds))
    return {"ring_ll128_cap": c["ring_ll128_channel_max_gbs"][gen] / speed,
            "tree_cap": tuple(x / speed for x in c["tree_channel_max_gbs"][gen]),
            "tree_ll128_cap": tuple(x / speed for x in c["tree_ll128_channel_max_gbs"][gen])}


@dataclass(frozen=True)
class Hardware:
    """The accelerator as the time model sees it (achieved rates, bytes/s and FLOP/s)."""

    peak: float  # dense FLOP/s of the compute dtype (bf16 under fp8: attention and the head stay 16-bit)
    gemm_peak: float  # the layers' GEMM FLOP/s (fp8 when the recipe is fp8)
    peak_dense: float  # the MFU denominator: the dense peak of the dtype the layers' GEMMs run in
    sms: int
    hbm: float
    nvlink: float  # achieved unidirectional ring bandwidth per GPU
    nic: float
    latency: tuple  # NCCL's latency model: ring (base, NVLink hop, network hop), NVLS (step, tree network step), s
    gemm_eff: float
    flash_eff: float
    attention_kernel: str  # the plan's attention (flash_head_dim pads by kernel)
    flash_head_dim_multiple: int
    overlap_slowdown: float  # compute slowdown beside overlapped data-parallel collectives
    h2d: float  # host <-> device bytes/s per GPU (PCIe; conventions.toml [data])
    host_memory: float  # the host's memory bytes/s, shared by the GPUs of a node ([offload])
    gemm_curve: GemmResiduals | GemmShape | None = None  # a profile's measured residuals, or the catalog's fit
    flash_curve: tuple | None = None  # FlashAttention fraction by log2 sequence length
    flash_fwd_curve: tuple | None = None  # its forward alone, where published
    eff_16: float | None = None  # 16-bit GEMMs (the head, materialised attention) under an fp8 recipe
    curve_16: GemmResiduals | GemmShape | None = None
    mfu_peak: str = "bf16"  # the dtype whose peak `peak_dense` is (the MFU's label)
    peak_bf16: float | None = None  # the accelerator's bf16 peak (None without bf16)
    peak_fp8: float | None = None  # ... and its fp8 peak (None without fp8)
    nccl: comm.NcclTuning | None = None  # NCCL's algorithm and protocol choice (comm.nccl_call)
    a2a_nvlink: float | None = None  # NVLink bytes/s per GPU of an expert-parallel all-to-all (None: `nvlink`)

    def __hash__(self) -> int:
        return cached_hash(self)

    @property
    def gemm16(self) -> tuple:
        """(efficiency, curve) of the 16-bit GEMMs: the layers' own unless the recipe is fp8."""
        return (self.gemm_eff, self.gemm_curve) if self.eff_16 is None else (self.eff_16, self.curve_16)


_HARDWARE = Memo(256)


def hardware(layout: Layout, profile: dict | None = None) -> Hardware:
    """The accelerator of a plan as the time model sees it; without a calibrated profile one
    object per distinct accelerator and plan settings it reads (memoised)."""
    if profile:
        return _hardware(layout, profile)
    plan, gpu = layout.plan, layout.gpu
    key = (gpu.name, gpu.hbm_tbs, gpu.sms, gpu.scale_up_gbs, gpu.nic_gbps, tuple(gpu.peak_tflops.items()),
           plan.precision, plan.attention, plan.h2d_gbs, plan.host_gbs)
    return _HARDWARE.get(key, lambda: _hardware(layout, None))


def _hardware(layout: Layout, profile: dict | None) -> Hardware:
    plan, gpu = layout.plan, layout.gpu
    e = efficiencies(layout, profile)
    # fp8 recipes (Transformer Engine's) run the layers' GEMMs in fp8; attention, the output
    # head and everything else stay 16-bit
    dtype = "bf16" if plan.precision == "fp8" else plan.precision
    dtype = "tf32" if dtype == "fp32" and gpu.peak("tf32") else dtype
    peak = gpu.peak(dtype) or gpu.peak("bf16")
    # a link the accelerator lacks is one no collective of the plan crosses (plan.cluster_links)
    nvlink = gpu.scale_up_gbs / 2 * 1e9 * e["nvlink"] if gpu.scale_up_gbs else np.inf
    nic = gpu.nic_gbps / 8 * 1e9 * e["nic"] if gpu.nic_gbps else np.inf
    sms = gpu.sms or 108  # A100's count for accelerators the catalog gives none
    fp8 = plan.precision == "fp8" and gpu.peak("fp8") is not None
    gpu_peak = gpu.peak("fp8") if fp8 else peak
    curve_at = lambda speedup: gemm_shape(e["gemm_shape"], speedup) or gemm_residuals(profile, sms)  # noqa: E731
    # MFU divides by the peak of the dtype the layers' GEMMs run in: an fp8 recipe's fp8 peak
    # (against the 16-bit one its GEMMs alone could pass 100%); `mfu_bf16_peak` gives the other
    bf16 = gpu.peak("bf16") or peak
    mfu_peak = "fp8" if fp8 else "bf16" if plan.precision in ("bf16", "fp8") else dtype
    return Hardware(
        peak=peak, gemm_peak=gpu_peak,
        peak_dense=gpu_peak if fp8 else bf16 if plan.precision in ("bf16", "fp8") else peak,
        mfu_peak=mfu_peak, peak_bf16=gpu.peak("bf16"), peak_fp8=gpu.peak("fp8"),
        sms=sms, hbm=gpu.hbm_tbs * 1e12 * e["hbm"], nvlink=nvlink, nic=nic,
        latency=e["latency"], gemm_eff=e["gemm"], flash_eff=e["flash"],
        gemm_curve=curve_at(gpu_peak / (gpu.peak("bf16") or peak)), flash_curve=flash_curve_points(e["flash_curve"]),
        flash_fwd_curve=flash_curve_points(e["flash_forward_curve"]),
        attention_kernel=plan.attention, flash_head_dim_multiple=e["flash_head_dim_multiple"],
        overlap_slowdown=e["overlap_slowdown"], nccl=e["nccl"],
        eff_16=e["gemm_16"] if fp8 else None, curve_16=curve_at(1.0) if fp8 else None,
        a2a_nvlink=gpu.scale_up_gbs / 2 * 1e9 * e["a2a_nvlink"] if gpu.scale_up_gbs else np.inf,
        h2d=(plan.h2d_gbs or conventions()["data"]["h2d_gbs"]) * 1e9,
        host_memory=(plan.host_gbs or conventions()["offload"]["host_memory_gbs"]) * 1e9)
