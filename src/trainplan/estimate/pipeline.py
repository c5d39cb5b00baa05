"""Micro-batches whose activations a pipeline stage holds at its memory peak.

Counts follow each schedule's warm-up rule (the number of forwards a stage runs before its
first backward, plus the one in progress), as each framework's pipeline engine runs it:

* GPipe (Huang et al. 2019): all forwards first, so every stage holds all m micro-batches.
* 1F1B (PipeDream-Flush; Narayanan et al. 2021 §2.2.1): stage i (0-based) of p runs
  p - i - 1 warm-up forwards, so it holds min(p - i, m).
* Interleaved 1F1B with v model chunks per stage, as Megatron-Core runs it
  (megatron/core/pipeline_parallel/schedules.py @d98e8a64, get_pp_rank_microbatches):
  (p - i - 1)·2 + (v - 1)·N warm-up chunk-forwards plus one, capped at m·v, where N is
  `microbatch_group_size_per_vp_stage`, the contiguous micro-batches each chunk runs before the
  next chunk (model_parallel_config.py: default p, the 2021 rule; allowed in [p, m]; Llama 3's
  schedule, arXiv 2407.21783 §3.3.2, "allows setting N flexibly"). Each chunk holds 1/v of the
  stage's layers, so with N = p stage 0 holds L/p·(1 + (p - 1)/(p·v)) layers' worth
  (Korthikanti et al. 2023 §4.2.3). The output tensor a chunk sends on is freed once sent
  (schedules.py deallocate_output_tensor, which megatron/training sets on; Llama 3 §3.3.2
  frees the pipeline's input and output tensors alike): the memory model counts only what
  the layers save, so no pipeline buffers are added.
* Zero-bubble ZB-H1 (Qi et al. 2024, arXiv 2401.10241 §3.1, Fig. 3): stage i runs 1F1B's
  p - i warm-up forwards, then defers weight gradients (W) into the bubbles; a micro-batch's
  activations (the linears' inputs W needs) live until its W. The peak is 1F1B's, p micro-batches
  (the paper's pM_B), but every stage reaches it: the later stages hold the inputs of up to
  p - 1 - i deferred W's besides their own in flight (the event simulation of
  pipeline_simulation.py shows min(p, m) on every stage; ZB-H2's 2p - 1 is not offered).
* DualPipe (DeepSeek-V3, arXiv 2412.19437 §3.2.1 and Table 2; deepseek-ai/DualPipe @3da1bbea
  dualpipe/dualpipe.py DualPipe.step): two copies of the model run in opposite directions, rank
  r holding stage r of one and stage p - 1 - r of the other (twice 1F1B's parameters). Its
  warm-up (steps 1-2) runs p forward chunks, and the first overlapped forward-and-backward
  pair of step 4 allocates one more before the backward frees one: p + 1 chunks on every rank,
  (p + 1)/2 of the rank's layers (it needs m >= 2p and m even).

`in_flight` is the one entry point: it dispatches on a schedule code, and a framework where one
runs a schedule its own way, through IN_FLIGHT_RULES, to which another framework's pipeline
engine adds its schedules or its own rules with `register_schedule`.
All functions take numbers or numpy arrays (broadcast together) and return layer-equivalent
micro-batch counts (how many micro-batches' worth of the stage's layers are alive).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from . import torch_schedules
from .scalars import SCALAR_TYPES, floats, maximum, minimum, values, where

SCHEDULES = ["gpipe", "1f1b", "interleaved", "zb", "dualpipe"]
# A backward pass costs twice its forward (input and weight gradients: two GEMMs per forward
# GEMM), so the forward is a third of a micro-batch's work and the weight gradients another
# third (the share ZB-H1 can defer).
FWD_SHARE = 1 / 3
WGRAD_SHARE = 1 / 3
SCHEDULE_CODE = {name: i for i, name in enumerate(SCHEDULES)}


def _gpipe(stage, pp, m, v, group):
    return m + 0 * stage


def _one_f_one_b(stage, pp, m, v, group):
    return minimum(pp - stage, m)


def _interleaved(stage, pp, m, v, group):
    chunks = minimum((pp - stage - 1) * 2 + (v - 1) * group + 1, m * v)
    return chunks / v


def _zb_h1(stage, pp, m, v, group):
    return minimum(pp, m) + 0 * stage


def _dualpipe(stage, pp, m, v, group):
    return (pp + 1) / 2 + 0 * stage + 0 * m


# (schedule code, framework or None) -> rule(stage, pp, m, vpp, group) giving layer-equivalent
# micro-batches in flight; None: the rule every framework's engine follows unless it has its own
IN_FLIGHT_RULES: dict[tuple[int, str | None], Callable] = {
    (SCHEDULE_CODE["gpipe"], None): _gpipe,
    (SCHEDULE_CODE["1f1b"], None): _one_f_one_b,
    (SCHEDULE_CODE["interleaved"], None): _interleaved,
    (SCHEDULE_CODE["zb"], None): _zb_h1,
    (SCHEDULE_CODE["dualpipe"], None): _dualpipe,
}

_REGISTRATIONS = [0]  # the registrations made


def register_schedule(name: str, rule: Callable, framework: str | None = None) -> int:
    """Add a schedule, or a framework's own rule for one (its pipeline engine runs it its way),
    with its in-flight rule rule(stage, pp, m, vpp, group); returns the schedule's code."""
    if name not in SCHEDULE_CODE:
        SCHEDULES.append(name)
        SCHEDULE_CODE[name] = len(SCHEDULES) - 1
    IN_FLIGHT_RULES[(SCHEDULE_CODE[name], framework)] = rule
    _REGISTRATIONS[0] += 1
    return SCHEDULE_CODE[name]


