"""One micro-batch on each pipeline stage (DESIGN §3): the layers' GEMMs, attention and
element-wise work, the recomputation, and the tensor-, expert- and context-parallel
collectives and pipeline transfers each layer exposes. Nothing here depends on the schedule.
"""

from __future__ import annotations

import numpy as np

from . import activations as act
from . import all_to_all, comm, norm_features
from .attention_rates import flash_efficiency, flash_head_dim
from .collectives import collective, link, overlapped
from .flops import (
    ATTN_BWD_EAGER,
    ATTN_BWD_FUSED,
    first_input_grad_skipped,
    layer_flops,
    op_sac_recomputed,
)
from .gemm_rates import (
    _gemm_time,
    attention_input_gemms,
    column_gemms,
    last_linear_time,
    layer_gemm_time,
    layer_gemms,
    lora_gemms,
)
from .hardware import Hardware
from .memo import Memo, fresh_copy, read_only, scalar_call
from .norm_features import causal_keys
from .recipe import recipe
from .scalars import SCALAR_TYPES, floats, maximum, minimum, values, where


def lora_arguments(plan) -> dict:
    """`stage_times`' and `step_flops`' LoRA arguments for a plan: its targets and rank under
    LoRA/QLoRA, and whether its recomputation checkpoints the first layer reentrantly (without
    early stop; any layers recomputed include the first); none when it trains in full."""
    if plan.finetune == "full":
        return {}
    return {"lora_targets": tuple(plan.lora_targets), "lora_rank": plan.lora_rank,
            "reentrant_checkpoint": not recipe(plan).early_stop_checkpoint and plan.recompute_layers != 0}


