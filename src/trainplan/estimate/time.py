"""Step time, throughput and MFU (DESIGN §3).

    step = pipeline(compute + exposed TP / EP / CP communication per micro-batch, per stage)
         + exposed data-parallel gradient reduction (and ZeRO-3 parameter gathers)
         + optimizer step

Compute per op is a roofline, max(FLOPs / (peak · efficiency), bytes / (HBM · efficiency)):

* GEMMs: efficiency = the accelerator's best achieved matmul fraction (MAMF / peak, or a
  calibrated profile) x tile quantization (dimensions padded to 128) x wave quantization
  (thread blocks padded to a multiple of the SM count) x an alignment penalty when the
  innermost dimension is not a multiple of 8 elements (16 bytes); on an accelerator with a
  measured shape fit (gemm_shape.py: Hopper) the fitted main loop x its write-back share
  k / (k + k0) + a fixed time per kernel, without wave quantization. Backward = two GEMMs with
  their own shapes: the input gradient (inner dimension the output width n) and the weight
  gradient (inner dimension the tokens).
* FlashAttention: the causal half of the score FLOPs, over the head dimension the kernel pads
  to, at the kernel's achieved fraction for the sequence one call spans (a curve over lengths
  where one is published or measured; FlashAttention in Triton at its published share of FA2);
  materialised attention: its batched matmuls as GEMMs plus the softmax traffic.
* Element-wise ops (norms, residual adds, activation functions, RoPE, dropout): bytes moved
  at HBM speed; backward moves twice the forward's bytes.
* Optimizer: reads gradients, reads and writes master weights and state, writes weights.

Communication: TP 2 all-reduces per layer forward and 2 backward (2 more in a recomputed
forward), exposed unless overlapped; PP activations to the next stage per micro-batch; DP
gradient reduction once per step, hidden behind the backward except what exceeds it when
overlapped, and slowing the compute it overlaps (SMs and HBM shared with NCCL's kernels);
ZeRO-3 adds two parameter all-gathers; EP two all-to-alls per MoE layer each way; CP a ring
exchange of K/V blocks overlapped with attention, or (cp_comm allgather) K/V gathered before
attention and their gradients reduce-scattered after it, exposed.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..plan import DTYPE_BYTES, Layout, conventions
from . import activations as act
from . import all_to_all, comm
from .data import data_report, step_with_data
from .distinct import per_distinct
from .flops import (
    ATTENTION_INPUTS,
    ATTN_BWD_EAGER,
    ATTN_BWD_FUSED,
    first_input_grad_skipped,
    layer_flops,
    op_sac_recomputed,
    step_flops,
)
from .gemm_shape import GemmShape
from .pipeline import SCHEDULE_CODE, WGRAD_SHARE, pipeline_time
from .pipeline_engine import engine_terms
from .recipe import Recipe, recipe

# ZeRO-3/FSDP backward prefetch: the next layer's gather before the current layer's gradients
# (overlapped), after them (FSDP1 BACKWARD_POST: the gather exposed) or on demand (no prefetch:
# gather and reduce-scatter exposed; PyTorch FSDP docs, BackwardPrefetch)
BACKWARD_PREFETCH_CODE = {"pre": 0, "post": 1, "none": 2}
TILE = 128  # GEMM output tile edge used for tile/wave quantization (CUTLASS/cuBLAS 128x128)


# ---- efficiencies ------------------------------------------------------------------------
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
        "nccl": nccl_tuning(name),
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
def nccl_tuning(gpu_name: str) -> comm.NcclTuning:
    """NCCL's tuning constants for this accelerator (conventions.toml [efficiency.nccl] and
    [efficiency.nccl_latency_us]), in seconds and bytes/s."""
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
        nvls_tree_net=lat["nvls_tree_net_step"] * 1e-6)


def triton_attention_curve(flash: float, flash_curve: dict | None, triton: dict, forward: bool = False) -> dict:
    """FlashAttention in Triton by sequence length: the FA2 forward + backward efficiency (its
    curve, else its single figure) at each length the published Triton/FA2 ratio was measured
    at, times that ratio; `forward`, the Triton forward alone over the same FA2 figure
    (conventions.toml [efficiency.flash_attention_triton])."""
    seq = np.asarray(triton["seq"], dtype=float)
    fa2 = np.interp(np.log2(seq), *flash_curve_points(flash_curve)) if flash_curve else np.full(seq.shape, flash)
    ratio = triton["forward_ratio" if forward else "ratio"]
    return {"seq": triton["seq"], "fraction": (fa2 * np.asarray(ratio)).tolist()}


def flash_head_dim(d, kernel: str, multiple: int):
    """The head dimension a FlashAttention kernel computes for a head of `d`, padded columns
    included: FA2 is compiled for multiples of `multiple` (conventions.toml
    flash_head_dim_multiple); the Triton kernel's tiles span the next power of two, at least 16
    (flash_attn_triton.py: BLOCK_HEADDIM = max(next_power_of_2(d), 16)); cuDNN's attention is
    priced at the head dimension as given (no published padding rule)."""
    d = np.maximum(np.asarray(d, dtype=float), 1.0)
    if kernel == "triton":
        return np.maximum(2.0 ** np.ceil(np.log2(d)), 16.0)
    if kernel == "cudnn":
        return d
    return np.ceil(d / multiple) * multiple


def gemm_training_fraction(gpu_name: str) -> float:
    """The share of its best measured matmul rate (MAMF) an accelerator's GEMMs sustain in
    training (conventions.toml [efficiency]: fitted on published runs, docs/accuracy.md)."""
    eff = conventions()["efficiency"]
    return eff["gemm_training_fraction"].get(gpu_name, eff["gemm_training_fraction_of_mamf"])


@dataclass(frozen=True)
class GemmResiduals:
    """What a calibrated profile measured of GEMM efficiency beyond tile and wave quantization:
    a residual by the equal-work square size (log2 n, residual) and one by the inner dimension
    (log2 k, residual), each log-interpolated and flat beyond its ends."""

    size: tuple | None = None
    depth: tuple | None = None
    waves = True  # measured on top of tile and wave quantization
    overhead_s = 0.0  # a kernel's fixed time is inside the measured fractions

    def __call__(self, m, n, k):
        r = 1.0
        if self.depth is not None:
            r = r * np.interp(np.log2(k), *self.depth)
        if self.size is not None:
            r = r * np.interp(np.log2(m * n * k) / 3, *self.size)
        return r


def gemm_shape(fit: dict | None, speedup: float = 1.0) -> GemmShape | None:
    """An accelerator's fitted GEMM shape terms (conventions.toml [efficiency.gemm_shape]), for
    a main loop `speedup` times the bf16 one it was fitted on (fp8): the same write-back then
    costs that many more inner-dimension steps."""
    return GemmShape(fit["k0"] * speedup, fit["overhead_us"] * 1e-6) if fit else None


def gemm_residuals(profile: dict | None, sms: int) -> GemmResiduals | None:
    """The residuals a profile's GEMM sweeps give (None without sweeps)."""
    if not profile:
        return None
    depth = gemm_depth_residual(profile["gemm_k_curve"]) if "gemm_k_curve" in profile else None
    size = gemm_residual_curve(profile["gemm_curve"], sms, depth) if "gemm_curve" in profile else None
    return GemmResiduals(size, depth) if size or depth else None


def gemm_depth_residual(curve: dict) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(log2 k, residual) from a measured sweep of the inner dimension at a fixed large m x n
    {"k": [...], "fraction": [...]}: the fraction at each k relative to the best, capped at 1.
    With m and n fixed, tile and wave quantization are the same at every k; what changes is how
    many k-steps each output tile has to amortise its pipeline fill and its write-back over."""
    frac = np.asarray(curve["fraction"], dtype=float)
    return _log_curve(tuple(curve["k"]), tuple(np.minimum(frac / np.max(frac), 1.0).tolist()))


def gemm_residual_curve(curve: dict, sms: int, depth: tuple | None = None) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(log2 n, residual) from a measured square-GEMM sweep {"n": [...], "fraction": [...]}:
    at each size, the measured fraction of peak that tile and wave quantization (as
    `gemm_efficiency` models them), and the inner-dimension residual `depth` when measured, do
    not explain, relative to the best size, capped at 1. What remains is what makes small GEMMs
    slow besides quantization (launch and pipeline fill, short K loops), which the datasheet
    model cannot know."""
    n = np.asarray(curve["n"], dtype=float)
    frac = np.asarray(curve["fraction"], dtype=float)
    explained = gemm_efficiency(n, n, n, 1.0, sms) * (np.interp(np.log2(n), *depth) if depth else 1.0)
    residual = np.minimum(frac / (np.max(frac) * explained), 1.0)
    return _log_curve(tuple(curve["n"]), tuple(residual.tolist()))


