"""The planner's own copies of torch.distributed.pipelining's schedule orders
(estimate/torch_orders.py, built without torch) against the orders torch 2.13's schedule
classes generate, action by action, and the event simulation run on them against the torch
convention's in-flight rules (estimate/torch_schedules.py)."""

from types import SimpleNamespace

import pytest

from trainplan.estimate import torch_orders as to
from trainplan.estimate import torch_schedules as ts
from trainplan.estimate.pipeline_simulation import simulate

# (schedule, chunks per rank) for every torch schedule; P = 2, 4 and m = P, 2P, 4P
CASES = [(name, v) for name, vs in (("gpipe", (1,)), ("1f1b", (1,)), ("interleaved", (2, 3)), ("looped_bfs", (2, 3)),
                                    ("zb", (1, 2)), ("zbv", (2,)), ("dualpipev", (2,))) for v in vs]
GRID = [(name, p, m, v) for name, v in CASES for p in (2, 4) for m in (p, 2 * p, 4 * p)
        if not (name == "dualpipev" and m < 2 * p)]
IDS = [f"{n}-p{p}-m{m}-v{v}" for n, p, m, v in GRID]


def _torch_order(name, p, m, v):
    """Each rank's compute actions as torch's schedule class generates them (without processes):
    (kind, stage, micro-batch), idle slots and gradient reductions dropped, an overlapped
    forward+backward as its two sub-actions."""
    torch = pytest.importorskip("torch")  # noqa: F841
    from torch.distributed.pipelining import schedules as S

    cls = getattr(S, ts.TORCH_CLASSES[name])
    ns = SimpleNamespace(pp_group_size=p, _n_microbatches=m, n_local_stages=v, num_stages=p * v,
                         _num_stages=p, _stages=[None] * v, microbatches_per_round=m // max(1, m // p))
    if name in ("gpipe", "1f1b"):
        orders = cls._get_pipeline_order(ns)
    else:
        ns.pipeline_order = {r: cls._calculate_single_rank_operations(ns, r) for r in range(p)}
        if name == "zb":
            ns.pipeline_order = cls._add_bubbles_to_actions(ns, p * v)
        orders = ns.pipeline_order
    out = {}
    for r, actions in orders.items():
        flat = []
        for a in actions:
            if a is None:
                continue
            for act in a.sub_actions if a.computation_type == S.OVERLAP_F_B else (a,):
                if act.computation_type in (S.F, S.B, S.I, S.W):
                    flat.append((act.computation_type.value, act.stage_index, act.microbatch_index))
        out[r] = flat
    return out


@pytest.mark.parametrize("name,p,m,v", GRID, ids=IDS)
def test_orders_equal_torch_own(name, p, m, v):
    theirs = _torch_order(name, p, m, v)
    for rank in range(p):
        ours = to.rank_order(name, rank, p, m, v)
        if name == "1f1b" and rank == p - 1:
            # Schedule1F1B._get_pipeline_order (a drawing aid) numbers the last rank's forwards
            # 1..m, from a counter started at 0 and bumped before use; its runtime
            # (_step_microbatches) runs min(m, p - i) forwards, then backward-forward pairs, each
            # kind in micro-batch order 0..m-1, which is the same sequence of kinds
            assert [k for k, _, _ in ours] == [k for k, _, _ in theirs[rank]]
            assert [b for k, _, b in ours if k == "F"] == list(range(m))
            assert [b for k, _, b in theirs[rank] if k == "F"] == list(range(1, m + 1))
            continue
        assert ours == theirs[rank], rank


@pytest.mark.parametrize("name,p,m,v", GRID, ids=IDS)
def test_simulated_peaks_equal_the_in_flight_rule(name, p, m, v):
    """The simulation, run on torch's orders with the transfers priced, holds at its peak the
    (chunk, micro-batch) pairs `chunks_in_flight` counts, on every rank: a pair is alive from its
    forward until its full backward or its weight pass."""
    stage_fwd = [1.0 + 0.1 * i for i in range(p)]  # unequal stages: the order, not the timing, decides
    sim = simulate(name, p, m, stage_fwd, [2 * x for x in stage_fwd], vpp=v, p2p=0.05, framework="torch")
    chunks = [round(x * to.chunks_per_rank(name, v)) for x in sim.peak_in_flight]
    assert chunks == [int(ts.chunks_in_flight(name, i, p, m, v)) for i in range(p)]
    kinds = [op.kind for op in sim.ops]
    assert kinds.count("F") == kinds.count("B") + kinds.count("I") == p * m * to.chunks_per_rank(name, v)
    split = sum(k == "I" for r in range(p) for k, _, _ in to.rank_order(name, r, p, m, v))
    assert kinds.count("I") == kinds.count("W") == split


def _formula(name, p, m, v, stage, p2p=0.0):
    from trainplan.estimate.pipeline import SCHEDULE_CODE, WGRAD_SHARE, pipeline_time

    return float(pipeline_time(SCHEDULE_CODE[name], p, m, max(stage), sum(stage), v, p2p, wgrad_share=WGRAD_SHARE))


@pytest.mark.parametrize("name,v", CASES)
@pytest.mark.parametrize("p", [2, 4, 8])
def test_step_formula_equals_the_simulation_on_equal_stages(name, v, p):
    """The array formula `plan` and `search` use for torch's schedules against the simulation of
    torch's own order: exact on equal stages (forward, input and weight gradients a third of a
    micro-batch each, the time model's shares), for every m the schedule takes up to 4p."""
    for m in range(p, 4 * p + 1):
        if (name == "dualpipev" and m < 2 * p) or (name in ("interleaved", "zb") and m % max(1, m // p)):
            continue
        sim = simulate(name, p, m, [1.0] * p, [2.0] * p, vpp=v, framework="torch")
        assert _formula(name, p, m, v, [3.0] * p) == pytest.approx(sim.step_time, rel=1e-9), m


@pytest.mark.parametrize("name,v", CASES)
@pytest.mark.parametrize("p,m", [(4, 8), (4, 16), (8, 16), (8, 32)])
def test_step_formula_with_uneven_stages_and_transfers(name, v, p, m):
    """With heavier first and last stages (embedding, output head) and point-to-point transfers:
    within 0.5% of the simulation (0.4% at worst: interleaving by 3)."""
    f = [1.2] + [1.0] * (p - 2) + [1.4]
    sim = simulate(name, p, m, f, [2 * x for x in f], vpp=v, p2p=0.01, framework="torch")
    assert _formula(name, p, m, v, [3 * x for x in f], 0.01) == pytest.approx(sim.step_time, rel=0.005)


def test_timeline_draws_torch_orders(tmp_path):
    """`plan --timeline` and the web page's timeline simulate torch's own order for framework
    torch: ZBV's split backwards (input half I, weight half W) on V-shaped ranks, DualPipeV with
    at least its 2 x pp micro-batches, the simulated peaks the memory model's."""
    from trainplan.plan import make_plan
    from trainplan.report import evaluate
    from trainplan.timeline import draw_timeline, row_labels, simulate_layout
    from trainplan.web.jobs import _timeline

    zbv = evaluate(make_plan(model="llama-3-8b", gpus=4, pp=4, gbs=16, framework="torch", schedule="zbv"))
    page = _timeline(zbv, max_micro_batches=8)
    assert page["micro_batches"] == 8 and {op[1] for op in page["ops"]} == {"F", "I", "W"}
    assert row_labels(zbv.layout)[0] == "rank 0: stages 0, 7"
    out = tmp_path / "zbv.svg"
    draw_timeline(zbv, str(out))
    assert out.stat().st_size > 0
    dual = evaluate(make_plan(model="llama-3-8b", gpus=4, pp=4, gbs=16, framework="torch", schedule="dualpipev"))
    page = _timeline(dual, max_micro_batches=4)
    assert page["micro_batches"] == 8 and {op[1] for op in page["ops"]} == {"F", "B", "I", "W"}
    # its overlapped pairs run forward first: every rank peaks at 2p + 1 chunks
    sim = simulate_layout(dual.layout, 8, dual.time["per_microbatch_stage_s"])
    assert [round(x * 2) for x in sim.peak_in_flight] == [9] * 4


def test_plan_refuses_what_torch_refuses():
    """torch 2.13's constructors refuse DualPipeV with fewer than 2p micro-batches and the
    interleaved schedules with m not a multiple of their rounds; so does the plan, by field."""
    from trainplan.errors import PlanError
    from trainplan.plan import make_plan, resolve

    with pytest.raises(PlanError) as e:
        resolve(make_plan(model="llama-3-8b", gpus=4, pp=4, gbs=6, framework="torch", schedule="dualpipev"))
    assert e.value.field == "gbs" and "2 x pp = 8" in e.value.rule
    with pytest.raises(PlanError) as e:
        resolve(make_plan(model="llama-3-8b", gpus=4, pp=4, gbs=9, framework="torch", schedule="zb"))
    assert e.value.field == "gbs" and "rounds" in e.value.rule
