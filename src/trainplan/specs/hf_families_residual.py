"""config.json mappings of the families with partial rotary, parallel residuals and their own
bias layouts: Phi, Phi-3, PhiMoE, DeepSeek-V2, StableLM, Falcon, Granite, GraniteMoE, GLM,
GLM-4, StarCoder2, GPT-J, GPT-NeoX and InternLM3.

One function per `model_type`, each from that family's `configuration_*.py` and
`modeling_*.py` in transformers 5.24 (their defaults where a key is absent). Keys are read in
both spellings: as transformers 5 saves them (`rope_parameters.partial_rotary_factor`) and as
hub configs carry them (`partial_rotary_factor`, `rotary_pct`, `rotary_dim`). A key that would
change the model in a way not modelled is refused by name (`refuse`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from ..errors import PlanError


def refuse(c: dict, key: str, modelled, why: str) -> None:
    """Refuse `key` unless it is absent or holds `modelled` (a value, or a tuple of values)."""
    allowed = modelled if isinstance(modelled, tuple) else (modelled,)
    if key in c and c[key] not in allowed:
        raise PlanError(f"hf_config.{key}", f"{c[key]!r:.60} is not modelled ({why}); "
                        f"supported: {' or '.join(repr(a) for a in allowed)}")


def rotary_fraction(c: dict, default: float = 1.0, *, head_dim: int | None = None) -> float:
    """The share of each head RoPE rotates: `partial_rotary_factor` (top level, hub configs, or
    inside `rope_parameters`, transformers 5), GPT-NeoX's `rotary_pct`, GPT-J's `rotary_dim`
    (a width, given `head_dim`)."""
    rope = c.get("rope_parameters") if isinstance(c.get("rope_parameters"), dict) else {}
    for key, value in (("partial_rotary_factor", c.get("partial_rotary_factor")), ("rotary_pct", c.get("rotary_pct")),
                       ("rope_parameters.partial_rotary_factor", rope.get("partial_rotary_factor"))):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not (
                math.isfinite(value) and 0 < value <= 1):
            raise PlanError(f"hf_config.{key}", f"must be a number in (0, 1] (got {value!r:.60})")
        return float(value)
    dim = c.get("rotary_dim")
    if dim is not None and head_dim:
        if isinstance(dim, bool) or not isinstance(dim, int) or not 2 <= dim <= head_dim or dim % 2:
            raise PlanError("hf_config.rotary_dim", f"must be an even integer from 2 to the head width {head_dim} "
                            f"(got {dim!r:.60})")
        return dim / head_dim
    return default


def _sliding_window(c: dict, d: dict) -> None:
    """A sliding window that every sequence fits in changes nothing; a shorter one is the
    sliding-window attention ModelSpec models where it has `sliding_window`."""
    from .model import ModelSpec

    window = c.get("sliding_window")
    if window is None:
        return
    if "sliding_window" in ModelSpec.model_fields:
        d["sliding_window"] = window
        return
    if isinstance(window, int) and window >= d.get("max_position", 0):
        return
    raise PlanError("hf_config.sliding_window", f"a window ({window!r:.60}) shorter than max_position_embeddings "
                    "is not modelled for this family; remove it to plan full attention")


def _base(c: dict, *, act_default: str = "silu", head_dim: int | None = None) -> dict:
    from .hf import _activation

    return dict(
        layers=c["num_hidden_layers"], hidden=c["hidden_size"], heads=c["num_attention_heads"],
        kv_heads=c.get("num_key_value_heads") or c["num_attention_heads"], head_dim=head_dim,
        ffn=c["intermediate_size"], vocab=c["vocab_size"],
        tied_embeddings=bool(c.get("tie_word_embeddings", False)),
        max_position=c.get("max_position_embeddings", 4096), mlp="swiglu",
        activation=_activation(c, "hidden_act", act_default), norm="rmsnorm", position="rotary",
    )


def _head(c: dict, d: dict) -> int:
    return c.get("head_dim") or d["hidden"] // d["heads"]


# ---- Phi family ------------------------------------------------------------------------
def phi(c: dict) -> dict:
    """PhiForCausalLM (phi-1/1.5/2): one LayerNorm feeding attention and MLP in parallel, biases
    on every linear and on the output head, gelu_new, partial rotary (0.5 by default)."""
    refuse(c, "qk_layernorm", False, "Phi's per-head LayerNorm on q and k")
    d = _base(c, act_default="gelu_new")
    d.update(mlp="gelu", norm="layernorm", qkv_bias=True, bias=True, parallel_residual=True, shared_norm=True,
             head_bias=True, rotary_fraction=rotary_fraction(c, 0.5), rope_concat=True)
    return d


def phi3(c: dict) -> dict:
    """Phi3ForCausalLM (Phi-3, Phi-3.5, Phi-4): Llama's layer with a fused qkv_proj and a fused
    gate_up_proj (the same weights and saved tensors as separate ones), no biases, optional
    partial rotary (Phi-4-mini 0.75); longrope scaling changes the tables' values only."""
    d = _base(c)
    d.update(fused_qkv=True, rotary_fraction=rotary_fraction(c, 1.0), rope_concat=True)
    _sliding_window(c, d)
    return d


