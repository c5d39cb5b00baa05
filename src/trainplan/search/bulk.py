"""Peak memory, fit and step time of many layouts at once, with the array formulas `plan` uses
(DESIGN §2).

Each layout is evaluated on a few representative ranks: rank 0, the last rank and the first
rank holding each distinct mix of layers (dense and MoE) of the default split, its stages
placed on the ranks as the schedule places them (`placements`: DualPipe's two copies of the
model folded onto each rank; torch's V-shaped schedules with the head on rank 0 and, as their
in-flight micro-batches rise with the rank, the last rank of each mix too). In-flight
micro-batches are monotonic in the rank under every schedule and a rank's memory and time are
set by its layers and ends, so the peak memory and the slowest rank lie among them; the
pipeline's sum over stages comes from the layer totals.

Work shared between layouts is done once. The memory model runs over a grid, (tp, pp, cp, ep,
dp) x micro-batch x recompute x ZeRO x stage, each input on its own axis, so that broadcasting
computes each term at the dimensions it depends on; layouts differing only in schedule and
interleaving share that evaluation, scaled by their micro-batches in flight (memory is linear
in them). Step times: layouts differing only in schedule and interleaving share everything but
the pipeline schedule, those differing also in ZeRO stage their per-stage times; each distinct
GEMM shape is timed once. Every formula sees the very values it would see layout by layout, so
the figures are those of evaluating each layout's arrays on their own; bulk and per-plan
evaluation agree to 1e-12 (tests).
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

import numpy as np

from ..errors import PlanError
from ..estimate import activations as act
from ..estimate.collectives import BACKWARD_PREFETCH_CODE, modules_per_layer
from ..estimate.data import data_step_seconds
from ..estimate.data_parallel import dp_collectives
from ..estimate.distinct import per_distinct
from ..estimate.flops import step_flops
from ..estimate.hardware import hardware
from ..estimate.memory import (
    fp8_cache_flags,
    lora_saves,
    module_flags,
    plan_numbers,
    priced_recompute,
    stage_memory,
)
from ..estimate.pipeline import (
    SCHEDULES,
    in_flight,
    last_stage_heads_in_flight,
    last_stage_logits_in_flight,
)
from ..estimate.placement import FOLDED, PLAIN, V_SHAPE, placement, rank_ends
from ..estimate.recipe import recipe
from ..estimate.stage import lora_arguments, stage_times
from ..estimate.time import step_from_stages
from ..plan import (
    Plan,
    conventions,
    default_stage_split,
    least_zero,
    load_model,
    padded_vocab,
    resolve,
)
from ..units import GiB
from .peak import peaks, row_max
from .space import _sequence_parallel, distinct_codes

REPRESENTATIVE = 4  # representative stages a table holds at least


def placements(framework: str, schedule: np.ndarray) -> np.ndarray:
    """Each layout's placement of stages on ranks (estimate/placement.py) by its schedule code,
    under `framework`."""
    return np.take(_placement_table(framework), schedule)


@lru_cache(maxsize=8)
def _placement_table(framework: str) -> np.ndarray:
    """The placement of each schedule code under `framework` (read-only)."""
    table = np.array([placement(name, framework) for name in SCHEDULES], dtype=np.int64)
    table.flags.writeable = False
    return table


@lru_cache(maxsize=4096)
def _representatives(model, p: int, lora: bool, place: int = PLAIN) -> tuple[tuple[int, ...], tuple[tuple, ...]]:
    """A pipeline of p ranks' representative ranks and each one's (dense layers, MoE layers,
    embedding, head for memory, embedding, head for time) under placement `place` (see
    `_stage_tables`); O(layers), once per model, depth and placement."""
    split = np.asarray(default_stage_split(model.layers, p), dtype=np.int64)
    bounds = np.concatenate([[0], np.cumsum(split)])
    # (dense, MoE) layers of each stage: a model whose first layers are dense (DeepSeek-V3's
    # three) has stages of equal depth but unequal weight
    moe_before = np.concatenate([[0], np.cumsum(np.asarray(model.moe_layer_flags, dtype=np.int64))])
    moe = moe_before[bounds[1:]] - moe_before[bounds[:-1]]
    kinds = np.stack([split - moe, moe], axis=1)
    if place == FOLDED:  # a rank's two stages' layers together
        kinds = kinds + kinds[::-1]
    # rank 0 (embedding, most micro-batches in flight), the last rank (output head) and the first
    # rank holding each distinct mix of layers: in-flight micro-batches fall with the rank under
    # every schedule but torch's ZBVZeroBubble, where they rise (the last rank holding each mix
    # too), so no other rank with the same layers can hold or take more
    firsts = np.unique(kinds, axis=0, return_index=True)[1].tolist()
    if place == V_SHAPE:
        firsts += (p - 1 - np.unique(kinds[::-1], axis=0, return_index=True)[1]).tolist()
    reps = list(dict.fromkeys([0, p - 1] + ([1] if lora and p > 1 else []) + sorted(set(firsts))))
    return tuple(reps), tuple((int(kinds[s, 0]), int(kinds[s, 1]), *map(float, rank_ends(place, s, p)))
                              for s in reps)


class StageTable(NamedTuple):
    """Per layout (or per pipeline depth and placement): its representative ranks (last axis),
    each one's index, dense and MoE layer counts, whether it holds the embedding and the head
    (for memory, and for time: they differ under DualPipe), and how many of them are distinct."""

    idx: np.ndarray
    dense: np.ndarray
    moe: np.ndarray
    first: np.ndarray
    last: np.ndarray
    time_first: np.ndarray
    time_last: np.ndarray
    width: np.ndarray | None = None

    def rows(self, rows, w: int) -> StageTable:
        """These rows' tables, the first `w` representative ranks."""
        return StageTable(*(a[rows, :w] for a in self[:7]))