def stage_times(model, hw: Hardware, r, *, tp, pp, dp, cp, ep, mbs, seq, recompute, eager, dropout,
                overlap_tp, gpn, stage_dense, stage_moe, first, last, total_dense, total_moe,
                vocab_padded, sp=False, sharp=False, cp_allgather=False, lora_targets=None, lora_rank=0,
                reentrant_checkpoint=False, recompute_layers=None, ep_node_limit=None, ep_overlap=False) -> dict:
    """One micro-batch's forward + backward seconds on each stage, by part ("parts", stage
    axis last), the same summed over all stages ("totals") and the point-to-point transfer
    between stages ("p2p"). Nothing here depends on the pipeline schedule. `lora_targets`
    (LoRA/QLoRA fine-tuning): the base weights are frozen, so their backward computes input
    gradients only, and rank-`lora_rank` adapters on the targeted linears add their GEMMs
    (`reentrant_checkpoint`: see `flops.first_input_grad_skipped`). Full recomputation re-runs
    the first `recompute_layers` layers of each stage (all when None)."""
    f = floats
    lt = layer_times(model, hw, r, tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, mbs=mbs, seq=seq, recompute=recompute,
                     eager=eager, dropout=dropout, overlap_tp=overlap_tp, gpn=gpn, vocab_padded=vocab_padded, sp=sp,
                     sharp=sharp, cp_allgather=cp_allgather, lora_targets=lora_targets, lora_rank=lora_rank,
                     reentrant_checkpoint=reentrant_checkpoint, ep_node_limit=ep_node_limit)
    rc, pp = f(recompute), f(pp)
    compute, recompute_extra, layer, head = lt["compute"], lt["recompute_extra"], lt["layer"], lt["head"]
    embed_passes, embed_fwd, first_input_grad = lt["embed_passes"], lt["embed_fwd"], lt["first_input_grad"]
    tp_fwd, tp_bwd, tp_extra, a2a = lt["tp_fwd"], lt["tp_bwd"], lt["tp_extra"], lt["a2a"]
    cp_layer, cp_extra, p2p = lt["cp_layer"], lt["cp_extra"], lt["p2p"]

    def ep_exposed(one, recomputed, overlap=ep_overlap):
        """One MoE layer's exposed all-to-all seconds per micro-batch."""
        total = 4 * one
        return where(f(overlap) > 0, overlapped(total, compute["moe"] + recomputed * recompute_extra["moe"],
                                                   hw.overlap_slowdown), total)

    def per_stage(dense, moe, first_, last_, n_stages, recomputed):
        """recomputed: the share of the layers whose recomputation is paid"""
        return {
            "compute": dense * (compute["dense"] + recomputed * recompute_extra["dense"])
            + moe * (compute["moe"] + recomputed * recompute_extra["moe"]) + last_ * head
            + first_ * (embed_passes * embed_fwd - first_input_grad),
            "tp_comm": dense * (tp_fwd + tp_bwd + recomputed * tp_extra["dense"])
            + moe * (tp_fwd + tp_bwd + recomputed * tp_extra["moe"]),
            "ep_comm": moe * ep_exposed(a2a, recomputed),
            "cp_comm": (dense + moe) * (cp_layer + recomputed * cp_extra),
            "pp_comm": n_stages * 2 * p2p,
        }

    stage_layers = f(stage_dense) + f(stage_moe)
    share = recomputed_share(rc, recompute_layers, stage_layers)
    parts = per_stage(f(stage_dense), f(stage_moe), f(first), f(last), 1.0, share)
    totals = per_stage(f(total_dense), f(total_moe), 1.0, 1.0, pp,
                       model_recomputed_share(rc, recompute_layers, stage_layers))
    # the terms above, one layer of each kind and one micro-batch (for `plan --explain`)
    # (the collectives per layer: with a recomputation's share of them where only some layers are recomputed)
    detail = {"layer": layer, "tp_layer": {kind: tp_fwd + tp_bwd + share * tp_extra[kind] for kind in tp_extra},
              "cp_layer": cp_layer + share * cp_extra, "ep_layer": ep_exposed(a2a, share),
              "a2a": a2a, "moe_layer_compute": compute["moe"] + share * recompute_extra["moe"],
              "head": head, "embedding": embed_passes * embed_fwd, "p2p": p2p,
              # one layer's tensor-parallel seconds by pass (the recomputation's: full recomputation)
              "tp_passes": {kind: {"forward": tp_fwd, "backward": tp_bwd, "recompute": tp_extra[kind]}
                            for kind in tp_extra}}
    # what DualPipe's overlap of one micro-batch's all-to-alls with another's compute saves where
    # the plan does not already overlap them (step_from_stages applies it under that schedule)
    saving = {"ep_saving": f(stage_moe) * (ep_exposed(a2a, share, False) - ep_exposed(a2a, share, True))
              * (f(ep_overlap) == 0)}
    slow = slowest_stage(parts, saving)
    ep_saving_total = f(total_moe) * (ep_exposed(a2a, 1.0, False) - ep_exposed(a2a, 1.0, True)) * (f(ep_overlap) == 0)
    return {**slow, "ep_saving": slow["slowest_extra"]["ep_saving"], "ep_saving_total": ep_saving_total,
            "totals": sum(totals.values()), "p2p": p2p, "detail": detail}


def layer_times(model, hw: Hardware, r, *, tp, pp, dp, cp, ep, mbs, seq, recompute, eager, dropout, overlap_tp, gpn,
                vocab_padded, sp=False, sharp=False, cp_allgather=False, lora_targets=None, lora_rank=0,
                reentrant_checkpoint=False, ep_node_limit=None) -> dict:
    """One layer of each kind, one micro-batch (`stage_times`' per-layer terms): its compute by
    part ("layer"), with and without what recomputation adds ("compute", "recompute_extra"), its
    exposed tensor-, expert- and context-parallel collectives, the pipeline transfer, the output
    head's and the embedding's seconds. Nothing here depends on the stage; one layout's
    (scalars) memoised."""
    args = (model, hw, r, tp, pp, dp, cp, ep, mbs, seq, recompute, eager, dropout, overlap_tp, gpn, vocab_padded,
            sp, sharp, cp_allgather, lora_targets, lora_rank, reentrant_checkpoint, ep_node_limit)
    return fresh_copy(scalar_call(_LAYER_TIMES, _layer_times_kept, *args))


_LAYER_TIMES = Memo(1024)


