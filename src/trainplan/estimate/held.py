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


def _held(mn: ModelNumbers, r: Recipe, x: HeldInputs) -> dict:
    p = _parameters(mn, x)
    # ZeRO shards over the data-parallel group (times CP, whose ranks hold the same
    # parameters), or under hybrid sharding over its dp_shard-rank part; expert parameters over
    # the expert-data-parallel group dp·cp/ep (dp_shard·cp/ep).
    shard_dense = (x.dp if x.dp_shard is None else x.dp_shard) * x.cp
    shard_expert = maximum(shard_dense / x.ep, 1)
    # FSDP1 runs NO_SHARD whatever strategy it is given when its shard group is one rank
    # (torch/distributed/fsdp/_init_utils.py: "FSDP is switching to use `NO_SHARD` ... since the
    # world size is 1"): ZeRO-0's memory
    zero = where(r.single_rank_no_shard & (values(shard_dense) <= 1), 0, x.zero)

    def sharded(per_param_bytes, stage_from):
        div_d = where(zero >= stage_from, shard_dense, 1)
        div_e = where(zero >= stage_from, shard_expert, 1)
        return per_param_bytes * (p["trainable_dense"] / div_d + p["trainable_expert"] / div_e)

    weights, gathered = _weights(mn, r, x, p, zero, shard_dense, shard_expert)
    grads = _gradients(mn, r, x, gathered, zero, sharded(r.grad_bytes, r.grads_sharded_from_zero))
    master = where(x.offload_optimizer, 0.0, sharded(r.master_bytes, 1))
    opt_state = sharded(r.optimizer_bytes, 1)
    if r.factored_optimizer:
        opt_state = opt_state + _factored_state(mn, x) * r.state_bytes / where(zero >= 1, shard_dense, 1)
    opt_state = where(x.offload_optimizer, 0.0, opt_state)
    offloaded_state = ((sharded(r.master_bytes, 1) + sharded(r.optimizer_bytes, 1)) if any_(x.offload_optimizer)
                       else 0.0)
    return {"d_dense": p["d_dense"], "d_exp": p["d_exp"], "m_dense": p["m_dense"], "m_exp": p["m_exp"],
            "embed": p["embed"], "head": p["head"], "p_stage": p["p_stage"], "adapters": p["adapters"],
            "layer_max_adapters": p["layer_max_adapters"], "trainable": p["trainable"], "shard_dense": shard_dense,
            "zero": zero, "dense_matrices": p["dense_matrices"], "moe_matrices": p["moe_matrices"],
            "layer_matrices": p["layer_matrices"],
            "uncast_experts": mn.moe.expert / (x.ep * x.tp) * float(mn.shape.grouped_experts and not r.fused_kernels),
            "weights": weights, "grads": grads, "master": master, "opt_state": opt_state, **gathered,
            "offloaded_state": offloaded_state}


def _parameters(mn: ModelNumbers, x: HeldInputs) -> dict:
    """The parameters a stage's rank holds (`_held`): per layer of each kind (dense and expert
    parts), the embedding and the head, in all and trainable (under LoRA the adapters alone),
    and its layers' weight matrices."""
    h, tp, ep, dense_layers, moe_layers = mn.hidden, x.tp, x.ep, x.dense_layers, x.moe_layers
    d_dense, d_exp = _per_rank(mn.dense, tp, ep, mn.kv_heads)
    m_dense, m_exp = _per_rank(mn.moe, tp, ep, mn.kv_heads)
    embed = x.vocab_padded * h / tp + mn.position_params
    head_matrix = where((mn.tied) & (values(x.pp) == 1), 0.0, x.vocab_padded * h / tp)
    head = head_matrix + mn.norm_params + mn.head_bias * x.vocab_padded / tp
    p_dense = dense_layers * d_dense + moe_layers * m_dense + x.first * embed + x.last * head
    p_expert = dense_layers * d_exp + moe_layers * m_exp
    adapters = (dense_layers * mn.dense.lora + moe_layers * mn.moe.lora) / tp
    trainable_dense = where(x.lora, adapters, p_dense)
    trainable_expert = where(x.lora, 0.0, p_expert)
    dense_matrices, moe_matrices = (layer_matrix_params(lp, tp, ep, mn.kv_heads) for lp in (mn.dense, mn.moe))
    return {"d_dense": d_dense, "d_exp": d_exp, "m_dense": m_dense, "m_exp": m_exp, "embed": embed, "head": head,
            "p_dense": p_dense, "p_expert": p_expert, "p_stage": p_dense + p_expert, "adapters": adapters,
            "layer_max_adapters": maximum(where(dense_layers > 0, mn.dense.lora, 0.0),
                                          where(moe_layers > 0, mn.moe.lora, 0.0)) / tp,
            "trainable_dense": trainable_dense, "trainable_expert": trainable_expert,
            "trainable": trainable_dense + trainable_expert, "dense_matrices": dense_matrices,
            "moe_matrices": moe_matrices, "layer_matrices": dense_layers * dense_matrices + moe_layers * moe_matrices}