def _stage_tables(model, pps: np.ndarray, lora: bool = False, places: np.ndarray | None = None) -> StageTable:
    """Per pp value (and placement, `places`; PLAIN when None): the representative ranks'
    indices, layer counts and ends, and how many of them are distinct (the rest repeat rank 0
    and change no maximum); `lora`: rank 1 too, as LoRA's rank 0 keeps nothing for its first
    layer's input norm and may hold less. The tables are as wide as the most representative
    ranks any row needs (REPRESENTATIVE at least)."""
    places = np.full(len(pps), PLAIN) if places is None else places
    chosen = [_representatives(model, int(p), lora, int(c)) for p, c in zip(pps, places, strict=True)]
    wide = max([REPRESENTATIVE] + [len(reps) for reps, _ in chosen])
    idx = np.zeros((len(pps), wide), dtype=np.int64)
    cols = np.zeros((6, len(pps), wide))
    width = np.zeros(len(pps), dtype=np.int64)
    for row, (reps, kinds) in enumerate(chosen):
        width[row] = len(reps)
        for j in range(wide):
            k = j if j < len(reps) else 0  # padding repeats rank 0
            idx[row, j] = reps[k]
            cols[:, row, j] = kinds[k]
    return StageTable(idx, *cols, width)


def evaluate_bulk(plan: Plan, layouts: dict[str, np.ndarray], gpus: int, spec=None,
                  fitting_only: bool = False) -> dict[str, np.ndarray]:
    """Peak memory, fit and step time of every layout, with the plan formulas on arrays
    (`fitting_only`: step time only for layouts that fit; the others get inf).

    The memory model runs once over a grid, (tp, pp, cp, ep, dp) x micro-batch x recompute x
    ZeRO x representative stage, each input on its own axis, so that numpy's broadcasting
    computes each term at the dimensions it depends on (a weight's bytes once per ZeRO stage,
    not once per micro-batch); the micro-batches in flight, which depend on the schedule, once
    per distinct (run, micro-batch, schedule, interleaving) (see `_grid`, `_in_flight`); step
    times as `_step` says."""
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
    """What every layout of a search shares: the plan resolved on one GPU layout (its recompute
    settings as given, held to plan's rules), its precision recipe and the hardware rates
    (derived once per search, not per batch)."""
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
                                           "vpp": None, "pp_group": None, "stage_layers": None,
                                           "ep_overlap": False}), model)
    profile = None
    if plan.gpu_profile:
        from ..profile import load_profile

        profile = load_profile(plan.gpu_profile)
    value = (lay0, recipe(plan), hardware(lay0, profile))
    _BASE[:] = [(plan, gpus, model), value]
    return value


