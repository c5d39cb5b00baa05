"""Every pipeline schedule a search can list, under the frameworks that run it: each listed
layout is one `plan` accepts, and its bulk figures are `plan`'s, including the schedules that
place a rank's stages other than one after another (DeepSeek's DualPipe: two copies of the
model, rank r holding stages r and p - 1 - r; torch's V-shaped zbv and dualpipev: rank i
holding stages i and 2p - 1 - i, the head on rank 0)."""

import numpy as np
import pytest

from trainplan.errors import PlanError
from trainplan.estimate import activations as act
from trainplan.estimate.pipeline import SCHEDULES
from trainplan.plan import load_model, make_plan, resolve
from trainplan.report import evaluate, to_json
from trainplan.search import default_space, enumerate_layouts, evaluate_bulk, search

# a dense model; a mixture of experts whose expert parallelism the search sets; DeepSeek-V3,
# whose three dense layers make the first stage of one copy lighter than the last of the other
MODELS = {
    "dense": dict(model="llama-3-8b", gpus=32, gbs=128),
    "moe": dict(model="mixtral-8x7b", gpus=32, gbs=128),
    "deepseek": dict(model="deepseek-v3", gpus=256, gbs=512),
    # interleaving with 8 contiguous micro-batches per virtual stage (--pp-group)
    "grouped": dict(model="llama-3-8b", gpus=32, gbs=256, pp_group=8),
}
MEGATRON = ("gpipe", "1f1b", "interleaved", "zb", "dualpipe")
TORCH = ("gpipe", "1f1b", "interleaved", "zb", "looped_bfs", "zbv", "dualpipev")
CASES = [(fw, s, m) for fw, names in (("megatron", MEGATRON), ("torch", TORCH)) for s in names for m in ("dense", "moe")]
CASES += [("megatron", "dualpipe", "deepseek"), ("megatron", "interleaved", "grouped"), ("torch", "interleaved", "grouped")]


def _listing(framework: str, schedule: str, kind: str):
    kw = dict(MODELS[kind], framework=framework, schedule=schedule)
    plan = make_plan(**kw)
    model = load_model(plan)
    space = default_space(plan, {"schedule"}, kw["gpus"], model.layers, 8, model.is_moe)
    return kw, plan, model, enumerate_layouts(plan, space, kw["gpus"], model)


def _layout_kwargs(kw: dict, lay: dict, i: int) -> dict:
    """The i-th layout as make_plan's arguments (sequence parallelism with TP, as a search uses it)."""
    v = int(lay["vpp"][i])
    return {**kw, "tp": int(lay["tp"][i]), "pp": int(lay["pp"][i]), "cp": int(lay["cp"][i]),
            "ep": int(lay["ep"][i]), "zero": int(lay["zero"][i]), "mbs": int(lay["mbs"][i]),
            "gbs": int(lay["gbs"][i]), "recompute": act.RECOMPUTE[int(lay["recompute"][i])],
            "schedule": SCHEDULES[int(lay["schedule"][i])], "vpp": v if v > 1 else None,
            "sp": int(lay["tp"][i]) > 1}


def _sample(lay: dict, rng, per_case: int = 12) -> list[int]:
    """Layouts of every listed (pp, vpp) pair, then of every expert-parallel size, then at random."""
    n = len(lay["tp"])
    picked: list[int] = []
    for key in (lay["pp"] * 1000 + lay["vpp"], lay["ep"]):
        for value in np.unique(key):
            if len(picked) < per_case:
                picked.append(int(rng.choice(np.flatnonzero(key == value))))
    picked += rng.choice(n, min(n, max(0, per_case - len(picked))), replace=False).tolist()
    return sorted(set(picked))


@pytest.mark.parametrize(("framework", "schedule", "kind"), CASES)
def test_every_listed_layout_is_a_plan(framework, schedule, kind):
    """`resolve` accepts one listed layout of each distinct depth, virtual stages and
    micro-batches per step (what the schedules' rules read)."""
    kw, plan, model, lay = _listing(framework, schedule, kind)
    assert len(lay["tp"]) > 0
    key = (lay["pp"] * 1000 + lay["vpp"]) * 100_000 + lay["m"]
    for i in np.unique(key, return_index=True)[1]:
        try:
            resolve(make_plan(**_layout_kwargs(kw, lay, int(i))), model)
        except PlanError as err:
            pytest.fail(f"listed layout {_layout_kwargs(kw, lay, int(i))} refused: {err}")


