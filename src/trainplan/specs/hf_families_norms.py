"""config.json import for the families defined by their norms, attention masks and soft-capping:
Gemma, Gemma 2, Gemma 3, OLMo, OLMo 2, OLMoE, Cohere (Command R), Cohere 2, gpt-oss, and the
sliding windows of Mistral and Qwen3 and Qwen3-MoE's dense layers.

Each converter takes the config (nulls already dropped) and the fields every Llama-like family
shares (`specs.hf._common`), and returns ModelSpec fields. Keys and defaults are those of
transformers 5's `configuration_<family>.py`; a key is read in both spellings where transformers 5
saves it differently from the hub (Qwen3-MoE's `num_local_experts` / `num_experts`). A key that
changes the model in a way not modelled is refused by name (`_refuse`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from ..errors import PlanError
from .model import LayerType

LAYER_TYPES = LayerType.__args__


def _refuse(c: dict, key: str, allowed: tuple, why: str) -> None:
    """A key whose value changes the model in a way the planner does not model."""
    if key in c and c[key] not in allowed:
        raise PlanError(f"hf_config.{key}", f"{c[key]!r:.60} is not supported ({why}); "
                        f"supported: {', '.join(repr(a) for a in allowed)}")


def _number(c: dict, key: str, default: float | None) -> float | None:
    """A positive number (a soft-cap, a clamp limit), or None where the family has none."""
    value = c.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise PlanError(f"hf_config.{key}", f"must be a positive number or null (got {value!r:.60})")
    return float(value)


def _int(c: dict, key: str, default: int | None, low: int = 1) -> int | None:
    value = c.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= 100_000_000:
        raise PlanError(f"hf_config.{key}", f"must be an integer from {low:,} to 100,000,000 (got {value!r:.60})")
    return value


def _flag(c: dict, key: str, default: bool) -> bool:
    value = c.get(key, default)
    if not isinstance(value, bool):
        raise PlanError(f"hf_config.{key}", f"must be true or false (got {value!r:.60})")
    return value


def layer_types(c: dict, layers: int, default: Callable[[int], str]) -> tuple[str, ...]:
    """`layer_types` as written (one attention type per layer), else the family's pattern."""
    given = c.get("layer_types")
    if given is None:
        return tuple(default(i) for i in range(layers))
    if not isinstance(given, list) or len(given) != layers:
        raise PlanError("hf_config.layer_types", f"must list one attention type per layer ({layers} layers)")
    for t in given:
        if t not in LAYER_TYPES:
            raise PlanError("hf_config.layer_types", f"attention type {t!r:.60} is not supported; "
                            f"supported: {', '.join(LAYER_TYPES)}")
    return tuple(given)


def _every(n: int) -> Callable[[int], str]:
    """Sliding layers with a full-attention layer every n-th (transformers' default patterns)."""
    return lambda i: "full_attention" if (i + 1) % n == 0 else "sliding_attention"


def _windowed(d: dict, c: dict, window_default: int | None, pattern: Callable[[int], str]) -> dict:
    """Sliding window and local/global pattern; a model without a window attends fully."""
    window = _int(c, "sliding_window", window_default)
    types = layer_types(c, d["layers"], pattern)
    if window is None:
        if any(t == "sliding_attention" for t in types):
            raise PlanError("hf_config.sliding_window", "sliding_attention layers need a sliding_window")
        return d
    return {**d, "sliding_window": window, "layer_types": types}


# ---- Gemma -------------------------------------------------------------------------------
def _gemma_activation(c: dict, key: str, activation) -> str:
    # GemmaConfig maps the legacy "gelu" to the tanh approximation the checkpoints were trained with
    if c.get(key) == "gelu":
        return "gelu_pytorch_tanh"
    return activation(c, key, "gelu_pytorch_tanh")


def _no_bidirectional(c: dict) -> None:
    _refuse(c, "use_bidirectional_attention", (False,), "bidirectional attention is not a causal LM")


def gemma(c: dict, base: dict, activation) -> dict:
    """GemmaForCausalLM: RMSNorm x·(1 + w), GeGLU (tanh), tied embeddings, head_dim 256 unless given."""
    _no_bidirectional(c)
    return {**base, "activation": _gemma_activation(c, "hidden_act", activation),
            "head_dim": _int(c, "head_dim", 256), "tied_embeddings": _flag(c, "tie_word_embeddings", True),
            "qkv_bias": _flag(c, "attention_bias", False), "bias": _flag(c, "attention_bias", False)}


