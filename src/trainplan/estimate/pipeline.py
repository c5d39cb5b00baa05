"""Micro-batches whose activations a pipeline stage holds at its memory peak.

Counts follow each schedule's warm-up rule (the number of forwards a stage runs before its
first backward, plus the one in progress):

* GPipe (Huang et al. 2019): all forwards first, so every stage holds all m micro-batches.
* 1F1B (PipeDream-Flush; Narayanan et al. 2021 §2.2.1): stage i (0-based) of p runs
  p - i - 1 warm-up forwards, so it holds min(p - i, m).
* Interleaved 1F1B with v model chunks per stage (Megatron-LM schedules.py,
  `get_num_warmup_microbatches`): (p - i - 1)·2 + (v - 1)·p warm-up chunk-forwards plus one,
  capped at m·v; each chunk holds 1/v of the stage's layers. Stage 0 therefore holds
  L/p·(1 + (p - 1)/(p·v)) layers' worth, Korthikanti et al. 2023 §4.2.3.
* Zero-bubble ZB-H1 (Qi et al. 2024): same activation memory as 1F1B, min(p - i, m).

All functions take numbers or numpy arrays (broadcast together) and return layer-equivalent
micro-batch counts (how many micro-batches' worth of the stage's layers are alive).
"""

from __future__ import annotations

import numpy as np

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb")
# A backward pass costs twice its forward (input and weight gradients: two GEMMs per forward
# GEMM), so the forward is a third of a micro-batch's work and the weight gradients another
# third (the share ZB-H1 can defer).
FWD_SHARE = 1 / 3
WGRAD_SHARE = 1 / 3
SCHEDULE_CODE = {name: i for i, name in enumerate(SCHEDULES)}


def in_flight(schedule_code, stage, pp, micro_batches, vpp=1):
    """Micro-batches' worth of activations stage `stage` holds at its peak."""
    stage, pp, m, v = (np.asarray(x, dtype=float) for x in (stage, pp, micro_batches, vpp))
    one_f_one_b = np.minimum(pp - stage, m)
    chunks = np.minimum((pp - stage - 1) * 2 + (v - 1) * pp + 1, m * v)
    interleaved = chunks / v
    code = np.asarray(schedule_code)
    return np.where(code == 0, m, np.where(code == 2, interleaved, one_f_one_b))


def last_stage_logits_in_flight(schedule_code, micro_batches):
    """Micro-batches whose logits/loss tensors are alive at once on the last stage: the
    last stage runs each backward right after its forward except under GPipe."""
    return np.where(np.asarray(schedule_code) == 0, np.asarray(micro_batches, dtype=float), 1.0)


# ---- event simulation of the schedules ----------------------------------------------------
from dataclasses import dataclass, field  # noqa: E402


@dataclass
class PipeOp:
    stage: int
    kind: str  # "F" forward, "B" backward (input grads; weight grads too except under ZB), "W"
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


