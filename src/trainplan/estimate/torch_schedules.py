"""The `torch` pipelining convention: micro-batches a stage holds at its peak under the
schedules of `torch.distributed.pipelining` (PyTorch 2.13, torch/distributed/pipelining/
schedules.py), whose warm-up and freeing rules differ from Megatron-LM's and the papers'.

A rank runs v stages ("chunks") of the model; a (chunk, micro-batch) holds its activations
from its forward until its full backward (`FULL_BACKWARD`), or, when the schedule splits the
backward, until its weight gradient (`BACKWARD_WEIGHT`): the input-gradient pass
(`BACKWARD_INPUT`, `stage_backward_input` in torch/distributed/pipelining/_backward.py) runs
with `retain_graph=True` and keeps the weights' "intermediates" (the graph nodes where a
weight's path joins the input's) for the weight pass; they reference every node above them,
so the chunk's saved tensors stay. Only what lies below the last intermediates goes at
`BACKWARD_INPUT`: the stage output (or loss) is detached there and nothing else references
those nodes; on the last stage that is the loss (the log-probabilities the cross-entropy keeps,
below the head's matmul). After `BACKWARD_WEIGHT` nothing of the chunk stays saved: the
weight pass frees what it runs, dropping the intermediates frees the rest, including what only
the input gradients needed (measured in validate/pipelining.py). Counting the chunks alive
after each action of each schedule's own order gives, for rank i of p, m micro-batches:

* ScheduleGPipe: all m forwards, then all backwards: m.
* Schedule1F1B (`_step_microbatches`): min(m, p - i) warm-up forwards, then backward first
  (1B1F): min(m, p - i). (Its `_get_pipeline_order`, a drawing aid, puts the forward first.)
* ScheduleInterleaved1F1B: `_get_warmup_ops` = (v - 1)·r + 2(p - 1 - i) warm-up chunk
  forwards, with r = m // max(1, m // p) micro-batches per round (p when p divides m, where
  it equals Megatron-LM's rule), then forward before backward: min(warm-up + 1, m·v) chunks.
* ScheduleLoopedBFS: every chunk's m forwards before any backward: m·v chunks.
* ScheduleInterleavedZeroBubble (ZB1P): warm-up (v - 1)·r + (p - 1 - i), and rank i defers
  its weight gradients by i micro-batches, so every rank peaks at min((v - 1)·r + p, m·v)
  chunks (p with one chunk per rank, against ZB-H1's p - i).
* ScheduleZBVZeroBubble (v = 2, V-shaped: rank i holds stages i and 2p - 1 - i): warm-ups of
  2(p - i) - 1, then i pairs of chunk forwards, then p - i F/I/W triples: min(2p, m + i + 1,
  2m) chunks.
* ScheduleDualPipeV (`dualpipev`; v = 2, V-shaped, m >= 2p; not DeepSeek's two-copy DualPipe): 2(p - i - 1) forwards, i + 1 forward pairs,
  then overlapped forward+backward pairs, forward first: 2p + 1 chunks.

The counts are checked action by action against torch's own orders in the tests. All
functions take numbers or numpy arrays and broadcast.
"""

from __future__ import annotations

import numpy as np

from .scalars import floats, maximum, minimum, where

# planner schedule name -> torch.distributed.pipelining class
TORCH_CLASSES = {
    "gpipe": "ScheduleGPipe",
    "1f1b": "Schedule1F1B",
    "interleaved": "ScheduleInterleaved1F1B",
    "looped_bfs": "ScheduleLoopedBFS",
    "zb": "ScheduleInterleavedZeroBubble",
    "zbv": "ScheduleZBVZeroBubble",
    "dualpipev": "ScheduleDualPipeV",
}
# schedules whose ranks hold stages i and 2p - 1 - i (torch's "v" stage-to-rank style)
V_SHAPED = ("zbv", "dualpipev")


