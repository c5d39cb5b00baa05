"""Runs that ran must fit (DESIGN §4): every published run of benchmarks/data/known_good_runs.toml
plans as fitting at its published layout, and within 10% of a published peak where its source
gives one. A row that still does not fit states why (`known_gap`) and is expected, strictly, not
to fit, so that closing the gap shows."""

import tomllib
from pathlib import Path

import numpy as np
import pytest

from trainplan import calibration as cal
from trainplan.estimate.memory import estimate_memory
from trainplan.plan import make_plan, resolve
from trainplan.specs.model import ModelSpec
from trainplan.units import GiB

DATA = Path(__file__).resolve().parents[1] / "benchmarks" / "data"
KNOWN = tomllib.loads((DATA / "known_good_runs.toml").read_text())
PUBLISHED = tomllib.loads((DATA / "published_runs.toml").read_text())
LAYOUT = ("gpu", "gpus", "tp", "pp", "dp", "cp", "ep", "vpp", "mbs", "gbs", "seq_len", "framework", "zero",
          "schedule", "recompute", "precision")


def published_layout(table: str, row: list):
    """A published_runs.toml row planned as trainplan.calibration plans it."""
    cfg = PUBLISHED[table]
    if table == "narayanan2021":
        spec, kw = cal.narayanan_setup(cfg, row)
        return resolve(make_plan(**kw), spec)
    if table == "megatron_core_h100":
        pb, a, h, L, tp, pp, g, gbs, _ = row
        spec = cal._gpt(f"GPT {pb}B", h, a, L, 131072, 4096, tied=False)
        layout, _, _ = cal._with_recompute_rule(
            spec, gpu=cfg["gpu"], gpus=g, tp=tp, pp=pp, gbs=gbs, mbs=1, seq_len=4096, zero=1, sp=tp > 1,
            framework="megatron", attention="cudnn", precision="bf16", overlap_tp=True, overlap_dp=True)
        return layout
    spec, kw = cal.mosaicml_setup(cfg, row)
    return resolve(make_plan(**kw), spec)


def run_layout(run: dict):
    """A [[run]] row as a resolved layout."""
    spec = ModelSpec(**run["model_spec"]) if "model_spec" in run else None
    options = {k: run[k] for k in LAYOUT if k in run}
    layout = resolve(make_plan(model=run.get("model", "custom"), **options, **run.get("options", {})), spec)
    assert (layout.gpus, layout.tp, layout.pp, layout.dp, layout.cp, layout.ep) == tuple(
        run[k] for k in ("gpus", "tp", "pp", "dp", "cp", "ep"))
    return layout


def _cases():
    for entry in KNOWN["from_published"]:
        for i, row in enumerate(PUBLISHED[entry["table"]]["rows"]):
            yield pytest.param(("published", entry["table"], row), id=f"{entry['table']}-{i}")
    for run in KNOWN["run"]:
        marks = [pytest.mark.xfail(strict=True, reason=run["known_gap"])] if "known_gap" in run else []
        yield pytest.param(("run", run["name"], run), id=run["name"], marks=marks)


def peak_bytes(layout) -> float:
    return float(np.max(estimate_memory(layout)["total"]))


@pytest.mark.parametrize("case", list(_cases()))
def test_known_good_run_fits(case):
    kind, _, row = case
    layout = published_layout(case[1], row) if kind == "published" else run_layout(row)
    peak = peak_bytes(layout)
    assert peak <= layout.gpu.capacity_bytes, f"peak {peak / GiB:.2f} GiB of {layout.gpu.capacity_bytes / GiB:.0f}"
    if kind == "run" and "peak_gib" in row:
        assert peak / GiB == pytest.approx(row["peak_gib"], rel=0.10)


def test_every_run_cites_its_source_and_layout():
    """Each row carries its accelerator, layout, framework, schedule, recompute, precision and a
    source; the tables it takes from published_runs.toml exist there."""
    for run in KNOWN["run"]:
        assert run["source"] and all(k in run for k in LAYOUT if k != "vpp"), run["name"]
    assert {e["table"] for e in KNOWN["from_published"]} <= set(PUBLISHED)
    names = {r["name"].split(",")[0] for r in KNOWN["run"]}
    assert {"Llama 3 405B", "DeepSeek-V3 671B", "BLOOM-176B", "OPT-175B"} <= names