def _layer_times_kept(*args) -> dict:
    """`_layer_times`, as a memo keeps it (read-only arrays)."""
    return read_only(_layer_times(*args))


def _layer_times(model, hw: Hardware, r, tp, pp, dp, cp, ep, mbs, seq, recompute, eager, dropout, overlap_tp, gpn,
                 vocab_padded, sp, sharp, cp_allgather, lora_targets, lora_rank, reentrant_checkpoint,
                 ep_node_limit) -> dict:
    f = floats
    tp, pp, dp, cp, ep, mbs, seq = (f(x) for x in (tp, pp, dp, cp, ep, mbs, seq))
    rc = f(recompute)
    eager, overlap_tp = f(eager) > 0, f(overlap_tp) > 0
    elem = r.act_bytes
    h = model.hidden
    tokens = mbs * seq / cp
    kvh = model.heads if model.is_mla else model.n_kv_heads
    frozen = lora_targets is not None
    gemm, gemm_bwd = ({kind: layer_gemm_time(layer_gemms(model, kind == "moe"), tokens, tp, ep, kvh, model.top_k,
                                             hw.gemm_peak, hw.gemm_eff, hw.sms, elem, hw.gemm_curve, backward,
                                             weight_grad=not frozen)
                       for kind in ("dense", "moe")} for backward in (False, True))
    first_input_grad = 0.0
    if frozen:  # the adapters: x·A then ·B forward, both gradients of each in the backward
        for backward, out in ((False, gemm), (True, gemm_bwd)):
            for kind in ("dense", "moe"):
                out[kind] = out[kind] + layer_gemm_time(
                    lora_gemms(model, kind == "moe", tuple(lora_targets), int(lora_rank)), tokens, tp, ep, kvh,
                    model.top_k, hw.gemm_peak, hw.gemm_eff, hw.sms, elem, hw.gemm_curve, backward)
        # the frozen embedding's output needs no gradient: the first layer's attention input
        # projections skip their input-gradient GEMMs (flops.step_flops counts the same)
        first_input_grad = layer_gemm_time(attention_input_gemms(model), tokens, tp, ep, kvh, model.top_k,
                                           hw.gemm_peak, hw.gemm_eff, hw.sms, elem, hw.gemm_curve, True,
                                           weight_grad=False) * first_input_grad_skipped(rc, reentrant_checkpoint)
    attn, attn_backward = _attention_times(model, hw, tokens=tokens, tp=tp, cp=cp, mbs=mbs, seq=seq, eager=eager,
                                           elem=elem)
    elementwise, elementwise_bwd = _elementwise_times(model, hw, r, tokens=tokens, tp=tp, sp=sp, dropout=dropout)
    dequant, adapter_drop = _adapter_passes(model, hw, r, lora_targets, tokens=tokens, tp=tp, ep=ep)
    # A non-reentrant checkpoint with early stop ends a dense block's recomputation before its
    # last linear (flops.py): that GEMM, and the TP collective after it, are not re-run.
    skip = float(r.recompute_skips_last_linear)
    shared = model.shared_ffn_total * (not model.shared_expert_gate)
    skipped = {"dense": skip * last_linear_time(layer_gemms(model, False), tokens, tp, hw.gemm_peak, hw.gemm_eff,
                                                hw.sms, elem, hw.gemm_curve),
               "moe": skip * (_gemm_time(tokens, h, shared / tp, 1, hw.gemm_peak, hw.gemm_eff, hw.sms, elem,
                                         hw.gemm_curve) if shared else 0.0)}
    op_sac_gemm_share = (op_sac_recomputed(model) / max(layer_flops(model).dense_gemm, 1.0)
                         * float(r.linear_in_bytes >= 2))  # float8 matmuls are all saved
    # per layer: its time without recomputation, and what recomputation adds to it
    compute, recompute_extra, layer = {}, {}, {}
    for kind in gemm:
        elem_fwd, elem_bwd = elementwise[kind] + adapter_drop[kind], elementwise_bwd[kind] + adapter_drop[kind]
        fwd = gemm[kind] + attn + elem_fwd + dequant[kind]
        # per-op selective checkpointing re-runs every second matmul (by FLOPs' share of the GEMM
        # time) and every element-wise op, not the attention core (flops.op_sac_recomputed)
        op_sac = gemm[kind] * op_sac_gemm_share + elem_fwd
        recompute_extra[kind] = where(rc == 2, fwd - skipped[kind],
                                         where(rc == 1, attn, where(rc == 3, op_sac, 0.0)))
        compute[kind] = fwd + gemm_bwd[kind] + attn_backward + elem_bwd + dequant[kind]
        layer[kind] = {"gemm_forward": gemm[kind], "gemm_backward": gemm_bwd[kind], "attention_forward": attn,
                       "attention_backward": attn_backward, "elementwise_forward": elem_fwd,
                       "elementwise_backward": elem_bwd, "dequantize": dequant[kind],
                       "recompute": recompute_extra[kind], "total": compute[kind] + recompute_extra[kind]}
    comms = _layer_comm(model, hw, r, tokens=tokens, tp=tp, ep=ep, cp=cp, dp=dp, pp=pp, gpn=gpn, sharp=sharp, sp=sp,
                        overlap_tp=overlap_tp, cp_allgather=cp_allgather, ep_node_limit=ep_node_limit, rc=rc,
                        skip=skip, frozen=frozen, kv_heads=kvh, gemm_dense=gemm["dense"],
                        gemm_bwd_dense=gemm_bwd["dense"], attn=attn, vocab_padded=vocab_padded)
    return {"compute": compute, "recompute_extra": recompute_extra, "layer": layer,
            "first_input_grad": first_input_grad, **comms}