def gemma2(c: dict, base: dict, activation) -> dict:
    """Gemma 2: sandwich norms, attention and final-logit soft-capping, alternating sliding and
    full attention (Gemma2Config: layer 0 sliding)."""
    d = gemma(c, base, activation)
    d.update(activation=_gemma_activation(c, "hidden_activation", activation), norm_position="sandwich",
             attn_softcap=_number(c, "attn_logit_softcapping", 50.0),
             final_softcap=_number(c, "final_logit_softcapping", 30.0))
    return _windowed(d, c, 4096, _every(2))


def gemma3_text(c: dict, base: dict, activation) -> dict:
    """Gemma 3's language model: Gemma 2's layout with per-head q/k RMSNorms, five sliding layers
    to a full one, no soft-capping unless stated."""
    d = gemma(c, base, activation)
    d.update(activation=_gemma_activation(c, "hidden_activation", activation), norm_position="sandwich",
             qk_norm=True, attn_softcap=_number(c, "attn_logit_softcapping", None),
             final_softcap=_number(c, "final_logit_softcapping", None))
    return _windowed(d, c, 4096, _every(_int(c, "sliding_window_pattern", None)
                                         or _int(c, "_sliding_window_pattern", 6)))


# ---- OLMo ---------------------------------------------------------------------------------
def olmo(c: dict, base: dict, activation) -> dict:
    """OLMo: LayerNorm without weight or bias (OlmoLayerNorm), pre-norm, SwiGLU, q/k/v clamped
    to ±clip_qkv where given."""
    return {**base, "norm": "layernorm", "norm_weight": False, "clip_qkv": _number(c, "clip_qkv", None),
            "qkv_bias": _flag(c, "attention_bias", False),
            "bias": _flag(c, "attention_bias", False)}


def olmo2(c: dict, base: dict, activation) -> dict:
    """OLMo 2: norms after attention and after the MLP (none before), RMSNorm over all heads of q and k."""
    return {**base, "norm_position": "post", "qk_norm": True, "qk_norm_scope": "all",
            "qkv_bias": _flag(c, "attention_bias", False), "bias": _flag(c, "attention_bias", False)}


def olmoe(c: dict, base: dict, activation) -> dict:
    """OLMoE: pre-norm, RMSNorm over all heads of q and k, routed experts without shared ones."""
    return {**base, "qk_norm": True, "qk_norm_scope": "all", "clip_qkv": _number(c, "clip_qkv", None),
            "qkv_bias": _flag(c, "attention_bias", False),
            "experts": _int(c, "num_experts", 64), "top_k": _int(c, "num_experts_per_tok", 8),
            "expert_ffn": base["ffn"]}


# ---- Cohere -------------------------------------------------------------------------------
def cohere(c: dict, base: dict, activation) -> dict:
    """Command R: one LayerNorm without bias feeding attention and MLP in parallel, tied embeddings;
    with `use_qk_norm` (Command R+) a LayerNorm over each head of q and k, a weight per head."""
    qk = _flag(c, "use_qk_norm", False)
    return {**base, "norm": "layernorm", "norm_bias": False, "shared_norm": True, "parallel_residual": True,
            "qk_norm": qk, "qk_norm_scope": "per_head" if qk else "head",
            "tied_embeddings": _flag(c, "tie_word_embeddings", True),
            "qkv_bias": _flag(c, "attention_bias", False), "bias": _flag(c, "attention_bias", False)}


def cohere2(c: dict, base: dict, activation) -> dict:
    """Command R7B / A: Cohere's layer (no q/k norms) with three sliding layers to a full one."""
    _refuse(c, "use_qk_norm", (False,), "Cohere 2's attention has no q/k norms")
    return _windowed(cohere(c, base, activation), c, 4096, _every(_int(c, "sliding_window_pattern", 4)))


# ---- gpt-oss ------------------------------------------------------------------------------
def gpt_oss(c: dict, base: dict, activation) -> dict:
    """gpt-oss: attention sinks, alternating sliding (128) and full attention, routed experts with
    biases and a clamped SwiGLU, a router with a bias."""
    alpha = _number(c, "swiglu_alpha", 1.702)
    if alpha != 1.702:
        raise PlanError("hf_config.swiglu_alpha", f"{alpha} is not supported (gpt-oss's 1.702 is modelled)")
    bias = _flag(c, "attention_bias", True)
    d = {**base, "qkv_bias": bias, "bias": bias, "attention_sinks": True, "expert_bias": True,
         "swiglu_limit": _number(c, "swiglu_limit", 7.0), "head_dim": _int(c, "head_dim", 64),
         "experts": _int(c, "num_local_experts", 128), "top_k": _int(c, "num_experts_per_tok", 4),
         "expert_ffn": base["ffn"]}
    return _windowed(d, c, 128, _every(2))


