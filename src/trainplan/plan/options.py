"""What the user asks for: the `Plan` (CLI options, web JSON, Python) with its field rules,
`make_plan`, and the framework conventions its defaults come from."""

from __future__ import annotations

from functools import lru_cache
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from ..errors import PlanError, from_pydantic

# upper bounds that catch typos (e.g. an extra zero) without limiting real clusters, and bound a
# plan's work: trainplan.limits says why each is where it is
from ..limits import MAX_BATCH, MAX_GPUS, MAX_SEQ_LEN, MAX_STAGES
from ..plan_types import (
    Attention,
    BackwardPrefetch,
    CpComm,
    Finetune,
    Fp8Cached,
    Framework,
    GradDtype,
    Optimizer,
    OptimizerImpl,
    Precision,
    Recompute,
    RecomputeModule,
    Schedule,
)
from ..specs import catalog
from ..specs.conventions import conventions
from ..specs.model import LORA_TARGETS

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


class Plan(BaseModel):
    """What to train and how. Omitted layout values are derived by `resolve`."""

    # every float finite: NaN and infinity are refused by name, never carried into a figure
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    model: str = Field(default="llama-3-8b", min_length=1, max_length=4096,
                       description="catalog name, or a path to a config.json / spec .toml: a path when it contains "
                       "a / or ends in .json or .toml, a catalog name otherwise")
    hf_config: dict | None = Field(default=None, description="a parsed Hugging Face config.json")
    gpu: str = Field(default="H100-SXM", min_length=1, max_length=256)
    gpus: int | None = Field(default=None, ge=1, le=MAX_GPUS)
    gpus_per_node: int | None = Field(
        default=None, ge=1, le=MAX_GPUS, description="GPUs one scale-up link joins (a server's NVLink, an NVL72 "
        "rack, a TPU slice's ICI); default: the accelerator's (catalog scale_up_domain: 8 for most, 72 for GB200)")
    tp: int = Field(default=1, ge=1, le=MAX_GPUS)
    pp: int = Field(default=1, ge=1, le=MAX_STAGES)
    dp: int | None = Field(default=None, ge=1, le=MAX_GPUS)
    cp: int = Field(default=1, ge=1, le=MAX_GPUS)
    ep: int = Field(default=1, ge=1, le=MAX_GPUS)
    ep_node_limit: int | None = Field(
        default=None, ge=1, le=MAX_GPUS,
        description="node-limited routing: each token to experts on at most this many nodes, dispatched once per "
        "node (DeepSeek-V3's 4, DeepEP's normal kernels); default: no limit, NCCL's all-to-all, one copy per expert")
    ep_overlap: bool = Field(
        default=False, description="expert-parallel all-to-alls beside another micro-batch's compute (DeepSeek-V3's "
        "DualPipe, Megatron-Core --overlap-moe-expert-parallel-comm); default: exposed, as under plain 1F1B")
    zero: int | None = Field(default=None, ge=0, le=3, description="ZeRO stage; default: the framework's "
                             "(3 for fsdp and fsdp1, FULL_SHARD; 0 otherwise)")
    dp_shard: int | None = Field(
        default=None, ge=1, le=MAX_GPUS, description="hybrid sharding (HSDP): ZeRO shards over groups of this many "
        "data-parallel ranks and replicates across dp / dp_shard groups, whose gradients are all-reduced (FSDP "
        "HYBRID_SHARD, torchtitan data_parallel_shard_degree, Megatron --num-distributed-optimizer-instances, "
        "DeepSpeed MiCS); default: shard over all dp ranks")
    sp: bool = False
    mbs: int = Field(default=1, ge=1, le=MAX_BATCH)
    gbs: int | None = Field(default=None, ge=1, le=MAX_BATCH)
    seq_len: int | None = Field(default=None, ge=1, le=MAX_SEQ_LEN)
    recompute: Recompute = "none"
    recompute_layers: int | None = Field(default=None, ge=0, le=100_000)
    recompute_modules: list[RecomputeModule] | None = Field(
        default=None, description="with --recompute selective, what it recomputes (Megatron-Core --recompute-modules): "
        "core_attn (the attention core, the default), layernorm (the norms' outputs), mla_up_proj (MLA's "
        "up-projections and RoPE), moe_act (the experts' SwiGLU output); e.g. layernorm,mla_up_proj,moe_act as "
        "DeepSeek-V3 runs")
    fp8_cache: list[Fp8Cached] | None = Field(
        default=None, description="with --precision fp8, saved tensors kept in low precision besides the linears' "
        "inputs (DeepSeek-V3 §3.3.3): attn_out (the attention output, E5M6), moe_act_input (the experts' SwiGLU "
        "input, FP8)")
    fused_kernels: bool | None = Field(
        default=None, description="fused norm and SwiGLU kernels that save only their inputs (Megatron's, "
        "Liger Kernel's, Apex's); default: the framework's convention (on for megatron)")
    tp_backward_overlap: bool | None = Field(
        default=None, description="the backward's tensor-parallel collectives run beside the GEMMs they do not feed "
        "(Megatron's asynchronous all-reduce of a column-parallel linear's input gradient with its weight "
        "gradient); default: the framework's convention (on for megatron)")
    recompute_early_stop: bool | None = Field(
        default=None, description="non-reentrant checkpointing stops the recomputation before each block's last "
        "linear (PyTorch >= 2.1's default); default: the framework's convention (on for fsdp)")
    schedule: Schedule = "1f1b"
    vpp: int | None = Field(default=None, ge=1, le=1024)
    pp_group: int | None = Field(
        default=None, ge=1, le=MAX_BATCH, description="interleaved schedule: contiguous micro-batches each virtual "
        "stage runs before the next (Megatron-Core microbatch_group_size_per_vp_stage, in [pp, micro-batches]; "
        "Llama 3's N); default pp")
    stage_layers: list[int] | None = None
    precision: Precision = "bf16"
    grad_dtype: GradDtype | None = None
    master_weights: bool = Field(
        default=True, description="keep fp32 master weights under 16-bit mixed precision; off: pure 16-bit training, "
        "the weights and gradients in the compute dtype with no fp32 copy (a model cast to bf16 and trained by "
        "torch.optim or Transformer Engine's FusedAdam without master_weights)")
    optimizer_state_dtype: GradDtype | None = Field(
        default=None, description="dtype of the optimizer state (AdamW's moments, momentum): default fp32, or the "
        "weights' dtype under pure 16-bit training (torch.optim's zeros_like); Transformer Engine FusedAdam "
        "exp_avg_dtype, Megatron --exp-avg-dtype")
    reduce_dtype: GradDtype | None = Field(default=None, description="dtype of the data-parallel gradient "
                                           "collectives (default: the gradients' own; FSDP1's: the compute dtype): FSDP "
                                           "MixedPrecision reduce_dtype, DeepSpeed communication_data_type")
    optimizer: Optimizer = "adamw"
    optimizer_impl: OptimizerImpl | None = Field(
        default=None, description="how the optimizer step runs: fused (one kernel: Apex/Transformer Engine "
        "FusedAdam, torch fused=True), foreach (PyTorch's default on GPUs: one multi-tensor kernel per "
        "operation) or for-loop (one kernel per operation and tensor); default: the framework's")
    grad_clip: float = Field(
        default=1.0, ge=0.0, le=1e6, description="gradient-norm clipping threshold (0: off): every step reads the gradients "
        "for their norm and, as the framework runs it, scales them (Megatron --clip-grad, torchtitan max_norm, "
        "DeepSpeed gradient_clipping)")
    offload_optimizer: bool = False
    offload_params: bool = False
    attention: Attention = Field(
        default="auto", description="attention kernel; auto: what the framework runs on the GPU (cuDNN for "
        "Megatron on Hopper, where Transformer Engine prefers it; FlashAttention-2 otherwise)")
    fp8_params: bool = Field(default=False, description="with --precision fp8, the compute copy of the weights "
                             "held in FP8 (Megatron --fp8-param-gather, Transformer Engine's fp8 model init; "
                             "torchao's float8 FSDP all-gather): no 16-bit copy, gathers in FP8")
    fused_loss: bool = Field(default=False, description="a fused cross-entropy kernel (flash-attn, Apex xentropy, "
                             "Liger): the loss reads the 16-bit logits and keeps no fp32 copy")
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    framework: Framework = "deepspeed"
    finetune: Finetune = "full"
    lora_rank: int = Field(default=16, ge=1, le=65536)
    lora_targets: list[str] = Field(default_factory=lambda: list(LORA_TARGETS))
    qlora_bits: Literal[4, 8] = 4
    lora_dropout: float = Field(default=0.0, ge=0.0, lt=1.0,
                                description="dropout on each adapter's input (PEFT's lora_dropout)")
    overlap_tp: bool = Field(default=False, description="overlap TP collectives with GEMMs (--tp-comm-overlap)")
    overlap_dp: bool = Field(default=True, description="reduce gradients during the backward (bucketed)")
    backward_prefetch: BackwardPrefetch = Field(
        default="pre", description="ZeRO-3/FSDP backward: gather the next layer's parameters before the current "
        "layer's gradients (pre, overlapped), after them (post: FSDP1 BACKWARD_POST, the gather exposed) or on "
        "demand (none: gather and reduce-scatter exposed)")
    cp_comm: CpComm = Field(default="ring", description="context-parallel K/V exchange: ring (overlapped with "
                            "attention) or allgather (gathered before it, exposed)")
    tokens: float | None = Field(default=None, ge=1, le=1e16, description="training tokens (default 20 x params)")
    price: float | None = Field(default=None, ge=0, le=1e4, description="USD per GPU-hour (default: catalog)")
    pue: float | None = Field(default=None, ge=1, le=5)
    grid_kg_per_kwh: float | None = Field(default=None, ge=0, le=5)
    gpu_mtbf_hours: float | None = Field(default=None, gt=0, le=1e9)
    checkpoint_gbs: float | None = Field(default=None, ge=1e-3, le=1e6, description="checkpoint write GB/s per node")
    gpu_profile: str | None = Field(default=None, min_length=1, max_length=4096,
                                    description="calibrated hardware profile: the path of a TOML file")
    sharp: bool = Field(default=False, description="in-network all-reduce (NVLS in a node, SHARP across nodes)")
    scale_up_gbs: float | None = Field(
        default=None, ge=1e-3, le=1e6, description="the link between the GPUs of a node (NVLink-class), per GPU, "
        "bidirectional GB/s (default: the accelerator's catalog entry)")
    nic_gbps: float | None = Field(
        default=None, ge=1e-3, le=1e6, description="the scale-out network between nodes, per GPU, Gb/s (default: the "
        "accelerator's catalog entry)")
    data_workers: int | None = Field(default=None, ge=1, le=4096, description="data-loader workers per data-parallel rank")
    tokenize_rate: float | None = Field(default=None, ge=1, le=1e12,
                                        description="tokens/s per worker when tokenizing on the fly (default: pre-tokenized)")
    storage_gbs: float | None = Field(default=None, ge=1e-3, le=1e6,
                                      description="effective storage read GB/s per data-parallel rank (default: no limit)")
    data_bytes_per_token: float | None = Field(default=None, gt=0, le=1e6,
                                               description="bytes read from storage per token (default: 4 raw text, 2 or 4 token ids)")
    h2d_gbs: float | None = Field(default=None, ge=1e-3, le=1e6, description="host->device GB/s per GPU (default 25)")
    host_gbs: float | None = Field(default=None, ge=1e-3, le=1e6,
                                   description="host memory GB/s per node for an offloaded optimizer (default 200)")
    prefetch: bool = Field(default=True, description="load the next batches while the step runs")
    overhead_gib: float | None = Field(default=None, ge=0, le=1024)
    fragmentation: float | None = Field(default=None, ge=0, le=1)

    @field_validator("lora_targets", mode="before")
    @classmethod
    def _split_targets(cls, v):
        if isinstance(v, str):
            v = [t.strip() for t in v.split(",") if t.strip()]
        if not isinstance(v, list | tuple):
            raise ValueError("must be comma-separated names or a list of them, e.g. q,v")
        bad = [t for t in v if t not in LORA_TARGETS]
        if bad:
            raise ValueError(f"unknown LoRA target(s) {bad}; choose from {', '.join(LORA_TARGETS)}")
        if not v:
            raise ValueError("name at least one LoRA target")
        twice = sorted({t for t in v if v.count(t) > 1})
        if twice:
            raise ValueError(f"names {', '.join(twice)} more than once")
        return v

    @field_validator("recompute_modules", "fp8_cache", mode="before")
    @classmethod
    def _split_modules(cls, v, info: ValidationInfo):
        if isinstance(v, str):
            v = [t.strip() for t in v.split(",") if t.strip()]
        if isinstance(v, list | tuple):
            if not v and info.field_name == "recompute_modules":
                raise ValueError("name at least one (an empty list recomputes nothing: --recompute none says so)")
            twice = sorted({str(t) for t in v if v.count(t) > 1})
            if twice:
                raise ValueError(f"names {', '.join(twice)} more than once")
        return v

    @field_validator("pp", mode="before")
    @classmethod
    def _planned_stages(cls, v):
        # a plan's work grows with its stages (trainplan.limits): the limit in words
        if isinstance(v, int) and not isinstance(v, bool) and v > MAX_STAGES:
            raise ValueError(f"at most {MAX_STAGES:,} pipeline stages are planned (one layer a stage, and models "
                             f"of at most {MAX_STAGES:,} layers); got {v:,}")
        return v

    @field_validator("stage_layers", mode="before")
    @classmethod
    def _split_stages(cls, v):
        if isinstance(v, str):
            try:
                v = [int(x) for x in v.split(",") if x.strip()]
            except ValueError:
                raise ValueError("must be comma-separated integers, e.g. 7,8,8,7") from None
        return v

    @model_validator(mode="after")
    def _resolve_accelerator_defaults(self):
        """What the plan leaves to its accelerator: the framework's attention kernel on it, and
        how many GPUs share its scale-up link."""
        if self.attention == "auto":
            self.attention = framework_attention(self.framework, self.gpu)
        if self.gpus_per_node is None:
            try:
                self.gpus_per_node = catalog.gpu(self.gpu).scale_up_domain
            except PlanError:  # an unknown accelerator is reported by resolve(), naming the field
                self.gpus_per_node = 8
        return self


