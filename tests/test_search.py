"""Layout search: bulk evaluation equals per-plan evaluation, constraints, ranking, CLI."""

import itertools
import json

import numpy as np
import pytest
from typer.testing import CliRunner

from trainplan.cli import app
from trainplan.errors import PlanError
from trainplan.plan import make_plan, resolve
from trainplan.report import evaluate
from trainplan.search import (
    default_space,
    enumerate_layouts,
    evaluate_bulk,
    layout_plan,
    search,
    search_batch,
)


@pytest.mark.parametrize("kw", [
    dict(model="llama-3-70b", gpus=64, gbs=256),
    dict(model="mixtral-8x7b", gpus=32, gbs=128, framework="megatron"),
    dict(model="gpt2-xl", gpus=8, gpu="A100-80GB-SXM", attention="eager", seq_len=1024),
    dict(model="llama-3.1-405b", gpus=512, gbs=512),
    dict(model="llama-3-8b", gpus=64, gbs=64, seq_len=32768, gpu="A100-80GB-SXM", attention="triton",
         fused_loss=True, cp_comm="allgather", framework="fsdp", reduce_dtype="bf16",
         backward_prefetch="post"),
    dict(model="llama-3-70b", gpus=128, gbs=256, framework="fsdp", dp_shard=4),  # hybrid sharding
    dict(model="llama-3-8b", gpus=16, gbs=64, finetune="lora", lora_rank=64),  # frozen base, adapters
    dict(model="llama-3-70b", gpus=32, gbs=64, offload_optimizer=True, offload_params=True, zero=3,
         host_gbs=300),  # the optimizer on the host, the parameters fetched from it
    dict(model="mixtral-8x7b", gpus=16, gbs=32, finetune="qlora", framework="fsdp"),  # 4-bit experts dequantized
    dict(model="llama-3-8b", gpus=32, gbs=128, gpu="RTX-4090", nic_gbps=100, scale_up_gbs=32),  # the plan's links
    # three dense layers, then MoE: stages of equal depth and unequal weight (the peak once lay
    # on a stage the search did not evaluate, and it ranked layouts 89 GiB over the GPU)
    dict(model="deepseek-v3", gpus=256, gbs=512),
    # DeepSeek-V3's memory recipe (§3.2.3, §3.3.3): the attention output and the experts' SwiGLU
    # input kept in low precision, the norms, MLA up-projections and SwiGLU recomputed (no
    # core_attn: saved as without recomputation)
    dict(model="deepseek-v3", gpus=256, gbs=512, precision="fp8", fp8_cache="attn_out,moe_act_input",
         recompute="selective", recompute_modules="layernorm,mla_up_proj,moe_act", framework="megatron"),
    dict(model="llama-3-8b", gpus=16, gbs=64, recompute="selective", recompute_modules="core_attn,layernorm",
         framework="megatron"),
    dict(model="mixtral-8x7b", gpus=32, gbs=64, precision="fp8", fp8_cache="attn_out,moe_act_input"),
])
def test_bulk_equals_scalar_on_random_layouts(kw):
    """DESIGN §2: the bulk search evaluation and `plan` agree exactly (peak memory, fit, step)."""
    _assert_bulk_equals_scalar(kw, layouts=25)


def _assert_bulk_equals_scalar(kw: dict, layouts: int) -> None:
    """Peak memory, fit and step of `layouts` layouts drawn from the search's space for `kw`, in
    bulk and one by one as `plan` evaluates them: equal to 1e-12."""
    plan = make_plan(**kw)
    from trainplan.plan import load_model

    model = load_model(plan)
    space = default_space(plan, set(), kw["gpus"], model.layers, 8, model.is_moe)
    lay = enumerate_layouts(plan, space, kw["gpus"])
    res = evaluate_bulk(plan, lay, kw["gpus"])
    rng = np.random.default_rng(1)
    chosen = rng.choice(len(lay["tp"]), size=min(layouts, len(lay["tp"])), replace=False)
    assert len(chosen) >= min(layouts, 10)
    for i in chosen:
        one = evaluate(layout_plan(plan, lay, int(i), kw["gpus"]))
        assert one.peak == pytest.approx(res["peak_bytes"][i], rel=1e-12)
        assert one.fits == bool(res["fits"][i])
        assert one.time["step_s"] == pytest.approx(res["step_s"][i], rel=1e-12)


