"""The work of a plan, search or comparison is bounded before it starts (trainplan.limits), and
the faster stage split and micro-batch bound give exactly the answers they gave before."""

import json
import math
import resource
import time
from pathlib import Path

import numpy as np
import pytest

from trainplan.errors import PlanError
from trainplan.estimate.memory import (
    estimate_memory,
    estimate_memory_and_line,
    layout_inputs,
    numbers_for,
    stage_memory,
)
from trainplan.estimate.micro_batch_limit import max_micro_batch, peak_candidate_stages
from trainplan.estimate.pipeline import SCHEDULE_CODE, in_flight, last_stage_logits_in_flight
from trainplan.estimate.recipe import recipe
from trainplan.limits import MAX_LAYERS, MAX_SEARCH_LAYOUTS, MAX_STAGES
from trainplan.plan import default_stage_split, make_plan, resolve
from trainplan.specs import catalog

HF = Path(__file__).parent / "data" / "hf"


def _llama(layers: int) -> dict:
    """Llama 3 8B's config.json (tests/data/hf) with another depth."""
    return {**json.loads((HF / "llama-3-8b.json").read_text()), "num_hidden_layers": layers}


def _web_client():
    from fastapi.testclient import TestClient

    from trainplan.web.app import create_app

    return TestClient(create_app(), base_url="http://127.0.0.1")


# ---- reference copies of the algorithms as they were, to show the answers did not change ----
def _old_stage_split(layers: int, pp: int) -> list[int]:
    per = math.ceil(layers / pp)
    split = [per] * pp
    order: list[int] = []
    for lo, hi in zip(range(pp), range(pp - 1, -1, -1), strict=True):
        for i in (hi, lo):
            if i not in order:
                order.append(i)
    deficit, k = per * pp - layers, 0
    while deficit > 0:
        split[order[k % pp]] -= 1
        deficit -= 1
        k += 1
    return split


def _old_max_micro_batch(layout, limit: int = 4096) -> int:
    """Every candidate on every stage, as one pp x candidates array."""
    plan = layout.plan
    cands = np.arange(1, limit + 1)
    if plan.gbs is not None:
        cands = cands[(layout.gbs % (layout.dp * cands)) == 0]
        m = layout.gbs // (layout.dp * cands)
    else:
        m = np.full(cands.shape, layout.micro_batches)
    inputs = layout_inputs(layout)
    sched = SCHEDULE_CODE[plan.schedule]
    stages = np.arange(layout.pp)[:, None]
    inputs.update(
        mbs=cands[None, :],
        in_flight_mb=in_flight(sched, stages, layout.pp, m[None, :], layout.vpp, plan.pp_group, plan.framework),
        logits_in_flight=last_stage_logits_in_flight(sched, m[None, :]),
        head_in_flight=last_stage_logits_in_flight(sched, m[None, :]),
        dense_layers=inputs["dense_layers"][:, None], moe_layers=inputs["moe_layers"][:, None],
        first=inputs["first"][:, None], last=inputs["last"][:, None],
    )
    total = stage_memory(numbers_for(layout), recipe(plan), **inputs)["total"]
    fits = (np.max(total, axis=0) <= layout.gpu.capacity_bytes)
    return int(cands[fits].max()) if fits.any() else 0


def test_stage_split_equals_the_outside_in_rule_on_a_sweep():
    """The O(pp) split takes the same layers from the same stages as the O(pp^2) walk from the
    outside in, on every depth up to 100 layers and every pipeline up to it, and on the deepest
    models the limits allow."""
    for layers in range(1, 101):
        for pp in range(1, layers + 1):
            assert default_stage_split(layers, pp) == _old_stage_split(layers, pp), (layers, pp)
    for layers, pp in ((MAX_LAYERS, 1000), (MAX_LAYERS, 3000), (MAX_LAYERS - 1, 2048), (4001, 4000)):
        assert default_stage_split(layers, pp) == _old_stage_split(layers, pp), (layers, pp)
    # the published case: Llama 3 405B, 126 layers on 16 stages (Dubey et al. 2024 §3.3.2)
    assert default_stage_split(126, 16) == [7] + [8] * 14 + [7]


