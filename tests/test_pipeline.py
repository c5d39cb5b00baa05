"""In-flight micro-batches per stage and the per-stage layer split."""

import numpy as np
import pytest

from trainplan.estimate.pipeline import SCHEDULE_CODE, in_flight
from trainplan.plan import default_stage_split, make_plan, resolve


def test_1f1b_holds_p_minus_i():
    """PipeDream-Flush / 1F1B: stage i of p keeps p - i micro-batches (Narayanan et al. 2021)."""
    got = in_flight(SCHEDULE_CODE["1f1b"], np.arange(4), 4, 8)
    assert list(got) == [4, 3, 2, 1]
    # fewer micro-batches than stages: capped at m
    assert list(in_flight(SCHEDULE_CODE["1f1b"], np.arange(4), 4, 2)) == [2, 2, 2, 1]


def test_gpipe_holds_all_m():
    assert list(in_flight(SCHEDULE_CODE["gpipe"], np.arange(4), 4, 8)) == [8] * 4


def test_zero_bubble_h1_peak_is_1f1bs_on_every_stage():
    """ZB-H1 (Qi et al. 2024 §3.1): 1F1B's peak, p micro-batches (pM_B); the later stages reach it
    too, holding the inputs of the weight gradients they defer."""
    a = in_flight(SCHEDULE_CODE["zb"], np.arange(8), 8, 32)
    b = in_flight(SCHEDULE_CODE["1f1b"], np.arange(8), 8, 32)
    assert list(a) == [8] * 8 and max(a) == max(b) == 8
    assert list(in_flight(SCHEDULE_CODE["zb"], np.arange(4), 4, 2)) == [2] * 4


@pytest.mark.parametrize("p,v", [(4, 2), (8, 3), (35, 3)])
def test_interleaved_first_stage(p, v):
    """Korthikanti et al. 2023 §4.2.3: stage 0 holds (1 + (p-1)/(p·v)) x p micro-batches of
    its layers, from Megatron's warm-up count (p-1)·2 + (v-1)·p + 1 chunk-forwards."""
    got = float(in_flight(SCHEDULE_CODE["interleaved"], 0, p, 4 * p, v))
    assert got == pytest.approx(p * (1 + (p - 1) / (p * v)))


def test_llama3_405b_split_126_layers_on_16_stages():
    """Llama 3 (Dubey et al. 2024) §3.3.2: one layer fewer on the first and the last stage."""
    split = default_stage_split(126, 16)
    assert split == [7] + [8] * 14 + [7]
    lay = resolve(make_plan(model="llama-3.1-405b", gpus=16 * 8, tp=8, pp=16))
    assert lay.stage_layers == split


def test_uneven_split_properties():
    for layers in range(1, 70):
        for pp in range(1, min(layers, 17) + 1):
            split = default_stage_split(layers, pp)
            assert sum(split) == layers and min(split) >= 1 and max(split) - min(split) <= 1


def test_stage_layers_by_hand():
    lay = resolve(make_plan(model="llama-3-8b", gpus=4, pp=4, stage_layers="6,9,9,8"))
    assert lay.stage_layers == [6, 9, 9, 8]


def test_peak_stage_is_first_under_1f1b():
    from trainplan.report import evaluate, to_json

    data = to_json(evaluate(make_plan(model="llama-3-70b", gpus=64, tp=8, pp=8, gbs=256)))
    stages = data["memory"]["stages"]
    acts = [s["activations_bytes"] for s in stages]
    assert acts[0] == max(acts)
    assert data["memory"]["peak_bytes"] == max(s["total_bytes"] for s in stages)