def _static_order(schedule: str, i: int, p: int, m: int, v: int) -> list[tuple[str, int, int]]:
    """Each stage's op order (kind, micro-batch, chunk) for GPipe, 1F1B and interleaved 1F1B
    (Megatron-LM `forward_backward_pipelining_with_interleaving`)."""
    if schedule == "gpipe":
        return [("F", b, 0) for b in range(m)] + [("B", b, 0) for b in range(m)]
    if schedule == "1f1b":
        warm = min(p - i - 1, m)
        order = [("F", b, 0) for b in range(warm)]
        for k in range(m - warm):
            order += [("F", warm + k, 0), ("B", k, 0)]
        return order + [("B", b, 0) for b in range(m - warm, m)]
    # interleaved: virtual micro-batch k -> (chunk, micro-batch), in groups of p
    total = m * v

    def fwd(k):
        return ("F", (k // (p * v)) * p + k % p, (k // p) % v)

    def bwd(k):
        return ("B", (k // (p * v)) * p + k % p, v - 1 - (k // p) % v)

    warm = min((p - i - 1) * 2 + (v - 1) * p, total)
    order = [fwd(k) for k in range(warm)]
    for k in range(total - warm):
        order += [fwd(warm + k), bwd(k)]
    return order + [bwd(k) for k in range(total - warm, total)]


def simulate(schedule: str, pp: int, micro_batches: int, fwd, bwd, vpp: int = 1, p2p: float = 0.0,
             wgrad_fraction: float = 0.5) -> Timeline:
    """Event simulation of one pipeline step.

    fwd[i], bwd[i]: forward and backward time of stage i for one micro-batch (its whole layer
    range; a chunk under interleaving takes 1/vpp of it); p2p: activation transfer time
    between neighbouring stages; wgrad_fraction: share of the backward that computes weight
    gradients, which zero-bubble ZB-H1 (Qi et al. 2024) defers into the bubbles while keeping
    1F1B's activation memory (at most p - i micro-batches whose weight gradients are pending).
    """
    p, m, v = int(pp), int(micro_batches), int(vpp) if schedule == "interleaved" else 1
    fwd = [float(x) for x in np.broadcast_to(np.asarray(fwd, dtype=float), (p,))]
    bwd = [float(x) for x in np.broadcast_to(np.asarray(bwd, dtype=float), (p,))]
    zb = schedule == "zb"
    done: dict[tuple, float] = {}
    ops: list[PipeOp] = []
    free = [0.0] * p
    busy = [0.0] * p
    live = [0.0] * p  # micro-batch chunks alive (activations held) per stage
    peak = [0.0] * p
    orders = None if zb else [_static_order(schedule, i, p, m, v) for i in range(p)]
    pos = [0] * p
    # ZB-H1 state per stage: next forward, next backward, pending weight-grad micro-batches
    nf, nb = [0] * p, [0] * p
    pending_w: list[list[int]] = [[] for _ in range(p)]

    def dep(i, kind, b, c):
        """(key, extra delay) the op waits for, or None."""
        if kind == "F":
            if i > 0:
                return ("F", i - 1, b, c), p2p
            if c > 0:
                return ("F", p - 1, b, c - 1), p2p
            return None
        if kind == "B":
            if i < p - 1:
                return ("B", i + 1, b, c), p2p
            if c < v - 1:
                return ("B", 0, b, c + 1), p2p
            return ("F", i, b, c), 0.0
        return ("B", i, b, c), 0.0  # W after its B

    def ready_at(i, kind, b, c):
        d = dep(i, kind, b, c)
        if d is None:
            return 0.0
        key, delay = d
        return done[key] + delay if key in done else None

    def duration(i, kind):
        if kind == "F":
            return fwd[i] / v
        if kind == "B":
            return bwd[i] / v * ((1 - wgrad_fraction) if zb else 1.0)
        return bwd[i] * wgrad_fraction

    def candidates(i):
        if not zb:
            return [orders[i][pos[i]]] if pos[i] < len(orders[i]) else []
        out = []
        if nb[i] < nf[i]:
            out.append(("B", nb[i], 0))
        # 1F1B's order for F and B; weight gradients wait for idle time. ZB-H1 keeps every
        # stage within 1F1B's peak, the p micro-batches of stage 0 (Qi et al. 2024 §3.1).
        outstanding = nf[i] - (nb[i] - len(pending_w[i]))  # forwards whose W is not done
        if nf[i] < m and nf[i] - nb[i] < p - i and outstanding < p:
            out.append(("F", nf[i], 0))
        if pending_w[i]:
            out.append(("W", pending_w[i][0], 0))
        return out

    remaining = sum(len(o) for o in orders) if orders else 3 * m * p
    priority = {"B": 0, "F": 1, "W": 2}
    while remaining:
        best = None
        for i in range(p):
            cands = []
            for kind, b, c in candidates(i):
                r = ready_at(i, kind, b, c)
                if r is not None:
                    cands.append((max(free[i], r), priority[kind], kind, b, c))
            if not cands:
                continue
            start = min(x[0] for x in cands)
            # among ops that could start by then, the schedule's priority decides
            pick = min((x for x in cands if x[0] <= start), key=lambda x: (x[1], x[0]))
            if best is None or pick[0] < best[0][0]:
                best = (pick, i)
        if best is None:
            raise RuntimeError(f"pipeline schedule {schedule} deadlocked (p={p}, m={m}, v={v})")
        (start, _, kind, b, c), i = best
        end = start + duration(i, kind)
        ops.append(PipeOp(i, kind, b, c, start, end))
        done[(kind, i, b, c)] = end
        free[i] = end
        busy[i] += end - start
        remaining -= 1
        if kind == "F":
            live[i] += 1
            peak[i] = max(peak[i], live[i])
        if not zb:
            pos[i] += 1
            if kind == "B":
                live[i] -= 1
        else:
            if kind == "F":
                nf[i] += 1
            elif kind == "B":
                nb[i] += 1
                pending_w[i].append(b)
            else:
                pending_w[i].pop(0)
                live[i] -= 1
    step = max(op.end for op in ops)
    return Timeline(schedule, p, m, v, ops, step, busy, [x / v for x in peak])


def pipeline_time(schedule_code, pp, micro_batches, stage_fwd_bwd_max, stage_fwd_bwd_sum, vpp=1,
                  p2p=0.0, wgrad_share=0.0):
    """Closed-form step time of the pipelined compute (array-friendly), checked against
    `simulate` in the tests.

    stage_fwd_bwd_max / _sum: the largest and the sum over stages of one micro-batch's
    forward + backward time. GPipe and 1F1B take (m - 1)·max + sum (= (m + p - 1)·t for
    equal stages; Narayanan et al. 2021 §2.2); interleaving divides the fill and drain by v:
    m·max + (sum - max)/v; ZB-H1 (weight gradients filling idle time) removes twice the
    weight-gradient share w of the fill and drain (one W fills the warm-up, one the cool-down
    idle slot of each stage), as the simulation shows.
    """
    code = np.asarray(schedule_code)
    m, p, v = (np.asarray(x, dtype=float) for x in (micro_batches, pp, vpp))
    tmax = np.asarray(stage_fwd_bwd_max, dtype=float)
    tsum = np.asarray(stage_fwd_bwd_sum, dtype=float)
    fill = tsum - tmax
    base = (m - 1) * tmax + tsum
    inter = m * tmax + fill / v
    zb = base - fill * np.minimum(2 * np.asarray(wgrad_share, dtype=float), 1.0)
    t = np.where(code == SCHEDULE_CODE["interleaved"], inter, np.where(code == SCHEDULE_CODE["zb"], zb, base))
    hops = np.where(code == SCHEDULE_CODE["interleaved"], 2 * (p - 1) * v, 2 * (p - 1))
    return t + hops * p2p
