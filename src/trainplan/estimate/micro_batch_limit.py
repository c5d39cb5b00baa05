"""The largest micro-batch that fits a layout: memory is affine in the micro-batch for the
terms the line keeps (`estimate_memory_and_line`), so the candidates (divisors of the
global batch per data-parallel rank) are checked on the line at the stages that can peak."""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from ..plan import Layout
from .memo import SameObjects, track
from .memory import LINE_KEYS, estimate_memory_and_line, layout_inputs, stage_indices
from .pipeline import (
    SCHEDULE_CODE,
    in_flight,
    last_stage_heads_in_flight,
    last_stage_logits_in_flight,
    rules_version,
)


def peak_candidate_stages(layout: Layout, inputs: dict | None = None, micro_batches=None) -> np.ndarray:
    """The stages among which the memory peak lies under any micro-batch size: the first of
    the stages sharing each (dense layers, MoE layers, first, last) of `inputs`
    (`layout_inputs`). A stage's memory is set by those and by its micro-batches in flight, and
    grows with these, which no schedule of estimate/pipeline.py lets grow with the stage index;
    so no later stage of the same kind holds more. A rule registered there that did (checked at
    the fewest and the most `micro_batches`) gets every stage. An even split has at most four
    (stage 0, one or two kinds of middle stages, the last). (A read-only array.)"""
    inputs = inputs or layout_inputs(layout)
    plan, pp = layout.plan, layout.pp
    grows = False
    if micro_batches is not None and len(micro_batches):
        m = np.asarray(micro_batches)
        flight = in_flight(SCHEDULE_CODE[plan.schedule], np.arange(pp)[:, None], pp,
                           np.array([m.min(), m.max()])[None, :], layout.vpp, plan.pp_group, plan.framework)
        grows = _grows(flight)
    return _peak_stages(_kinds_key(inputs, pp), grows)


def _grows(flight: np.ndarray) -> bool:
    """Whether a later stage holds more in flight than the one before it (stages on the first axis)."""
    return bool(_any(flight[1:] > flight[:-1], axis=None))


_any = np.logical_or.reduce  # (an array's .any() without its method wrapper)


def _kinds_key(inputs: dict, pp: int) -> tuple:
    """Each stage's (dense layers, MoE layers, first, last) of `inputs`, as a tuple per stage."""
    columns = (inputs[k].tolist() if np.shape(inputs[k]) == (pp,) else np.broadcast_to(inputs[k], (pp,)).tolist()
               for k in ("dense_layers", "moe_layers", "first", "last"))
    return tuple(zip(*columns, strict=True))


def _line_kinds(inputs: dict, pp: int) -> tuple[tuple, int]:
    """`_kinds_key` of a memory line's stage kinds, and a number standing for it in memo keys (the
    same for the same kinds while the process lives); of a memoised line's (read-only arrays)
    the same again while they are the same objects."""
    return _KINDS.get(pp, tuple(inputs.values()), lambda: _kinds_numbered(_kinds_key(inputs, pp)))


def _kinds_numbered(kinds: tuple) -> tuple[tuple, int]:
    """`kinds` and the number standing for them."""
    number = _KIND_NUMBERS.get(kinds)
    if number is None:
        if len(_KIND_NUMBERS) >= 1024:
            _KIND_NUMBERS.clear()  # (the numbers go on rising: none stands for two kinds)
        _KIND_COUNT[0] += 1
        number = _KIND_NUMBERS[kinds] = _KIND_COUNT[0]
    return kinds, number


_KINDS = SameObjects(64)  # a line's stage kinds (its arrays) and pp -> `_line_kinds`
_KIND_NUMBERS: dict = track({})  # stage kinds -> the number standing for them
_KIND_COUNT = [0]  # the last number given


@lru_cache(maxsize=1024)
def _peak_stages(kinds: tuple, grows: bool) -> np.ndarray:
    """`peak_candidate_stages` from each stage's kind and whether a later stage holds more in
    flight (then every stage)."""
    if grows:
        out = np.arange(len(kinds))
    else:
        first: dict = {}  # kind -> its first stage, in stage order
        for i, kind in enumerate(kinds):
            first.setdefault(kind, i)
        out = np.fromiter(first.values(), dtype=np.int64, count=len(first))
    out.flags.writeable = False
    return out


def _divisors(q: int) -> list[int]:
    """The divisors of a positive integer, ascending (from its prime factors)."""
    out, n, p = [1], q, 2
    while p * p <= n:
        if n % p == 0:
            power, powers = 1, []
            while n % p == 0:
                n //= p
                power *= p
                powers.append(power)
            out += [d * k for d in out for k in powers]
        p += 1 if p == 2 else 2
    if n > 1:
        out += [d * n for d in out]
    return sorted(out)


@lru_cache(maxsize=1024)
def _mbs_candidates(limit: int, gbs: int | None, dp: int, micro_batches: int) -> tuple[np.ndarray, np.ndarray]:
    """The micro-batch sizes `max_micro_batch` tries (1..limit; with a global batch, those for
    which dp x size divides it), ascending, and the micro-batches per step at each (read-only
    arrays; never rising)."""
    if gbs is None:
        cands = np.arange(1, limit + 1)
        m = np.full(cands.shape, micro_batches)
    elif gbs % dp:
        cands = m = np.zeros(0, dtype=np.int64)
    else:  # dp x size divides gbs: the divisors of gbs / dp
        q = gbs // dp
        divisors = _divisors(q)
        cands = np.array(divisors if divisors[-1] <= limit else [c for c in divisors if c <= limit], dtype=np.int64)
        m = q // cands
    cands.flags.writeable = m.flags.writeable = False
    return cands, m


