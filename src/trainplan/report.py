"""The plan result as the JSON contract of DESIGN §5 (keys are extended, never renamed)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .estimate.accuracy import prediction_accuracy
from .estimate.memo import Memo, SameObjects
from .estimate.memory import estimate_memory_and_line
from .estimate.micro_batch_limit import max_micro_batch
from .estimate.recipe import Recipe, recipe
from .estimate.scalars import largest
from .estimate.time import step_time
from .estimate.training import training_figures
from .plan import Layout, Plan, conventions, resolve

STAGE_COMPONENTS = ("params", "grads", "master", "optimizer_state", "activations", "zero3_gather",
                    "comm_buckets", "loss_workspace", "fragmentation", "runtime_reserved")


@dataclass
class PlanResult:
    layout: Layout
    memory: dict
    time: dict | None = None
    training: dict | None = None
    # each stage's memory line in the micro-batch size, from the same evaluation (max_micro_batch)
    mbs_line: dict | None = None
    # the plan's recipe, derived once for the memory, the step, the run and the report
    recipe: Recipe | None = None

    @property
    def capacity(self) -> float:
        return self.layout.gpu.capacity_bytes

    @property
    def peak(self) -> float:
        return largest(self.memory["total"])

    @property
    def fits(self) -> bool:
        return self.peak <= self.capacity


def evaluate(plan: Plan, with_time: bool = True, spec=None) -> PlanResult:
    """Memory, time and the training run of a plan (for an in-memory model spec if given)."""
    layout = resolve(plan, spec)
    r = recipe(plan)  # derived once for the memory, the step and the run
    memory, line = estimate_memory_and_line(layout, r)
    result = PlanResult(layout=layout, memory=memory, mbs_line=line, recipe=r)
    if with_time:
        profile = None
        if plan.gpu_profile:
            from .profile import load_profile

            profile = load_profile(plan.gpu_profile)
        result.time = step_time(layout, profile, result.memory, r)
        result.training = training_figures(layout, result.time["step_s"], r)
    return result


# the stage rows' figures: (row key, memory key) of the top-level columns, then the components
STAGE_COLUMNS = (("params_bytes", "params"), ("grads_bytes", "grads"), ("optimizer_bytes", "optimizer"),
                 ("activations_bytes", "activations"), ("other_bytes", "other"), ("total_bytes", "total"),
                 ("param_count", "param_count"), ("cpu_offload_bytes", "cpu_offload"))


def stage_rows(result: PlanResult) -> list[dict]:
    """One row per pipeline stage: its memory by column, sharding buffer and component (fresh
    dicts for each call)."""
    m = result.memory
    parts, buffers = m["activation_parts"], m["sharding_buffers"]
    values = ([m[key] for _, key in STAGE_COLUMNS] + list(buffers.values())
              + [m[k] for k in STAGE_COMPONENTS] + list(parts.values()))
    names = (tuple(buffers), tuple(parts), tuple(result.layout.stage_layers))
    # a memoised plan's figures are the same objects (numbers, read-only arrays) again: its rows
    # are those the same objects gave
    rows = _STAGE_ROWS.get(names, tuple(values), lambda: _stage_rows(values, names, result.layout.pp))
    return [{**row, "sharding_buffers": {**row["sharding_buffers"]},
             "components": {**row["components"], "activation_parts": {**row["components"]["activation_parts"]}}}
            for row in rows]


_STAGE_ROWS = SameObjects(64)  # the stage rows of a memoised plan's figures


def _stage_rows(values: list, names: tuple, pp: int) -> list[dict]:
    """`stage_rows` from its figures in order (`values`) and the names of the buffers, the
    activation parts and each stage's layers. Every figure goes into one stages x figures table
    of floats (a term that is the same on every stage fills its column), read back as Python
    floats in one pass."""
    table = np.empty((len(values), pp))
    for i, v in enumerate(values):
        table[i] = v
    col_names = [name for name, _ in STAGE_COLUMNS]
    buf_names, part_names, stage_layers = names
    rows = []
    for i, (n, figures) in enumerate(zip(stage_layers, table.T.tolist(), strict=True)):
        it = iter(figures)  # each zip below takes its names' count of figures from it, in order
        row = {"stage": i, "layers": n}
        row.update(zip(col_names, it, strict=False))
        row["sharding_buffers"] = dict(zip(buf_names, it, strict=False))
        components = dict(zip(STAGE_COMPONENTS, it, strict=False))
        components["activation_parts"] = dict(zip(part_names, it, strict=False))
        row["components"] = components
        rows.append(row)
    return rows


_ACCURACY = Memo(64)


def _accuracy(gpu_name: str, profiled: bool, moe: bool, finetune: str) -> dict:
    """`prediction_accuracy`, read once per accelerator and kind of plan (a fresh copy each time)."""
    found = _ACCURACY.get((gpu_name, profiled, moe, finetune),
                          lambda: prediction_accuracy(gpu_name, profiled=profiled, moe=moe, finetune=finetune))
    return {k: list(v) if isinstance(v, list) else v for k, v in found.items()}


def _sharding_buffer_sources(buffers: dict) -> dict:
    """The sources (conventions.toml [sharding_buffers]) of the buffers some stage holds; of a
    memoised plan's (read-only arrays) the names found for the same objects again."""
    sources = conventions()["sharding_buffers"]
    values = tuple(buffers[k] for k in sources)
    used = _SOURCES.get(None, (sources, *values), lambda: tuple(
        k for k, v in zip(sources, values, strict=True) if (np.asarray(v) > 0).any()))
    return {k: sources[k] for k in used}