def _elementwise_times(model, hw: Hardware, r, *, tokens, tp, sp, dropout) -> tuple[dict, dict]:
    """One layer's element-wise passes per micro-batch at HBM speed, by layer kind: (forward
    seconds, backward seconds)."""
    f, h, elem = floats, model.hidden, r.act_bytes
    # norms, residual adds and dropout see the full hidden width of every token, or 1/t of the
    # tokens under sequence parallelism (Korthikanti et al. 2022 §4.2.2); the MLP activation
    # and RoPE work on the TP-sharded width, in an MoE layer on each of a token's top-k routed
    # copies (expert parallelism brings a rank as many as it sends) and the shared experts
    hidden_shard = where(f(sp) > 0, tp, 1.0)
    mlp_width = {"dense": model.ffn,
                 "moe": model.top_k * (model.expert_ffn or model.ffn) + model.shared_ffn_total if model.is_moe else 0}
    drop_fwd, drop_bwd = dropout_passes(r.fused_kernels, elem)
    dropped = f(dropout) > 0
    elementwise, elementwise_bwd = {}, {}
    for kind, width in mlp_width.items():
        sharded = model.mlp_matrices * width / tp \
            + (2 * (model.q_dim + model.kv_dim) / tp if model.position == "rotary" else 0)
        passes = 10 + norm_features.extra_norm_passes(model)  # norms, residual adds (and sandwich norms)
        elementwise[kind] = tokens * ((passes + drop_fwd * dropped) * h / hidden_shard + sharded) * elem / hw.hbm
        elementwise_bwd[kind] = tokens * ((2 * passes + drop_bwd * dropped) * h / hidden_shard + 2 * sharded) * elem / hw.hbm
    return elementwise, elementwise_bwd