# ---- event simulation -------------------------------------------------------------------
from trainplan.estimate.pipeline import pipeline_time  # noqa: E402
from trainplan.estimate.pipeline_simulation import simulate  # noqa: E402


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", [(4, 8), (8, 32), (2, 1), (16, 16)])
def test_bubble_gpipe_1f1b(schedule, p, m):
    """GPipe (Huang et al. 2019) and 1F1B: bubble (p-1)/(m+p-1) with equal stages."""
    t = simulate(schedule, p, m, 1.0, 2.0)
    assert t.bubble_fraction == pytest.approx((p - 1) / (m + p - 1))
    assert t.step_time == pytest.approx((m + p - 1) * 3.0)


@pytest.mark.parametrize("p,m,v", [(4, 8, 2), (4, 8, 4), (8, 16, 2), (4, 12, 3)])
def test_bubble_interleaved(p, m, v):
    """Narayanan et al. 2021 §2.2.2: interleaving with v chunks divides the bubble by v:
    (p-1)/(v·m + p-1)."""
    t = simulate("interleaved", p, m, 1.0, 2.0, vpp=v)
    assert t.bubble_fraction == pytest.approx((p - 1) / (v * m + p - 1), rel=1e-9)


@pytest.mark.parametrize("p,m,v", [(4, 8, 1), (4, 8, 2), (8, 16, 3)])
def test_simulated_in_flight_matches_memory_model(p, m, v):
    """The peak micro-batches per stage the memory model uses equal the simulation's."""
    schedule = "interleaved" if v > 1 else "1f1b"
    t = simulate(schedule, p, m, 1.0, 2.0, vpp=v)
    expected = in_flight(SCHEDULE_CODE[schedule], np.arange(p), p, m, v)
    assert t.peak_in_flight == pytest.approx(list(expected))
    g = simulate("gpipe", p, m, 1.0, 2.0)
    assert g.peak_in_flight == [m] * p


def test_zero_bubble_below_1f1b_within_1f1b_peak_memory():
    """ZB-H1 (Qi et al. 2024): a smaller bubble than 1F1B at 1F1B's peak memory (p
    micro-batches, held by stage 0)."""
    for p, m in ((4, 8), (8, 32)):
        zb = simulate("zb", p, m, 1.0, 2.0)
        base = simulate("1f1b", p, m, 1.0, 2.0)
        assert zb.bubble_fraction < base.bubble_fraction
        assert max(zb.peak_in_flight) <= max(base.peak_in_flight) == p


@pytest.mark.parametrize("schedule,v", [("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zb", 1)])
@pytest.mark.parametrize("p,m", [(4, 8), (8, 32), (4, 4)])
def test_closed_form_matches_simulation_with_uneven_stages(schedule, v, p, m):
    """The array formula `plan` and `search` use against the event simulation, with heavier
    first and last stages (embedding, output head) and point-to-point transfers: within 0.5%."""
    f = np.array([1.2] + [1.0] * (p - 2) + [1.4])
    b = 2 * f
    sim = simulate(schedule, p, m, f, b, vpp=v, p2p=0.01)
    closed = pipeline_time(SCHEDULE_CODE[schedule], p, m, (f + b).max(), (f + b).sum(), v, 0.01,
                           wgrad_share=1 / 3)
    assert float(closed) == pytest.approx(sim.step_time, rel=0.005)


# ---- every schedule as it runs: simulation against the memory model ---------------------
from trainplan.estimate.pipeline import SCHEDULES  # noqa: E402
from trainplan.estimate.pipeline_simulation import megatron_schedule_table  # noqa: E402


def _grid():
    for schedule in SCHEDULES[:5]:
        for p in (2, 4, 8):
            for m in (p, 2 * p, 4 * p):
                if schedule == "dualpipe" and m < 2 * p:
                    continue  # DualPipe.step asserts num_chunks >= 2 x num_ranks
                for v in ((2, 4) if schedule == "interleaved" else (1,)):
                    # Megatron's default group (N = p) and the largest it allows (N = m)
                    for group in ((None, m) if schedule == "interleaved" else (None,)):
                        yield schedule, p, m, v, group


