"""GEMM rates (DESIGN §3): the seconds of a layer's matrix multiplies on one rank.

A GEMM runs at the accelerator's best achieved matmul fraction (MAMF / peak, or a calibrated
profile) times tile quantization (dimensions padded to 128), wave quantization (thread blocks
padded to a multiple of the SM count) and an alignment penalty when the innermost dimension is
not a multiple of 16 bytes; on an accelerator with a measured shape fit (gemm_shape.py: Hopper)
the fitted main loop times its write-back share k / (k + k0), plus a fixed time per kernel,
without wave quantization. The backward is two GEMMs with their own shapes: the input gradient
(inner dimension the output width n) and the weight gradient (inner dimension the tokens).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..plan import conventions
from .distinct import per_distinct
from .flops import ATTENTION_INPUTS
from .gemm_shape import GemmShape
from .scalars import floats, maximum, minimum, where

TILE = 128  # GEMM output tile edge used for tile/wave quantization (CUTLASS/cuBLAS 128x128)


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
    return log_curve(tuple(curve["k"]), tuple(minimum(frac / np.max(frac), 1.0).tolist()))


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
    residual = minimum(frac / (np.max(frac) * explained), 1.0)
    return log_curve(tuple(curve["n"]), tuple(residual.tolist()))


@lru_cache(maxsize=64)
def log_curve(x: tuple, y: tuple) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """A measured curve as the time model interpolates it: (log2 x, y), both as tuples."""
    return tuple(np.log2(np.asarray(x, dtype=float)).tolist()), tuple(map(float, y))


def gemm_efficiency(m, n, k, peak_eff, sms, elem_bytes=2, curve=None):
    """Achieved fraction of peak for an (m x k) @ (k x n) GEMM: tile and wave quantization
    (MLE-P 'tile and wave quantization') times an alignment penalty for an innermost
    dimension that is not a multiple of 16 bytes (thonking.ai: > 2x slower), times, with a
    calibrated profile's `curve` (`GemmResiduals`), the measured residuals at the inner
    dimension k and at the square size of equal work, (m·n·k)^(1/3), interpolated in log size;
    or, with an accelerator's fitted `GemmShape`, its write-back share k / (k + k0) in place
    of wave quantization (gemm_shape.py)."""
    m, n, k = (maximum(floats(x), 1) for x in (m, n, k))
    residual = 1.0 if curve is None else curve(m, n, k)
    tiles_m, tiles_n = np.ceil(m / TILE), np.ceil(n / TILE)
    tile_q = (m * n) / (tiles_m * tiles_n * TILE * TILE)
    tiles = tiles_m * tiles_n
    wave_q = tiles / (np.ceil(tiles / sms) * sms) if curve is None or curve.waves else 1.0
    aligned = where((np.mod(k * elem_bytes, 16) == 0) & (np.mod(n * elem_bytes, 16) == 0), 1.0, 0.5)
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


@lru_cache(maxsize=256)
def column_gemms(model) -> LayerGemms:
    """A dense layer's column-parallel linears (attention's input projections, the MLP's up and
    gate projections): those whose input gradient is all-reduced over tensor parallelism."""
    index = model.first_layer(False)
    lins = _linears(model, index if index is not None else 0)
    return _gemms_of([lin for lin in lins if lin.tp in ("col", "kv")])


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
    ex = lambda x: floats(x)[..., None]  # noqa: E731
    tokens, tp, ep = ex(tokens), ex(tp), ex(ep)
    k = where(g.split == SPLIT["row"], g.fan_in / tp, g.fan_in)
    n = where(g.split == SPLIT["col"], g.fan_out / tp,
                 where(g.split == SPLIT["kv"], g.fan_out / minimum(tp, kv_heads), g.fan_out))
    # routed experts: ep ranks host E/ep experts each and receive top_k·tokens tokens in all
    m = where(g.expert > 0, top_k * tokens * ep / g.count, tokens)
    count = where(g.expert > 0, g.count / ep, 1.0)
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
