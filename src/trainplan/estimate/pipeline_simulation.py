"""Event simulation of the pipeline schedules: each stage's forward, backward (and, split,
input- and weight-gradient) ops in the order its schedule issues them, each started when its
inputs are ready and its stage is free, giving the step's timeline (`simulate`). The closed
forms of pipeline.py are checked against it, and `trainplan plan --timeline` draws it."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import torch_orders, torch_schedules


@dataclass
class PipeOp:
    stage: int
    kind: str  # "F" forward, "B" full backward, "I" its input half where the weight half "W" is split off
    mb: int
    chunk: int
    start: float = 0.0
    end: float = 0.0


@dataclass
class Timeline:
    schedule: str
    pp: int
    micro_batches: int
    vpp: int
    ops: list[PipeOp] = field(default_factory=list)
    step_time: float = 0.0
    busy: list[float] = field(default_factory=list)  # compute time per stage
    peak_in_flight: list[float] = field(default_factory=list)  # micro-batches (layer-equivalent)

    @property
    def bubble_fraction(self) -> float:
        """Idle share of the step, averaged over stages: 1 - busy / (p · step)."""
        return 1.0 - sum(self.busy) / (self.pp * self.step_time) if self.step_time else 0.0


def megatron_schedule_table(m: int, v: int, group: int) -> list[tuple[int, int]]:
    """(micro-batch, chunk) of each virtual micro-batch in the order a stage runs its forwards:
    groups of `group` micro-batches through chunk 0, then chunk 1, ..., the last group taking
    what is left (Megatron-Core schedules.py @d98e8a64, get_schedule_table)."""
    table = []
    for lo in range(0, m, group):
        hi = m if lo + group >= m else lo + group
        table += [(b, c) for c in range(v) for b in range(lo, hi)]
        if hi == m:
            break
    return table


def _static_order(schedule: str, i: int, p: int, m: int, v: int, group: int | None = None) -> list[tuple]:
    """Each stage's op order (kind, micro-batch, chunk) for GPipe, 1F1B and interleaved 1F1B
    (Megatron-Core `forward_backward_pipelining_with_interleaving`: warm-up forwards, then one
    forward and one backward, then the remaining backwards; backwards run the chunks in reverse)."""
    if schedule == "gpipe":
        return [("F", b, 0) for b in range(m)] + [("B", b, 0) for b in range(m)]
    if schedule == "1f1b":
        warm = min(p - i - 1, m)
        order = [("F", b, 0) for b in range(warm)]
        for k in range(m - warm):
            order += [("F", warm + k, 0), ("B", k, 0)]
        return order + [("B", b, 0) for b in range(m - warm, m)]
    table = megatron_schedule_table(m, v, group or p)
    total = m * v

    def fwd(k):
        return ("F", table[k][0], table[k][1])

    def bwd(k):
        return ("B", table[k][0], v - 1 - table[k][1])

    warm = min((p - i - 1) * 2 + (v - 1) * (group or p), total)
    order = [fwd(k) for k in range(warm)]
    for k in range(total - warm):
        order += [fwd(warm + k), bwd(k)]
    return order + [bwd(k) for k in range(total - warm, total)]


def _dualpipe_order(rank: int, p: int, m: int) -> list[tuple]:
    """One DualPipe rank's ops (kind, micro-batch, direction, deferred) in the order
    deepseek-ai/DualPipe @3da1bbea dualpipe/dualpipe.py DualPipe.step issues them (steps 1-8;
    an overlapped forward-and-backward pair as its forward, then its backward). Direction 0
    enters at rank 0, direction 1 at rank p - 1; a deferred backward ("enable_zb") leaves its
    weight gradient to a later W, which the WeightGradStore queue runs first in, first out."""
    n, h = p // 2, min(rank, p - 1 - rank)
    direction = (lambda ph: ph) if rank < n else (lambda ph: 1 - ph)
    nf, nb = [0, 0], [0, 0]
    queue: list[tuple[int, int]] = []
    order: list[tuple] = []

    def F(ph):
        d = direction(ph)
        order.append(("F", nf[d], d, False))
        nf[d] += 1

    def B(ph, zb=False):
        d = direction(ph)
        order.append(("B", nb[d], d, zb))
        if zb:
            queue.append((nb[d], d))
        nb[d] += 1

    def W():
        b, d = queue.pop(0)
        order.append(("W", b, d, False))

    for _ in range((n - h - 1) * 2):
        F(0)
    for _ in range(h + 1):
        F(0)
        F(1)
    for _ in range(n - h - 1):
        B(1, zb=True)
        W()
        F(1)
    for _ in range(m // 2 - p + h + 1):
        F(0)
        B(1)
        F(1)
        B(0)
    for _ in range(n - h - 1):
        B(1)
        F(1)
        B(0)
    zb = False
    for k in range(h + 1):
        if k == (h + 1) // 2 and h % 2 == 1:
            zb = True
        B(1, zb)
        if k == (h + 1) // 2 and h % 2 == 0:
            zb = True
        B(0, zb)
    for _ in range(n - h - 1):
        W()
        B(0, zb=True)
    for _ in range(h + 1):
        W()
    return order


def _dependency(kind: str, i: int, b: int, c: int, *, p: int, v: int, dual: bool, p2p: float):
    """(key, extra delay) of the op that op `kind` of micro-batch b, chunk c on stage i waits
    for, or None: a forward, the previous stage's forward of the same micro-batch (or, under
    interleaving, the last stage's forward of the previous chunk); a backward, the next stage's
    backward (the first stage's of the next chunk), or on the last stage its own forward; a
    weight gradient, its own backward. DualPipe's chunk c is the direction the micro-batch runs
    in (0 from rank 0 to p - 1, 1 back)."""
    if kind == "W":
        return ("B", i, b, c), 0.0
    if dual:
        step = 1 if c == 0 else -1
        if kind == "F":
            prev = i - step
            return (("F", prev, b, c), p2p) if 0 <= prev < p else None
        nxt = i + step
        return (("B", nxt, b, c), p2p) if 0 <= nxt < p else (("F", i, b, c), 0.0)
    if kind == "F":
        if i > 0:
            return ("F", i - 1, b, c), p2p
        if c > 0:
            return ("F", p - 1, b, c - 1), p2p
        return None
    if i < p - 1:
        return ("B", i + 1, b, c), p2p
    if c < v - 1:
        return ("B", 0, b, c + 1), p2p
    return ("F", i, b, c), 0.0


class _StaticOrder:
    """Each stage's ops in the order its schedule fixes in advance (`_static_order`, DualPipe's
    `_dualpipe_order`): (kind, micro-batch, chunk, deferred weight gradient) per op."""

    def __init__(self, orders: list[list[tuple]]):
        self.orders = orders
        self.pos = [0] * len(orders)
        self.deferred: set[tuple] = set()
        self.total = sum(len(o) for o in orders)

    def candidates(self, i: int) -> list[tuple]:
        return [self.orders[i][self.pos[i]]] if self.pos[i] < len(self.orders[i]) else []

    def done(self, i: int, kind: str, b: int, c: int, defer: bool) -> int:
        """Record the op; the change in stage i's micro-batch chunks alive (activations held):
        a forward adds one, a backward frees it unless its weight gradient is deferred, which
        then frees it."""
        self.pos[i] += 1
        if kind == "F":
            return 1
        if kind == "B" and defer:
            self.deferred.add((i, b, c))
            return 0
        return -1 if kind == "B" or (i, b, c) in self.deferred else 0


class _ZbH1Order:
    """ZB-H1's order (Qi et al. 2024 §3.1), decided as the step runs: 1F1B's order for the
    forwards and backwards (input gradients only), every stage within 1F1B's peak (at most
    p - i forwards ahead of its backwards, p micro-batches whose weight gradients are pending),
    and the weight gradients in the idle time."""

    def __init__(self, p: int, m: int):
        self.p, self.m = p, m
        self.nf, self.nb = [0] * p, [0] * p  # next forward, next backward per stage
        self.pending: list[list[int]] = [[] for _ in range(p)]  # micro-batches whose W is pending
        self.total = 3 * m * p

    def candidates(self, i: int) -> list[tuple]:
        nf, nb, pending = self.nf[i], self.nb[i], self.pending[i]
        out = []
        if nb < nf:
            out.append(("B", nb, 0, True))
        outstanding = nf - (nb - len(pending))  # forwards whose W is not done
        if nf < self.m and nf - nb < self.p - i and outstanding < self.p:
            out.append(("F", nf, 0, False))
        if pending:
            out.append(("W", pending[0], 0, False))
        return out

    def done(self, i: int, kind: str, b: int, c: int, defer: bool) -> int:
        if kind == "F":
            self.nf[i] += 1
            return 1
        if kind == "B":
            self.nb[i] += 1
            self.pending[i].append(b)
            return 0
        self.pending[i].pop(0)
        return -1


PRIORITY = {"B": 0, "F": 1, "W": 2}  # among ops that could start at once on a stage


def _next_op(order, free: list[float], done: dict, dependency) -> tuple | None:
    """The op that starts first over all stages: ((start, priority, kind, micro-batch, chunk,
    deferred), stage), None if no stage has an op whose dependency is done (a deadlock). On a
    stage, among the candidates that could start by the earliest of them, the schedule's
    priority decides."""
    best = None
    for i in range(len(free)):
        cands = []
        for kind, b, c, defer in order.candidates(i):
            d = dependency(kind, i, b, c)
            if d is not None and d[0] not in done:
                continue
            ready = 0.0 if d is None else done[d[0]] + d[1]
            cands.append((max(free[i], ready), PRIORITY[kind], kind, b, c, defer))
        if not cands:
            continue
        start = min(x[0] for x in cands)
        pick = min((x for x in cands if x[0] <= start), key=lambda x: (x[1], x[0]))
        if best is None or pick[0] < best[0][0]:
            best = (pick, i)
    return best


def simulate(schedule: str, pp: int, micro_batches: int, fwd, bwd, vpp: int = 1, p2p: float = 0.0,
             wgrad_fraction: float = 0.5, group: int | None = None, framework: str | None = None) -> Timeline:
    """Event simulation of one pipeline step.

    fwd[i], bwd[i]: forward and backward time of stage i for one micro-batch (its whole layer
    range; a chunk under interleaving takes 1/vpp of it, under DualPipe half); p2p: activation
    transfer time between neighbouring stages; wgrad_fraction: share of the backward that
    computes weight gradients, which zero-bubble ZB-H1 (Qi et al. 2024) defers into the bubbles
    while keeping 1F1B's activation memory (at most p - i micro-batches whose weight gradients
    are pending), and DualPipe defers where its step says so; group: the interleaved schedule's
    contiguous micro-batches per chunk (default pp); framework "torch": the order
    torch.distributed.pipelining runs each of its schedules in (`torch_orders`, its stages
    placed as torch places them: looped, or V-shaped for zbv and dualpipev), its split
    backwards' weight passes at `wgrad_fraction` as ZB-H1's.
    """
    p, m = int(pp), int(micro_batches)
    v = int(vpp) if schedule == "interleaved" else (2 if schedule == "dualpipe" else 1)
    fwd = [float(x) for x in np.broadcast_to(np.asarray(fwd, dtype=float), (p,))]
    bwd = [float(x) for x in np.broadcast_to(np.asarray(bwd, dtype=float), (p,))]
    by_torch = framework == "torch" and schedule in torch_schedules.TORCH_CLASSES
    zb, dual = schedule == "zb" and not by_torch, schedule == "dualpipe"
    if by_torch:
        v = torch_orders.chunks_per_rank(schedule, vpp)
        place = torch_orders.Placement(schedule, p, v)
        order = _StaticOrder([place.sim_order(schedule, i, p, m, v) for i in range(p)])
    elif zb:
        order = _ZbH1Order(p, m)
    elif dual:
        order = _StaticOrder([_dualpipe_order(i, p, m) for i in range(p)])
    else:
        order = _StaticOrder([[(*o, False) for o in _static_order(schedule, i, p, m, v, group)] for i in range(p)])

    def duration(i, kind, defer):
        if kind == "F":
            return fwd[i] / v
        if kind == "B":
            return bwd[i] / v * ((1 - wgrad_fraction) if (zb or defer) else 1.0)
        return bwd[i] / v * wgrad_fraction

    def dependency(kind, i, b, c):
        if by_torch:
            return place.dependency(kind, i, b, c, p2p)
        return _dependency(kind, i, b, c, p=p, v=v, dual=dual, p2p=p2p)

    done: dict[tuple, float] = {}
    ops: list[PipeOp] = []
    free, busy = [0.0] * p, [0.0] * p
    live, peak = [0.0] * p, [0.0] * p  # micro-batch chunks alive (activations held) per stage
    for _ in range(order.total):
        best = _next_op(order, free, done, dependency)
        if best is None:
            raise RuntimeError(f"pipeline schedule {schedule} deadlocked (p={p}, m={m}, v={v})")
        (start, _, kind, b, c, defer), i = best
        end = start + duration(i, kind, defer)
        ops.append(PipeOp(i, "I" if kind == "B" and (defer or zb) else kind, b, c, start, end))
        done[(kind, i, b, c)] = end
        free[i] = end
        busy[i] += end - start
        live[i] += order.done(i, kind, b, c, defer)
        peak[i] = max(peak[i], live[i])
    step = max(op.end for op in ops)
    return Timeline(schedule, p, m, v, ops, step, busy, [x / v for x in peak])
