"""`resolve()` checks a plan against its model and accelerator, derives what was left out (dp,
the global batch, the per-stage layer split) and returns a `Layout` of plain numbers the
estimators use; one named check per concern, each raising `PlanError(field, rule)`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..errors import PlanError
from ..specs import catalog
from ..specs.conventions import conventions, shares_efficiency_defaults
from ..specs.hardware import GPUSpec
from ..specs.model import ModelSpec
from .lookup import load_model
from .options import (
    DTYPE_BYTES,
    Plan,
    adapter_defaults,
    default_zero,
    least_zero,
    qlora_bits_default,
    te_prefers_cudnn,
    zero_stages,
)
from .stages import schedule_batch_rules, stage_split


@dataclass
class Layout:
    """A validated plan as plain numbers. Per-stage lists have one entry per PP stage."""

    plan: Plan
    model: ModelSpec
    gpu: GPUSpec
    gpus: int
    tp: int
    pp: int
    dp: int
    cp: int
    ep: int
    zero: int
    dp_shard: int  # data-parallel ranks ZeRO shards over (dp unless hybrid sharding)
    sp: bool
    mbs: int
    gbs: int
    seq_len: int
    micro_batches: int  # per pipeline per step (gradient-accumulation steps when pp = 1)
    vpp: int
    stage_layers: list[int]
    stage_dense_layers: list[int]
    stage_moe_layers: list[int]
    vocab_padded: int
    warnings: list[str] = field(default_factory=list)
    # the same warnings as {"code", "params", "message"}, for pages that word them in other languages
    warning_details: list[dict] = field(default_factory=list)

    @property
    def grad_accum(self) -> int:
        return self.micro_batches

    @property
    def recompute_layers_per_stage(self) -> int | None:
        """Layers a stage recomputes under `--recompute-layers N`: the first N of each of its
        virtual stages (Megatron's block method counts per model chunk); None for all."""
        n = self.plan.recompute_layers
        return None if n is None else n * self.vpp


def cluster_links(gpu: GPUSpec, plan: Plan, gpus: int) -> GPUSpec:
    """The accelerator with the plan's own links (`scale_up_gbs`, `nic_gbps`) in place of its
    catalog entry's, checked to connect all `gpus`: a node of several needs the link between
    them, more than one node the network between nodes. An accelerator the catalog lists
    without one (a PCIe card sold without a network, a TPU whose chips talk over ICI) cannot be
    timed across it until the plan gives it."""
    links = {k: getattr(plan, k) for k in ("scale_up_gbs", "nic_gbps") if getattr(plan, k) is not None}
    gpu = gpu.model_copy(update=links) if links else gpu
    gpn = plan.gpus_per_node
    if min(gpus, gpn) > 1 and not gpu.scale_up_gbs:
        raise PlanError("scale_up_gbs", f"{gpu.name}'s catalog entry gives no link between the accelerators of a "
                        f"node, which {min(gpus, gpn)} per node need: give it (--scale-up-gbs, per GPU, "
                        "bidirectional GB/s)")
    if gpus > gpn and not gpu.nic_gbps:
        raise PlanError("nic_gbps", f"{gpus} GPUs span {math.ceil(gpus / gpn)} nodes of {gpn} and {gpu.name}'s "
                        "catalog entry gives no network between nodes: give it (--nic-gbps, per GPU, Gb/s), or, "
                        f"when all {gpus} share one scale-up domain such as a TPU slice's ICI, "
                        f"--gpus-per-node {gpus}")
    return gpu


class _Warnings:
    """The warnings a plan collects while it is resolved: messages, and each with its code and
    parameters (for translation)."""

    def __init__(self) -> None:
        self.messages: list[str] = []
        self.details: list[dict] = []

    def __call__(self, code: str, message: str, **params) -> None:
        self.messages.append(message)
        self.details.append({"code": code, "params": params, "message": message})


def _world_size(plan: Plan, tp: int, pp: int, cp: int) -> tuple[int, int]:
    """(GPUs, data-parallel size): the plan's, checked against tp x pp x cp."""
    # -- world size and data parallelism
    model_parallel = tp * pp * cp
    if plan.dp is not None:
        dp = plan.dp
        gpus = plan.gpus or dp * model_parallel
        if gpus != dp * model_parallel:
            raise PlanError("dp", f"gpus ({gpus}) must equal tp x pp x cp x dp = "
                            f"{tp} x {pp} x {cp} x {dp} = {dp * model_parallel}")
    else:
        gpus = plan.gpus or model_parallel
        if gpus % model_parallel:
            raise PlanError("gpus", f"must be a multiple of tp x pp x cp = {model_parallel} (got {gpus})")
        dp = gpus // model_parallel
    return gpus, dp


def _accelerator(plan: Plan, gpu: GPUSpec, gpus: int) -> GPUSpec:
    """The accelerator with the cluster's links, checked against a measured profile."""
    gpu = cluster_links(gpu, plan, gpus)
    if plan.gpu_profile:
        from ..profile import profile_accelerator

        measured = profile_accelerator(plan.gpu_profile)
        if measured is not None and not shares_efficiency_defaults(measured, gpu.name):
            raise PlanError("gpu_profile", f"was measured on {measured}, whose efficiencies the plan's {gpu.name} "
                            "does not share (the same chip does: H100, H200 and H800)")

    return gpu


def _tensor_parallel(plan: Plan, model: ModelSpec, tp: int, warn: _Warnings) -> bool | None:
    """Check TP against the model's heads and widths; whether sequence parallelism applies."""
    # -- tensor parallelism
    if model.heads % tp:
        raise PlanError("tp", f"must divide the number of attention heads ({model.heads}); got {tp}")
    kv = model.n_kv_heads
    if not model.is_mla and kv % tp and tp % kv:
        raise PlanError("tp", f"must divide the KV heads ({kv}) or be a multiple of them; got {tp}")
    ffns = [model.ffn] + ([model.expert_ffn] if model.expert_ffn else [])
    for f in ffns:
        if f % tp:
            raise PlanError("tp", f"must divide the MLP width ({f}); got {tp}")
    if tp > plan.gpus_per_node:
        warn("tp_across_nodes", f"TP {tp} > {plan.gpus_per_node} GPUs per node: tensor-parallel all-reduces "
             "cross the node boundary (NIC instead of NVLink)", tp=tp, gpn=plan.gpus_per_node)
    sp = plan.sp
    if sp and tp == 1:
        warn("sp_needs_tp", "sequence parallelism needs tp > 1; ignored")
        sp = False

    return sp


def _context_and_experts(plan: Plan, model: ModelSpec, cp: int, ep: int, dp: int) -> int:
    """Check CP and EP against the sequence, the experts and the ranks; the sequence length."""
    # -- context and expert parallelism
    seq_len = plan.seq_len or min(model.max_position, 4096)
    if cp > 1:
        if seq_len % (2 * cp):
            raise PlanError("cp", f"seq_len ({seq_len}) must be divisible by 2 x cp = {2 * cp} "
                            "(load-balanced causal context parallelism)")
        if plan.attention == "eager":
            raise PlanError("cp", "context parallelism needs --attention flash or sdpa")
    for name in ("ep_node_limit", "ep_overlap"):
        if getattr(plan, name) and not model.is_moe:
            raise PlanError(name, f"applies to mixture-of-experts models; {model.name} is dense")
    if plan.ep_node_limit is not None and plan.ep_node_limit > model.top_k:
        raise PlanError("ep_node_limit", f"must be at most the experts a token is routed to (top_k {model.top_k}): "
                        f"a token reaches no more nodes than experts; got {plan.ep_node_limit}")
    if ep > 1:
        if not model.is_moe:
            raise PlanError("ep", f"expert parallelism needs a mixture-of-experts model; {model.name} is dense")
        if model.experts % ep:
            raise PlanError("ep", f"must divide the number of experts ({model.experts}); got {ep}")
        if (dp * cp) % ep:
            raise PlanError("ep", f"must divide dp x cp = {dp * cp} (experts are spread over "
                            f"data-parallel ranks); got {ep}")

    return seq_len


def _hybrid_sharding(plan: Plan, dp: int, cp: int, ep: int, zero: int, warn: _Warnings) -> int:
    """The ranks ZeRO shards over, checked."""
    # -- hybrid sharding: ZeRO over groups of dp_shard ranks (x cp), replicated across them
    dp_shard = plan.dp_shard or dp
    if dp % dp_shard:
        raise PlanError("dp_shard", f"must divide dp ({dp}); got {dp_shard}")
    if dp_shard < dp:
        if zero == 0:
            warn("dp_shard_unused", "--dp-shard groups ZeRO's shards; with --zero 0 every rank holds everything",
                 dp_shard=dp_shard)
        if plan.framework.startswith("deepspeed") and zero in (1, 2):
            raise PlanError("dp_shard", "DeepSpeed shards over part of the data-parallel ranks only at ZeRO-3 "
                            "(MiCS, mics_shard_size); use --zero 3, or shard over all ranks")
        if ep > 1 and (dp_shard * cp) % ep:
            raise PlanError("dp_shard", f"dp_shard x cp ({dp_shard} x {cp}) must be a multiple of ep ({ep}): "
                            "expert parameters shard over dp_shard x cp / ep ranks")

    return dp_shard


def _batch(plan: Plan, dp: int, pp: int, warn: _Warnings) -> tuple[int, int]:
    """(global batch, micro-batches per step), checked against the ranks and the schedule."""
    # -- batch
    if plan.gbs is not None:
        gbs = plan.gbs
        if gbs % (dp * plan.mbs):
            raise PlanError("gbs", f"must be divisible by dp x mbs = {dp} x {plan.mbs} = {dp * plan.mbs}; got {gbs}")
    else:
        # Default: one micro-batch per data-parallel rank without PP; 4 x pp with PP so the
        # 1F1B bubble (p-1)/(m+p-1) stays under 20%.
        gbs = dp * plan.mbs * (1 if pp == 1 else 4 * pp)
    micro_batches = gbs // (dp * plan.mbs)
    if plan.ep_overlap and micro_batches < 2:
        raise PlanError("ep_overlap", f"hides a micro-batch's all-to-alls behind another's compute: needs at least 2 "
                        f"micro-batches per step; got {micro_batches}")
    schedule_batch_rules(plan, pp, micro_batches)
    if pp > 1 and micro_batches < pp:
        warn("few_micro_batches", f"only {micro_batches} micro-batches for {pp} pipeline stages: "
             "most stages sit idle; raise --gbs", m=micro_batches, pp=pp)

    return gbs, micro_batches


def _recompute(plan: Plan, model: ModelSpec, vpp: int, split: list[int], warn: _Warnings) -> None:
    """Check the recomputation options against the model and the stages."""
    # -- recompute
    if plan.recompute_layers is not None:
        if plan.recompute != "full":
            raise PlanError("recompute_layers", "applies to --recompute full only")
        if plan.recompute_layers * vpp > max(split):
            where = (f"on a stage ({max(split)})" if vpp == 1 else
                     f"of a virtual stage ({max(split) // vpp}, with {vpp} virtual stages per stage)")
            raise PlanError("recompute_layers", f"cannot exceed the layers {where}")

    if plan.recompute == "selective-op":
        # activations.op_sac_saved walks a dense layer's matmuls with a fused attention kernel
        if model.is_moe or model.is_mla:
            raise PlanError("recompute", f"selective-op (torchtitan's per-op checkpointing) is modelled for dense "
                            f"layers with standard attention; {model.name} has "
                            f"{'experts' if model.is_moe else 'multi-head latent attention'}: use selective or full")
        if plan.attention == "eager":
            raise PlanError("recompute", "selective-op saves the fused attention kernel's output (SDPA); "
                            "use --attention flash, sdpa or cudnn")
        if plan.finetune != "full":
            raise PlanError("recompute", "selective-op is modelled for full training; use selective or full "
                            f"with --finetune {plan.finetune}")
    if plan.recompute_modules is not None:
        if plan.recompute != "selective":
            raise PlanError("recompute_modules", "applies to --recompute selective only (Megatron-Core's "
                            "--recompute-granularity selective)")
        if "mla_up_proj" in plan.recompute_modules and not model.is_mla:
            raise PlanError("recompute_modules", f"mla_up_proj recomputes multi-head latent attention's "
                            f"up-projections; {model.name} has none")
        if "moe_act" in plan.recompute_modules and not model.is_moe:
            raise PlanError("recompute_modules", f"moe_act recomputes the experts' activation; {model.name} has "
                            "no experts")
    if plan.fp8_params and (plan.precision != "fp8" or not plan.master_weights):
        raise PlanError("fp8_params", "keeps the compute weights in FP8 beside fp32 master weights: needs "
                        f"--precision fp8 with master weights (got {plan.precision}"
                        f"{'' if plan.master_weights else ', --no-master-weights'})")
    if plan.fp8_cache is not None and plan.precision != "fp8":
        raise PlanError("fp8_cache", f"applies to --precision fp8 only (got {plan.precision})")
    if plan.fp8_cache is not None and "moe_act_input" in plan.fp8_cache and not model.is_moe:
        raise PlanError("fp8_cache", f"moe_act_input is the experts' SwiGLU input; {model.name} has no experts")
    if plan.recompute_early_stop and plan.recompute != "full":
        warn("early_stop_unused", "--recompute-early-stop changes only full recomputation; recompute is "
             f"{plan.recompute}", recompute=plan.recompute)
    if plan.recompute_early_stop and plan.dropout > 0 and plan.recompute == "full":
        warn("early_stop_dropout", "with dropout the recomputation cannot stop early (a dropout mask is saved "
             "after each block's last linear); the whole block is re-run")


def _precision_and_optimizer(plan: Plan, gpu: GPUSpec, zero: int, warn: _Warnings) -> None:
    """Check precision, optimizer, ZeRO stage, offloading and fine-tuning."""
    # -- precision, optimizer, offload, fine-tuning
    conv = conventions()
    if plan.precision != "fp32" and gpu.peak(plan.precision) is None:
        raise PlanError("precision", f"{gpu.name} has no {plan.precision} support in the catalog; "
                        f"choose one of: {', '.join(sorted(gpu.peak_tflops))}")
    if not plan.master_weights and plan.precision != "fp32" and plan.framework in ("deepspeed", "deepspeed-0.4", "megatron"):
        warn("pure16_unsupported", f"{plan.framework} keeps fp32 master weights in 16-bit training; priced as pure "
             "16-bit training as asked", framework=plan.framework)
    if not plan.master_weights and plan.precision == "fp32":
        warn("master_weights_unused", "--no-master-weights drops the fp32 copy of 16-bit training; fp32 training "
             "has none")
    if plan.optimizer_state_dtype is not None and plan.optimizer not in conv["optimizers"]["state_dtype_follows"]:
        warn("state_dtype_unused", f"{plan.optimizer} keeps its state in its own format; --optimizer-state-dtype "
             "does not change it", optimizer=plan.optimizer)
    stages = zero_stages(plan.framework)
    if zero not in stages:
        modes = conventions()["frameworks"][plan.framework].get("zero_modes", {})
        offered = [f"{z} = {modes[str(z)]}" if str(z) in modes else str(z) for z in stages]
        raise PlanError("zero", f"{plan.framework} has no ZeRO-{zero}: it shards the optimizer state only together "
                        f"with the gradients and the parameters it updates; choose --zero "
                        f"{', '.join(offered[:-1])} or {offered[-1]}")
    if zero < least_zero(plan):
        if plan.offload_params:
            raise PlanError("offload_params", "parameter offload needs --zero 3")
        raise PlanError("offload_optimizer", f"{plan.framework} offloads a sharded optimizer: use --zero 1 or more")
    if plan.lora_dropout > 0 and plan.finetune == "full":
        raise PlanError("lora_dropout", "applies to --finetune lora or qlora only")
    if plan.finetune == "full":
        for name, default in adapter_defaults().items():
            if getattr(plan, name) != default:
                raise PlanError(name, "applies to --finetune lora or qlora only")
    if plan.finetune != "qlora" and plan.qlora_bits != qlora_bits_default():
        raise PlanError("qlora_bits", "applies to --finetune qlora only")


def _unused_options(plan: Plan, gpus: int, dp: int, cp: int, zero: int, warn: _Warnings) -> None:
    """Warn about options that change nothing in this layout."""
    if plan.cp_comm != "ring" and cp == 1:
        warn("cp_comm_unused", f"--cp-comm {plan.cp_comm} changes only context parallelism (cp = 1)",
             mode=plan.cp_comm)
    if plan.host_gbs is not None and not plan.offload_optimizer:
        warn("host_unused", "--host-gbs paces only an optimizer offloaded to the host (--offload-optimizer)")
    if plan.nic_gbps is not None and gpus <= plan.gpus_per_node:
        warn("nic_unused", f"--nic-gbps changes nothing on one node ({gpus} GPUs, {plan.gpus_per_node} per node)",
             gpus=gpus, gpn=plan.gpus_per_node)
    if plan.scale_up_gbs is not None and min(gpus, plan.gpus_per_node) == 1:
        warn("scale_up_unused", "--scale-up-gbs changes nothing with one GPU per node")
    if plan.finetune != "full" and zero == 3:
        warn("zero3_frozen", "ZeRO-3 shards the frozen base weights of LoRA/QLoRA too")
    if plan.backward_prefetch != "pre" and (zero < 3 or dp * cp == 1):
        warn("prefetch_unused", f"--backward-prefetch {plan.backward_prefetch} changes only ZeRO-3/FSDP "
             "parameter gathers over data parallelism", mode=plan.backward_prefetch)
    if plan.reduce_dtype is not None and dp * cp == 1:
        warn("reduce_unused", "--reduce-dtype changes the data-parallel gradient reduction; there is none with "
             "dp x cp = 1")


def _gradient_reduction(plan: Plan, zero: int, warn: _Warnings) -> None:
    """Check the gradient reduction against Megatron-LM's conventions."""
    conv = conventions()
    if plan.framework == "megatron" and plan.reduce_dtype is not None:
        fw = conv["frameworks"]["megatron"]
        grad = plan.grad_dtype or ("fp32" if plan.precision == "fp32" or
                                   fw.get(f"grad_bytes_{plan.precision}", fw["grad_bytes"]) == 4 else "bf16")
        if DTYPE_BYTES[plan.reduce_dtype] != DTYPE_BYTES[grad]:
            raise PlanError("reduce_dtype", f"Megatron-LM reduces its gradient buffer in place, in the gradients' "
                            f"dtype ({grad}); set --grad-dtype {plan.reduce_dtype} instead "
                            f"(--grad-reduce-in-bf16 keeps the buffer in bf16)")
    if plan.framework == "megatron" and zero == 2:
        warn("megatron_zero2", "Megatron-LM has no ZeRO-2 mode; bytes follow the generic ZeRO-2 rule")


def _attention(plan: Plan, gpu: GPUSpec, seq_len: int, warn: _Warnings) -> None:
    """Warn where the attention kernel asked for is not what the accelerator or framework runs."""
    if plan.attention in ("flash", "triton", "cudnn") and gpu.vendor == "NVIDIA" and gpu.peak("bf16") is None:
        # FlashAttention-2 and its Triton kernel build for Ampere (sm80) and newer, the first with bf16 tensor cores
        warn("flash_needs_ampere", f"FlashAttention needs an Ampere or newer GPU; {gpu.name} would run PyTorch's "
             "SDPA fallback or materialised scores: plan with --attention sdpa or eager", gpu=gpu.name)
    if plan.attention == "cudnn" and not te_prefers_cudnn(gpu.name):
        warn("cudnn_unpublished", f"no published cuDNN attention speed for {gpu.name}: priced as FlashAttention-2",
             gpu=gpu.name)
    if plan.attention == "flash" and plan.framework == "megatron" and te_prefers_cudnn(gpu.name):
        warn("megatron_cudnn", f"Megatron-Core's Transformer Engine runs cuDNN attention on {gpu.name}, not "
             "FlashAttention-2: plan with --attention cudnn to match", gpu=gpu.name)
    if plan.dropout > 0 and plan.attention == "eager" and plan.recompute == "none" and seq_len >= 8192:
        warn("eager_dropout_scores", "eager attention with dropout stores 5 bytes per attention score; "
             "use --attention flash or --recompute selective")


def padded_vocab(vocab: int, framework: str, tp):
    """The vocabulary as `framework` pads its embedding and output layer: up to a multiple of its
    catalog `vocab_multiple` times the tensor-parallel size (Megatron's
    --make-vocab-size-divisible-by, 128 by default, times TP), or unpadded where that multiple
    is 1. `tp`: a number or an integer array (search's layouts)."""
    multiple = int(conventions()["frameworks"][framework]["vocab_multiple"])
    if multiple <= 1:
        return vocab + 0 * tp
    pad = multiple * tp
    return -(-vocab // pad) * pad


def resolve(plan: Plan, model: ModelSpec | None = None) -> Layout:
    """Check a plan against its model (looked up from the plan unless given) and
    accelerator, and derive the missing values: one named check per concern, in order."""
    model = model or load_model(plan)
    gpu = catalog.gpu(plan.gpu)
    warn = _Warnings()
    tp, pp, cp, ep = plan.tp, plan.pp, plan.cp, plan.ep
    zero = plan.zero if plan.zero is not None else default_zero(plan.framework)
    gpus, dp = _world_size(plan, tp, pp, cp)
    gpu = _accelerator(plan, gpu, gpus)
    sp = _tensor_parallel(plan, model, tp, warn)
    vpp, split, stage_dense, stage_moe = stage_split(plan, model, pp)
    seq_len = _context_and_experts(plan, model, cp, ep, dp)
    dp_shard = _hybrid_sharding(plan, dp, cp, ep, zero, warn)
    gbs, micro_batches = _batch(plan, dp, pp, warn)
    _recompute(plan, model, vpp, split, warn)
    _precision_and_optimizer(plan, gpu, zero, warn)
    _unused_options(plan, gpus, dp, cp, zero, warn)
    _gradient_reduction(plan, zero, warn)
    _attention(plan, gpu, seq_len, warn)

    vocab_padded = padded_vocab(model.vocab, plan.framework, tp)

    return Layout(
        plan=plan, model=model, gpu=gpu, gpus=gpus, tp=tp, pp=pp, dp=dp, cp=cp, ep=ep,
        zero=zero, dp_shard=dp_shard, sp=sp, mbs=plan.mbs, gbs=gbs, seq_len=seq_len,
        micro_batches=micro_batches, vpp=vpp, stage_layers=split,
        stage_dense_layers=stage_dense, stage_moe_layers=stage_moe,
        vocab_padded=vocab_padded, warnings=warn.messages, warning_details=warn.details,
    )
