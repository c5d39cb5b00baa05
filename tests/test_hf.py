"""Hugging Face config.json import: each supported model_type gives the catalog's exact count."""

import json

import pytest

from trainplan.errors import PlanError
from trainplan.specs import catalog, hf

CASES = ["llama-3-8b", "mistral-7b", "mixtral-8x7b", "qwen2.5-7b", "qwen1.5-moe-a2.7b",
         "qwen3-30b-a3b", "gpt2-xl", "gpt-neox-20b", "deepseek-v3"]


@pytest.mark.parametrize("name", CASES)
def test_config_json_matches_catalog(name, data_dir):
    spec = hf.from_file(data_dir / "hf" / f"{name}.json")
    ref = catalog.model(name)
    assert spec.params == ref.params
    assert spec.active_params == ref.active_params


def test_all_required_model_types_supported():
    required = {"llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3_moe", "gpt2", "gpt_neox",
                "deepseek_v3"}
    assert required <= set(hf.CONVERTERS)


def test_unknown_model_type_lists_supported():
    with pytest.raises(PlanError) as e:
        hf.from_dict({"model_type": "bert", "hidden_size": 768})
    assert e.value.field == "hf_config.model_type"
    assert "llama" in e.value.rule and "deepseek_v3" in e.value.rule


def test_missing_key_and_bad_json(tmp_path):
    with pytest.raises(PlanError) as e:
        hf.from_dict({"model_type": "llama", "hidden_size": 4096})
    assert e.value.field.startswith("hf_config.")
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(PlanError) as e:
        hf.from_file(bad)
    assert e.value.field == "model" and "not valid JSON" in e.value.rule


def test_invalid_values_are_rejected(data_dir):
    cfg = json.loads((data_dir / "hf" / "llama-3-8b.json").read_text())
    cfg["num_key_value_heads"] = 7
    with pytest.raises(PlanError) as e:
        hf.from_dict(cfg)
    assert e.value.field == "hf_config.num_key_value_heads" and "must divide num_attention_heads (32)" in e.value.rule


def test_linear_dynamic_and_longrope_scaling_are_read_by_name():
    """Gemma 3 (linear, factor 8), InternLM3 (dynamic) and Phi-3.5 (longrope, per-frequency
    factors) stretch the rotation's frequencies only: planned like the unscaled model, kept by
    name, refused by the Megatron-LM export (no flag), and an unknown type refused by name."""
    import json
    from pathlib import Path

    from trainplan.errors import PlanError
    from trainplan.export import export_plan

    base = json.loads((Path(__file__).parent / "data" / "hf_families" / "phi3.json").read_text())
    plain = hf.from_dict(base)
    for scaling, kind, factor in (({"rope_type": "linear", "factor": 8.0}, "linear", 8.0),
                                  ({"type": "dynamic", "factor": 6.0}, "dynamic", 6.0),
                                  ({"rope_type": "longrope", "short_factor": [1.0], "long_factor": [2.0],
                                    "original_max_position_embeddings": 4096}, "longrope", None)):
        spec = hf.from_dict({**base, "rope_scaling": scaling})
        assert (spec.rope_scaling.kind, spec.rope_scaling.factor) == (kind, factor)
        assert spec.params == plain.params
        with pytest.raises(PlanError) as err:
            export_plan({"hf_config": {**base, "rope_scaling": scaling}, "gpus": 8, "framework": "megatron"}, "megatron")
        assert err.value.field == "model.rope_scaling" and kind in err.value.rule
    with pytest.raises(PlanError) as err:
        hf.from_dict({**base, "rope_scaling": {"rope_type": "weird"}})
    assert err.value.field == "hf_config.rope_scaling" and "'weird'" in err.value.rule
