"""The parameters a pipeline stage's rank holds and their bytes: weights, gradients, master
copy and optimizer state under ZeRO / FSDP sharding, offloading and LoRA (`stage_memory`'s
first four terms)."""

from __future__ import annotations

from typing import NamedTuple

from .memo import Memo, array_key, read_only
from .model_numbers import ModelNumbers, _per_rank, layer_matrix_params
from .recipe import Recipe
from .scalars import any_, bools, maximum, values, where


class HeldInputs(NamedTuple):
    """What the parameters a stage's rank holds are computed from beside the model's numbers and
    the recipe (numbers, or arrays over layouts and stages: they broadcast)."""

    dense_layers: object  # the stage's dense layers
    moe_layers: object  # ... and MoE layers
    first: object  # 1.0 where the stage holds the embedding
    last: object  # ... and the output head
    tp: object
    cp: object
    ep: object
    dp: object
    zero: object  # the ZeRO stage
    dp_shard: object  # the data-parallel ranks ZeRO shards over (None: all dp)
    lora: object  # LoRA / QLoRA: only the adapters train
    offload_optimizer: object
    offload_params: object
    pp: object
    vocab_padded: object


def held(mn: ModelNumbers, r: Recipe, inputs: HeldInputs) -> dict:
    """The parameters a stage's rank holds and their bytes (`stage_memory`'s weights, gradients,
    master copy and optimizer state, and what it derives them from); one layout's memoised
    (scalars, or a few stages: read-only figures)."""
    key = array_key((mn, r, *inputs))  # (arrays of at most 64 entries: one layout's stages)
    if key is None:
        return _held(mn, r, inputs)
    return _HELD.get(key, lambda: read_only(_held(mn, r, inputs)))


_HELD = Memo(256)


def _held(mn: ModelNumbers, r: Recipe, inputs: HeldInputs) -> dict:
    (dense_layers, moe_layers, first, last, tp, cp, ep, dp, zero, dp_shard, lora, offload_optimizer, offload_params,
     pp, vocab_padded) = inputs
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