def _adapter_passes(model, hw: Hardware, r, lora_targets, *, tokens, tp, ep) -> tuple[dict, dict]:
    """LoRA's and QLoRA's extra passes per layer and micro-batch at HBM speed, by layer kind:
    (dequantization seconds, adapter dropout seconds); none when training in full."""
    elem = r.act_bytes
    # QLoRA (bitsandbytes' MatMul4Bit): every use of a quantized weight dequantizes it to the
    # compute dtype first, in the forward (and a recomputed forward) and for the backward's input
    # gradient: a pass reading the packed weight and writing the 16-bit one
    dequant = {kind: 0.0 for kind in ("dense", "moe")}
    # LoRA's dropout on each adapter's input: a pass reading it and writing the dropped copy and
    # its 1-byte mask, and in the backward one reading the gradient and the mask
    adapter_drop = {kind: 0.0 for kind in ("dense", "moe")}
    if lora_targets is not None:
        from .model_numbers import layer_matrix_params, model_numbers

        mn = model_numbers(model)
        targets = {name: 1.0 for name in lora_targets}
        for kind, lp in (("dense", mn.dense), ("moe", mn.moe)):
            if r.frozen_weight_bytes < r.compute_weight_bytes:
                dequant[kind] = layer_matrix_params(lp, tp, ep, mn.kv_heads) * (r.frozen_weight_bytes + elem) / hw.hbm
            if r.lora_dropout:
                widths = act.adapter_inputs(mn.shape, targets, moe=kind == "moe", tp=tp)
                adapter_drop[kind] = tokens * widths * (2 * elem + act.MASK_BYTES) / hw.hbm
    return dequant, adapter_drop


def _attention_times(model, hw: Hardware, *, tokens, tp, cp, mbs, seq, eager, elem) -> tuple:
    """One layer's attention core per micro-batch: (forward seconds, backward seconds)."""
    heads_local = model.heads / tp
    qk = model.q_dim / model.heads
    vd = model.attn_out_dim / model.heads
    eff16, curve16 = hw.gemm16
    attn_eager = 2 * _gemm_time(seq, seq, qk, mbs * heads_local / cp, hw.peak, eff16, hw.sms, elem, curve16) \
        + (mbs * heads_local * seq * seq / cp) * elem * (4 + norm_features.softcap_passes(model)) / hw.hbm  # softmax, mask
    # FlashAttention: the causal half of 2·s·(qk + v) per token and head, at its efficiency
    # for the s/cp tokens one kernel call spans (a context-parallel ring computes s/cp blocks),
    # over the head dimensions the kernel pads to
    qk_run, vd_run = (flash_head_dim(d, hw.attention_kernel, hw.flash_head_dim_multiple) for d in (qk, vd))
    # (on sliding-window layers the window's keys: norm_features.causal_keys)
    attn_flops = tokens * causal_keys(seq, model.sliding_share, model.sliding_window or 0) * heads_local * 2 * (
        qk_run + vd_run)
    attn_flash = attn_flops / (hw.peak * flash_efficiency(hw, seq / cp))
    attn_bwd = where(eager, ATTN_BWD_EAGER, ATTN_BWD_FUSED)
    # forward + backward at the kernel's combined efficiency; where its forward alone is
    # published (Hopper FA2, cuDNN, the Triton kernel) the forward, and a recomputed forward,
    # take that speed and the backward the rest of the same total
    attn_total = where(eager, attn_eager, attn_flash) * (1 + attn_bwd)
    attn = where(eager, attn_eager, attn_flash if hw.flash_fwd_curve is None else
                    attn_flops / (hw.peak * flash_efficiency(hw, seq / cp, forward=True)))
    attn_backward = attn_total - attn
    return attn, attn_backward


