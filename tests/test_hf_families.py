"""The families defined by their norms, attention masks and soft-capping, planned from config.json
and measured: Gemma, Gemma 2, Gemma 3, OLMo, OLMo 2, OLMoE, Cohere, Cohere 2, gpt-oss, Mistral's
sliding window, Qwen3 and Qwen3-MoE.

Measured: tiny configs in tests/data/hf_families (written by transformers 5.24's config classes:
2-3 layers, hidden 64, 4 heads / 2 KV heads, a window of 32 keys under 128-token sequences so
the sliding masks matter), built by transformers as written, one fp32 training step on the
CPU. Targets: parameters exact, activations within 3% under SDPA and eager attention (where
transformers runs the family with it), FLOPs as the flop counter counts them. Measured on
transformers 5.24 / torch 2.13 (scripts/families_report.py writes the table in docs/validation.md)."""

import json

import pytest

from trainplan.errors import PlanError
from trainplan.estimate import norm_features
from trainplan.estimate.flops import step_flops
from trainplan.specs import hf

ACT_TOL = 0.03
# family -> the attention implementations transformers runs it with (Gemma 2's soft-capping and
# gpt-oss's sinks: eager, flash or flex, not SDPA)
FAMILIES = {
    "gemma": ("sdpa", "eager"), "gemma2": ("eager",), "gemma3_text": ("sdpa", "eager"),
    "olmo": ("sdpa", "eager"), "olmo2": ("sdpa", "eager"), "olmoe": ("sdpa", "eager"),
    "cohere": ("sdpa", "eager"), "cohere2": ("sdpa", "eager"), "gpt_oss": ("eager",),
    "mistral": ("sdpa", "eager"), "qwen3": ("sdpa", "eager"), "qwen3_moe": ("sdpa", "eager"),
    # the families supported before these, as transformers 5 saves their configs (Qwen2-MoE writes
    # its unused window as 0), in the same table
    **dict.fromkeys(("llama", "mixtral", "qwen2", "qwen2_moe", "gpt2", "deepseek_v3"), ("sdpa", "eager")),
}


def _config(data_dir, name, **changes):
    cfg = json.loads((data_dir / "hf_families" / f"{name}.json").read_text())
    cfg.update(changes)
    return cfg


def _validate(cfg, attention):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from trainplan.plan import make_plan
    from trainplan.validate.run import validate

    plan = make_plan(model="custom", hf_config=cfg, gpus=1, precision="fp32", framework="torch", seq_len=128,
                     mbs=2, attention=attention)
    (case,) = validate(plan, device="cpu", impl="transformers")["cases"]
    return case


# ---- measured -------------------------------------------------------------------------------
# features a family's flagship may switch on beyond its tiny config: OLMo's clip_qkv (OLMo 7B
# 0424), Command R+'s per-head q/k LayerNorms
VARIANTS = [("olmo", {"clip_qkv": 8.0}), ("olmoe", {"clip_qkv": 8.0}), ("cohere", {"use_qk_norm": True})]


@pytest.mark.parametrize("name,changes,attention",
                         [(n, {}, a) for n, atts in FAMILIES.items() for a in atts]
                         + [(n, c, a) for n, c in VARIANTS for a in FAMILIES[n]])
def test_tiny_family_matches_transformers(data_dir, name, changes, attention):
    """Measured (transformers 5.24, torch 2.13, CPU): activations within 0.5% for every family and
    attention (e.g. Gemma 2 eager +0.19%, Gemma 3 SDPA -0.10%, Cohere 2 SDPA +0.48%, gpt-oss eager
    +0.36%, Mistral's window under SDPA +0.42%, OLMo with clip_qkv eager +0.35%, Cohere with q/k
    norms SDPA -0.06%); before these features, -33% (Gemma 2), -20% (Gemma 3 SDPA), -15% (Cohere 2
    SDPA), -21% (gpt-oss), -12% (Mistral SDPA)."""
    case = _validate(_config(data_dir, name, **changes), attention)
    err = case["rel_error"]
    assert err["params_bytes"] == 0 and err["grads_bytes"] == 0, err
    assert abs(err["activations_bytes"]) <= ACT_TOL, (name, attention, err["activations_bytes"])
    assert abs(err["flops"]) < 1e-9, (name, err["flops"])


@pytest.mark.parametrize("name", ["gemma2", "gpt_oss"])
def test_families_without_sdpa_are_refused_by_name(data_dir, name):
    with pytest.raises(PlanError) as e:
        _validate(_config(data_dir, name), "sdpa")
    assert e.value.field == "attention" and "--attention eager" in e.value.rule


