"""Import a Hugging Face `config.json` (a local file or an already-parsed dict; no network).

Each supported `model_type` maps the transformers configuration keys of its
`configuration_*.py` onto a ModelSpec. Defaults follow those classes' own defaults.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from pydantic import ValidationError

from ..errors import PlanError, from_pydantic
from .model import ActivationKind, ModelSpec

# Activation functions whose saved tensors are modelled (transformers' ACT2FN names).
ACTIVATIONS = ActivationKind.__args__
# config.json's `experts_implementation` (transformers 5) -> ModelSpec.experts_impl
EXPERTS_IMPLEMENTATIONS = {"grouped_mm": "grouped", "eager": "eager"}


def _activation(c: dict, key: str, default: str) -> str:
    """The config's activation function, by transformers' name; any other is refused (what
    it saves for backward would be unknown)."""
    name = c.get(key, default)
    if name not in ACTIVATIONS:
        raise PlanError(f"hf_config.{key}", f"unsupported activation function {name!r}; "
                        f"supported: {', '.join(ACTIVATIONS)}")
    return name


def _experts_impl(c: dict) -> str | None:
    """The config's `experts_implementation`, when it states one."""
    name = c.get("experts_implementation")
    if name is None:
        return None
    if name not in EXPERTS_IMPLEMENTATIONS:
        raise PlanError("hf_config.experts_implementation", f"unsupported experts implementation {name!r}; "
                        f"supported: {', '.join(EXPERTS_IMPLEMENTATIONS)}")
    return EXPERTS_IMPLEMENTATIONS[name]


def _common(c: dict) -> dict:
    return dict(
        layers=c["num_hidden_layers"],
        hidden=c["hidden_size"],
        heads=c["num_attention_heads"],
        kv_heads=c.get("num_key_value_heads") or c["num_attention_heads"],
        head_dim=c.get("head_dim"),
        ffn=c["intermediate_size"],
        vocab=c["vocab_size"],
        tied_embeddings=bool(c.get("tie_word_embeddings", False)),
        max_position=c.get("max_position_embeddings", 4096),
        mlp="swiglu",
        activation=_activation(c, "hidden_act", "silu"),  # LlamaConfig's default and the others'
        norm="rmsnorm",
        position="rotary",
    )


def _llama(c: dict) -> dict:
    d = _common(c)
    d["qkv_bias"] = bool(c.get("attention_bias", False))
    d["bias"] = bool(c.get("mlp_bias", False))
    return d


def _qwen2(c: dict) -> dict:
    return {**_common(c), "qkv_bias": True}  # Qwen2Attention always has q/k/v biases


def _qwen3(c: dict) -> dict:
    return {**_common(c), "qkv_bias": bool(c.get("attention_bias", False)), "qk_norm": True}


def _mixtral(c: dict) -> dict:
    d = _common(c)
    d.update(experts=c.get("num_local_experts", 8), top_k=c.get("num_experts_per_tok", 2),
             expert_ffn=c["intermediate_size"], experts_impl=_experts_impl(c))
    return d


def _qwen2_moe(c: dict) -> dict:
    d = _qwen2(c)
    step = c.get("decoder_sparse_step", 1)
    if c.get("mlp_only_layers"):
        raise PlanError("hf_config.mlp_only_layers", "dense-only layer lists are not supported; "
                        "use first_dense_layers in a TOML spec instead")
    d.update(experts=c["num_experts"], top_k=c["num_experts_per_tok"],
             expert_ffn=c["moe_intermediate_size"], moe_layer_freq=step, experts_impl=_experts_impl(c))
    shared = c.get("shared_expert_intermediate_size", 0)
    if shared:
        d.update(shared_experts=1, shared_expert_ffn=shared, shared_expert_gate=True)
    return d


def _qwen3_moe(c: dict) -> dict:
    d = _qwen3(c)
    d.update(experts=c["num_experts"], top_k=c["num_experts_per_tok"],
             expert_ffn=c["moe_intermediate_size"], moe_layer_freq=c.get("decoder_sparse_step", 1),
             experts_impl=_experts_impl(c))
    return d


