"""The layouts a search enumerates: the space of each layout dimension, the rules a layout
keeps (the plan's own, applied as soon as their dimensions exist, so that rejected prefixes are
never multiplied out), the search's default global batch, and a layout as a Plan."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..errors import PlanError
from ..estimate import activations as act
from ..estimate.pipeline import SCHEDULE_CODE, SCHEDULES
from ..plan import (
    Plan,
    conventions,
    default_stage_split,
    interleaving_problem,
    least_zero,
    load_model,
    pipeline_rules,
    schedule_batch_rules,
    zero_stages,
)

# the layout dimensions a search enumerates unless the plan fixes them
LAYOUT_DIMENSIONS = ("tp", "pp", "cp", "ep", "zero", "mbs", "recompute", "schedule", "vpp", "sp")


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
        # (--recompute-modules names what selective recomputation re-runs: it alone is searched)
        recompute=dim("recompute", ["none", "selective", "full"] if plan.recompute_modules is None else ["selective"]),
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


def plan_vpp(v: int) -> int | None:
    """A layout's virtual stages per GPU as the plan's --vpp: none for one stage per GPU."""
    return int(v) if v > 1 else None


# (model, framework, schedule) -> {(pp, vpp): whether `pipeline_rules` accepts it}: the rules
# read nothing else of the plan (its schedule, vpp and framework, the model's layers), so a
# search asks once per model and depth
_ACCEPTED: dict[tuple, dict[tuple[int, int], bool]] = {}


def _accepted(plan: Plan, model) -> dict[tuple[int, int], bool]:
    """`_ACCEPTED`'s table for `plan`'s schedule (and framework) and `model`."""
    if len(_ACCEPTED) > 1 << 10:
        _ACCEPTED.clear()
    return _ACCEPTED.setdefault((model, plan.framework, plan.schedule), {})


def _accepts(plan: Plan, model, pp: int, v: int, table: dict | None = None) -> bool:
    """Whether `plan` (a schedule of the space) runs `v` virtual stages per GPU on `pp` stages:
    `pipeline_rules`, resolve's own check, returning that count (`table`: `_accepted`'s)."""
    table = _accepted(plan, model) if table is None else table
    if (pp, v) not in table:
        try:
            table[pp, v] = pipeline_rules(plan.model_copy(update={"vpp": plan_vpp(v)}), model, pp) == v
        except PlanError:
            table[pp, v] = False
    return table[pp, v]


def _schedule_plans(plan: Plan, space: Space) -> dict[str, Plan]:
    """The plan under each schedule of the space."""
    return {s: plan.model_copy(update={"schedule": s, "vpp": None, "stage_layers": None}) for s in space.schedule}


def _schedule_pairs(plan: Plan, space: Space, model, pps: list[int]) -> dict[int, list[tuple[int, int]]]:
    """Per pipeline depth, its (schedule code, virtual stages) pairs in the space's schedule
    order, virtual stages ascending: each count `plan` accepts for the schedule on that depth
    (`pipeline_rules`): one for a schedule of one stage per GPU, those the split allows
    (`interleavings`) for interleaving and torch's looped schedules, two for torch's V-shaped
    ones, none for a schedule the depth cannot run (DualPipe on an odd one)."""
    plans = _schedule_plans(plan, space)
    tables = {s: _accepted(plans[s], model) for s in space.schedule}
    out = {}
    for p in pps:
        counts = (1, *interleavings(model.layers, p, plan.framework)) if space.vpp is None else tuple(space.vpp)
        out[p] = [(SCHEDULE_CODE[s], v) for s in space.schedule for v in counts
                  if _accepts(plans[s], model, p, v, tables[s])]
    return out


def _batch_rules(plans: dict[str, Plan], pairs: dict[int, list[tuple[int, int]]], depths: list[int],
                 keys: np.ndarray, m_top: int) -> np.ndarray:
    """Per (depth, micro-batches) key (depth index x m_top + micro-batches), whether each of the
    depth's pairs takes that many micro-batches per step: `schedule_batch_rules`, resolve's own
    check (interleaving: a multiple of the depth; DualPipe: an even count, at least twice it;
    torch's schedules their constructors' rules)."""
    by_code = {SCHEDULE_CODE[s]: (plan, (plan.framework, s, plan.pp_group)) for s, plan in plans.items()}
    width = max(1, max(len(p) for p in pairs.values()))
    # (the rules do not depend on the virtual stages: once per schedule, each pair then reading
    # its schedule's answer: `pick`, per depth, each pair's schedule's position, padding at the
    # last, always False)
    codes = sorted(by_code)
    pick = np.full((len(depths), width), len(codes))
    for i, p in enumerate(depths):
        pick[i, :len(pairs[p])] = [codes.index(code) for code, _ in pairs[p]]
    used = [{code for code, _ in pairs[p]} for p in depths]
    tables = [(code, _taken(by_code[code][1])) for code in codes]
    rows = []
    for key in keys.tolist():
        i, m = divmod(key, m_top)
        p = depths[i]
        rows.append([code in used[i] and (table[p, m] if (p, m) in table else _takes(*by_code[code], p, m, table))
                     for code, table in tables] + [False])
    return np.take_along_axis(np.array(rows, dtype=bool).reshape(len(keys), len(codes) + 1), pick[keys // m_top],
                              axis=1)


# (framework, schedule, interleaving group) -> {(pp, micro-batches): whether
# `schedule_batch_rules` accepts them}: the rules read nothing else of the plan
_TAKES: dict[tuple, dict[tuple[int, int], bool]] = {}


def _taken(rules: tuple) -> dict[tuple[int, int], bool]:
    """`_TAKES`' table for `rules` (a plan's framework, schedule and interleaving group)."""
    if len(_TAKES) > 1 << 10:
        _TAKES.clear()
    return _TAKES.setdefault(rules, {})


def _takes(plan: Plan, rules: tuple, pp: int, m: int, table: dict | None = None) -> bool:
    """Whether `plan`'s schedule takes `m` micro-batches per step on `pp` stages (`rules`: the
    plan's framework, schedule and interleaving group; `table`: `_taken`'s)."""
    table = _taken(rules) if table is None else table
    if (pp, m) not in table:
        try:
            schedule_batch_rules(plan, pp, m)
            table[pp, m] = True
        except PlanError:
            table[pp, m] = False
    return table[pp, m]


def distinct_codes(col: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct values of a column of non-negative integers, ascending, and each element's
    position among them (a table lookup where the values are small: no sort)."""
    top = int(col.max()) + 1
    if top > 4 * len(col) + 4096:
        values, code = np.unique(col, return_inverse=True)
        return values, code.reshape(-1)
    present = np.zeros(top, dtype=bool)
    present[col] = True
    values = np.flatnonzero(present)
    position = np.empty(top, dtype=np.int64)  # (read only where a value is present)
    position[values] = np.arange(len(values))
    return values, position[col]