def test_sandwich_norms_and_soft_capping_are_what_gemma2_adds(data_dir):
    """Gemma 2's two post-norms (eager RMSNorm: the fp32 input and normalised input, 2h x 4 bytes,
    and one fp32 statistic per token), the tanh of the attention soft-cap (a·s² fp32 per sequence)
    and of the final-logit soft-cap (V fp32 per token) are all the planner adds to the same
    config without them: 2 layers x (2 x 256 x 516 + 2 x 4 x 128² x 4) + 256 x 512 x 4 bytes."""
    capped = _validate(_config(data_dir, "gemma2"), "eager")
    plain = _validate(_config(data_dir, "gemma"), "eager")
    added = 2 * (2 * 256 * (2 * 64 * 4 + 4) + 2 * 4 * 128 * 128 * 4) + 256 * 512 * 4
    assert capped["predicted"]["activations_bytes"] - plain["predicted"]["activations_bytes"] == added
    measured = capped["measured"]["activations_bytes"] - plain["measured"]["activations_bytes"]
    assert abs(measured / added - 1) < 0.01


# ---- import ----------------------------------------------------------------------------------
def test_both_spellings_of_qwen3_moe_experts(data_dir):
    saved = _config(data_dir, "qwen3_moe")  # transformers 5 writes num_local_experts
    hub = {k: v for k, v in saved.items() if k != "num_local_experts"} | {"num_experts": saved["num_local_experts"]}
    assert hf.from_dict(saved).params == hf.from_dict(hub).params
    assert hf.from_dict(saved).experts == 8


def test_qwen3_moe_dense_layers(data_dir):
    """mlp_only_layers [1]: layer 1 runs a dense MLP of intermediate_size (3 x 64 x 128 weights) in
    place of 8 experts of moe_intermediate_size (8 x 3 x 64 x 32) and the router (64 x 8)."""
    with_dense = hf.from_dict(_config(data_dir, "qwen3_moe"))
    all_moe = hf.from_dict(_config(data_dir, "qwen3_moe", mlp_only_layers=[]))
    assert with_dense.moe_layer_flags == (True, False, True)
    assert with_dense.params - all_moe.params == 3 * 64 * 128 - (8 * 3 * 64 * 32 + 64 * 8)
    # decoder_sparse_step 2: the layers with (i + 1) % 2 == 0 are MoE (modeling_qwen3_moe.py)
    step = hf.from_dict(_config(data_dir, "qwen3_moe", mlp_only_layers=[], decoder_sparse_step=2))
    assert step.moe_layer_flags == (False, True, False)


@pytest.mark.parametrize("name,key,value", [
    ("gemma2", "use_bidirectional_attention", True),
    ("olmo", "clip_qkv", -1),
    ("cohere2", "use_qk_norm", True),
    ("gpt_oss", "swiglu_alpha", 1.5),
    ("gemma2", "layer_types", ["sliding_attention", "chunked_attention"]),
    ("gemma2", "layer_types", ["sliding_attention"]),
    ("gemma2", "attn_logit_softcapping", -1),
    ("qwen3_moe", "mlp_only_layers", [5]),
])
def test_keys_that_change_the_model_are_refused_by_name(data_dir, name, key, value):
    with pytest.raises(PlanError) as e:
        hf.from_dict(_config(data_dir, name, **{key: value}))
    assert e.value.field == f"hf_config.{key}"


def test_per_head_norms_and_clamps_are_counted(data_dir):
    """Command R+'s q/k LayerNorms carry a weight per head (no bias): (4 + 2) x 16 per layer;
    OLMo's clip_qkv adds no parameter."""
    cohere = hf.from_dict(_config(data_dir, "cohere"))
    plus = hf.from_dict(_config(data_dir, "cohere", use_qk_norm=True))
    assert plus.params - cohere.params == 2 * (4 + 2) * 16 and plus.qk_norm_scope == "per_head"
    clipped = hf.from_dict(_config(data_dir, "olmo", clip_qkv=8.0))
    assert clipped.clip_qkv == 8.0 and clipped.params == hf.from_dict(_config(data_dir, "olmo")).params


def test_family_features_are_read(data_dir):
    g2 = hf.from_dict(_config(data_dir, "gemma2"))
    assert (g2.norm_position, g2.attn_softcap, g2.final_softcap, g2.sliding_window, g2.sliding_layers) == (
        "sandwich", 50.0, 30.0, 32, 1)
    g3 = hf.from_dict(_config(data_dir, "gemma3_text"))
    assert g3.qk_norm and g3.attn_softcap is None and g3.sliding_layers == 2
    assert hf.from_dict(_config(data_dir, "olmo2")).qk_norm_scope == "all"
    assert hf.from_dict(_config(data_dir, "olmo")).norm_weight is False
    cohere = hf.from_dict(_config(data_dir, "cohere"))
    assert (cohere.shared_norm, cohere.norm_bias, cohere.tied_embeddings) == (True, False, True)
    oss = hf.from_dict(_config(data_dir, "gpt_oss"))
    assert (oss.attention_sinks, oss.swiglu_limit, oss.expert_bias) == (True, 7.0, True)
    assert hf.from_dict(_config(data_dir, "mistral")).sliding_window == 32
    assert hf.from_dict(_config(data_dir, "mistral", sliding_window=None)).sliding_window is None
    # Qwen3's sliding window applies only with use_sliding_window, from max_window_layers on
    q3 = hf.from_dict(_config(data_dir, "qwen3", use_sliding_window=True, sliding_window=32, max_window_layers=1,
                              layer_types=None))
    assert q3.layer_types == ("full_attention", "sliding_attention")
    # Gemma 2's default pattern (no layer_types): sliding first, alternating
    bare = {k: v for k, v in _config(data_dir, "gemma2").items() if k != "layer_types"}
    assert hf.from_dict(bare).layer_types == ("sliding_attention", "full_attention")