@pytest.mark.parametrize(("framework", "schedule", "kind"), CASES)
def test_bulk_figures_are_plans(framework, schedule, kind):
    """A sample of listed layouts over depths, virtual stages and expert-parallel sizes has the
    figures of `plan --json` for the same layout, to 1e-9 relative: peak memory per GPU, fit,
    step time, tokens per second, MFU."""
    kw, plan, model, lay = _listing(framework, schedule, kind)
    res = evaluate_bulk(plan, lay, kw["gpus"], model)
    for i in _sample(lay, np.random.default_rng(7)):
        args = _layout_kwargs(kw, lay, i)
        one = to_json(evaluate(make_plan(**args), spec=model))
        got = {"peak_bytes": res["peak_bytes"][i], "step_s": res["step_s"][i], "tokens_per_s": res["tokens_per_s"][i],
               "mfu": res["mfu"][i]}
        want = {"peak_bytes": one["memory"]["peak_bytes"], "step_s": one["time"]["step_s"],
                "tokens_per_s": one["time"]["tokens_per_s"], "mfu": one["time"]["mfu"]}
        assert got == pytest.approx(want, rel=1e-12), args
        assert bool(res["fits"][i]) == one["memory"]["fits"], args


def test_listings_keep_to_each_schedules_depths():
    """DualPipe runs on an even pipeline of two stages or more, torch's looped and V-shaped
    schedules on two or more, with their virtual stages: the listings hold exactly those."""
    for framework, schedule, kind in CASES:
        lay = _listing(framework, schedule, kind)[3]
        pp, vpp = lay["pp"], lay["vpp"]
        if schedule == "dualpipe":
            assert np.all(pp % 2 == 0) and set(vpp.tolist()) == {1}, (framework, kind)
        if schedule in ("interleaved", "looped_bfs"):
            assert pp.min() >= 2 and vpp.min() >= 2, (framework, schedule, kind)
        if framework == "torch" and schedule in ("zbv", "dualpipev"):
            assert pp.min() >= 2 and set(vpp.tolist()) == {2}, kind
        if framework == "torch" and schedule == "zb":  # torch's ZB1P on one stage, or interleaved
            assert pp.min() >= 2 and 1 in vpp and vpp.max() >= 2, kind


def test_dualpipe_search_on_deepseek_v3():
    """`search --schedule dualpipe`, DeepSeek-V3 on 1,024 H100s (it listed pp = 1 and odd pp,
    which `plan` refuses, and failed): ranked plans, each DualPipe on an even pipeline, the
    best one's step time that of `plan` for its layout."""
    plan = make_plan(model="deepseek-v3", gpus=1024, schedule="dualpipe")
    out = search(plan, {"schedule"}, top=3)
    assert out["feasible"] > 0 and len(out["best"]) == 3
    for best in out["best"]:
        par = best["parallel"]
        assert par["schedule"] == "dualpipe" and par["pp"] % 2 == 0 and best["memory"]["fits"]
    par = out["best"][0]["parallel"]
    one = to_json(evaluate(make_plan(model="deepseek-v3", gpus=1024, **{k: par[k] for k in (
        "tp", "pp", "cp", "ep", "zero", "mbs", "gbs", "recompute", "schedule", "sp")})))
    assert out["best"][0]["time"]["step_s"] == pytest.approx(one["time"]["step_s"], rel=1e-12)


def test_a_schedule_no_depth_runs_is_refused_by_its_rule():
    """DeepSeek-V3's 61 layers split over no pipeline of 256 GPUs into torch's two V-shaped
    virtual stages per rank (every split of 61 has an odd stage; with the end stages a layer
    lighter 63 layers' worth, odd too): the search names that rule, not the plan's own depth's
    (pp 1); a broken rule every depth shares is given as it is."""
    plan = make_plan(model="deepseek-v3", gpus=256, framework="torch", schedule="zbv")
    with pytest.raises(PlanError) as err:
        search(plan, {"schedule"}, top=1)
    assert err.value.field == "vpp" and "runs on none of the pipeline depths" in err.value.rule
    assert "[31, 30] divisible by 2" in err.value.rule
    with pytest.raises(PlanError) as err:
        search(make_plan(model="llama-3-8b", gpus=8, schedule="zbv"), {"schedule"}, top=1)
    assert err.value.field == "schedule" and "use --framework torch" in err.value.rule
    # a global batch too small for every depth DualPipe runs on: the batch's rule on one of them
    with pytest.raises(PlanError) as err:
        search(make_plan(model="llama-3-8b", gpus=8, gbs=2, schedule="dualpipe"), {"schedule", "gbs"}, top=1)
    assert err.value.field == "gbs"


def test_dualpipe_is_not_a_torch_pipelining_schedule():
    """torch.distributed.pipelining has DualPipeV but no two-copy DualPipe: `plan` refuses it
    by name under the torch framework (its memory was NaN), and the search never lists it."""
    with pytest.raises(PlanError) as err:
        resolve(make_plan(model="llama-3-8b", gpus=32, pp=4, gbs=128, framework="torch", schedule="dualpipe"))
    assert err.value.field == "schedule" and "dualpipev" in err.value.rule
    with pytest.raises(PlanError) as err:
        search(make_plan(model="llama-3-8b", gpus=32, gbs=128, framework="torch", schedule="dualpipe"), {"schedule"})
    assert err.value.field == "schedule"