def flash_curve_points(curve: dict | None) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    """(log2 sequence length, fraction of peak) from {"seq": [...], "fraction": [...]}."""
    return _log_curve(tuple(curve["seq"]), tuple(curve["fraction"])) if curve else None


@lru_cache(maxsize=64)
def _log_curve(x: tuple, y: tuple) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """A measured curve as the time model interpolates it: (log2 x, y), both as tuples."""
    return tuple(np.log2(np.asarray(x, dtype=float)).tolist()), tuple(map(float, y))


def flash_efficiency(hw: Hardware, seq, forward: bool = False):
    """FlashAttention's achieved fraction of peak for kernel calls over `seq` tokens, forward +
    backward (or, `forward`, the forward alone where published): the measured curve
    log-interpolated (flat beyond its ends), else the single figure. Short sequences give each
    thread block fewer key blocks to amortise its start over."""
    curve = hw.flash_fwd_curve if forward and hw.flash_fwd_curve is not None else hw.flash_curve
    if curve is None:
        return hw.flash_eff
    return np.interp(np.log2(np.maximum(np.asarray(seq, dtype=float), 1.0)), *curve)


def gemm_efficiency(m, n, k, peak_eff, sms, elem_bytes=2, curve=None):
    """Achieved fraction of peak for an (m x k) @ (k x n) GEMM: tile and wave quantization
    (MLE-P 'tile and wave quantization') times an alignment penalty for an innermost
    dimension that is not a multiple of 16 bytes (thonking.ai: > 2x slower), times, with a
    calibrated profile's `curve` (`GemmResiduals`), the measured residuals at the inner
    dimension k and at the square size of equal work, (m·n·k)^(1/3), interpolated in log size;
    or, with an accelerator's fitted `GemmShape`, its write-back share k / (k + k0) in place
    of wave quantization (gemm_shape.py)."""
    m, n, k = (np.maximum(np.asarray(x, dtype=float), 1) for x in (m, n, k))
    residual = 1.0 if curve is None else curve(m, n, k)
    tiles_m, tiles_n = np.ceil(m / TILE), np.ceil(n / TILE)
    tile_q = (m * n) / (tiles_m * tiles_n * TILE * TILE)
    tiles = tiles_m * tiles_n
    wave_q = tiles / (np.ceil(tiles / sms) * sms) if curve is None or curve.waves else 1.0
    aligned = np.where((np.mod(k * elem_bytes, 16) == 0) & (np.mod(n * elem_bytes, 16) == 0), 1.0, 0.5)
    return peak_eff * tile_q * wave_q * aligned * residual


def _gemm_time(m, n, k, count, peak, eff, sms, elem_bytes, curve=None):
    """Seconds of `count` (m x k) @ (k x n) GEMMs issued as one kernel (a batched or grouped
    GEMM: routed experts, attention heads), with its fixed time once when a fit gives one."""
    flops = 2.0 * m * n * k * count
    overhead = 0.0 if curve is None else curve.overhead_s
    return flops / (peak * gemm_efficiency(m, n, k, eff, sms, elem_bytes, curve)) + overhead


@lru_cache(maxsize=1024)
def _linears(model, index):
    return tuple(model.layer_linears(index))


SPLIT = {"none": 0, "col": 1, "row": 2, "kv": 3}


@dataclass(frozen=True, eq=False)  # hashed by identity: one cached instance per model and kind
class LayerGemms:
    """The weight matrices of one layer kind as arrays (one entry per linear)."""

    fan_in: np.ndarray
    fan_out: np.ndarray
    split: np.ndarray  # SPLIT codes
    expert: np.ndarray  # 1.0 for routed-expert matrices
    count: np.ndarray


def _gemms_of(lins) -> LayerGemms:
    col = lambda f: np.array([f(lin) for lin in lins], dtype=float)  # noqa: E731
    return LayerGemms(col(lambda x: x.fan_in), col(lambda x: x.fan_out), col(lambda x: SPLIT[x.tp]),
                      col(lambda x: float(x.expert)), col(lambda x: x.count))


@lru_cache(maxsize=256)
def layer_gemms(model, moe: bool) -> LayerGemms:
    index = model.first_layer(moe)
    return _gemms_of(_linears(model, index) if index is not None else ())


@lru_cache(maxsize=256)
def lora_gemms(model, moe: bool, targets: tuple, rank: int) -> LayerGemms:
    """LoRA's adapter matrices on one layer kind's targeted linears (Hu et al. 2021: W + A·B, A of
    fan_in x r, B of r x fan_out): A splits like its base's input (row-parallel bases split it,
    the others see the whole input) and B like its base's output."""
    index = model.first_layer(moe)
    lins = [lin for lin in (_linears(model, index) if index is not None else ()) if lin.name in targets]
    pairs = [((lin.fan_in, rank, SPLIT["row"] if lin.tp == "row" else SPLIT["none"]),
              (rank, lin.fan_out, SPLIT[lin.tp] if lin.tp in ("col", "kv") else SPLIT["none"]), lin)
             for lin in lins]
    mats = [(a, lin) for pa, pb, lin in pairs for a in (pa, pb)]
    col = lambda f: np.array([f(m, lin) for m, lin in mats], dtype=float)  # noqa: E731
    return LayerGemms(col(lambda m, _: m[0]), col(lambda m, _: m[1]), col(lambda m, _: m[2]),
                      col(lambda _, lin: float(lin.expert)), col(lambda _, lin: lin.count))


@lru_cache(maxsize=256)
def attention_input_gemms(model) -> LayerGemms:
    """The first layer's projections of its normalised input (flops.ATTENTION_INPUTS)."""
    return _gemms_of([lin for lin in _linears(model, 0) if lin.name in ATTENTION_INPUTS])


def layer_gemm_time(g: LayerGemms, tokens, tp, ep, kv_heads, top_k, peak, eff, sms, elem_bytes, curve=None,
                    backward=False, weight_grad=True):
    """GEMM seconds of one layer's forward (or, `backward`, its input-gradient GEMMs and, with
    `weight_grad`, its weight-gradient ones: frozen weights have none) for `tokens` tokens on one
    rank; every argument may be an array (layouts), the layer's linears are the last axis.
    Layouts share few GEMM shapes, so each distinct (tokens, tp, ep) is timed once."""
    if g.fan_in.size == 0:
        return np.zeros(np.broadcast(tokens, tp).shape)
    if np.ndim(tokens) == np.ndim(tp) == np.ndim(ep) == 0:  # one layout (plan, explorer): memoised
        return _one_layer_gemm_time(g, float(tokens), float(tp), float(ep), kv_heads, top_k, peak, eff, sms,
                                    elem_bytes, curve, backward, weight_grad)
    return per_distinct(_layer_gemm_time, {"tokens": tokens, "tp": tp, "ep": ep}, g=g, kv_heads=kv_heads,
                        top_k=top_k, peak=peak, eff=eff, sms=sms, elem_bytes=elem_bytes, curve=curve,
                        backward=backward, weight_grad=weight_grad)


@lru_cache(maxsize=4096)
def _one_layer_gemm_time(g, tokens, tp, ep, kv_heads, top_k, peak, eff, sms, elem_bytes, curve, backward,
                         weight_grad):
    return _layer_gemm_time(g, tokens, tp, ep, kv_heads, top_k, peak, eff, sms, elem_bytes, curve, backward,
                            weight_grad)


def _layer_gemm_time(g: LayerGemms, tokens, tp, ep, kv_heads, top_k, peak, eff, sms, elem_bytes, curve=None,
                     backward=False, weight_grad=True):
    ex = lambda x: np.asarray(x, dtype=float)[..., None]  # noqa: E731
    tokens, tp, ep = ex(tokens), ex(tp), ex(ep)
    k = np.where(g.split == SPLIT["row"], g.fan_in / tp, g.fan_in)
    n = np.where(g.split == SPLIT["col"], g.fan_out / tp,
                 np.where(g.split == SPLIT["kv"], g.fan_out / np.minimum(tp, kv_heads), g.fan_out))
    # routed experts: ep ranks host E/ep experts each and receive top_k·tokens tokens in all
    m = np.where(g.expert > 0, top_k * tokens * ep / g.count, tokens)
    count = np.where(g.expert > 0, g.count / ep, 1.0)
    if backward:  # dX = dY·Wᵀ (inner dimension n) and dW = Xᵀ·dY (inner dimension m, the tokens)
        dw = _gemm_time(k, n, m, count, peak, eff, sms, elem_bytes, curve) if weight_grad else 0.0
        return np.sum(_gemm_time(m, k, n, count, peak, eff, sms, elem_bytes, curve) + dw, axis=-1)
    return np.sum(_gemm_time(m, n, k, count, peak, eff, sms, elem_bytes, curve), axis=-1)