# every plan option beside the layout, each changed from its default on its own
DENSE_OPTIONS = [
    dict(fused_kernels=True), dict(fused_kernels=False, framework="megatron"),
    dict(tp_backward_overlap=False, framework="megatron"), dict(recompute_early_stop=True), dict(grad_dtype="fp32"),
    dict(grad_dtype="bf16", framework="megatron"), dict(master_weights=False), dict(optimizer_state_dtype="bf16"),
    dict(reduce_dtype="fp32"), dict(reduce_dtype="bf16", framework="fsdp"), dict(optimizer="sgd"),
    dict(optimizer="adafactor"), dict(optimizer_impl="for-loop"), dict(optimizer_impl="foreach"), dict(grad_clip=0.0),
    dict(offload_optimizer=True, framework="deepspeed", host_gbs=20, h2d_gbs=5), dict(attention="sdpa"),
    dict(attention="eager"), dict(attention="triton"), dict(attention="cudnn"), dict(precision="fp8"),
    dict(precision="fp8", fp8_params=True), dict(precision="fp8", fp8_cache="attn_out"), dict(precision="fp16"),
    dict(precision="fp32"), dict(fused_loss=True), dict(dropout=0.1), dict(framework="fsdp1"), dict(framework="torch"),
    dict(finetune="lora", lora_rank=64, lora_targets="q,v", lora_dropout=0.05), dict(finetune="qlora", qlora_bits=8),
    dict(overlap_tp=True), dict(overlap_dp=False), dict(backward_prefetch="post", framework="fsdp"),
    dict(backward_prefetch="none", framework="fsdp"), dict(cp_comm="allgather"), dict(sharp=True),
    dict(scale_up_gbs=100), dict(nic_gbps=100), dict(gpus_per_node=4), dict(data_workers=1, tokenize_rate=1e5),
    dict(storage_gbs=0.01), dict(prefetch=False, tokenize_rate=1e5), dict(overhead_gib=5), dict(fragmentation=0.2),
    dict(dp_shard=2, framework="fsdp"), dict(seq_len=8192),
]
MOE_OPTIONS = [dict(ep_node_limit=1), dict(ep_overlap=True), dict(precision="fp8", fp8_cache="moe_act_input"),
               dict(fused_kernels=True, framework="megatron")]


@pytest.mark.parametrize("kw", [dict(model="llama-3-8b", gpus=16, gbs=64, **o) for o in DENSE_OPTIONS]
                         + [dict(model="mixtral-8x7b", gpus=32, gbs=64, seq_len=4096, **o) for o in MOE_OPTIONS],
                         ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items() if k not in ("model", "gpus", "gbs")))
def test_every_plan_option_is_priced_alike_by_search_and_plan(kw):
    """Each plan option beside the layout changes search's figures as it changes plan's (a
    search that ignored one ranked layouts by other figures than `plan` reports for them)."""
    _assert_bulk_equals_scalar(kw, layouts=12)


def test_search_keeps_the_recompute_modules_and_their_rule():
    """`search --recompute selective --recompute-modules ...` searches selective recomputation of
    those modules (its best layout reported as `plan` prices it); without --recompute selective
    the modules are refused by plan's own rule, by name."""
    runner = CliRunner()
    args = ["search", "--model", "llama-3-8b", "--gpus", "16", "--gbs", "64", "--framework", "megatron",
            "--recompute-modules", "layernorm", "--top", "1", "--json"]
    res = runner.invoke(app, [*args, "--recompute", "selective"])
    assert res.exit_code == 0, res.output
    best = json.loads(res.stdout)["best"][0]
    assert best["parallel"]["recompute"] == "selective" and best["parallel"]["recompute_modules"] == ["layernorm"]
    res = runner.invoke(app, args)
    assert res.exit_code == 2
    assert "recompute_modules: applies to --recompute selective only" in res.output


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


def test_search_ranks_only_layouts_that_fit_on_a_partly_dense_moe():
    """DeepSeek-V3 (3 dense layers, then 58 MoE) on 256 H100s: every layout the search ranks
    fits when planned on its own."""
    out = search(make_plan(model="deepseek-v3", gpus=256), set(), top=5)
    assert all(b["memory"]["fits"] and b["memory"]["headroom_bytes"] >= 0 for b in out["best"])


def test_cost_ranks_layouts_as_time_does_on_one_accelerator():
    """On a fixed GPU count at one price, dollars per token are GPU-hours per token times the
    price: the cheapest layout is the fastest, priced or not (GB200 has no catalog price; the
    cost objective once ranked its layouts in enumeration order, a slower one first)."""
    for gpu in ("H100-SXM", "GB200"):
        kw = dict(model="llama-3-8b", gpus=8, gbs=64, gpu=gpu)
        by = {o: [b["time"]["step_s"] for b in search(make_plan(**kw), set(), top=5, objective=o)["best"]]
              for o in ("time", "cost")}
        assert by["cost"] == by["time"] == sorted(by["time"])