def test_stage_split_of_the_deepest_plan_is_fast():
    t0 = time.perf_counter()
    split = default_stage_split(MAX_LAYERS, MAX_STAGES - 1)
    assert time.perf_counter() - t0 < 0.05
    assert sum(split) == MAX_LAYERS and split[0] == split[-1] == 1 and max(split) == 2


def _sweep():
    """Catalog models x pipeline depths x schedules x batches, LoRA, and a split by hand."""
    for m in catalog.models():
        for pp in sorted({1, 2, 4, min(m.layers, 8), min(m.layers, 16)}):
            for sched, vpp in (("1f1b", None), ("gpipe", None), ("interleaved", 2), ("zb", None)):
                if sched != "1f1b" and pp < 2:
                    continue
                for gbs in (None, 64 * pp):
                    kw = dict(model=m.name, gpus=8 * pp, tp=8, pp=pp, schedule=sched, vpp=vpp, gbs=gbs)
                    if m.heads % 8 or m.ffn % 8:
                        kw.update(tp=1, gpus=pp)
                    yield kw
    yield dict(model="llama-3-8b", gpus=4, pp=4, stage_layers="6,9,9,8", gbs=64)
    yield dict(model="llama-3-8b", gpus=8, pp=8, stage_layers="1,2,3,4,5,6,5,6")
    yield dict(model="llama-3-8b", gpus=4, pp=4, finetune="lora", gbs=32)
    yield dict(model="llama-3-70b", gpus=8, pp=4, tp=2, finetune="qlora")
    yield dict(model="deepseek-v3", gpu="H800", gpus=256, pp=16, ep=16, zero=1, gbs=512)
    yield dict(model="mixtral-8x7b", gpus=16, pp=4, ep=4, schedule="zb", gbs=64)
    yield dict(model="deepseek-v3", gpu="H800", gpus=256, pp=16, ep=16, zero=1, gbs=512, schedule="dualpipe")
    yield dict(model="llama-3-8b", gpus=8, pp=8, gbs=64, schedule="dualpipe")
    yield dict(model="llama-3-70b", gpus=32, tp=4, pp=8, schedule="interleaved", vpp=2, pp_group=16, gbs=64)
    # every kind of term the memory line carries: recomputation, offloading, FP8 caches, eager
    # attention with dropout, ZeRO-3 under FSDP, fused loss, partial recomputation
    yield dict(model="llama-3-8b", gpus=8, recompute="full", zero=3, framework="fsdp", gbs=64)
    yield dict(model="llama-3-8b", gpus=8, pp=2, recompute="full", recompute_layers=3, gbs=64)
    yield dict(model="llama-3-8b", gpus=8, zero=3, offload_optimizer=True, offload_params=True, gbs=32)
    yield dict(model="deepseek-v3", gpu="H800", gpus=256, pp=16, ep=16, zero=1, gbs=512, precision="fp8",
               fp8_cache="attn_out,moe_act_input", recompute="selective", recompute_modules="mla_up_proj,moe_act")
    yield dict(model="gpt2-xl", gpu="V100", gpus=4, precision="fp16", attention="eager", dropout=0.1, gbs=64)
    yield dict(model="llama-3-8b", gpu="RTX-4090", gpus=1, finetune="qlora", recompute="full", fused_loss=True)


def _assert_same(got, want, where):
    """Equal figures of equal shapes, down to nested dicts (the plan's memory computed alongside
    its micro-batch line is the plan's memory)."""
    if isinstance(want, dict):
        assert got.keys() == want.keys(), where
        for k in want:
            _assert_same(got[k], want[k], (where, k))
        return
    assert np.shape(got) == np.shape(want), where
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=0, err_msg=str(where))