def last_linear_time(g: LayerGemms, tokens, tp, peak, eff, sms, elem_bytes, curve=None):
    """Forward seconds of a layer's last linear (a dense block's MLP down projection)."""
    if g.fan_in.size == 0:
        return 0.0
    k = g.fan_in[-1] / tp if g.split[-1] == SPLIT["row"] else g.fan_in[-1]
    return _gemm_time(tokens, g.fan_out[-1], k, g.count[-1], peak, eff, sms, elem_bytes, curve)


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

    @property
    def gemm16(self) -> tuple:
        """(efficiency, curve) of the 16-bit GEMMs: the layers' own unless the recipe is fp8."""
        return (self.gemm_eff, self.gemm_curve) if self.eff_16 is None else (self.eff_16, self.curve_16)


def hardware(layout: Layout, profile: dict | None = None) -> Hardware:
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


# ---- the step: one formula, numbers or arrays (DESIGN §2) ---------------------------------
def step_time_core(model, hw: Hardware, r, *, tp, pp, dp, cp, ep, zero, mbs, seq, m, vpp, schedule,
                   recompute, eager, dropout, overlap_tp, overlap_dp, offload_optimizer, gpn,
                   stage_dense, stage_moe, first, last, total_dense, total_moe, vocab_padded,
                   trainable, gbs, gpus, model_flops, hw_flops, sp=False, sharp=False, cp_allgather=False,
                   data_s=0.0, prefetch=True, backward_prefetch=0, dp_shard=None, lora=None,
                   recompute_layers=None, offload_params=False, ep_node_limit=None, ep_overlap=False) -> dict:
    """Step time and its breakdown. Layout arguments broadcast against the stage arrays
    (stage_dense, stage_moe, first, last: the stages to consider, last axis); total_dense /
    total_moe are the layers of all stages (for the pipeline's sum over stages)."""
    stages = stage_times(model, hw, r, tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, mbs=mbs, seq=seq, recompute=recompute,
                         eager=eager, dropout=dropout, overlap_tp=overlap_tp, gpn=gpn, stage_dense=stage_dense,
                         stage_moe=stage_moe, first=first, last=last, total_dense=total_dense,
                         total_moe=total_moe, vocab_padded=vocab_padded, sp=sp, sharp=sharp,
                         cp_allgather=cp_allgather, recompute_layers=recompute_layers, ep_node_limit=ep_node_limit,
                         ep_overlap=ep_overlap, **(lora or {}))
    out = step_from_stages(stages, hw, r, pp=pp, dp=dp, cp=cp, tp=tp, zero=zero, m=m, vpp=vpp,
                           schedule=schedule, overlap_dp=overlap_dp, offload_optimizer=offload_optimizer,
                           gpn=gpn, trainable=trainable, gbs=gbs, seq=seq, gpus=gpus, model_flops=model_flops,
                           hw_flops=hw_flops, sharp=sharp, data_s=data_s, prefetch=prefetch,
                           backward_prefetch=backward_prefetch, dp_shard=dp_shard, offload_params=offload_params,
                           stage_layers=(np.asarray(total_dense, dtype=float) + total_moe) / pp,
                           recompute=recompute, modules_per_layer=modules_per_layer(model, r))
    return {**out, "detail": stages["detail"]}


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


def lora_arguments(plan) -> dict:
    """`stage_times`' and `step_flops`' LoRA arguments for a plan: its targets and rank under
    LoRA/QLoRA, and whether its recomputation checkpoints the first layer reentrantly (without
    early stop; any layers recomputed include the first); none when it trains in full."""
    if plan.finetune == "full":
        return {}
    return {"lora_targets": tuple(plan.lora_targets), "lora_rank": plan.lora_rank,
            "reentrant_checkpoint": not recipe(plan).early_stop_checkpoint and plan.recompute_layers != 0}


