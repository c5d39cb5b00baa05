"""Layout search: enumerate every valid TP x PP x DP x CP x EP x ZeRO x micro-batch x
recompute x schedule layout of a model on a cluster, evaluate them all at once with the same
array formulas `plan` uses (DESIGN §2), keep those that fit, and rank them.

Each layout is evaluated on a few representative pipeline stages: stage 0, the last stage and
the first stage holding each distinct mix of layers (dense and MoE) of the default split.
In-flight micro-batches fall with the stage index under every schedule and a stage's memory
and time are set by its layers, so the peak memory and the slowest stage lie among them; the
pipeline's sum over stages comes from the layer totals.

Work shared between layouts is done once: layouts differing only in schedule and interleaving
(adjacent in enumeration order) share one memory evaluation, scaled by their micro-batches in
flight (memory is linear in them); those differing only in ZeRO stage, schedule and
interleaving share their per-stage times; each distinct GEMM shape is timed once. Bulk and
per-plan evaluation agree to 1e-12 (tests).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from .errors import PlanError
from .estimate import activations as act
from .estimate.collectives import BACKWARD_PREFETCH_CODE, modules_per_layer
from .estimate.data import data_step_seconds
from .estimate.distinct import per_distinct
from .estimate.flops import step_flops
from .estimate.hardware import hardware
from .estimate.memory import lora_saves, plan_numbers, stage_memory
from .estimate.pipeline import (
    SCHEDULE_CODE,
    SCHEDULES,
    in_flight,
    last_stage_heads_in_flight,
    last_stage_logits_in_flight,
)
from .estimate.recipe import recipe
from .estimate.stage import lora_arguments, stage_times
from .estimate.time import step_from_stages
from .limits import MAX_SEARCH_LAYOUTS
from .plan import (
    Plan,
    conventions,
    default_stage_split,
    interleaving_problem,
    least_zero,
    load_model,
    resolve,
    zero_stages,
)
from .specs.hardware import GPUSpec
from .units import GiB

# the layout dimensions a search enumerates unless the plan fixes them
LAYOUT_DIMENSIONS = ("tp", "pp", "cp", "ep", "zero", "mbs", "recompute", "schedule", "vpp", "sp")
REPRESENTATIVE = 4
OBJECTIVES = ("time", "cost")


@dataclass
class Space:
    """The values each layout dimension may take (a fixed dimension has one value)."""

    tp: list[int]
    pp: list[int]
    cp: list[int]
    ep: list[int]
    zero: list[int]
    mbs: list[int]
    recompute: list[str]
    schedule: list[str]
    # virtual stages per GPU of the interleaved schedule; None: every count the pipeline's
    # split allows (`interleavings`), per pipeline depth
    vpp: list[int] | None = None


def _pow2_upto(n: int) -> list[int]:
    return [2**i for i in range(int(math.log2(max(n, 1))) + 1)]


def default_space(plan: Plan, fixed: set[str], gpus: int, layers: int, max_tp: int, is_moe: bool) -> Space:
    """Omitted dimensions are searched: TP and CP over powers of two (TP within a node), PP over
    every divisor of the GPU count up to the layer count, ZeRO over the stages the framework
    offers; given dimensions stay fixed."""
    def dim(name, values):
        return [getattr(plan, name)] if name in fixed else values

    return Space(
        tp=dim("tp", [t for t in _pow2_upto(max_tp) if t <= gpus]),
        pp=dim("pp", [p for p in range(1, min(gpus, layers) + 1) if gpus % p == 0]),
        cp=dim("cp", [c for c in _pow2_upto(min(gpus, 16))]),
        ep=dim("ep", [e for e in _pow2_upto(gpus)] if is_moe else [1]),
        zero=[z for z in dim("zero", [0, 1, 2, 3]) if z in zero_stages(plan.framework)],
        mbs=dim("mbs", [1, 2, 3, 4, 6, 8, 12, 16, 24, 32]),
        recompute=dim("recompute", ["none", "selective", "full"]),
        schedule=dim("schedule", ["gpipe", "1f1b", "interleaved", "zb"]),
        vpp=[plan.vpp] if "vpp" in fixed and plan.vpp else None,
    )


@lru_cache(maxsize=4096)
def interleavings(layers: int, pp: int, framework: str) -> tuple[int, ...]:
    """Every count of virtual stages per GPU (2 or more) the default split of `layers` over `pp`
    stages allows under `framework`'s conventions: each stage's layers divisible by it, or
    (outside Megatron) equal but for one layer fewer on the first and last virtual stages, down
    to ones that hold only the embedding or the head (`interleaving_problem`)."""
    if pp < 2:
        return ()
    split = default_stage_split(layers, pp)
    return tuple(v for v in range(2, max(split) + 2) if interleaving_problem(split, v, framework) is None)


def _expand(cols: dict[str, np.ndarray], values: dict[str, list]) -> dict[str, np.ndarray]:
    """Every row of `cols` with every row of `values` (columns of equal length), the new
    columns innermost: the row order of the full Cartesian product, kept by later filters."""
    n = len(next(iter(cols.values()))) if cols else 1
    k = len(next(iter(values.values())))
    out = {name: np.repeat(col, k) for name, col in cols.items()}
    out.update({name: np.tile(np.asarray(col, dtype=np.int64), n) for name, col in values.items()})
    return out


def _batch_tokens(gpus: int | None) -> int:
    """The tokens of the search's default global batch on `gpus` GPUs (conventions.toml
    [search]): the 4M-token floor, or 1,024 tokens per GPU past 4,096 GPUs."""
    conv = conventions()["search"]
    return max(int(conv["batch_tokens"]), int(conv["batch_tokens_per_gpu"]) * (gpus or 0))


def search_batch_tokens(gpus: int | None = None) -> str:
    """The tokens of the search's default global batch on `gpus` GPUs, in words ("4M")."""
    return f"{_batch_tokens(gpus) / 2**20:g}M"


