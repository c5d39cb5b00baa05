"""The order in which each rank runs its actions under torch.distributed.pipelining's schedules
(PyTorch 2.13, torch/distributed/pipelining/schedules.py), rebuilt without torch so the event
simulation (`pipeline_simulation.simulate`, framework torch) runs them as torch does.

An action is (kind, stage, micro-batch): kind "F" forward, "B" full backward, "I" the input
half of a split backward (BACKWARD_INPUT, run with retain_graph) and "W" its weight half
(BACKWARD_WEIGHT); stage is the global stage index (chunk) of the model. Each builder follows
torch's own, step for step:

* gpipe: ScheduleGPipe._get_pipeline_order (all forwards, then all backwards).
* 1f1b: Schedule1F1B._get_pipeline_order (p - 1 - i warm-up forwards, then forward-backward
  pairs, then the remaining backwards; the runtime's 1B1F after p - i forwards is the same
  sequence).
* looped_bfs: ScheduleLoopedBFS._calculate_single_rank_operations (each local stage's m
  forwards in model order, then each's m backwards in reverse).
* interleaved, zb: `_get_1f1b_rank_ops` with `_get_warmup_ops` (multiply factor 2, and 1 with
  the zero-bubble split for ScheduleInterleavedZeroBubble, whose rank i runs its first i
  input-gradient passes before it starts deferring weight passes), rounds of
  m // max(1, m // p) micro-batches per local stage (`microbatches_per_round`);
  `_add_bubbles_to_actions` only inserts idle slots, which the simulation finds by itself.
* zbv: ScheduleZBVZeroBubble._calculate_single_rank_operations (V-shaped: rank i holds stages
  i and 2p - 1 - i; warm-ups of 2(p - i) - 1 and i pairs, F/I/W triples, cool-down).
* dualpipev: ScheduleDualPipeV._calculate_single_rank_operations (steps 1-8; an overlapped
  forward+backward pair, OVERLAP_F_B, as its forward then its full backward, as the runtime
  runs its sub-actions; W passes from a first-in first-out queue of split backwards).

Idle slots (None) are dropped: the order is what the rank runs, and the simulation times it.
"""

from __future__ import annotations

from collections import defaultdict

from .torch_schedules import TORCH_CLASSES, stage_ranks


def _gpipe(rank, p, m, v):
    return [("F", rank, b) for b in range(m)] + [("B", rank, b) for b in range(m)]


def _one_f_one_b(rank, p, m, v):
    warm = min(p - 1 - rank, m)
    order = [("F", rank, b) for b in range(warm)]
    for k in range(m - warm):
        order += [("F", rank, warm + k), ("B", rank, k)]
    return order + [("B", rank, b) for b in range(m - warm, m)]


def _looped_bfs(rank, p, m, v):
    stages = range(rank, p * v, p)
    return [("F", s, b) for s in stages for b in range(m)] + \
        [("B", s, b) for s in reversed(stages) for b in reversed(range(m))]


def _rounds(p, m):
    return m // max(1, m // p)


