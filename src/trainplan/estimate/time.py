"""Step time, throughput and MFU (DESIGN §3).

    step = pipeline(compute + exposed TP / EP / CP communication per micro-batch, per stage)
         + exposed data-parallel gradient reduction (and ZeRO-3 parameter gathers)
         + optimizer step

Compute per op is a roofline, max(FLOPs / (peak · efficiency), bytes / (HBM · efficiency)):

* GEMMs: efficiency = the accelerator's best achieved matmul fraction (MAMF / peak, or a
  calibrated profile) x tile quantization (dimensions padded to 128) x wave quantization
  (thread blocks padded to a multiple of the SM count) x an alignment penalty when the
  innermost dimension is not a multiple of 8 elements (16 bytes); on an accelerator with a
  measured shape fit (gemm_shape.py: Hopper) the fitted main loop x its write-back share
  k / (k + k0) + a fixed time per kernel, without wave quantization. Backward = two GEMMs with
  their own shapes: the input gradient (inner dimension the output width n) and the weight
  gradient (inner dimension the tokens).
* FlashAttention: the causal half of the score FLOPs, over the head dimension the kernel pads
  to, at the kernel's achieved fraction for the sequence one call spans (a curve over lengths
  where one is published or measured; FlashAttention in Triton at its published share of FA2);
  materialised attention: its batched matmuls as GEMMs plus the softmax traffic.
* Element-wise ops (norms, residual adds, activation functions, RoPE, dropout): bytes moved
  at HBM speed; backward moves twice the forward's bytes.
* Optimizer: reads gradients, reads and writes master weights and state, writes weights.

Communication: TP 2 all-reduces per layer forward and 2 backward (2 more in a recomputed
forward), exposed unless overlapped; PP activations to the next stage per micro-batch; DP
gradient reduction once per step, hidden behind the backward except what exceeds it when
overlapped, and slowing the compute it overlaps (SMs and HBM shared with NCCL's kernels);
ZeRO-3 adds two parameter all-gathers; EP two all-to-alls per MoE layer each way; CP a ring
exchange of K/V blocks overlapped with attention, or (cp_comm allgather) K/V gathered before
attention and their gradients reduce-scattered after it, exposed.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ..plan import Layout
from . import comm
from .collectives import (
    BACKWARD_PREFETCH_CODE,
    collective_choice,
    modules_per_layer,
)
from .data import data_report, step_with_data
from .data_parallel import dp_collectives, dp_exposed, optimizer_time
from .flops import step_flops
from .hardware import Hardware, hardware
from .memo import Memo, fresh_copy, read_only, scalar_call
from .memory import estimate_memory, recompute_code
from .pipeline import SCHEDULE_CODE, WGRAD_SHARE, pipeline_time
from .pipeline_engine import engine_terms
from .placement import ends, placement
from .recipe import Recipe, recipe
from .scalars import floats, largest, maximum, minimum, values, where
from .stage import lora_arguments, model_recomputed_share, stage_times


def step_time_core(model, hw: Hardware, r, *, tp, pp, dp, cp, ep, zero, mbs, seq, m, vpp, schedule,
                   recompute, eager, dropout, overlap_tp, overlap_dp, offload_optimizer, gpn,
                   stage_dense, stage_moe, first, last, total_dense, total_moe, vocab_padded,
                   trainable, gbs, gpus, model_flops, hw_flops, sp=False, sharp=False, cp_allgather=False,
                   data_s=0.0, prefetch=True, backward_prefetch=0, dp_shard=None, lora=None,
                   recompute_layers=None, offload_params=False, ep_node_limit=None, ep_overlap=False) -> dict:
    """Step time and its breakdown. Layout arguments broadcast against the stage arrays
    (stage_dense, stage_moe, first, last: the stages to consider, last axis); total_dense /
    total_moe are the layers of all stages (for the pipeline's sum over stages)."""
    stages = stage_times(model, hw, r, tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, mbs=mbs, seq=seq, recompute=recompute,
                         eager=eager, dropout=dropout, overlap_tp=overlap_tp, gpn=gpn, stage_dense=stage_dense,
                         stage_moe=stage_moe, first=first, last=last, total_dense=total_dense,
                         total_moe=total_moe, vocab_padded=vocab_padded, sp=sp, sharp=sharp,
                         cp_allgather=cp_allgather, recompute_layers=recompute_layers, ep_node_limit=ep_node_limit,
                         ep_overlap=ep_overlap, **(lora or {}))
    terms = _layout_terms(model, r, tp=tp, pp=pp, dp=dp, cp=cp, seq=seq, recompute=recompute, gpn=gpn,
                          total_dense=total_dense, total_moe=total_moe, sharp=sharp)
    return {**step_from_stages(stages, hw, r, **terms, zero=zero, m=m, vpp=vpp, schedule=schedule,
                               overlap_dp=overlap_dp, offload_optimizer=offload_optimizer, trainable=trainable,
                               gbs=gbs, gpus=gpus, model_flops=model_flops, hw_flops=hw_flops, data_s=data_s,
                               prefetch=prefetch, backward_prefetch=backward_prefetch, dp_shard=dp_shard,
                               offload_params=offload_params),
            "detail": stages["detail"]}


def _layout_terms(model, r, *, tp, pp, dp, cp, seq, recompute, gpn, total_dense, total_moe, sharp) -> dict:
    """`step_from_stages`' arguments that one layout sets (its layers per stage and its layers'
    submodules with parameters among them)."""
    return dict(tp=tp, pp=pp, dp=dp, cp=cp, seq=seq, recompute=recompute, gpn=gpn, sharp=sharp,
                stage_layers=(floats(total_dense) + total_moe) / pp, modules_per_layer=modules_per_layer(model, r))


def step_from_stages(stages: dict, hw: Hardware, r, *, pp, dp, cp, tp, zero, m, vpp, schedule, overlap_dp,
                     offload_optimizer, gpn, trainable, gbs, seq, gpus, model_flops, hw_flops, sharp=False,
                     data_s=0.0, prefetch=True, backward_prefetch=0, stage_layers=1, dp_shard=None,
                     offload_params=False, recompute=0, modules_per_layer=1.0, collectives=None) -> dict:
    """The step from `stage_times`: the pipeline schedule over the slowest stage, the exposed
    data-parallel communication and the optimizer update (on the host under
    `offload_optimizer`, see `offloaded_optimizer`); then the input pipeline's `data_s` per
    step, overlapped with all that when prefetching (estimate/data.py). `dp_shard`: the
    data-parallel ranks ZeRO shards over (all `dp` when None: no hybrid sharding);
    `offload_params`: ZeRO-3 fetches each rank's shard from the host for every gather;
    `recompute` (activations.RECOMPUTE_CODE) and `modules_per_layer` (a layer's submodules with
    parameters) shape ZeRO-3's unit-by-unit collectives (`zero3_exposed`); `collectives`:
    `dp_collectives` of these arguments where the caller worked them out already (search: once
    for layouts that differ only in schedule)."""
    f = floats
    pp, dp, cp, tp, m, vpp, zero = map(f, (pp, dp, cp, tp, m, vpp, zero))
    pipe = _pipeline_terms(stages, r, pp=pp, m=m, vpp=vpp, schedule=schedule, overlap_dp=f(overlap_dp))
    overlap_dp, stage_compute = pipe["overlap_dp"], pipe["micro_batch_s"]["compute"]
    c = collectives or dp_collectives(hw, r, dp=dp, cp=cp, tp=tp, zero=zero, gpn=gpn, trainable=trainable,
                                      sharp=sharp, dp_shard=dp_shard, stage_layers=stage_layers,
                                      modules_per_layer=modules_per_layer)
    d = dp_exposed(hw, r, c, pp=pp, zero=zero, m=m, stage_compute=stage_compute, recompute=recompute,
                   backward_prefetch=backward_prefetch, overlap_dp=overlap_dp, offload_params=offload_params,
                   trainable=trainable, dp_group=dp * cp)
    optimizer, on_host = optimizer_time(hw, r, shard_params=trainable / d["shard"], reductions=d["reductions"],
                                        backward=d["backward"], overlap_dp=overlap_dp,
                                        offload_optimizer=offload_optimizer, offload_params=offload_params,
                                        ranks_per_host=minimum(f(gpn), f(gpus)))
    busy = pipe["pipeline_s"] + d["dp_exposed"] + optimizer
    step = step_with_data(busy, data_s, prefetch)
    bubble = pipe["bubble"]
    return {
        "step_s": step,
        "tokens_per_s": gbs * seq / step,
        "tflops_per_gpu": model_flops / step / gpus / 1e12,
        "hardware_tflops_per_gpu": hw_flops / step / gpus / 1e12,
        "mfu": model_flops / (hw.peak_dense * step * gpus),
        "hfu": hw_flops / (hw.peak_dense * step * gpus),
        # the same model FLOPs against the accelerator's bf16 and fp8 peaks ("mfu" divides by
        # the one Hardware.mfu_peak names); NaN where it has no such peak
        "mfu_bf16_peak": model_flops / ((hw.peak_bf16 or np.nan) * step * gpus),
        "mfu_fp8_peak": model_flops / ((hw.peak_fp8 or np.nan) * step * gpus),
        "bubble_fraction": bubble / step,
        "breakdown_s": {**pipe["parts_busy"], "bubble": bubble, "dp_comm": d["dp_exposed"], "optimizer": optimizer,
                        "data": step - busy},
        "stage_s": stages.get("stage_s"),
        "micro_batch_s": pipe["micro_batch_s"],
        "pipeline_s": pipe["pipeline_s"],
        # (reduce_scatter includes, under hybrid sharding, the replicas' all-reduce of its output)
        "dp_collectives_s": {"all_gather": c["gather"], "reduce_scatter": c["scatter"], "all_reduce": c["ar"],
                             "replica_all_reduce": c["replica_ar"]},
        "dp_shard_group": c["shard_group"], "dp_replicas": c["replicas"],
        # the framework's passes over gradients and gathered parameters, inside "dp_comm"
        "dp_bookkeeping_s": d["bookkeeping"],
        # --offload-params: fetching the shards from the host, inside "dp_comm"; --offload-optimizer:
        # the parts of "optimizer"
        "param_fetch_s": d["fetches"], "offloaded_optimizer_s": on_host,
        # each collective's calls per pass and the latency of one call (`plan --explain`)
        "dp_calls": c["calls"],
        # gradient reductions and (ZeRO-1 and up) parameter all-gathers per step
        "dp_reductions": d["reductions"], "dp_gathers": where(zero >= 1, d["gathers"], 0.0),
        "dp_call_latency_s": {"all_gather": c["gather_lat"], "reduce_scatter": c["scatter_lat"],
                              "all_reduce": c["ar_lat"]},
        # calls per pass of each (DeepSpeed's ZeRO-3: a submodule's gather each, a bucket's reduce-scatter each)
        "dp_gather_calls": c["gather_calls"], "dp_scatter_calls": c["scatter_calls"],
        # the share of the parameters ZeRO-3 gathers again for a recomputed forward (DeepSpeed)
        "dp_regathered": d["regathered"],
    }


def _pipeline_terms(stages: dict, r, *, pp, m, vpp, schedule, overlap_dp) -> dict:
    """The pipeline schedule over the slowest stage (`step_from_stages`): its seconds, each
    micro-batch's parts and their busy seconds, the bubble, and the data-parallel overlap the
    pipeline engine leaves."""
    stage_max, per_micro_batch, p2p = stages["slowest_s"], stages["slowest_parts"], stages["p2p"]
    # DualPipe runs one micro-batch's all-to-alls beside another's compute (DeepSeek-V3 §3.2.1):
    # the saving stage_times worked out for that overlap, where the plan did not ask for it anyway
    dual = values(schedule) == SCHEDULE_CODE["dualpipe"]
    saving = where(dual, stages.get("ep_saving", 0.0), 0.0)
    stage_max = stage_max - saving
    totals = stages["totals"] - where(dual, stages.get("ep_saving_total", 0.0), 0.0)
    per_micro_batch = {**per_micro_batch, "ep_comm": per_micro_batch["ep_comm"] - saving}
    # The engine running the pipeline (estimate/pipeline_engine.py): DeepSpeed's blocking sends
    # and receives put more transfers on every micro-batch's critical path than the two
    # stage_times prices, and its gradients are reduced after the schedule, not overlapped.
    extra_p2p, overlap_dp = scalar_call(_TERMS, engine_terms, r.pipeline_engine, pp, schedule, overlap_dp)
    per_micro_batch = {**per_micro_batch, "pp_comm": per_micro_batch["pp_comm"] + extra_p2p * p2p}
    pipe = pipeline_time(schedule, pp, m, stage_max, totals, vpp, p2p, wgrad_share=WGRAD_SHARE) \
        + m * extra_p2p * p2p
    # a DualPipe rank holds two stages and runs each micro-batch through one of them
    busy_mbs = where(values(schedule) == SCHEDULE_CODE["dualpipe"], m / 2, m)
    parts_busy = {k: busy_mbs * v for k, v in per_micro_batch.items()}
    bubble = maximum(pipe - sum(parts_busy.values()), 0.0)
    return {"pipeline_s": pipe, "micro_batch_s": per_micro_batch, "parts_busy": parts_busy, "bubble": bubble,
            "overlap_dp": overlap_dp}


_TERMS = Memo(1024)  # one plan's terms that the global batch does not change (`scalar_call`)


def step_time(layout: Layout, profile: dict | None = None, memory: dict | None = None,
              r: Recipe | None = None) -> dict:
    """The step of a resolved plan (every stage considered), as plain numbers; `r`, the plan's
    `recipe` where the caller has it already."""
    figures, _, data, _ = _step(layout, profile, memory, r, shared=True)
    # (the memo's figures in dicts and lists of the caller's own)
    return {**figures, "breakdown_s": {**figures["breakdown_s"]},
            "per_microbatch_stage_s": [*figures["per_microbatch_stage_s"]],
            "micro_batch_s": {**figures["micro_batch_s"]}, "input_pipeline_s": data}


def _step_figures(out: dict, hw: Hardware, model_flops: float, hw_flops: float) -> dict:
    """`step_time`'s figures (all but the input pipeline's) from `step_time_core`'s `out`."""
    num = float
    breakdown = {k: num(v) for k, v in out["breakdown_s"].items()}
    step = num(out["step_s"])
    slowest = max((k for k in breakdown if k != "compute"), key=breakdown.__getitem__)
    return {
        **{k: num(out[k]) for k in ("step_s", "tokens_per_s", "tflops_per_gpu", "hardware_tflops_per_gpu",
                                    "mfu", "hfu", "bubble_fraction")},
        # which peak "mfu" divides by, and the MFU against each peak the accelerator has (null
        # where it has none)
        "mfu_peak": hw.mfu_peak,
        **{k: (None if math.isnan(out[k]) else num(out[k])) for k in ("mfu_bf16_peak", "mfu_fp8_peak")},
        "breakdown_s": breakdown,
        "bottleneck": f"{slowest.replace('_', ' ')} {breakdown[slowest] / step:.0%}"
        if breakdown[slowest] > 0.1 * step else "compute-bound",
        "model_flops_per_step": model_flops,
        "hardware_flops_per_step": hw_flops,
        "per_microbatch_stage_s": [num(x) for x in out["stage_s"]],
        "micro_batch_s": {k: num(v) for k, v in out["micro_batch_s"].items()},
    }


def step_derivation(layout: Layout, profile: dict | None = None, memory: dict | None = None) -> dict:
    """The terms behind `step_time`: per layer kind and micro-batch on every stage ("detail"),
    the pipeline's seconds, the data-parallel collectives and the rates used (`plan --explain`)."""
    mem = memory if memory is not None else estimate_memory(layout)
    out, _, _, hw = _step(layout, profile, mem)
    return {**out, "hardware": hw,
            "nccl_algorithms": collective_choices(layout, hw, float(np.max(mem["trainable_params"])), out)}


def collective_choices(layout: Layout, hw: Hardware, trainable: float, out: dict) -> dict:
    """The algorithm and protocol NCCL runs each collective group's calls with (`plan
    --explain`): TP's all-reduce, CP's K/V all-gather, and the data-parallel group's calls."""
    plan, model, r = layout.plan, layout.model, recipe(layout.plan)
    gpn, tokens = plan.gpus_per_node, layout.mbs * layout.seq_len / layout.cp
    one = lambda key: float(np.asarray(out[key]).ravel()[0])  # noqa: E731
    choices = {}
    if layout.tp > 1:
        choices["TP all-reduce"] = collective_choice(hw, comm.ALL_REDUCE, tokens * model.hidden * r.act_bytes,
                                                     layout.tp, 1, gpn, plan.sharp)
    if layout.cp > 1:
        choices["CP all-gather"] = collective_choice(
            hw, comm.ALL_GATHER, tokens * 2 * model.kv_dim / layout.tp * r.act_bytes * layout.cp, layout.cp,
            layout.tp, gpn)
    shard = one("dp_shard_group")
    if layout.dp * layout.cp > 1:
        if layout.zero >= 1 or r.per_unit_collectives and layout.zero >= 2:
            choices["DP all-gather"] = collective_choice(hw, comm.ALL_GATHER, trainable * r.compute_weight_bytes,
                                                         shard, layout.tp, gpn, calls=one("dp_gather_calls"))
            choices["DP reduce-scatter"] = collective_choice(hw, comm.REDUCE_SCATTER, trainable * r.reduce_bytes,
                                                             shard, layout.tp, gpn, calls=one("dp_scatter_calls"))
        else:
            choices["DP all-reduce"] = collective_choice(hw, comm.ALL_REDUCE, trainable * r.reduce_bytes,
                                                         layout.dp * layout.cp, layout.tp, gpn, plan.sharp,
                                                         calls=one("dp_calls"))
    return choices


def layer_pass_times(layout: Layout, profile: dict | None = None, kind: str = "dense") -> dict:
    """One layer's seconds per micro-batch as Korthikanti et al. 2023 Table 4 times them: its
    forward, its backward (the recomputation included) and that recomputation, each with the
    exposed tensor-parallel collectives of the pass."""
    d = step_derivation(layout, profile)["detail"]
    lay, tp = d["layer"][kind], d["tp_passes"][kind]
    num = lambda x: float(np.ravel(x)[0])  # noqa: E731
    recompute = num(lay["recompute"]) + num(tp["recompute"])
    forward = num(lay["gemm_forward"]) + num(lay["attention_forward"]) + num(lay["elementwise_forward"]) \
        + num(lay["dequantize"]) + num(tp["forward"])
    backward = num(lay["gemm_backward"]) + num(lay["attention_backward"]) + num(lay["elementwise_backward"]) \
        + num(lay["dequantize"]) + num(tp["backward"]) + recompute
    return {"forward_s": forward, "backward_s": backward, "recompute_s": recompute,
            "elementwise_s": num(lay["elementwise_forward"]) + num(lay["elementwise_backward"])}


def _step(layout: Layout, profile: dict | None, memory: dict | None, r: Recipe | None = None, shared=False):
    """`step_time_core` of a resolved layout, its FLOPs, input pipeline and hardware; `shared`:
    instead of the core, `step_time`'s figures as the memo holds them (for a caller that copies
    what it hands on)."""
    plan, model = layout.plan, layout.model
    r = r if r is not None else recipe(plan)
    mem = memory if memory is not None else estimate_memory(layout, r)
    # selective recomputation re-runs the attention core unless its modules leave core_attn out
    # (the output-discarding modules' norms, up-projections and activations are not priced)
    rc = recompute_code(plan)
    hw = hardware(layout, profile)
    s = layout_stages(layout, hw, r, rc)
    fl = step_flops(model, tokens=layout.gbs * layout.seq_len, seq=layout.seq_len,
                    dense_layers=model.layers - model.n_moe_layers, moe_layers=model.n_moe_layers, head=1,
                    attention_eager=s.eager, recompute=rc, vocab_padded=model.vocab, causal=True,
                    skip_last=r.recompute_skips_last_linear, recompute_share=s.recompute_share,
                    low_precision_mm=float(r.linear_in_bytes < 2), **s.lora)
    data = data_report(plan, model, layout.gbs * layout.seq_len / layout.dp)
    tail = dict(zero=layout.zero, m=layout.micro_batches, vpp=layout.vpp, schedule=SCHEDULE_CODE[plan.schedule],
                overlap_dp=plan.overlap_dp, offload_optimizer=plan.offload_optimizer,
                offload_params=plan.offload_params, trainable=largest(mem["trainable_params"]), gbs=layout.gbs,
                gpus=layout.gpus, model_flops=float(fl["model"]), hw_flops=float(fl["hardware"]),
                data_s=data["per_step_s"], prefetch=plan.prefetch,
                backward_prefetch=BACKWARD_PREFETCH_CODE[plan.backward_prefetch], dp_shard=layout.dp_shard)
    if not shared:  # the layout's memoised stages, the step of this plan, a copy of its own
        return fresh_copy({**s.step(hw, r, tail), "detail": s.stages["detail"]}), fl, data, hw
    # one layout's step figures, memoised on its stages (the entry, which the key holds) and the
    # rest they are computed from
    key = (s, *tail.values())
    figures = lambda: _step_figures(s.step(hw, r, tail), hw, tail["model_flops"], tail["hw_flops"])  # noqa: E731
    try:
        found = _LAYOUT_STEP.get(key, figures)
    except TypeError:  # an unhashable setting: not memoised
        found = figures()
    return found, fl, data, hw


class StageSettings(NamedTuple):
    """What one layout's stage times are computed from beside its model, accelerator and recipe
    (`layout_stages`): its parallel sizes, micro-batch, kernels, communication settings, and
    each stage's dense and MoE layers (hashable: a memo key)."""

    tp: int
    pp: int
    dp: int
    cp: int
    ep: int
    mbs: int
    seq: int
    recompute: int  # activations.RECOMPUTE_CODE
    eager: bool  # materialised attention
    dropout: float
    overlap_tp: bool
    gpn: int  # GPUs per node
    dense: tuple  # dense layers on each stage
    moe: tuple  # MoE layers on each stage
    place: int  # where the schedule places the stages (`placement`): which hold the embedding and the head
    vocab_padded: int
    sp: bool
    sharp: bool
    cp_allgather: bool
    lora: tuple  # `lora_arguments` as (name, value) pairs
    recompute_layers: object  # recomputed layers per stage (None: as `recompute` says)
    ep_node_limit: object
    ep_overlap: bool


class LayoutStages:
    """One layout's stage-time inputs and `stage_times` (read-only), which nothing of the global
    batch, the data-parallel settings or the memory changes (`layout_stages`)."""

    __slots__ = ("kwargs", "lora", "eager", "recompute_share", "stages", "terms")

    def __init__(self, model, hw: Hardware, r, s: StageSettings):
        _, _, first, last = ends(s.place, s.pp)  # (the step time's)
        self.kwargs = read_only(dict(
            tp=s.tp, pp=s.pp, dp=s.dp, cp=s.cp, ep=s.ep, mbs=s.mbs, seq=s.seq, recompute=s.recompute,
            eager=s.eager, dropout=s.dropout, overlap_tp=s.overlap_tp, gpn=s.gpn,
            stage_dense=np.asarray(s.dense, dtype=float), stage_moe=np.asarray(s.moe, dtype=float),
            first=first, last=last,
            total_dense=sum(s.dense), total_moe=sum(s.moe), vocab_padded=s.vocab_padded, sp=s.sp, sharp=s.sharp,
            cp_allgather=s.cp_allgather, recompute_layers=s.recompute_layers, ep_node_limit=s.ep_node_limit,
            ep_overlap=s.ep_overlap))
        self.lora, self.eager = dict(s.lora), s.eager
        k = self.kwargs
        self.recompute_share = float(model_recomputed_share(s.recompute, s.recompute_layers,
                                                            k["stage_dense"] + k["stage_moe"]))
        self.stages = read_only(stage_times(model, hw, r, **k, **self.lora))
        self.terms = read_only(_layout_terms(model, r, tp=s.tp, pp=s.pp, dp=s.dp, cp=s.cp, seq=s.seq,
                                             recompute=s.recompute, gpn=s.gpn, total_dense=k["total_dense"],
                                             total_moe=k["total_moe"], sharp=s.sharp))

    def step(self, hw: Hardware, r, tail: dict) -> dict:
        """`step_time_core` of this layout (on the accelerator and recipe it was made for) with the
        rest of its settings (`tail`), without the stages' "detail"."""
        return step_from_stages(self.stages, hw, r, **self.terms, **tail)


def layout_stages(layout: Layout, hw: Hardware, r, rc) -> LayoutStages:
    """The `LayoutStages` of a resolved layout on `hw` with recipe `r` and recompute code `rc`,
    memoised on every value it is computed from."""
    plan, model = layout.plan, layout.model
    settings = StageSettings(
        tp=layout.tp, pp=layout.pp, dp=layout.dp, cp=layout.cp, ep=layout.ep, mbs=layout.mbs, seq=layout.seq_len,
        recompute=rc, eager=model.attention_kernel(plan.attention) == "eager", dropout=plan.dropout,
        overlap_tp=plan.overlap_tp, gpn=plan.gpus_per_node, dense=tuple(layout.stage_dense_layers),
        moe=tuple(layout.stage_moe_layers),
        place=placement(plan.schedule, plan.framework),
        vocab_padded=layout.vocab_padded, sp=layout.sp, sharp=plan.sharp, cp_allgather=plan.cp_comm == "allgather",
        lora=tuple(lora_arguments(plan).items()), recompute_layers=layout.recompute_layers_per_stage,
        ep_node_limit=plan.ep_node_limit, ep_overlap=plan.ep_overlap)
    return _LAYOUT_STAGES.get((model, hw, r, settings), lambda: LayoutStages(model, hw, r, settings))


_LAYOUT_STAGES = Memo(256)
_LAYOUT_STEP = Memo(256)  # (LayoutStages, the rest of step_time_core's settings) -> `_step_figures`