@pytest.mark.parametrize("schedule,p,m,v,group", list(_grid()))
def test_simulated_peak_equals_in_flight(schedule, p, m, v, group):
    """For each schedule, the event simulation's per-stage peak of live micro-batches (layer-
    equivalent) is what the memory model charges."""
    t = simulate(schedule, p, m, 1.0, 2.0, vpp=v, group=group)
    expected = in_flight(SCHEDULE_CODE[schedule], np.arange(p), p, m, v, group)
    assert t.peak_in_flight == pytest.approx(list(expected), abs=1e-12)


def test_interleaving_group_below_pp_deadlocks():
    """Why --pp-group >= pp: with groups smaller than pp, Megatron's warm-up count is too short for
    the last stage's first backward, and the order deadlocks."""
    with pytest.raises(RuntimeError, match="deadlocked"):
        simulate("interleaved", 4, 8, 1.0, 2.0, vpp=2, group=2)
    # a last group shorter than pp only stalls (outside Megatron's rule, allowed elsewhere)
    t = simulate("interleaved", 4, 8, 1.0, 2.0, vpp=2, group=6)
    assert t.peak_in_flight == list(in_flight(SCHEDULE_CODE["interleaved"], np.arange(4), 4, 8, 2, 6))


def test_megatron_group_warmup_and_table():
    """Megatron-Core (schedules.py @d98e8a64): warm-up (p - i - 1)·2 + (v - 1)·N chunk-forwards
    and the schedule table in groups of N, the last group taking the rest."""
    # p = 4, m = 8, v = 2: N = 4 (default) against N = 8
    assert list(in_flight(SCHEDULE_CODE["interleaved"], np.arange(4), 4, 8, 2)) == [5.5, 4.5, 3.5, 2.5]
    assert list(in_flight(SCHEDULE_CODE["interleaved"], np.arange(4), 4, 8, 2, 8)) == [7.5, 6.5, 5.5, 4.5]
    # the model_parallel_config.py docstring's example: PP=2 VP=2, N=3, 5 micro-batches
    assert megatron_schedule_table(5, 2, 3) == [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1),
                                                (3, 0), (4, 0), (3, 1), (4, 1)]


@pytest.mark.parametrize("p", [2, 4, 8, 16])
def test_dualpipe_holds_pp_plus_one_chunks(p):
    """DualPipe (deepseek-ai/DualPipe README and DeepSeek-V3 Table 2): PP + 1 micro-batches' worth
    of one stage on every rank, which holds two stages: (PP + 1)/2 of its layers."""
    t = simulate("dualpipe", p, 2 * p, 1.0, 2.0)
    assert [x * 2 for x in t.peak_in_flight] == [p + 1] * p
    assert {op.kind for op in t.ops} == {"F", "B", "I", "W"}  # kinds the timeline draws
    assert sum(op.kind == "F" for op in t.ops) == 2 * p * p  # each rank runs all m = 2p micro-batches once


@pytest.mark.parametrize("p,m", [(4, 8), (4, 16), (8, 16), (8, 32)])
def test_dualpipe_closed_form_matches_simulation(p, m):
    """The array formula: a rank runs m chunks of half its layers plus (p/2 - 1)(F + B - 2W) of one
    chunk idle (equal stages, weight gradients half the backward), within 0.5%."""
    sim = simulate("dualpipe", p, m, 1.0, 2.0, p2p=0.01, wgrad_fraction=0.5)
    closed = pipeline_time(SCHEDULE_CODE["dualpipe"], p, m, 3.0, 3.0 * p, 1, 0.01, wgrad_share=1 / 3)
    assert float(closed) == pytest.approx(sim.step_time, rel=0.005)
    assert sim.bubble_fraction < simulate("1f1b", p, m, 1.0, 2.0).bubble_fraction


