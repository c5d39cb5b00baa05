"""A DeepSpeed JSON configuration (deepspeed.ai/docs/config-json) for a plan."""

from __future__ import annotations

import json

from ..errors import PlanError
from ..files import non_finite_key


def deepspeed_config(layout) -> str:
    p = layout.plan
    mixed = p.precision != "fp32"
    if mixed and not p.master_weights:
        raise PlanError("master_weights", "DeepSpeed's bf16/fp16 optimizers keep fp32 master weights: a DeepSpeed "
                        "config cannot train in pure 16 bits (plan with --master-weights to export it)")
    if p.optimizer_state_dtype not in (None, "fp32"):
        raise PlanError("optimizer_state_dtype", "DeepSpeed keeps the optimizer state in fp32; its config has no "
                        "16-bit state (plan without --optimizer-state-dtype to export it)")
    zero: dict = {"stage": min(layout.zero, 3), "overlap_comm": bool(p.overlap_dp), "contiguous_gradients": True}
    if layout.zero >= 3 and layout.dp_shard < layout.dp:
        # MiCS: parameters, gradients and optimizer state partitioned within groups of this many
        # ranks, replicated across the groups (ZeRO-3 only)
        zero["mics_shard_size"] = layout.dp_shard * layout.cp
    if p.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if p.offload_params:
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    cfg = {
        "train_batch_size": layout.gbs,
        "train_micro_batch_size_per_gpu": layout.mbs,
        "gradient_accumulation_steps": layout.micro_batches,
        "zero_optimization": zero,
        "bf16": {"enabled": p.precision in ("bf16", "fp8")},
        "fp16": {"enabled": p.precision == "fp16"},
        "gradient_clipping": p.grad_clip,
        "optimizer": {"type": "AdamW" if p.optimizer in ("adamw", "adam") else "SGD" if p.optimizer.startswith("sgd")
                      else "Adam", "params": {"lr": 3e-4}},
    }
    if p.reduce_dtype is not None:  # the dtype of the gradient all-reduce / reduce-scatter
        cfg["communication_data_type"] = p.reduce_dtype
    if p.recompute != "none":
        cfg["activation_checkpointing"] = {"partition_activations": layout.tp > 1,
                                           "contiguous_memory_optimization": False, "cpu_checkpointing": False}
    try:  # strict JSON: DeepSpeed's json.load would take Infinity, but no other reader does
        return json.dumps(cfg, indent=2, allow_nan=False) + "\n"
    except ValueError:
        raise PlanError(non_finite_key(cfg) or "to", "is not a finite number; DeepSpeed's configuration takes finite numbers only") from None
