"""Bad plans and specs: one message naming the field and the rule, exit 2, no traceback."""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from trainplan.cli import app
from trainplan.errors import PlanError
from trainplan.plan import make_plan
from trainplan.report import evaluate, to_json

runner = CliRunner()


def run(*args):
    return runner.invoke(app, ["plan", *args])


@pytest.mark.parametrize("args,field,words", [
    (["--model", "llama-3-70b", "--tp", "3"], "tp", "attention heads (64)"),
    (["--model", "llama-3-8b", "--pp", "40"], "pp", "number of layers (32)"),
    (["--model", "llama-3-8b", "--gpus", "8", "--gbs", "12", "--mbs", "1"], "gbs", "dp x mbs"),
    (["--gpu", "H1000"], "gpu", "unknown gpu"),
    (["--model", "llama-9000"], "model", "unknown model"),
    (["--mbs", "-1"], "mbs", "greater than or equal to 1"),
    (["--seq-len", "999999999"], "seq_len", "less than or equal"),
    (["--gpus", "7", "--tp", "2"], "gpus", "multiple of tp x pp x cp"),
    (["--model", "llama-3-8b", "--ep", "2", "--gpus", "2"], "ep", "mixture-of-experts"),
    (["--schedule", "interleaved", "--pp", "2", "--gpus", "2"], "vpp", "--vpp >= 2"),
    (["--offload-params"], "offload_params", "--zero 3"),
    (["--cp", "2", "--gpus", "2", "--attention", "eager"], "cp", "flash or sdpa"),
    (["--pp", "2", "--gpus", "2", "--stage-layers", "10,10"], "stage_layers", "sum to the layer count"),
    (["--lora-targets", "q,zz", "--finetune", "lora"], "lora_targets", "unknown LoRA target"),
    (["--dropout", "1.5"], "dropout", "less than 1"),
    (["--gpu", "V100", "--precision", "bf16"], "precision", "no bf16"),
    # adapter settings without adapters (a forgotten --finetune lora) were silently ignored
    (["--lora-rank", "64"], "lora_rank", "--finetune lora or qlora only"),
    (["--lora-targets", "q,v"], "lora_targets", "--finetune lora or qlora only"),
    (["--finetune", "lora", "--qlora-bits", "8"], "qlora_bits", "--finetune qlora only"),
    (["--gpu", "RTX-4090", "--gpus", "16", "--zero", "3"], "nic_gbps", "no network between nodes"),
    (["--gpus", "16", "--nic-gbps", "0"], "nic_gbps", "greater than or equal to 0.001"),
])
def test_bad_plans_exit_2_naming_field(args, field, words):
    res = run(*args)
    assert res.exit_code == 2, res.output
    out = res.output
    assert out.count("error:") == 1 and "Traceback" not in out
    assert f"error: {field}:" in out and words in out


@pytest.mark.parametrize("args,code", [
    (["--cp-comm", "allgather"], "cp_comm_unused"),
    (["--host-gbs", "100"], "host_unused"),
    (["--gpus", "8", "--nic-gbps", "100"], "nic_unused"),
    (["--gpus", "8", "--gpus-per-node", "1", "--scale-up-gbs", "100"], "scale_up_unused"),
])
def test_options_that_change_nothing_say_so(args, code):
    """An option the plan has no use for is named in a warning, not silently dropped."""
    res = run("--model", "llama-3-8b", *args, "--json")
    assert res.exit_code == 0, res.output
    assert code in [w["code"] for w in json.loads(res.output)["warning_details"]]


def test_malformed_files(tmp_path):
    bad_toml = tmp_path / "m.toml"
    bad_toml.write_text("layers = = 3")
    res = run("--model", str(bad_toml))
    assert res.exit_code == 2 and "error: model:" in res.output and "TOML" in res.output
    bad_json = tmp_path / "config.json"
    bad_json.write_text('{"model_type": "llama",')
    res = run("--model", str(bad_json))
    assert res.exit_code == 2 and "not valid JSON" in res.output
    missing = run("--model", str(tmp_path / "nope" / "config.json"))
    assert missing.exit_code == 2 and "cannot read" in missing.output


