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

from functools import lru_cache

import numpy as np

from ..plan import Layout, conventions
from ..specs.model import LORA_TARGETS, ModelSpec
from ..units import GiB
from . import activations as act
from . import norm_features
from . import stage_activations as stage_act
from .held import HeldInputs, held
from .memo import Memo, Unhashable, array_key, fresh_copy, read_only, track
from .model_numbers import ModelNumbers, model_numbers
from .pipeline import (
    SCHEDULE_CODE,
    in_flight,
    last_stage_heads_in_flight,
    last_stage_logits_in_flight,
    rules_version,
)
from .placement import ends, placement
from .recipe import Recipe, recipe
from .scalars import any_, floats, maximum, minimum, values, where

FP32 = 4


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
    hd_ = held(mn, r, HeldInputs(dense_layers=dense_layers, moe_layers=moe_layers, first=first, last=last, tp=tp,
                                 cp=cp, ep=ep, dp=dp, zero=zero, dp_shard=dp_shard, lora=lora,
                                 offload_optimizer=offload_optimizer, offload_params=offload_params, pp=pp,
                                 vocab_padded=vocab_padded))
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
        "stage_tensors": sum(stage_act.stage_terms(seq=seq, cp=cp, rope_dim=mn.rope_dim,
                                                   act_bytes=r.residual_bytes, attention=attention).values())
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
    ckpt = stage_act.checkpoint_bytes(h, tokens=tokens, tp=tp, sp=sp, act_bytes=r.residual_bytes)
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
    emb = stage_act.embedding_terms(h, tokens=tokens, seq=seq, cp=cp, tp=tp, sp=sp, dropout=dropout,
                                    learned_positions=float(mn.position_params > 0), mask_bytes=mask_bytes,
                                    frozen=float(lora_saves is not None))
    hd = stage_act.head_terms(h, vocab_padded, tokens=tokens, tp=tp, sp=sp, act_bytes=r.residual_bytes,
                              linear_in_bytes=r.linear_in_bytes, layernorm=mn.layernorm,
                              fused=float(r.fused_kernels), logit_bytes=r.logit_bytes,
                              frozen=float(lora_saves is not None), sp_gathered=float(r.sp_gathers_saved_inputs))
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


def layer_terms_of(shape: act.LayerShape, moe: bool, kw: dict) -> tuple[dict, object]:
    """`layer_terms_and_sum`, memoised for one layout's arguments (scalars, or a few columns of
    micro-batch sizes: a fresh dict of read-only figures); search's arrays computed afresh."""
    key = array_key((shape, moe, tuple(kw), *kw.values()), max_size=16)
    if key is None:
        return layer_terms_and_sum(shape, moe, kw)
    terms, total = _LAYER_TERMS.get(key, lambda: read_only(layer_terms_and_sum(shape, moe, kw)))
    return dict(terms), total


# one layout's per-layer terms, by their arguments: the explorer and repeated plans ask for the
# same micro-batch shapes again
_LAYER_TERMS = Memo(1024)


def layer_terms_and_sum(shape: act.LayerShape, moe: bool, kw: dict) -> tuple[dict, object]:
    """`activations.layer_terms` with the norm, mask and soft-capping terms
    (`norm_features.adjust_layer_terms`) for one layer kind, `kw` the former's keyword
    arguments, and their sum."""
    terms = norm_features.adjust_layer_terms(
        act.layer_terms(shape, moe=moe, **kw), shape, tokens=kw["tokens"], seq=kw["seq"], tp=kw["tp"],
        sp=kw["sp"], act_bytes=kw["act_bytes"], residual_bytes=kw["residual_bytes"], attention=kw["attention"],
        recompute=kw["recompute"], fused=kw["fused"], autocast=kw["autocast"],
        frozen=float(kw["saves"] is not None))
    return terms, sum(terms.values())


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
        dense_layers=_per_stage(tuple(layout.stage_dense_layers)),
        moe_layers=_per_stage(tuple(layout.stage_moe_layers)),
        first=first, last=last, in_flight_mb=flight, logits_in_flight=logits, head_in_flight=heads,
        tp=layout.tp, sp=layout.sp, cp=layout.cp, ep=layout.ep, dp=layout.dp, zero=layout.zero,
        dp_shard=layout.dp_shard,
        mbs=layout.mbs, seq=layout.seq_len, vocab_padded=layout.vocab_padded,
        attention=act.ATTENTION_CODE[layout.model.attention_kernel(plan.attention)], recompute=recompute_code(plan),
        modules=recompute_modules(plan),
        fp8_cache=fp8_cache_flags(plan),
        recompute_layers=layout.recompute_layers_per_stage if plan.recompute_layers is not None else 10**9,
        dropout=float(plan.dropout > 0), lora=lora, lora_saves=lora_saves(plan), lora_rank=plan.lora_rank,
        offload_optimizer=plan.offload_optimizer, offload_params=plan.offload_params, pp=pp,
        reserved_bytes=reserved, fragmentation=frag,
    )