def framework_attention(framework: str, gpu: str) -> str:
    """The attention kernel a framework runs on an accelerator: Transformer Engine (Megatron-Core)
    prefers cuDNN's fused attention to FlashAttention-2 on Hopper (its backend selection:
    "Disabling FlashAttention to give FusedAttention preference on Hopper+ for performance
    reasons", TE 1.x already, with flash-attn <= 2.5.8), priced where its speed is published
    (conventions.toml [efficiency.cudnn_attention_curve]); FlashAttention-2 otherwise."""
    try:
        name = catalog.gpu(gpu).name
    except PlanError:  # an unknown accelerator is reported by resolve(), naming the field
        return "flash"
    return "cudnn" if framework == "megatron" and te_prefers_cudnn(name) else "flash"


def te_prefers_cudnn(gpu_name: str) -> bool:
    """Whether Transformer Engine runs cuDNN attention rather than FlashAttention-2 on this
    accelerator (Hopper: the ones with a published cuDNN speed, conventions.toml
    [efficiency.cudnn_attention_curve])."""
    return gpu_name in conventions()["efficiency"]["cudnn_attention_curve"]


def make_plan(**options) -> Plan:
    """Build a Plan, turning pydantic's errors into one PlanError naming the field."""
    try:
        return Plan(**{k: v for k, v in options.items() if v is not None})
    except ValidationError as exc:
        raise from_pydantic(exc) from None