def _one_f_one_b_rank_ops(rank, p, m, v, factor, zero_bubble):
    """`_get_1f1b_rank_ops` as ScheduleInterleaved1F1B (factor 2) and
    ScheduleInterleavedZeroBubble (factor 1, zero_bubble) call it."""
    r = _rounds(p, m)
    warm = min((v - 1) * r + factor * (p - 1 - rank), m * v)
    total = m * v + warm  # warm-up + (m·v - warm-up) steady + warm-up cool-down steps

    def fwd_stage(step):
        return (step // r) % v * p + rank

    def bwd_stage(step):
        return (v - 1 - ((step - warm) // r) % v) * p + rank

    nf, nb, nw = defaultdict(int), defaultdict(int), defaultdict(int)
    order, backward_steps = [], []
    weights = 0  # weight passes run so far (they follow the backwards in order)

    def act(kind, stage, counter):
        order.append((kind, stage, counter[stage]))
        counter[stage] += 1

    for step in range(total):
        if step < m * v:
            act("F", fwd_stage(step), nf)
        if step >= warm:
            act("I" if zero_bubble else "B", bwd_stage(step), nb)
            backward_steps.append(step)
            if zero_bubble and step - warm >= rank:  # num_1f1b_microbatches = rank
                act("W", bwd_stage(backward_steps[weights]), nw)
                weights += 1
    for step in backward_steps[weights:] if zero_bubble else ():
        act("W", bwd_stage(step), nw)
    return order


def _interleaved(rank, p, m, v):
    return _one_f_one_b_rank_ops(rank, p, m, v, 2, False)


def _zb(rank, p, m, v):
    return _one_f_one_b_rank_ops(rank, p, m, v, 1, True)


def _zbv(rank, p, m, v):
    n_micro = max(2 * p - 1, m)
    s0, s1 = rank, 2 * p - 1 - rank
    c = defaultdict(int)  # (stage, kind) -> next micro-batch
    order = []

    def act(kind, stage, counter_kind=None):
        key = (stage, counter_kind or kind)
        order.append((kind, stage, c[key]))
        c[key] += 1

    for _ in range(2 * (p - rank) - 1):
        act("F", s0)
    for _ in range(rank):
        act("F", s1)
        act("F", s0)
    for _ in range(p - rank):
        act("F", s1)
        act("I", s1)
        act("W", s1)
    while c[(s1, "F")] < c[(s0, "F")] or c[(s0, "F")] < n_micro:
        if c[(s0, "F")] < n_micro:
            act("F", s0)
        act("I", s0)
        act("W", s0)
        act("F", s1)
        act("I", s1)
        act("W", s1)
    for _ in range(rank):
        act("I", s0)
        act("I", s1)
    for _ in range(p - rank):
        act("I", s0)
        act("W", s0)
    while c[(s1, "W")] < c[(s1, "I")]:
        act("W", s1)
    while c[(s0, "W")] < c[(s0, "I")]:
        act("W", s0)
    return [a for a in order if a[2] < m]  # the micro-batches past m are torch's idle slots


def _dualpipev(rank, p, m, v):
    s0, s1 = rank, 2 * p - 1 - rank
    nf, ni = defaultdict(int), defaultdict(int)  # forwards, backwards (input halves) per stage
    queue, order = [], []

    def F(s):
        order.append(("F", s, nf[s]))
        nf[s] += 1

    def B(s, split=False):
        order.append(("I" if split else "B", s, ni[s]))
        if split:
            queue.append((s, ni[s]))
        ni[s] += 1

    def W():
        if queue:
            s, b = queue.pop(0)
            order.append(("W", s, b))

    for _ in range((p - rank - 1) * 2):
        F(s0)
    for _ in range(rank + 1):
        F(s0)
        F(s1)
    for _ in range(p - rank - 1):
        B(s1, True)
        W()
        F(s1)
    for _ in range(m - 2 * p + rank + 1):  # overlapped pairs: forward, then backward
        F(s0)
        B(s1)
        F(s1)
        B(s0)
    for _ in range(p - rank - 1):
        B(s1)
        F(s1)
        B(s0)
    split, n6 = False, rank + 1
    for k in range(n6):
        if k == n6 // 2 and rank % 2 == 1:
            split = True
        B(s1, split)
        if k == n6 // 2 and rank % 2 == 0:
            split = True
        B(s0, split)
    for _ in range(p - rank - 1):
        W()
        B(s0, split)
    for _ in range(rank + 1):
        W()
    return order


BUILDERS = {"gpipe": _gpipe, "1f1b": _one_f_one_b, "looped_bfs": _looped_bfs, "interleaved": _interleaved,
            "zb": _zb, "zbv": _zbv, "dualpipev": _dualpipev}
assert set(BUILDERS) == set(TORCH_CLASSES)


def chunks_per_rank(name: str, vpp: int = 1) -> int:
    """Stages a rank holds under torch's schedule `name`: 2 for the V-shaped ones, 1 for GPipe
    and 1F1B, else vpp."""
    return 2 if name in ("zbv", "dualpipev") else (1 if name in ("gpipe", "1f1b") else int(vpp))


def rank_order(name: str, rank: int, pp: int, micro_batches: int, vpp: int = 1) -> list[tuple[str, int, int]]:
    """Rank `rank`'s actions (kind, global stage, micro-batch) in the order torch runs them."""
    return BUILDERS[name](int(rank), int(pp), int(micro_batches), chunks_per_rank(name, vpp))


class Placement:
    """Where each stage runs: (rank, local chunk) of global stage s, and back."""

    def __init__(self, name: str, pp: int, vpp: int = 1):
        self.ranks = stage_ranks(name, pp, chunks_per_rank(name, vpp))
        self.owner = {s: (r, c) for r, stages in enumerate(self.ranks) for c, s in enumerate(stages)}
        self.last = len(self.owner) - 1

    def dependency(self, kind: str, rank: int, b: int, c: int, p2p: float):
        """(key, delay) of the op an op waits for (keys (kind, rank, micro-batch, local chunk);
        an input-gradient pass is recorded as "B"): a forward on the previous stage's forward,
        a backward on the next stage's, the last stage's on its own forward, a weight pass on its
        own input-gradient pass; the transfer time only between ranks (none at the V's bottom,
        where rank p - 1 holds stages p - 1 and p)."""
        if kind == "W":
            return ("B", rank, b, c), 0.0
        s = self.ranks[rank][c]
        if kind == "F":
            if s == 0:
                return None
            r, k = self.owner[s - 1]
            return ("F", r, b, k), (p2p if r != rank else 0.0)
        if s == self.last:
            return ("F", rank, b, c), 0.0
        r, k = self.owner[s + 1]
        return ("B", r, b, k), (p2p if r != rank else 0.0)

    def sim_order(self, name: str, rank: int, pp: int, micro_batches: int, vpp: int = 1) -> list[tuple]:
        """The rank's order as the simulation's ops (kind, micro-batch, local chunk, deferred
        weight pass): a split backward's input half is a "B" whose weight pass is deferred."""
        return [("B" if k == "I" else k, b, self.owner[s][1], k == "I")
                for k, s, b in rank_order(name, rank, pp, micro_batches, vpp)]