def stage_times(model, hw: Hardware, r, *, tp, pp, dp, cp, ep, mbs, seq, recompute, eager, dropout,
                overlap_tp, gpn, stage_dense, stage_moe, first, last, total_dense, total_moe,
                vocab_padded, sp=False, sharp=False, cp_allgather=False, lora_targets=None, lora_rank=0,
                reentrant_checkpoint=False, recompute_layers=None, ep_node_limit=None, ep_overlap=False) -> dict:
    """One micro-batch's forward + backward seconds on each stage, by part ("parts", stage
    axis last), the same summed over all stages ("totals") and the point-to-point transfer
    between stages ("p2p"). Nothing here depends on the pipeline schedule. `lora_targets`
    (LoRA/QLoRA fine-tuning): the base weights are frozen, so their backward computes input
    gradients only, and rank-`lora_rank` adapters on the targeted linears add their GEMMs
    (`reentrant_checkpoint`: see `flops.first_input_grad_skipped`). Full recomputation re-runs
    the first `recompute_layers` layers of each stage (all when None)."""
    f = lambda x: np.asarray(x, dtype=float)  # noqa: E731
    tp, pp, dp, cp, ep, mbs, seq = (f(x) for x in (tp, pp, dp, cp, ep, mbs, seq))
    rc = f(recompute)
    eager, overlap_tp = f(eager) > 0, f(overlap_tp) > 0
    elem = r.act_bytes
    h = model.hidden
    tokens = mbs * seq / cp
    kvh = model.heads if model.is_mla else model.n_kv_heads
    frozen = lora_targets is not None
    gemm, gemm_bwd = ({kind: layer_gemm_time(layer_gemms(model, kind == "moe"), tokens, tp, ep, kvh, model.top_k,
                                             hw.gemm_peak, hw.gemm_eff, hw.sms, elem, hw.gemm_curve, backward,
                                             weight_grad=not frozen)
                       for kind in ("dense", "moe")} for backward in (False, True))
    first_input_grad = 0.0
    if frozen:  # the adapters: x·A then ·B forward, both gradients of each in the backward
        for backward, out in ((False, gemm), (True, gemm_bwd)):
            for kind in ("dense", "moe"):
                out[kind] = out[kind] + layer_gemm_time(
                    lora_gemms(model, kind == "moe", tuple(lora_targets), int(lora_rank)), tokens, tp, ep, kvh,
                    model.top_k, hw.gemm_peak, hw.gemm_eff, hw.sms, elem, hw.gemm_curve, backward)
        # the frozen embedding's output needs no gradient: the first layer's attention input
        # projections skip their input-gradient GEMMs (flops.step_flops counts the same)
        first_input_grad = layer_gemm_time(attention_input_gemms(model), tokens, tp, ep, kvh, model.top_k,
                                           hw.gemm_peak, hw.gemm_eff, hw.sms, elem, hw.gemm_curve, True,
                                           weight_grad=False) * first_input_grad_skipped(rc, reentrant_checkpoint)
    heads_local = model.heads / tp
    qk = model.q_dim / model.heads
    vd = model.attn_out_dim / model.heads
    eff16, curve16 = hw.gemm16
    attn_eager = 2 * _gemm_time(seq, seq, qk, mbs * heads_local / cp, hw.peak, eff16, hw.sms, elem, curve16) \
        + (mbs * heads_local * seq * seq / cp) * elem * 4 / hw.hbm  # softmax in and out, mask
    # FlashAttention: the causal half of 2·s·(qk + v) per token and head, at its efficiency
    # for the s/cp tokens one kernel call spans (a context-parallel ring computes s/cp blocks),
    # over the head dimensions the kernel pads to
    qk_run, vd_run = (flash_head_dim(d, hw.attention_kernel, hw.flash_head_dim_multiple) for d in (qk, vd))
    attn_flops = 0.5 * tokens * seq * heads_local * 2 * (qk_run + vd_run)
    attn_flash = attn_flops / (hw.peak * flash_efficiency(hw, seq / cp))
    attn_bwd = np.where(eager, ATTN_BWD_EAGER, ATTN_BWD_FUSED)
    # forward + backward at the kernel's combined efficiency; where its forward alone is
    # published (Hopper FA2, cuDNN, the Triton kernel) the forward, and a recomputed forward,
    # take that speed and the backward the rest of the same total
    attn_total = np.where(eager, attn_eager, attn_flash) * (1 + attn_bwd)
    attn = np.where(eager, attn_eager, attn_flash if hw.flash_fwd_curve is None else
                    attn_flops / (hw.peak * flash_efficiency(hw, seq / cp, forward=True)))
    attn_backward = attn_total - attn
    # norms, residual adds and dropout see the full hidden width of every token, or 1/t of the
    # tokens under sequence parallelism (Korthikanti et al. 2022 §4.2.2); the MLP activation
    # and RoPE work on the TP-sharded width, in an MoE layer on each of a token's top-k routed
    # copies (expert parallelism brings a rank as many as it sends) and the shared experts
    hidden_shard = np.where(f(sp) > 0, tp, 1.0)
    mlp_width = {"dense": model.ffn,
                 "moe": model.top_k * (model.expert_ffn or model.ffn) + model.shared_ffn_total if model.is_moe else 0}
    drop_fwd, drop_bwd = dropout_passes(r.fused_kernels, elem)
    dropped = f(dropout) > 0
    elementwise, elementwise_bwd = {}, {}
    for kind, width in mlp_width.items():
        sharded = model.mlp_matrices * width / tp \
            + (2 * (model.q_dim + model.kv_dim) / tp if model.position == "rotary" else 0)
        elementwise[kind] = tokens * ((10 + drop_fwd * dropped) * h / hidden_shard + sharded) * elem / hw.hbm
        elementwise_bwd[kind] = tokens * ((20 + drop_bwd * dropped) * h / hidden_shard + 2 * sharded) * elem / hw.hbm
    # QLoRA (bitsandbytes' MatMul4Bit): every use of a quantized weight dequantizes it to the
    # compute dtype first, in the forward (and a recomputed forward) and for the backward's input
    # gradient: a pass reading the packed weight and writing the 16-bit one
    dequant = {kind: 0.0 for kind in ("dense", "moe")}
    # LoRA's dropout on each adapter's input: a pass reading it and writing the dropped copy and
    # its 1-byte mask, and in the backward one reading the gradient and the mask
    adapter_drop = {kind: 0.0 for kind in ("dense", "moe")}
    if frozen:
        from .memory import layer_matrix_params, model_numbers

        mn = model_numbers(model)
        targets = {name: 1.0 for name in lora_targets}
        for kind, lp in (("dense", mn.dense), ("moe", mn.moe)):
            if r.frozen_weight_bytes < r.compute_weight_bytes:
                dequant[kind] = layer_matrix_params(lp, tp, ep, mn.kv_heads) * (r.frozen_weight_bytes + elem) / hw.hbm
            if r.lora_dropout:
                widths = act.adapter_inputs(mn.shape, targets, moe=kind == "moe", tp=tp)
                adapter_drop[kind] = tokens * widths * (2 * elem + act.MASK_BYTES) / hw.hbm
    # A non-reentrant checkpoint with early stop ends a dense block's recomputation before its
    # last linear (flops.py): that GEMM, and the TP collective after it, are not re-run.
    skip = float(r.recompute_skips_last_linear)
    shared = model.shared_ffn_total * (not model.shared_expert_gate)
    skipped = {"dense": skip * last_linear_time(layer_gemms(model, False), tokens, tp, hw.gemm_peak, hw.gemm_eff,
                                                hw.sms, elem, hw.gemm_curve),
               "moe": skip * (_gemm_time(tokens, h, shared / tp, 1, hw.gemm_peak, hw.gemm_eff, hw.sms, elem,
                                         hw.gemm_curve) if shared else 0.0)}
    op_sac_gemm_share = (op_sac_recomputed(model) / max(layer_flops(model).dense_gemm, 1.0)
                         * float(r.linear_in_bytes >= 2))  # float8 matmuls are all saved
    # per layer: its time without recomputation, and what recomputation adds to it
    compute, recompute_extra, layer = {}, {}, {}
    for kind in gemm:
        elem_fwd, elem_bwd = elementwise[kind] + adapter_drop[kind], elementwise_bwd[kind] + adapter_drop[kind]
        fwd = gemm[kind] + attn + elem_fwd + dequant[kind]
        # per-op selective checkpointing re-runs every second matmul (by FLOPs' share of the GEMM
        # time) and every element-wise op, not the attention core (flops.op_sac_recomputed)
        op_sac = gemm[kind] * op_sac_gemm_share + elem_fwd
        recompute_extra[kind] = np.where(rc == 2, fwd - skipped[kind],
                                         np.where(rc == 1, attn, np.where(rc == 3, op_sac, 0.0)))
        compute[kind] = fwd + gemm_bwd[kind] + attn_backward + elem_bwd + dequant[kind]
        layer[kind] = {"gemm_forward": gemm[kind], "gemm_backward": gemm_bwd[kind], "attention_forward": attn,
                       "attention_backward": attn_backward, "elementwise_forward": elem_fwd,
                       "elementwise_backward": elem_bwd, "dequantize": dequant[kind],
                       "recompute": recompute_extra[kind], "total": compute[kind] + recompute_extra[kind]}

    # -- communication per layer and micro-batch
    # (each call at the algorithm and protocol NCCL picks for its size: comm.nccl_call)
    tp_ar = collective(hw, comm.ALL_REDUCE, tokens * h * elem, tp, 1, gpn, sharp)
    # Chunked TP overlap (Megatron --tp-comm-overlap) hides the collectives behind the GEMMs of
    # the same pass; what exceeds them stays exposed.
    tp_fwd = np.where(overlap_tp, np.maximum(0.0, 2 * tp_ar - gemm["dense"]), 2 * tp_ar)
    tp_bwd = np.where(overlap_tp, np.maximum(0.0, 2 * tp_ar - gemm_bwd["dense"]),
                      tp_backward(model, hw, r, tp_ar, tokens=tokens, tp=tp, ep=ep, kv_heads=kvh, sp=f(sp) > 0,
                                  frozen=frozen))
    # (early stop: the attention's collective only; per-op selective checkpointing keeps the
    # reduce-scatters' outputs and re-runs the all-gathers, or every all-reduce without SP)
    tp_extra = {kind: np.where(rc == 2, tp_fwd * (1 - 0.5 * (kind == "dense") * skip),
                               np.where(rc == 3, tp_fwd * np.where(f(sp) > 0, 0.5, 1.0), 0.0))
                for kind in ("dense", "moe")}
    # EP: a dispatch and a combine each way per MoE layer (estimate/all_to_all.py; a recomputed
    # forward's are not priced); beside another micro-batch's compute under `ep_overlap`
    # (DualPipe), what outlasts that compute and the slowdown of the compute it overlaps exposed
    a2a = all_to_all.dispatch_time(h * elem, tokens, model.top_k, ep, tp * cp, gpn,
                                   hw.a2a_nvlink or hw.nvlink, hw.nic, link(hw, comm.ALL_TO_ALL, ep, tp * cp, gpn)[1],
                                   ep_node_limit) if model.is_moe else 0.0
    cp_ring = collective(hw, comm.ALL_GATHER, tokens * 2 * model.kv_dim / tp * elem * cp, cp, tp, gpn)
    # The ring passes K/V blocks around while attention runs (forward, and K/V plus their
    # gradients in the backward); the all-gather variant (Llama 3, Dubey et al. 2024 §3.3.2)
    # gathers K/V before attention and reduce-scatters their gradients after it, "exposed in
    # the critical path", again for a recomputed forward.
    cp_layer = np.where(f(cp_allgather) > 0, 2 * cp_ring, 3 * np.maximum(0.0, cp_ring - attn))
    cp_extra = np.where(f(cp_allgather) > 0, (rc == 2) * cp_ring, 0.0)
    # PP: each micro-batch sends 1/t of its activations forward and their gradients back
    # (Megatron's scatter-gather optimization, Narayanan et al. 2021 §4.1), on the critical
    # path of 1F1B; neighbouring stages are tp·cp·dp ranks apart.
    p2p = np.where(pp > 1, comm.collective_time(comm.SEND_RECV, tokens * h * elem / tp, 2,
                                                *link(hw, comm.SEND_RECV, 2, tp * cp * dp, gpn)), 0.0)
    # the output head's GEMM forward and its two backward GEMMs (frozen: the input gradient's
    # only), and the loss's passes over the logits
    eff16, curve16 = hw.gemm16
    head = (2 if frozen else 3) * _gemm_time(tokens, vocab_padded / tp, h, 1, hw.peak, eff16, hw.sms, elem, curve16) \
        + tokens * vocab_padded / tp * (r.loss_traffic_bytes + r.loss_backward_bytes) / hw.hbm
    # the embedding's lookup, and its gradient's two passes unless it is frozen
    embed_fwd = tokens * h * elem * 2 / hw.hbm
    embed_passes = 1 if frozen else 3

    def ep_exposed(one, recomputed, overlap=ep_overlap):
        """One MoE layer's exposed all-to-all seconds per micro-batch."""
        total = 4 * one
        return np.where(f(overlap) > 0, overlapped(total, compute["moe"] + recomputed * recompute_extra["moe"],
                                                   hw.overlap_slowdown), total)

    def per_stage(dense, moe, first_, last_, n_stages, recomputed):
        """recomputed: the share of the layers whose recomputation is paid"""
        return {
            "compute": dense * (compute["dense"] + recomputed * recompute_extra["dense"])
            + moe * (compute["moe"] + recomputed * recompute_extra["moe"]) + last_ * head
            + first_ * (embed_passes * embed_fwd - first_input_grad),
            "tp_comm": dense * (tp_fwd + tp_bwd + recomputed * tp_extra["dense"])
            + moe * (tp_fwd + tp_bwd + recomputed * tp_extra["moe"]),
            "ep_comm": moe * ep_exposed(a2a, recomputed),
            "cp_comm": (dense + moe) * (cp_layer + recomputed * cp_extra),
            "pp_comm": n_stages * 2 * p2p,
        }

    stage_layers = f(stage_dense) + f(stage_moe)
    share = recomputed_share(rc, recompute_layers, stage_layers)
    parts = per_stage(f(stage_dense), f(stage_moe), f(first), f(last), 1.0, share)
    totals = per_stage(f(total_dense), f(total_moe), 1.0, 1.0, pp,
                       model_recomputed_share(rc, recompute_layers, stage_layers))
    # the terms above, one layer of each kind and one micro-batch (for `plan --explain`)
    # (the collectives per layer: with a recomputation's share of them where only some layers are recomputed)
    detail = {"layer": layer, "tp_layer": {kind: tp_fwd + tp_bwd + share * tp_extra[kind] for kind in tp_extra},
              "cp_layer": cp_layer + share * cp_extra, "ep_layer": ep_exposed(a2a, share),
              "a2a": a2a, "moe_layer_compute": compute["moe"] + share * recompute_extra["moe"],
              "head": head, "embedding": embed_passes * embed_fwd, "p2p": p2p,
              # one layer's tensor-parallel seconds by pass (the recomputation's: full recomputation)
              "tp_passes": {kind: {"forward": tp_fwd, "backward": tp_bwd, "recompute": tp_extra[kind]}
                            for kind in tp_extra}}
    # what DualPipe's overlap of one micro-batch's all-to-alls with another's compute saves where
    # the plan does not already overlap them (step_from_stages applies it under that schedule)
    saving = {"ep_saving": f(stage_moe) * (ep_exposed(a2a, share, False) - ep_exposed(a2a, share, True))
              * (f(ep_overlap) == 0)}
    slow = slowest_stage(parts, saving)
    ep_saving_total = f(total_moe) * (ep_exposed(a2a, 1.0, False) - ep_exposed(a2a, 1.0, True)) * (f(ep_overlap) == 0)
    return {**slow, "ep_saving": slow["slowest_extra"]["ep_saving"], "ep_saving_total": ep_saving_total,
            "totals": sum(totals.values()), "p2p": p2p, "detail": detail}