def test_max_micro_batch_unchanged_on_a_sweep():
    """The largest micro-batch evaluated on the stages that can hold the peak (in blocks) equals
    the one from every stage at once, on every layout of the sweep that resolves."""
    checked = nonzero = 0
    for kw in _sweep():
        try:
            layout = resolve(make_plan(**kw))
        except PlanError:
            continue
        want = _old_max_micro_batch(layout)
        memory, line = estimate_memory_and_line(layout)
        assert max_micro_batch(layout) == want, kw
        assert max_micro_batch(layout, line=line) == want, kw
        _assert_same(memory, estimate_memory(layout), kw)
        checked += 1
        nonzero += want > 0
    assert checked > 150 and nonzero > 100


def test_peak_candidates_of_an_even_split():
    """Stage 0, the first of the middle stages of each depth, and the last: four for Llama 3
    405B's 7 + 14 x 8 + 7, three for an even split, one without pipelining."""
    lay = resolve(make_plan(model="llama-3.1-405b", gpus=128, tp=8, pp=16))
    assert peak_candidate_stages(lay).tolist() == [0, 1, 15]
    lay = resolve(make_plan(model="llama-3-8b", gpus=4, pp=4, stage_layers="6,9,8,9"))
    assert peak_candidate_stages(lay).tolist() == [0, 1, 2, 3]
    assert peak_candidate_stages(resolve(make_plan(model="llama-3-8b", gpus=8, pp=8))).tolist() == [0, 1, 7]
    assert peak_candidate_stages(resolve(make_plan(model="llama-3-8b", gpus=1))).tolist() == [0]


# ---- refusals by name, and the largest accepted plan in bounded time and memory ----
def test_a_model_deeper_than_the_limit_is_refused_by_name():
    with pytest.raises(PlanError) as err:
        make_plan(hf_config=_llama(20_000), gpus=20_000, pp=20_000)
    assert err.value.field == "pp" and f"at most {MAX_STAGES:,} pipeline stages" in err.value.rule
    with pytest.raises(PlanError) as err:
        resolve(make_plan(hf_config=_llama(20_000), gpus=8))
    assert err.value.field == "hf_config.num_hidden_layers" and f"at most {MAX_LAYERS:,} layers" in err.value.rule


def test_the_deepest_plan_accepted_runs_in_bounded_time_and_memory():
    """4,096 layers on 4,096 stages, the largest plan the limits accept: the whole JSON report
    (every stage's memory and time, the largest micro-batch) in well under a second and without
    the pp x 4,096 arrays (which took 12.5 GB at 20,000 stages)."""
    from trainplan.report import evaluate, to_json

    plan = make_plan(hf_config=_llama(MAX_LAYERS), gpus=MAX_STAGES, pp=MAX_STAGES)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    data = to_json(evaluate(plan))
    assert time.perf_counter() - t0 < 5  # measured 0.3 s on one core
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024
    assert grown_mib < 400  # measured (a fresh process): 120 MiB peak in all
    assert len(data["memory"]["stages"]) == MAX_STAGES and data["parallel"]["stage_layers"] == [1] * MAX_STAGES


# ---- searches: refused while listing, or stopped by their deadline ----
def _deepest_moe_search(**kw):
    """DeepSeek-V3's config.json at the deepest depth planned, on 720,720 GPUs (2^4 x 3^2 x 5 x 7 x
    11 x 13: 240 divisors) in one scale-up domain, with a batch many data-parallel sizes divide:
    1,303,056 layouts, the most we could make a search list (1.3 s, 450 MB)."""
    cfg = {**json.loads((HF / "deepseek-v3.json").read_text()), "num_hidden_layers": MAX_LAYERS}
    return make_plan(hf_config=cfg, gpus=720_720, gbs=720_720 * 64, gpus_per_node=720_720,
                     gpu_mtbf_hours=1e9, **kw)


def test_a_search_past_the_layout_limit_is_refused_while_listing():
    """Refused by the web's layout limit within a second or two, before all layouts are listed."""
    from trainplan.search import search

    t0 = time.perf_counter()
    with pytest.raises(PlanError) as err:
        search(_deepest_moe_search(), set(), top=1, max_layouts=200_000, max_seconds=5.0)
    # (wall time, with room for a loaded machine: listing them all took tens of seconds)
    assert time.perf_counter() - t0 < 10
    assert err.value.field == "search" and "more than 200,000 layouts" in err.value.rule