def test_llama3_schedule_as_run():
    """Llama 3 405B at 16K GPUs (m = 16 = pp): interleaving with v = 8 holds every micro-batch's
    forward on stage 0 before its first backward (Megatron's warm-up (p-1)·2 + (v-1)·p = 142 chunks,
    capped at m·v = 128: 16 micro-batches of its layers), and the 7-layer first and last stages
    (§3.3.2) keep them under the 8-layer ones."""
    run = next(r for r in KNOWN["run"] if r["name"].startswith("Llama 3 405B, 16,384 H100, TP 8 PP"))
    layout = run_layout(run)
    assert layout.stage_layers == [7] + [8] * 14 + [7] and layout.micro_batches == 16
    total = estimate_memory(layout)["total"]
    assert int(np.argmax(total)) not in (0, 15)


def test_deepseek_v3_as_run_holds_two_stages_and_pp_plus_one():
    """DualPipe on 16 ranks: rank 0 holds stages 0 and 15 (3 + 3 of 61 layers: the embedding
    and the head of both copies), PP + 1 = 17 stage-micro-batches in flight."""
    run = next(r for r in KNOWN["run"] if r["name"].startswith("DeepSeek-V3"))
    layout = run_layout(run)
    assert sum(layout.stage_layers) == 2 * 61 and layout.stage_layers[0] == 3 + 3
    from trainplan.estimate.pipeline import SCHEDULE_CODE, in_flight

    assert float(in_flight(SCHEDULE_CODE["dualpipe"], 0, 16, layout.micro_batches)) * 2 == 17


def test_framework_kernels_state_what_is_saved():
    """Each framework convention names its norm, SwiGLU, RoPE, cross-entropy and attention kernels,
    and the memory model's fused-kernel switch follows its norm and SwiGLU."""
    from trainplan.plan import conventions

    for name, fw in conventions()["frameworks"].items():
        k = fw["kernels"]
        assert set(k) == {"norm", "swiglu", "rope", "cross_entropy", "attention"}, name
        assert fw["fused_kernels"] == (k["norm"] == k["swiglu"] == "fused"), name


def test_recompute_modules_and_fp8_cache_on_deepseek_v3():
    """DeepSeek-V3's per-layer saved bytes at 4,096 tokens, no TP, from the shapes (h = 7168,
    128 heads, q/k 192 and v 128 per head, 8 routed experts of width 2048):
    layernorm drops both norms' outputs (the linears' inputs, 2 x 4096·7168 FP8 bytes);
    mla_up_proj drops the per-head q, k, v; moe_act the experts' SwiGLU outputs (8 x 2048 FP8
    bytes a token); the FP8 cache keeps the attention output in E5M6 (1.5 B) and the SwiGLU
    input (8 x 2 x 2048) in FP8."""
    from trainplan.estimate.memory import estimate_memory as mem

    base = dict(model="deepseek-v3", gpu="H800-SXM", gpus=2048, pp=16, ep=64, zero=1, gbs=15360, seq_len=4096,
                precision="fp8", framework="megatron", schedule="dualpipe")
    plain = mem(resolve(make_plan(**base, recompute="selective", recompute_modules=["core_attn"])))["moe_layer_terms"]
    run = mem(resolve(make_plan(**base, recompute="selective",
                                recompute_modules=["layernorm", "mla_up_proj", "moe_act"],
                                fp8_cache=["attn_out", "moe_act_input"])))["moe_layer_terms"]
    t = 4096
    assert float(plain["attn_input"]) == t * 7168 * 1 and float(run["attn_input"]) == 0
    assert float(run["mlp_input"]) == 0 and float(run["qkv"]) == 0
    assert float(run["attn_out"]) == t * 128 * 128 * 1.5
    assert float(plain["expert_mlp"]) - float(run["expert_mlp"]) == t * 8 * 2048 * (1 + 2 * (2 - 1))
    # the experts' gathered inputs are what their FP8 linears keep: 1 byte; their outputs are not
    # kept (Megatron-Core's experts apply the gate weights inside the SwiGLU)
    assert float(run["expert_dispatch"]) == t * 8 * 7168 * 1


def test_megatron_experts_keep_no_output_for_the_gate_weights():
    """Megatron-Core @d98e8a64 multiplies each routed copy by its gate weight inside the experts'
    SwiGLU (experts.py, weighted_bias_swiglu_impl), whose saved input also gives the weights'
    gradient, and combines with a plain sum: against an eager gate multiply after the experts
    (which keeps the 16-bit expert output), DeepSeek-V3 at 4,096 tokens saves exactly
    4,096 x 8 routed copies x 7,168 x 2 bytes less per MoE layer."""
    base = dict(model="deepseek-v3", gpu="H800-SXM", gpus=2048, pp=16, ep=64, zero=1, gbs=15360, seq_len=4096,
                schedule="dualpipe", fused_kernels=True)
    terms = {fw: estimate_memory(resolve(make_plan(**base, framework=fw)))["moe_layer_terms"]
             for fw in ("megatron", "deepspeed")}
    assert float(terms["megatron"]["expert_dispatch"]) == 4096 * 8 * 7168 * 2
    assert float(terms["deepspeed"]["expert_dispatch"]) - float(terms["megatron"]["expert_dispatch"]) == (
        4096 * 8 * 7168 * 2)