def dropout_passes(fused: bool, elem: float) -> tuple[float, float]:
    """One layer's two hidden-width dropouts (after the attention projection and after the MLP)
    in one-way passes over an `elem`-byte activation, forward and backward. Megatron's fused
    bias-dropout-add (megatron/model/fused_bias_dropout.py, bias_dropout_add_fused_train) reads
    the branch and the residual and writes their sum, the residual add's own passes, plus the
    1-byte mask; its backward reads the gradient and the mask and writes the branch's gradient.
    Unfused, each dropout is its own pass over the activation: a read, a write and the mask
    (counted as a full element), and twice that backward."""
    mask = act.MASK_BYTES / elem
    if fused:
        return 2 * mask, 2 * (2 + mask)
    return 6.0, 12.0


def tp_backward(model, hw: Hardware, r, tp_ar, *, tokens, tp, ep, kv_heads, sp, frozen):
    """Exposed seconds of one layer's backward tensor-parallel collectives: the two
    column-parallel linears' input-gradient all-reduces (`tp_ar` each). Where the framework
    issues them asynchronously (`r.tp_backward_overlap`: Megatron) they run beside the weight-
    gradient GEMMs of those linears, adding what outlasts them and slowing the GEMMs they overlap
    (`overlapped`); under sequence parallelism the reduce-scatter runs beside the weight gradient
    and the re-gather of the saved input shard beside the input gradient (two all-reduces' worth
    beside both GEMMs), while the row-parallel linears' output-gradient all-gathers, which their
    GEMMs wait for, stay exposed (half an all-reduce each). A frozen base has no weight gradient
    to hide behind."""
    if not r.tp_backward_overlap:
        return 2 * tp_ar
    g = column_gemms(model)
    args = (g, tokens, tp, ep, kv_heads, model.top_k, hw.gemm_peak, hw.gemm_eff, hw.sms, r.act_bytes, hw.gemm_curve)
    both = layer_gemm_time(*args, backward=True, weight_grad=not frozen)
    dgrad = layer_gemm_time(*args, backward=True, weight_grad=False)
    beside = np.where(sp, both, both - dgrad)
    return np.where(sp, tp_ar, 0.0) + overlapped(2 * tp_ar, beside, hw.overlap_slowdown)


@lru_cache(maxsize=256)
def column_gemms(model) -> LayerGemms:
    """A dense layer's column-parallel linears (attention's input projections, the MLP's up and
    gate projections): those whose input gradient is all-reduced over tensor parallelism."""
    index = model.first_layer(False)
    lins = _linears(model, index if index is not None else 0)
    return _gemms_of([lin for lin in lins if lin.tp in ("col", "kv")])


def recomputed_share(recompute, recompute_layers, layers):
    """The share of `layers` whose recomputation is paid: under full recomputation its first
    `recompute_layers` (Megatron's --recompute-method block; all when None), every layer
    otherwise (selective recomputation, or none, which adds nothing)."""
    if recompute_layers is None:
        return 1.0
    layers = np.asarray(layers, dtype=float)
    share = np.minimum(recompute_layers, layers) / np.maximum(layers, 1.0)
    return np.where(np.asarray(recompute) == 2, share, 1.0)


def model_recomputed_share(recompute, recompute_layers, stage_layers):
    """`recomputed_share` over all the stages together (`stage_layers`: every stage's layers,
    stage axis last), for the FLOPs and the pipeline's sum over stages."""
    if recompute_layers is None:
        return 1.0
    share = recomputed_share(recompute, recompute_layers, stage_layers)
    return np.sum(share * stage_layers, axis=-1) / np.maximum(np.sum(stage_layers, axis=-1), 1.0)


def slowest_stage(parts: dict, extra: dict | None = None) -> dict:
    """The slowest stage of per-stage times by part (stage axis last): its seconds per
    micro-batch in all ("slowest_s") and by part ("slowest_parts"), and every stage's total
    ("stage_s"); `extra` per-stage figures outside the total, taken on that stage too
    ("slowest_extra")."""
    stage = sum(parts.values())
    slow = np.argmax(stage, axis=-1)
    n_stages = stage.shape[-1]
    slow_flat = np.arange(slow.size) * n_stages + slow.ravel()  # the slowest stage's flat index

    def pick(a):
        """The value on the slowest stage of a per-stage array (keeping the stage axis as one
        entry, so it lines up with layout arrays shaped (..., 1)); `a` itself otherwise."""
        a = np.asarray(a)
        if a.ndim == 0 or a.shape[-1] != n_stages:
            return a
        if a.ndim == 1:
            return a[slow]
        if n_stages == 1:  # one stage considered: it is the slowest
            return np.broadcast_to(a, stage.shape)
        return np.broadcast_to(a, stage.shape).reshape(-1)[slow_flat].reshape(slow.shape + (1,))

    return {"slowest_s": pick(stage), "slowest_parts": {k: pick(v) for k, v in parts.items()}, "stage_s": stage,
            "slowest_extra": {k: pick(v) for k, v in (extra or {}).items()}}


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
    secs, algo, proto, lat = _collective(nvlink, nic, nccl, kind, nbytes, n, stride, gpn, sharp, calls)
    return float(secs), int(algo), int(proto), float(lat)


def _collective(nvlink, nic, nccl, kind, nbytes, n, stride, gpn, sharp, calls):
    per_node = comm.ranks_per_node(n, stride, gpn)
    nodes = comm.group_nodes(n, stride, gpn, per_node)
    busbw = comm.group_busbw(n, stride, gpn, nvlink, nic, per_node)
    calls = np.maximum(np.asarray(calls, dtype=float), 1e-9)
    secs, algo, proto, lat = comm.nccl_call(kind, np.asarray(nbytes, dtype=float) / calls, n, nodes, per_node,
                                            busbw, nccl, sharp)
    return calls * secs, algo, proto, lat


def overlapped(comm_s, compute_s, slowdown):
    """Seconds a collective adds when run beside `compute_s` of compute: what outlasts the
    compute, plus the compute it overlaps slowed by `slowdown` (NCCL's kernels take SMs and
    memory bandwidth from the GEMMs beside them: 18.9% on average over A100/H100/MI250/MI210
    runs of GPT and Llama models, arXiv 2507.03114; conventions.toml [efficiency])"""
    return np.maximum(0.0, comm_s - compute_s) + slowdown * np.minimum(comm_s, compute_s)