def rounds_size(pp, micro_batches):
    """Micro-batches per round of torch's interleaved schedules: m // max(1, m // p)."""
    p, m = map(floats, (pp, micro_batches))
    return m // maximum(1.0, m // p)


def chunks_in_flight(name, stage, pp, micro_batches, vpp=1):
    """(chunk, micro-batch) pairs rank `stage` holds at its peak under torch's schedule `name`
    (a planner schedule name, see TORCH_CLASSES); vpp: chunks per rank (2 for zbv, dualpipev)."""
    i, p, m, v = map(floats, (stage, pp, micro_batches, vpp))
    r = rounds_size(p, m)
    if name == "gpipe":
        return m + 0 * i
    if name == "1f1b":
        return minimum(m, p - i)
    if name == "interleaved":
        return minimum((v - 1) * r + 2 * (p - 1 - i) + 1, m * v)
    if name == "looped_bfs":
        return m * v + 0 * i
    if name == "zb":
        return minimum((v - 1) * r + p, m * v) + 0 * i
    if name == "zbv":
        return minimum(minimum(2 * p, m + i + 1), 2 * m)
    if name == "dualpipev":
        return minimum(2 * p + 1, 2 * m) + 0 * i
    raise ValueError(f"torch.distributed.pipelining has no schedule for {name!r}")


def in_flight(name, stage, pp, micro_batches, vpp=1):
    """Layer-equivalent micro-batches (chunks in flight / chunks per rank) at rank `stage`'s
    peak: what `estimate.pipeline.in_flight` returns for framework torch."""
    return chunks_in_flight(name, stage, pp, micro_batches, vpp) / floats(vpp)


def logits_in_flight(name, micro_batches, pp):
    """Micro-batches whose loss (logits and what the cross-entropy keeps) are in flight at the
    peak of the rank holding the last stage: GPipe and LoopedBFS run every forward first (m);
    the others run the last stage's backward, or under a split backward its input-gradient pass,
    right after its forward and loss (1). A loss lives until that input-gradient pass, not until
    the weight-gradient pass the zero-bubble schedules defer: `stage_backward_input` detaches
    the loss, and the cross-entropy's nodes lie below the head's weight intermediate, so nothing
    holds them after it (torch/distributed/pipelining/_backward.py, PyTorch 2.13)."""
    m = floats(micro_batches) + 0 * floats(pp)
    return where(name in ("gpipe", "looped_bfs"), m, 1.0 + 0 * m)


def heads_in_flight(name, micro_batches, pp):
    """Micro-batches of the last stage alive at the peak of the rank holding it (its final norm
    and the output layer's input, kept until the stage's full backward or weight-gradient pass):
    the live losses' count, except under InterleavedZeroBubble, whose last rank defers its
    weight gradients by p - 1 micro-batches (min(p, m))."""
    m, p = floats(micro_batches), floats(pp)
    return where(name == "zb", minimum(p, m), logits_in_flight(name, m, p))


def stage_ranks(name, pp, vpp=1) -> list[list[int]]:
    """The stages (model chunks, in model order) each rank holds: loop style (rank i holds
    i, i + p, ...), or V-shaped (i and 2p - 1 - i) for zbv and dualpipev."""
    p, v = int(pp), int(vpp)
    if name in V_SHAPED:
        return [[i, 2 * p - 1 - i] for i in range(p)]
    return [[i + k * p for k in range(v)] for i in range(p)]


def rule(name):
    """`estimate.pipeline`'s rule(stage, pp, m, vpp, group) for torch's schedule `name`."""
    return lambda stage, pp, m, v, group: in_flight(name, stage, pp, m, v)


def by_code(rule, names, schedule_code, *args):
    """`rule(name, *args)` for numeric schedule codes (indices into `names`, scalar or array):
    each torch schedule's rule where its code is; NaN for a schedule torch does not run."""
    code = np.asarray(schedule_code)
    out = np.nan
    for k, name in enumerate(names):
        if name in TORCH_CLASSES and np.any(code == k):
            out = where(code == k, rule(name, *args), out)
    return out