def _first_of(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For keys that are small non-negative integers: one element holding each distinct key
    (an index into `key`), and each element's distinct key's position among them."""
    values, code = distinct_codes(key)
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
    place = placements(plan.framework, layouts["schedule"])
    run = _runs(layouts, ("tp", "pp", "cp", "ep", "dp"), place)
    head = np.flatnonzero(np.diff(run, prepend=-1))
    kinds, inverse = np.unique(layouts["pp"][head] * 3 + place[head], return_inverse=True)
    tables = _stage_tables(model, kinds // 3, plan.finetune != "full", kinds % 3)
    wide = int(tables.width.max())
    mbs, mi = distinct_codes(layouts["mbs"])
    rc, ri = distinct_codes(layouts["recompute"])
    zero, zi = distinct_codes(layouts["zero"])
    cell = ((run * len(mbs) + mi) * len(rc) + ri) * len(zero) + zi
    return Grid(run, cell, head, mbs, rc, zero, tables.rows(inverse, wide))


def _runs(layouts: dict[str, np.ndarray], keys: tuple[str, ...], *more: np.ndarray) -> np.ndarray:
    """Run number of each layout: a new run starts wherever one of `keys` (or of the columns
    `more`) changes from the previous layout."""
    n = len(layouts["tp"])
    change = np.zeros(n, dtype=bool)
    change[0:1] = True
    for col in [layouts[k] for k in keys] + list(more):
        change[1:] |= col[1:] != col[:-1]
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
    dense, moe, first, last = (a[:, None, None, None, :] for a in grid.stages[1:5])
    vocab_padded = padded_vocab(model.vocab, plan.framework, tp)
    dp_shard = np.full_like(dp, plan.dp_shard) if plan.dp_shard else dp
    fragmentation = plan.fragmentation if plan.fragmentation is not None else run["fragmentation"]
    return stage_memory(
        plan_numbers(model, plan), r, dense_layers=dense, moe_layers=moe,
        first=first, last=last, in_flight_mb=1.0, logits_in_flight=1.0,
        tp=tp, sp=(tp > 1) & _sequence_parallel(plan), cp=cp, ep=ep, dp=dp, dp_shard=dp_shard,
        zero=_on_axis(grid.zero, 3), mbs=_on_axis(grid.mbs, 1), seq=seq,
        vocab_padded=vocab_padded, attention=act.ATTENTION_CODE[model.attention_kernel(plan.attention)],
        recompute=_on_axis(priced_recompute(grid.recompute, plan.recompute_modules), 2),
        modules=module_flags(plan.recompute_modules), fp8_cache=fp8_cache_flags(plan), recompute_layers=10**9,
        dropout=float(plan.dropout > 0), lora=plan.finetune != "full",
        lora_saves=lora_saves(plan), lora_rank=plan.lora_rank, offload_optimizer=plan.offload_optimizer,
        offload_params=plan.offload_params, pp=pp,
        reserved_bytes=(plan.overhead_gib if plan.overhead_gib is not None else run["reserved_gib"]) * GiB,
        fragmentation=fragmentation)


def _in_flight(plan: Plan, layouts: dict[str, np.ndarray], grid: Grid) -> tuple[np.ndarray, ...]:
    """The micro-batches in flight on each representative stage, and the last stage's heads and
    logits in flight, per distinct (run, micro-batch, global batch, schedule, interleaving): the
    three tables (keys x stages, keys, keys) and each layout's key."""
    sched, vpp, gbs = layouts["schedule"], layouts["vpp"], layouts["gbs"]
    key = grid.cell // (len(grid.recompute) * len(grid.zero))  # run x micro-batch
    if gbs.min() != gbs.max():  # (a search holds every layout to one)
        values, code = distinct_codes(gbs)
        key = key * len(values) + code
    values, code = distinct_codes(sched * (int(vpp.max()) + 1) + vpp)
    first, code = _first_of(key * len(values) + code)
    f = lambda k: layouts[k][first].astype(float)[:, None]  # noqa: E731
    s, m, v, pp = f("schedule"), f("m"), f("vpp"), f("pp")
    stage_idx = grid.stages.idx[grid.run[first]]
    fw = plan.framework
    inflight = in_flight(s, stage_idx, pp, m, v, plan.pp_group, framework=fw)
    column = lambda a: np.broadcast_to(a, (len(first), 1))[:, 0]  # noqa: E731
    return np.ascontiguousarray(inflight.T), column(last_stage_heads_in_flight(s, m, fw, pp)), \
        column(last_stage_logits_in_flight(s, m, fw, pp)), code


def _per_cell(a: np.ndarray, grid: Grid) -> np.ndarray:
    """A grid quantity (broadcastable to the grid) as stages x cells (a row per stage)."""
    shape = grid.shape
    return np.moveaxis(np.broadcast_to(a, shape), -1, 0).reshape(shape[-1], -1)


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
    per_cell = {k: _per_cell(mem[k], grid) for k in ("total", "total_per_in_flight", "total_per_logits",
                                                       "total_per_loss")}
    cell = grid.cell
    inflight_table, heads_table, logits_table, key = _in_flight(plan, layouts, grid)
    peak = peaks(per_cell, cell, inflight_table, heads_table, logits_table, key)
    fits = peak <= lay0.gpu.capacity_bytes
    step, mfu, hfu = np.full(n, np.inf), np.zeros(n), np.zeros(n)
    # a search ranks only layouts that fit, so it times only those
    rows = np.flatnonzero(fits) if fitting_only else np.arange(n)
    if len(rows):
        trainable = row_max(_per_cell(mem["trainable_params"], grid))[cell[rows], None]
        t = _step(plan, layouts, gpus, model, grid, rows, trainable)
        step[rows], mfu[rows], hfu[rows] = t["step_s"], t["mfu"], t["hfu"]
    return {"peak_bytes": peak, "fits": fits, "step_s": step, "tokens_per_s": layouts["gbs"] * seq / step,
            "mfu": mfu, "hfu": hfu, "capacity_bytes": lay0.gpu.capacity_bytes}


# A step evaluation's table: its rows (pieces of groups, see `_step`) as wide as makes the
# fewest table entries and rows at GROUP_ENTRIES entries a row (a row's own work, done once for
# all its layouts, against that of one layout), and worked out in pieces of at most
# STEP_ENTRIES entries, whose temporaries stay in the cache and below glibc's mmap threshold
# (one float64 temporary of 2^13 entries is 64 KiB; at 2^14, 128 KiB, GPT-3 175B's search took
# 3,900 page faults instead of 1,200, a fifth of its CPU time as system time). Measured:
# benchmarks/search_speed.py.
GROUP_ENTRIES = 3
STEP_ENTRIES = 1 << 13


def _step(plan: Plan, layouts: dict[str, np.ndarray], gpus: int, model, grid: Grid, rows: np.ndarray,
          trainable: np.ndarray) -> dict[str, np.ndarray]:
    """Step time, MFU and HFU of the layouts `rows` (`step_from_stages`). Adjacent layouts that
    differ only in schedule and interleaving form a group: everything but the pipeline schedule
    (data-parallel communication, optimizer, FLOPs) is worked out once per group
    (`_group_shared`), stage times once per run of groups differing only in ZeRO stage
    (`_group_stage_times`); the schedules on a table whose rows are pieces of a group, each as
    wide as `_table_width` says (a group's layouts side by side, a short piece padded with its
    first layout)."""
    cell, m, gbs = grid.cell[rows], layouts["m"][rows], layouts["gbs"][rows]
    change = np.ones(len(rows), dtype=bool)
    change[1:] = (cell[1:] != cell[:-1]) | (m[1:] != m[:-1]) | (gbs[1:] != gbs[:-1])
    first = np.flatnonzero(change)
    group = np.cumsum(change) - 1
    col = np.arange(len(rows)) - first[group]
    heads = rows[first]
    sel = lambda k: layouts[k][heads].astype(float)[:, None]  # noqa: E731
    cols = {k: sel(k) for k in ("tp", "pp", "dp", "cp", "ep", "mbs", "recompute", "zero", "m", "gbs")}
    cols["recompute"] = priced_recompute(cols["recompute"], plan.recompute_modules)
    # the copies of the model a rank's stages hold layers of (DualPipe's two)
    cols["copies"] = 1.0 + (placements(plan.framework, layouts["schedule"][heads]) == FOLDED)[:, None]
    stages, stage_run = _group_stage_times(plan, gpus, model, grid, heads, cols)
    cols["trainable"] = trainable[first]
    shared = _group_shared(plan, gpus, model, cols)
    # the table: each group cut into pieces of `wide` layouts, a row each
    size = np.diff(np.append(first, len(rows)))
    wide = _table_width(size)
    pieces = -(-size // wide)
    start = np.cumsum(pieces) - pieces
    owner = np.repeat(np.arange(len(first)), pieces)  # each row's group
    at = (start[group] + col // wide) * wide + col % wide  # each layout's entry (flat)
    slot = np.repeat((first[owner] + (np.arange(len(owner)) - start[owner]) * wide)[:, None], wide, axis=1)
    slot.ravel()[at] = np.arange(len(rows))
    sched, vpp = (layouts[k][rows].astype(float)[slot] for k in ("schedule", "vpp"))
    out = {k: np.empty(slot.shape) for k in ("step_s", "mfu", "hfu")}
    count = -(-slot.size // STEP_ENTRIES)
    step = -(-len(owner) // count)
    for lo in range(0, len(owner), step):
        part = slice(lo, lo + step)
        g = owner[part]
        t = _group_steps(plan, gpus, model, {k: v[g] for k, v in cols.items()}, _take(stages, stage_run[g]),
                         _take(shared, g), {"schedule": sched[part], "vpp": vpp[part]})
        for k, v in out.items():
            v[part] = t[k]
    return {k: v.ravel()[at] for k, v in out.items()}


def _table_width(size: np.ndarray) -> int:
    """The width of a step table for groups of `size` layouts: the fewest entries, counting each
    row as GROUP_ENTRIES more."""
    counts = np.bincount(size)
    sizes = np.flatnonzero(counts)
    widths = np.arange(1, int(sizes[-1]) + 1)
    rows = (-(-sizes[None, :] // widths[:, None]) * counts[sizes]).sum(axis=1)
    return int(widths[np.argmin(rows * (widths + GROUP_ENTRIES))])


def _take(stages: dict, ids: np.ndarray) -> dict:
    """These rows of `_group_stage_times`'s or `_group_shared`'s arrays (a number, the same for
    all, kept)."""
    return {k: _take(v, ids) if isinstance(v, dict) else v[ids] if np.ndim(v) else v for k, v in stages.items()}


def _group_shared(plan: Plan, gpus: int, model, cols: dict[str, np.ndarray]) -> dict:
    """What `step_from_stages` works out from a group's columns alone (one row per group), once
    for all groups rather than once per table: the model's and the hardware's FLOPs per step
    (one value per distinct global batch and recompute), the input pipeline's seconds and the
    data-parallel collectives (`dp_collectives`)."""
    lay0, r, hw = _base(plan, gpus, model)
    seq = lay0.seq_len
    tp, pp, dp, cp, zero, gbs, rc = (cols[k] for k in ("tp", "pp", "dp", "cp", "zero", "gbs", "recompute"))
    fl = per_distinct(
        lambda tokens, recompute: {k: v for k, v in step_flops(
            model, tokens=tokens, seq=seq, dense_layers=model.layers - model.n_moe_layers,
            moe_layers=model.n_moe_layers, head=1, attention_eager=model.attention_kernel(plan.attention) == "eager",
            recompute=recompute, vocab_padded=model.vocab, causal=True, skip_last=r.recompute_skips_last_linear,
            low_precision_mm=float(r.linear_in_bytes < 2), **lora_arguments(plan)).items()
            if k in ("model", "hardware")},
        {"tokens": gbs * seq, "recompute": rc})
    dp_shard = np.full_like(dp, plan.dp_shard) if plan.dp_shard else dp
    collectives = dp_collectives(hw, r, dp=dp, cp=cp, tp=tp, zero=zero, gpn=plan.gpus_per_node,
                                 trainable=cols["trainable"], sharp=plan.sharp, dp_shard=dp_shard,
                                 stage_layers=cols["copies"] * model.layers / pp,
                                 modules_per_layer=modules_per_layer(model, r))
    return {"model_flops": fl["model"], "hw_flops": fl["hardware"],
            "data_s": data_step_seconds(plan, model, gbs * seq / dp), "dp_shard": dp_shard,
            "collectives": collectives}


def _group_steps(plan: Plan, gpus: int, model, cols: dict[str, np.ndarray], stages: dict, shared: dict,
                 table: dict[str, np.ndarray]) -> dict:
    """`step_from_stages` on a table of schedules (`_step`): `cols`, `stages` and `shared`
    (`_group_shared`) one row per table row (its group's), `table` (schedule, vpp) a row of
    layouts of one group each."""
    lay0, r, hw = _base(plan, gpus, model)
    seq = lay0.seq_len
    tp, pp, dp, cp, zero, m, gbs, rc = (cols[k] for k in ("tp", "pp", "dp", "cp", "zero", "m", "gbs", "recompute"))
    return step_from_stages(
        stages, hw, r, pp=pp, dp=dp, cp=cp, tp=tp, zero=zero,
        m=m, vpp=table["vpp"], schedule=table["schedule"], overlap_dp=plan.overlap_dp,
        offload_optimizer=plan.offload_optimizer, gpn=plan.gpus_per_node, trainable=cols["trainable"],
        gbs=gbs, seq=seq, gpus=gpus, model_flops=shared["model_flops"], hw_flops=shared["hw_flops"],
        sharp=plan.sharp, data_s=shared["data_s"],
        prefetch=plan.prefetch, backward_prefetch=BACKWARD_PREFETCH_CODE[plan.backward_prefetch],
        stage_layers=cols["copies"] * model.layers / pp,
        dp_shard=shared["dp_shard"], offload_params=plan.offload_params,
        recompute=rc, modules_per_layer=modules_per_layer(model, r), collectives=shared["collectives"])


def _group_stage_times(plan: Plan, gpus: int, model, grid: Grid, heads: np.ndarray,
                       cols: dict[str, np.ndarray]) -> tuple[dict, np.ndarray]:
    """`stage_times` for groups whose first layouts are `heads` (their columns `cols`, one row
    per group), once per run of groups that differ only in ZeRO stage: the per-stage times do
    not depend on it. Returns them one row per run, and each group's run."""
    lay0, r, hw = _base(plan, gpus, model)
    run = (grid.cell // len(grid.zero))[heads]
    starts = np.diff(run, prepend=-1) != 0
    at = np.cumsum(starts) - 1
    tp, pp, dp, cp, ep, mbs, rc, copies = (cols[k][starts] for k in ("tp", "pp", "dp", "cp", "ep", "mbs", "recompute",
                                                                       "copies"))
    dense, moe, first, last = (a[grid.run[heads[starts]]] for a in (grid.stages.dense, grid.stages.moe,
                                                                    grid.stages.time_first, grid.stages.time_last))
    vocab_padded = padded_vocab(model.vocab, plan.framework, tp)
    stages = stage_times(
        model, hw, r, tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, mbs=mbs,
        seq=lay0.seq_len, recompute=rc, eager=model.attention_kernel(plan.attention) == "eager",
        dropout=plan.dropout, overlap_tp=plan.overlap_tp, gpn=plan.gpus_per_node, stage_dense=dense,
        stage_moe=moe, first=first, last=last,
        total_dense=copies * (model.layers - model.n_moe_layers), total_moe=copies * model.n_moe_layers,
        vocab_padded=vocab_padded, sp=(tp > 1) & _sequence_parallel(plan), sharp=plan.sharp,
        cp_allgather=plan.cp_comm == "allgather", ep_node_limit=plan.ep_node_limit, ep_overlap=plan.ep_overlap,
        **lora_arguments(plan))
    runs = lambda a: np.broadcast_to(a, (len(dense),) + np.shape(a)[1:])  # noqa: E731
    return {"slowest_s": runs(stages["slowest_s"]), "totals": runs(stages["totals"]), "p2p": runs(stages["p2p"]),
            "ep_saving": runs(stages["ep_saving"]), "ep_saving_total": runs(stages["ep_saving_total"]),
            "slowest_parts": {k: runs(v) for k, v in stages["slowest_parts"].items()}}, at