def offloaded_optimizer(hw: Hardware, r, *, shard_params, reductions, backward, overlap_dp, ranks_per_host,
                        params_on_host=False):
    """Seconds a step spends on an optimizer offloaded to the host (conventions.toml
    [offload]): the rank's gradient partition going to the host (the fp32 copy at the
    accumulation boundary; before it, under ZeRO-2's reduction in every micro-batch, each
    micro-batch's gradient through the host and back in its own dtype), each copy beside that
    micro-batch's backward; the step on the host, memory-bound, for all `ranks_per_host` ranks a
    host serves at once; and the updated 16-bit parameters back to the GPU (unless they live on
    the host, `params_on_host`, and go with the next gathers)."""
    off = conventions()["offload"]
    last = shard_params * off["grad_to_host_bytes"] / hw.h2d
    earlier = shard_params * 2 * r.grad_bytes / hw.h2d
    copies = np.where(overlap_dp, (reductions - 1) * overlapped(earlier, backward, hw.overlap_slowdown)
                      + overlapped(last, backward, hw.overlap_slowdown), (reductions - 1) * earlier + last)
    # the fused step's bytes per parameter: the gradient, and the master copy and state read
    # and written (as `opt_bytes` on the GPU), times the host implementation's passes
    fp32 = DTYPE_BYTES["fp32"]
    host_step = ranks_per_host * shard_params * (fp32 + 2 * (fp32 + r.optimizer_bytes)) * r.cpu_optimizer_traffic \
        / hw.host_memory
    back = np.where(params_on_host, 0.0, shard_params * r.compute_weight_bytes / hw.h2d)
    return {"to_host": copies, "host_step": host_step, "to_device": back}


def recompute_regathered(r, recompute, zero, unit_params):
    """The share of a unit's parameters ZeRO-3 gathers again in its recomputed forward (full
    recomputation): DeepSpeed keeps a gathered parameter only if it is used again within
    stage3_max_reuse_distance R elements of other parameters. A parameter's recomputed use and
    its backward use are 2 x (the unit's parameters after it) apart, so those in the first
    P - R/2 elements of a P-element unit are gathered a third time; FSDP recomputes inside the
    unit's backward, after its gather (R infinite: none)."""
    share = np.maximum(unit_params - r.zero3_max_reuse_distance / 2, 0.0) / np.maximum(unit_params, 1.0)
    return np.where((np.asarray(recompute) == 2) & (np.asarray(zero) >= 3), share, 0.0)


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
        back = np.where(backward_gathers, gather, 0.0)
        bwd_scatter = np.where(backward_prefetch >= 2, scatter, overlapped(scatter, 2 * compute / units /
                                                                           (3 + np.where(np.asarray(recompute) == 2,
                                                                                         1.0, 0.0)), slowdown))
        return units * ((1 + regathered) * gather + back + np.where(overlap, bwd_scatter, scatter))
    rec = np.where(np.asarray(recompute) == 2, 1.0, 0.0)
    per_unit = compute / units / (3 + rec)  # one unit's forward
    back_gather = np.where(backward_gathers, gather, 0.0)
    hidden_bwd = np.where(backward_prefetch >= 1, 0.0, back_gather) + np.where(backward_prefetch >= 2, 0.0, scatter)
    exposed_bwd = back_gather + scatter - hidden_bwd
    hide = lambda c, comp: overlapped(c, comp, slowdown)  # noqa: E731
    overlapped_s = units * (hide(gather, per_unit) + hide(regathered * gather, rec * per_unit)
                            + hide(hidden_bwd, 2 * per_unit) + exposed_bwd) + gather - hide(gather, per_unit)
    return np.where(overlap, overlapped_s, units * ((1 + regathered) * gather + back_gather + scatter))


