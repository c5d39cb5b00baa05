"""The numbers behind `plan --explain`, as data: the memory formula of the peak stage and the
parts of the step, for the explorer's "why" panel to word in its own language.

The same terms as `explain.explain_lines` / `explain_time_lines` print (one peak stage; the
step's slowest stage), taken from the same estimates: every value here is also in, or sums to,
the plan's JSON (`memory.stages[i]`, `time.breakdown_s`).
"""

from __future__ import annotations

import numpy as np

from .estimate.pipeline import SCHEDULE_CODE, in_flight
from .estimate.recipe import recipe
from .report import PlanResult


def _at(values, i: int, pp: int) -> float:
    return float(np.broadcast_to(np.asarray(values, dtype=float), (pp,))[i])


def memory_terms(result: PlanResult) -> dict:
    """The peak stage's memory, term by term: parameters P (trainable T) times bytes per
    parameter over ZeRO's shard group, activations per layer times layers times micro-batches
    in flight plus the embedding/head terms, and the buffers."""
    L, m = result.layout, result.memory
    p, r = L.plan, recipe(L.plan)
    i = int(np.argmax(np.broadcast_to(m["total"], (L.pp,))))
    at = lambda v: _at(v, i, L.pp)  # noqa: E731
    full = p.finetune == "full"
    layers = []
    for kind, terms, count in (("dense", m["dense_layer_terms"], L.stage_dense_layers[i]),
                               ("moe", m["moe_layer_terms"], L.stage_moe_layers[i])):
        if count:
            per = {k: float(np.asarray(v).flat[0]) for k, v in terms.items() if float(np.asarray(v).flat[0])}
            layers.append({"kind": kind, "count": int(count), "per_layer_bytes": sum(per.values()), "terms": per})
    flight = float(in_flight(SCHEDULE_CODE[p.schedule], i, L.pp, L.micro_batches, L.vpp, p.pp_group, p.framework))
    return {
        "stage": i, "stages": L.pp, "layers": int(L.stage_layers[i]), "params": at(m["param_count"]),
        "trainable": at(m["trainable_params"]), "shard": L.dp_shard * L.cp, "zero": L.zero,
        "moe": bool(L.model.is_moe), "finetune": p.finetune,
        "bytes_per_param": {"weights": r.weight_bytes if full else r.frozen_weight_bytes, "grads": r.grad_bytes,
                            "master": r.master_bytes, "optimizer": r.optimizer_bytes},
        "sharded": {"weights": bool(full and r.weights_sharded(L.zero)), "grads": L.zero >= 2,
                    "optimizer": L.zero >= 1},
        "weights_bytes": at(m["params"]), "grads_bytes": at(m["grads"]), "optimizer_bytes": at(m["optimizer"]),
        "offload_optimizer": bool(p.offload_optimizer),
        "tokens_per_rank": L.mbs * L.seq_len / L.cp, "mbs": L.mbs, "seq_len": L.seq_len,
        "activation_layers": layers, "in_flight": flight, "micro_batches": L.micro_batches,
        # what one micro-batch's layers keep: every layer's terms, less what full recompute
        # (checkpointed layers keep their input) and LoRA's frozen first norm do not keep
        "layers_per_micro_batch_bytes": at(m["activation_parts"]["layers"]) / flight if flight else 0.0,
        "schedule": p.schedule, "activations_bytes": at(m["activations"]),
        "activation_parts": {k: at(v) for k, v in m["activation_parts"].items() if at(v)},
        "other": {k: at(m[k]) for k in ("zero3_gather", "comm_buckets", "loss_workspace", "fragmentation",
                                        "runtime_reserved")},
        "total_bytes": at(m["total"]), "capacity_bytes": float(result.capacity),
    }


def time_terms(result: PlanResult) -> dict:
    """The step's parts: one layer's forward and backward on the slowest stage, that stage's
    micro-batch, the pipeline over the step's micro-batches, then what data parallelism, the
    optimizer and the input pipeline add (`time.breakdown_s`, which sums to the step)."""
    from .estimate.time import step_derivation
    from .profile import load_profile

    L, p = result.layout, result.layout.plan
    d = step_derivation(L, load_profile(p.gpu_profile) if p.gpu_profile else None, result.memory)
    stage_s = np.broadcast_to(np.asarray(d["stage_s"], dtype=float), (L.pp,))
    i = int(np.argmax(stage_s))
    det = d["detail"]
    per_layer = []
    for kind, count in (("dense", L.stage_dense_layers[i]), ("moe", L.stage_moe_layers[i])):
        if count:
            t = {k: _at(v, i, L.pp) for k, v in det["layer"][kind].items()}
            per_layer.append({"kind": kind, "count": int(count), **{k: t[k] for k in (
                "gemm_forward", "gemm_backward", "attention_forward", "attention_backward", "elementwise_forward",
                "elementwise_backward", "recompute", "total")}})
    # each parallelism's exposed communication a layer (TP's collectives, CP's K/V exchange,
    # EP's all-to-alls), over the stage's layers
    tp_layer = det["tp_layer"]["dense" if L.stage_dense_layers[i] else "moe"]
    comm = {name: _at(per, i, L.pp) for name, per, on in (("tp_comm", tp_layer, L.tp > 1), ("cp_comm", det["cp_layer"], L.cp > 1),
                                                          ("ep_comm", det["ep_layer"], L.ep > 1)) if on}
    return {
        "stage": i, "stages": L.pp, "layers": per_layer, "comm_per_layer_s": comm,
        "stage_layers": int(L.stage_dense_layers[i] + L.stage_moe_layers[i]),
        "head_s": _at(det["head"], i, L.pp) if i == L.pp - 1 else 0.0,
        "embedding_s": _at(det["embedding"], i, L.pp) if i == 0 else 0.0,
        "micro_batch_s": {k: float(np.asarray(v).ravel()[0]) for k, v in d["micro_batch_s"].items()},
        "micro_batches": L.micro_batches, "schedule": p.schedule, "vpp": L.vpp,
        "pipeline_s": float(np.asarray(d["pipeline_s"]).ravel()[0]),
        "dp_ranks": L.dp * L.cp, "breakdown_s": dict(result.time["breakdown_s"]), "step_s": result.time["step_s"],
    }


def explain_json(result: PlanResult) -> dict:
    """The "explain" key of a plan's web answer."""
    return {"memory": memory_terms(result), "time": time_terms(result)}
