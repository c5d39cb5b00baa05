"""One training step of a plan's model in PyTorch, measured (for `trainplan validate`, run.py):
its optimizer, its model built under the framework's byte conventions, and the step's
parameter, gradient and optimizer-state bytes, the bytes saved for backward by region, the
re-materialised layer under full recomputation and the FLOPs; on a GPU also the allocator peak
and the step time."""

from __future__ import annotations

import time

from ..errors import PlanError
from ..estimate.recipe import recipe
from ..plan import DTYPE_BYTES, Layout, Plan
from ..specs.model import ModelSpec

TORCH_OPTIMIZERS = {"adamw", "adam", "sgd", "sgd-momentum", "adafactor"}


def check_optimizer(name: str) -> None:
    if name not in TORCH_OPTIMIZERS:
        raise PlanError("optimizer", f"validate measures the optimizers PyTorch ships "
                        f"({', '.join(sorted(TORCH_OPTIMIZERS))}); {name} needs a third-party package")


def make_optimizer(name: str, params):
    import torch

    check_optimizer(name)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-4)
    if name == "adam":
        return torch.optim.Adam(params, lr=1e-4)
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-4)
    if name == "sgd-momentum":
        return torch.optim.SGD(params, lr=1e-4, momentum=0.9)
    return torch.optim.Adafactor(params, lr=1e-4)


def optimizer_state_bytes(opt) -> int:
    import torch

    from .measure import tensor_bytes

    return tensor_bytes(v for state in opt.state.values() for v in state.values() if isinstance(v, torch.Tensor))


def build_model(spec: ModelSpec, plan: Plan, device: str):
    import torch

    from .models import DecoderLM

    fused = recipe(plan).fused_kernels  # the fused norm/SwiGLU stand-ins save only their inputs
    # On the CPU no fused attention kernel takes dropout (SDPA falls back to its math kernel,
    # which keeps more than any GPU kernel): with dropout the model runs its own materialised
    # attention, which `predict` prices as eager.
    attention = "eager" if device == "cpu" and plan.dropout > 0 else plan.attention
    torch.manual_seed(0)
    model = DecoderLM(spec, attention=attention, dropout=plan.dropout, recompute=plan.recompute,
                      fused=fused, fused_loss=plan.fused_loss,
                      early_stop=recipe(plan).early_stop_checkpoint,
                      recompute_layers=plan.recompute_layers,
                      gate_in_act=recipe(plan).moe_gate_in_activation).to(device)
    if plan.finetune == "lora":
        from .models import apply_lora

        apply_lora(model, plan.lora_targets, plan.lora_rank, plan.lora_dropout)
        if plan.precision != "fp32":  # the frozen base in the 16-bit compute dtype, as PEFT loads it
            for w in model.parameters():
                if not w.requires_grad:
                    w.data = w.data.to(low_dtype(plan))
        model.to(device)
    return model


def check_state_dtype(plan: Plan) -> None:
    """validate trains with torch.optim, whose state takes its parameters' dtype: the fp32 master
    copy's, or the 16-bit weights' under pure 16-bit training."""
    if plan.optimizer_state_dtype is None:
        return
    kept = "fp32" if plan.precision == "fp32" or plan.master_weights else plan.precision
    if DTYPE_BYTES[plan.optimizer_state_dtype] != DTYPE_BYTES[kept]:
        raise PlanError("optimizer_state_dtype", f"validate steps torch.optim, whose state here is {kept} "
                        "(the dtype of the parameters it updates); drop --optimizer-state-dtype to measure")


def low_dtype(plan: Plan):
    import torch

    return torch.float16 if plan.precision == "fp16" else torch.bfloat16