def step_from_stages(stages: dict, hw: Hardware, r, *, pp, dp, cp, tp, zero, m, vpp, schedule, overlap_dp,
                     offload_optimizer, gpn, trainable, gbs, seq, gpus, model_flops, hw_flops, sharp=False,
                     data_s=0.0, prefetch=True, backward_prefetch=0, stage_layers=1, dp_shard=None,
                     offload_params=False, recompute=0, modules_per_layer=1.0) -> dict:
    """The step from `stage_times`: the pipeline schedule over the slowest stage, the exposed
    data-parallel communication and the optimizer update (on the host under
    `offload_optimizer`, see `offloaded_optimizer`); then the input pipeline's `data_s` per
    step, overlapped with all that when prefetching (estimate/data.py). `dp_shard`: the
    data-parallel ranks ZeRO shards over (all `dp` when None: no hybrid sharding);
    `offload_params`: ZeRO-3 fetches each rank's shard from the host for every gather;
    `recompute` (activations.RECOMPUTE_CODE) and `modules_per_layer` (a layer's submodules with
    parameters) shape ZeRO-3's unit-by-unit collectives (`zero3_exposed`)."""
    f = lambda x: np.asarray(x, dtype=float)  # noqa: E731
    pp, dp, cp, tp, m, vpp, zero = (f(x) for x in (pp, dp, cp, tp, m, vpp, zero))
    stage_max, per_micro_batch, p2p = stages["slowest_s"], stages["slowest_parts"], stages["p2p"]
    # DualPipe runs one micro-batch's all-to-alls beside another's compute (DeepSeek-V3 §3.2.1):
    # the saving stage_times worked out for that overlap, where the plan did not ask for it anyway
    dual = np.asarray(schedule) == SCHEDULE_CODE["dualpipe"]
    saving = np.where(dual, stages.get("ep_saving", 0.0), 0.0)
    stage_max = stage_max - saving
    totals = stages["totals"] - np.where(dual, stages.get("ep_saving_total", 0.0), 0.0)
    per_micro_batch = {**per_micro_batch, "ep_comm": per_micro_batch["ep_comm"] - saving}
    # The engine running the pipeline (estimate/pipeline_engine.py): DeepSpeed's blocking sends
    # and receives put more transfers on every micro-batch's critical path than the two
    # stage_times prices, and its gradients are reduced after the schedule, not overlapped.
    extra_p2p, overlap_dp = engine_terms(r.pipeline_engine, pp, schedule, f(overlap_dp))
    per_micro_batch = {**per_micro_batch, "pp_comm": per_micro_batch["pp_comm"] + extra_p2p * p2p}
    pipe = pipeline_time(schedule, pp, m, stage_max, totals, vpp, p2p, wgrad_share=WGRAD_SHARE) \
        + m * extra_p2p * p2p
    # a DualPipe rank holds two stages and runs each micro-batch through one of them
    busy_mbs = np.where(np.asarray(schedule) == SCHEDULE_CODE["dualpipe"], m / 2, m)
    parts_busy = {k: busy_mbs * v for k, v in per_micro_batch.items()}
    bubble = np.maximum(pipe - sum(parts_busy.values()), 0.0)

    # -- data-parallel gradient reduction (+ ZeRO-3 gathers) and the optimizer
    dp_group = dp * cp
    # ZeRO's collectives run over the shard group: all dp x cp ranks, or under hybrid sharding
    # the dp_shard x cp neighbouring ones; the replicas of each shard (dp / dp_shard of them,
    # dp_shard x cp x tp GPUs apart) then all-reduce their reduce-scattered gradients (FSDP2's
    # HSDP: an all-reduce of the reduce-scatter's output, on the same stream, after it)
    shard_group = (dp if dp_shard is None else f(dp_shard)) * cp
    replicas = dp * cp / shard_group
    wire_grad_bytes = trainable * r.reduce_bytes  # the gradients as the collectives carry them
    stage_compute = per_micro_batch["compute"]
    # ZeRO-3 / FSDP gathers the parameters for every micro-batch's forward and backward and
    # reduce-scatters its gradients, prefetching so each overlaps that micro-batch's compute;
    # a backward gather issued after the layer's gradients (BACKWARD_POST) waits in the open,
    # and without prefetch the reduce-scatter queued before it does too.
    # Each pass pays NCCL's latency per call (conventions.toml [efficiency.nccl_latency_us]):
    # ZeRO-3 / FSDP gathers and reduce-scatters unit by unit, one call per layer and one for the
    # root, each needed before (or freed after) its layer; a bucketed gradient reduction
    # (Megatron, DeepSpeed, DDP) is priced as one call per pass: counting Megatron-Core's
    # 40M-parameter buckets one call each would put its published H100 rows (DP 48 across
    # nodes) 2.4 points further off, 7.7% -> 10.1% mean, and its 16B row from +1% to -6%.
    per_unit = (zero >= 3) | r.per_unit_collectives
    units = f(stage_layers) + 1
    calls = np.where(per_unit, units, 1.0)
    # DeepSpeed's ZeRO-3 gathers submodule by submodule and reduce-scatters bucket by bucket
    # (conventions.toml [frameworks.deepspeed] zero3_module_fetches); FSDP a unit in one call
    module_fetches = (zero >= 3) & r.zero3_module_fetches
    gather_calls = calls * np.where(module_fetches, f(modules_per_layer), 1.0)
    bucketed = module_fetches & (r.reduce_bucket_elems > 0) & (not r.zero3_parameter_calls)
    scatter_calls = np.where(bucketed, np.maximum(trainable / max(r.reduce_bucket_elems, 1.0), 1.0),
                             np.where(module_fetches & r.zero3_parameter_calls, gather_calls, calls))
    # each call at the algorithm and protocol NCCL picks for its size (comm.nccl_call)
    gather, _, _, gather_lat = collective_terms(hw, comm.ALL_GATHER, trainable * r.compute_weight_bytes,
                                                shard_group, tp, gpn, calls=gather_calls)
    # (a group of one costs nothing: skipped outright where no layout has replicas)
    replica_ar = collective(hw, comm.ALL_REDUCE, wire_grad_bytes / shard_group, replicas, tp * shard_group, gpn,
                            sharp, calls=calls) if np.any(replicas > 1) else 0.0
    scatter, _, _, scatter_lat = collective_terms(hw, comm.REDUCE_SCATTER, wire_grad_bytes, shard_group, tp, gpn,
                                                  calls=scatter_calls)
    scatter = scatter + replica_ar
    # Pipelined FSDP gathers each unit once a step, for the first forward, and reduce-scatters
    # it once, after the last backward (Recipe.keeps_stage_gathered): ZeRO-1's timing, unit by
    # unit. Otherwise FSDP's SHARD_GRAD_OP (ZeRO-2 unit by unit) gathers once a micro-batch, for
    # the forward, and keeps the parameters through the backward: no backward gather to wait for.
    pipelined_fsdp = r.keeps_stage_gathered(pp, zero)
    unit_by_unit = ((zero >= 3) | ((zero == 2) & per_unit)) & ~pipelined_fsdp
    backward_gathers = zero >= 3
    regathered = recompute_regathered(r, f(recompute), zero, trainable / units)
    z3 = m * zero3_exposed(gather / units, scatter / units, units, stage_compute, f(recompute), regathered,
                           backward_gathers, f(backward_prefetch), overlap_dp, hw.overlap_slowdown,
                           gathers_overlap=r.zero3_gathers_overlap)
    # How often the gradients are reduced, decided once for the collectives and the framework's
    # passes: FSDP (unit by unit, or NO_SHARD's all-reduce) and ZeRO-2, which keeps only its
    # partition of the gradients (DeepSpeed's stage_1_and_2.py reduces when "partition_gradients
    # or is_gradient_accumulation_boundary"), in every micro-batch's backward; ZeRO-1, Megatron's
    # distributed optimizer, DDP and pipelined FSDP once a step, in the last backward.
    reductions = np.where(pipelined_fsdp, 1.0, np.where(per_unit | (zero == 2), m, 1.0))
    gathers = np.where(unit_by_unit, np.where(backward_gathers, 2, 1) * m, 1.0)  # with ZeRO-1 and up
    # a sharded optimizer reduce-scatters the gradients behind each reducing backward and
    # all-gathers the parameters during the next step's first forward (--overlap-grad-reduce,
    # --overlap-param-gather); plain data parallelism all-reduces them, bucket by bucket
    backward = stage_compute * 2 / 3
    z1 = np.where(overlap_dp, reductions * overlapped(scatter, backward, hw.overlap_slowdown)
                  + overlapped(gather, stage_compute / 3, hw.overlap_slowdown), reductions * scatter + gather)
    ar, _, _, ar_lat = collective_terms(hw, comm.ALL_REDUCE, wire_grad_bytes, dp_group, tp, gpn, sharp, calls=calls)
    z0 = reductions * np.where(overlap_dp, overlapped(ar, backward, hw.overlap_slowdown), ar)
    # The framework's own passes over the local gradients and the gathered parameters outside
    # the collectives (conventions.toml [frameworks] grad_reduce_passes, gather_copy_passes),
    # memory-bound work on the compute stream, at every reduction and gather.
    grad_passes = np.where(zero >= 3, r.grad_reduce_passes_zero3, r.grad_reduce_passes)
    bookkeeping = np.where(dp_group > 1, trainable * (reductions * grad_passes * r.reduce_bytes
                                                      + np.where(unit_by_unit | pipelined_fsdp, gathers, 0.0)
                                                      * r.gather_copy_passes * r.compute_weight_bytes)
                           / hw.hbm, 0.0)
    shard = np.where(zero >= 1, shard_group, 1.0)
    # ZeRO-Infinity's parameter offload: every gather starts from the rank's shard on the host,
    # fetched over PCIe ahead of it (prefetched beside the compute like the gather itself)
    fetches = 0.0
    if np.any(offload_params):
        fetch = trainable / shard * r.compute_weight_bytes / hw.h2d
        fetches = np.where(f(offload_params) > 0, gathers, 0.0) * np.where(
            overlap_dp, overlapped(fetch, stage_compute / 2, hw.overlap_slowdown), fetch)
    dp_exposed = np.where(unit_by_unit, z3, np.where(zero >= 1, z1, z0)) + bookkeeping + fetches
    # One optimizer step over this rank's shard. A fused kernel reads the gradient, reads and
    # writes the master copy (the fp32 parameters themselves where there is none) and the
    # state, and writes the 16-bit working weights where there is a master copy: 28 bytes per
    # parameter for fp32 AdamW. Foreach and for-loop steps move `optimizer_traffic` times that.
    # Gradient-norm clipping runs before it over the same gradients (`grad_clip_passes`).
    updated = r.master_bytes if r.master_bytes > 0 else r.weight_bytes
    working = r.weight_bytes if r.master_bytes > 0 else 0.0
    opt_bytes = trainable / shard * ((r.grad_bytes + 2 * (updated + r.optimizer_bytes) + working) * r.optimizer_traffic
                                     + r.grad_clip_passes * r.grad_bytes)
    on_host = {"to_host": 0.0, "host_step": 0.0, "to_device": 0.0}
    optimizer = opt_bytes / hw.hbm
    if np.any(offload_optimizer):
        on_host = offloaded_optimizer(hw, r, shard_params=trainable / shard, reductions=reductions,
                                      backward=backward, overlap_dp=overlap_dp,
                                      ranks_per_host=np.minimum(f(gpn), f(gpus)), params_on_host=f(offload_params) > 0)
        optimizer = np.where(f(offload_optimizer) > 0, sum(on_host.values()), optimizer)
    busy = pipe + dp_exposed + optimizer
    step = step_with_data(busy, data_s, prefetch)
    return {
        "step_s": step,
        "tokens_per_s": gbs * seq / step,
        "tflops_per_gpu": model_flops / step / gpus / 1e12,
        "hardware_tflops_per_gpu": hw_flops / step / gpus / 1e12,
        "mfu": model_flops / (hw.peak_dense * step * gpus),
        "hfu": hw_flops / (hw.peak_dense * step * gpus),
        # the same model FLOPs against the accelerator's bf16 and fp8 peaks ("mfu" divides by
        # the one Hardware.mfu_peak names); NaN where it has no such peak
        "mfu_bf16_peak": model_flops / ((hw.peak_bf16 or np.nan) * step * gpus),
        "mfu_fp8_peak": model_flops / ((hw.peak_fp8 or np.nan) * step * gpus),
        "bubble_fraction": bubble / step,
        "breakdown_s": {**parts_busy, "bubble": bubble, "dp_comm": dp_exposed, "optimizer": optimizer,
                        "data": step - busy},
        "stage_s": stages.get("stage_s"),
        "micro_batch_s": per_micro_batch,
        "pipeline_s": pipe,
        # (reduce_scatter includes, under hybrid sharding, the replicas' all-reduce of its output)
        "dp_collectives_s": {"all_gather": gather, "reduce_scatter": scatter, "all_reduce": ar,
                             "replica_all_reduce": replica_ar},
        "dp_shard_group": shard_group, "dp_replicas": replicas,
        # the framework's passes over gradients and gathered parameters, inside "dp_comm"
        "dp_bookkeeping_s": bookkeeping,
        # --offload-params: fetching the shards from the host, inside "dp_comm"; --offload-optimizer:
        # the parts of "optimizer"
        "param_fetch_s": fetches, "offloaded_optimizer_s": on_host,
        # each collective's calls per pass and the latency of one call (`plan --explain`)
        "dp_calls": calls,
        # gradient reductions and (ZeRO-1 and up) parameter all-gathers per step
        "dp_reductions": reductions, "dp_gathers": np.where(zero >= 1, gathers, 0.0),
        "dp_call_latency_s": {"all_gather": gather_lat, "reduce_scatter": scatter_lat, "all_reduce": ar_lat},
        # calls per pass of each (DeepSpeed's ZeRO-3: a submodule's gather each, a bucket's reduce-scatter each)
        "dp_gather_calls": gather_calls, "dp_scatter_calls": scatter_calls,
        # the share of the parameters ZeRO-3 gathers again for a recomputed forward (DeepSpeed)
        "dp_regathered": regathered,
    }