def test_good_plan_json_contract():
    res = run("--model", "llama-3-70b", "--gpus", "64", "--tp", "8", "--pp", "4", "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert set(data["model"]) >= {"name", "params", "active_params"}
    assert set(data["parallel"]) >= {"tp", "pp", "dp", "cp", "ep", "zero", "mbs", "gbs", "seq_len",
                                     "recompute", "schedule", "vpp"}
    mem = data["memory"]
    assert set(mem) >= {"capacity_bytes", "peak_bytes", "fits", "stages"}
    assert len(mem["stages"]) == 4
    for s in mem["stages"]:
        assert set(s) >= {"stage", "params_bytes", "grads_bytes", "optimizer_bytes",
                          "activations_bytes", "other_bytes", "total_bytes"}
        parts = s["params_bytes"] + s["grads_bytes"] + s["optimizer_bytes"] + s["activations_bytes"] + s["other_bytes"]
        assert parts == pytest.approx(s["total_bytes"])
    assert data["parallel"]["dp"] == 2 and isinstance(data["warnings"], list)


PLAN_FIELDS = st.fixed_dictionaries({}, optional={
    "model": st.sampled_from(["llama-3-8b", "gpt2", "mixtral-8x7b", "deepseek-v3", "qwen2.5-0.5b", "bogus"]),
    "gpu": st.sampled_from(["H100-SXM", "A100-80GB-SXM", "V100", "RTX-4090", "TPU-v4", "nope"]),
    "gpus": st.integers(-2, 4096), "gpus_per_node": st.integers(-1, 80),
    "scale_up_gbs": st.one_of(st.none(), st.floats(-1, 2000), st.just(5e-324)),
    "nic_gbps": st.one_of(st.none(), st.floats(-1, 1000), st.just(5e-324)),
    "tp": st.integers(-1, 64), "pp": st.integers(-1, 200), "dp": st.one_of(st.none(), st.integers(-1, 64)),
    "cp": st.integers(0, 16), "ep": st.integers(0, 64), "zero": st.integers(-1, 4),
    "sp": st.booleans(), "mbs": st.integers(-1, 64), "gbs": st.one_of(st.none(), st.integers(-1, 5000)),
    "seq_len": st.one_of(st.none(), st.integers(-5, 200_000)),
    "recompute": st.sampled_from(["none", "selective", "full", "some"]),
    "recompute_layers": st.one_of(st.none(), st.integers(-1, 100)),
    "schedule": st.sampled_from(["gpipe", "1f1b", "interleaved", "zb", "x"]),
    "vpp": st.one_of(st.none(), st.integers(-1, 8)),
    "stage_layers": st.one_of(st.none(), st.text(max_size=12), st.lists(st.integers(-2, 40), max_size=6)),
    "precision": st.sampled_from(["fp32", "bf16", "fp16", "fp8", "int4"]),
    "optimizer": st.sampled_from(["adamw", "adafactor", "adam-8bit", "lion", "sgd", "rmsprop"]),
    "attention": st.sampled_from(["flash", "sdpa", "eager"]),
    "framework": st.sampled_from(["deepspeed", "megatron", "fsdp", "torch", "jax"]),
    "finetune": st.sampled_from(["full", "lora", "qlora"]),
    "dropout": st.one_of(st.floats(-1, 2), st.just(float("nan"))),
    "offload_optimizer": st.booleans(), "offload_params": st.booleans(),
    "lora_targets": st.sampled_from(["q,v", "q,k,v,o,gate,up,down", "", "x"]),
    "lora_dropout": st.one_of(st.floats(-1, 2), st.just(0.0)),
    "tokens": st.one_of(st.none(), st.floats(-1, 1e15)), "price": st.one_of(st.none(), st.floats(-1, 100)),
    "pue": st.one_of(st.none(), st.floats(0, 3)), "gpu_mtbf_hours": st.one_of(st.none(), st.floats(0, 1e6), st.floats(1e-9, 1e-3)),
    "checkpoint_gbs": st.one_of(st.none(), st.floats(0, 100), st.just(5e-324)), "overlap_tp": st.booleans(),
    "storage_gbs": st.one_of(st.none(), st.floats(0, 100), st.just(5e-324)),
    "h2d_gbs": st.one_of(st.none(), st.floats(0, 100), st.just(5e-324)),
    "host_gbs": st.one_of(st.none(), st.floats(0, 1000), st.just(5e-324)),
    "tokenize_rate": st.one_of(st.none(), st.floats(0, 1e7), st.just(5e-324)),
    "overlap_dp": st.booleans(), "grid_kg_per_kwh": st.one_of(st.none(), st.floats(-1, 2)),
    "hf_config": st.one_of(st.none(), st.dictionaries(st.sampled_from(
        ["model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size",
         "intermediate_size"]), st.one_of(st.integers(-3, 5000), st.sampled_from(["llama", "gpt2", "qwen2"])))),
})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(PLAN_FIELDS)
def test_random_plans_raise_only_plan_errors(fields):
    try:
        data = to_json(evaluate(make_plan(**fields)), with_max_mbs=False)
    except PlanError as err:
        assert err.field and err.rule
        return
    assert data["memory"]["peak_bytes"] > 0
    for s in data["memory"]["stages"]:
        assert s["total_bytes"] > 0
    json.dumps(data, allow_nan=False)  # strict JSON: no NaN or Infinity anywhere
    assert data["time"]["step_s"] > 0


SPEC_FIELDS = st.fixed_dictionaries({
    "name": st.just("random"), "source": st.sampled_from(["test", ""]),
    "layers": st.integers(-1, 300), "hidden": st.integers(-1, 20000), "heads": st.integers(-1, 256),
    "ffn": st.integers(-1, 60000), "vocab": st.integers(-1, 300000),
}, optional={
    "kv_heads": st.integers(-1, 64), "head_dim": st.integers(-1, 512),
    "mlp": st.sampled_from(["gelu", "swiglu", "relu"]), "norm": st.sampled_from(["layernorm", "rmsnorm"]),
    "position": st.sampled_from(["learned", "rotary", "none", "alibi"]),
    "experts": st.integers(-1, 300), "top_k": st.integers(-1, 16), "expert_ffn": st.integers(-1, 8000),
    "shared_experts": st.integers(0, 4), "first_dense_layers": st.integers(0, 10),
    "moe_layer_freq": st.integers(0, 4), "tied_embeddings": st.booleans(),
    "kv_lora_rank": st.integers(-1, 1024), "qk_rope_head_dim": st.integers(-1, 128),
    "qk_nope_head_dim": st.integers(-1, 128), "v_head_dim": st.integers(-1, 128),
    "unknown_key": st.integers(),
})


def _toml_value(v):
    return str(v).lower() if isinstance(v, bool) else (f'"{v}"' if isinstance(v, str) else str(v))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(spec=SPEC_FIELDS, tp=st.integers(1, 8), pp=st.integers(1, 4), seq=st.integers(1, 4096))
def test_random_specs_raise_only_plan_errors(tmp_path, spec, tp, pp, seq):
    path = tmp_path / "spec.toml"
    path.write_text("\n".join(f"{k} = {_toml_value(v)}" for k, v in spec.items()) + "\n")
    try:
        data = to_json(evaluate(make_plan(model=str(path), tp=tp, pp=pp, gpus=tp * pp, seq_len=seq)),
                       with_max_mbs=False)
    except PlanError as err:
        assert err.field and err.rule
        return
    assert data["memory"]["peak_bytes"] > 0


def test_default_batch_bubble_points_to_a_training_batch():
    """The plan's default global batch (4 x pp micro-batches with pipelining) leaves a pipeline
    bubble of (p - 1)/(m + p - 1) = 3/19 on 4 stages; the output says so and names the batch
    a search would train (4M tokens: 1,024 x 4,096 on 64 GPUs). With --gbs it says nothing."""
    args = ["--model", "llama-3-70b", "--gpus", "64", "--tp", "8", "--pp", "4", "--zero", "1", "--sp"]
    out = run(*args).output
    assert "the default global batch (32, 16 micro-batches) leaves a 15% bubble" in out and "--gbs 1024" in out
    data = json.loads(run(*args, "--json").output)
    assert data["parallel"]["gbs_given"] is False
    assert "the default global batch" not in run(*args, "--gbs", "32").output