@pytest.mark.parametrize("options,field", [
    (dict(recompute="full", recompute_modules=["layernorm"]), "recompute_modules"),
    (dict(recompute="selective", recompute_modules=["mla_up_proj"]), "recompute_modules"),
    (dict(recompute="selective", recompute_modules=["moe_act"]), "recompute_modules"),
    (dict(fp8_cache=["attn_out"]), "fp8_cache"),
])
def test_recompute_and_cache_options_refused_by_name(options, field):
    """On a dense GQA model in bf16: modules it has not, or options the plan does not use."""
    from trainplan.errors import PlanError

    with pytest.raises(PlanError) as err:
        resolve(make_plan(model="llama-3-8b", gpus=8, **options))
    assert err.value.field == field


def test_unknown_recompute_module_names_the_choices():
    from trainplan.errors import PlanError

    with pytest.raises(PlanError) as err:
        make_plan(recompute="selective", recompute_modules="layernorm,mlp")
    assert err.value.field.startswith("recompute_modules")
    assert "mla_up_proj" in str(err.value)


def test_mla_saves_its_query_key_and_value_once():
    """MLA (DeepSeek-V3, no TP, 4,096 tokens): the attention core keeps q and k (128 heads x 192)
    and v (128 x 128), 65,536 16-bit elements a token; the up-projections' outputs they are cut
    from are not kept (Megatron-Core makes them contiguous); the fused latent norms keep their
    inputs (q_a's 1536 and kv_a's whole 512 + 64 output, the latent being a view of it) and one
    fp32 statistic each, and the up-projections their normalised inputs (1536 + 512; the rotary
    key is not normalised): measured in validate (tests/test_validate_mla_lora.py)."""
    terms = estimate_memory(resolve(make_plan(model="deepseek-v3", gpu="H800-SXM", gpus=2048, pp=16, ep=64, zero=1,
                                              gbs=15360, seq_len=4096, framework="megatron")))["moe_layer_terms"]
    assert float(terms["qkv"]) == 4096 * (2 * 128 * 192 + 128 * 128) * 2
    assert float(terms["mla_latents"]) == 4096 * ((1536 + 512 + 64) * 2 + (1536 + 512) * 2 + 2 * 4)


def test_recompute_modules_without_core_attn_do_not_rerun_attention():
    """Selective recomputation re-runs the attention core (its hardware FLOPs above the model's)
    only when its modules include core_attn, Megatron-Core's default."""
    from trainplan.report import evaluate, to_json

    def compute(modules):
        data = to_json(evaluate(make_plan(model="llama-3-8b", gpus=8, tp=8, sp=True, recompute="selective",
                                          recompute_modules=modules, framework="megatron")))
        return data["compute"]["hardware_flops_per_step"] / data["compute"]["model_flops_per_step"]

    assert compute(["layernorm"]) == pytest.approx(1.0)
    assert compute(["core_attn", "layernorm"]) > 1.0


def test_megatrons_llama3_8b_fp8_example_fits_with_its_fp8_parameters():
    """Megatron-LM's examples/llama/train_llama3_8b_h100_fp8.sh (tests/data/imports/SOURCE: 8 H100,
    TP 1, distributed optimizer, FP8 with --fp8-param-gather, no recompute, 8K tokens) is published
    to run on 80 GB H100s. Its parameters are FP8 tensors (1 byte, and the transpose cache 1 byte):
    14.96 GiB for 8.03B parameters, where a 16-bit copy plus the FP8 weight cache would be 29.92
    GiB and the run would not fit (94 GiB)."""
    from pathlib import Path

    from trainplan import api

    script = Path(__file__).parent / "data" / "imports" / "megatron_train_llama3_8b_h100_fp8.sh"
    out = api.plan(from_file=str(script))
    assert out["recipe"]["precision"] == "fp8" and out["memory"]["fits"]
    (stage,) = out["memory"]["stages"]
    assert stage["params_bytes"] == pytest.approx(8.03e9 * 2, rel=0.001)
    without = api.plan(from_file=str(script), fp8_params=False)
    assert not without["memory"]["fits"] and without["memory"]["stages"][0]["params_bytes"] == pytest.approx(
        8.03e9 * 4, rel=0.001)