def _layer_comm(model, hw: Hardware, r, *, tokens, tp, ep, cp, dp, pp, gpn, sharp, sp, overlap_tp, cp_allgather,
                ep_node_limit, rc, skip, frozen, kv_heads, gemm_dense, gemm_bwd_dense, attn, vocab_padded) -> dict:
    """`layer_times`' collectives per layer and micro-batch (tensor-, expert- and context-
    parallel), the pipeline transfer, and the output head's and the embedding's seconds."""
    f = floats
    elem = r.act_bytes
    h = model.hidden
    kvh = kv_heads
    # -- communication per layer and micro-batch
    # (each call at the algorithm and protocol NCCL picks for its size: comm.nccl_call)
    tp_ar = collective(hw, comm.ALL_REDUCE, tokens * h * elem, tp, 1, gpn, sharp)
    # Chunked TP overlap (Megatron --tp-comm-overlap) hides the collectives behind the GEMMs of
    # the same pass; what exceeds them stays exposed.
    tp_fwd = where(overlap_tp, maximum(0.0, 2 * tp_ar - gemm_dense), 2 * tp_ar)
    tp_bwd = where(overlap_tp, maximum(0.0, 2 * tp_ar - gemm_bwd_dense),
                      tp_backward(model, hw, r, tp_ar, tokens=tokens, tp=tp, ep=ep, kv_heads=kvh, sp=f(sp) > 0,
                                  frozen=frozen))
    # (early stop: the attention's collective only; per-op selective checkpointing keeps the
    # reduce-scatters' outputs and re-runs the all-gathers, or every all-reduce without SP)
    tp_extra = {kind: where(rc == 2, tp_fwd * (1 - 0.5 * (kind == "dense") * skip),
                               where(rc == 3, tp_fwd * where(f(sp) > 0, 0.5, 1.0), 0.0))
                for kind in ("dense", "moe")}
    # EP: a dispatch and a combine each way per MoE layer (estimate/all_to_all.py; a recomputed
    # forward's are not priced); beside another micro-batch's compute under `ep_overlap`
    # (DualPipe), what outlasts that compute and the slowdown of the compute it overlaps exposed
    a2a = all_to_all.dispatch_time(h * elem, tokens, model.top_k, ep, tp * cp, gpn,
                                   hw.a2a_nvlink or hw.nvlink, hw.nic, link(hw, comm.ALL_TO_ALL, ep, tp * cp, gpn)[1],
                                   ep_node_limit) if model.is_moe else 0.0
    cp_ring = collective(hw, comm.ALL_GATHER, tokens * 2 * model.kv_dim / tp * elem * cp, cp, tp, gpn)
    # The ring passes K/V blocks around while attention runs (forward, and K/V plus their
    # gradients in the backward); the all-gather variant (Llama 3, Dubey et al. 2024 §3.3.2)
    # gathers K/V before attention and reduce-scatters their gradients after it, "exposed in
    # the critical path", again for a recomputed forward.
    cp_layer = where(f(cp_allgather) > 0, 2 * cp_ring, 3 * maximum(0.0, cp_ring - attn))
    cp_extra = where(f(cp_allgather) > 0, (rc == 2) * cp_ring, 0.0)
    # PP: each micro-batch sends 1/t of its activations forward and their gradients back
    # (Megatron's scatter-gather optimization, Narayanan et al. 2021 §4.1), on the critical
    # path of 1F1B; neighbouring stages are tp·cp·dp ranks apart.
    p2p = where(pp > 1, comm.collective_time(comm.SEND_RECV, tokens * h * elem / tp, 2,
                                                *link(hw, comm.SEND_RECV, 2, tp * cp * dp, gpn)), 0.0)
    # the output head's GEMM forward and its two backward GEMMs (frozen: the input gradient's
    # only), and the loss's passes over the logits
    eff16, curve16 = hw.gemm16
    head = (2 if frozen else 3) * _gemm_time(tokens, vocab_padded / tp, h, 1, hw.peak, eff16, hw.sms, elem, curve16) \
        + tokens * vocab_padded / tp * (r.loss_traffic_bytes + r.loss_backward_bytes) / hw.hbm
    # the embedding's lookup, and its gradient's two passes unless it is frozen
    embed_fwd = tokens * h * elem * 2 / hw.hbm
    embed_passes = 1 if frozen else 3

    return {"head": head, "embed_passes": embed_passes, "embed_fwd": embed_fwd, "tp_fwd": tp_fwd, "tp_bwd": tp_bwd,
            "tp_extra": tp_extra, "a2a": a2a, "cp_layer": cp_layer, "cp_extra": cp_extra, "p2p": p2p}


def dropout_passes(fused: bool, elem: float) -> tuple[float, float]:
    """One layer's two hidden-width dropouts (after the attention projection and after the MLP)
    in one-way passes over an `elem`-byte activation, forward and backward. Megatron's fused
    bias-dropout-add (megatron/model/fused_bias_dropout.py, bias_dropout_add_fused_train) reads
    the branch and the residual and writes their sum, the residual add's own passes, plus the
    1-byte mask; its backward reads the gradient and the mask and writes the branch's gradient.
    Unfused, each dropout is its own pass over the activation: a read, a write and the mask
    (counted as a full element), and twice that backward."""
    mask = act.MASK_BYTES / elem
    if fused:
        return 2 * mask, 2 * (2 + mask)
    return 6.0, 12.0