def test_dualpipe_layout_holds_two_stages():
    """Rank r holds stage r of one copy and p - 1 - r of the other: twice 1F1B's parameters,
    the embedding and the head on both end ranks."""
    from trainplan.estimate.memory import estimate_memory

    base = resolve(make_plan(model="llama-3-8b", gpus=8, pp=4, gbs=16))
    dual = resolve(make_plan(model="llama-3-8b", gpus=8, pp=4, gbs=16, schedule="dualpipe"))
    assert dual.stage_layers == [16] * 4 and base.stage_layers == [8] * 4
    pb, pd = estimate_memory(base)["param_count"], estimate_memory(dual)["param_count"]
    assert sum(pd) == pytest.approx(2 * sum(pb))
    assert pd[0] == pytest.approx(pb[0] + pb[3]) and pd[1] == pytest.approx(pb[1] + pb[2])


@pytest.mark.parametrize("options,field", [
    (dict(schedule="dualpipe", pp=3, gpus=3, model="llama-3-8b", gbs=12), "schedule"),
    (dict(schedule="dualpipe", pp=4, gpus=4, model="llama-3-8b", gbs=4), "gbs"),
    (dict(schedule="1f1b", pp=4, gpus=4, model="llama-3-8b", pp_group=4), "pp_group"),
    (dict(schedule="interleaved", vpp=2, pp=4, gpus=4, model="llama-3-8b", gbs=16, pp_group=2,
          framework="megatron"), "pp_group"),
    (dict(schedule="interleaved", vpp=2, pp=4, gpus=4, model="llama-3-8b", gbs=16, pp_group=32), "pp_group"),
    (dict(schedule="interleaved", vpp=2, pp=4, gpus=4, model="llama-3-8b", gbs=8, pp_group=2), "pp_group"),
    (dict(schedule="interleaved", vpp=2, pp=4, gpus=4, model="llama-3-8b", gbs=8, pp_group=6,
          framework="megatron"), "pp_group"),
])
def test_schedule_rules_refused_by_name(options, field):
    from trainplan.errors import PlanError

    with pytest.raises(PlanError) as err:
        resolve(make_plan(**options))
    assert err.value.field == field


def test_unknown_schedule_names_the_field_and_the_choices():
    from trainplan.errors import PlanError

    with pytest.raises(PlanError) as err:
        make_plan(schedule="zb-h2")  # (zbv is torch's ZBVZeroBubble, --framework torch)
    assert err.value.field == "schedule"
    assert all(name in str(err.value) for name in SCHEDULES)


def test_timeline_draws_dualpipe(tmp_path):
    """The drawing and the web page's timeline take simulate()'s ops, DualPipe's W kind among
    them (the page colours F, B, I and W: style.css .tl-op), at least 2 x pp micro-batches."""
    from trainplan.report import evaluate
    from trainplan.timeline import draw_timeline
    from trainplan.web.jobs import _timeline

    result = evaluate(make_plan(model="llama-3-8b", gpus=8, pp=4, gbs=64, schedule="dualpipe"))
    out = tmp_path / "dualpipe.svg"
    draw_timeline(result, str(out))
    assert out.stat().st_size > 0
    page = _timeline(result, max_micro_batches=4)
    assert page["micro_batches"] == 8 and {op[1] for op in page["ops"]} == {"F", "B", "I", "W"}


def test_exports_carry_the_schedule_or_refuse_it():
    """Megatron-LM takes the interleaving group as its own flag; neither Megatron-LM nor torchtitan
    has DualPipe, so exporting it is refused by name rather than run as 1F1B."""
    from trainplan.errors import PlanError
    from trainplan.export import export

    inter = resolve(make_plan(model="llama-3-8b", gpus=8, pp=4, gbs=32, schedule="interleaved", vpp=2, pp_group=8,
                              framework="megatron"))
    assert "--microbatch-group-size-per-virtual-pipeline-stage 8" in export(inter, "megatron")
    dual = resolve(make_plan(model="llama-3-8b", gpus=8, pp=4, gbs=16, schedule="dualpipe"))
    for target in ("megatron", "torchtitan"):
        with pytest.raises(PlanError) as err:
            export(dual, target)
        assert err.value.field == "schedule"