def search_batch(seq: int, gpus: int) -> int:
    """The global batch (sequences) every layout of a search trains when the plan gives none:
    about `_batch_tokens` (the 4M-token floor, 1,024 tokens per GPU past 4,096 GPUs), as the
    GPU count times a power of two (or divided by one), so that it divides among as many
    data-parallel ranks as it can; where the GPU count does not divide by that power of two
    (100,000 by 128), its divisor nearest to the batch (1,000), so that data parallelism
    still can."""
    sequences = _batch_tokens(gpus) / seq
    shift = round(math.log2(sequences / gpus))
    if shift >= 0 or gpus % 2 ** -shift == 0:
        return max(1, round(gpus * 2.0 ** shift))
    divisors = [d for d in range(1, math.isqrt(gpus) + 1) if gpus % d == 0]
    divisors += [gpus // d for d in divisors]
    return min(divisors, key=lambda d: (abs(math.log2(d / sequences)), d))


def _keep(cols: dict[str, np.ndarray], ok: np.ndarray) -> dict[str, np.ndarray]:
    if ok.all():
        return cols
    return {name: col[ok] for name, col in cols.items()}


LAYOUT_KEYS = ("tp", "pp", "dp", "cp", "ep", "zero", "mbs", "recompute", "schedule", "vpp", "m", "gbs")
# Layouts listed at a time, at most: (tp, pp, cp, ep) combinations are expanded into full
# layouts (x micro-batch, recompute, ZeRO, schedule) in blocks of as many as can give this many
# (some 25 MB), between which the layout limit and the deadline are checked: a listing past
# either stops there. A block of a real search is usually all of it (GPT-3 on 1,024 GPUs).
ENUM_BLOCK_LAYOUTS = 1 << 18


def enumerate_layouts(plan: Plan, space: Space, gpus: int, spec=None,
                      max_layouts: int | None = None) -> dict[str, np.ndarray]:
    """Every combination of the space that satisfies the plan rules, as arrays, in the row
    order of the full product (tp, pp, cp, ep, mbs, recompute, zero, schedule, vpp). Built
    dimension by dimension, each rule applied as soon as its dimensions exist, so rejected
    prefixes are never multiplied out; more than `max_layouts` is refused as soon as they are
    listed (a PlanError)."""
    return _list_layouts(plan, space, gpus, spec or load_model(plan), max_layouts)[0]


def _list_layouts(plan: Plan, space: Space, gpus: int, model, max_layouts: int | None = None,
                  deadline: float | None = None) -> tuple[dict[str, np.ndarray], bool]:
    """`enumerate_layouts`, listed in blocks of at most ENUM_BLOCK_LAYOUTS layouts, and
    whether the listing is complete: at `deadline` (time.perf_counter) it stops early."""
    parts, count = [], 0
    for part in _layout_blocks(plan, space, gpus, model):
        count += len(part["tp"])
        if max_layouts is not None and count > max_layouts:
            raise PlanError("search", f"a search over {gpus:,} GPUs lists more than {max_layouts:,} layouts, the "
                            "limit; fix some dimensions (e.g. tp, pp or zero)")
        parts.append(part)
        if deadline is not None and time.perf_counter() > deadline:
            return _concat(parts), False
    return _concat(parts), True


def _concat(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    if not parts:
        return {k: np.zeros(0, dtype=np.int64) for k in LAYOUT_KEYS}
    if len(parts) == 1:
        return parts[0]
    return {k: np.concatenate([p[k] for p in parts]) for k in LAYOUT_KEYS}


def _layout_blocks(plan: Plan, space: Space, gpus: int, model):
    """The layouts of `enumerate_layouts` in consecutive blocks (a generator)."""
    seq = plan.seq_len or min(model.max_position, 4096)
    # innermost the dimensions that change the least work: schedule and interleaving leave
    # memory (but for micro-batches in flight) and stage times alike, ZeRO leaves stage times
    # alike, so equal work lies in adjacent runs (see `_evaluate`)
    if any(len(a) == 0 for a in (space.tp, space.pp, space.cp, space.ep, space.mbs, space.recompute, space.zero,
                                 space.schedule)) or space.vpp == []:
        return
    cols: dict[str, np.ndarray] = {}
    for name in ("tp", "pp", "cp", "ep"):
        cols = _expand(cols, {name: getattr(space, name)})
    tp, pp, cp, ep = cols["tp"], cols["pp"], cols["cp"], cols["ep"]
    mp = tp * pp * cp
    ok = (gpus % mp) == 0
    dp = np.where(ok, gpus // np.maximum(mp, 1), 0)
    ok &= dp >= 1
    if plan.dp is not None:  # a data-parallel size the plan fixes
        ok &= dp == plan.dp
    kv = model.n_kv_heads
    ok &= (model.heads % tp) == 0
    if not model.is_mla:
        ok &= ((kv % tp) == 0) | ((tp % kv) == 0)
    for f in [model.ffn] + ([model.expert_ffn] if model.expert_ffn else []):
        ok &= (f % tp) == 0
    ok &= pp <= model.layers
    ok &= np.where(cp > 1, (seq % (2 * cp)) == 0, True)
    if plan.attention == "eager":
        ok &= cp == 1
    if model.is_moe:
        ok &= ((model.experts % ep) == 0) & (((dp * cp) % np.maximum(ep, 1)) == 0)
    else:
        ok &= ep == 1
    cols = _keep({**cols, "dp": dp}, ok)

    pairs = _schedule_pairs(plan, space, model, np.unique(cols["pp"]).tolist())
    if not any(len(p) for p in pairs.values()):
        return
    gbs = plan.gbs or search_batch(seq, gpus)
    n = len(cols["tp"])
    # near-equal blocks of (tp, pp, cp, ep) rows, each expanding to at most ENUM_BLOCK_LAYOUTS
    per_row = len(space.mbs) * len(space.recompute) * len(space.zero) * max(len(p) for p in pairs.values())
    count = -(-n // max(1, ENUM_BLOCK_LAYOUTS // per_row))
    size = max(1, -(-n // max(count, 1)))
    for lo in range(0, n, size):
        block = {k: v[lo:lo + size] for k, v in cols.items()}
        out = _expand_block(plan, space, block, gbs, pairs)
        if len(out["tp"]):
            yield out


def _schedule_pairs(plan: Plan, space: Space, model, pps: list[int]) -> dict[int, list[tuple[int, int]]]:
    """Per pipeline depth, its (schedule code, virtual stages) pairs in the space's schedule
    order: interleaving with each count its split allows (v >= 2), every other schedule v = 1."""
    inter = SCHEDULE_CODE["interleaved"]
    out = {}
    for p in pps:
        allowed = interleavings(model.layers, p, plan.framework)
        vs = allowed if space.vpp is None else [v for v in space.vpp if v in allowed]
        out[p] = [(SCHEDULE_CODE[s], v) for s in space.schedule
                  for v in (vs if SCHEDULE_CODE[s] == inter else (1,) if space.vpp is None or 1 in space.vpp else ())]
    return out


def _expand_pairs(cols: dict[str, np.ndarray], pairs: dict[int, list[tuple[int, int]]],
                  one_stage_1f1b: bool) -> dict[str, np.ndarray]:
    """Every row of `cols` with each (schedule, vpp) pair of its pipeline depth that the rules
    allow, the pairs innermost (the row order of the full product, restricted to them):
    interleaving needs two stages or more and micro-batches a multiple of them; without a
    pipeline, `one_stage_1f1b`, 1F1B alone (1F1B is then plain gradient accumulation, ZB-H1
    the same and GPipe the same or worse: it keeps every micro-batch's activations)."""
    depths = sorted(pairs)
    width = max(len(p) for p in pairs.values())
    table = np.full((len(depths), width, 2), -1, dtype=np.int64)
    for i, p in enumerate(depths):
        kept = [q for q in pairs[p] if p > 1 or not one_stage_1f1b or q[0] == SCHEDULE_CODE["1f1b"]]
        if kept:
            table[i, :len(kept)] = kept
    depth = np.searchsorted(depths, cols["pp"])
    pp = cols["pp"]
    unsplit = (pp < 2) | ((cols["m"] % np.maximum(pp, 1)) != 0)  # micro-batches interleaving cannot take
    valid = (table[:, :, 0] >= 0)[depth] & ~((table[:, :, 0] == SCHEDULE_CODE["interleaved"])[depth] & unsplit[:, None])
    row, slot = np.nonzero(valid)
    counts = np.count_nonzero(valid, axis=1)
    out = {name: np.repeat(col, counts) for name, col in cols.items()}
    out["schedule"], out["vpp"] = table[depth[row], slot, 0], table[depth[row], slot, 1]
    return out


def _expand_block(plan: Plan, space: Space, cols: dict[str, np.ndarray], gbs: int,
                  pairs: dict[int, list[tuple[int, int]]]) -> dict[str, np.ndarray]:
    """Valid (tp, pp, cp, ep) combinations times micro-batch, recompute, ZeRO and schedule, each
    rule applied as soon as its dimensions exist."""
    cols = _expand(cols, {"mbs": space.mbs})
    dp, mbs = cols["dp"], cols["mbs"]
    cols = _keep(cols, (gbs % np.maximum(dp * mbs, 1)) == 0)
    cols["m"] = gbs // np.maximum(cols["dp"] * cols["mbs"], 1)
    cols["gbs"] = np.full_like(cols["dp"], gbs)
    if plan.ep_overlap:  # a micro-batch's all-to-alls hide behind another's compute (plan.resolve's rule)
        cols = _keep(cols, cols["m"] >= 2)

    cols = _expand(cols, {"recompute": [act.RECOMPUTE_CODE[r] for r in space.recompute]})
    cols = _expand(cols, {"zero": space.zero})
    cols = _keep(cols, cols["zero"] >= least_zero(plan))  # what offloading needs
    if plan.dp_shard:
        # hybrid sharding: shard groups of dp_shard ranks that divide dp (and hold whole expert
        # groups); DeepSpeed has them only at ZeRO-3 (MiCS)
        hybrid = cols["dp"] > plan.dp_shard
        ok = (cols["dp"] % plan.dp_shard == 0) & ((plan.dp_shard * cols["cp"]) % cols["ep"] == 0)
        if plan.framework.startswith("deepspeed"):
            ok &= ~(hybrid & ((cols["zero"] == 1) | (cols["zero"] == 2)))
        cols = _keep(cols, ok)

    # one stage has no pipeline to schedule: only 1F1B stays, where the space has it
    cols = _expand_pairs(cols, pairs, "1f1b" in space.schedule)
    return {k: cols[k] for k in LAYOUT_KEYS}


@lru_cache(maxsize=4096)
def _representatives(model, p: int, lora: bool) -> tuple[tuple[int, ...], tuple[tuple[int, int], ...]]:
    """A pipeline of p stages' representative stage indices and their (dense, MoE) layers (see
    `_stage_tables`); O(layers), once per model and depth."""
    split = np.asarray(default_stage_split(model.layers, p), dtype=np.int64)
    bounds = np.concatenate([[0], np.cumsum(split)])
    # (dense, MoE) layers of each stage: a model whose first layers are dense (DeepSeek-V3's
    # three) has stages of equal depth but unequal weight
    moe_before = np.concatenate([[0], np.cumsum(np.asarray(model.moe_layer_flags, dtype=np.int64))])
    moe = moe_before[bounds[1:]] - moe_before[bounds[:-1]]
    kinds = np.stack([split - moe, moe], axis=1)
    # stage 0 (embedding, most micro-batches in flight), the last stage (output head) and
    # the first stage holding each distinct mix of layers: in-flight micro-batches fall with
    # the stage index, so no later stage with the same layers can hold or take more
    firsts = np.sort(np.unique(kinds, axis=0, return_index=True)[1]).tolist()
    reps = list(dict.fromkeys([0, p - 1] + ([1] if lora and p > 1 else []) + firsts))
    return tuple(reps), tuple((int(kinds[s, 0]), int(kinds[s, 1])) for s in reps)


class StageTable(NamedTuple):
    """Per layout (or per pipeline depth): its representative stages (last axis), each one's
    index and dense and MoE layer counts, and how many of them are distinct."""

    idx: np.ndarray
    dense: np.ndarray
    moe: np.ndarray
    width: np.ndarray | None = None

    def rows(self, rows, w: int) -> StageTable:
        """These rows' tables, the first `w` representative stages."""
        return StageTable(self.idx[rows, :w], self.dense[rows, :w], self.moe[rows, :w])


def _stage_tables(model, pps: np.ndarray, lora: bool = False) -> StageTable:
    """Per pp value: the representative stages' indices, dense/MoE layer counts, and how many
    of them are distinct (the rest repeat stage 0 and change no maximum); `lora`: stage 1 too,
    as LoRA's stage 0 keeps nothing for its first layer's input norm and may hold less. The
    tables are as wide as the most representative stages any pp value needs (REPRESENTATIVE
    at least)."""
    chosen = [_representatives(model, int(p), lora) for p in pps]
    wide = max([REPRESENTATIVE] + [len(reps) for reps, _ in chosen])
    idx = np.zeros((len(pps), wide), dtype=np.int64)
    dense = np.zeros((len(pps), wide))
    moe = np.zeros((len(pps), wide))
    width = np.zeros(len(pps), dtype=np.int64)
    for row, (reps, kinds) in enumerate(chosen):
        width[row] = len(reps)
        for j in range(wide):
            k = j if j < len(reps) else 0  # padding repeats stage 0
            idx[row, j] = reps[k]
            dense[row, j], moe[row, j] = kinds[k]
    return StageTable(idx, dense, moe, width)


def evaluate_bulk(plan: Plan, layouts: dict[str, np.ndarray], gpus: int, spec=None,
                  fitting_only: bool = False) -> dict[str, np.ndarray]:
    """Peak memory, fit and step time of every layout, with the plan formulas on arrays
    (`fitting_only`: step time only for layouts that fit; the others get inf).

    The memory model runs once over a grid, (tp, pp, cp, ep, dp) x micro-batch x recompute x
    ZeRO x representative stage, each input on its own axis, so that numpy's broadcasting
    computes each term at the dimensions it depends on (a weight's bytes once per ZeRO stage,
    not once per micro-batch); the micro-batches in flight, which depend on the schedule, once
    per distinct (pipeline, micro-batches, schedule, interleaving) (see `_grid`)."""
    model = spec or load_model(plan)
    if not len(layouts["tp"]):
        return _empty_result(_base(plan, gpus, model)[0])
    grid = _grid(plan, layouts, model)
    return _evaluate(plan, layouts, gpus, model, grid, fitting_only)


def _empty_result(lay0) -> dict[str, np.ndarray]:
    empty = np.zeros(0)
    return {"peak_bytes": empty, "fits": np.zeros(0, dtype=bool), "step_s": empty, "tokens_per_s": empty,
            "mfu": empty, "hfu": empty, "capacity_bytes": lay0.gpu.capacity_bytes}


_BASE: list = [None, None]  # (plan, gpus, model) and what `_base` derived from them


def _base(plan: Plan, gpus: int, model):
    """What every layout of a search shares: the plan resolved on one GPU layout, its
    precision recipe and the hardware rates (derived once per search, not per batch)."""
    key, value = _BASE
    if key is not None and key[0] is plan and key[1] == gpus and key[2] is model:
        return value
    if plan.recompute_layers is not None:
        raise PlanError("recompute_layers", "a search recomputes all of a stage's layers or none; price some "
                        "of them with `trainplan plan --recompute full --recompute-layers N`")
    # at the least ZeRO stage the plan's offloading allows (the search's layouts keep to it too)
    lay0 = resolve(plan.model_copy(update={"tp": 1, "pp": 1, "cp": 1, "ep": 1, "zero": least_zero(plan), "dp": None,
                                           "dp_shard": None,
                                           "gpus": gpus, "gbs": None, "mbs": 1, "schedule": "1f1b",
                                           "vpp": None, "recompute": "none", "stage_layers": None,
                                           "ep_overlap": False}), model)
    profile = None
    if plan.gpu_profile:
        from .profile import load_profile

        profile = load_profile(plan.gpu_profile)
    value = (lay0, recipe(plan), hardware(lay0, profile))
    _BASE[:] = [(plan, gpus, model), value]
    return value


def _codes(col: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct values of a column of non-negative integers, ascending, and each element's
    position among them (a table lookup where the values are small: no sort)."""
    top = int(col.max()) + 1
    if top > 4 * len(col) + 4096:
        values, code = np.unique(col, return_inverse=True)
        return values, code.reshape(-1)
    present = np.zeros(top, dtype=bool)
    present[col] = True
    return np.flatnonzero(present), (np.cumsum(present) - 1)[col]


def _first_of(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For keys that are small non-negative integers: one element holding each distinct key
    (an index into `key`), and each element's distinct key's position among them."""
    values, code = _codes(key)
    first = np.zeros(len(values), dtype=np.int64)
    first[code] = np.arange(len(key))
    return first, code


class Grid(NamedTuple):
    """Where each layout lies on the memory grid (run of (tp, pp, cp, ep, dp) x micro-batch x
    recompute x ZeRO, flattened: `cell`), the grid's axes (`head`: each run's first layout;
    the values on the micro-batch, recompute and ZeRO axes) and the runs' representative
    stages (last axis)."""

    run: np.ndarray
    cell: np.ndarray
    head: np.ndarray
    mbs: np.ndarray
    recompute: np.ndarray
    zero: np.ndarray
    stages: StageTable

    @property
    def shape(self) -> tuple[int, int, int, int, int]:
        return (len(self.head), len(self.mbs), len(self.recompute), len(self.zero), self.stages.idx.shape[-1])


def _grid(plan: Plan, layouts: dict[str, np.ndarray], model) -> Grid:
    """The memory grid of `layouts` (see `Grid`). A run is a stretch of adjacent layouts of one
    (tp, pp, cp, ep, dp): enumeration lists them outermost, so there are few runs. Each run is
    evaluated on the representative stages of the widest pipeline among them (a narrower one
    repeats its stage 0, which changes no maximum)."""
    run = _runs(layouts, ("tp", "pp", "cp", "ep", "dp"))
    head = np.flatnonzero(np.diff(run, prepend=-1))
    pps, inverse = np.unique(layouts["pp"][head], return_inverse=True)
    tables = _stage_tables(model, pps, lora=plan.finetune != "full")
    wide = int(tables.width.max())
    mbs, mi = _codes(layouts["mbs"])
    rc, ri = _codes(layouts["recompute"])
    zero, zi = _codes(layouts["zero"])
    cell = ((run * len(mbs) + mi) * len(rc) + ri) * len(zero) + zi
    return Grid(run, cell, head, mbs, rc, zero, tables.rows(inverse, wide))


def _runs(layouts: dict[str, np.ndarray], keys: tuple[str, ...], within: np.ndarray | None = None) -> np.ndarray:
    """Run number of each layout: a new run starts wherever one of `keys` (or the run in
    `within`) changes from the previous layout."""
    n = len(layouts["tp"])
    change = np.zeros(n, dtype=bool)
    change[0:1] = True
    for k in keys:
        change[1:] |= layouts[k][1:] != layouts[k][:-1]
    if within is not None:
        change[1:] |= within[1:] != within[:-1]
    return np.cumsum(change) - 1


def _on_axis(values, axis: int) -> np.ndarray:
    """`values` as floats along one axis of the 5-axis memory grid."""
    shape = [1] * 5
    shape[axis] = -1
    return np.asarray(values, dtype=float).reshape(shape)


def _grid_memory(plan: Plan, layouts: dict[str, np.ndarray], model, grid: Grid, r, seq: int) -> dict:
    """`stage_memory` at one micro-batch in flight over the whole grid (5 axes: run, micro-batch,
    recompute, ZeRO, stage)."""
    conv = conventions()
    run = conv["runtime"]
    head = grid.head
    tp, pp, cp, ep, dp = (_on_axis(layouts[k][head], 0) for k in ("tp", "pp", "cp", "ep", "dp"))
    stage_idx, dense, moe = (a[:, None, None, None, :] for a in grid.stages[:3])
    mult = int(conv["frameworks"][plan.framework]["vocab_multiple"])
    vocab_padded = np.ceil(model.vocab / (mult * tp)) * (mult * tp) if mult > 1 else np.full_like(tp, model.vocab)
    dp_shard = np.full_like(dp, plan.dp_shard) if plan.dp_shard else dp
    fragmentation = plan.fragmentation if plan.fragmentation is not None else run["fragmentation"]
    return stage_memory(
        plan_numbers(model, plan), r, dense_layers=dense, moe_layers=moe,
        first=(stage_idx == 0).astype(float), last=(stage_idx == pp - 1).astype(float),
        in_flight_mb=1.0, logits_in_flight=1.0,
        tp=tp, sp=(tp > 1) & _sequence_parallel(plan), cp=cp, ep=ep, dp=dp, dp_shard=dp_shard,
        zero=_on_axis(grid.zero, 3), mbs=_on_axis(grid.mbs, 1), seq=seq,
        vocab_padded=vocab_padded, attention=act.ATTENTION_CODE[model.attention_kernel(plan.attention)],
        recompute=_on_axis(grid.recompute, 2),
        recompute_layers=10**9, dropout=float(plan.dropout > 0), lora=plan.finetune != "full",
        lora_saves=lora_saves(plan), lora_rank=plan.lora_rank, offload_optimizer=plan.offload_optimizer,
        offload_params=plan.offload_params, pp=pp,
        reserved_bytes=(plan.overhead_gib if plan.overhead_gib is not None else run["reserved_gib"]) * GiB,
        fragmentation=fragmentation)


def _in_flight(plan: Plan, layouts: dict[str, np.ndarray], grid: Grid) -> tuple[np.ndarray, ...]:
    """The micro-batches in flight on each representative stage (stages x layouts), and the
    last stage's heads and logits in flight (per layout); worked out once per distinct (run,
    micro-batches, schedule, interleaving)."""
    sched, vpp, m = layouts["schedule"], layouts["vpp"], layouts["m"]
    key = grid.run
    for col in (m, sched, vpp):
        values, code = _codes(col)
        key = key * len(values) + code
    first, code = _first_of(key)
    f = lambda a: a[first].astype(float)[:, None]  # noqa: E731
    s, mm, v, pp = f(sched), f(m), f(vpp), f(layouts["pp"])
    stage_idx = grid.stages.idx[grid.run[first]]
    fw = plan.framework
    inflight = in_flight(s, stage_idx, pp, mm, v, framework=fw)
    heads = last_stage_heads_in_flight(s, mm, fw, pp)
    logits = last_stage_logits_in_flight(s, mm, fw, pp)
    per_key = lambda a: np.broadcast_to(a, (len(first), 1))[:, 0][code]  # noqa: E731
    return np.take(np.ascontiguousarray(inflight.T), code, axis=1), per_key(heads), per_key(logits)


def _per_cell(a: np.ndarray, grid: Grid) -> np.ndarray:
    """A grid quantity (broadcastable to the grid) as stages x cells (a row per stage)."""
    shape = grid.shape
    return np.moveaxis(np.broadcast_to(a, shape), -1, 0).reshape(shape[-1], -1)


def _row_max(a: np.ndarray) -> np.ndarray:
    """The largest of each column of a few long rows, row by row (numpy's reduction over the
    first axis walks it column by column)."""
    out = a[0]
    for row in a[1:]:
        out = np.maximum(out, row)
    return out


def _evaluate(plan: Plan, layouts: dict[str, np.ndarray], gpus: int, model, grid: Grid,
              fitting_only: bool) -> dict[str, np.ndarray]:
    """`evaluate_bulk` on its grid."""
    lay0, r, hw = _base(plan, gpus, model)
    n = len(layouts["tp"])
    seq = lay0.seq_len
    # Memory depends on the schedule only through the micro-batches in flight, linearly
    # (stage_memory: activations x in-flight count, then + fragmentation share): one
    # evaluation at one micro-batch in flight, scaled to each layout's count.
    mem = _grid_memory(plan, layouts, model, grid, r, seq)
    inflight, heads, logits = _in_flight(plan, layouts, grid)
    cell = grid.cell
    # (stages x layouts: a row per stage, so the peak is a maximum of a few long rows)
    at = lambda k: np.take(_per_cell(mem[k], grid), cell, axis=1)  # noqa: E731
    total = (at("total") + at("total_per_in_flight") * (inflight - 1) + at("total_per_logits") * (heads - 1)
             + at("total_per_loss") * (logits - heads))
    peak = _row_max(total)
    fits = peak <= lay0.gpu.capacity_bytes
    step, mfu, hfu = np.full(n, np.inf), np.zeros(n), np.zeros(n)
    # a search ranks only layouts that fit, so it times only those
    rows = np.flatnonzero(fits) if fitting_only else np.arange(n)
    if len(rows):
        trainable = _row_max(_per_cell(mem["trainable_params"], grid))[cell[rows], None]
        t = _step(plan, layouts, gpus, model, grid, rows, trainable)
        step[rows], mfu[rows], hfu[rows] = t["step_s"], t["mfu"], t["hfu"]
    return {"peak_bytes": peak, "fits": fits, "step_s": step, "tokens_per_s": layouts["gbs"] * seq / step,
            "mfu": mfu, "hfu": hfu, "capacity_bytes": lay0.gpu.capacity_bytes}


def _step(plan: Plan, layouts: dict[str, np.ndarray], gpus: int, model, grid: Grid, rows: np.ndarray,
          trainable: np.ndarray) -> dict[str, np.ndarray]:
    """Step time, MFU and HFU of the layouts `rows` (`step_from_stages`). Adjacent layouts that
    differ only in schedule and interleaving form a group: everything but the pipeline schedule
    (stage times, data-parallel communication, optimizer) is worked out once per group, on a
    groups x schedules table (the groups' layouts side by side, a short group's row padded
    with its first layout); stage times once per run of groups differing only in ZeRO stage."""
    cell, m, gbs = grid.cell[rows], layouts["m"][rows], layouts["gbs"][rows]
    change = np.ones(len(rows), dtype=bool)
    change[1:] = (cell[1:] != cell[:-1]) | (m[1:] != m[:-1]) | (gbs[1:] != gbs[:-1])
    first = np.flatnonzero(change)
    group = np.cumsum(change) - 1
    col = np.arange(len(rows)) - first[group]
    slot = np.repeat(first[:, None], int(col.max()) + 1, axis=1)
    slot[group, col] = np.arange(len(rows))
    heads = rows[first]
    sel = lambda k: layouts[k][heads].astype(float)[:, None]  # noqa: E731
    cols = {k: sel(k) for k in ("tp", "pp", "dp", "cp", "ep", "mbs", "recompute", "zero", "m", "gbs")}
    stages = _group_stage_times(plan, gpus, model, grid, heads, cols)
    cols["trainable"] = trainable[first]
    # groups of more than half the largest group's layouts in one table, the others in another
    # (fewer calls, less padding)
    size = np.diff(np.append(first, len(rows)))
    bucket = (size > (size.max() + 1) // 2).astype(np.int64)
    out = {k: np.empty(len(rows)) for k in ("step_s", "mfu", "hfu")}
    for b in np.unique(bucket).tolist():
        ids = np.flatnonzero(bucket == b)
        width = int(size[ids].max())
        table = slot[ids, :width]
        t = _group_steps(plan, gpus, model, {k: v[ids] for k, v in cols.items()}, _take(stages, ids),
                         {k: layouts[k][rows[table]].astype(float) for k in ("schedule", "vpp")})
        local = np.full(len(first), -1)
        local[ids] = np.arange(len(ids))
        at = np.flatnonzero(bucket[group] == b)
        for k, v in out.items():
            v[at] = np.broadcast_to(np.asarray(t[k], dtype=float), table.shape)[local[group[at]], col[at]]
    return out


def _take(stages: dict, ids: np.ndarray) -> dict:
    """These groups' rows of `_group_stage_times`'s arrays."""
    return {k: _take(v, ids) if isinstance(v, dict) else v[ids] for k, v in stages.items()}


def _group_steps(plan: Plan, gpus: int, model, cols: dict[str, np.ndarray], stages: dict,
                 table: dict[str, np.ndarray]) -> dict:
    """`step_from_stages` on a groups x schedules table: `cols` and `stages` one row per group,
    `table` (schedule, vpp) a row of the group's layouts each."""
    lay0, r, hw = _base(plan, gpus, model)
    seq = lay0.seq_len
    tp, pp, dp, cp, zero, m, gbs, rc = (cols[k] for k in ("tp", "pp", "dp", "cp", "zero", "m", "gbs", "recompute"))
    # the model's FLOPs per step: one value per distinct (global batch, recompute)
    fl = per_distinct(
        lambda tokens, recompute: {k: v for k, v in step_flops(
            model, tokens=tokens, seq=seq, dense_layers=model.layers - model.n_moe_layers,
            moe_layers=model.n_moe_layers, head=1, attention_eager=model.attention_kernel(plan.attention) == "eager",
            recompute=recompute, vocab_padded=model.vocab, causal=True, skip_last=r.recompute_skips_last_linear,
            low_precision_mm=float(r.linear_in_bytes < 2), **lora_arguments(plan)).items()
            if k in ("model", "hardware")},
        {"tokens": gbs * seq, "recompute": rc})
    dp_shard = np.full_like(dp, plan.dp_shard) if plan.dp_shard else dp
    return step_from_stages(
        stages, hw, r, pp=pp, dp=dp, cp=cp, tp=tp, zero=zero,
        m=m, vpp=table["vpp"], schedule=table["schedule"], overlap_dp=plan.overlap_dp,
        offload_optimizer=plan.offload_optimizer, gpn=plan.gpus_per_node, trainable=cols["trainable"],
        gbs=gbs, seq=seq, gpus=gpus, model_flops=fl["model"], hw_flops=fl["hardware"],
        sharp=plan.sharp, data_s=data_step_seconds(plan, model, gbs * seq / dp),
        prefetch=plan.prefetch, backward_prefetch=BACKWARD_PREFETCH_CODE[plan.backward_prefetch],
        stage_layers=model.layers / pp, dp_shard=dp_shard, offload_params=plan.offload_params,
        recompute=rc, modules_per_layer=modules_per_layer(model, r))


def _group_stage_times(plan: Plan, gpus: int, model, grid: Grid, heads: np.ndarray,
                       cols: dict[str, np.ndarray]) -> dict:
    """`stage_times` for groups whose first layouts are `heads` (their columns `cols`, one row
    per group), once per run of groups that differ only in ZeRO stage: the per-stage times do
    not depend on it."""
    lay0, r, hw = _base(plan, gpus, model)
    run = (grid.cell // len(grid.zero))[heads]
    starts = np.diff(run, prepend=-1) != 0
    at = np.cumsum(starts) - 1
    tp, pp, dp, cp, ep, mbs, rc = (cols[k][starts] for k in ("tp", "pp", "dp", "cp", "ep", "mbs", "recompute"))
    stage_idx, dense, moe = (a[grid.run[heads[starts]]] for a in grid.stages[:3])
    mult = int(conventions()["frameworks"][plan.framework]["vocab_multiple"])
    vocab_padded = np.ceil(model.vocab / (mult * tp)) * (mult * tp) if mult > 1 else np.full_like(tp, model.vocab)
    stages = stage_times(
        model, hw, r, tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, mbs=mbs,
        seq=lay0.seq_len, recompute=rc, eager=model.attention_kernel(plan.attention) == "eager",
        dropout=plan.dropout, overlap_tp=plan.overlap_tp, gpn=plan.gpus_per_node, stage_dense=dense,
        stage_moe=moe, first=(stage_idx == 0).astype(float), last=(stage_idx == pp - 1).astype(float),
        total_dense=model.layers - model.n_moe_layers, total_moe=model.n_moe_layers,
        vocab_padded=vocab_padded, sp=(tp > 1) & _sequence_parallel(plan), sharp=plan.sharp,
        cp_allgather=plan.cp_comm == "allgather", ep_node_limit=plan.ep_node_limit, ep_overlap=plan.ep_overlap,
        **lora_arguments(plan))
    spread = lambda a: np.broadcast_to(a, (len(dense),) + np.shape(a)[1:])[at]  # noqa: E731
    return {"slowest_s": spread(stages["slowest_s"]), "totals": spread(stages["totals"]),
            "p2p": spread(stages["p2p"]), "ep_saving": spread(stages["ep_saving"]),
            "ep_saving_total": spread(stages["ep_saving_total"]),
            "slowest_parts": {k: spread(v) for k, v in stages["slowest_parts"].items()}}


def layout_plan(plan: Plan, layouts: dict[str, np.ndarray], i: int, gpus: int) -> Plan:
    """The i-th layout as a Plan (for the full per-plan report)."""
    tp = int(layouts["tp"][i])
    sched = SCHEDULES[int(layouts["schedule"][i])]
    return plan.model_copy(update={
        "gpus": gpus, "dp": None, "tp": tp, "pp": int(layouts["pp"][i]), "cp": int(layouts["cp"][i]),
        "ep": int(layouts["ep"][i]), "zero": int(layouts["zero"][i]), "mbs": int(layouts["mbs"][i]),
        "gbs": int(layouts["gbs"][i]), "recompute": act.RECOMPUTE[int(layouts["recompute"][i])],
        "schedule": sched, "vpp": int(layouts["vpp"][i]) if sched == "interleaved" else None,
        "sp": tp > 1 and _sequence_parallel(plan), "stage_layers": None})


def _sequence_parallel(plan: Plan) -> bool:
    """Searched layouts use sequence parallelism with TP unless the plan turns it off."""
    return bool(plan.sp or "sp" not in plan.model_fields_set)


def _layouts(plan: Plan, fixed: set[str], gpus: int, model, max_tp: int | None, max_layouts: int | None = None,
             deadline: float | None = None) -> tuple[dict[str, np.ndarray], bool]:
    """The layouts a search ranks (at most `max_layouts`, MAX_SEARCH_LAYOUTS unless given) and
    whether they are all of them (listing stops at `deadline`); when there are none, the rule a
    fixed value breaks, by name."""
    if plan.stage_layers is not None:
        raise PlanError("stage_layers", "a search splits each pipeline its own way (evenly, the first and last "
                        "stages lighter); price a split of your own with `trainplan plan --stage-layers`")
    space = default_space(plan, fixed, gpus, model.layers, max_tp or plan.gpus_per_node, model.is_moe)
    layouts, complete = _list_layouts(plan, space, gpus, model,
                                      MAX_SEARCH_LAYOUTS if max_layouts is None else max_layouts, deadline)
    if len(layouts["tp"]):
        return layouts, complete
    gbs = plan.gbs or search_batch(plan.seq_len or min(model.max_position, 4096), gpus)
    try:
        resolve(plan.model_copy(update={"gpus": gpus, "gbs": gbs}), model)
    except PlanError as err:
        if plan.gbs is None and err.field == "gbs":
            raise PlanError("gbs", f"{err.rule} (the search's default global batch, about {search_batch_tokens(gpus)} "
                            "tokens; give --gbs)") from None
        raise
    raise PlanError("search", "no layout satisfies the constraints; relax the fixed dimensions")


# Layouts per batch: equal work is deduplicated within a batch, so larger batches evaluate fewer
# distinct groups per layout, while the full-size temporaries must stay small enough for the
# cache; also the unit of progress reports and of Ctrl-C. Measured: benchmarks/search_speed.py.
CHUNK = 32768


def batches(total: int) -> list[slice]:
    """`total` layouts cut into near-equal batches of at most CHUNK (no small remainder batch)."""
    count = max(1, -(-total // CHUNK))
    size = max(1, -(-total // count))
    return [slice(start, min(start + size, total)) for start in range(0, total, size)]


def search(plan: Plan, fixed: set[str], top: int = 5, objective: str = "time", max_tp: int | None = None,
           progress=None, spec=None, max_layouts: int | None = None, max_seconds: float | None = None) -> dict:
    """The best layouts that fit, best first, each as the full plan JSON. More than
    `max_layouts` layouts (MAX_SEARCH_LAYOUTS unless given) are refused while they are listed;
    past `max_seconds` (checked while listing and between evaluated batches) or on Ctrl-C, the
    best of what was evaluated so far is returned (`interrupted`: true)."""
    from .report import evaluate, to_json

    if objective not in OBJECTIVES:
        raise PlanError("objective", f"must be one of {', '.join(OBJECTIVES)}")
    t0 = time.perf_counter()
    deadline = None if max_seconds is None else t0 + max_seconds
    model = spec or load_model(plan)
    gpus = plan.gpus or (plan.tp * plan.pp * plan.cp * (plan.dp or 1))
    layouts, complete = _layouts(plan, fixed, gpus, model, max_tp, max_layouts, deadline)
    total = len(layouts["tp"])
    parts, interrupted = [], not complete
    try:
        for part in batches(total):
            if deadline is not None and parts and time.perf_counter() > deadline:
                interrupted = True  # out of time: rank what was evaluated
                break
            chunk = {k: v[part] for k, v in layouts.items()}
            parts.append(evaluate_bulk(plan, chunk, gpus, model, fitting_only=True))
            if progress:
                progress(f"evaluated {part.stop:,} of {total:,} layouts")
    except KeyboardInterrupt:
        interrupted = True
    if not parts:
        raise PlanError("search", "interrupted before any layout was evaluated")
    evaluated = sum(len(p["step_s"]) for p in parts)
    layouts = {k: v[:evaluated] for k, v in layouts.items()}
    res = {k: np.concatenate([p[k] for p in parts]) for k in ("fits", "tokens_per_s")}
    fits = np.flatnonzero(res["fits"])
    if not len(fits):
        raise PlanError("search", f"none of the {evaluated:,} layouts fits in memory; add GPUs, lower the "
                        "sequence or micro-batch, or allow recompute and ZeRO")
    # seconds per token; on a fixed number of GPUs at one price, dollars per token are the same
    # order (gpus x price / tokens per second), so both objectives rank the layouts alike (and an
    # accelerator without a price still ranks by speed); `compare_gpus` ranks across prices
    order = fits[smallest(1.0 / res["tokens_per_s"][fits], top)]
    best = []
    for i in order:
        p = layout_plan(plan, layouts, int(i), gpus)
        data = to_json(evaluate(p, spec=model))  # the model already loaded (an hf_config is parsed once)
        best.append(data)
    return {"evaluated": evaluated, "feasible": int(len(fits)), "seconds": time.perf_counter() - t0,
            "objective": objective, "interrupted": interrupted,
            # the global batch every layout trains: the plan's, or search_batch's when it gives none
            "gbs": int(layouts["gbs"][0]), "gbs_given": plan.gbs is not None, "best": best}


def smallest(key: np.ndarray, k: int) -> np.ndarray:
    """Indices of the `k` smallest keys, smallest first, equal keys in index order: a stable
    sort's first `k`, sorting only those no larger than the k-th smallest."""
    if k >= len(key):
        return np.argsort(key, kind="stable")
    if k <= 0:
        return np.zeros(0, dtype=np.int64)
    kth = np.partition(key, k - 1)[k - 1]
    if np.isnan(kth):  # (NaNs sort last)
        return np.argsort(key, kind="stable")[:k]
    candidates = np.flatnonzero(key <= kth)
    return candidates[np.argsort(key[candidates], kind="stable")][:k]


# ---- Pareto fronts -------------------------------------------------------------------------
def pareto_front(cost: np.ndarray, benefit: np.ndarray) -> np.ndarray:
    """Indices of the points no other point beats on both axes (lower cost, higher benefit),
    sorted by cost."""
    order = np.lexsort((-benefit, cost))
    front, best = [], -np.inf
    for i in order:
        if benefit[i] > best:
            front.append(i)
            best = benefit[i]
    return np.asarray(front, dtype=np.int64)


def pareto(plan: Plan, fixed: set[str], max_tp: int | None = None) -> dict:
    """Memory vs throughput: the layouts that fit for which no other fits in less memory and
    runs faster."""
    model = load_model(plan)
    gpus = plan.gpus or (plan.tp * plan.pp * plan.cp * (plan.dp or 1))
    lay = _layouts(plan, fixed, gpus, model, max_tp)[0]
    res = evaluate_bulk(plan, lay, gpus, fitting_only=True)
    fits = np.flatnonzero(res["fits"])
    front = fits[pareto_front(res["peak_bytes"][fits], res["tokens_per_s"][fits])]
    points = []
    for i in front:
        p = layout_plan(plan, lay, int(i), gpus)
        points.append({"peak_bytes": float(res["peak_bytes"][i]), "tokens_per_s": float(res["tokens_per_s"][i]),
                       "parallel": {k: getattr(p, k) for k in ("tp", "pp", "cp", "ep", "zero", "mbs", "recompute",
                                                                "schedule", "vpp")}})
    return {"evaluated": len(lay["tp"]), "feasible": int(len(fits)), "gbs": int(lay["gbs"][0]),
            "gbs_given": plan.gbs is not None, "front": points,
            "all": {"peak_bytes": res["peak_bytes"][fits].tolist(), "tokens_per_s": res["tokens_per_s"][fits].tolist()}}


# ---- how many GPUs -------------------------------------------------------------------------
def min_gpus(plan: Plan, fixed: set[str], days: float, tokens: float | None = None, max_gpus: int = 1 << 17,
             max_tp: int | None = None, total_seconds: float | None = None, **limits) -> dict:
    """The fewest GPUs (doubling from a node of 8, or one smaller node) whose best layout trains
    `tokens` (default 20 per parameter) within `days`, goodput included. `limits` bound each
    search (`search`'s max_layouts, max_seconds); `total_seconds` all of them: past it, the sizes
    not reached are not tried (a PlanError when none met the deadline)."""
    from .estimate.cost import CHINCHILLA_TOKENS_PER_PARAM

    if days <= 0:
        raise PlanError("days", "must be positive")
    t0 = time.perf_counter()
    model = load_model(plan)
    tokens = tokens or plan.tokens or CHINCHILLA_TOKENS_PER_PARAM * model.params
    tried, refused = [], []
    # from a server's worth (GPUSpec's default scale-up domain): a GB200 rack or a TPU slice also
    # comes in smaller sizes
    gpus = min(plan.gpus_per_node, GPUSpec.model_fields["scale_up_domain"].default)
    while gpus <= max_gpus:
        left = None if total_seconds is None else total_seconds - (time.perf_counter() - t0)
        if left is not None and left <= 0:
            raise PlanError("days", f"no cluster of the {len(tried)} sizes tried trains {tokens:.3g} tokens in "
                            f"{days:g} days, and no larger one was tried within {total_seconds:g} s")
        each = _within(limits.get("max_seconds"), left)
        try:
            out = search(plan.model_copy(update={"gpus": gpus, "tokens": tokens}), fixed, top=1, max_tp=max_tp,
                         **{**limits, "max_seconds": each})
        except PlanError as err:
            out = None
            refused.append(err)
        if out and out["best"]:
            best = out["best"][0]
            tried.append({"gpus": gpus, "days": best["training"]["days"]})
            if best["training"]["days"] <= days:
                return {"gpus": gpus, "tokens": tokens, "deadline_days": days, "best": best, "tried": tried}
        else:
            tried.append({"gpus": gpus, "days": None})
        gpus *= 2
    fastest = min((t["days"] for t in tried if t["days"]), default=None)
    if fastest is None and refused:
        # no size could be planned at all: the rule that stopped it, one that no size can meet (a
        # link, a dtype) before "nothing fits"
        raise next((e for e in refused if e.field != "search"), refused[-1])
    raise PlanError("days", f"no cluster up to {max_gpus:,} GPUs trains {tokens:.3g} tokens in {days:g} days "
                    f"(fastest: {fastest:.1f} days)")


def _within(seconds: float | None, left: float | None) -> float | None:
    """The tighter of a search's own time limit and what is left of an overall one (None: none)."""
    return seconds if left is None else left if seconds is None else min(seconds, left)


# ---- across accelerators -------------------------------------------------------------------
def compare_gpus(plans: list[Plan], fixed: set[str], objective: str = "time", max_tp: int | None = None,
                 days: float | None = None, progress=None, total_seconds: float | None = None, **limits) -> dict:
    """The same training on each accelerator: `plans` differ only in their accelerator. Each
    gets its best layout on the plan's GPU count (`search`), or with `days` the fewest GPUs
    that meet the deadline and their best layout (`min_gpus`). Ranked by `objective`: time
    (most tokens per second; with `days`, fewest GPUs, then fewest days) or cost (fewest
    dollars for the training, accelerators without a price last); an accelerator on which
    nothing fits (or whose links the catalog lacks) comes last, with the reason. `limits`
    bound each search (`search`'s max_layouts, max_seconds); `total_seconds` all of them: the
    accelerators not reached by then say so."""
    if objective not in OBJECTIVES:
        raise PlanError("objective", f"must be one of {', '.join(OBJECTIVES)}")
    rows, t0 = [], time.perf_counter()
    for plan in plans:
        name = plan.gpu
        left = None if total_seconds is None else total_seconds - (time.perf_counter() - t0)
        if left is not None and left <= 0:
            rows.append({"gpu": name, "best": None, "reason": f"not searched: the comparison ran past its "
                         f"{total_seconds:g} s; compare fewer accelerators"})
            continue
        if progress:
            progress(f"searching {name}…")
        # each search stops by the comparison's deadline too
        bounded = {**limits, "max_seconds": _within(limits.get("max_seconds"), left)}
        try:
            if days is None:
                out = search(plan, fixed, top=1, objective=objective, max_tp=max_tp, **bounded)
                rows.append({"gpu": name, "best": out["best"][0], "evaluated": out["evaluated"],
                             "feasible": out["feasible"], "reason": None})
            else:
                out = min_gpus(plan, fixed, days, max_tp=max_tp, total_seconds=left, **limits)
                rows.append({"gpu": name, "best": out["best"], "tried": out["tried"], "reason": None})
        except PlanError as err:
            rows.append({"gpu": name, "best": None, "reason": str(err)})

    def rank(row):
        b = row["best"]
        if b is None:
            return (2, 0.0, 0.0)
        cost = b["training"]["cost_usd"]
        if objective == "cost":
            return (0, cost, 0.0) if cost is not None else (1, -b["time"]["tokens_per_s"], 0.0)
        if days is not None:
            return (0, b["gpu"]["gpus"], b["training"]["days"])
        return (0, -b["time"]["tokens_per_s"], 0.0)

    rows.sort(key=rank)
    return {"objective": objective, "deadline_days": days, "price": plans[0].price if plans else None, "rows": rows}


def accelerator_plans(options: dict, accelerators: str | list[str]) -> list[Plan]:
    """One plan per accelerator named in `accelerators` ("H100-SXM,MI300X", a list, or "all":
    the whole catalog), each built from the same `options` (make_plan's) so that what the
    options leave to the accelerator (the framework's attention kernel) is decided for each."""
    from .plan import make_plan
    from .specs import catalog

    if isinstance(accelerators, str):
        accelerators = [a.strip() for a in accelerators.split(",") if a.strip()]
    if [a.lower() for a in accelerators] == ["all"]:
        names = [g.name for g in catalog.gpus()]
    elif "all" in (a.lower() for a in accelerators):
        raise PlanError("compare_gpus", "all stands alone (every accelerator of the catalog); or name them")
    else:
        names = []
        for a in accelerators:
            try:
                name = catalog.gpu(a).name
            except PlanError as err:
                raise PlanError("compare_gpus", err.rule) from None
            if name not in names:
                names.append(name)
    if len(names) < 2:
        raise PlanError("compare_gpus", "name two accelerators or more, comma-separated (or all)")
    # a measured profile prices its own accelerator (and those of the same chip, which share its
    # efficiencies); the others keep their catalog defaults
    profile, profiled = options.get("gpu_profile"), None
    if profile:
        from .profile import profile_accelerator
        from .specs.conventions import shares_efficiency_defaults

        profiled = profile_accelerator(profile)
        if profiled is None:
            raise PlanError("gpu_profile", "names no accelerator (its gpu key): a comparison prices only the "
                            "accelerator a profile was measured on with it")
    return [make_plan(**{**options, "gpu": name, "gpu_profile": profile if profiled and
                         shares_efficiency_defaults(profiled, name) else None}) for name in names]


# ---- the largest trainable model ----------------------------------------------------------
STRATEGIES = {
    "DDP": {"zero": 0, "tp": 1, "pp": 1},
    "ZeRO-1": {"zero": 1, "tp": 1, "pp": 1},
    "ZeRO-2": {"zero": 2, "tp": 1, "pp": 1},
    "ZeRO-3 / FSDP": {"zero": 3, "tp": 1, "pp": 1},
}


def family_model(hidden: int, vocab: int = 128256):
    """A Llama-style model of a given width: 128-wide heads, 8 KV groups, SwiGLU with
    ffn = 8/3·h rounded to 256, and depth h/128 (Kaplan et al. 2020's aspect ratio
    d_model/n_layers ≈ 128 is near-optimal across scales)."""
    from .specs.model import ModelSpec

    heads = max(1, hidden // 128)
    return ModelSpec(name=f"llama-style h{hidden}", source="family scaling rule", layers=max(1, hidden // 128),
                     hidden=hidden, heads=heads, kv_heads=max(1, heads // 8) if heads % 8 == 0 else heads,
                     ffn=int(round(8 * hidden / 3 / 256) * 256), vocab=vocab, max_position=8192)


def max_model(plan: Plan, strategies: dict | None = None, hidden_step: int = 128, max_hidden: int = 65536) -> dict:
    """For each strategy, the widest family model whose plan fits (seed 000's question: how
    large a model can DDP and ZeRO-1/2/3 train on this cluster?). Memory grows with width, so
    a binary search over widths in steps of `hidden_step` finds it."""
    from .estimate.memory import estimate_memory

    strategies = strategies or STRATEGIES
    gpus = plan.gpus or 8

    def fits(k: int, dims: dict) -> bool:
        spec = family_model(k * hidden_step)
        p = plan.model_copy(update={"gpus": gpus, "dp": None, "gbs": None, "stage_layers": None, **dims})
        try:
            layout = resolve(p, spec)
        except PlanError:
            return False
        return float(np.max(estimate_memory(layout)["total"])) <= layout.gpu.capacity_bytes

    out = []
    for name, dims in strategies.items():
        if dims.get("zero", plan.zero) not in zero_stages(plan.framework):
            continue  # a strategy the framework does not offer (FSDP has no ZeRO-1)
        lo, hi = 1, max_hidden // hidden_step
        if not fits(lo, dims):
            out.append({"strategy": name, "params": 0, "hidden": None, "layers": None})
            continue
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if fits(mid, dims):
                lo = mid
            else:
                hi = mid - 1
        best = family_model(lo * hidden_step)
        out.append({"strategy": name, "params": best.params, "hidden": best.hidden, "layers": best.layers})
    return {"gpus": gpus, "gpu": plan.gpu, "results": out}


# `from trainplan import search` is also the Python API's function (trainplan/api.py)
from .api import make_callable  # noqa: E402

make_callable(__name__)