def step_time(layout: Layout, profile: dict | None = None, memory: dict | None = None,
              r: Recipe | None = None) -> dict:
    """The step of a resolved plan (every stage considered), as plain numbers; `r`, the plan's
    `recipe` where the caller has it already."""
    out, fl, data, hw = _step(layout, profile, memory, r)
    num = lambda x: float(x)  # noqa: E731
    breakdown = {k: num(v) for k, v in out["breakdown_s"].items()}
    step = num(out["step_s"])
    slowest = max((k for k in breakdown if k != "compute"), key=lambda k: breakdown[k])
    return {
        **{k: num(out[k]) for k in ("step_s", "tokens_per_s", "tflops_per_gpu", "hardware_tflops_per_gpu",
                                    "mfu", "hfu", "bubble_fraction")},
        # which peak "mfu" divides by, and the MFU against each peak the accelerator has (null
        # where it has none)
        "mfu_peak": hw.mfu_peak,
        **{k: (None if np.isnan(out[k]) else num(out[k])) for k in ("mfu_bf16_peak", "mfu_fp8_peak")},
        "breakdown_s": breakdown,
        "bottleneck": f"{slowest.replace('_', ' ')} {breakdown[slowest] / step:.0%}"
        if breakdown[slowest] > 0.1 * step else "compute-bound",
        "model_flops_per_step": float(fl["model"]),
        "hardware_flops_per_step": float(fl["hardware"]),
        "per_microbatch_stage_s": [num(x) for x in out["stage_s"]],
        "micro_batch_s": {k: num(v) for k, v in out["micro_batch_s"].items()},
        "input_pipeline_s": data,
    }


def step_derivation(layout: Layout, profile: dict | None = None, memory: dict | None = None) -> dict:
    """The terms behind `step_time`: per layer kind and micro-batch on every stage ("detail"),
    the pipeline's seconds, the data-parallel collectives and the rates used (`plan --explain`)."""
    from .memory import estimate_memory

    mem = memory if memory is not None else estimate_memory(layout)
    out, _, _, hw = _step(layout, profile, mem)
    return {**out, "hardware": hw,
            "nccl_algorithms": collective_choices(layout, hw, float(np.max(mem["trainable_params"])), out)}


def collective_choices(layout: Layout, hw: Hardware, trainable: float, out: dict) -> dict:
    """The algorithm and protocol NCCL runs each collective group's calls with (`plan
    --explain`): TP's all-reduce, CP's K/V all-gather, and the data-parallel group's calls."""
    plan, model, r = layout.plan, layout.model, recipe(layout.plan)
    gpn, tokens = plan.gpus_per_node, layout.mbs * layout.seq_len / layout.cp
    one = lambda key: float(np.asarray(out[key]).ravel()[0])  # noqa: E731
    choices = {}
    if layout.tp > 1:
        choices["TP all-reduce"] = collective_choice(hw, comm.ALL_REDUCE, tokens * model.hidden * r.act_bytes,
                                                     layout.tp, 1, gpn, plan.sharp)
    if layout.cp > 1:
        choices["CP all-gather"] = collective_choice(
            hw, comm.ALL_GATHER, tokens * 2 * model.kv_dim / layout.tp * r.act_bytes * layout.cp, layout.cp,
            layout.tp, gpn)
    shard = one("dp_shard_group")
    if layout.dp * layout.cp > 1:
        if layout.zero >= 1 or r.per_unit_collectives and layout.zero >= 2:
            choices["DP all-gather"] = collective_choice(hw, comm.ALL_GATHER, trainable * r.compute_weight_bytes,
                                                         shard, layout.tp, gpn, calls=one("dp_gather_calls"))
            choices["DP reduce-scatter"] = collective_choice(hw, comm.REDUCE_SCATTER, trainable * r.reduce_bytes,
                                                             shard, layout.tp, gpn, calls=one("dp_scatter_calls"))
        else:
            choices["DP all-reduce"] = collective_choice(hw, comm.ALL_REDUCE, trainable * r.reduce_bytes,
                                                         layout.dp * layout.cp, layout.tp, gpn, plan.sharp,
                                                         calls=one("dp_calls"))
    return choices


def layer_pass_times(layout: Layout, profile: dict | None = None, kind: str = "dense") -> dict:
    """One layer's seconds per micro-batch as Korthikanti et al. 2023 Table 4 times them: its
    forward, its backward (the recomputation included) and that recomputation, each with the
    exposed tensor-parallel collectives of the pass."""
    d = step_derivation(layout, profile)["detail"]
    lay, tp = d["layer"][kind], d["tp_passes"][kind]
    num = lambda x: float(np.ravel(x)[0])  # noqa: E731
    recompute = num(lay["recompute"]) + num(tp["recompute"])
    forward = num(lay["gemm_forward"]) + num(lay["attention_forward"]) + num(lay["elementwise_forward"]) \
        + num(lay["dequantize"]) + num(tp["forward"])
    backward = num(lay["gemm_backward"]) + num(lay["attention_backward"]) + num(lay["elementwise_backward"]) \
        + num(lay["dequantize"]) + num(tp["backward"]) + recompute
    return {"forward_s": forward, "backward_s": backward, "recompute_s": recompute,
            "elementwise_s": num(lay["elementwise_forward"]) + num(lay["elementwise_backward"])}


def _step(layout: Layout, profile: dict | None, memory: dict | None, r: Recipe | None = None):
    from .memory import estimate_memory, recompute_code

    plan, model = layout.plan, layout.model
    r = r if r is not None else recipe(plan)
    mem = memory if memory is not None else estimate_memory(layout, r)
    # selective recomputation re-runs the attention core unless its modules leave core_attn out
    # (the output-discarding modules' norms, up-projections and activations are not priced)
    rc = recompute_code(plan)
    hw = hardware(layout, profile)
    stage_layers = np.asarray(layout.stage_dense_layers, dtype=float) + layout.stage_moe_layers
    fl = step_flops(model, tokens=layout.gbs * layout.seq_len, seq=layout.seq_len,
                    dense_layers=model.layers - model.n_moe_layers, moe_layers=model.n_moe_layers, head=1,
                    attention_eager=plan.attention == "eager", recompute=rc, vocab_padded=model.vocab, causal=True,
                    skip_last=r.recompute_skips_last_linear,
                    recompute_share=float(model_recomputed_share(rc, layout.recompute_layers_per_stage, stage_layers)),
                    low_precision_mm=float(r.linear_in_bytes < 2), **lora_arguments(plan))
    stages = np.arange(layout.pp)
    data = data_report(plan, model, layout.gbs * layout.seq_len / layout.dp)
    out = step_time_core(
        model, hw, r, tp=layout.tp, pp=layout.pp, dp=layout.dp, cp=layout.cp,
        ep=layout.ep, zero=layout.zero, mbs=layout.mbs, seq=layout.seq_len, m=layout.micro_batches,
        vpp=layout.vpp, schedule=SCHEDULE_CODE[plan.schedule], recompute=rc, eager=plan.attention == "eager",
        dropout=plan.dropout, overlap_tp=plan.overlap_tp, overlap_dp=plan.overlap_dp,
        offload_optimizer=plan.offload_optimizer, offload_params=plan.offload_params, gpn=plan.gpus_per_node,
        stage_dense=np.asarray(layout.stage_dense_layers, dtype=float),
        stage_moe=np.asarray(layout.stage_moe_layers, dtype=float),
        first=(stages == 0).astype(float), last=(stages == layout.pp - 1).astype(float),
        total_dense=sum(layout.stage_dense_layers), total_moe=sum(layout.stage_moe_layers),
        vocab_padded=layout.vocab_padded, trainable=float(np.max(mem["trainable_params"])),
        gbs=layout.gbs, gpus=layout.gpus, model_flops=float(fl["model"]), hw_flops=float(fl["hardware"]),
        sp=layout.sp, sharp=plan.sharp, cp_allgather=plan.cp_comm == "allgather", data_s=data["per_step_s"],
        prefetch=plan.prefetch, backward_prefetch=BACKWARD_PREFETCH_CODE[plan.backward_prefetch],
        dp_shard=layout.dp_shard, lora=lora_arguments(plan), recompute_layers=layout.recompute_layers_per_stage,
        ep_node_limit=plan.ep_node_limit, ep_overlap=plan.ep_overlap)
    return out, fl, data, hw
