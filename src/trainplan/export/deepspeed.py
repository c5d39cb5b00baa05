"""A DeepSpeed JSON configuration (deepspeed.ai/docs/config-json, DeepSpeed 0.19) for a plan.

Tensor parallelism is DeepSpeed's AutoTP training (`tensor_parallel.autotp_size`) and expert
parallelism its AutoEP (`expert_parallel.autoep_size`); the data-parallel size DeepSpeed's
batch check divides by is then what remains (deepspeed/runtime/config.py _batch_assertion).
What the JSON cannot say (pipeline stages live in the model code's PipelineModule; Megatron's
sequence parallelism, context parallelism, fp8) is refused by name.
"""

from __future__ import annotations

import json

from ..errors import PlanError
from ..files import non_finite_key

# The plan's optimizers by the names DeepSpeed resolves (deepspeed/runtime/config.py
# DEEPSPEED_OPTIMIZERS, lower-cased; any other name is looked up in torch.optim by
# engine._configure_basic_optimizer): DeepSpeed's own Adam/AdamW/Lion, torch's SGD and Adafactor.
OPTIMIZERS = {"adamw": "AdamW", "adam": "Adam", "lion": "Lion", "sgd": "SGD", "sgd-momentum": "SGD",
              "adafactor": "Adafactor"}
TORCH_OPTIMIZERS = ("SGD", "Adafactor")  # ZeRO runs them only with zero_allow_untested_optimizer
# A plan decides none of these; DeepSpeed would fall back to its optimizer's defaults (FusedAdam: lr 1e-3)
USER_CHOICES = ("optimizer.params.lr (and betas, eps, weight_decay)", "scheduler", "the data and steps")
USER_KEY = "_set_before_launch"


def _refuse(field: str, what: str) -> PlanError:
    return PlanError(field, f"a DeepSpeed configuration cannot express {what}")


def _check_expressible(layout) -> None:
    p = layout.plan
    if layout.pp > 1:
        raise _refuse("pp", f"{layout.pp} pipeline stages (they are PipelineModule(num_stages=...) in the model "
                      "code, not the JSON); export to megatron or torchtitan")
    if layout.sp:
        raise _refuse("sp", "Megatron-style sequence parallelism (AutoTP splits the linears only); plan without --sp")
    if layout.cp > 1:
        raise _refuse("cp", f"context parallelism over {layout.cp} ranks (its Ulysses sequence parallelism "
                      "exchanges heads all-to-all, not the plan's K/V); export to megatron or torchtitan")
    if p.precision == "fp8":
        raise _refuse("precision", "fp8 (it comes from Transformer Engine layers in the model code); export to "
                      "megatron, or plan in bf16")
    if p.optimizer not in OPTIMIZERS:
        raise _refuse("optimizer", f"{p.optimizer} (its optimizer types are DeepSpeed's Adam, AdamW, Lion, "
                      "Lamb and torch.optim's classes; bitsandbytes' 8-bit Adam is passed in the script)")
    if p.precision != "fp32" and not p.master_weights:
        raise PlanError("master_weights", "DeepSpeed's bf16/fp16 optimizers keep fp32 master weights: a DeepSpeed "
                        "config cannot train in pure 16 bits (plan with --master-weights to export it)")
    if p.optimizer_state_dtype not in (None, "fp32"):
        raise PlanError("optimizer_state_dtype", "DeepSpeed keeps the optimizer state in fp32; its config has no "
                        "16-bit state (plan without --optimizer-state-dtype to export it)")
    if p.recompute == "selective":
        raise _refuse("recompute", "selective recomputation (its activation checkpointing wraps whole layers); "
                      "plan with --recompute full or none")
    if p.recompute == "full" and p.recompute_layers is not None:
        raise _refuse("recompute_layers", "recomputing some layers only (the model code checkpoints every "
                      "layer); plan without --recompute-layers")
    if layout.dp_shard < layout.dp:
        # MiCS (zero_optimization.mics_shard_size) was removed in DeepSpeed 0.19; ZeRO++'s hpZ keeps
        # a second copy of the parameters per group but shards the optimizer over every rank
        raise _refuse("dp_shard", f"sharding within groups of {layout.dp_shard} ranks (MiCS is gone from "
                      "DeepSpeed 0.19); export to torchtitan (HSDP) or megatron")


def deepspeed_dict(layout) -> dict:
    _check_expressible(layout)
    p = layout.plan
    zero: dict = {"stage": layout.zero, "overlap_comm": bool(p.overlap_dp), "contiguous_gradients": True}
    if p.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if p.offload_params:
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    name = OPTIMIZERS[p.optimizer]
    params: dict = {}
    if p.optimizer == "adam":
        params["adam_w_mode"] = False  # DeepSpeed's "Adam" runs AdamW unless told otherwise
    elif p.optimizer == "sgd-momentum":
        params["momentum"] = 0.9  # the plan's momentum buffer; the value itself is yours to tune
    cfg: dict = {
        USER_KEY: f"a plan does not decide these: {'; '.join(USER_CHOICES)}",
        "train_batch_size": layout.gbs,
        "train_micro_batch_size_per_gpu": layout.mbs,
        "gradient_accumulation_steps": layout.micro_batches,
        "zero_optimization": zero,
        "bf16": {"enabled": p.precision == "bf16"},
        "fp16": {"enabled": p.precision == "fp16"},
        "gradient_clipping": p.grad_clip,
        "optimizer": {"type": name, "params": params},
    }
    if name in TORCH_OPTIMIZERS and layout.zero >= 1:
        cfg["zero_allow_untested_optimizer"] = True
    if layout.tp > 1:  # AutoTP training (DeepSpeed >= 0.16.4) shards the Hugging Face model's linears
        cfg["tensor_parallel"] = {"autotp_size": layout.tp}
    if layout.model.is_moe and layout.ep > 1:
        cfg["expert_parallel"] = {"enabled": True, "autoep_size": layout.ep}
    if p.reduce_dtype is not None:  # the dtype of the gradient all-reduce / reduce-scatter
        cfg["communication_data_type"] = p.reduce_dtype
    if p.grad_dtype is not None and p.precision != "fp32":  # gradients accumulated in this dtype
        cfg["data_types"] = {"grad_accum_dtype": p.grad_dtype}
    if p.recompute == "full":
        cfg["activation_checkpointing"] = {"partition_activations": layout.tp > 1,
                                           "contiguous_memory_optimization": False, "cpu_checkpointing": False}
    return cfg


def deepspeed_config(layout) -> str:
    cfg = deepspeed_dict(layout)
    try:  # strict JSON: DeepSpeed's json.load would take Infinity, but no other reader does
        return json.dumps(cfg, indent=2, allow_nan=False) + "\n"
    except ValueError:
        raise PlanError(non_finite_key(cfg) or "to", "is not a finite number; DeepSpeed's configuration takes finite numbers only") from None


def notes(layout) -> list[str]:
    out = [f"yours to set before launching (the JSON's {USER_KEY} lists them): {'; '.join(USER_CHOICES)}"]
    if layout.tp > 1:
        out.append(f"tensor parallelism {layout.tp}: DeepSpeed's AutoTP shards the Hugging Face model given to "
                   "deepspeed.initialize (DeepSpeed >= 0.16.4)")
    if layout.model.is_moe and layout.ep > 1:
        out.append(f"expert parallelism {layout.ep}: DeepSpeed's AutoEP replaces the model's MoE blocks")
    return out