def phimoe(c: dict) -> dict:
    """PhimoeForCausalLM (Phi-3.5-MoE): Mixtral's experts, LayerNorms, `attention_bias` on all
    four attention linears, `lm_head_bias`."""
    from .hf import _experts_impl

    refuse(c, "input_jitter_noise", (0, 0.0), "input jitter multiplies the MoE input by noise in training")
    d = _base(c)
    bias = bool(c.get("attention_bias", False))
    d.update(norm="layernorm", qkv_bias=bias, bias=bias, mlp_bias=False, head_bias=bool(c.get("lm_head_bias", False)),
             experts=c.get("num_local_experts", 16), top_k=c.get("num_experts_per_tok", 2),
             expert_ffn=c["intermediate_size"], experts_impl=_experts_impl(c))
    _sliding_window(c, d)
    return d


# ---- DeepSeek-V2 -----------------------------------------------------------------------
def deepseek_v2(c: dict) -> dict:
    """DeepseekV2ForCausalLM: MLA (with or without a query latent: V2-Lite has none), shared
    experts, dense-first layers; greedy or group-limited routing, no score-correction bias."""
    from .hf import _deepseek_v3

    refuse(c, "attention_bias", False, "biases on MLA's down-projections")
    refuse(c, "mlp_bias", False, "biases on the MLP linears")
    refuse(c, "topk_method", ("greedy", "group_limited_greedy"), "DeepSeek-V2's routing")
    d = _deepseek_v3({**c, "topk_method": "greedy"})
    d["router_bias"] = False
    return d


# ---- StableLM, Falcon ------------------------------------------------------------------
def stablelm(c: dict) -> dict:
    """StableLmForCausalLM: LayerNorms, q/k/v biases (`use_qkv_bias`), partial rotary (0.25 by
    default), optionally GPT-NeoX's parallel residual (one norm: input_layernorm feeds both)."""
    refuse(c, "qk_layernorm", False, "StableLM's per-head LayerNorms on q and k")
    d = _base(c)
    parallel = bool(c.get("use_parallel_residual", False))
    d.update(norm="layernorm", qkv_bias=bool(c.get("use_qkv_bias", False)), parallel_residual=parallel,
             shared_norm=parallel, rotary_fraction=rotary_fraction(c, 0.25), rope_concat=True)
    return d


def falcon(c: dict) -> dict:
    """FalconForCausalLM: fused query_key_value, LayerNorms, GELU MLP; `parallel_attn` with one
    norm (Falcon-7B) or, with `new_decoder_architecture`, two (Falcon-40B/180B: ln_attn, ln_mlp);
    `multi_query` (one KV head) unless the new architecture's `num_kv_heads`; `bias` on every
    linear."""
    from .hf import _activation

    refuse(c, "alibi", False, "ALiBi positions")
    h, heads = c.get("hidden_size", 4544), c.get("num_attention_heads", 71)
    new = bool(c.get("new_decoder_architecture", False))
    parallel = bool(c.get("parallel_attn", True))
    if new:
        kv = c.get("num_kv_heads") or heads
        norms = c.get("num_ln_in_parallel_attn") or 2
        refuse(c, "num_ln_in_parallel_attn", (1, 2), "one or two norms before attention and MLP")
        parallel = True  # the new architecture always adds attention and MLP to the same residual
    else:
        kv = 1 if c.get("multi_query", True) else (c.get("num_kv_heads") or heads)
        norms = 1 if parallel else 2
    bias = bool(c.get("bias", False))
    return dict(
        layers=c.get("num_hidden_layers", 32), hidden=h, heads=heads, kv_heads=kv,
        ffn=c.get("ffn_hidden_size") or 4 * h, vocab=c.get("vocab_size", 65024),
        tied_embeddings=bool(c.get("tie_word_embeddings", True)),
        max_position=c.get("max_position_embeddings", 2048), mlp="gelu",
        activation=_activation(c, "activation", "gelu"), norm="layernorm", position="rotary",
        qkv_bias=bias, bias=bias, fused_qkv=True, parallel_residual=parallel,
        shared_norm=parallel and norms == 1, kv_broadcast=not new and kv < heads,
    )


# ---- Granite ---------------------------------------------------------------------------
GRANITE_MULTIPLIERS = ("embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling")


def _check_multipliers(c: dict) -> None:
    """Granite's scalar multipliers scale the embeddings, each block's output, the attention
    scores and the logits: products with a Python number, which keep nothing for backward and
    change no shape. Read, checked, and otherwise without effect on memory or time."""
    for key in GRANITE_MULTIPLIERS:
        value = c.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                  or not math.isfinite(value) or value == 0):
            raise PlanError(f"hf_config.{key}", f"must be a finite nonzero number (got {value!r:.60})")


