"""Ready-to-run configurations for training frameworks, from a resolved plan."""

from __future__ import annotations

from ..errors import PlanError

TARGETS = ("megatron", "deepspeed", "torchtitan")


def export(layout, target: str) -> str:
    if layout.plan.finetune != "full" and target in ("megatron", "torchtitan"):
        # LoRA lives in the model code (Hugging Face PEFT under DeepSpeed), not in these configs
        raise PlanError("finetune", f"{target}'s configuration has no LoRA adapters; export a "
                        f"{layout.plan.finetune} plan to deepspeed (with PEFT applying the adapters)")
    if target == "megatron":
        from .megatron import megatron_args

        return megatron_args(layout)
    if target == "deepspeed":
        from .deepspeed import deepspeed_config

        return deepspeed_config(layout)
    if target == "torchtitan":
        from .torchtitan import torchtitan_toml

        return torchtitan_toml(layout)
    raise PlanError("to", f"must be one of {', '.join(TARGETS)} (got {target!r})")