def rules_version() -> tuple:
    """Changes whenever a rule is registered (or removed): part of the keys of memoised
    in-flight figures."""
    return _REGISTRATIONS[0], len(IN_FLIGHT_RULES)


# framework torch: torch.distributed.pipelining's own rules for its schedules (torch_schedules.py)
for _name in torch_schedules.TORCH_CLASSES:
    register_schedule(_name, torch_schedules.rule(_name), "torch")


def in_flight(schedule_code, stage, pp, micro_batches, vpp=1, group=None, framework: str | None = None):
    """Micro-batches' worth of activations stage `stage` holds at its peak; `group` is the
    interleaved schedule's contiguous micro-batches per chunk (N; default pp); `framework` picks
    that framework's own rule for a schedule where it registered one."""
    stage, pp, m, v = map(floats, (stage, pp, micro_batches, vpp))
    n = pp if group is None else floats(group)
    if schedule_code.__class__ in SCALAR_TYPES or np.ndim(schedule_code) == 0:
        # one schedule (a single plan): its rule alone, without scanning the registry, on the
        # arguments' broadcast shape
        shape = _broadcast_shape(stage, pp, m, v, n)
        rule = _rule(int(schedule_code), framework)
        if rule is None:
            return np.zeros(shape)
        out = rule(stage, pp, m, v, n)
        if not (isinstance(out, np.ndarray) and out.shape == shape and out.dtype == float):
            out = np.broadcast_to(out, shape).astype(float)
        return out
    code = np.asarray(schedule_code)
    out = np.zeros(np.broadcast_shapes(code.shape, np.shape(stage), np.shape(pp), np.shape(m), np.shape(v),
                                       np.shape(n)))
    for c in {c for c, _ in IN_FLIGHT_RULES}:
        rule = _rule(c, framework)
        if rule is not None and np.any(code == c):
            out = where(code == c, rule(stage, pp, m, v, n), out)
    return out


def _rule(code: int, framework: str | None):
    """The in-flight rule of schedule `code` under `framework` (its own, else every framework's);
    None where it has neither (no micro-batches counted in flight)."""
    return IN_FLIGHT_RULES.get((code, framework)) or IN_FLIGHT_RULES.get((code, None))


def _broadcast_shape(*args) -> tuple:
    """np.broadcast(*args).shape of float arrays and numpy floats (`floats`): one array's own
    shape where the rest are scalars."""
    shapes = [a.shape for a in args if a.__class__ is np.ndarray]
    if len(shapes) == 1:
        return shapes[0]
    return np.broadcast(*args).shape


def last_stage_logits_in_flight(schedule_code, micro_batches, framework: str | None = None, pp=1):
    """Micro-batches whose logits/loss tensors are alive at once on the last stage: the
    last stage runs each backward right after its forward except under GPipe (framework torch:
    torch.distributed.pipelining's schedules, `torch_schedules.logits_in_flight`)."""
    if framework == "torch":
        return torch_schedules.by_code(torch_schedules.logits_in_flight, SCHEDULES, schedule_code, micro_batches, pp)
    return where(values(schedule_code) == 0, floats(micro_batches), 1.0)