# ---- sliding windows of Llama-like families; Qwen3-MoE's dense layers ------------------------
def mistral(c: dict, base: dict, activation) -> dict:
    """Mistral: Llama's layer; `sliding_window` (MistralConfig's default 4096) on every layer."""
    d = {**base, "qkv_bias": _flag(c, "attention_bias", False), "bias": _flag(c, "mlp_bias", False),
         "head_dim": _int(c, "head_dim", None)}
    window = _int(c, "sliding_window", 4096)
    return {**d, "sliding_window": window} if window is not None else d


def qwen3(c: dict, base: dict, activation) -> dict:
    """Qwen3: per-head q/k RMSNorms; with `use_sliding_window`, the layers from
    `max_window_layers` on slide (Qwen3Config)."""
    d = {**base, "qkv_bias": _flag(c, "attention_bias", False), "qk_norm": True}
    if not _flag(c, "use_sliding_window", False):
        if any(t == "sliding_attention" for t in c.get("layer_types") or ()):
            raise PlanError("hf_config.layer_types", "sliding_attention layers need use_sliding_window true")
        return d
    first = _int(c, "max_window_layers", 28, low=0)
    return _windowed(d, c, 4096, lambda i: "sliding_attention" if i >= first else "full_attention")


def sparse_layers(c: dict, layers: int, experts_key: str) -> dict:
    """Qwen-MoE's MoE layers: every `decoder_sparse_step`-th ((i + 1) % step == 0) not listed in
    `mlp_only_layers` (modeling_qwen3_moe.py); the others run a dense MLP of intermediate_size."""
    step = _int(c, "decoder_sparse_step", 1)
    only = c.get("mlp_only_layers") or []
    if not isinstance(only, list) or any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < layers
                                         for i in only):
        raise PlanError("hf_config.mlp_only_layers", f"must list layer indices from 0 to {layers - 1}")
    dense = sorted(set(only) | {i for i in range(layers) if (i + 1) % step})
    if len(dense) == layers:
        raise PlanError("hf_config.mlp_only_layers", "leaves no MoE layer (every layer is dense)")
    experts = c.get("num_local_experts", c.get(experts_key))
    if experts is None:
        raise PlanError("hf_config.num_experts", "required (or num_local_experts, as transformers 5 saves it)")
    return {"experts": experts, "mlp_only_layers": tuple(dense), "moe_layer_freq": 1}


def qwen3_moe(c: dict, base: dict, activation) -> dict:
    d = qwen3(c, base, activation)
    d.update(top_k=c["num_experts_per_tok"], expert_ffn=c["moe_intermediate_size"],
             **sparse_layers(c, d["layers"], "num_experts"))
    return d


# model_type -> converter(config, common fields, activation reader)
FAMILIES = {
    "gemma": gemma, "gemma2": gemma2, "gemma3_text": gemma3_text,
    "olmo": olmo, "olmo2": olmo2, "olmoe": olmoe,
    "cohere": cohere, "cohere2": cohere2, "gpt_oss": gpt_oss,
    "mistral": mistral, "qwen3": qwen3, "qwen3_moe": qwen3_moe,
}
# config.json keys whose integers these families read (checked like specs.hf.FIELD_RANGES)
# (a sliding_window of 0 is no window, read as null by specs.hf.from_dict)
FIELD_RANGES = {"sliding_window": (0, 100_000_000), "max_window_layers": (0, 100_000),
                "sliding_window_pattern": (1, 100_000)}
FLAGS = ("use_sliding_window", "use_qk_norm", "use_bidirectional_attention")
# keys whose null turns a feature off rather than meaning the class's default (MistralConfig's
# sliding_window defaults to 4096, Mistral-7B-v0.3 writes null: no window)
NULL_IS_OFF = ("sliding_window", "attn_logit_softcapping", "final_logit_softcapping")

# Multimodal configs whose language model is one of these families: its config, nested
MULTIMODAL = {"gemma3": ("text_config", "gemma3_text")}


def language_model(c: dict, source: str) -> tuple[dict, str]:
    """A multimodal config (Gemma 3's `gemma3`) planned as its language model, `text_config`; the
    source says the vision tower is left out. Other configs pass through."""
    if not isinstance(c.get("model_type"), str) or c["model_type"] not in MULTIMODAL:
        return c, source
    key, kind = MULTIMODAL[c["model_type"]]
    text = c.get(key)
    if not isinstance(text, dict):
        raise PlanError(f"hf_config.{key}", f"required for model_type {c['model_type']!r} (its language model)")
    inner = {"model_type": kind, **text}
    for k in ("_name_or_path", "tie_word_embeddings"):  # stated on the outer config
        if k in c and k not in text:
            inner[k] = c[k]
    return inner, f"{source} (language model: {key}; the vision tower is not planned)"