def tp_backward(model, hw: Hardware, r, tp_ar, *, tokens, tp, ep, kv_heads, sp, frozen):
    """Exposed seconds of one layer's backward tensor-parallel collectives: the two
    column-parallel linears' input-gradient all-reduces (`tp_ar` each). Where the framework
    issues them asynchronously (`r.tp_backward_overlap`: Megatron) they run beside the weight-
    gradient GEMMs of those linears, adding what outlasts them and slowing the GEMMs they overlap
    (`overlapped`); under sequence parallelism the reduce-scatter runs beside the weight gradient
    and the re-gather of the saved input shard beside the input gradient (two all-reduces' worth
    beside both GEMMs), while the row-parallel linears' output-gradient all-gathers, which their
    GEMMs wait for, stay exposed (half an all-reduce each). A frozen base has no weight gradient
    to hide behind."""
    if not r.tp_backward_overlap:
        return 2 * tp_ar
    g = column_gemms(model)
    args = (g, tokens, tp, ep, kv_heads, model.top_k, hw.gemm_peak, hw.gemm_eff, hw.sms, r.act_bytes, hw.gemm_curve)
    both = layer_gemm_time(*args, backward=True, weight_grad=not frozen)
    dgrad = layer_gemm_time(*args, backward=True, weight_grad=False)
    beside = where(sp, both, both - dgrad)
    return where(sp, tp_ar, 0.0) + overlapped(2 * tp_ar, beside, hw.overlap_slowdown)


def recomputed_share(recompute, recompute_layers, layers):
    """The share of `layers` whose recomputation is paid: under full recomputation its first
    `recompute_layers` (Megatron's --recompute-method block; all when None), every layer
    otherwise (selective recomputation, or none, which adds nothing)."""
    if recompute_layers is None:
        return 1.0
    layers = floats(layers)
    share = minimum(recompute_layers, layers) / maximum(layers, 1.0)
    return where(values(recompute) == 2, share, 1.0)


def model_recomputed_share(recompute, recompute_layers, stage_layers):
    """`recomputed_share` over all the stages together (`stage_layers`: every stage's layers,
    stage axis last), for the FLOPs and the pipeline's sum over stages."""
    if recompute_layers is None:
        return 1.0
    share = recomputed_share(recompute, recompute_layers, stage_layers)
    return np.sum(share * stage_layers, axis=-1) / maximum(np.sum(stage_layers, axis=-1), 1.0)


def slowest_stage(parts: dict, extra: dict | None = None) -> dict:
    """The slowest stage of per-stage times by part (stage axis last): its seconds per
    micro-batch in all ("slowest_s") and by part ("slowest_parts"), and every stage's total
    ("stage_s"); `extra` per-stage figures outside the total, taken on that stage too
    ("slowest_extra")."""
    stage = sum(parts.values())
    slow = np.argmax(stage, axis=-1)
    n_stages = stage.shape[-1]
    slow_flat = np.arange(slow.size) * n_stages + slow.ravel()  # the slowest stage's flat index

    def pick(a):
        """The value on the slowest stage of a per-stage array (keeping the stage axis as one
        entry, so it lines up with layout arrays shaped (..., 1)); `a` itself otherwise."""
        if a.__class__ in SCALAR_TYPES:
            return a
        a = np.asarray(a)
        if a.ndim == 0 or a.shape[-1] != n_stages:
            return a
        if a.ndim == 1:
            return a[slow]
        if n_stages == 1:  # one stage considered: it is the slowest
            return np.broadcast_to(a, stage.shape)
        return np.broadcast_to(a, stage.shape).reshape(-1)[slow_flat].reshape(slow.shape + (1,))

    return {"slowest_s": pick(stage), "slowest_parts": {k: pick(v) for k, v in parts.items()}, "stage_s": stage,
            "slowest_extra": {k: pick(v) for k, v in (extra or {}).items()}}