def test_search_holds_every_layout_to_one_global_batch():
    """Without --gbs every layout trains the same batch: Llama 2's 4M tokens (Touvron et al.
    2023, Table 1), as the GPU count times a power of two so it divides among the data-parallel
    ranks: 1,024 x 4,096 on 8 or 64 GPUs, 768 on 24; past 4,096 GPUs 1,024 tokens per GPU, Llama 3
    405B's final 16M tokens of 8K sequences on 16K H100s (Dubey et al. 2024, §3.4.1: 2,048
    sequences). Ranking layouts at their own default batches favoured larger batches."""
    assert search_batch(4096, 8) * 4096 == 4_194_304 == search_batch(4096, 64) * 4096
    assert search_batch(4096, 24) == 768 and search_batch(4096, 1) == 1024
    assert search_batch(8192, 16384) * 8192 == 16 * 2**20 and search_batch(8192, 4096) * 8192 == 4 * 2**20
    # the batch grows past 4,096 GPUs: 8M tokens on 8,192
    assert search_batch(4096, 8192) * 4096 == 8 * 2**20 and search_batch(4096, 65536) * 4096 == 64 * 2**20
    out = search(make_plan(model="llama-3-8b", gpus=8), set(), top=5)
    assert out["gbs"] == 1024 and not out["gbs_given"]
    assert {b["parallel"]["gbs"] for b in out["best"]} == {1024}
    given = search(make_plan(model="llama-3-8b", gpus=8, gbs=64), set(), top=5)
    assert given["gbs"] == 64 and given["gbs_given"] and {b["parallel"]["gbs"] for b in given["best"]} == {64}
    text = CliRunner().invoke(app, ["search", "--model", "llama-3-8b", "--gpus", "8", "--top", "1"]).output
    assert "global batch 1,024 x 4,096 tokens (4.2M tokens, the default; --gbs sets it)" in text
    # a fixed micro-batch the default batch cannot divide among the ranks: the rule, by name
    with pytest.raises(PlanError) as e:
        search(make_plan(model="llama-3-8b", gpus=24, mbs=5), {"mbs"})
    assert e.value.field == "gbs" and "got 768 (the search's default global batch" in e.value.rule


def test_compare_gpus_ranks_each_accelerators_best_layout():
    """`search --compare-gpus`: the same training (model, batch, tokens) on each accelerator,
    its best layout found by the same search as on its own; ranked by tokens/s, or by the
    training's cost at each accelerator's catalog price; one that cannot be planned says why."""
    from trainplan.search import accelerator_plans, compare_gpus

    opts = dict(model="llama-3-8b", gpus=8, gbs=64)
    plans = accelerator_plans(opts, "h100,A100-80GB-SXM,MI300X,H100-SXM")  # aliases resolved, duplicates dropped
    assert [p.gpu for p in plans] == ["H100-SXM", "A100-80GB-SXM", "MI300X"]
    data = compare_gpus(plans, set())
    rows = {r["gpu"]: r for r in data["rows"]}
    for name in rows:  # each row is that accelerator's own search's best
        alone = search(make_plan(**opts, gpu=name), set(), top=1)["best"][0]
        assert rows[name]["best"]["time"]["step_s"] == alone["time"]["step_s"]
        assert rows[name]["best"]["parallel"]["gbs"] == 64
    speeds = [r["best"]["time"]["tokens_per_s"] for r in data["rows"]]
    assert speeds == sorted(speeds, reverse=True)
    by_cost = compare_gpus(plans, set(), objective="cost")["rows"]
    costs = [r["best"]["training"]["cost_usd"] for r in by_cost]
    assert costs == sorted(costs)
    # the cost is GPU-hours at the catalog price: H100-SXM $2.69, A100 $2.45, MI300X $1.78
    for r in by_cost:
        tr = r["best"]["training"]
        assert tr["cost_usd"] == pytest.approx(tr["gpu_hours"] * {"H100-SXM": 2.69, "A100-80GB-SXM": 2.45,
                                                                  "MI300X": 1.78}[r["gpu"]], rel=1e-9)
    # an accelerator the catalog gives no network for cannot span nodes: last, with the reason
    far = compare_gpus(accelerator_plans({**opts, "gpus": 16}, "H100-SXM,RTX-4090"), set())["rows"]
    assert far[0]["gpu"] == "H100-SXM" and far[1]["best"] is None and far[1]["reason"].startswith("nic_gbps:")