def test_gemma3_multimodal_config_plans_its_language_model(data_dir):
    text = _config(data_dir, "gemma3_text")
    outer = {"model_type": "gemma3", "text_config": {k: v for k, v in text.items() if k != "model_type"},
             "vision_config": {"hidden_size": 1152}}
    spec = hf.from_dict(outer)
    assert spec.params == hf.from_dict(text).params and "vision tower is not planned" in spec.source
    with pytest.raises(PlanError) as e:
        hf.from_dict({"model_type": "gemma3"})
    assert e.value.field == "hf_config.text_config"


# ---- attention work of a sliding window -------------------------------------------------------
def test_sliding_window_keys():
    """A causal query i attends min(i + 1, w) keys: averaged over s queries, w - w²/(2s) when s > w
    (4096 at s 8192, w 4096: 3072) and s/2 otherwise."""
    assert norm_features.window_keys(8192, 4096) == 3072
    assert norm_features.window_keys(2048, 4096) == 1024
    exact = sum(min(i + 1, 32) for i in range(128)) / 128  # 28.25 + the diagonal's half-block
    assert abs(norm_features.window_keys(128, 32) - exact) <= 0.5


def test_mistral_window_halves_attention_flops_at_long_context(data_dir):
    """Mistral-7B's window of 4096 at 32K tokens: causal attention work 4096 - 4096²/65536 = 3840
    keys per query against 16384 without the window."""
    cfg = json.loads((data_dir / "hf" / "mistral-7b.json").read_text())
    windowed, full = hf.from_dict(cfg), hf.from_dict({**cfg, "sliding_window": None})
    kw = dict(tokens=32768, seq=32768, dense_layers=32, moe_layers=0, head=1, attention_eager=0, recompute=0,
              causal=True)
    ratio = step_flops(windowed, **kw)["attention_forward"] / step_flops(full, **kw)["attention_forward"]
    assert ratio == pytest.approx(3840 / 16384, rel=1e-12)
    # the flop counter's convention (every key of every query) is unchanged
    kw["causal"] = False
    assert step_flops(windowed, **kw)["attention_forward"] == step_flops(full, **kw)["attention_forward"]


# ---- published configs ------------------------------------------------------------------------
HUB = {"gemma-2-9b": "eager", "gpt-oss-20b": "eager", "olmo-2-7b": "sdpa", "qwen3-8b": "sdpa", "command-r": "sdpa"}


@pytest.mark.parametrize("name", HUB)
def test_hub_config_imports_to_the_catalog_model(data_dir, name):
    """The hub's config.json (tests/data/hf) and the catalog entry (sources cited there) count the
    same parameters: gemma-2-9b 9,241,705,984, gpt-oss-20b 20,914,757,184 (the card's 20.91B)."""
    from trainplan.specs import catalog

    spec = hf.from_file(data_dir / "hf" / f"{name}.json")
    assert spec.params == catalog.model(name).params
    assert spec.active_params == catalog.model(name).active_params


@pytest.mark.parametrize("name,attention", HUB.items())
def test_hub_config_scaled_matches_transformers(data_dir, name, attention):
    """Scaled to 2 layers, hidden 256 (one sliding and one full layer where the model alternates),
    built by transformers as written. Measured: Gemma 2 9B +0.21%, gpt-oss-20b +0.31% (8 heads,
    one KV head: the eager repeat is a view), OLMo 2 7B -0.01%, Qwen3 8B -0.02%, Command R -0.02%."""
    pytest.importorskip("transformers")
    from trainplan.plan import make_plan
    from trainplan.validate.run import validate

    plan = make_plan(model=str(data_dir / "hf" / f"{name}.json"), gpus=1, precision="fp32", framework="torch",
                     attention=attention)
    (case,) = validate(plan, device="cpu", impl="transformers")["cases"]
    err = case["rel_error"]
    assert err["params_bytes"] == 0 and abs(err["activations_bytes"]) <= ACT_TOL, (name, err)
    assert abs(err["flops"]) < 1e-9