def _deepseek_v3(c: dict) -> dict:
    d = _common(c)
    d.update(
        kv_heads=c["num_attention_heads"], head_dim=None,
        experts=c["n_routed_experts"], top_k=c["num_experts_per_tok"],
        expert_ffn=c["moe_intermediate_size"], shared_experts=c.get("n_shared_experts") or 0,
        first_dense_layers=c.get("first_k_dense_replace", 0), moe_layer_freq=c.get("moe_layer_freq", 1),
        router_bias=c.get("topk_method", "noaux_tc") == "noaux_tc",
        q_lora_rank=c.get("q_lora_rank"), kv_lora_rank=c["kv_lora_rank"],
        qk_rope_head_dim=c["qk_rope_head_dim"], qk_nope_head_dim=c["qk_nope_head_dim"],
        v_head_dim=c["v_head_dim"], experts_impl=_experts_impl(c),
    )
    return d


def _gpt2(c: dict) -> dict:
    h = c.get("n_embd", 768)
    return dict(
        layers=c.get("n_layer", 12), hidden=h, heads=c.get("n_head", 12),
        ffn=c.get("n_inner") or 4 * h, vocab=c.get("vocab_size", 50257),
        tied_embeddings=bool(c.get("tie_word_embeddings", True)),
        max_position=c.get("n_positions", 1024), mlp="gelu", norm="layernorm",
        activation=_activation(c, "activation_function", "gelu_new"),  # GPT2Config's default
        position="learned", qkv_bias=True, bias=True, fused_qkv=True,
    )


def _gpt_neox(c: dict) -> dict:
    return dict(
        layers=c["num_hidden_layers"], hidden=c["hidden_size"], heads=c["num_attention_heads"],
        ffn=c.get("intermediate_size") or 4 * c["hidden_size"], vocab=c["vocab_size"],
        tied_embeddings=bool(c.get("tie_word_embeddings", False)),
        max_position=c.get("max_position_embeddings", 2048), mlp="gelu", norm="layernorm",
        activation=_activation(c, "hidden_act", "gelu"),  # GPTNeoXConfig's defaults
        parallel_residual=bool(c.get("use_parallel_residual", True)),
        position="rotary", qkv_bias=bool(c.get("attention_bias", True)),
        bias=bool(c.get("attention_bias", True)), fused_qkv=True,
    )


CONVERTERS: dict[str, Callable[[dict], dict]] = {
    "llama": _llama,
    "mistral": _llama,
    "mixtral": _mixtral,
    "qwen2": _qwen2,
    "qwen3": _qwen3,
    "qwen2_moe": _qwen2_moe,
    "qwen3_moe": _qwen3_moe,
    "deepseek_v3": _deepseek_v3,
    "gpt2": _gpt2,
    "gpt_neox": _gpt_neox,
}


def from_dict(config: dict, name: str | None = None, source: str = "Hugging Face config.json") -> ModelSpec:
    if not isinstance(config, dict):
        raise PlanError("hf_config", "must be a JSON object (the contents of config.json)")
    model_type = config.get("model_type")
    if model_type not in CONVERTERS:
        raise PlanError("hf_config.model_type",
                        f"unsupported model_type {model_type!r}; supported: {', '.join(sorted(CONVERTERS))}")
    try:
        fields = CONVERTERS[model_type](config)
    except KeyError as exc:
        raise PlanError(f"hf_config.{exc.args[0]}", f"required for model_type {model_type!r}") from None
    except TypeError as exc:
        raise PlanError("hf_config", f"malformed {model_type} config ({exc})") from None
    fields = {k: v for k, v in fields.items() if v is not None}
    name = name or config.get("_name_or_path") or model_type
    try:
        return ModelSpec(name=str(name), source=source, family=model_type, **fields)
    except ValidationError as exc:
        raise from_pydantic(exc, "hf_config.") from None


def from_file(path: str | Path) -> ModelSpec:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PlanError("model", f"cannot read {path} ({exc.strerror or exc})") from None
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PlanError("model", f"{path} is not valid JSON (line {exc.lineno}: {exc.msg})") from None
    name = path.parent.name if path.name == "config.json" and path.parent.name else path.stem
    return from_dict(config, name=name, source=f"Hugging Face config.json at {path}")
