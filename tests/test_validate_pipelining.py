"""Pipelines run for real with torch.distributed.pipelining (gloo, one process per rank) against
the planner's `torch` convention (estimate/torch_schedules.py).

The in-flight rules are checked action by action against the orders torch's own schedule
classes generate (PyTorch 2.13, schedules.py `_calculate_single_rank_operations`), and a few
real runs (pp 2, and one pp 4) check every rank: micro-batches in flight exactly, bytes saved
for backward within 3%, parameters and gradients exact, optimizer state off by AdamW's 4-byte
step counter per parameter tensor only, FLOPs exact."""

from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from trainplan.errors import PlanError  # noqa: E402
from trainplan.estimate import torch_schedules as ts  # noqa: E402
from trainplan.estimate.pipeline import SCHEDULE_CODE, in_flight  # noqa: E402
from trainplan.plan import make_plan, resolve  # noqa: E402
from trainplan.validate.run import validate  # noqa: E402

ACT_TOL = 0.03
ADAMW_STEP_BYTES = 4  # torch.optim.AdamW keeps a scalar fp32 step per parameter tensor
TENSORS_PER_LAYER = 9  # q, k, v, o, gate, up, down, two RMSNorm weights (Llama-style, no biases)


# ---- the rules against torch's own orders ----------------------------------------------------
def _torch_order(name, p, m, v):
    """Each rank's actions as torch's schedule class generates them, without processes."""
    from torch.distributed.pipelining import schedules as S

    cls = getattr(S, ts.TORCH_CLASSES[name])
    ns = SimpleNamespace(pp_group_size=p, _n_microbatches=m, n_local_stages=v, num_stages=p * v,
                         _num_stages=p, _stages=[None] * v, microbatches_per_round=m // max(1, m // p))
    if name == "gpipe":
        return cls._get_pipeline_order(ns)
    ns.pipeline_order = {r: cls._calculate_single_rank_operations(ns, r) for r in range(p)}
    if name == "zb":
        ns.pipeline_order = cls._add_bubbles_to_actions(ns, p * v)
    return ns.pipeline_order


def _replay(name, p, m, v, rank):
    """(chunks alive at the peak, of which the last stage's): alive from a forward until the full
    backward or the weight-gradient pass; overlapped F+B pairs run forward first (as torch's
    runtime runs their sub-actions)."""
    from torch.distributed.pipelining import schedules as S

    live, best = set(), (0, 0)
    for a in _torch_order(name, p, m, v)[rank]:
        if a is None:
            continue
        for act in a.sub_actions if a.computation_type == S.OVERLAP_F_B else (a,):
            key = (act.stage_index, act.microbatch_index)
            if act.computation_type == S.F:
                live.add(key)
                best = max(best, (len(live), sum(s == p * v - 1 for s, _ in live)))
            elif act.computation_type in (S.B, S.W):
                live.discard(key)
    return best


GRID = [(name, p, m, v) for name, vs in (("gpipe", (1,)), ("interleaved", (2, 3)), ("looped_bfs", (2, 3)),
                                          ("zb", (1, 2, 3)), ("zbv", (2,)), ("dualpipev", (2,)))
        for p in (2, 3, 4, 8) for m in sorted({p, p + 1, 2 * p, 2 * p + 2, 3 * p, 4 * p}) for v in vs
        if not (name == "dualpipev" and m < 2 * p) and not (name in ("interleaved", "zb") and m % max(1, m // p))]


@pytest.mark.parametrize("name,p,m,v", GRID, ids=[f"{n}-p{p}-m{m}-v{v}" for n, p, m, v in GRID])
def test_torch_rules_follow_torch_orders(name, p, m, v):
    head_rank = 0 if name in ts.V_SHAPED else p - 1
    for rank in range(p):
        chunks, heads = _replay(name, p, m, v, rank)
        assert ts.chunks_in_flight(name, rank, p, m, v) == chunks, (rank, chunks)
        if rank == head_rank:
            assert ts.logits_in_flight(name, m, p) == heads


def test_planner_takes_torch_rules_for_framework_torch():
    stages = np.arange(4)
    # interleaved, 10 micro-batches on 4 ranks: torch runs rounds of 5 (warm-up (v - 1)·5 + 2(p - 1 - i)),
    # Megatron-Core groups of p = 4 by default
    assert list(in_flight(SCHEDULE_CODE["interleaved"], stages, 4, 10, 2) * 2) == [11, 9, 7, 5]
    assert list(in_flight(SCHEDULE_CODE["interleaved"], stages, 4, 10, 2, framework="torch") * 2) == [12, 10, 8, 6]
    # ZB1P on one stage per rank: p on every rank
    assert list(in_flight(SCHEDULE_CODE["zb"], stages, 4, 16, 1, framework="torch")) == [4, 4, 4, 4]
    # array-friendly over schedule codes too (as search evaluates them)
    codes = np.array([SCHEDULE_CODE["gpipe"], SCHEDULE_CODE["1f1b"], SCHEDULE_CODE["dualpipev"]])
    assert list(in_flight(codes, 1, 4, 8, np.array([1, 1, 2]), framework="torch")) == [8, 3, 4.5]
    # the V-shaped schedules run two stages per rank
    assert resolve(make_plan(model="llama-3-8b", gpus=4, pp=4, framework="torch", schedule="zbv")).vpp == 2


def test_pipeline_plans_are_checked_before_any_process():
    with pytest.raises(PlanError) as e:
        validate(make_plan(model="llama-3-8b", gpus=2, pp=2, framework="torch", precision="fp32",
                           schedule="dualpipev", gbs=2, mbs=1), device="cpu")
    assert e.value.field == "gbs" and "2 x pp = 4" in e.value.rule
    with pytest.raises(PlanError) as e:
        resolve(make_plan(model="llama-3-8b", gpus=2, pp=2, framework="torch", schedule="zbv", vpp=3))
    assert e.value.field == "vpp"
    with pytest.raises(PlanError) as e:
        validate(make_plan(model="llama-3-8b", gpus=2, pp=2, framework="torch"), device="cpu")
    assert e.value.field == "precision"


# ---- real runs ------------------------------------------------------------------------------
def _run(schedule, pp, m, vpp=None):
    return validate(make_plan(model="llama-3-8b", gpus=pp, pp=pp, framework="torch", precision="fp32",
                              schedule=schedule, vpp=vpp, gbs=m, mbs=1), device="cpu")["cases"]


def _check_states(cases, layers_per_rank, first, last):
    for r, case in enumerate(cases):
        err, pred, meas = case["rel_error"], case["predicted"], case["measured"]
        assert err["params_bytes"] == 0.0 and err["grads_bytes"] == 0.0, case["name"]
        tensors = TENSORS_PER_LAYER * layers_per_rank + first[r] + 2 * last[r]
        assert meas["optimizer_bytes"] - pred["optimizer_bytes"] == ADAMW_STEP_BYTES * tensors, case["name"]
        assert err["flops"] == 0.0, case["name"]


@pytest.mark.parametrize("schedule,m,vpp,flight", [
    ("1f1b", 4, None, [2, 1]),         # min(m, p - i)
    ("gpipe", 2, None, [2, 2]),        # every micro-batch
    ("interleaved", 4, 2, [5, 3]),     # min((v - 1)·p + 2(p - 1 - i) + 1, m·v) stage chunks
])
def test_pipeline_pp2_per_rank(schedule, m, vpp, flight):
    cases = _run(schedule, 2, m, vpp)
    assert [c["in_flight"]["measured"] for c in cases] == flight
    assert [c["in_flight"]["predicted"] for c in cases] == flight
    for c in cases:
        assert abs(c["rel_error"]["activations_bytes"]) <= ACT_TOL, (c["name"], c["rel_error"])
        assert c["finished"]["micro_batches"] == 0  # full backwards free what they saved
    _check_states(cases, 2 * (vpp or 1), first=[1, 0], last=[0, 1])


def test_zbv_keeps_what_input_gradients_needed_until_the_step_ends():
    """ZBV (V-shaped: rank 0 holds the first and the last stage): the micro-batches in flight
    follow the rule exactly; on top, the split backward leaves what only the input gradients
    needed saved after each weight-gradient pass: the measured peak is the predicted one plus
    that residue."""
    cases = _run("zbv", 2, 4)
    assert [c["in_flight"]["measured"] for c in cases] == [4, 4]  # min(2p, m + i + 1, 2m)
    assert [c["in_flight"]["predicted"] for c in cases] == [4, 4]
    for c in cases:
        assert c["finished"]["micro_batches"] > 0 and c["notes"]
        in_flight_bytes = c["measured"]["activations_bytes"] - c["finished"]["bytes"]
        assert in_flight_bytes == pytest.approx(c["predicted"]["activations_bytes"], rel=ACT_TOL), c["name"]
    _check_states(cases, 4, first=[1, 0], last=[1, 0])


def test_pipeline_pp4_1f1b():
    cases = _run("1f1b", 4, 4)
    assert [c["in_flight"]["measured"] for c in cases] == [4, 3, 2, 1]
    for c in cases:
        assert c["in_flight"]["predicted"] == c["in_flight"]["measured"]
        assert abs(c["rel_error"]["activations_bytes"]) <= ACT_TOL, (c["name"], c["rel_error"])
    _check_states(cases, 2, first=[1, 0, 0, 0], last=[0, 0, 0, 1])
