"""`trainplan plan --explain`: each memory term's formula with the plan's numbers filled in."""

from __future__ import annotations

import numpy as np

from .estimate.pipeline import SCHEDULE_CODE, in_flight
from .estimate.recipe import recipe
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
    shard = L.dp * L.cp
    tokens = L.mbs * L.seq_len / L.cp
    out = [f"Stage {i} of {L.pp} ({L.stage_layers[i]} layers) — the peak stage" if stage is None
           else f"Stage {i} of {L.pp} ({L.stage_layers[i]} layers)"]
    out.append(f"  parameters on this GPU  P = {_n(P)}  (layers / tp={L.tp}"
               + (f", experts / (ep={L.ep} x tp)" if L.model.is_moe else "")
               + (", + embedding" if i == 0 else "") + (", + output head" if i == L.pp - 1 else "") + ")")
    if p.finetune != "full":
        out.append(f"  trainable (LoRA adapters, rank {p.lora_rank})  T = {_n(T)}")
    wdiv = f" / {shard} (ZeRO-3 over dp x cp)" if L.zero >= 3 else ""
    wb = r.frozen_weight_bytes if p.finetune != "full" else r.weight_bytes
    out.append(f"  weights      = P x {wb:g} B{wdiv} = {_g(pick(m['params']))}")
    gdiv = f" / {shard}" if L.zero >= 2 else ""
    out.append(f"  gradients    = T x {r.grad_bytes:g} B{gdiv} = {_g(pick(m['grads']))}")
    exp_shard = max(shard // L.ep, 1)
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
    flight = float(in_flight(SCHEDULE_CODE[p.schedule], i, L.pp, L.micro_batches, L.vpp))
    out.append(f"  activations  = {L.stage_layers[i]} layers x per-layer x {flight:g} micro-batch(es) in flight "
               f"({p.schedule}, m={L.micro_batches}) + embedding/head terms = {_g(pick(m['activations']))}")
    for k, v in parts.items():
        if v:
            out.append(f"      {k:<24s} {_g(v)}")
    out.append(f"  other        = ZeRO-3 gather {_g(pick(m['zero3_gather']))} + buckets "
               f"{_g(pick(m['comm_buckets']))} + loss workspace {_g(pick(m['loss_workspace']))}"
               f" + fragmentation {_g(pick(m['fragmentation']))} + runtime {_g(pick(m['runtime_reserved']))}")
    out.append(f"  total        = {_g(pick(m['total']))} of {_g(result.capacity)}")
    return out
