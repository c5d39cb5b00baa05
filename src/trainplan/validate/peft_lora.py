"""LoRA through Hugging Face `peft` on a `transformers` model (`validate --impl transformers
--finetune lora`): the adapters are peft's own (`LoraConfig` + `get_peft_model`), with the
plan's rank, target projections and dropout, so what is measured is what peft's
`lora.Linear.forward` keeps (peft 0.13+ layer.py: result = base_layer(x), then
lora_B(lora_A(dropout(x))) * scaling added per active adapter). Optional extra `hf`."""

from __future__ import annotations

from ..errors import PlanError

# the plan's LoRA target names -> the projection names of transformers' Llama-style decoders
HF_TARGETS = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj", "gate": "gate_proj",
              "up": "up_proj", "down": "down_proj"}


def _peft():
    try:
        import peft
    except ImportError:
        raise PlanError("finetune", "LoRA on a transformers model is measured with peft: "
                        "pip install 'trainplan[hf]'") from None
    return peft


def check(plan, spec) -> None:
    """What validate runs through peft: one process, a Llama-style decoder (separate q, k, v
    projections, dense MLP), no recompute (before any model is built)."""
    if spec.fused_qkv or spec.is_mla or spec.is_moe:
        raise PlanError("finetune", "validate applies peft's LoRA to dense transformers models with separate "
                        "q, k and v projections (llama, mistral, qwen2); this model is measured with "
                        "--impl reference")
    if plan.recompute != "none":
        raise PlanError("recompute", "peft's LoRA on a transformers model is validated without recompute; "
                        "validate LoRA with recompute with --impl reference")
    unknown = [t for t in plan.lora_targets if t not in HF_TARGETS]
    if unknown:
        raise PlanError("lora_targets", f"peft targets the projections {', '.join(HF_TARGETS)}; not {unknown}")
    _peft()


def apply_peft(model, plan, low_dtype=None):
    """peft's LoRA on `model` with the plan's rank, targets and dropout (lora_alpha = 2 r, which
    only sets the scaling); the frozen base cast to `low_dtype` (the 16-bit compute dtype, as a
    base is loaded for LoRA), the adapters kept in fp32 by peft's autocast_adapter_dtype."""
    peft = _peft()
    if low_dtype is not None:
        model.to(low_dtype)
    config = peft.LoraConfig(r=plan.lora_rank, lora_alpha=2 * plan.lora_rank, lora_dropout=plan.lora_dropout,
                             target_modules=[HF_TARGETS[t] for t in plan.lora_targets], bias="none",
                             task_type="CAUSAL_LM")
    model = peft.get_peft_model(model, config)
    model.train()
    return model


def adapter_dtypes(model) -> list[str]:
    """The dtypes of the trainable parameters (the adapters)."""
    return sorted({str(p.dtype).removeprefix("torch.") for p in model.parameters() if p.requires_grad})