def test_a_search_stops_by_its_deadline_with_the_best_so_far():
    from trainplan.search import search

    t0 = time.perf_counter()
    # 0.3 s: well short of the whole search (1.7 s warm on the development machine, which ran a
    # 1 s deadline out), well past its listing (about 0.5 s)
    out = search(_deepest_moe_search(), set(), top=1, max_seconds=0.3)
    assert time.perf_counter() - t0 < 10  # a deadline ignored while listing took 24.5 s
    # (of the 1,344,312 layouts the whole search evaluates)
    assert out["interrupted"] and 0 < out["evaluated"] < 1_344_312 and len(out["best"]) == 1


def test_a_web_search_of_100000_layers_is_refused_by_name():
    client = _web_client()
    t0 = time.perf_counter()
    res = client.post("/api/search", json={"hf_config": _llama(100_000), "gpus": 720_720})
    assert time.perf_counter() - t0 < 10  # it ran past a 60 s timeout before the layer limit
    assert res.status_code == 422 and res.json()["field"] == "hf_config.num_hidden_layers"
    res = client.post("/api/plan", json={"hf_config": _llama(20_000), "gpus": 20_000, "pp": 20_000})
    assert res.status_code == 422 and res.json()["field"] == "pp"


def test_the_deepest_web_plan_answers_without_a_timeline():
    """The page asks every plan for its timeline, an event simulation of ops x stages steps (it
    took minutes at 4,096 stages): within MAX_TIMELINE_STEPS, 16 micro-batches on 128 stages;
    past them, the plan without one."""
    client = _web_client()
    t0 = time.perf_counter()
    res = client.post("/api/plan", json={"hf_config": _llama(MAX_LAYERS), "gpus": MAX_STAGES, "pp": MAX_STAGES,
                                         "timeline": True})
    assert time.perf_counter() - t0 < 5
    assert res.status_code == 200 and res.json()["timeline"] is None
    res = client.post("/api/plan", json={"hf_config": _llama(128), "gpus": 128, "pp": 128, "gbs": 2048,
                                         "timeline": True})
    timeline = res.json()["timeline"]
    assert timeline["micro_batches"] == 16 and {op[0] for op in timeline["ops"]} == set(range(128))
    assert len(timeline["ops"]) == 2 * 16 * 128  # a forward and a backward of each micro-batch on each stage


def test_an_interleaved_timeline_simulates_whole_groups_of_stages():
    """Interleaved 1F1B takes micro-batches pp at a time: the first 16 of 24 on 12 stages
    deadlocked the simulation (HTTP 500); one whole group of 12 is drawn instead."""
    res = _web_client().post("/api/plan", json={"model": "qwen3-30b-a3b", "gpus": 12, "pp": 12,
                                                "schedule": "interleaved", "vpp": 2, "gbs": 24, "timeline": True})
    assert res.status_code == 200 and res.json()["timeline"]["micro_batches"] == 12


def test_the_drawn_timeline_keeps_to_its_steps():
    """16 micro-batches on 128 stages are 2^19 steps, the limit; 256 stages take 4, 512 one, and
    past 512 the CLI refuses by name."""
    from trainplan.limits import MAX_TIMELINE_STEPS
    from trainplan.report import evaluate
    from trainplan.timeline import draw_timeline, drawn_micro_batches

    assert 2 * 16 * 128 * 128 == MAX_TIMELINE_STEPS
    for pp, m in ((128, 16), (256, 4), (512, 1), (513, None)):
        layout = resolve(make_plan(hf_config=_llama(1024), gpus=pp, pp=pp, gbs=64 * pp))
        assert drawn_micro_batches(layout, 64) == m
    # DualPipe needs 2 x pp micro-batches, each some five steps a stage: DeepSeek-V3's 16 stages
    # are drawn (32 micro-batches), 64 are not
    for pp, m in ((16, 32), (64, None)):
        layout = resolve(make_plan(hf_config=_llama(1024), gpus=pp, pp=pp, gbs=4 * pp, schedule="dualpipe"))
        assert drawn_micro_batches(layout, 16) == m
    with pytest.raises(PlanError, match="timeline: a simulation of 1024 pipeline stages is not drawn"):
        draw_timeline(evaluate(make_plan(hf_config=_llama(1024), gpus=1024, pp=1024)), "never-written.png")