@pytest.mark.parametrize("args, field", [
    (["--compare-gpus", "H100-SXM,nope"], "compare_gpus"),
    (["--compare-gpus", "H100-SXM"], "compare_gpus"),
    (["--compare-gpus", "all,H100-SXM"], "compare_gpus"),
    (["--compare-gpus", " , "], "compare_gpus"),
    (["--compare-gpus", "H100-SXM,MI300X", "--gpu", "B200"], "compare_gpus"),
    (["--compare-gpus", "H100-SXM,MI300X", "--pareto"], "compare_gpus"),
    (["--compare-gpus", "H100-SXM,MI300X", "--export", "megatron"], "export"),
    (["--compare-gpus", "H100-SXM,MI300X", "--min-gpus"], "days"),
])
def test_compare_gpus_refuses_bad_input_by_name(args, field):
    res = CliRunner().invoke(app, ["search", "--model", "llama-3-8b", "--gpus", "8", *args])
    assert res.exit_code == 2 and res.output.startswith(f"error: {field}: ") and "Traceback" not in res.output


def test_compare_gpus_cli_table_and_deadline():
    res = CliRunner().invoke(app, ["search", "--model", "llama-3-8b", "--gbs", "64", "--compare-gpus",
                                   "H100-SXM,A100-80GB-SXM", "--min-gpus", "--days", "30"])
    assert res.exit_code == 0, res.output
    assert "the fewest GPUs of each that train within 30 days; ranked by fewest GPUs, then fewest days" in res.output
    data = json.loads(CliRunner().invoke(app, ["search", "--model", "llama-3-8b", "--gbs", "64", "--compare-gpus",
                                               "H100-SXM,A100-80GB-SXM", "--min-gpus", "--days", "30",
                                               "--json"]).output)
    for r in data["rows"]:  # each the fewest GPUs (doubling from a node) within the deadline
        assert r["best"]["training"]["days"] <= 30
        assert all(t["days"] is None or t["days"] > 30 for t in r["tried"][:-1])
    assert [r["best"]["gpu"]["gpus"] for r in data["rows"]] == sorted(r["best"]["gpu"]["gpus"] for r in data["rows"])


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
    # a search recomputes all of a stage's layers or none: a chosen number is refused by name
    res = CliRunner().invoke(app, ["search", "--model", "llama-3-8b", "--gpus", "8", "--recompute", "full",
                                   "--recompute-layers", "4"])
    assert res.exit_code == 2 and "recompute_layers" in res.output and "Traceback" not in res.output
    # nor does it take a hand-made stage split (it was silently ignored, interleaving included)
    res = CliRunner().invoke(app, ["search", "--model", "llama-3-8b", "--gpus", "8", "--pp", "2",
                                   "--stage-layers", "15,17"])
    assert res.exit_code == 2 and res.output.startswith("error: stage_layers: ")


def test_search_with_offloading_keeps_to_the_zero_stages_it_allows():
    """Parameter offload needs ZeRO-3 and DeepSpeed's optimizer offload a partitioned optimizer:
    a search with either flag ranks only such layouts (it used to stop on the rule instead)."""
    for flag, stages in (("offload_params", {3}), ("offload_optimizer", {1, 2, 3})):
        out = search(make_plan(model="llama-3-8b", gpus=8, **{flag: True}), set(), top=5)
        assert out["best"] and {b["parallel"]["zero"] for b in out["best"]} <= stages


def test_search_cli_uses_sequence_parallelism_as_the_api_does():
    """Searched layouts with TP use sequence parallelism unless the plan turns it off, from the
    command line as from Python and the web (the CLI's flag used to switch it off unasked)."""
    kw = dict(model="llama-3-70b", gpus=64, gbs=256, tp=8)
    api = search(make_plan(**kw), {"tp"}, top=1)["best"][0]
    args = ["search", "--model", "llama-3-70b", "--gpus", "64", "--gbs", "256", "--tp", "8", "--top", "1", "--json"]
    cli = json.loads(CliRunner().invoke(app, args).output)["best"][0]
    assert cli["parallel"]["sp"] and cli["time"]["step_s"] == api["time"]["step_s"]
    off = json.loads(CliRunner().invoke(app, [*args, "--no-sp"]).output)["best"][0]
    assert not off["parallel"]["sp"]
    assert not json.loads(CliRunner().invoke(app, ["plan", "--model", "llama-3-70b", "--gpus", "64", "--tp", "8",
                                                   "--json"]).output)["parallel"]["sp"]  # plan: off unless --sp