@lru_cache(maxsize=256)
def _per_stage(counts: tuple) -> np.ndarray:
    """Each stage's count as a float array (read-only; one split's memoised)."""
    out = np.asarray(counts, dtype=float)
    out.flags.writeable = False
    return out


@track
@lru_cache(maxsize=128)
def _schedule_inputs(schedule: str, framework: str, pp: int, micro_batches: int, vpp: int, group,
                     version: tuple) -> tuple:
    """`layout_inputs`' figures of the pipeline schedule: the stages holding the model's first
    and last layers, each stage's micro-batches in flight, and the last stage's live logits and
    heads (read-only arrays; one schedule's memoised, `version` the rules registered)."""
    sched = SCHEDULE_CODE[schedule]
    out = (*_both_ends(schedule, framework, pp),
           in_flight(sched, stage_indices(pp), pp, micro_batches, vpp, group, framework),
           last_stage_logits_in_flight(sched, micro_batches, framework, pp),
           last_stage_heads_in_flight(sched, micro_batches, framework, pp))
    for a in out:
        if isinstance(a, np.ndarray):
            a.flags.writeable = False
    return out


@lru_cache(maxsize=64)
def stage_indices(pp: int) -> np.ndarray:
    """The stage indices 0..pp-1 as floats, as the in-flight rules take them (read-only)."""
    out = np.arange(pp, dtype=float)
    out.flags.writeable = False
    return out


def recompute_code(plan) -> int:
    """RECOMPUTE_CODE for the layers' saved tensors of a plan (`priced_recompute`)."""
    return priced_recompute(act.RECOMPUTE_CODE[plan.recompute], plan.recompute_modules)


def priced_recompute(code, modules):
    """The RECOMPUTE_CODE the layers are priced at for a recomputation `code` (a number or an
    array of them) and the plan's `modules` (--recompute-modules; None: the default):
    selective recomputation recomputes the attention core unless its modules leave core_attn
    out, and then saves what no recomputation does (its modules discarding their own outputs,
    `recompute_modules`)."""
    if modules is None or "core_attn" in modules:
        return code
    return where(values(code) == act.RECOMPUTE_CODE["selective"], act.RECOMPUTE_CODE["none"], code)


def recompute_modules(plan) -> dict | None:
    """1.0 for each output-discarding module selective recomputation re-runs (None: none)."""
    return module_flags(plan.recompute_modules) if plan.recompute == "selective" else None


def module_flags(modules) -> dict | None:
    """1.0 for each output-discarding module (RECOMPUTE_MODULES but core_attn) among `modules`
    (None where they name none)."""
    if not modules:
        return None
    return {name: float(name in modules) for name in act.RECOMPUTE_MODULES if name != "core_attn"}


def fp8_cache_flags(plan) -> dict | None:
    """1.0 for each tensor the plan keeps in low precision beyond the linears' inputs (--fp8-cache;
    None: none)."""
    return {name: 1.0 for name in plan.fp8_cache} if plan.fp8_cache else None


def _both_ends(schedule: str, framework: str, pp: int) -> tuple[np.ndarray, np.ndarray]:
    """Which stages hold the embedding and which the output head, for memory (1.0 where they do;
    read-only arrays, `placement.ends`)."""
    return ends(placement(schedule, framework), pp)[:2]


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
    key = array_key((mn, r, layout.mbs, *inputs.values()), checked=False)
    if key is None:
        return _memory_and_line(mn, r, layout.mbs, inputs)
    try:
        memory, line = _MEMORY_AND_LINE.get(key, lambda: read_only(_memory_and_line(mn, r, layout.mbs, inputs)))
    except Unhashable:
        return _memory_and_line(mn, r, layout.mbs, inputs)
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
