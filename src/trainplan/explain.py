"""`trainplan plan --explain`: each memory term's formula and each part of the step with the
plan's numbers filled in."""

from __future__ import annotations

import numpy as np

from .estimate import activations as act
from .estimate.pipeline import SCHEDULE_CODE, in_flight
from .estimate.recipe import recipe
from .plan import conventions
from .report import PlanResult
from .units import GiB


def _g(x) -> str:
    x = float(x)
    return f"{x / GiB:.2f} GiB" if x >= GiB / 4 else f"{x / 2**20:.1f} MiB"


def _n(x) -> str:
    x = float(x)
    return f"{x:,.0f}" if x >= 1000 or x == int(x) else f"{x:.3g}"


def explain_lines(result: PlanResult, stage: int | None = None) -> list[str]:
    L, m = result.layout, result.memory
    p = L.plan
    r = recipe(p)
    pick = lambda a: float(np.broadcast_to(np.asarray(a, dtype=float), (L.pp,))[i])  # noqa: E731
    i = int(np.argmax(np.broadcast_to(m["total"], (L.pp,)))) if stage is None else stage
    P = pick(m["param_count"])
    T = pick(m["trainable_params"])
    shard = L.dp_shard * L.cp  # ZeRO's shard group (dp x cp unless hybrid sharding)
    over = "dp_shard x cp" if L.dp_shard < L.dp else "dp x cp"
    tokens = L.mbs * L.seq_len / L.cp
    out = [f"Stage {i} of {L.pp} ({L.stage_layers[i]} layers) — the peak stage" if stage is None
           else f"Stage {i} of {L.pp} ({L.stage_layers[i]} layers)"]
    out.append(f"  parameters on this GPU  P = {_n(P)}  (layers / tp={L.tp}"
               + (f", experts / (ep={L.ep} x tp)" if L.model.is_moe else "")
               + (", + embedding" if i == 0 else "") + (", + output head" if i == L.pp - 1 else "") + ")")
    if p.finetune != "full":
        out.append(f"  trainable (LoRA adapters, rank {p.lora_rank})  T = {_n(T)}")
    full = p.finetune == "full"
    exp_shard = max(shard // L.ep, 1)
    experts = f"; experts / {exp_shard}" if L.model.is_moe else ""
    wdiv = f" / {shard} (ZeRO-{L.zero} over {over}{experts})" if full and r.weights_sharded(L.zero) else ""
    wb = r.weight_bytes if full else r.frozen_weight_bytes
    pipelined = bool(r.keeps_stage_gathered(L.pp, L.zero))
    kept = (" the stage kept gathered all step (pipelined FSDP)" if pipelined
            else " each unit gathered from its forward to its backward (SHARD_GRAD_OP)")
    gathered = f" + P x {r.compute_weight_bytes:g} B{kept}" if pick(m["params_gathered"]) else ""
    out.append(f"  weights      = P x {wb:g} B{wdiv}{gathered} = {_g(pick(m['params']))}")
    gdiv = (f" / {shard}" + (f" (experts / {exp_shard})" if L.model.is_moe else "")) if L.zero >= 2 else ""
    sharded = f"T x {r.grad_bytes:g} B{gdiv}"
    if pick(m["grads_unsharded"]):  # never alive together: the shards replace them at the last micro-batch
        sharded = (f"max({sharded}, T x {r.reduce_bytes:g} B accumulated unsharded until the last "
                   "micro-batch)")
    out.append(f"  gradients    = {sharded} = {_g(pick(m['grads']))}")
    odiv = (f" / {shard}" + (f" (experts / {exp_shard})" if L.model.is_moe else "")) if L.zero >= 1 else ""
    opt = f"{r.optimizer_bytes:g} B ({p.optimizer})" + (" + 4 B x (rows + cols) per matrix" if r.factored_optimizer else "")
    out.append(f"  optimizer    = T x ({r.master_bytes:g} B master + {opt}){odiv}"
               f" = {_g(pick(m['optimizer']))}" + (" (offloaded to CPU)" if p.offload_optimizer else ""))
    kinds = [("dense", m["dense_layer_terms"], L.stage_dense_layers[i]),
             ("MoE", m["moe_layer_terms"], L.stage_moe_layers[i])]
    for kind, terms, count in kinds:
        if not count:
            continue
        per_layer = {k: float(np.asarray(v).flat[0]) for k, v in terms.items()}
        out.append(f"  activations per {kind} layer per micro-batch (b={L.mbs}, s={L.seq_len}, "
                   f"tokens/rank={_n(tokens)}): {_g(sum(per_layer.values()))} x {count} layers")
        for k, v in per_layer.items():
            if v:
                out.append(f"      {k:<20s} {_g(v)}")
    parts = {k: pick(v) for k, v in m["activation_parts"].items()}
    flight = float(in_flight(SCHEDULE_CODE[p.schedule], i, L.pp, L.micro_batches, L.vpp, p.pp_group, p.framework))
    out.append(f"  activations  = {L.stage_layers[i]} layers x per-layer x {flight:g} micro-batch(es) in flight "
               f"({p.schedule}, m={L.micro_batches}) + embedding/head terms = {_g(pick(m['activations']))}")
    for k, v in parts.items():
        if v:
            out.append(f"      {k:<24s} {_g(v)}")
    out.append(f"  other        = {'unit gradient' if r.keeps_gathered_forward_to_backward(L.zero) else 'ZeRO-3 gather'} {_g(pick(m['zero3_gather']))} + buckets "
               f"{_g(pick(m['comm_buckets']))} + loss workspace {_g(pick(m['loss_workspace']))}"
               f" + fragmentation {_g(pick(m['fragmentation']))} + runtime {_g(pick(m['runtime_reserved']))}")
    buffers = {k: pick(v) for k, v in m["sharding_buffers"].items() if pick(v) > 0}
    if buffers:  # the bytes by which this ZeRO stage may need more than a lower one
        sources = conventions()["sharding_buffers"]
        out.append(f"  sharding buffers of ZeRO-{L.zero} (inside the terms above; a lower stage does without):")
        out += [f"      {k:<20s} {_g(v)}: {sources[k]}" for k, v in buffers.items()]
    out.append(f"  total        = {_g(pick(m['total']))} of {_g(result.capacity)}")
    return out


def _t(seconds) -> str:
    s = float(seconds)
    return f"{s:.3f} s" if s >= 1 else f"{s * 1e3:.3g} ms"


def _bus(L, hw) -> str:
    """The bus bandwidth of the data-parallel (ZeRO shard) group and the links it comes from."""
    from .estimate import comm
    from .estimate.collectives import link

    size, gpn = (L.dp_shard if L.zero >= 1 else L.dp) * L.cp, L.plan.gpus_per_node
    bw = link(hw, comm.ALL_GATHER, size, L.tp, gpn)[0]
    if size * L.tp <= gpn:
        return f"{bw / 1e9:.0f} GB/s of bus bandwidth (NVLink, in a node)"
    nics = int(comm.ranks_per_node(size, L.tp, gpn))
    return (f"{bw / 1e9:.0f} GB/s of bus bandwidth ({nics} NIC{'s' if nics != 1 else ''} of {hw.nic / 1e9:.1f} "
            f"GB/s achieved per node, {L.gpu.nic_gbps:g} Gb/s each)")


def gemm_terms(hw) -> str:
    """What the GEMM rate is before: quantization, or an accelerator's fitted shape terms."""
    from .estimate.gemm_shape import GemmShape

    c = hw.gemm_curve
    if isinstance(c, GemmShape):
        return (f"in the main loop, x k / (k + {c.k0:,.0f}) for the output write-back, "
                f"+ {c.overhead_s * 1e6:.1f} us per kernel")
    return "before tile and wave quantization" + (" and the profile's measured residuals" if c else "")


def explain_time_lines(result: PlanResult) -> list[str]:
    """The step's terms with the plan's numbers: one micro-batch on the slowest stage, by layer
    kind and part, then the pipeline, the data-parallel collectives and the optimizer."""
    from .estimate.time import step_derivation
    from .profile import load_profile

    L, p = result.layout, result.layout.plan
    r = recipe(p)
    d = step_derivation(L, load_profile(p.gpu_profile) if p.gpu_profile else None, result.memory)
    out = _micro_batch_lines(result, d, r)
    bd = result.time["breakdown_s"]
    out.append(f"Step: {L.micro_batches} micro-batch{'es' if L.micro_batches != 1 else ''}, {p.schedule}"
               + (f" v={L.vpp}" if L.vpp > 1 else "") + f" over {L.pp} stage{'s' if L.pp != 1 else ''}: pipeline "
               f"{_t(float(np.asarray(d['pipeline_s']).ravel()[0]))} (bubble {_t(bd['bubble'])})")
    if L.dp * L.cp > 1:
        out.append(_data_parallel_line(result, d, r))
    out.append(_optimizer_line(result, d, r))
    return out


def _micro_batch_lines(result: PlanResult, d: dict, r) -> list[str]:
    """`explain_time_lines`' micro-batch on the slowest stage: the rates, each layer kind's parts,
    the head and the embedding where the stage holds them, the exposed communication, the sum."""
    from .estimate.attention_rates import flash_efficiency
    from .estimate.stage import recomputed_share

    L, p = result.layout, result.layout.plan
    hw, det = d["hardware"], d["detail"]
    stage_s = np.broadcast_to(np.asarray(d["stage_s"], dtype=float), (L.pp,))
    i = int(np.argmax(stage_s))
    at = lambda a: float(np.broadcast_to(np.asarray(a, dtype=float), (L.pp,))[i])  # noqa: E731
    tokens = L.mbs * L.seq_len / L.cp
    kernel = {"flash": "FlashAttention-2", "sdpa": "SDPA", "triton": "FlashAttention in Triton", "cudnn": "cuDNN",
              "eager": "materialised scores"}[p.attention]
    call = L.seq_len / L.cp
    forward = "" if hw.flash_fwd_curve is None or p.attention == "eager" else \
        f" (forward {float(flash_efficiency(hw, call, forward=True)):.3f})"
    out = [f"Time of one micro-batch on stage {i} of {L.pp} (the slowest), {_n(tokens)} tokens per rank",
           f"  rates: GEMMs at {hw.gemm_eff:.3f} of {hw.gemm_peak / 1e12:,.0f} TFLOP/s {gemm_terms(hw)}; attention "
           f"({kernel}) at {float(flash_efficiency(hw, call)):.3f}{forward} of {hw.peak / 1e12:,.0f}; element-wise "
           f"and loss traffic at {hw.hbm / 1e12:.2f} TB/s"]
    early = " (early stop: without the last linear)" if r.recompute_skips_last_linear and \
        p.recompute == "full" else ""
    frozen = p.finetune != "full"
    if frozen:
        out.append(f"  {p.finetune}: the base weights are frozen (input gradients only in the backward), with "
                   f"rank-{p.lora_rank} adapters on {', '.join(p.lora_targets)}, their GEMMs included")
    layers = L.stage_dense_layers[i] + L.stage_moe_layers[i]
    share = float(recomputed_share(act.RECOMPUTE_CODE[p.recompute], L.recompute_layers_per_stage, layers))
    for kind, count in (("dense", L.stage_dense_layers[i]), ("moe", L.stage_moe_layers[i])):
        if not count:
            continue
        t = {k: at(v) for k, v in det["layer"][kind].items()}
        head = (f"  per {'MoE' if kind == 'moe' else kind} layer: GEMMs {_t(t['gemm_forward'])} forward + "
                f"{_t(t['gemm_backward'])} backward; attention {_t(t['attention_forward'])} + "
                f"{_t(t['attention_backward'])}; element-wise {_t(t['elementwise_forward'])} + "
                f"{_t(t['elementwise_backward'])}"
                + (f"; dequantizing the {p.qlora_bits}-bit weights {_t(t['dequantize'])} a use (forward, backward"
                   + (", recompute" if p.recompute == "full" else "") + ")" if t["dequantize"] else "")
                + f"; recompute {_t(t['recompute'])}{early}")
        if share < 1:  # full recomputation of the stage's first recompute_layers layers only
            plain, redone = t["total"] - t["recompute"], count * share
            out.append(f"{head} on {redone:g} of the {count} = {_t(plain)} x {count} + {_t(t['recompute'])} x "
                       f"{redone:g} = {_t(plain * count + t['recompute'] * redone)}")
        else:
            out.append(f"{head} = {_t(t['total'])} x {count} layers = {_t(t['total'] * count)}")
    if i == L.pp - 1:
        out.append(f"  output head ({2 if frozen else 3} GEMMs) and loss ({r.loss_traffic_bytes:g} + "
                   f"{r.loss_backward_bytes:g} B per logit) = {_t(at(det['head']))}")
    if i == 0:
        out.append(f"  embedding = {_t(at(det['embedding']))}")
    tp_layer = det["tp_layer"]["dense" if L.stage_dense_layers[i] else "moe"]
    comm = [("TP collectives", tp_layer, L.tp > 1), ("CP exchange", det["cp_layer"], L.cp > 1),
            ("EP all-to-alls", det["ep_layer"], L.ep > 1)]
    nccl = {"TP collectives": "TP all-reduce", "CP exchange": "CP all-gather"}
    for name, per_layer, on in comm:
        if on:
            algo = d.get("nccl_algorithms", {}).get(nccl.get(name, ""))
            out.append(f"  {name} exposed = {_t(at(per_layer))} per layer x {layers} layers"
                       + (f" (NCCL {algo})" if algo else ""))
    parts = {k: float(np.asarray(v).ravel()[0]) for k, v in d["micro_batch_s"].items()}
    out.append("  micro-batch = " + " + ".join(f"{k.replace('_', ' ')} {_t(v)}" for k, v in parts.items() if v)
               + f" = {_t(sum(parts.values()))}")
    return out


def _data_parallel_line(result: PlanResult, d: dict, r) -> str:
    """`explain_time_lines`' data-parallel collectives: what they move, their calls and latency,
    the framework's own passes, and how much of them the step exposes."""
    L, p, hw, bd = result.layout, result.layout.plan, d["hardware"], result.time["breakdown_s"]
    coll = {k: float(np.asarray(v).ravel()[0]) for k, v in d["dp_collectives_s"].items()}
    if r.keeps_stage_gathered(L.pp, L.zero):
        what = (f"per step, the parameters kept gathered and the gradients accumulated unsharded across the "
                f"micro-batches (pipelined FSDP), a parameter all-gather of {_t(coll['all_gather'])} and a "
                f"gradient reduce-scatter of {_t(coll['reduce_scatter'])}")
    elif L.zero >= 3:
        again = float(np.asarray(d["dp_regathered"]).ravel()[0])
        more = f" (and {again:.0%} of one more for the recomputed forward)" if again > 0 else ""
        what = (f"per micro-batch 2 parameter all-gathers{more} of {_t(coll['all_gather'])} and a gradient "
                f"reduce-scatter of {_t(coll['reduce_scatter'])} (backward prefetch {p.backward_prefetch})")
    else:
        reductions, gathers = (float(np.asarray(d[k]).ravel()[0]) for k in ("dp_reductions", "dp_gathers"))
        times = lambda n, what: f"{n:g} {what}{'s' if n != 1 else ''}"  # noqa: E731
        each = " (one in each micro-batch)" if reductions > 1 else ""
        what = (f"per step {times(reductions, 'gradient reduce-scatter')}{each} of {_t(coll['reduce_scatter'])} "
                f"and {times(gathers, 'parameter all-gather')} of {_t(coll['all_gather'])}" if L.zero >= 1
                else f"per step {times(reductions, 'gradient all-reduce')}{each} of {_t(coll['all_reduce'])}")
    overlap = (f"overlapped, compute beside them {hw.overlap_slowdown:.1%} slower" if p.overlap_dp
               else "not overlapped")
    n_calls = float(np.asarray(d["dp_gather_calls" if L.zero >= 3 else "dp_calls"]).ravel()[0])
    unit = "a submodule each" if L.zero >= 3 and r.zero3_module_fetches else "a layer each, and the root"
    calls = f"{n_calls:g} calls ({unit})" if n_calls > 1 else "one call"
    lat = float(np.asarray(d["dp_call_latency_s"]["all_gather" if L.zero >= 1 else "all_reduce"]).ravel()[0])
    book = float(np.asarray(d["dp_bookkeeping_s"]).ravel()[0])
    passes = (f"; {p.framework}'s own passes over the gradients ({r.grad_reduce_passes:g} per reduction)"
              + (f" and gathered parameters ({r.gather_copy_passes:g} per gather)" if r.gather_copy_passes else "")
              + f" {_t(book)}, included") if book else ""
    hybrid = (f" (sharded in groups of {L.dp_shard * L.cp}, {L.dp // L.dp_shard} replicas: each gradient "
              f"reduce-scatter includes their all-reduce of its output, {_t(coll['replica_all_reduce'])})"
              if L.zero >= 1 and L.dp_shard < L.dp else "")
    fetch = float(np.asarray(d["param_fetch_s"]).ravel()[0])
    fetched = (f"; fetching each parameter shard from the host before its gather (at {hw.h2d / 1e9:g} GB/s) "
               f"{_t(fetch)}, included" if p.offload_params else "")
    algos = ", ".join(f"{k.removeprefix('DP ')} {v}" for k, v in d.get("nccl_algorithms", {}).items()
                      if k.startswith("DP "))
    return (f"  + data parallel over {L.dp * L.cp} ranks{hybrid}: {what}, {overlap}: {_t(bd['dp_comm'])} exposed; "
               f"each collective {calls} of {_t(lat)} NCCL latency, {_bus(L, hw)}{passes}{fetched}"
               + (f"; NCCL runs (its tuner's algorithm/protocol for the call size) {algos}" if algos else ""))


def _optimizer_line(result: PlanResult, d: dict, r) -> str:
    """`explain_time_lines`' optimizer step (on the host when offloaded), the wait for data, and
    the step."""
    L, p, hw, bd = result.layout, result.layout.plan, d["hardware"], result.time["breakdown_s"]
    if p.offload_optimizer:
        off = {k: float(np.asarray(v).ravel()[0]) for k, v in d["offloaded_optimizer_s"].items()}
        hosts = min(p.gpus_per_node, L.gpus)
        where = (f" on the host: gradients to it {_t(off['to_host'])} exposed, the step {_t(off['host_step'])} "
                 f"({hosts} rank{'s' if hosts != 1 else ''} a host, {hw.host_memory / 1e9:g} GB/s of host memory"
                 + (f", {r.cpu_optimizer_traffic:g}x a fused step's traffic" if r.cpu_optimizer_traffic != 1 else "")
                 + (f"), parameters back {_t(off['to_device'])} at {hw.h2d / 1e9:g} GB/s" if not p.offload_params
                    else "), the parameters kept there for the next gathers"))
    else:
        where = ""
    impl = r.cpu_optimizer_impl if where else r.optimizer_impl
    return (f"  + optimizer {_t(bd['optimizer'])}{where} ({p.optimizer} {impl}"
               + (f", {r.optimizer_traffic:g}x a fused step's traffic" if r.optimizer_traffic != 1 and not where else "")
               + (f"; clipping at norm {p.grad_clip:g}, {r.grad_clip_passes:g} pass"
                  f"{'es' if r.grad_clip_passes != 1 else ''} over the gradients" if r.grad_clip_passes else "") + ")"
               + (f" + waiting for data {_t(bd['data'])}" if bd["data"] else "")
               + f" = step {_t(result.time['step_s'])}")
