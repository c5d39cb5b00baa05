"""Per-GPU training memory, per pipeline stage (DESIGN §3).

    total = weights + gradients + (master weights + optimizer state)
          + activations (saved for backward, x in-flight micro-batches of the schedule)
          + other (ZeRO-3 gathered units, communication buckets, loss workspace,
                   runtime reserve and allocator fragmentation)

`stage_memory` is the one formula: it takes numbers or numpy arrays (stages, or whole
batches of layouts for search) and returns arrays. `estimate_memory` feeds it a resolved
Layout, one array element per pipeline stage.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..plan import Layout, conventions
from ..specs.model import LORA_TARGETS, Linear, ModelSpec
from ..units import GiB
from . import activations as act
from . import norm_features
from .flops import ATTENTION_INPUTS
from .memo import Memo, array_key, cached_hash, fresh_copy, read_only, track
from .pipeline import (
    SCHEDULE_CODE,
    in_flight,
    last_stage_heads_in_flight,
    last_stage_logits_in_flight,
    rules_version,
)
from .recipe import Recipe, recipe
from .scalars import any_, bools, floats, maximum, minimum, values, where
from .torch_schedules import V_SHAPED

FP32 = 4


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


def held(mn: ModelNumbers, r: Recipe, *, dense_layers, moe_layers, first, last, tp, cp, ep, dp, zero, dp_shard,
         lora, offload_optimizer, offload_params, pp, vocab_padded) -> dict:
    """The parameters a stage's rank holds and their bytes (`stage_memory`'s weights, gradients,
    master copy and optimizer state, and what it derives them from); one layout's memoised
    (scalars, or a few stages: read-only figures)."""
    args = (mn, r, dense_layers, moe_layers, first, last, tp, cp, ep, dp, zero, dp_shard, lora, offload_optimizer,
            offload_params, pp, vocab_padded)
    key = _memo_key(args)
    out = _HELD.get(key) if key is not None else None
    if out is None:
        out = _held(*args)
        if key is not None:
            for v in out.values():
                if v.__class__ is np.ndarray:
                    v.flags.writeable = False
            if len(_HELD) >= _HELD_MAX:
                _HELD.clear()
            _HELD[key] = out
    return out


_HELD: dict = track({})
_HELD_MAX = 256


_memo_key = array_key  # (an array of at most 64 entries: one layout's stages)


def _held(mn, r, dense_layers, moe_layers, first, last, tp, cp, ep, dp, zero, dp_shard, lora, offload_optimizer,
          offload_params, pp, vocab_padded) -> dict:
    h = mn.hidden
    # ---- parameters held by this rank
    d_dense, d_exp = _per_rank(mn.dense, tp, ep, mn.kv_heads)
    m_dense, m_exp = _per_rank(mn.moe, tp, ep, mn.kv_heads)
    embed = vocab_padded * h / tp + mn.position_params
    head_matrix = where((mn.tied) & (values(pp) == 1), 0.0, vocab_padded * h / tp)
    head = head_matrix + mn.norm_params + mn.head_bias * vocab_padded / tp
    p_dense = dense_layers * d_dense + moe_layers * m_dense + first * embed + last * head
    p_expert = dense_layers * d_exp + moe_layers * m_exp
    p_stage = p_dense + p_expert
    adapters = (dense_layers * mn.dense.lora + moe_layers * mn.moe.lora) / tp
    layer_max_adapters = maximum(where(dense_layers > 0, mn.dense.lora, 0.0),
                                    where(moe_layers > 0, mn.moe.lora, 0.0)) / tp
    trainable_dense = where(lora, adapters, p_dense)
    trainable_expert = where(lora, 0.0, p_expert)
    trainable = trainable_dense + trainable_expert

    # ZeRO shards over the data-parallel group (times CP, whose ranks hold the same
    # parameters), or under hybrid sharding over its dp_shard-rank part; expert parameters over
    # the expert-data-parallel group dp·cp/ep (dp_shard·cp/ep).
    shard_dense = (dp if dp_shard is None else dp_shard) * cp
    shard_expert = maximum(shard_dense / ep, 1)
    # FSDP1 runs NO_SHARD whatever strategy it is given when its shard group is one rank
    # (torch/distributed/fsdp/_init_utils.py: "FSDP is switching to use `NO_SHARD` ... since the
    # world size is 1"): ZeRO-0's memory
    zero = where(r.single_rank_no_shard & (values(shard_dense) <= 1), 0, zero)

    def sharded(per_param_bytes, stage_from):
        div_d = where(zero >= stage_from, shard_dense, 1)
        div_e = where(zero >= stage_from, shard_expert, 1)
        return per_param_bytes * (trainable_dense / div_d + trainable_expert / div_e)

    # LoRA/QLoRA: the layers' weight matrices are frozen (quantized under QLoRA, which
    # bitsandbytes applies to nn.Linear layers only); embeddings, output head and norms stay
    # in the 16-bit compute dtype.
    dense_matrices, moe_matrices = (layer_matrix_params(lp, tp, ep, mn.kv_heads) for lp in (mn.dense, mn.moe))
    layer_matrices = dense_layers * dense_matrices + moe_layers * moe_matrices
    quantizable = layer_matrices
    uncast_experts = mn.moe.expert / (ep * tp) * float(mn.shape.grouped_experts and not r.fused_kernels)
    frozen_bytes = quantizable * r.frozen_weight_bytes + (p_stage - quantizable) * r.compute_weight_bytes
    weights_sharded = r.weights_sharded(zero)
    weights = where(lora, frozen_bytes + adapters * r.weight_bytes,
                       p_dense * r.weight_bytes / where(weights_sharded, shard_dense, 1)
                       + p_expert * r.weight_bytes / where(weights_sharded, shard_expert, 1))
    weights = where(offload_params, 0.0, weights)
    grads = sharded(r.grad_bytes, r.grads_sharded_from_zero)
    # Pipelined FSDP (Recipe.keeps_stage_gathered): the stage's parameters stay gathered in the
    # compute dtype and its gradients accumulate unsharded in the reduce dtype all step, beside
    # the sharded copies; FSDP's SHARD_GRAD_OP keeps each unit gathered from its forward to its
    # backward, the whole stage when the backward starts (LoRA's frozen base is never sharded
    # here, so it has nothing to add)
    not_lora = ~bools(lora)
    pipelined_fsdp = r.keeps_stage_gathered(pp, zero) & not_lora
    forward_to_backward = r.keeps_gathered_forward_to_backward(zero) & not_lora & ~pipelined_fsdp
    stage_gathered = (pipelined_fsdp & weights_sharded) | forward_to_backward
    params_gathered = where(stage_gathered, p_stage * r.compute_weight_bytes, 0.0)
    grads_unsharded = where(pipelined_fsdp, trainable * r.reduce_bytes, 0.0)
    weights = weights + params_gathered
    # The unsharded gradients and the sharded ones are not alive together: the optimizer's
    # zero_grad (set_to_none) frees the shards before the step's first backward, and at the last
    # micro-batch FSDP2 drops each unit's unsharded gradient as it reduce-scatters it into its
    # shard (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py post_backward:
    # "fsdp_param.unsharded_accumulated_grad = None"): the larger of the two at any time. (Summing
    # them charged an expert-parallel stage whose experts have one rank to shard over, e.g.
    # DeepSeek-V3 on 16 H100s at PP 2, EP 8, DP 8, twice its expert gradients: 1,140 GiB at
    # ZeRO-2 against 980 GiB replicated.)
    grads = where(pipelined_fsdp, maximum(grads, grads_unsharded), grads)
    if r.tp_embedding_grad_replicated and not mn.tied:
        # DTensor's vocabulary-parallel embedding returns a replicated V x h gradient (an
        # untied embedding without ZeRO-2/3, which reshard gradients like their parameters).
        grads = grads + where(lora | (zero >= 2), 0.0,
                                 first * vocab_padded * h * (1 - 1 / tp) * r.grad_bytes)
    master = where(offload_optimizer, 0.0, sharded(r.master_bytes, 1))
    opt_state = sharded(r.optimizer_bytes, 1)
    if r.factored_optimizer:
        # under LoRA only the adapters train: each of A and B is a matrix of its own
        fac = where(lora, (dense_layers * mn.dense.lora_factored + moe_layers * mn.moe.lora_factored) / tp,
                       dense_layers * (mn.dense.factored_rep + mn.dense.factored_split / tp)
                       + moe_layers * (mn.moe.factored_rep + mn.moe.factored_split / tp)
                       + first * (vocab_padded + h) + last * (vocab_padded + h + mn.norm_params))
        opt_state = opt_state + fac * r.state_bytes / where(zero >= 1, shard_dense, 1)
    opt_state = where(offload_optimizer, 0.0, opt_state)

    offloaded_state = (sharded(r.master_bytes, 1) + sharded(r.optimizer_bytes, 1)) if any_(offload_optimizer) else 0.0
    return {"d_dense": d_dense, "d_exp": d_exp, "m_dense": m_dense, "m_exp": m_exp, "embed": embed, "head": head,
            "p_stage": p_stage, "adapters": adapters, "layer_max_adapters": layer_max_adapters,
            "trainable": trainable, "shard_dense": shard_dense, "zero": zero, "dense_matrices": dense_matrices,
            "moe_matrices": moe_matrices, "layer_matrices": layer_matrices, "uncast_experts": uncast_experts,
            "weights": weights, "grads": grads, "master": master, "opt_state": opt_state,
            "pipelined_fsdp": pipelined_fsdp, "forward_to_backward": forward_to_backward,
            "params_gathered": params_gathered, "grads_unsharded": grads_unsharded,
            "offloaded_state": offloaded_state}


def stage_memory(mn: ModelNumbers, r: Recipe, *, dense_layers, moe_layers, first, last,
                 in_flight_mb, logits_in_flight, tp, sp, cp, ep, dp, zero, mbs, seq,
                 vocab_padded, attention, recompute, recompute_layers, dropout, lora,
                 lora_saves, offload_optimizer, offload_params, pp, reserved_bytes,
                 fragmentation, mask_bytes=act.MASK_BYTES, dp_shard=None, lora_rank=0, modules=None,
                 fp8_cache=None, head_in_flight=None, heads_major_copy=0) -> dict:
    """Memory of one pipeline stage on one GPU, by component (bytes; arrays broadcast);
    `dp_shard`, the data-parallel ranks ZeRO shards over (all `dp` when None);
    `logits_in_flight`, the losses alive at the peak (the logits the loss keeps);
    `head_in_flight`, the last stage's micro-batches alive then (its final norm and the output
    layer's input), `logits_in_flight` unless a split backward frees the loss before the rest of
    the stage (`pipeline.last_stage_heads_in_flight`); `heads_major_copy`: see
    `activations.layer_terms` (1 for PyTorch's CPU attention kernels)."""
    first = floats(first)
    last = floats(last)
    hd_ = held(mn, r, dense_layers=dense_layers, moe_layers=moe_layers, first=first, last=last, tp=tp, cp=cp, ep=ep,
               dp=dp, zero=zero, dp_shard=dp_shard, lora=lora, offload_optimizer=offload_optimizer,
               offload_params=offload_params, pp=pp, vocab_padded=vocab_padded)
    p_stage, trainable, shard_dense, zero = hd_["p_stage"], hd_["trainable"], hd_["shard_dense"], hd_["zero"]
    weights, grads, master, opt_state = hd_["weights"], hd_["grads"], hd_["master"], hd_["opt_state"]
    params_gathered, grads_unsharded = hd_["params_gathered"], hd_["grads_unsharded"]

    # ---- activations: one micro-batch's saved tensors x micro-batches in flight
    tokens = mbs * seq / cp
    common = dict(tokens=tokens, seq=seq, tp=tp, sp=sp, act_bytes=r.act_bytes, residual_bytes=r.residual_bytes,
                  autocast=float(r.casts_linear_inputs),
                  linear_in_bytes=r.linear_in_bytes, attention=attention, recompute=recompute,
                  fused=float(r.fused_kernels), dropout=dropout, saves=lora_saves, mask_bytes=mask_bytes,
                  adapter_rank=lora_rank if lora_saves is not None else 0,
                  adapter_dropout=float(r.lora_dropout), adapter_copies=float(r.lora_input_copies),
                  modules=modules, fp8_cache=fp8_cache, heads_major_copy=heads_major_copy,
                  gate_in_act=float(r.moe_gate_in_activation), sp_gathered=float(r.sp_gathers_saved_inputs),
                  cp_output_copy=float(r.cp_ring_output_copy) * (values(cp) > 1))

    saved = _saved_per_micro_batch(mn, r, common, dense_layers=dense_layers, moe_layers=moe_layers, first=first,
                                   recompute_layers=recompute_layers)
    dense_terms, moe_terms, ckpt, ckpt_reused = (saved[k] for k in ("dense_terms", "moe_terms", "ckpt", "ckpt_reused"))
    working_set, n_ckpt, per_mb_layers = saved["working_set"], saved["n_ckpt"], saved["per_mb_layers"]
    emb, hd = _end_terms(mn, r, common, vocab_padded=vocab_padded, cp=cp)
    # what one more micro-batch in flight (or one more set of live logits) holds
    per_in_flight = {
        "layers": per_mb_layers,
        "embedding": first * sum(emb.values()),
        "stage_tensors": sum(act.stage_terms(seq=seq, cp=cp, rope_dim=mn.rope_dim, act_bytes=r.residual_bytes,
                                             attention=attention).values())
        + norm_features.window_stage_bytes(mn.shape, seq=seq, cp=cp, attention=attention),
    }
    per_logits = last * sum(hd.values())
    per_loss = last * hd["logits"]
    head_in_flight = logits_in_flight if head_in_flight is None else head_in_flight
    parts = {
        "layers": per_in_flight["layers"] * in_flight_mb,
        # Backward of a checkpointed layer re-materialises that layer's activations (as
        # without recompute) next to its checkpointed input, once.
        "recompute_working_set": where(n_ckpt > 0, working_set - ckpt_reused, 0.0),
        "embedding": per_in_flight["embedding"] * in_flight_mb,
        "stage_tensors": per_in_flight["stage_tensors"] * in_flight_mb,
        "head_and_loss": (per_logits - per_loss) * head_in_flight + per_loss * logits_in_flight,
        "autocast_weight_copies": _autocast_copies(mn, r, hd_, saved, dense_layers=dense_layers,
                                                   moe_layers=moe_layers, first=first, last=last,
                                                   vocab_padded=vocab_padded, tp=tp, lora=lora),
    }
    activations = sum(parts.values())

    zero3_gather, bucket, loss_ws = _other_memory(r, hd_, dense_layers=dense_layers, moe_layers=moe_layers,
                                                  first=first, last=last, tokens=tokens, vocab_padded=vocab_padded,
                                                  tp=tp, dp=dp, lora=lora)
    allocated = weights + grads + master + opt_state + activations + zero3_gather + bucket + loss_ws
    fragment = allocated * fragmentation
    other = zero3_gather + bucket + loss_ws + fragment + reserved_bytes
    total = allocated + fragment + reserved_bytes
    # these buffers on every stage (`+ 0 * total` broadcasts them to the stage axis)
    params_gathered = params_gathered + 0 * total
    grads_unsharded = grads_unsharded + 0 * total
    cpu_offload = np.zeros(np.shape(total))
    if any_(offload_optimizer):
        cpu_offload = cpu_offload + where(offload_optimizer, hd_["offloaded_state"], 0.0)
    if any_(offload_params):
        cpu_offload = cpu_offload + where(offload_params, p_stage * r.weight_bytes
                                             / where(zero >= 3, shard_dense, 1), 0.0)
    return {
        "params": weights, "grads": grads, "master": master, "optimizer_state": opt_state,
        "params_gathered": params_gathered, "grads_unsharded": grads_unsharded,
        "optimizer": master + opt_state, "activations": activations, "other": other,
        "total": total, "zero3_gather": zero3_gather, "comm_buckets": bucket,
        "loss_workspace": loss_ws, "fragmentation": fragment,
        "runtime_reserved": reserved_bytes + 0 * total,
        "param_count": p_stage, "trainable_params": trainable,
        "activation_parts": parts, "dense_layer_terms": dense_terms, "moe_layer_terms": moe_terms,
        "embedding_terms": emb, "head_terms": hd, "checkpoint_per_layer": ckpt,
        "per_microbatch_layers": per_mb_layers,
        "cpu_offload": cpu_offload,
        # what sharding itself allocates (conventions.toml [sharding_buffers]): the only bytes by
        # which a higher ZeRO stage may need more than a lower one (tests/test_zero_monotonic.py)
        "sharding_buffers": {"zero3_gather": zero3_gather, "params_gathered": params_gathered,
                             "grads_unsharded": grads_unsharded},
        # total is linear in the micro-batches in flight and in the live logits (activations,
        # then their fragmentation share): its slopes, for callers that vary the schedule
        # (total_per_logits: the head's and the loss's together; total_per_loss: the loss's alone)
        "total_per_in_flight": sum(per_in_flight.values()) * (1 + fragmentation),
        "total_per_logits": per_logits * (1 + fragmentation),
        "total_per_loss": per_loss * (1 + fragmentation),
    }


def _autocast_copies(mn: ModelNumbers, r: Recipe, hd_: dict, saved: dict, *, dense_layers, moe_layers, first,
                     last, vocab_padded, tp, lora):
    """The weights' autocast copies a stage holds (`stage_memory`; `hd_`, its `held` parameters,
    `saved`, `_saved_per_micro_batch`'s figures).

    torch.autocast caches the 16-bit cast of every weight a matmul uses (the layers' matrices
    and the output head, tied or not) and the matmuls save those casts; a fully recomputed layer
    runs its forward without grad (nothing saved) and keeps its casts only while it is re-run in
    backward, one layer at a time. (LoRA's frozen base is already in the 16-bit dtype: only its
    fp32 adapters are cast, and the A of the first layer's attention-input adapters only where
    that layer's input needs a gradient: a checkpointed first layer.) (transformers' grouped
    experts run outside autocast: their weights are not cast.)"""
    h = mn.hidden
    n_ckpt, frac_ckpt = saved["n_ckpt"], saved["frac_ckpt"]
    adapters, layer_max_adapters = hd_["adapters"], hd_["layer_max_adapters"]
    dense_matrices, moe_matrices, uncast_experts = hd_["dense_matrices"], hd_["moe_matrices"], hd_["uncast_experts"]
    return where(
        lora, (1 - frac_ckpt) * adapters + where(n_ckpt > 0, layer_max_adapters, 0.0)
        - first * (n_ckpt == 0) * max(mn.dense.lora_input_a, mn.moe.lora_input_a) / tp,
        (1 - frac_ckpt) * (hd_["layer_matrices"] - moe_layers * uncast_experts) + last * vocab_padded * h / tp
        + where(n_ckpt > 0, maximum(where(dense_layers > 0, dense_matrices, 0.0),
                                    where(moe_layers > 0, moe_matrices - uncast_experts, 0.0)), 0.0)
    ) * r.autocast_copy_bytes


def _saved_per_micro_batch(mn: ModelNumbers, r: Recipe, common: dict, *, dense_layers, moe_layers, first,
                           recompute_layers) -> dict:
    """What a stage's layers save for one micro-batch (`stage_memory`; `common`, the layers'
    `activations.layer_terms` arguments): each layer kind's terms, the checkpointed input of a
    recomputed layer, the working set of its re-run, the layers checkpointed and the bytes they
    save in all."""
    h = mn.hidden
    tokens, tp, sp, recompute = common["tokens"], common["tp"], common["sp"], common["recompute"]
    lora_saves, mask_bytes = common["saves"], common["mask_bytes"]
    layers = dense_layers + moe_layers

    def layer_terms(moe, **kw):  # activations' terms with the norm, mask and soft-capping features, and their sum
        return layer_terms_of(mn.shape, moe, kw)

    dense_terms, dense_layer = layer_terms(False, **common)
    moe_terms, moe_layer = layer_terms(True, **common) if mn.moe.expert or mn.moe.split else ({}, 0.0)
    ckpt = act.checkpoint_bytes(h, tokens=tokens, tp=tp, sp=sp, act_bytes=r.residual_bytes)
    # The re-run layer's first norm keeps the checkpointed input itself, unless an eager
    # RMSNorm upcasts a 16-bit input to a new fp32 copy.
    eager_rms = (not r.fused_kernels) and not mn.layernorm and r.residual_bytes < FP32
    ckpt_reused = 0.0 if eager_rms else ckpt
    op_sac = values(recompute) == act.RECOMPUTE_CODE["selective-op"]
    full = (values(recompute) == act.RECOMPUTE_CODE["full"]) | op_sac
    if any_(op_sac):
        # per-op selective checkpointing keeps, besides each block's input, the outputs its
        # policy saves (dense layers; plan.py refuses it for MoE layers)
        # (the re-run block returns those saved outputs instead of making new ones)
        op_saved = where(op_sac, act.op_sac_saved(mn.shape, tokens=tokens, tp=tp, sp=sp, act_bytes=r.act_bytes,
                                                      low_precision_mm=float(r.linear_in_bytes < 2)), 0.0)
        extra = where(op_sac, op_saved - ckpt, 0.0)  # op_saved counts the block's input too
        ckpt, ckpt_reused = ckpt + extra, ckpt_reused + extra
    if any_(full):
        # a layer that full recomputation leaves out, or re-runs in the backward, saves what it
        # saves without recomputation
        plain = {**common, "recompute": act.RECOMPUTE_CODE["none"]}
        dense_plain = layer_terms(False, **plain)[1]
        moe_plain = layer_terms(True, **plain)[1] if moe_terms else 0.0
        working_set = maximum(where(dense_layers > 0, dense_plain, 0.0),
                                 where(moe_layers > 0, moe_plain, 0.0))
        dense_layer = where(full, dense_plain, dense_layer)
        moe_layer = where(full, moe_plain, moe_layer)
    else:
        working_set = 0.0
    n_ckpt = where(full, minimum(recompute_layers, layers), 0)
    frac_ckpt = where(layers > 0, n_ckpt / maximum(layers, 1), 0.0)
    stored_layers = dense_layers * dense_layer + moe_layers * moe_layer
    per_mb_layers = stored_layers * (1 - frac_ckpt) + n_ckpt * ckpt
    if lora_saves is not None:
        # LoRA: the frozen embedding's output needs no gradient, so the first layer's input
        # norm (its weight frozen too) has no backward and keeps nothing (the same in either
        # layer kind), and a dropout on the q, k, v adapters' input keeps no mask; unless the
        # first layer is checkpointed (full recompute checkpoints each stage's first layers)
        # and keeps its input instead
        qkv_inputs = act.adapter_inputs(mn.shape, {n: lora_saves.get(n, 0) for n in ("q", "k", "v")}, moe=False, tp=tp)
        per_mb_layers = per_mb_layers - first * (n_ckpt == 0) * (
            dense_terms["attn_norm"] + tokens * qkv_inputs * mask_bytes * float(r.lora_dropout))
    return {"dense_terms": dense_terms, "moe_terms": moe_terms, "ckpt": ckpt, "ckpt_reused": ckpt_reused,
            "working_set": working_set, "n_ckpt": n_ckpt, "frac_ckpt": frac_ckpt, "per_mb_layers": per_mb_layers}


def _end_terms(mn: ModelNumbers, r: Recipe, common: dict, *, vocab_padded, cp) -> tuple[dict, dict]:
    """The embedding's and the output head's (with the loss's) saved tensors for one micro-batch
    on the stages holding them (`stage_memory`; `common`, the layers' arguments)."""
    h = mn.hidden
    tokens, seq, tp, sp = common["tokens"], common["seq"], common["tp"], common["sp"]
    dropout, mask_bytes, lora_saves = common["dropout"], common["mask_bytes"], common["saves"]
    emb = act.embedding_terms(h, tokens=tokens, seq=seq, cp=cp, tp=tp, sp=sp, dropout=dropout,
                              learned_positions=float(mn.position_params > 0), mask_bytes=mask_bytes,
                              frozen=float(lora_saves is not None))
    hd = act.head_terms(h, vocab_padded, tokens=tokens, tp=tp, sp=sp, act_bytes=r.residual_bytes,
                        linear_in_bytes=r.linear_in_bytes, layernorm=mn.layernorm,
                        fused=float(r.fused_kernels), logit_bytes=r.logit_bytes, frozen=float(lora_saves is not None),
                        sp_gathered=float(r.sp_gathers_saved_inputs))
    if mn.shape.final_softcap:
        hd["final_softcap"] = norm_features.final_softcap_bytes(vocab_padded, tokens=tokens, tp=tp,
                                                                logit_act_bytes=r.linear_in_bytes)
    if mn.shape.python_layernorm and not r.fused_kernels:
        hd["final_norm"] = tokens * norm_features.python_layernorm_bytes(h, float(lora_saves is not None)) / where(
            sp, tp, 1)
    return emb, hd


def _other_memory(r: Recipe, hd_: dict, *, dense_layers, moe_layers, first, last, tokens, vocab_padded, tp, dp,
                  lora) -> tuple:
    """A stage's gathered ZeRO-3 units, gradient buckets and loss workspace (`stage_memory`;
    `hd_`, its `held` parameters)."""
    d_dense, d_exp, m_dense, m_exp, embed, head = (hd_[k] for k in ("d_dense", "d_exp", "m_dense", "m_exp", "embed",
                                                                    "head"))
    zero, trainable, layer_max_adapters = hd_["zero"], hd_["trainable"], hd_["layer_max_adapters"]
    pipelined_fsdp, forward_to_backward = hd_["pipelined_fsdp"], hd_["forward_to_backward"]
    unit = maximum(where(dense_layers > 0, d_dense + d_exp, 0),
                      where(moe_layers > 0, m_dense + m_exp, 0))
    unit = maximum(unit, maximum(first * embed, last * head))
    # ZeRO-3: the current unit + the prefetched next one in the compute dtype, plus the
    # unsharded gradient of the current unit before its reduce-scatter (under LoRA its
    # adapters' only: the frozen base has none); SHARD_GRAD_OP, whose units are already
    # gathered (above): that gradient only.
    unit_grad = where(lora, layer_max_adapters, unit)
    zero3_gather = where((zero >= 3) & ~pipelined_fsdp,
                            unit * 2 * r.compute_weight_bytes + unit_grad * r.reduce_bytes,
                            where(forward_to_backward, unit * r.reduce_bytes, 0.0))
    bucket = minimum(r.reduce_bucket_elems, trainable) * r.grad_bytes * (zero <= 2)
    bucket = bucket + where(r.grad_bucket_copy & (values(dp) > 1), trainable * r.grad_bytes, 0.0)
    loss_ws = last * tokens * vocab_padded / tp * r.loss_workspace_bytes
    return zero3_gather, bucket, loss_ws


# one layout's per-layer terms (scalars, or a few columns), memoised by their arguments: the
# explorer and repeated plans ask for the same micro-batch shapes again (search's arrays are not)
_LAYER_TERMS: dict = track({})
_LAYER_TERMS_MAX = 1024


def layer_terms_of(shape: act.LayerShape, moe: bool, kw: dict) -> tuple[dict, object]:
    """`activations.layer_terms` with the norm, mask and soft-capping terms
    (`norm_features.adjust_layer_terms`) for one layer kind, `kw` the former's keyword
    arguments, and their sum; memoised for one layout's arguments (scalars, or a few columns of
    micro-batch sizes: a fresh dict of read-only figures)."""
    key = _layer_terms_key(shape, moe, kw)
    hit = _LAYER_TERMS.get(key) if key is not None else None
    if hit is None:
        terms = norm_features.adjust_layer_terms(
            act.layer_terms(shape, moe=moe, **kw), shape, tokens=kw["tokens"], seq=kw["seq"], tp=kw["tp"],
            sp=kw["sp"], act_bytes=kw["act_bytes"], residual_bytes=kw["residual_bytes"], attention=kw["attention"],
            recompute=kw["recompute"], fused=kw["fused"], autocast=kw["autocast"],
            frozen=float(kw["saves"] is not None))
        hit = terms, sum(terms.values())
        if key is not None:
            for v in (*terms.values(), hit[1]):
                if v.__class__ is np.ndarray:
                    v.flags.writeable = False
            if len(_LAYER_TERMS) >= _LAYER_TERMS_MAX:
                _LAYER_TERMS.clear()
            _LAYER_TERMS[key] = hit
    return dict(hit[0]), hit[1]


def _layer_terms_key(shape, moe, kw: dict):
    """The memo's key for `layer_terms_of`: None where an argument is an array of many layouts
    (search's) or is not hashable."""
    parts = []
    for v in kw.values():
        cls = v.__class__
        if cls is np.ndarray:
            if v.size > 16:
                return None
            v = (v.shape, v.dtype.str, v.tobytes())
        elif cls is dict:
            v = tuple(v.items())
        parts.append(v)
    key = (shape, moe, tuple(kw), tuple(parts))
    try:
        hash(key)
    except TypeError:
        return None
    return key


def layout_inputs(layout: Layout) -> dict:
    """The keyword arguments of `stage_memory` for a layout, one array entry per stage."""
    plan = layout.plan
    conv = conventions()
    pp = layout.pp
    first, last, flight, logits, heads = _schedule_inputs(plan.schedule, plan.framework, pp, layout.micro_batches,
                                                          layout.vpp, plan.pp_group, rules_version())
    lora = plan.finetune != "full"
    run = conv["runtime"]
    reserved = (plan.overhead_gib if plan.overhead_gib is not None else run["reserved_gib"]) * GiB
    frag = plan.fragmentation if plan.fragmentation is not None else run["fragmentation"]
    return dict(
        dense_layers=np.asarray(layout.stage_dense_layers, dtype=float),
        moe_layers=np.asarray(layout.stage_moe_layers, dtype=float),
        first=first, last=last, in_flight_mb=flight, logits_in_flight=logits, head_in_flight=heads,
        tp=layout.tp, sp=layout.sp, cp=layout.cp, ep=layout.ep, dp=layout.dp, zero=layout.zero,
        dp_shard=layout.dp_shard,
        mbs=layout.mbs, seq=layout.seq_len, vocab_padded=layout.vocab_padded,
        attention=act.ATTENTION_CODE[layout.model.attention_kernel(plan.attention)], recompute=recompute_code(plan),
        modules=recompute_modules(plan),
        fp8_cache={name: 1.0 for name in plan.fp8_cache} if plan.fp8_cache else None,
        recompute_layers=layout.recompute_layers_per_stage if plan.recompute_layers is not None else 10**9,
        dropout=float(plan.dropout > 0), lora=lora, lora_saves=lora_saves(plan), lora_rank=plan.lora_rank,
        offload_optimizer=plan.offload_optimizer, offload_params=plan.offload_params, pp=pp,
        reserved_bytes=reserved, fragmentation=frag,
    )


@track
@lru_cache(maxsize=128)
def _schedule_inputs(schedule: str, framework: str, pp: int, micro_batches: int, vpp: int, group,
                     version: tuple) -> tuple:
    """`layout_inputs`' figures of the pipeline schedule: the stages holding the model's first
    and last layers, each stage's micro-batches in flight, and the last stage's live logits and
    heads (read-only arrays; one schedule's memoised, `version` the rules registered)."""
    sched = SCHEDULE_CODE[schedule]
    out = (_ends(schedule, framework, pp, 0), _ends(schedule, framework, pp, pp - 1),
           in_flight(sched, np.arange(pp), pp, micro_batches, vpp, group, framework),
           last_stage_logits_in_flight(sched, micro_batches, framework, pp),
           last_stage_heads_in_flight(sched, micro_batches, framework, pp))
    for a in out:
        if isinstance(a, np.ndarray):
            a.flags.writeable = False
    return out


def recompute_code(plan) -> int:
    """RECOMPUTE_CODE for the layers' saved tensors: selective recomputation recomputes the
    attention core unless its modules leave core_attn out."""
    if plan.recompute == "selective" and plan.recompute_modules is not None and "core_attn" not in plan.recompute_modules:
        return act.RECOMPUTE_CODE["none"]
    return act.RECOMPUTE_CODE[plan.recompute]


def recompute_modules(plan) -> dict | None:
    """1.0 for each output-discarding module selective recomputation re-runs (None: none)."""
    if plan.recompute != "selective" or not plan.recompute_modules:
        return None
    return {name: float(name in plan.recompute_modules) for name in act.RECOMPUTE_MODULES if name != "core_attn"}


def pipeline_ends(layout: Layout, end: int) -> np.ndarray:
    """1.0 for the stages holding the model's first (end 0: the embedding) or last (end pp - 1:
    the output head) stage: under DualPipe both end ranks hold both, one for each copy."""
    return _ends(layout.plan.schedule, layout.plan.framework, layout.pp, end)


def _ends(schedule: str, framework: str, pp: int, end: int) -> np.ndarray:
    stages = np.arange(pp)
    ends = (stages == end)
    if schedule == "dualpipe":
        ends = ends | (stages == pp - 1 - end)
    if framework == "torch" and schedule in V_SHAPED:
        ends = stages == 0  # torch's V-shaped schedules: rank 0 holds the first and the last stage
    return ends.astype(float)


def numbers_for(layout: Layout) -> ModelNumbers:
    return plan_numbers(layout.model, layout.plan)


def plan_numbers(model: ModelSpec, plan) -> ModelNumbers:
    """The model's parameter groups with the plan's LoRA adapters (none when it trains in full)."""
    targets = tuple(plan.lora_targets) if plan.finetune != "full" else ()
    return model_numbers(model, targets, plan.lora_rank if targets else 0)


def lora_saves(plan) -> dict | None:
    """Which linears' inputs a LoRA plan saves for its adapters' gradients (1.0 for a target);
    None when it trains in full."""
    if plan.finetune == "full":
        return None
    return {t: float(t in plan.lora_targets) for t in LORA_TARGETS}


def estimate_memory(layout: Layout, r: Recipe | None = None) -> dict:
    """Per-stage memory for a resolved layout (arrays of length pp); `r`, the plan's
    `recipe` where the caller has it already."""
    return stage_memory(numbers_for(layout), r if r is not None else recipe(layout.plan), **layout_inputs(layout))


def _first_column(value: dict) -> dict:
    """The plan's own figures out of a `stage_memory` result evaluated on (stage, 1, column)
    arrays: column 0 of each, as a (pp,) array where it varies by stage (three axes), a scalar
    where it does not (two); nested dicts alike."""
    out = {}
    for k, v in value.items():
        if v.__class__ is np.ndarray:
            ndim = v.ndim
            out[k] = v[:, 0, 0] if ndim == 3 else v[0, 0] if ndim == 2 else v
        elif isinstance(v, dict):
            out[k] = _first_column(v)
        else:
            out[k] = v
    return out


# the memory line's keys, in the order max_micro_batch combines them
LINE_KEYS = ("total", "total_per_in_flight", "total_per_logits", "total_per_loss")


def estimate_memory_and_line(layout: Layout, r: Recipe | None = None) -> tuple[dict, dict]:
    """`estimate_memory`, and in the same evaluation the line `max_micro_batch` reads: each
    stage's memory at micro-batch sizes 1 and 2 with one micro-batch (one set of logits) in
    flight. A stage's memory is affine in the micro-batch size at a given number in flight
    (every term is a per-token figure times tokens, or none), so these two points give it at
    any size."""
    r = r if r is not None else recipe(layout.plan)
    inputs = layout_inputs(layout)
    mn = numbers_for(layout)
    key = array_key((mn, r, layout.mbs, *inputs.values()))
    if key is None:
        return _memory_and_line(mn, r, layout.mbs, inputs)
    memory, line = _MEMORY_AND_LINE.get(key, lambda: read_only(_memory_and_line(mn, r, layout.mbs, inputs)))
    return fresh_copy(memory), fresh_copy(line)


# one layout's memory and line, memoised by the figures they are computed from
_MEMORY_AND_LINE = Memo(256)


def _memory_and_line(mn: ModelNumbers, r: Recipe, mbs, inputs: dict) -> tuple[dict, dict]:
    """`estimate_memory_and_line` of a layout's `layout_inputs` (which it reshapes in place)."""
    pp = inputs["pp"]
    kinds = {k: inputs[k] for k in ("dense_layers", "moe_layers", "first", "last")}
    for k, v in inputs.items():  # per-stage inputs on the first axis
        if isinstance(v, np.ndarray) and v.ndim == 1:
            inputs[k] = v[:, None, None]
    inputs["mbs"] = np.array([[mbs, 1, 2]], dtype=float)
    flight = np.ones((pp, 1, 3))
    flight[:, :, :1] = inputs["in_flight_mb"]
    inputs["in_flight_mb"] = flight
    inputs["logits_in_flight"] = np.array([[float(inputs["logits_in_flight"]), 1.0, 1.0]])
    inputs["head_in_flight"] = np.array([[float(inputs["head_in_flight"]), 1.0, 1.0]])
    out = stage_memory(mn, r, **inputs)
    points = np.empty((len(LINE_KEYS), pp, 2))  # each key at sizes 1 and 2, on every stage
    for i, k in enumerate(LINE_KEYS):
        v = out[k]
        points[i] = v[:, 0, 1:] if np.ndim(v) == 3 else v[0, 1:] if np.ndim(v) == 2 else v
    line = dict(zip(LINE_KEYS, points, strict=True))
    return _first_column(out), {**line, "points": points, "stage_kinds": kinds}


def peak_candidate_stages(layout: Layout, inputs: dict | None = None, micro_batches=None) -> np.ndarray:
    """The stages among which the memory peak lies under any micro-batch size: the first of
    the stages sharing each (dense layers, MoE layers, first, last) of `inputs`
    (`layout_inputs`). A stage's memory is set by those and by its micro-batches in flight, and
    grows with these, which no schedule of estimate/pipeline.py lets grow with the stage index;
    so no later stage of the same kind holds more. A rule registered there that did (checked at
    the fewest and the most `micro_batches`) gets every stage. An even split has at most four
    (stage 0, one or two kinds of middle stages, the last)."""
    inputs = inputs or layout_inputs(layout)
    plan, pp = layout.plan, layout.pp
    if micro_batches is not None and len(micro_batches):
        m = np.asarray(micro_batches)
        flight = in_flight(SCHEDULE_CODE[plan.schedule], np.arange(pp)[:, None], pp,
                           np.array([m.min(), m.max()])[None, :], layout.vpp, plan.pp_group, plan.framework)
        if (flight[1:] > flight[:-1]).any():  # more in flight on a later stage
            return np.arange(pp)
    first: dict = {}  # kind -> its first stage, in stage order
    columns = (inputs[k].tolist() if np.shape(inputs[k]) == (pp,) else np.broadcast_to(inputs[k], (pp,)).tolist()
               for k in ("dense_layers", "moe_layers", "first", "last"))
    kinds = zip(*columns, strict=True)
    for i, kind in enumerate(kinds):
        first.setdefault(kind, i)
    return np.fromiter(first.values(), dtype=np.int64, count=len(first))


@lru_cache(maxsize=1024)
def _mbs_candidates(limit: int, gbs: int | None, dp: int, micro_batches: int) -> tuple[np.ndarray, np.ndarray]:
    """The micro-batch sizes `max_micro_batch` tries (1..limit; with a global batch, those for
    which dp x size divides it) and the micro-batches per step at each (read-only arrays)."""
    if gbs is None:
        cands = np.arange(1, limit + 1)
        m = np.full(cands.shape, micro_batches)
    elif gbs % dp:
        cands = m = np.zeros(0, dtype=np.int64)
    else:  # dp x size divides gbs: the divisors of gbs / dp
        q = gbs // dp
        small = [c for c in range(1, math.isqrt(q) + 1) if q % c == 0]
        divisors = sorted(set(small + [q // c for c in small]))
        cands = np.array([c for c in divisors if c <= limit], dtype=np.int64)
        m = gbs // (dp * cands)
    cands.flags.writeable = m.flags.writeable = False
    return cands, m


def max_micro_batch(layout: Layout, limit: int = 4096, line: dict | None = None) -> int:
    """Largest micro-batch that fits every stage (respecting gbs divisibility when the
    global batch was given); 0 when even 1 does not fit. Every candidate size on the stages
    that can hold the peak (`peak_candidate_stages`), from each stage's memory line in the
    micro-batch size (`estimate_memory_and_line`; evaluated here unless given) and its
    micro-batches in flight at that size."""
    plan = layout.plan
    cands, m = _mbs_candidates(limit, layout.gbs if plan.gbs is not None else None, layout.dp,
                               layout.micro_batches)
    if not len(cands):
        return 0
    if line is None:
        line = estimate_memory_and_line(layout)[1]
    kinds = line["stage_kinds"]
    grid_args = (plan.schedule, plan.framework, plan.pp_group, layout.pp, layout.vpp, limit, *rules_version(),
                 layout.gbs if plan.gbs is not None else None, layout.dp, layout.micro_batches,
                 *(kinds[k] for k in ("dense_layers", "moe_layers", "first", "last")))
    key = _memo_key(grid_args)
    grid = _MBS_GRIDS.get(key) if key is not None else None
    if grid is None:
        grid = _mbs_grid(layout, kinds, cands, m)
        if key is not None:
            if len(_MBS_GRIDS) >= 256:
                _MBS_GRIDS.clear()
            _MBS_GRIDS[key] = grid
    points = line["points"] if "points" in line else np.stack([line[k] for k in LINE_KEYS])
    capacity = layout.gpu.capacity_bytes
    if key is None:
        return _largest_fitting(points, grid, cands, capacity)
    # a memoised line's points are one read-only array: the same object, the same answer
    found = _MAX_MBS.get((key, capacity))
    if found is None or found[0] is not points or points.flags.writeable:
        found = (points, _largest_fitting(points, grid, cands, capacity))
        if len(_MAX_MBS) >= 256:
            _MAX_MBS.clear()
        _MAX_MBS[(key, capacity)] = found
    return found[1]


_MAX_MBS: dict = track({})  # grid key, capacity -> (the line's points, max_micro_batch)


def _largest_fitting(points: np.ndarray, grid: tuple, cands: np.ndarray, capacity: float) -> int:
    """`max_micro_batch` from each stage's memory line (`points`, keys x stages x sizes 1 and 2)
    and its `_mbs_grid`."""
    stages, flight_extra, heads_extra, loss_extra = grid
    # each key's value at each candidate size, keys x stages x candidates
    points = points[:, stages]
    one, two = points[:, :, :1], points[:, :, 1:]
    total, per_flight, per_logits, per_loss = one + (cands - 1) * (two - one)
    total = total + per_flight * flight_extra + per_logits * heads_extra + per_loss * loss_extra
    fits = total.max(axis=0) <= capacity
    return int(cands[fits].max()) if fits.any() else 0


_MBS_GRIDS: dict = track({})  # one layout's `_mbs_grid`, memoised by the integers it is computed from


def _mbs_grid(layout: Layout, kinds: dict, cands, m) -> tuple:
    """`max_micro_batch`'s integers: the stages that can hold the peak, and at each candidate size
    on them the micro-batches in flight beyond one, the live heads beyond one and the live losses
    beyond the heads (read-only arrays)."""
    plan = layout.plan
    sched = SCHEDULE_CODE[plan.schedule]
    stages = peak_candidate_stages(layout, kinds, m)
    flight = in_flight(sched, stages[:, None], layout.pp, m[None, :], layout.vpp, plan.pp_group, plan.framework)
    logits = last_stage_logits_in_flight(sched, m[None, :], plan.framework, layout.pp)
    heads = last_stage_heads_in_flight(sched, m[None, :], plan.framework, layout.pp)
    grid = (stages, flight - 1, heads - 1, logits - heads)
    for a in grid:
        if isinstance(a, np.ndarray):
            a.flags.writeable = False
    return grid
