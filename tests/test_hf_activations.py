"""Hugging Face configs planned and validated as written: the activation function
(`activation_function` / `hidden_act`), GPT-NeoX's parallel residual and transformers 5's
experts implementation decide the bytes saved for backward.

Measured: transformers 5 models built from the config.json files in tests/data/hf (sizes scaled
down, everything else as written), one fp32 training step on the CPU, saved tensors through
saved_tensors_hooks. Targets: parameter and gradient bytes exact, optimizer state within 0.01%
(torch.optim's per-parameter step counters), activations within 3%."""

import json

import pytest

from trainplan.errors import PlanError
from trainplan.estimate import activations as act
from trainplan.specs import hf

torch = pytest.importorskip("torch")

from trainplan.plan import make_plan  # noqa: E402
from trainplan.validate.measure import saved_tensor_bytes  # noqa: E402
from trainplan.validate.run import validate  # noqa: E402

ACT_TOL = 0.03


def _config(data_dir, name, **changes):
    cfg = json.loads((data_dir / "hf" / f"{name}.json").read_text())
    cfg.update(changes)
    return cfg


# ---- import ---------------------------------------------------------------------------
def test_configs_keep_their_activation_and_residual_layout(data_dir):
    gpt2 = hf.from_file(data_dir / "hf" / "gpt2-xl.json")
    neox = hf.from_file(data_dir / "hf" / "gpt-neox-20b.json")
    mixtral = hf.from_file(data_dir / "hf" / "mixtral-8x7b.json")
    assert (gpt2.activation, gpt2.parallel_residual) == ("gelu_new", False)
    assert (neox.activation, neox.parallel_residual) == ("gelu_fast", True)
    assert (mixtral.activation, mixtral.experts_impl) == ("silu", None)
    eager = hf.from_dict(_config(data_dir, "mixtral-8x7b", experts_implementation="eager"))
    assert eager.experts_impl == "eager"
    # transformers' defaults where the config is silent: GPT2Config gelu_new, GPTNeoXConfig gelu
    # with a parallel residual
    bare_gpt2 = {k: v for k, v in _config(data_dir, "gpt2-xl").items() if k != "activation_function"}
    assert hf.from_dict(bare_gpt2).activation == "gelu_new"
    bare_neox = {k: v for k, v in _config(data_dir, "gpt-neox-20b").items()
                 if k not in ("hidden_act", "use_parallel_residual")}
    assert (hf.from_dict(bare_neox).activation, hf.from_dict(bare_neox).parallel_residual) == ("gelu", True)


@pytest.mark.parametrize("name,key,value", [
    ("gpt2-xl", "activation_function", "gelu_10"),
    ("gpt-neox-20b", "hidden_act", "gelu_python"),
    ("llama-3-8b", "hidden_act", "xielu"),
    ("mixtral-8x7b", "experts_implementation", "batched_mm"),
])
def test_unknown_activation_or_experts_implementation_is_refused(data_dir, name, key, value):
    with pytest.raises(PlanError) as e:
        hf.from_dict(_config(data_dir, name, **{key: value}))
    assert e.value.field == f"hf_config.{key}" and repr(value) in e.value.rule
    assert ("gelu_new" in e.value.rule and "relu2" in e.value.rule) or "grouped_mm" in e.value.rule


def test_catalog_models_state_their_activation():
    from trainplan.specs import catalog

    for name in ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl"):
        assert catalog.model(name).activation == "gelu_new"
    neox = catalog.model("gpt-neox-20b")
    assert (neox.activation, neox.parallel_residual) == ("gelu_fast", True)


# ---- what each activation function saves ----------------------------------------------
@pytest.mark.parametrize("gated", [False, True], ids=["plain", "gated"])
@pytest.mark.parametrize("name", [n for n in act.ACTIVATION_SAVES if n is not None])
def test_activation_saves_match_transformers(name, gated):
    """transformers' own activation module between an up and a down projection (separate gate and
    up projections when gated), fp32: the bytes autograd saves equal the planner's MLP term
    exactly (f = 96 wide, 64 tokens)."""
    pytest.importorskip("transformers")
    from transformers.activations import ACT2FN

    tokens, h, f = 64, 32, 96
    torch.manual_seed(0)
    up, down, gate = torch.nn.Linear(h, f), torch.nn.Linear(f, h), torch.nn.Linear(h, f)
    fn = ACT2FN[name]
    x = torch.randn(tokens, h, requires_grad=True)

    def run():
        y = fn(gate(x)) * up(x) if gated else fn(up(x))
        return down(y)

    params = [*up.parameters(), *down.parameters(), *gate.parameters(), x]
    measured, _ = saved_tensor_bytes(run, params)
    predicted = tokens * act._mlp_elems(f, 3 if gated else 2, 0, 1, 4, 4, act.ACTIVATION_SAVES[name])
    assert measured == predicted, (name, gated, measured / (tokens * f * 4), predicted / (tokens * f * 4))