def test_a_framework_registers_its_own_rule_for_a_schedule():
    """in_flight dispatches on (schedule, framework): a framework's engine that runs a schedule
    its own way registers its rule; the others keep the common one."""
    from trainplan.estimate import pipeline

    code = pipeline.register_schedule("interleaved", lambda stage, pp, m, v, n: m + 0 * stage, framework="x-engine")
    try:
        assert list(in_flight(code, np.arange(4), 4, 8, 2, framework="x-engine")) == [8] * 4
        assert list(in_flight(code, np.arange(4), 4, 8, 2, framework="megatron")) == [5.5, 4.5, 3.5, 2.5]
    finally:
        del pipeline.IN_FLIGHT_RULES[(code, "x-engine")]


def test_a_schedule_whose_only_rule_is_another_frameworks_holds_nothing_in_flight():
    """A schedule one framework registered its own rule for, and no common one: under any other
    framework (and once that rule is removed) no micro-batches are counted in flight, on the one-
    plan path and on search's arrays alike, where a 1F1B stage 0 of pp 4 at 8 micro-batches
    holds 4."""
    from trainplan.estimate import pipeline

    code = pipeline.register_schedule("x-only-schedule", lambda stage, pp, m, v, n: m + 0 * stage,
                                      framework="x-engine")
    codes = np.array([code, pipeline.SCHEDULE_CODE["1f1b"]])
    try:
        assert float(in_flight(code, 0, 4, 8, framework="x-engine")) == 8
        assert float(in_flight(code, 0, 4, 8)) == 0
        assert list(in_flight(codes, 0, 4, 8)) == [0, 4]
        del pipeline.IN_FLIGHT_RULES[(code, "x-engine")]
        assert float(in_flight(code, 0, 4, 8, framework="x-engine")) == 0
        assert list(in_flight(codes, 0, 4, 8, framework="x-engine")) == [0, 4]
    finally:
        pipeline.IN_FLIGHT_RULES.pop((code, "x-engine"), None)
        pipeline.SCHEDULES.remove("x-only-schedule")
        del pipeline.SCHEDULE_CODE["x-only-schedule"]


@pytest.mark.parametrize("schedule,framework,pp,want", [
    # rank 0 the embedding, the last rank the head
    ("1f1b", "megatron", 4, ([1, 0, 0, 0], [0, 0, 0, 1], [1, 0, 0, 0], [0, 0, 0, 1])),
    # DualPipe's two copies: both end ranks hold both ends (memory); the time counts each once
    ("dualpipe", "megatron", 4, ([1, 0, 0, 1], [1, 0, 0, 1], [1, 0, 0, 0], [0, 0, 0, 1])),
    # torch's V-shaped schedules: rank 0 holds stage 0 and stage 2p - 1
    ("zbv", "torch", 4, ([1, 0, 0, 0],) * 4),
    ("dualpipev", "torch", 2, ([1, 0],) * 4),
    # the same schedule names outside torch keep the plain placement
    ("interleaved", "torch", 2, ([1, 0], [0, 1], [1, 0], [0, 1])),
])
def test_the_ranks_holding_the_embedding_and_the_head(schedule, framework, pp, want):
    """One placement rule for memory, step time and search: the ranks holding the embedding and
    the output head, for memory and for time."""
    from trainplan.estimate.placement import ends, placement, rank_ends

    place = placement(schedule, framework)
    got = ends(place, pp)
    assert [a.tolist() for a in got] == [[float(x) for x in column] for column in want]
    assert [rank_ends(place, s, pp) for s in range(pp)] == [tuple(bool(c[s]) for c in want) for s in range(pp)]
