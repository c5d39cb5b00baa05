"""Step time, throughput and MFU (DESIGN §3).

    step = pipeline(compute + exposed TP / EP / CP communication per micro-batch, per stage)
         + exposed data-parallel gradient reduction (and ZeRO-3 parameter gathers)
         + optimizer step

Compute per op is a roofline, max(FLOPs / (peak · efficiency), bytes / (HBM · efficiency)):

* GEMMs: efficiency = the accelerator's best achieved matmul fraction (MAMF / peak, or a
  calibrated profile) x tile quantization (dimensions padded to 128) x wave quantization
  (thread blocks padded to a multiple of the SM count) x an alignment penalty when the
  innermost dimension is not a multiple of 8 elements (16 bytes). Backward = two GEMMs of the
  forward's size (input and weight gradients).
* FlashAttention: the causal half of the score FLOPs at the kernel's achieved fraction;
  materialised attention: its batched matmuls as GEMMs plus the softmax traffic.
* Element-wise ops (norms, residual adds, activation functions, RoPE, dropout): bytes moved
  at HBM speed; backward moves twice the forward's bytes.
* Optimizer: reads gradients, reads and writes master weights and state, writes weights.

Communication: TP 2 all-reduces per layer forward and 2 backward (2 more in a recomputed
forward), exposed unless overlapped; PP activations to the next stage per micro-batch; DP
gradient reduction once per step, hidden behind the backward except what exceeds it when
overlapped; ZeRO-3 adds two parameter all-gathers; EP two all-to-alls per MoE layer each way;
CP a ring exchange of K/V blocks overlapped with attention.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from ..plan import Layout, conventions
from . import activations as act
from . import comm
from .flops import step_flops
from .pipeline import SCHEDULE_CODE, pipeline_time
from .recipe import recipe

TILE = 128  # GEMM output tile edge used for tile/wave quantization (CUTLASS/cuBLAS 128x128)


# ---- efficiencies ------------------------------------------------------------------------
def efficiencies(layout: Layout, profile: dict | None = None) -> dict:
    """Achieved fractions for this accelerator: a calibrated profile's values when given,
    else the documented defaults in conventions.toml [efficiency]."""
    eff = conventions()["efficiency"]
    name = layout.gpu.name
    out = {
        "gemm": eff["gemm"][name] * eff["gemm_training_fraction_of_mamf"] if name in eff["gemm"]
        else eff["gemm_default"],
        "flash": eff["flash_attention"].get(name, eff["flash_attention_default"]),
        "hbm": eff["hbm"],
        "nvlink": eff["nvlink_ring"],
        "nic": eff["nic"],
        "latency": eff["collective_latency_us"] * 1e-6,
    }
    if profile:
        out.update({k: v for k, v in profile.items() if k in out})
    return out


def gemm_efficiency(m, n, k, peak_eff, sms, elem_bytes=2):
    """Achieved fraction of peak for an (m x k) @ (k x n) GEMM: tile and wave quantization
    (MLE-P 'tile and wave quantization') times an alignment penalty for an innermost
    dimension that is not a multiple of 16 bytes (thonking.ai: > 2x slower)."""
    m, n, k = (np.maximum(np.asarray(x, dtype=float), 1) for x in (m, n, k))
    tiles_m, tiles_n = np.ceil(m / TILE), np.ceil(n / TILE)
    tile_q = (m * n) / (tiles_m * tiles_n * TILE * TILE)
    tiles = tiles_m * tiles_n
    wave_q = tiles / (np.ceil(tiles / sms) * sms)
    aligned = np.where((np.mod(k * elem_bytes, 16) == 0) & (np.mod(n * elem_bytes, 16) == 0), 1.0, 0.5)
    return peak_eff * tile_q * wave_q * aligned


def _gemm_time(m, n, k, count, peak, eff, sms, elem_bytes):
    flops = 2.0 * m * n * k * count
    return flops / (peak * gemm_efficiency(m, n, k, eff, sms, elem_bytes))


@lru_cache(maxsize=1024)
def _linears(model, index):
    return tuple(model.layer_linears(index))


def layer_gemm_time(model, index, tokens, tp, ep, peak, eff, sms, elem_bytes):
    """Forward GEMM seconds of layer `index` for `tokens` tokens on one rank (all its
    linears evaluated at once)."""
    kvh = model.heads if model.is_mla else model.n_kv_heads
    shapes = []
    for lin in _linears(model, index):
        k, n = lin.fan_in, lin.fan_out
        if lin.tp == "col":
            n = n / tp
        elif lin.tp == "row":
            k = k / tp
        elif lin.tp == "kv":
            n = n / min(tp, kvh)
        if lin.expert:
            # ep ranks each host E/ep experts and receive top_k·tokens routed tokens in all
            shapes.append((model.top_k * tokens * ep / lin.count, n, k, lin.count / ep))
        else:
            shapes.append((tokens, n, k, 1.0))
    m, n, k, count = (np.array(col, dtype=float) for col in zip(*shapes, strict=True))
    return float(np.sum(_gemm_time(m, n, k, count, peak, eff, sms, elem_bytes)))


# ---- the step ---------------------------------------------------------------------------
def step_time(layout: Layout, profile: dict | None = None, memory: dict | None = None) -> dict:
    plan, model, gpu = layout.plan, layout.model, layout.gpu
    r = recipe(plan)
    e = efficiencies(layout, profile)
    dtype = "bf16" if plan.precision == "fp8" and gpu.peak("fp8") is None else plan.precision
    dtype = "tf32" if dtype == "fp32" and gpu.peak("tf32") else dtype
    peak = gpu.peak(dtype) or gpu.peak("bf16")
    gemm_peak = gpu.peak("fp8") if plan.precision == "fp8" else peak
    sms = gpu.sms or 108
    elem = r.act_bytes
    hbm = gpu.hbm_tbs * 1e12 * e["hbm"]
    tp, pp, dp, cp, ep = layout.tp, layout.pp, layout.dp, layout.cp, layout.ep
    gpn = plan.gpus_per_node
    nvlink = gpu.scale_up_gbs / 2 * 1e9 * e["nvlink"]  # unidirectional per GPU
    nic = (gpu.nic_gbps / 8 * 1e9 * e["nic"]) if gpu.nic_gbps else nvlink
    if not gpu.scale_up_gbs:
        nvlink = nic
    lat = e["latency"]
    tokens = layout.mbs * layout.seq_len / cp
    seq = layout.seq_len
    h = model.hidden
    rc = act.RECOMPUTE_CODE[plan.recompute]

    # -- per-layer forward compute for one micro-batch
    dense_i = next((i for i in range(model.layers) if not model.is_moe_layer(i)), None)
    moe_i = next((i for i in range(model.layers) if model.is_moe_layer(i)), None)
    gemm = {kind: layer_gemm_time(model, i, tokens, tp, ep, gemm_peak, e["gemm"], sms, elem) if i is not None else 0.0
            for kind, i in (("dense", dense_i), ("moe", moe_i))}
    heads_local = model.heads / tp
    qk = model.q_dim / model.heads
    vd = model.attn_out_dim / model.heads
    if plan.attention == "eager":
        attn = 2 * _gemm_time(seq, seq, qk, layout.mbs * heads_local / cp, peak, e["gemm"], sms, elem) \
            + (layout.mbs * heads_local * seq * seq / cp) * elem * 4 / hbm  # softmax in/out, mask
    else:
        # the causal half of 2·s·(qk + v) per token per head, at the kernel's efficiency
        attn = 0.5 * tokens * seq * heads_local * 2 * (qk + vd) / (peak * e["flash"])
    f_dense = model.ffn / tp
    elem_elems = (10 * h + (3 if model.mlp == "swiglu" else 2) * f_dense
                  + (2 * (model.q_dim + model.kv_dim) / tp if model.position == "rotary" else 0)
                  + (6 * h if plan.dropout > 0 else 0))
    elementwise = tokens * elem_elems * elem / hbm
    layer_fwd = {k: v + attn + elementwise for k, v in gemm.items()}
    attn_bwd_ratio = 2.0 if plan.attention == "eager" else 2.5
    layer_bwd = {k: 2 * gemm[k] + attn_bwd_ratio * attn + 2 * elementwise for k in gemm}

    # -- per-layer exposed communication for one micro-batch
    tp_bytes = tokens * h * elem
    tp_ar = comm.collective_time(comm.ALL_REDUCE, tp_bytes, tp, comm.group_busbw(tp, 1, gpn, nvlink, nic), lat)
    tp_fwd, tp_bwd = 2 * tp_ar, 2 * tp_ar
    if plan.overlap_tp:
        # Chunked TP overlap (Megatron --tp-comm-overlap) hides the collectives behind the
        # GEMMs of the same pass; what exceeds them stays exposed.
        tp_fwd = np.maximum(0.0, 2 * tp_ar - gemm["dense"])
        tp_bwd = np.maximum(0.0, 2 * tp_ar - 2 * gemm["dense"])
    a2a = comm.collective_time(comm.ALL_TO_ALL, tokens * model.top_k * h * elem, ep,
                               comm.group_busbw(ep, tp * cp, gpn, nvlink, nic), lat) if model.is_moe else 0.0
    cp_ring = comm.collective_time(comm.ALL_GATHER, tokens * 2 * model.kv_dim / tp * elem * cp, cp,
                                   comm.group_busbw(cp, tp, gpn, nvlink, nic), lat)
    cp_exposed = np.maximum(0.0, cp_ring - attn)
    # recompute: full re-runs each layer's forward (with its TP collectives), selective the
    # attention core only
    compute = {k: layer_fwd[k] + layer_bwd[k] + (layer_fwd[k] if rc == 2 else (attn if rc == 1 else 0.0))
               for k in gemm}
    tp_layer = tp_fwd + tp_bwd + (tp_fwd if rc == 2 else 0.0)
    ep_layer = 4 * a2a
    cp_layer = 3 * cp_exposed

    # -- per stage, per micro-batch, by component
    dense_l = np.asarray(layout.stage_dense_layers, dtype=float)
    moe_l = np.asarray(layout.stage_moe_layers, dtype=float)
    v_pad = layout.vocab_padded
    first = (np.arange(pp) == 0).astype(float)
    last = (np.arange(pp) == pp - 1).astype(float)
    head_fwd = _gemm_time(tokens, v_pad / tp, h, 1, peak, e["gemm"], sms, elem) + tokens * v_pad / tp * 4 * 3 / hbm
    embed_fwd = tokens * h * elem * 2 / hbm
    parts = {
        "compute": dense_l * compute["dense"] + moe_l * compute["moe"] + 3 * last * head_fwd + 3 * first * embed_fwd,
        "tp_comm": (dense_l + moe_l) * tp_layer,
        "ep_comm": moe_l * ep_layer,
        "cp_comm": (dense_l + moe_l) * cp_layer,
    }
    # -- pipeline: each micro-batch sends its activations forward and their gradients back;
    # Megatron's scatter-gather optimization sends 1/t of the tensor across nodes and
    # all-gathers it over NVLink (Narayanan et al. 2021 §4.1). In 1F1B these transfers sit
    # on the critical path of every micro-batch.
    p2p_bytes = tokens * h * elem / tp
    # neighbouring stages are tp·cp·dp ranks apart; each rank sends over its own link
    p2p = float(comm.collective_time(comm.SEND_RECV, p2p_bytes, 2, comm.group_busbw(2, tp * cp * dp, gpn, nvlink, nic),
                                     lat)) if pp > 1 else 0.0
    parts["pp_comm"] = np.full(pp, 2 * p2p)
    stage = sum(parts.values())
    sched = SCHEDULE_CODE[plan.schedule]
    m = layout.micro_batches
    pipe = float(pipeline_time(sched, pp, m, stage.max(), stage.sum(), layout.vpp, p2p, wgrad_share=1 / 3))
    slow = int(np.argmax(stage))
    busy = {k: m * float(v[slow]) for k, v in parts.items()}
    bubble = max(pipe - sum(busy.values()), 0.0)

    # -- data parallel gradient reduction (+ ZeRO-3 gathers) and the optimizer
    from .memory import estimate_memory

    mem = memory if memory is not None else estimate_memory(layout)
    trainable = float(np.max(mem["trainable_params"]))
    dp_group = dp * cp
    dp_bw = comm.group_busbw(dp_group, tp, gpn, nvlink, nic)
    grad_bytes = trainable * r.grad_bytes
    stage_compute = float(parts["compute"][slow])
    if layout.zero >= 3:
        # FSDP / ZeRO-3 gathers the parameters for every micro-batch's forward and backward
        # and reduce-scatters its gradients, prefetching so that each overlaps that
        # micro-batch's compute.
        gather = float(comm.collective_time(comm.ALL_GATHER, trainable * dp_group * r.compute_weight_bytes / dp_group,
                                            dp_group, dp_bw, lat))
        scatter = float(comm.collective_time(comm.REDUCE_SCATTER, trainable * dp_group * r.grad_bytes / dp_group,
                                             dp_group, dp_bw, lat))
        per_mb = 2 * gather + scatter
        dp_comm = m * per_mb
        dp_exposed = m * (max(0.0, per_mb - stage_compute) if plan.overlap_dp else per_mb)
    elif layout.zero >= 1:
        # sharded optimizer (ZeRO-1/2, Megatron's distributed optimizer): reduce-scatter the
        # gradients during the last micro-batch's backward, all-gather the updated
        # parameters during the next step's first forward (--overlap-grad-reduce,
        # --overlap-param-gather)
        rs = float(comm.collective_time(comm.REDUCE_SCATTER, grad_bytes, dp_group, dp_bw, lat))
        ag = float(comm.collective_time(comm.ALL_GATHER, trainable * r.compute_weight_bytes, dp_group, dp_bw, lat))
        dp_comm = rs + ag
        dp_exposed = (max(0.0, rs - stage_compute * 2 / 3) + max(0.0, ag - stage_compute / 3)) \
            if plan.overlap_dp else dp_comm
    else:
        # one all-reduce per step; with overlap it runs bucket by bucket during the last
        # micro-batch's backward
        dp_comm = float(comm.collective_time(comm.ALL_REDUCE, grad_bytes, dp_group, dp_bw, lat))
        dp_exposed = max(0.0, dp_comm - stage_compute * 2 / 3) if plan.overlap_dp else dp_comm
    shard = dp_group if layout.zero >= 1 else 1
    opt_bytes = trainable / shard * (r.grad_bytes + 2 * (r.master_bytes + r.optimizer_bytes) + r.weight_bytes)
    optimizer = 0.0 if plan.offload_optimizer else opt_bytes / hbm
    step = pipe + dp_exposed + optimizer

    # -- throughput and utilisation (PaLM's MFU: model FLOPs without recompute; HFU with)
    fl = step_flops(model, tokens=layout.gbs * layout.seq_len, seq=seq,
                    dense_layers=model.layers - model.n_moe_layers, moe_layers=model.n_moe_layers, head=1,
                    attention_eager=plan.attention == "eager", recompute=rc, vocab_padded=model.vocab)
    model_flops, hw_flops = float(fl["model"]), float(fl["hardware"])
    gpus = layout.gpus
    peak_dense = gpu.peak("bf16") or peak if plan.precision in ("bf16", "fp8") else peak
    breakdown = {**busy, "bubble": bubble, "dp_comm": dp_exposed, "optimizer": optimizer}
    slowest = max((k for k in breakdown if k != "compute"), key=lambda k: breakdown[k])
    return {
        "step_s": step,
        "tokens_per_s": layout.gbs * layout.seq_len / step,
        "tflops_per_gpu": model_flops / step / gpus / 1e12,
        "hardware_tflops_per_gpu": hw_flops / step / gpus / 1e12,
        "mfu": model_flops / (peak_dense * step * gpus),
        "hfu": hw_flops / (peak_dense * step * gpus),
        "bubble_fraction": bubble / step,
        "breakdown_s": breakdown,
        "bottleneck": f"{slowest.replace('_', ' ')} {breakdown[slowest] / step:.0%}"
        if breakdown[slowest] > 0.1 * step else "compute-bound",
        "model_flops_per_step": model_flops,
        "hardware_flops_per_step": hw_flops,
        "per_microbatch_stage_s": [float(x) for x in stage],
        "micro_batch_s": {k: float(v[slow]) for k, v in parts.items()},
    }