def _expand_pairs(cols: dict[str, np.ndarray], pairs: dict[int, list[tuple[int, int]]],
                  one_stage_1f1b: bool, plans: dict[str, Plan]) -> dict[str, np.ndarray]:
    """Every row of `cols` with each (schedule, vpp) pair of its pipeline depth that the rules
    allow, the pairs innermost (the row order of the full product, restricted to them): the
    micro-batches per step each schedule takes (`_batch_rules`); without a pipeline,
    `one_stage_1f1b`, 1F1B alone (1F1B is then plain gradient accumulation, ZB-H1 the same and
    GPipe the same or worse: it keeps every micro-batch's activations)."""
    depths = sorted(pairs)
    pairs = {p: [q for q in pairs[p] if p > 1 or not one_stage_1f1b or q[0] == SCHEDULE_CODE["1f1b"]]
             for p in depths}
    width = max(1, max(len(p) for p in pairs.values()))
    table = np.full((len(depths), width, 2), -1, dtype=np.int64)
    for i, p in enumerate(depths):
        if pairs[p]:
            table[i, :len(pairs[p])] = pairs[p]
    depth = np.searchsorted(depths, cols["pp"])
    sched, vpp = table[:, :, 0], table[:, :, 1]
    m_top = int(cols["m"].max()) + 1 if len(cols["m"]) else 1
    valid = np.take(sched >= 0, depth, axis=0)
    if len(depth):
        keys, code = distinct_codes(depth * m_top + cols["m"])
        valid &= np.take(_batch_rules(plans, pairs, depths, keys, m_top), code, axis=0)
    # (flat positions: one-dimensional takes, far cheaper than indexing by two index arrays)
    flat = np.flatnonzero(valid)
    row = flat // width
    pick = depth[row] * width + (flat - row * width)
    out = {name: np.take(col, row) for name, col in cols.items()}
    out["schedule"], out["vpp"] = np.take(sched.ravel(), pick), np.take(vpp.ravel(), pick)
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
    cols = _expand_pairs(cols, pairs, "1f1b" in space.schedule, _schedule_plans(plan, space))
    return {k: cols[k] for k in LAYOUT_KEYS}


def layout_plan(plan: Plan, layouts: dict[str, np.ndarray], i: int, gpus: int) -> Plan:
    """The i-th layout as a Plan (for the full per-plan report)."""
    tp = int(layouts["tp"][i])
    sched = SCHEDULES[int(layouts["schedule"][i])]
    return plan.model_copy(update={
        "gpus": gpus, "dp": None, "tp": tp, "pp": int(layouts["pp"][i]), "cp": int(layouts["cp"][i]),
        "ep": int(layouts["ep"][i]), "zero": int(layouts["zero"][i]), "mbs": int(layouts["mbs"][i]),
        "gbs": int(layouts["gbs"][i]), "recompute": act.RECOMPUTE[int(layouts["recompute"][i])],
        "schedule": sched, "vpp": plan_vpp(int(layouts["vpp"][i])),
        "sp": tp > 1 and _sequence_parallel(plan), "stage_layers": None})


def _sequence_parallel(plan: Plan) -> bool:
    """Searched layouts use sequence parallelism with TP unless the plan turns it off."""
    return bool(plan.sp or "sp" not in plan.model_fields_set)