def max_micro_batch(layout: Layout, limit: int = 4096, line: dict | None = None) -> int:
    """Largest micro-batch that fits every stage (respecting gbs divisibility when the
    global batch was given); 0 when even 1 does not fit. Every candidate size on the stages
    that can hold the peak (`peak_candidate_stages`), from each stage's memory line in the
    micro-batch size (`estimate_memory_and_line`; evaluated here unless given) and its
    micro-batches in flight at that size."""
    plan = layout.plan
    cands, m = _mbs_candidates(limit, layout.gbs if plan.gbs is not None else None, layout.dp,
                               layout.micro_batches)
    if not len(cands):
        return 0
    if line is None:
        line = estimate_memory_and_line(layout)[1]
    kinds, kinds_number = _line_kinds(line["stage_kinds"], layout.pp)
    key = (plan.schedule, plan.framework, plan.pp_group, layout.pp, layout.vpp, limit, *rules_version(),
           layout.gbs if plan.gbs is not None else None, layout.dp, layout.micro_batches, kinds_number)
    try:
        grid = _MBS_GRIDS.get(key)
    except TypeError:  # an unhashable setting: not memoised
        key = grid = None
    if grid is None:
        grid = _mbs_grid(layout, kinds, cands, m)
        if key is not None:
            if len(_MBS_GRIDS) >= 256:
                _MBS_GRIDS.clear()
            _MBS_GRIDS[key] = grid
    points = line["points"]
    capacity = layout.gpu.capacity_bytes
    if key is None:
        return _largest_fitting(points, grid, cands, capacity)
    # a memoised line's points are one read-only array: the same object, the same answer
    return _MAX_MBS.get((key, capacity), (points,), lambda: _largest_fitting(points, grid, cands, capacity))


_MAX_MBS = SameObjects(256)  # grid key, capacity and a line's points -> max_micro_batch


def _largest_fitting(points: np.ndarray, grid: tuple, cands: np.ndarray, capacity: float) -> int:
    """`max_micro_batch` from each stage's memory line (`points`, keys x stages x sizes 1 and 2)
    and its `_mbs_grid`."""
    stages, extras, sizes_above_one = grid
    one, slope = _line_on(points, stages)
    # each key's value at each candidate size (keys x stages x candidates), each times its count
    # beyond the one micro-batch the line holds (the total's once), summed over the keys in
    # LINE_KEYS' order: the total, then the micro-batches in flight, the heads and the losses
    total = _sum0(_mul(_add(one, _mul(sizes_above_one, slope)), extras), 0)
    fitting = (_max0(total, 0) <= capacity).nonzero()[0]
    return int(cands[fitting[-1]]) if len(fitting) else 0  # the largest: candidates ascend


# numpy's ufuncs and their reductions, called directly (no method wrapper on tiny arrays)
_mul, _add, _sum0, _max0 = np.multiply, np.add, np.add.reduce, np.maximum.reduce


def _line_on(points: np.ndarray, stages: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The line's value at size 1 and its rise per size (keys x stages x 1) on `stages`; of a
    memoised (read-only) line the same arrays again while it and the stages are the same objects."""
    return _LINES_ON.get(None, (points, stages), lambda: _rise(points[:, stages]))


def _rise(on: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A line's value at size 1 and its rise per size (from its points at sizes 1 and 2, last axis)."""
    one = on[:, :, :1]
    return one, on[:, :, 1:] - one


_LINES_ON = SameObjects(64)  # a line's points and the stages -> `_line_on`


_MBS_GRIDS: dict = track({})  # one layout's `_mbs_grid`, memoised by the integers it is computed from


def _mbs_grid(layout: Layout, kinds: tuple, cands, m) -> tuple:
    """`max_micro_batch`'s integers: the stages that can hold the peak (`peak_candidate_stages`, of
    the stages' `kinds`), and at each candidate size on them the micro-batches in flight beyond
    one, the live heads beyond one and the live losses beyond the heads (read-only arrays; one
    column for every size where the micro-batches per step do not change with it). The
    in-flight rules are element-wise: every stage's count at each size is one evaluation, the
    peak stages' rows and the check at the fewest and the most micro-batches read from it."""
    plan = layout.plan
    sched = SCHEDULE_CODE[plan.schedule]
    # (m falls as the size grows, `_mbs_candidates`: the most micro-batches first, the fewest last;
    # without a global batch it is the same at every size, whose counts one column gives)
    row = (m[None, :] if len(m) and m[0] != m[-1] else m[None, :1]).astype(float)  # (as the rules take it)
    every = in_flight(sched, stage_indices(layout.pp)[:, None], layout.pp, row, layout.vpp, plan.pp_group, plan.framework)
    stages = _peak_stages(kinds, _grows(every[:, ::max(row.shape[1] - 1, 1)]))
    logits = last_stage_logits_in_flight(sched, row, plan.framework, layout.pp)
    heads = last_stage_heads_in_flight(sched, row, plan.framework, layout.pp)
    # LINE_KEYS' counts beyond the line's: the total once, the micro-batches in flight beyond one,
    # the live heads beyond one and the live losses beyond the heads (keys x stages x columns)
    extras = np.empty((len(LINE_KEYS), len(stages), row.shape[1]))
    extras[0] = 1.0
    np.subtract(every[stages], 1, out=extras[1])
    extras[2] = heads - 1
    extras[3] = logits - heads
    grid = (stages, extras, cands - 1)
    for a in grid:
        if isinstance(a, np.ndarray):
            a.flags.writeable = False
    return grid
