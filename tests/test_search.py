"""Layout search: bulk evaluation equals per-plan evaluation, constraints, ranking, CLI."""

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from trainplan.cli import app
from trainplan.errors import PlanError
from trainplan.plan import make_plan
from trainplan.report import evaluate
from trainplan.search import default_space, enumerate_layouts, evaluate_bulk, layout_plan, search


@pytest.mark.parametrize("kw", [
    dict(model="llama-3-70b", gpus=64, gbs=256),
    dict(model="mixtral-8x7b", gpus=32, gbs=128, framework="megatron"),
    dict(model="gpt2-xl", gpus=8, gpu="A100-80GB-SXM", attention="eager", seq_len=1024),
    dict(model="llama-3.1-405b", gpus=512, gbs=512),
])
def test_bulk_equals_scalar_on_random_layouts(kw):
    """DESIGN §2: the bulk search evaluation and `plan` agree exactly (peak memory, fit, step)."""
    plan = make_plan(**kw)
    from trainplan.plan import load_model

    model = load_model(plan)
    space = default_space(plan, set(), kw["gpus"], model.layers, 8, model.is_moe)
    lay = enumerate_layouts(plan, space, kw["gpus"])
    res = evaluate_bulk(plan, lay, kw["gpus"])
    rng = np.random.default_rng(1)
    for i in rng.choice(len(lay["tp"]), size=min(25, len(lay["tp"])), replace=False):
        one = evaluate(layout_plan(plan, lay, int(i), kw["gpus"]))
        assert one.peak == pytest.approx(res["peak_bytes"][i], rel=1e-12)
        assert one.fits == bool(res["fits"][i])
        assert one.time["step_s"] == pytest.approx(res["step_s"][i], rel=1e-12)


def test_enumeration_respects_plan_rules():
    plan = make_plan(model="llama-3-70b", gpus=64, gbs=256)
    space = default_space(plan, set(), 64, 80, 8, False)
    lay = enumerate_layouts(plan, space, 64)
    assert np.all(lay["tp"] * lay["pp"] * lay["cp"] * lay["dp"] == 64)
    assert np.all(64 % lay["tp"] == 0) and np.all(lay["tp"] <= 8)
    assert np.all(256 % (lay["dp"] * lay["mbs"]) == 0)
    inter = lay["schedule"] == 2
    assert np.all(lay["vpp"][~inter] == 1) and np.all(lay["vpp"][inter] >= 2)
    # every enumerated layout passes the plan's own validation
    rng = np.random.default_rng(0)
    for i in rng.choice(len(lay["tp"]), 30, replace=False):
        evaluate(layout_plan(plan, lay, int(i), 64))


def test_search_keeps_fixed_dimensions_and_ranks():
    plan = make_plan(model="llama-3-70b", gpus=64, gbs=256, tp=8)
    out = search(plan, fixed={"tp"}, top=5)
    assert out["evaluated"] > out["feasible"] > 0
    best = out["best"]
    assert all(b["parallel"]["tp"] == 8 for b in best)
    assert all(b["memory"]["fits"] for b in best)
    tps = [b["time"]["tokens_per_s"] for b in best]
    assert tps == sorted(tps, reverse=True)


def test_search_reports_broken_fixed_value():
    with pytest.raises(PlanError) as e:
        search(make_plan(model="llama-3-70b", gpus=64, tp=3), fixed={"tp"})
    assert e.value.field == "gpus"


def test_search_cli_json():
    res = CliRunner().invoke(app, ["search", "--model", "llama-3-8b", "--gpus", "16", "--gbs", "64", "--pp", "1",
                                   "--top", "3", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert set(data) >= {"evaluated", "feasible", "seconds", "best"}
    assert len(data["best"]) == 3 and all(b["parallel"]["pp"] == 1 for b in data["best"])
    assert set(data["best"][0]) >= {"model", "parallel", "memory", "time", "training"}