def measure(layout: Layout, device: str = "cpu", impl: str = "reference", user_config: dict | None = None) -> dict:
    """Run one training step of the plan's model on one device and measure it.
    impl: "reference" (trainplan's PyTorch models) or "transformers" (Hugging Face: built from
    `user_config`, the user's config.json, when the model came from one)."""
    import torch

    from .measure import SavedTensors, counted_flops, tensor_bytes

    plan, spec = layout.plan, layout.model
    if plan.precision == "fp8":
        raise PlanError("precision", "validate runs fp32, bf16 and fp16; fp8 needs Transformer Engine")
    mixed = plan.precision != "fp32"
    fw = plan.framework if mixed else "torch"
    if impl == "transformers":
        if fw not in ("torch",):
            raise PlanError("framework", "transformers models are validated with --framework torch "
                            "(fp32 weights, torch.autocast)")
        if plan.fused_loss:
            raise PlanError("fused_loss", "transformers models compute PyTorch's cross-entropy; "
                            "validate a fused loss with the reference models (--impl reference)")
        if plan.fused_kernels:
            raise PlanError("fused_kernels", "transformers models run their own unfused norms and MLPs; "
                            "validate fused kernels with the reference models (--impl reference)")
        if plan.dropout > 0:
            raise PlanError("dropout", "transformers models are validated without dropout (their attention "
                            "kernels take no dropout on the CPU); validate dropout with --impl reference")
        from .hf_models import build_hf_model, experts_impl

        model = build_hf_model(spec, plan.attention, plan.recompute, device, recipe(plan).early_stop_checkpoint,
                               user=user_config, dropout=plan.dropout)
        if plan.finetune == "lora":  # peft's adapters (peft_lora.py); the frozen base in 16 bits
            from .peft_lora import apply_peft

            model = apply_peft(model, plan, low_dtype(plan) if mixed else None).to(device)
    else:
        model = build_model(spec, plan, device)
    pure16 = mixed and not plan.master_weights  # the model cast to 16 bits, trained as it is
    check_state_dtype(plan)
    autocast = mixed and fw == "torch" and not pure16
    if mixed and (fw in ("deepspeed", "megatron") or pure16):
        model.to(low_dtype(plan))
    params = [p for p in model.parameters() if p.requires_grad]
    masters = None
    if mixed and fw in ("deepspeed", "megatron") and not pure16:
        masters = [p.detach().float().clone().requires_grad_() for p in params]
        opt = make_optimizer(plan.optimizer, masters)
    else:
        opt = make_optimizer(plan.optimizer, params)
    if fw == "megatron" and mixed and not pure16 and recipe(plan).grad_bytes == 4:
        for p in params:  # Megatron accumulates into an fp32 main_grad buffer (bf16; fp16 keeps fp16 grads)
            p.main_grad = torch.zeros_like(p, dtype=torch.float32)

            def hook(p):
                p.main_grad.add_(p.grad)
                p.grad = None
            p.register_post_accumulate_grad_hook(hook)

    g = torch.Generator(device="cpu").manual_seed(1)
    ids = torch.randint(0, spec.vocab, (layout.mbs, layout.seq_len), generator=g).to(device)

    def call():
        if impl == "transformers":
            # a training step without the inference KV cache (a cache built in the step keeps
            # contiguous copies of a fused projection's K and V views, which nothing prices)
            return model(input_ids=ids, labels=ids, use_cache=False).loss
        return model(ids, ids)

    def forward():
        if autocast:
            with torch.autocast(device_type=device, dtype=low_dtype(plan)):
                return call()
        return call()

    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    recorder = SavedTensors(model, blocks=_blocks(model), tail=_tail(model))
    t0 = time.perf_counter()
    with recorder:
        loss = forward()
    saved = recorder.bytes_alive()
    loss.backward()
    grads = (tensor_bytes(p.main_grad for p in params) if hasattr(params[0], "main_grad")
             else tensor_bytes(p.grad for p in params))
    if masters is not None:
        for m, p in zip(masters, params, strict=True):
            src = p.main_grad if hasattr(p, "main_grad") else p.grad
            m.grad = src.float()
    opt.step()
    if masters is not None:
        with torch.no_grad():
            for m, p in zip(masters, params, strict=True):
                p.copy_(m)
                m.grad = None
    if device == "cuda":
        torch.cuda.synchronize()
    step_s = time.perf_counter() - t0
    optimizer = optimizer_state_bytes(opt) + (tensor_bytes(masters) if masters is not None else 0)
    out = {
        "params_bytes": tensor_bytes(model.parameters()),
        "grads_bytes": grads,
        "optimizer_bytes": optimizer,
        "activations_bytes": saved,
        "regions": recorder.by_region(),
    }
    if impl == "transformers" and spec.is_moe:
        out["experts_impl"] = experts_impl(model)
    if plan.recompute == "full" and impl == "reference":
        out["recompute_working_set"] = recompute_working_set(model, layout, device, autocast)
        out["activations_bytes"] += out["recompute_working_set"]
    if device == "cuda":
        out["peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
        out["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
        out["step_s"] = step_s

    def train_step():
        loss = forward()
        loss.backward()
        return loss
    model.zero_grad(set_to_none=True)
    out["flops"], _ = counted_flops(train_step)
    return out


def _blocks(model):
    """The transformer blocks of a reference or transformers model (for region labels)."""
    if hasattr(model, "blocks"):
        return model.blocks
    inner = getattr(model, "model", None) or getattr(model, "transformer", None) or getattr(model, "gpt_neox", None)
    return getattr(inner, "layers", None) or getattr(inner, "h", None)


def _tail(model):
    if hasattr(model, "norm") and hasattr(model, "blocks"):
        return model.norm
    inner = getattr(model, "model", None) or getattr(model, "transformer", None) or getattr(model, "gpt_neox", None)
    return getattr(inner, "norm", None) or getattr(inner, "ln_f", None) or getattr(inner, "final_layer_norm", None)


def recompute_working_set(model, layout: Layout, device: str, autocast: bool) -> int:
    """Bytes one layer saves when it is re-run in backward (its activations besides its
    input, which the checkpoint already holds): the largest layer's forward, measured."""
    import torch

    from .measure import saved_tensor_bytes
    from .models import rope_dim, rope_tables

    spec, plan = layout.model, layout.plan
    b, s, h = layout.mbs, layout.seq_len, spec.hidden
    dtype = next(model.parameters()).dtype
    x = torch.randn(b, s, h, device=device, dtype=dtype, requires_grad=True)
    cos = sin = causal = None
    if spec.position == "rotary":
        cos, sin = rope_tables(s, rope_dim(spec), device, dtype)
    if model.attention == "eager":  # the attention the model runs (build_model)
        causal = torch.ones(s, s, dtype=torch.bool, device=device).triu(1)
    best = 0
    for blk in model.blocks[:model.checkpointed]:  # the checkpointed layers
        def run(blk=blk):
            if autocast:
                with torch.autocast(device_type=device, dtype=low_dtype(plan)):
                    return blk(x, cos, sin, causal)
            return blk(x, cos, sin, causal)
        extra = [x] + [t for t in (cos, sin, causal) if t is not None]
        n, _ = saved_tensor_bytes(run, list(model.parameters()) + extra)
        best = max(best, n)
    return best