def _weights(mn: ModelNumbers, r: Recipe, x: HeldInputs, p: dict, zero, shard_dense, shard_expert) -> tuple:
    """The weights' bytes a stage's rank holds (`_held`), and what FSDP keeps gathered beside its
    shards: the flags saying when, the gathered parameters and the unsharded gradients."""
    # LoRA/QLoRA: the layers' weight matrices are frozen (quantized under QLoRA, which
    # bitsandbytes applies to nn.Linear layers only); embeddings, output head and norms stay
    # in the 16-bit compute dtype.
    quantizable = p["layer_matrices"]
    frozen_bytes = quantizable * r.frozen_weight_bytes + (p["p_stage"] - quantizable) * r.compute_weight_bytes
    weights_sharded = r.weights_sharded(zero)
    weights = where(x.lora, frozen_bytes + p["adapters"] * r.weight_bytes,
                    p["p_dense"] * r.weight_bytes / where(weights_sharded, shard_dense, 1)
                    + p["p_expert"] * r.weight_bytes / where(weights_sharded, shard_expert, 1))
    weights = where(x.offload_params, 0.0, weights)
    # Pipelined FSDP (Recipe.keeps_stage_gathered): the stage's parameters stay gathered in the
    # compute dtype and its gradients accumulate unsharded in the reduce dtype all step, beside
    # the sharded copies; FSDP's SHARD_GRAD_OP keeps each unit gathered from its forward to its
    # backward, the whole stage when the backward starts (LoRA's frozen base is never sharded
    # here, so it has nothing to add)
    not_lora = ~bools(x.lora)
    pipelined_fsdp = r.keeps_stage_gathered(x.pp, zero) & not_lora
    forward_to_backward = r.keeps_gathered_forward_to_backward(zero) & not_lora & ~pipelined_fsdp
    stage_gathered = (pipelined_fsdp & weights_sharded) | forward_to_backward
    params_gathered = where(stage_gathered, p["p_stage"] * r.compute_weight_bytes, 0.0)
    grads_unsharded = where(pipelined_fsdp, p["trainable"] * r.reduce_bytes, 0.0)
    return weights + params_gathered, {"pipelined_fsdp": pipelined_fsdp, "forward_to_backward": forward_to_backward,
                                       "params_gathered": params_gathered, "grads_unsharded": grads_unsharded}


def _gradients(mn: ModelNumbers, r: Recipe, x: HeldInputs, gathered: dict, zero, grads):
    """The gradients' bytes a stage's rank holds (`_held`), from its sharded ones (`grads`) and
    what FSDP keeps gathered (`_weights`)."""
    # The unsharded gradients and the sharded ones are not alive together: the optimizer's
    # zero_grad (set_to_none) frees the shards before the step's first backward, and at the last
    # micro-batch FSDP2 drops each unit's unsharded gradient as it reduce-scatters it into its
    # shard (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py post_backward:
    # "fsdp_param.unsharded_accumulated_grad = None"): the larger of the two at any time. (Summing
    # them charged an expert-parallel stage whose experts have one rank to shard over, e.g.
    # DeepSeek-V3 on 16 H100s at PP 2, EP 8, DP 8, twice its expert gradients: 1,140 GiB at
    # ZeRO-2 against 980 GiB replicated.)
    grads = where(gathered["pipelined_fsdp"], maximum(grads, gathered["grads_unsharded"]), grads)
    if r.tp_embedding_grad_replicated and not mn.tied:
        # DTensor's vocabulary-parallel embedding returns a replicated V x h gradient (an
        # untied embedding without ZeRO-2/3, which reshard gradients like their parameters).
        grads = grads + where(x.lora | (zero >= 2), 0.0,
                              x.first * x.vocab_padded * mn.hidden * (1 - 1 / x.tp) * r.grad_bytes)
    return grads


def _factored_state(mn: ModelNumbers, x: HeldInputs):
    """A factored optimizer's (Adafactor's) row and column statistics a stage's rank holds, per
    element of its state (`_held`); under LoRA only the adapters train, each of A and B a matrix
    of its own."""
    h, tp, dense_layers, moe_layers = mn.hidden, x.tp, x.dense_layers, x.moe_layers
    return where(x.lora, (dense_layers * mn.dense.lora_factored + moe_layers * mn.moe.lora_factored) / tp,
                 dense_layers * (mn.dense.factored_rep + mn.dense.factored_split / tp)
                 + moe_layers * (mn.moe.factored_rep + mn.moe.factored_split / tp)
                 + x.first * (x.vocab_padded + h) + x.last * (x.vocab_padded + h + mn.norm_params))