_SOURCES = SameObjects(64)  # the names of the buffers some stage holds, of a memoised plan's figures


def _peak_stage(total) -> int:
    """The stage of the memory peak (the first of equal ones); 0 for one figure for all stages."""
    if total.__class__ is np.ndarray:
        return int(total.argmax()) if total.ndim else 0
    return int(np.argmax(total)) if np.ndim(total) else 0


def to_json(result: PlanResult, with_max_mbs: bool = True) -> dict:
    L = result.layout
    p = L.plan
    r = result.recipe if result.recipe is not None else recipe(p)
    peak, capacity = result.peak, result.capacity
    return {
        "model": {"name": L.model.name, "params": L.model.params, "active_params": L.model.active_params,
                  "layers": L.model.layers, "hidden": L.model.hidden, "vocab": L.model.vocab,
                  "vocab_padded": L.vocab_padded},
        "gpu": {"name": L.gpu.name, "memory_gib": L.gpu.memory_gib, "gpus": L.gpus,
                "gpus_per_node": p.gpus_per_node, "scale_up_gbs": L.gpu.scale_up_gbs, "nic_gbps": L.gpu.nic_gbps},
        "parallel": {"tp": L.tp, "pp": L.pp, "dp": L.dp, "cp": L.cp, "ep": L.ep, "zero": L.zero, "dp_shard": L.dp_shard,
                     "sp": L.sp, "mbs": L.mbs, "gbs": L.gbs, "gbs_given": p.gbs is not None, "seq_len": L.seq_len,
                     "micro_batches": L.micro_batches, "recompute": p.recompute,
                     "recompute_early_stop": r.early_stop_checkpoint and p.recompute == "full",
                     "recompute_layers": p.recompute_layers, "recompute_modules": p.recompute_modules,
                     "schedule": p.schedule, "vpp": L.vpp, "pp_group": p.pp_group,
                     "stage_layers": L.stage_layers, "cp_comm": p.cp_comm,
                     "backward_prefetch": p.backward_prefetch},
        "recipe": {"precision": p.precision, "optimizer": p.optimizer, "optimizer_impl": r.optimizer_impl,
                     "grad_clip": p.grad_clip, "framework": p.framework, "master_weights": p.master_weights,
                     "optimizer_state_bytes": r.state_bytes,
                     "attention": p.attention, "fused_loss": p.fused_loss, "dropout": p.dropout,
                     "reduce_dtype": p.reduce_dtype, "fused_kernels": r.fused_kernels, "fp8_cache": p.fp8_cache,
                     "finetune": p.finetune,
                     "bytes_per_param": {"weights": r.weight_bytes, "grads": r.grad_bytes,
                                         "master": r.master_bytes, "optimizer": r.optimizer_bytes},
                     **({"lora_rank": p.lora_rank, "lora_targets": p.lora_targets}
                        if p.finetune != "full" else {})},
        "memory": {
            "capacity_bytes": capacity,
            "peak_bytes": peak,
            "fits": bool(peak <= capacity),
            "headroom_bytes": capacity - peak,
            "peak_stage": _peak_stage(result.memory["total"]),
            **({"max_mbs": max_micro_batch(L, line=result.mbs_line)} if with_max_mbs else {}),
            "stages": stage_rows(result),
            # what each of the stages' sharding_buffers is, with its source (the bytes by which a
            # higher ZeRO stage may need more memory than a lower one)
            "sharding_buffer_sources": _sharding_buffer_sources(result.memory["sharding_buffers"]),
        },
        **({"compute": {"model_flops_per_step": result.time["model_flops_per_step"],
                        "hardware_flops_per_step": result.time["hardware_flops_per_step"]},
            "time": {**{k: v for k, v in result.time.items()
                        if k not in ("model_flops_per_step", "hardware_flops_per_step")},
                     "accuracy": _accuracy(L.gpu.name, bool(p.gpu_profile), L.model.is_moe, p.finetune)},
            "training": result.training} if result.time else {}),
        "warnings": list(L.warnings),
        "warning_details": list(L.warning_details),
    }