def test_search_cli_json():
    res = CliRunner().invoke(app, ["search", "--model", "llama-3-8b", "--gpus", "16", "--gbs", "64", "--pp", "1",
                                   "--top", "3", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert set(data) >= {"evaluated", "feasible", "seconds", "best"}
    assert len(data["best"]) == 3 and all(b["parallel"]["pp"] == 1 for b in data["best"])
    assert set(data["best"][0]) >= {"model", "parallel", "memory", "time", "training"}
    # the text table ends with the published error behind its predictions (H100: 94 runs)
    text = CliRunner().invoke(app, ["search", "--model", "llama-3-8b", "--gpus", "16", "--gbs", "64", "--top", "1"])
    assert text.exit_code == 0 and "accuracy: 94 published runs (9 fitted on) on H100-SXM" in text.output
    # one stage has no schedule to choose: the best three are three layouts, not one layout's
    # 1F1B, GPipe and ZB-H1; under hybrid sharding the ZeRO column names the shard group
    layouts = [tuple(b["parallel"][k] for k in ("tp", "pp", "dp", "cp", "zero", "mbs", "recompute"))
               for b in data["best"]]
    assert len(set(layouts)) == 3 and all(b["parallel"]["schedule"] == "1f1b" for b in data["best"])
    text = CliRunner().invoke(app, ["search", "--model", "llama-3-70b", "--gpus", "128", "--gbs", "256",
                                    "--framework", "fsdp", "--dp-shard", "16", "--top", "1"])
    assert text.exit_code == 0 and "3 (shard 16)" in text.output


def test_pareto_front_definition():
    from trainplan.search import pareto_front

    cost = np.array([3.0, 1.0, 2.0, 2.0, 4.0])
    benefit = np.array([5.0, 1.0, 4.0, 3.0, 5.0])
    assert list(pareto_front(cost, benefit)) == [1, 2, 0]


def test_pareto_front_of_layouts_is_non_dominated():
    from trainplan.search import pareto

    out = pareto(make_plan(model="llama-3-8b", gpus=8, gbs=64), set())
    assert (out["gbs"], out["gbs_given"]) == (64, True)
    mem = [p["peak_bytes"] for p in out["front"]]
    tps = [p["tokens_per_s"] for p in out["front"]]
    assert mem == sorted(mem) and tps == sorted(tps)
    all_mem, all_tps = np.array(out["all"]["peak_bytes"]), np.array(out["all"]["tokens_per_s"])
    for m, t in zip(mem, tps, strict=True):  # nothing fits in less memory and runs faster
        assert not np.any((all_mem < m) & (all_tps > t))


def test_max_model_per_strategy_8xA100():
    """Seed 000's question on 8 x A100 80GB. Model states alone allow about 5B (DDP, 16 B/param),
    14.5B (ZeRO-1, 5.5 B/param), 21B (ZeRO-2, 3.75) and 40B (ZeRO-3, 2) (ZeRO paper's
    formulas); with activations (full recompute, s = 2048) and buffers the planner's answers
    sit below those ceilings and keep their order."""
    from trainplan.search import max_model

    out = max_model(make_plan(gpu="A100-80GB-SXM", gpus=8, seq_len=2048, recompute="full"))
    params = {r["strategy"]: r["params"] for r in out["results"]}
    ceilings = {"DDP": 80 * 2**30 / 16, "ZeRO-1": 80 * 2**30 / 5.5, "ZeRO-2": 80 * 2**30 / 3.75,
                "ZeRO-3 / FSDP": 80 * 2**30 / 2}
    order = list(ceilings)
    assert [params[k] for k in order] == sorted(params[k] for k in order)
    for k, ceiling in ceilings.items():
        assert 0.6 * ceiling < params[k] < ceiling, k


def test_fsdp_searches_and_sizes_only_its_sharding_strategies():
    """FSDP offers ZeRO-0, 2 (SHARD_GRAD_OP) and 3 (FULL_SHARD), no ZeRO-1: the search space and
    the largest-model table leave ZeRO-1 out. Its ZeRO-2 holds fp32 shards (4/8 B), the bf16
    model gathered from forward to backward (2 B), sharded gradients and Adam state (12/8 B):
    4 B per parameter on 8 GPUs, a ceiling of 80 GiB / 4 = 21.5B parameters before
    activations."""
    from trainplan.plan import load_model
    from trainplan.search import max_model

    plan = make_plan(model="llama-3-8b", gpus=8, framework="fsdp")
    space = default_space(plan, set(), 8, load_model(plan).layers, 8, False)
    assert space.zero == [0, 2, 3]
    assert default_space(make_plan(model="llama-3-8b", gpus=8), set(), 8, 32, 8, False).zero == [0, 1, 2, 3]
    out = max_model(make_plan(gpu="A100-80GB-SXM", gpus=8, seq_len=2048, recompute="full", framework="fsdp"))
    params = {r["strategy"]: r["params"] for r in out["results"]}
    assert list(params) == ["DDP", "ZeRO-2", "ZeRO-3 / FSDP"]
    assert 0.6 * 80 * 2**30 / 4 < params["ZeRO-2"] < 80 * 2**30 / 4


def test_min_gpus_meets_the_deadline_with_the_fewest():
    from trainplan.search import min_gpus

    out = min_gpus(make_plan(model="llama-3-8b", gbs=512), set(), days=10)
    assert out["best"]["training"]["days"] <= 10
    smaller = [t for t in out["tried"] if t["gpus"] < out["gpus"]]
    assert smaller and all(t["days"] is None or t["days"] > 10 for t in smaller)
    with pytest.raises(PlanError):
        min_gpus(make_plan(model="llama-3-8b", gbs=512), set(), days=-1)
    # when no size can be planned at all, the rule that stops it (once "fastest: nan days")
    for kw, field in ((dict(gpu="RTX-4090"), "nic_gbps"), (dict(gpu="V100"), "precision")):
        with pytest.raises(PlanError) as e:
            min_gpus(make_plan(model="llama-3-70b", gbs=512, **kw), set(), days=30)
        assert e.value.field == field
    # a GB200 rack's 72 GPUs on NVLink: the doubling still starts at 8 GPUs
    rack = min_gpus(make_plan(model="llama-3-8b", gpu="GB200", gbs=512), set(), days=10)
    assert rack["tried"][0]["gpus"] == 8 and rack["best"]["gpu"]["gpus_per_node"] == 72
    with pytest.raises(PlanError) as e:  # plannable but too slow at every size: the fastest it gets
        min_gpus(make_plan(model="llama-3-8b", gbs=512), set(), days=0.01, max_gpus=64)
    assert e.value.field == "days" and "fastest:" in e.value.rule and "nan" not in e.value.rule


def test_interrupted_search_returns_best_so_far(monkeypatch):
    """Ctrl-C during the evaluation keeps what was evaluated and ranks it."""
    import trainplan.search as S

    calls = {"n": 0}
    real = S.evaluate_bulk

    def flaky(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(S, "CHUNK", 500)
    monkeypatch.setattr(S, "evaluate_bulk", flaky)
    out = S.search(make_plan(model="llama-3-8b", gpus=16, gbs=64), set(), top=2)
    assert out["interrupted"] and 0 < out["evaluated"] <= 500 and len(out["best"]) == 2


def test_batches_are_near_equal_and_cover_every_layout():
    from trainplan.search import CHUNK, batches

    for total in (1, CHUNK, CHUNK + 1, 68364):
        parts = batches(total)
        sizes = [p.stop - p.start for p in parts]
        assert parts[0].start == 0 and parts[-1].stop == total
        assert all(a.stop == b.start for a, b in itertools.pairwise(parts))
        assert max(sizes) <= CHUNK and max(sizes) - min(sizes) <= len(parts)


def test_search_times_only_layouts_that_fit():
    """`fitting_only` (how `search` evaluates) gives the same memory and fit for every layout
    and the same step time, bit for bit, for each layout that fits; the rest are never ranked."""
    from trainplan.plan import load_model

    plan = make_plan(model="llama-3-70b", gpus=64, gbs=256)
    model = load_model(plan)
    lay = enumerate_layouts(plan, default_space(plan, set(), 64, model.layers, 8, False), 64)
    full = evaluate_bulk(plan, lay, 64, model)
    pruned = evaluate_bulk(plan, lay, 64, model, fitting_only=True)
    fits = full["fits"]
    assert 0 < fits.sum() < len(fits)  # both kinds present: the comparison means something
    assert np.array_equal(full["peak_bytes"], pruned["peak_bytes"]) and np.array_equal(fits, pruned["fits"])
    assert np.array_equal(full["step_s"][fits], pruned["step_s"][fits])
    assert np.all(np.isinf(pruned["step_s"][~fits])) and np.all(pruned["tokens_per_s"][~fits] == 0)


def test_memory_slopes_in_micro_batches_in_flight_are_exact():
    """The search scales one memory evaluation per schedule group by the stage_memory slopes;
    they must equal the difference of two full evaluations (Llama-3-70B, 4 stages, 1F1B)."""
    from trainplan.estimate.memory import layout_inputs, numbers_for, stage_memory
    from trainplan.estimate.recipe import recipe
    from trainplan.plan import resolve

    layout = resolve(make_plan(model="llama-3-70b", gpus=64, tp=8, pp=4, gbs=256, recompute="selective"))
    args = dict(layout_inputs(layout))
    one = stage_memory(numbers_for(layout), recipe(layout.plan), **{**args, "in_flight_mb": 1.0,
                                                                      "logits_in_flight": 1.0, "head_in_flight": 1.0})
    more = stage_memory(numbers_for(layout), recipe(layout.plan), **{**args, "in_flight_mb": 4.0,
                                                                       "logits_in_flight": 3.0, "head_in_flight": 3.0})
    expected = more["total"] - one["total"]
    got = 3 * one["total_per_in_flight"] + 2 * one["total_per_logits"]
    assert np.all(expected > 0)
    assert got == pytest.approx(expected, rel=1e-12)


def _scalar_reference(plan, space, gpus: int) -> dict:
    """Every combination of the space, one at a time, kept when it passes each rule."""
    from trainplan.estimate import activations as act
    from trainplan.estimate.pipeline import SCHEDULE_CODE
    from trainplan.plan import default_stage_split, interleaving_problem, load_model

    model = load_model(plan)
    seq = plan.seq_len or min(model.max_position, 4096)
    rows = []
    # every virtual-stage count up to a stage's layers and one more (one-layer end stages)
    vpps = space.vpp if space.vpp is not None else range(1, model.layers + 2)
    problems: dict = {}

    def combinations():
        for combo in itertools.product(space.tp, space.pp, space.cp, space.ep, space.mbs, space.recompute,
                                       space.zero, space.schedule):
            for vpp in (vpps if combo[-1] == "interleaved" else [v for v in vpps if v == 1]):
                yield *combo, vpp

    for tp, pp, cp, ep, mbs, rc, zero, sched, vpp in combinations():
        if gpus % (tp * pp * cp) or pp > model.layers or model.heads % tp:
            continue
        dp = gpus // (tp * pp * cp)
        if plan.dp is not None and dp != plan.dp:
            continue
        kv = model.n_kv_heads
        if not model.is_mla and kv % tp and tp % kv:
            continue
        if any(f % tp for f in [model.ffn] + ([model.expert_ffn] if model.expert_ffn else [])):
            continue
        if (cp > 1 and seq % (2 * cp)) or (plan.attention == "eager" and cp > 1):
            continue
        if (model.is_moe and (model.experts % ep or (dp * cp) % ep)) or (not model.is_moe and ep != 1):
            continue
        if plan.offload_params and zero != 3:
            continue
        gbs = plan.gbs or search_batch(seq, gpus)
        if gbs % (dp * mbs):
            continue
        m = gbs // (dp * mbs)
        if sched == "interleaved":
            if pp < 2 or vpp < 2 or m % pp:
                continue
            if (pp, vpp) not in problems:
                problems[pp, vpp] = interleaving_problem(default_stage_split(model.layers, pp), vpp, plan.framework)
            if problems[pp, vpp]:
                continue
        elif vpp != 1:
            continue
        if pp == 1 and sched != "1f1b" and "1f1b" in space.schedule:  # one stage: only 1F1B
            continue
        rows.append(dict(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, zero=zero, mbs=mbs, recompute=act.RECOMPUTE_CODE[rc],
                         schedule=SCHEDULE_CODE[sched], vpp=vpp, m=m, gbs=gbs))
    return {k: np.array([r[k] for r in rows]) for k in rows[0]}


@pytest.mark.parametrize("kw", [
    dict(model="llama-3-70b", gpus=64, gbs=256),
    dict(model="mixtral-8x7b", gpus=32, gbs=64, seq_len=4096),
    dict(model="gpt2-xl", gpus=8, attention="eager", seq_len=1024),
    dict(model="llama-3-8b", gpus=16, gbs=32, offload_params=True, zero=3),
    dict(model="llama-3-8b", gpus=32, dp=4, gbs=64),  # a fixed data-parallel size (it was ignored)
])
def test_staged_enumeration_equals_trying_every_combination(kw):
    """Building the layouts dimension by dimension (arrays, rules applied early) keeps exactly
    the layouts, in exactly the order, of trying every combination one by one."""
    from trainplan.plan import load_model

    plan = make_plan(**kw)
    model = load_model(plan)
    space = default_space(plan, {"zero"} if "zero" in kw else set(), kw["gpus"], model.layers, 8, model.is_moe)
    got, want = enumerate_layouts(plan, space, kw["gpus"]), _scalar_reference(plan, space, kw["gpus"])
    assert set(got) == set(want) and len(want["tp"]) > 0
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def test_a_profile_prices_only_the_accelerator_it_was_measured_on(tmp_path):
    """A profile written by `trainplan bench --profile` names its accelerator: a plan on another
    one is refused by name (its efficiencies are not that accelerator's), and a comparison
    prices only that accelerator with it, the others with their catalog defaults."""
    from trainplan.plan import resolve
    from trainplan.search import accelerator_plans, compare_gpus

    prof = tmp_path / "h100.toml"
    prof.write_text('gpu = "H100-SXM"\n[efficiency]\ngemm = 0.5\n')
    with pytest.raises(PlanError) as e:
        resolve(make_plan(model="llama-3-8b", gpus=8, gpu="A100-80GB-SXM", gpu_profile=str(prof)))
    assert e.value.field == "gpu_profile" and "measured on H100-SXM" in e.value.rule
    # the same chip shares its fractions of the datasheet (scripts/bench_gpu.sh prices the
    # published H100 runs with an H200's profile)
    assert resolve(make_plan(model="llama-3-8b", gpus=8, gpu="H200-SXM", gpu_profile=str(prof))).gpu.name == "H200-SXM"
    opts = dict(model="llama-3-8b", gpus=8, gbs=64, gpu_profile=str(prof))
    plans = accelerator_plans(opts, "H100-SXM,A100-80GB-SXM,H200-SXM")
    assert [p.gpu_profile for p in plans] == [str(prof), None, str(prof)]
    rows = {r["gpu"]: r["best"] for r in compare_gpus(plans, set())["rows"]}
    assert rows["H100-SXM"]["time"]["accuracy"]["basis"] == "profile"
    assert rows["A100-80GB-SXM"]["time"]["accuracy"]["basis"] == "published runs"
    unnamed = tmp_path / "any.toml"
    unnamed.write_text("[efficiency]\ngemm = 0.5\n")
    with pytest.raises(PlanError) as e:
        accelerator_plans({**opts, "gpu_profile": str(unnamed)}, "H100-SXM,A100-80GB-SXM")
    assert e.value.field == "gpu_profile"


def _gpt3_13b():
    """GPT-3 13B (Brown et al. 2020, Table 2.1: 40 layers, 40 heads of 128, 2,048 tokens; d_model
    5,120 = 40 x 128 as implementations build it)."""
    from trainplan.specs.model import ModelSpec

    return ModelSpec(name="gpt3-13b", source="Brown et al. 2020, Table 2.1", layers=40, hidden=5120, heads=40,
                     ffn=20480, vocab=50257, mlp="gelu", norm="layernorm", position="learned", max_position=2048,
                     bias=True, qkv_bias=True, tied_embeddings=True)


@pytest.mark.parametrize("framework", ["megatron", "deepspeed"])
def test_search_lists_every_interleaving_a_plan_accepts(framework):
    """Every (pipeline depth, virtual stages) pair `plan` accepts for GPT-3 13B on 8 GPUs is
    listed by the search, and no other: 10 virtual stages on 2 and on 4 stages (Calculon's best
    layout for this model and GPU count uses 10), one-layer virtual stages (20 on 2 stages)."""
    from trainplan.search import default_space, enumerate_layouts

    spec = _gpt3_13b()
    plan = make_plan(model="gpt2", gpu="A100-80GB-SXM", gpus=8, seq_len=2048, gbs=64, framework=framework)
    lay = enumerate_layouts(plan, default_space(plan, set(), 8, spec.layers, 8, False), 8, spec)
    listed = set(zip(lay["pp"][lay["vpp"] > 1].tolist(), lay["vpp"][lay["vpp"] > 1].tolist(), strict=True))
    accepted = set()
    for pp in (2, 4, 8):
        for v in range(2, spec.layers + 2):
            try:
                resolve(plan.model_copy(update={"pp": pp, "tp": 8 // pp, "schedule": "interleaved", "vpp": v}), spec)
            except PlanError:
                continue
            accepted.add((pp, v))
    assert listed == accepted
    assert {(2, 10), (4, 10), (2, 20), (4, 5)} <= listed
    best = search(plan.model_copy(update={"schedule": "interleaved", "vpp": 10}), {"schedule", "vpp"}, top=1,
                  spec=spec)["best"][0]["parallel"]
    assert best["schedule"] == "interleaved" and best["vpp"] == 10