def test_listing_in_blocks_keeps_the_order_and_the_layouts(monkeypatch):
    """Blocks of a few (tp, pp, cp, ep) combinations list the same layouts in the same order as
    one block of all of them."""
    import trainplan.search as S
    from trainplan.plan import load_model

    plan = make_plan(model="mixtral-8x7b", gpus=64, gbs=256)
    model = load_model(plan)
    space = S.default_space(plan, set(), 64, model.layers, 8, model.is_moe)
    whole = S.enumerate_layouts(plan, space, 64)
    monkeypatch.setattr(S.space, "ENUM_BLOCK_LAYOUTS", 3 * 960)  # 3 combinations x 10 mbs x 3 x 4 x 8 a block
    blocks = S.enumerate_layouts(plan, space, 64)
    assert len(whole["tp"]) > 1000
    for k in S.LAYOUT_KEYS:
        np.testing.assert_array_equal(blocks[k], whole[k], err_msg=k)
    with pytest.raises(PlanError, match="more than 100 layouts"):
        S.enumerate_layouts(plan, space, 64, max_layouts=100)


def test_a_comparison_stops_by_its_total_deadline():
    """Each accelerator's search gets what is left of the comparison's time: none runs past it
    by more than one evaluated batch. 0.3 s is less than one search of these 1,344,312 layouts
    takes (0.7-1.5 s here), so the first is cut short and the others are not run, however fast
    the machine. (At 1.5 s a fast, warm machine searched all three in time.)"""
    from trainplan.search import accelerator_plans, compare_gpus

    options = _deepest_moe_search().model_dump(exclude_unset=True)
    plans = accelerator_plans({k: v for k, v in options.items() if k != "gpu"}, "H100-SXM,H200,B200")
    t0 = time.perf_counter()
    out = compare_gpus(plans, set(), max_seconds=5.0, total_seconds=0.3)
    assert time.perf_counter() - t0 < 6
    searched = [r for r in out["rows"] if not r["reason"]]
    assert len(searched) == 1 and 0 < searched[0]["evaluated"] < 1_344_312
    assert all("not searched: the comparison ran past its 0.3 s" in r["reason"] for r in out["rows"] if r["reason"])


def test_a_search_without_a_limit_of_its_own_keeps_the_core_one(monkeypatch):
    """The CLI passes no layout limit: MAX_SEARCH_LAYOUTS (10 M, a hundred times the largest
    real search) bounds it; here lowered to show it applies."""
    import trainplan.search as S

    assert S.MAX_SEARCH_LAYOUTS == MAX_SEARCH_LAYOUTS == 10_000_000
    monkeypatch.setattr(S, "MAX_SEARCH_LAYOUTS", 1000)
    with pytest.raises(PlanError, match="more than 1,000 layouts"):
        S.search(make_plan(model="llama-3-70b", gpus=64, gbs=256), set())


def test_the_default_search_batch_divides_among_gpus_that_are_not_a_power_of_two():
    """4M tokens of 4,096-token sequences are 1,024 sequences: 24 GPUs times 32; on 3,375 GPUs
    (3^3 x 5^3) no power of two gives a whole number near 1,024 (843.75), so no layout was found:
    its divisor nearest 1,024, 1,125, instead. Past 4,096 GPUs the batch is 1,024 tokens per GPU:
    4,096 sequences on 16,384 GPUs (Llama 3 405B's 16M tokens), 25,000 on 100,000."""
    from trainplan.search import search, search_batch

    assert search_batch(4096, 16384) == 4096 and search_batch(4096, 24) == 768
    assert search_batch(4096, 3375) == 1125 and search_batch(4096, 100_000) == 25_000
    out = search(make_plan(model="llama-3.1-405b", gpus=100_000), set(), top=1)
    assert out["gbs"] == 25_000 and 25_000 % (out["best"][0]["parallel"]["dp"] * out["best"][0]["parallel"]["mbs"]) == 0