# ---- validate --impl transformers on the configs as written ------------------------------
CONFIGS = ["gpt2-xl", "gpt-neox-20b", "mixtral-8x7b", "qwen1.5-moe-a2.7b", "qwen3-30b-a3b"]


def _validate(data_dir, name, **changes):
    pytest.importorskip("transformers")
    plan = make_plan(model="custom", hf_config=_config(data_dir, name, **changes), gpus=1, precision="fp32",
                     framework="torch")
    (case,) = validate(plan, device="cpu", impl="transformers")["cases"]
    return case


@pytest.mark.parametrize("name", CONFIGS)
def test_transformers_config_as_written_matches(data_dir, name):
    """Measured with the config's own activation function, residual layout and (for MoE) the
    installed transformers' default experts implementation (grouped_mm in transformers 5).
    Measured on transformers 5.24 / torch 2.13: GPT-2 gelu_new -0.01%, GPT-NeoX gelu_fast
    -0.01% (its partial rotary, rotary_pct 0.25, with the heads-major copy of the attention
    output it causes on the CPU), Mixtral -0.04%,
    Qwen1.5-MoE -0.01%, Qwen3-MoE -0.09% (with its per-head q/k norms)."""
    case = _validate(data_dir, name)
    err = case["rel_error"]
    assert err["params_bytes"] == 0 and err["grads_bytes"] == 0, err
    assert abs(err["optimizer_bytes"]) < 1e-4, err
    assert abs(err["activations_bytes"]) <= ACT_TOL, (name, err["activations_bytes"])
    assert abs(err["flops"]) < 1e-9, (name, err["flops"])
    assert any("as written" in n for n in case["notes"])
    if name in ("mixtral-8x7b", "qwen1.5-moe-a2.7b", "qwen3-30b-a3b"):
        assert "experts grouped" in case["name"]


def test_gpt2_activation_is_measured_not_substituted(data_dir):
    """The same GPT-2 config with gelu_new and with gelu_pytorch_tanh: gelu_new's separate ops
    keep three more f-wide fp32 tensors per token and layer (pow's input is F.gelu's input
    too; tanh's output, 0.5·x and 1 + tanh): 2 layers x 256 tokens x 3 x 1024 x 4 bytes =
    6,291,456 bytes, measured and predicted alike."""
    new = _validate(data_dir, "gpt2-xl")
    tanh = _validate(data_dir, "gpt2-xl", activation_function="gelu_pytorch_tanh")
    for side in ("measured", "predicted"):
        assert new[side]["activations_bytes"] - tanh[side]["activations_bytes"] == 2 * 256 * 3 * 1024 * 4
    assert any("resid_pdrop 0.1" in n for n in new["notes"])  # the config's dropout: the plan's 0


def test_mixtral_eager_experts_when_the_config_says_so(data_dir):
    """experts_implementation "eager" (a loop with index_add_) keeps one more h-wide copy per
    routed token (the weighted outputs) than the grouped default: 2 layers x 256 tokens x top-2 x
    256 x 4 bytes, less the grouped path's extra int64 index and its fp32 gate weights."""
    grouped = _validate(data_dir, "mixtral-8x7b")
    eager = _validate(data_dir, "mixtral-8x7b", experts_implementation="eager")
    assert "experts eager" in eager["name"]
    assert abs(eager["rel_error"]["activations_bytes"]) <= ACT_TOL
    assert abs(eager["rel_error"]["flops"]) < 1e-9
    diff = eager["predicted"]["activations_bytes"] - grouped["predicted"]["activations_bytes"]
    assert diff == 2 * 256 * 2 * (256 * 4 - 8)


def test_transformers_validation_refuses_dropout(data_dir):
    """transformers' attention takes no dropout on the CPU kernels the prediction assumes: refused
    by name, before a model is built."""
    pytest.importorskip("transformers")
    plan = make_plan(model=str(data_dir / "hf" / "gpt2-xl.json"), gpus=1, precision="fp32", framework="torch",
                     dropout=0.1)
    with pytest.raises(PlanError) as e:
        validate(plan, device="cpu", impl="transformers")
    assert e.value.field == "dropout" and "--impl reference" in e.value.rule