def last_stage_heads_in_flight(schedule_code, micro_batches, framework: str | None = None, pp=1):
    """Micro-batches of the last stage alive at its rank's peak, for its final norm and the output
    layer's input: the live logits' count, except under a split backward that frees the loss at
    the input-gradient pass and the rest of the stage at the deferred weight-gradient pass
    (framework torch: `torch_schedules.heads_in_flight`)."""
    if framework == "torch":
        return torch_schedules.by_code(torch_schedules.heads_in_flight, SCHEDULES, schedule_code, micro_batches, pp)
    return last_stage_logits_in_flight(schedule_code, micro_batches, framework, pp)


def pipeline_time(schedule_code, pp, micro_batches, stage_fwd_bwd_max, stage_fwd_bwd_sum, vpp=1,
                  p2p=0.0, wgrad_share=0.0):
    """Closed-form step time of the pipelined compute (array-friendly), checked against
    `simulate` in the tests.

    stage_fwd_bwd_max / _sum: the largest and the sum over stages of one micro-batch's
    forward + backward time. GPipe and 1F1B take (m - 1)·max + sum (= (m + p - 1)·t for
    equal stages; Narayanan et al. 2021 §2.2); interleaving divides the fill and drain by v:
    m·max + (sum - max)/v; ZB-H1 (weight gradients filling idle time) removes twice the
    weight-gradient share w of the fill and drain (one W fills the warm-up, one the cool-down
    idle slot of each stage), as the simulation shows. DualPipe: a rank runs m chunks of half
    its layers (m·max/2) and, run as DualPipe.step orders it, leaves (p/2 - 1)·(F + B - 2W) of
    one chunk idle, F, B and W a chunk's forward, whole backward and weight gradients: with
    F = B/2 and W = B/2 a third of a chunk, (p/2 - 1)·(1 - 2w)·max/2 (the simulation, equal
    stages; DeepSeek-V3 Table 2 gives (p/2 - 1)(F&B + B - 3W) with the forward and backward of a
    pair overlapped).

    torch.distributed.pipelining's schedules (framework torch, `torch_orders`; exact against
    `simulate` on equal stages at the model's shares, forward, input and weight gradients a
    third each): LoopedBFS fills and drains as interleaving does, m·max + (sum - max)/v;
    InterleavedZeroBubble (`zb`, v chunks) takes ZB-H1's fill and drain divided by v;
    DualPipeV m·max + (1 - 2w)·(sum - max)/2; ZBVZeroBubble the same once m >= (3p - 1)/2, and
    with fewer micro-batches (its warm-up assumes 2p - 1 of them, the missing ones leave idle
    slots) (1 - 2w)·(sum - max)·(2p - 1 - m)/(p - 1). The pipeline's first forward and last
    backward cross 2(p - 1)·v stage boundaries under every schedule with v chunks per rank (V-
    shaped: the bottom of the V stays on its rank).
    """
    code = values(schedule_code)
    m, p, v = map(floats, (micro_batches, pp, vpp))
    tmax = floats(stage_fwd_bwd_max)
    tsum = floats(stage_fwd_bwd_sum)
    fill = tsum - tmax
    base = (m - 1) * tmax + tsum
    inter = m * tmax + fill / v
    w = floats(wgrad_share)
    zb = m * tmax + fill * (1 - minimum(2 * w, 1.0)) / v
    dual = m * tmax / 2 + (p / 2 - 1) * maximum(1 - 2 * w, 0.0) * tmax / 2
    vee = m * tmax + fill * maximum(1 - 2 * w, 0.0) / 2
    zbv = m * tmax + fill * maximum(1 - 2 * w, 0.0) * maximum((2 * p - 1 - m) / maximum(p - 1, 1), 0.5)
    looped = (code == SCHEDULE_CODE["interleaved"]) | (code == SCHEDULE_CODE.get("looped_bfs", -1))
    t = where(looped, inter, where(code == SCHEDULE_CODE["zb"], zb, base))
    t = where(code == SCHEDULE_CODE["dualpipe"], dual, t)
    t = where(code == SCHEDULE_CODE.get("dualpipev", -1), vee, where(code == SCHEDULE_CODE.get("zbv", -1), zbv, t))
    return t + 2 * (p - 1) * v * p2p