def granite(c: dict) -> dict:
    """GraniteForCausalLM: Llama's layer with scalar multipliers (no effect on shapes or memory)."""
    _check_multipliers(c)
    d = _base(c)
    d.update(qkv_bias=bool(c.get("attention_bias", False)), bias=bool(c.get("attention_bias", False)),
             mlp_bias=bool(c.get("mlp_bias", False)))
    return d


def granitemoe(c: dict) -> dict:
    """GraniteMoeForCausalLM: Granite's attention and multipliers, Mixtral-like routed experts
    (fused gate_up), a bias-free router."""
    from .hf import _experts_impl

    _check_multipliers(c)
    d = _base(c)
    bias = bool(c.get("attention_bias", False))
    d.update(qkv_bias=bias, bias=bias, mlp_bias=False, experts=c.get("num_local_experts", 8),
             top_k=c.get("num_experts_per_tok", 2), expert_ffn=c["intermediate_size"], experts_impl=_experts_impl(c))
    return d


# ---- GLM -------------------------------------------------------------------------------
def glm(c: dict) -> dict:
    """GlmForCausalLM (GLM-4-9B-chat-hf): q/k/v biases (`attention_bias`), fused gate_up_proj,
    RMSNorms, interleaved partial rotary (0.5 by default)."""
    d = _base(c)
    d.update(head_dim=c.get("head_dim", 128), qkv_bias=bool(c.get("attention_bias", True)),
             rotary_fraction=rotary_fraction(c, 0.5), rope_concat=True, rope_interleaved=True)
    return d


def glm4(c: dict) -> dict:
    """Glm4ForCausalLM (GLM-4-9B-0414, GLM-Z1): GLM's layer with sandwich norms, an RMSNorm after
    the attention (post_self_attn_layernorm) and after the MLP (post_mlp_layernorm) besides the
    two before them (transformers modeling_glm4.py Glm4DecoderLayer)."""
    d = glm(c)
    d.update(norm_position="sandwich")
    return d


# ---- StarCoder2, GPT-J, InternLM3 ---------------------------------------------------------
def starcoder2(c: dict) -> dict:
    """Starcoder2ForCausalLM: LayerNorms, a GELU MLP (c_fc, c_proj), `use_bias` on every linear."""
    d = _base(c, act_default="gelu_pytorch_tanh")
    bias = bool(c.get("use_bias", True))
    d.update(mlp="gelu", norm="layernorm", qkv_bias=bias, bias=bias, tied_embeddings=bool(c.get(
        "tie_word_embeddings", True)))
    _sliding_window(c, d)
    return d


def gptj(c: dict) -> dict:
    """GPTJForCausalLM: one LayerNorm (ln_1) feeding attention and MLP in parallel, no attention
    biases, MLP and output-head biases, gelu_new, interleaved rotary on `rotary_dim` of each head."""
    from .hf import _activation

    h, heads = c.get("n_embd", 4096), c.get("n_head", 16)
    head_dim = h // heads if heads and h % heads == 0 else None
    return dict(
        layers=c.get("n_layer", 28), hidden=h, heads=heads, ffn=c.get("n_inner") or 4 * h,
        vocab=c.get("vocab_size", 50400), tied_embeddings=bool(c.get("tie_word_embeddings", False)),
        max_position=c.get("n_positions", 2048), mlp="gelu", norm="layernorm", position="rotary",
        activation=_activation(c, "activation_function", "gelu_new"), qkv_bias=False, bias=False, mlp_bias=True,
        head_bias=True, parallel_residual=True, shared_norm=True, rope_interleaved=True,
        rotary_fraction=rotary_fraction(c, 1.0, head_dim=head_dim) if c.get("rotary_dim") is not None else 1.0,
    )


def internlm3(c: dict) -> dict:
    """InternLM3 (configuration_internlm3.py; modelled on Llama's layer): `qkv_bias` / `bias`
    (transformers 5: attention_bias / mlp_bias) must agree and cover q, k, v and o."""
    d = _base(c)
    bias = bool(c.get("attention_bias", c.get("qkv_bias", False)))
    d.update(head_dim=c.get("head_dim"), qkv_bias=bias, bias=bias, mlp_bias=bool(c.get("mlp_bias", c.get("bias", False))))
    return d


CONVERTERS: dict[str, Callable[[dict], dict]] = {
    "phi": phi, "phi3": phi3, "phimoe": phimoe, "deepseek_v2": deepseek_v2, "stablelm": stablelm,
    "falcon": falcon, "granite": granite, "granitemoe": granitemoe, "glm": glm, "glm4": glm4, "starcoder2": starcoder2,
    "gptj": gptj, "internlm3": internlm3,
}
