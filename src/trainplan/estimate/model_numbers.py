"""A model's parameter counts as the memory model and the step time read them: each layer's
parameters by kind (split by tensor parallelism, replicated, key/value heads, experts) and
what one rank holds (`stage_memory` in memory.py, `stage_times` in stage.py)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ..specs.model import Linear, ModelSpec
from . import activations as act
from .flops import ATTENTION_INPUTS
from .memo import cached_hash, track
from .scalars import minimum


@dataclass(frozen=True)
class LayerParams:
    """Parameters of one layer grouped by how they are split across ranks."""

    split: float = 0  # divided by tp (column/row-parallel weights, column biases)
    kv: float = 0  # K/V projections: divided by min(tp, kv_heads)
    rep: float = 0  # replicated: norms, row-parallel biases, router
    expert: float = 0  # routed experts: divided by ep x tp
    factored_rep: float = 0  # Adafactor row+column state elements (not split)
    factored_split: float = 0  # ... split by tp
    lora: float = 0  # LoRA adapter parameters (split by tp)
    lora_input_a: float = 0  # ... the A matrices of those on the attention's input projections
    lora_factored: float = 0  # Adafactor's row+column state of the adapters (A: in + r, B: r + out)


def _group(linears: list[Linear], vectors: int, kv_heads: int, lora_targets, lora_rank) -> LayerParams:
    g = dict(split=0.0, kv=0.0, rep=float(vectors), expert=0.0, factored_rep=float(vectors),
             factored_split=0.0, lora=0.0, lora_input_a=0.0, lora_factored=0.0)
    for lin in linears:
        w = lin.count * lin.fan_in * lin.fan_out
        b = lin.count * lin.fan_out if lin.bias else 0
        if lin.expert:
            g["expert"] += w + b
        elif lin.tp == "kv":
            g["kv"] += w + b
        elif lin.tp == "none":
            g["rep"] += w + b
        else:
            g["split"] += w + (b if lin.tp == "col" else 0)
            g["rep"] += b if lin.tp == "row" else 0
        # Adafactor: one row and one column vector per matrix; TP splits one of them.
        kept, split = (lin.fan_in, lin.fan_out) if lin.tp in ("col", "kv") else (lin.fan_out, lin.fan_in)
        if lin.tp == "none":
            kept, split = lin.fan_in + lin.fan_out, 0
        g["factored_rep"] += lin.count * kept + b
        g["factored_split"] += lin.count * split
        if lin.name in lora_targets:
            g["lora"] += lin.count * lora_rank * (lin.fan_in + lin.fan_out)
            g["lora_input_a"] += lin.count * lora_rank * lin.fan_in * (lin.name in ATTENTION_INPUTS)
            g["lora_factored"] += lin.count * (lin.fan_in + lin.fan_out + 2 * lora_rank)
    return LayerParams(**g)


@dataclass(frozen=True)
class ModelNumbers:
    dense: LayerParams
    moe: LayerParams
    shape: act.LayerShape
    kv_heads: int
    hidden: int
    position_params: int  # learned position embedding (replicated)
    norm_params: int  # final norm
    rope_dim: int  # rotary dimension per head (0 without RoPE)
    tied: bool
    layernorm: bool
    head_bias: bool = False  # a bias on the output head (vocabulary-parallel like its matrix)

    def __hash__(self) -> int:  # the memoised parameter figures key on it: hashed once
        return cached_hash(self)


@track
@lru_cache(maxsize=256)
def model_numbers(model: ModelSpec, lora_targets: tuple = (), lora_rank: int = 0) -> ModelNumbers:
    dense_i, moe_i = model.first_layer(False), model.first_layer(True)
    kvh = model.heads if model.is_mla else model.n_kv_heads

    def group(i):
        if i is None:
            return LayerParams()
        return _group(model.layer_linears(i), model.layer_vector_params(i), kvh, lora_targets, lora_rank)

    latent = 0
    if model.is_mla:
        latent = (model.q_lora_rank or 0) + model.kv_lora_rank + model.qk_rope_head_dim
    shared_ffn = model.shared_ffn_total
    shape = act.LayerShape(
        hidden=model.hidden, heads=model.heads, kv_heads=kvh, q=model.q_dim, k=model.kv_dim,
        v=model.v_dim, attn_out=model.attn_out_dim, latent=latent, ffn=model.ffn,
        mlp_matrices=model.mlp_matrices, layernorm=model.norm == "layernorm",
        experts=model.experts, top_k=model.top_k, expert_ffn=model.expert_ffn or model.ffn,
        shared_ffn=shared_ffn, shared_gate=bool(model.shared_expert_gate and model.shared_experts),
        capacity_factor=model.capacity_factor or 1.0,
        # MLA: the query's (down-)projection and the KV down-projection read the attention input
        qkv_projections=2 if model.is_mla else 1 if model.fused_qkv else 3,
        rotary=model.position == "rotary",
        rope_concat=model.position == "rotary" and not model.is_mla and model.rope_concat,
        activation_saves=(act.CLAMPED_SWIGLU_SAVES if model.swiglu_limit else act.ACTIVATION_SAVES[model.activation]),
        parallel_residual=model.parallel_residual, shared_norm=model.shared_norm,
        grouped_experts=(model.experts_impl or act.DEFAULT_EXPERTS_IMPL) == "grouped",
        qk_norm=model.qk_norm, head_dim=0 if model.is_mla else model.dim_head,
        latent_rope=model.qk_rope_head_dim if model.is_mla else 0,
        latent_norms=(1 + bool(model.q_lora_rank)) if model.is_mla else 0,
        post_norms=2 if model.norm_position == "sandwich" else 0,
        python_layernorm=model.family in ("cohere", "cohere2"), qk_norm_all=model.qk_norm_scope == "all",
        attn_softcap=model.attn_softcap is not None, final_softcap=model.final_softcap is not None,
        sliding_share=model.sliding_share, sliding_window=model.sliding_window or 0,
        attention_sinks=model.attention_sinks, clip_qkv=model.clip_qkv is not None,
        kv_repeat_view=not model.kv_broadcast,
    )
    return ModelNumbers(
        dense=group(dense_i), moe=group(moe_i), shape=shape, kv_heads=kvh, hidden=model.hidden,
        position_params=model.max_position * model.hidden if model.position == "learned" else 0,
        norm_params=model.final_norm_params,
        tied=model.tied_embeddings, layernorm=model.norm == "layernorm",
        rope_dim=model.rotary_dim, head_bias=model.head_bias,
    )


def _per_rank(lp: LayerParams, tp, ep, kv_heads):
    """(dense part, expert part) of one layer's parameters held by one rank."""
    dense = lp.split / tp + lp.kv / minimum(tp, kv_heads) + lp.rep
    return dense, lp.expert / (ep * tp)


def layer_matrix_params(lp: LayerParams, tp, ep, kv_heads):
    """One layer's weight matrices held by one rank (its linears, experts included; no norms or
    biases a rank replicates): what QLoRA quantizes."""
    dense, expert = _per_rank(lp, tp, ep, kv_heads)
    return dense - lp.rep + expert
