"""`trainplan validate`: run a plan's model for real in PyTorch and compare every memory
term and the FLOPs with the prediction.

The model is built from the plan's spec, scaled down when it is too large for the machine
(fewer layers, narrower, smaller vocabulary, shorter sequences; same structure: GQA ratio,
MLP kind, norms, positions, experts and top-k). Each framework's byte convention is
emulated with plain PyTorch:

* torch: fp32 parameters and gradients, `torch.autocast` for 16-bit compute;
* deepspeed: 16-bit parameters and gradients, fp32 master copies owned by the optimizer;
* megatron: 16-bit parameters, fp32 `main_grad` buffers, fp32 master copies, and the fused
  RMSNorm / SwiGLU / unpermute kernels (autograd Functions keeping what those kernels keep);
* fsdp: FSDP2 `fully_shard` (see `distributed.py`).

Measured: parameter, gradient and optimizer-state bytes after one optimizer step (the
optimizer's real state), bytes saved for backward (distinct storages alive at the end of
the forward, parameters excluded, by region), the re-materialised layer under full
recompute, and FLOPs with `FlopCounterMode`; on a GPU also the allocator peak and step time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..errors import PlanError
from ..estimate import activations as act
from ..estimate.flops import step_flops
from ..estimate.memory import layout_inputs, numbers_for, stage_memory
from ..estimate.recipe import recipe
from ..estimate.stage import lora_arguments, recomputed_share
from ..plan import Layout, Plan, resolve
from ..specs.model import ModelSpec
from .hf_models import sdpa_runs_math
from .step import check_optimizer, measure

TERMS = ("params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "flops")

# A model runs at its given size when it is at most this large (parameters, tokens per
# micro-batch); otherwise it is scaled down to the defaults below.
RUN_AS_IS_PARAMS = 60_000_000
RUN_AS_IS_TOKENS = 4096


@dataclass
class Scale:
    layers: int | None = None
    hidden: int | None = None
    vocab: int | None = None
    seq_len: int | None = None
    mbs: int | None = None
    experts: int | None = None


DEFAULT_SCALE = Scale(layers=2, hidden=256, vocab=512, seq_len=256, mbs=2, experts=8)
HEAD_DIM = 32  # head width of a scaled-down model


def _round_to(x: float, multiple: int) -> int:
    return max(multiple, int(round(x / multiple)) * multiple)


def scale_model(spec: ModelSpec, scale: Scale, tp: int = 1) -> ModelSpec:
    """The same architecture at a smaller size: the GQA ratio, MLP kind, norms, positions,
    biases, expert count (capped) and top-k are kept; widths shrink in proportion."""
    hidden = scale.hidden or spec.hidden
    ratio = hidden / spec.hidden
    group = spec.heads // spec.n_kv_heads
    heads = max(tp, hidden // HEAD_DIM) if scale.hidden else spec.heads
    kv = max(1, heads // group) if scale.hidden else spec.n_kv_heads
    if heads % kv:
        kv = 1
    # the tensor-parallel run splits the KV heads too (it does not replicate them): a multiple
    # of tp that divides the heads
    while (kv % tp or heads % kv) and kv < heads:
        kv += 1
    head_dim = hidden // heads if scale.hidden else spec.head_dim
    layers = scale.layers or spec.layers
    first_dense = min(spec.first_dense_layers, max(0, layers - 1))
    fields = dict(spec.model_dump())
    unit = 8 * tp
    fields.update(
        name=f"{spec.name} (scaled)", layers=layers, hidden=hidden, heads=heads, kv_heads=kv,
        head_dim=head_dim if not scale.hidden else None,
        ffn=_round_to(spec.ffn * ratio, unit) if scale.hidden else spec.ffn,
        vocab=scale.vocab or spec.vocab, first_dense_layers=first_dense,
        max_position=max(spec.max_position if not scale.seq_len else 0, scale.seq_len or 0, 1),
        published_params=None, published_active_params=None,
    )
    fields.update(spec.layer_pattern(layers))  # sliding and dense-MLP layers in proportion
    if spec.is_mla and scale.hidden:
        from .mla import scaled_mla_fields

        fields.update(kv_heads=heads, **scaled_mla_fields(spec, hidden, heads, HEAD_DIM))
    if spec.is_moe:
        experts = min(spec.experts, scale.experts or spec.experts)
        fields.update(experts=experts, top_k=min(spec.top_k, experts),
                      expert_ffn=_round_to((spec.expert_ffn or spec.ffn) * ratio, unit) if scale.hidden
                      else spec.expert_ffn)
        if spec.shared_expert_ffn:
            fields["shared_expert_ffn"] = (_round_to(spec.shared_expert_ffn * ratio, unit)
                                           if scale.hidden else spec.shared_expert_ffn)
    return ModelSpec(**fields)


def needs_scaling(spec: ModelSpec, plan: Plan, seq_len: int) -> bool:
    return spec.params > RUN_AS_IS_PARAMS or plan.mbs * seq_len > RUN_AS_IS_TOKENS


@dataclass
class Case:
    name: str
    predicted: dict
    measured: dict
    rel_error: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    extra: dict = field(default_factory=dict)

    def finish(self) -> Case:
        for k in TERMS:
            p, m = self.predicted.get(k), self.measured.get(k)
            if p is None or m is None:
                continue
            self.rel_error[k] = 0.0 if p == m else (p / m - 1 if m else math.inf)
        return self

    def to_json(self) -> dict:
        return {"name": self.name, "predicted": self.predicted, "measured": self.measured,
                "rel_error": self.rel_error, "notes": self.notes, **self.extra}


# ---- prediction ---------------------------------------------------------------------
def predict(layout: Layout, device: str = "cpu", r=None, sdpa_math: bool = False) -> dict:
    """The plan's per-stage prediction for stage 0 (whole model when pp = 1), with the
    device's kernel semantics: on the CPU dropout masks have the input's dtype and, with
    dropout, attention runs materialised (`build_model`). r: the plan's recipe unless given;
    sdpa_math: SDPA runs its math kernel (`hf_models.sdpa_runs_math`)."""
    plan = layout.plan
    inputs = layout_inputs(layout)
    r = r or recipe(plan)
    if device == "cpu" and (plan.dropout > 0 or plan.lora_dropout > 0):
        inputs["mask_bytes"] = r.act_bytes
        if plan.dropout == 0 and r.lora_input_copies:
            # peft drops out its fp32 cast of each adapter's input under autocast: an fp32 mask
            inputs["mask_bytes"] = 4.0
    if device == "cpu":  # PyTorch's CPU attention kernels return their query's memory order
        inputs["heads_major_copy"] = 1.0
    kernel = "eager" if sdpa_math else layout.model.attention_kernel(plan.attention)
    inputs["attention"] = act.ATTENTION_CODE[kernel]
    if device == "cpu" and plan.dropout > 0:
        if plan.attention != "eager":
            inputs["attention"] = act.ATTENTION_CODE["eager"]
    mem = stage_memory(numbers_for(layout), r, **inputs)
    first = lambda a: float(np.broadcast_to(np.asarray(a, dtype=float), (layout.pp,))[0])  # noqa: E731
    eager = kernel == "eager" or (device == "cpu" and plan.dropout > 0)
    fl = step_flops(layout.model, tokens=layout.mbs * layout.seq_len / layout.cp, seq=layout.seq_len,
                    dense_layers=layout.stage_dense_layers[0], moe_layers=layout.stage_moe_layers[0],
                    head=float(layout.pp == 1), attention_eager=eager,
                    recompute=act.RECOMPUTE_CODE[plan.recompute], vocab_padded=layout.vocab_padded,
                    skip_last=r.recompute_skips_last_linear,
                    recompute_share=float(recomputed_share(act.RECOMPUTE_CODE[plan.recompute], layout.recompute_layers_per_stage,
                                                           first(layout.stage_dense_layers)
                                                           + first(layout.stage_moe_layers))),
                    **lora_arguments(plan))
    return {
        "params_bytes": first(mem["params"]),
        "grads_bytes": first(mem["grads"]),
        "optimizer_bytes": first(mem["optimizer"]),
        "activations_bytes": first(mem["activations"]),
        "flops": float(fl["hardware"]) / layout.tp,
        "parts": {k: first(v) for k, v in mem["activation_parts"].items()},
    }


# ---- the command ------------------------------------------------------------------------
def resolve_device(device: str) -> str:
    if device != "auto":
        if device == "cuda":
            import torch

            if not torch.cuda.is_available():
                raise PlanError("device", "no CUDA device is available here; use --device cpu")
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def validate(plan: Plan, scale: Scale | None = None, device: str = "auto", progress=None,
             impl: str = "reference") -> dict:
    """Predicted vs measured for a plan. Layouts with tp, zero or dp > 1 run as real
    distributed jobs (gloo on CPU, NCCL on GPUs) in local processes."""
    try:
        import torch  # noqa: F401
    except ImportError:
        raise PlanError("validate", "needs PyTorch: pip install 'trainplan[torch]'") from None
    if impl == "transformers":
        try:
            import transformers  # noqa: F401
        except ImportError:
            raise PlanError("impl", "--impl transformers needs the transformers package: "
                            "pip install 'trainplan[hf]'") from None
    if plan.finetune == "qlora":
        raise PlanError("finetune", "validate measures full training and LoRA; QLoRA's quantized base needs "
                        "bitsandbytes, which is not measured here")
    if plan.finetune == "lora" and (plan.tp > 1 or (plan.gpus or 1) > 1 or plan.zero):
        raise PlanError("finetune", "validate measures LoRA on one process (tp = dp = 1, no ZeRO)")
    check_optimizer(plan.optimizer)  # before any process is started
    if plan.pp > 1:
        if impl == "transformers":
            raise PlanError("impl", "pipelines are validated with the reference models (--impl reference)")
        return _validate_pipeline(plan, scale or Scale(), device, progress)
    if plan.ep > 1:
        from .expert_parallel import validate_expert_parallel

        return validate_expert_parallel(plan, scale, device, progress)
    device = resolve_device(device)
    full = resolve(plan)
    spec = full.model
    if plan.finetune == "lora" and impl == "transformers":
        from .peft_lora import check

        check(plan, spec)
    if plan.finetune == "lora" and spec.is_mla:
        raise PlanError("finetune", "validate measures multi-head latent attention with full training; "
                        "LoRA on its latent projections is predicted only")
    if plan.finetune == "lora" and spec.fused_qkv and impl != "transformers":
        raise PlanError("finetune", "validate's LoRA adapters attach to separate q, k and v projections; "
                        "this model fuses them")
    scale = scale or Scale()
    auto = needs_scaling(spec, plan, full.seq_len)
    eff = Scale(
        layers=scale.layers or (DEFAULT_SCALE.layers if auto else None),
        hidden=scale.hidden or (DEFAULT_SCALE.hidden if auto else None),
        vocab=scale.vocab or (DEFAULT_SCALE.vocab if auto else None),
        seq_len=scale.seq_len or (min(full.seq_len, DEFAULT_SCALE.seq_len) if auto else None),
        mbs=scale.mbs or (min(plan.mbs, DEFAULT_SCALE.mbs) if auto else None),
        experts=scale.experts or (DEFAULT_SCALE.experts if auto else None),
    )
    small = scale_model(spec, eff, plan.tp) if any(
        v is not None for v in (eff.layers, eff.hidden, eff.vocab, eff.experts)) else spec
    world = plan.tp * (plan.dp or max(1, (plan.gpus or 1) // plan.tp))
    recompute_layers = plan.recompute_layers
    if recompute_layers is not None:
        if impl == "transformers" and recompute_layers < spec.layers:
            raise PlanError("recompute_layers", "transformers models checkpoint every layer; validate "
                            "recomputing some of them with the reference models (--impl reference)")
        # the same share of the scaled model's layers, at least one when any
        recompute_layers = min(small.layers, max(round(recompute_layers * small.layers / spec.layers),
                                                 int(recompute_layers > 0)))
    small_plan = plan.model_copy(update={
        # the scaled model travels as a spec; the name only labels it (a plan's model is never empty)
        "model": small.name, "hf_config": None, "seq_len": eff.seq_len or full.seq_len, "mbs": eff.mbs or plan.mbs,
        "gbs": None, "gpus": world, "dp": None, "stage_layers": None, "recompute_layers": recompute_layers,
    })
    layout = resolve(small_plan, small)
    some = f" (first {recompute_layers} of {small.layers} layers)" if recompute_layers is not None else ""
    name = (f"{spec.name}{' scaled to ' + _describe(small) if small is not spec else ''}, "
            f"{plan.precision}/{plan.framework}, attention {plan.attention}, recompute {plan.recompute}{some}, "
            f"tp {layout.tp} zero {layout.zero} dp {layout.dp}"
            + (f" (shards of {layout.dp_shard})" if layout.dp_shard < layout.dp else "")
            + f", b={layout.mbs} s={layout.seq_len}, {device}")
    if progress:
        progress(f"running {name}")
    if plan.framework == "fsdp1":
        raise PlanError("framework", "validate runs FSDP2 (fully_shard); FSDP1 holds the same bytes per "
                        "parameter: validate with --framework fsdp")
    if impl == "transformers" and (world > 1 or plan.framework == "fsdp"):
        raise PlanError("impl", "transformers models are validated on one process (tp = dp = 1)")
    if layout.cp > 1:
        from .context_parallel import run_context_parallel

        cases = run_context_parallel(layout, small, name + f", cp {layout.cp} (torch's ring attention)")
    elif layout.zero == 2 and world > 1 and plan.framework in ("deepspeed", "megatron"):
        from .zero2 import run_zero2

        cases = run_zero2(layout, small, name)
    elif world > 1 or plan.framework == "fsdp" and plan.precision != "fp32":
        from .distributed import run_distributed

        cases = run_distributed(layout, small, device, name)
    else:
        user = user_config(plan) if impl == "transformers" else None
        measured = measure(layout, device, impl, user)
        if measured.get("experts_impl") and measured["experts_impl"] != layout.model.experts_impl:
            # priced as the experts implementation the library ran (its default unless stated)
            layout = resolve(small_plan, small.model_copy(update={"experts_impl": measured["experts_impl"]}))
        predicted = predict(layout, device, sdpa_math=impl == "transformers" and sdpa_runs_math(layout.model, device,
                                                                                             plan.attention))
        unmeasured = 0.0
        if impl == "transformers" and plan.recompute == "full":
            # transformers re-runs its layers inside its own checkpoint: the re-materialised
            # layer is not measured there, so it is left out of both sides
            unmeasured = float(predicted["parts"].get("recompute_working_set", 0.0))
            predicted = {**predicted, "activations_bytes": predicted["activations_bytes"] - unmeasured}
        case = Case(name, {k: predicted[k] for k in TERMS}, {k: measured[k] for k in TERMS},
                    extra={"activation_regions": {"measured": measured["regions"],
                                                  "predicted": predicted["parts"]}})
        for k in ("peak_allocated_bytes", "peak_reserved_bytes", "step_s", "recompute_working_set"):
            if k in measured:
                case.extra[k] = measured[k]
        if impl == "transformers":
            case.name += " (transformers" + (", experts " + measured["experts_impl"] if measured.get("experts_impl")
                                             else "") + ")"
            if user is not None:
                case.notes.append(_config_note(user, plan.dropout))
            if plan.recompute == "full":
                case.notes.append(f"transformers' checkpointing: the re-materialised layer ({unmeasured / 2**20:.2f} MiB "
                                  "predicted) is not measured; both sides leave it out")
        cases = [case.finish()]
    worst = max((abs(e) for c in cases for e in c.rel_error.values()), default=0.0)
    return {"device": device, "cases": [c.to_json() for c in cases], "max_abs_rel_error": worst}


def user_config(plan: Plan) -> dict | None:
    """The config.json the plan's model came from (the web's `hf_config` or a .json file),
    built as written by `--impl transformers`; None for a catalog or TOML model."""
    if plan.hf_config is not None:
        return plan.hf_config
    if not plan.model.endswith(".json"):
        return None
    import json
    from pathlib import Path

    return json.loads(Path(plan.model).read_text(encoding="utf-8"))  # parsed once already by resolve


def _config_note(config: dict, dropout: float) -> str:
    from .hf_models import dropout_settings

    note = "built from the given config.json as written (sizes scaled)"
    replaced = dropout_settings(config)
    if replaced:
        note += (f"; its dropout ({', '.join(f'{k} {v}' for k, v in replaced.items())}) set to the plan's "
                 f"{dropout} (--dropout)")
    return note


# a pipeline runs one process per stage on the CPU: smaller defaults, two layers per stage
PIPELINE_SCALE = Scale(hidden=64, vocab=512, seq_len=64, mbs=1, experts=4)
PIPELINE_LAYERS_PER_STAGE = 2


def _validate_pipeline(plan: Plan, scale: Scale, device: str, progress=None) -> dict:
    """pp > 1: the scaled-down model split over pp local processes, stepped by the
    torch.distributed.pipelining schedule of the plan's name (`pipelining.py`)."""
    from .pipelining import check, run_pipeline

    if resolve_device(device) != "cpu":
        raise PlanError("device", "pipelines are validated on the CPU (gloo) here")
    full = resolve(plan)
    spec = full.model
    check(full, plan.schedule)  # before any process starts
    d = PIPELINE_SCALE
    layers = scale.layers or PIPELINE_LAYERS_PER_STAGE * full.pp * full.vpp
    eff = Scale(layers=layers, hidden=scale.hidden or d.hidden, vocab=scale.vocab or d.vocab,
                seq_len=scale.seq_len or min(full.seq_len, d.seq_len), mbs=scale.mbs or min(plan.mbs, d.mbs),
                experts=scale.experts or d.experts)
    small = scale_model(spec, eff)
    small_plan = plan.model_copy(update={
        "model": small.name, "hf_config": None, "seq_len": eff.seq_len, "mbs": eff.mbs,
        "gbs": full.micro_batches * eff.mbs, "gpus": full.pp, "dp": None, "stage_layers": None})
    layout = resolve(small_plan, small)
    check(layout, plan.schedule)
    name = (f"{spec.name} scaled to {_describe(small)}, {plan.precision}/{plan.framework}, pp {layout.pp} "
            f"{plan.schedule}" + (f" v={layout.vpp}" if layout.vpp > 1 else "")
            + f", m={layout.micro_batches}, b={layout.mbs} s={layout.seq_len}, cpu")
    if progress:
        progress(f"running {name}")
    cases = run_pipeline(layout, small, name)
    worst = max((abs(e) for c in cases for e in c.rel_error.values()), default=0.0)
    return {"device": "cpu", "cases": [c.to_json() for c in cases], "max_abs_rel_error": worst}


def _describe(spec: ModelSpec) -> str:
    moe = f", {spec.experts} experts top-{spec.top_k}" if spec.is_moe else ""
    return (f"{spec.layers} layers x hidden {spec.hidden} ({spec.heads} heads / {spec.n_kv_heads} kv), "
            f"ffn {spec.ffn}, vocab {spec.vocab}{moe}")