@lru_cache(maxsize=1)
def adapter_defaults() -> dict:
    """The LoRA settings' defaults, which a plan training in full must leave as they are
    (pydantic's get_default inspects the default factory's signature on every call)."""
    return {name: Plan.model_fields[name].get_default(call_default_factory=True)
            for name in ("lora_rank", "lora_targets")}


@lru_cache(maxsize=1)
def qlora_bits_default() -> int:
    """The QLoRA bits' default, which a plan not training with QLoRA must leave as it is."""
    return Plan.model_fields["qlora_bits"].default


# ---- conventions --------------------------------------------------------------------

def default_zero(framework: str) -> int:
    """The ZeRO stage a framework runs unless told otherwise (FSDP: FULL_SHARD)."""
    return int(conventions()["frameworks"][framework].get("default_zero", 0))


def zero_stages(framework: str) -> tuple[int, ...]:
    """The ZeRO stages a framework offers (FSDP: 0, 2 and 3, its sharding strategies)."""
    return tuple(conventions()["frameworks"][framework].get("zero_stages", (0, 1, 2, 3)))


def least_zero(plan: Plan) -> int:
    """The least ZeRO stage a plan's offloading allows: parameter offload needs ZeRO-3, and
    DeepSpeed and Megatron-LM offload only an optimizer they shard (DeepSpeed's ZeRO 1-3,
    Megatron's --optimizer-cpu-offload beside its distributed optimizer; DDP has none); FSDP
    offloads at any of its strategies."""
    if plan.offload_params:
        return 3
    return 1 if plan.offload_optimizer and not plan.framework.startswith("fsdp") else 0
