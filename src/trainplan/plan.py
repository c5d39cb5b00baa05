"""The plan: parallel layout, precision recipe, optimizer, batch, recompute, schedule.

`Plan` holds what the user asked for (CLI options, web JSON, Python). `resolve()` checks it
against the model and the accelerator, derives what was left out (dp, the global batch,
the per-stage layer split) and returns a `Layout` of plain numbers the estimators use.
Every rule that can fail raises `PlanError(field, rule)`.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
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

from .errors import PlanError, from_pydantic
from .files import looks_like_path, shown_path

# upper bounds that catch typos (e.g. an extra zero) without limiting real clusters, and bound a
# plan's work: trainplan.limits says why each is where it is (re-exported here for the callers)
from .limits import MAX_BATCH, MAX_GPUS, MAX_SEQ_LEN, MAX_STAGES  # noqa: F401
from .plan_types import (
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
from .specs import catalog, hf_cache
from .specs.conventions import conventions, shares_efficiency_defaults  # conventions: re-exported
from .specs.hardware import GPUSpec
from .specs.model import LORA_TARGETS, ModelSpec

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
def _adapter_defaults() -> dict:
    """The LoRA settings' defaults, which a plan training in full must leave as they are
    (pydantic's get_default inspects the default factory's signature on every call)."""
    return {name: Plan.model_fields[name].get_default(call_default_factory=True)
            for name in ("lora_rank", "lora_targets")}


@lru_cache(maxsize=1)
def _qlora_bits_default() -> int:
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


# ---- model and accelerator lookup -------------------------------------------------------
@lru_cache(maxsize=256)
def _model_from_file(path: str, mtime_ns: int, size: int) -> ModelSpec:
    """Parse a spec file; cached per (path, modification time, size) so edits are seen."""
    p = Path(path)
    if p.suffix == ".toml":
        data = catalog.read_toml(p, "model")
        catalog.check_kinds(data, ModelSpec, "model.")
        try:
            return catalog.check_size(ModelSpec(**data))
        except ValidationError as exc:
            raise from_pydantic(exc, "model.") from None
    from .specs import hf

    return hf.from_file(p)


def _model_from_path(path: str) -> ModelSpec:
    try:
        st = Path(path).stat()
    except OSError as exc:
        raise PlanError("model", f"cannot read {shown_path(path)} ({exc.strerror or exc})") from None
    except ValueError as exc:  # a NUL byte in the name
        raise PlanError("model", f"cannot read {path!r} ({exc})") from None
    return _model_from_file(path, st.st_mtime_ns, st.st_size)


def _model_from_hub_cache(repo_id: str) -> ModelSpec:
    path = hf_cache.config_path(repo_id)
    st = path.stat()
    return _model_from_cached_config(repo_id, str(path), st.st_mtime_ns, st.st_size)


@lru_cache(maxsize=64)
def _model_from_cached_config(repo_id: str, path: str, mtime_ns: int, size: int) -> ModelSpec:
    from .files import read_json_file
    from .specs import hf

    return hf.from_dict(read_json_file(path, "model"), name=repo_id, source=f"Hugging Face config.json at {path}")


def load_model(plan: Plan) -> ModelSpec:
    if plan.hf_config is not None:
        from .specs import hf

        return hf.from_dict(plan.hf_config, name=plan.hf_config.get("_name_or_path") or "custom")
    name = plan.model
    if hf_cache.is_repo_id(name):  # a Hugging Face model id: its config.json in the local cache
        return _model_from_hub_cache(name)
    if looks_like_path(name):  # never a file that merely shares a catalog name
        return _model_from_path(name)
    try:
        return catalog.model(name)
    except PlanError as err:
        if Path(name).is_file():
            raise PlanError("model", f"{err.rule}; to read the file {name}, give its path: ./{name}") from None
        raise


# ---- the resolved layout ------------------------------------------------------------
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


def interleaving_problem(split: list[int], v: int, framework: str) -> str | None:
    """Why `split` (layers per stage) cannot run v virtual stages per rank, or None. Megatron-LM
    (--num-layers-per-virtual-pipeline-stage) needs equal virtual stages; torchtitan
    (pipeline_parallel_layers_per_stage) also allows the first and last virtual stage one layer
    lighter, for the embedding and the head (Llama 3 405B: 126 layers as 7, 8, ..., 8, 7 on 16 x 2,
    or 16 x 8 with the end virtual stages holding only the embedding and the head)."""
    if all(n % v == 0 for n in split):
        return None
    if framework != "megatron" and torchtitan_virtual_stages(split, v):
        return None
    lighter = "" if framework == "megatron" else ", or equal but for a first and last one layer lighter"
    return (f"{v} virtual stages per rank need each stage's layers {split} divisible by {v}{lighter} "
            f"({framework} conventions)")


# torch.distributed.pipelining schedules that run several stages per rank (PyTorch 2.13,
# schedules.py): LoopedBFS and InterleavedZeroBubble any number, ZBVZeroBubble and DualPipeV two
TORCH_MULTI_STAGE = ("looped_bfs", "zb", "zbv", "dualpipev")


def torch_schedule_vpp(schedule: str, vpp: int | None, pp: int) -> int:
    """Stages per rank of a torch multi-stage schedule: --vpp (default 1; zb with 1 is torch's
    ZB1P on one stage per rank), exactly 2 for the V-shaped zbv and dualpipev."""
    if pp < 2:
        raise PlanError("schedule", f"{schedule} needs pp >= 2")
    if schedule in ("zbv", "dualpipev"):
        if vpp not in (None, 2):
            raise PlanError("vpp", f"{schedule} runs exactly 2 stages per rank (V-shaped); got --vpp {vpp}")
        return 2
    if schedule == "looped_bfs" and (vpp or 1) < 2:
        raise PlanError("vpp", "looped_bfs loops over several stages per rank: --vpp >= 2")
    return vpp or 1


def torchtitan_virtual_stages(split: list[int], v: int) -> tuple[int, int] | None:
    """(layers per virtual stage, layers fewer on the first and on the last) for which
    torchtitan's cut of layers + 2 x fewer "weighted" layers into len(split) x v virtual
    stages (rank r holding r, r + pp, ...) gives `split`; None when no such cut does. Every
    virtual stage keeps a layer but the first and last, which may hold only the embedding and
    only the head: Llama 3 405B's one-layer chunks (paper §3.3.2, 126 layers on 16 x 8)."""
    pp, layers = len(split), sum(split)
    for fewer in (0, 1):
        total = layers + 2 * fewer
        if total % (pp * v) or total // (pp * v) < 1:
            continue
        chunks = [total // (pp * v)] * (pp * v)
        chunks[0] -= fewer
        chunks[-1] -= fewer
        if [sum(chunks[r::pp]) for r in range(pp)] == split:
            return total // (pp * v), fewer
    return None


def schedule_batch_rules(plan: Plan, pp: int, m: int) -> None:
    """The micro-batches per step a schedule needs (m), and its interleaving group."""
    if plan.schedule == "interleaved" and m % pp:
        raise PlanError("gbs", f"the interleaved schedule needs micro-batches per step ({m}) divisible by pp ({pp})")
    if plan.pp_group is not None:
        if plan.schedule != "interleaved":
            raise PlanError("pp_group", f"applies to --schedule interleaved only (got {plan.schedule})")
        n = plan.pp_group
        if n > m or n < pp:
            # megatron/core/pipeline_parallel/schedules.py @d98e8a64 (interleaving): with fewer
            # than pp per group the last stage's first backward waits on forwards its warm-up
            # has not run (the order deadlocks; estimate/pipeline.py simulate)
            raise PlanError("pp_group", f"contiguous micro-batches per virtual stage must lie in [pp={pp}, "
                            f"micro-batches per step={m}]; got {n}")
        if plan.framework == "megatron":
            if 0 < m % n < pp:
                raise PlanError("pp_group", f"the micro-batches per step ({m}) modulo --pp-group ({n}) must be 0 or "
                                f"at least pp ({pp}) (Megatron-Core: otherwise the last group stalls)")
    if plan.framework == "torch" and pp > 1:
        # torch.distributed.pipelining 2.13 (schedules.py): the constructors refuse these
        if plan.schedule == "dualpipev" and m < 2 * pp:
            raise PlanError("gbs", f"torch's ScheduleDualPipeV needs micro-batches ({m}) >= its 2 x pp = {2 * pp} stages")
        if plan.schedule in ("interleaved", "zb") and m % max(1, m // pp):
            raise PlanError("gbs", f"torch's Schedule{'Interleaved1F1B' if plan.schedule == 'interleaved' else 'InterleavedZeroBubble'}"
                            f" needs micro-batches ({m}) divisible by their rounds (max(1, m // pp) = {max(1, m // pp)})")
    if plan.schedule == "dualpipe" and (m < 2 * pp or m % 2):
        # DualPipe.step: "num_chunks % 2 == 0 and num_chunks >= num_ranks * 2"
        raise PlanError("gbs", f"dualpipe needs an even number of micro-batches per step, at least 2 x pp = "
                        f"{2 * pp}; got {m}")


def default_stage_split(layers: int, pp: int) -> list[int]:
    """Even split; when it does not divide, the first and last stages (which also hold the
    embedding and the output head) give up layers first, as Llama 3 405B does
    (126 layers on 16 stages: 7 + 14 x 8 + 7; Llama 3 paper §3.3.2)."""
    per = math.ceil(layers / pp)
    split = [per] * pp
    # The deficit (fewer than pp layers) is taken one layer a stage from the outside in: last,
    # first, second-to-last, second, ...: the j-th stage in that order is pp - 1 - j/2 for even
    # j and (j - 1)/2 for odd j. O(pp).
    for j in range(per * pp - layers):
        split[pp - 1 - j // 2 if j % 2 == 0 else j // 2] -= 1
    return split


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
        from .profile import profile_accelerator

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


def _pipeline(plan: Plan, model: ModelSpec, pp: int) -> tuple[int, list[int], list[int], list[int]]:
    """(virtual stages per GPU, layers per stage, dense and MoE layers per stage): the schedule
    and split checked."""
    # -- pipeline
    if pp > model.layers:
        raise PlanError("pp", f"cannot exceed the number of layers ({model.layers}); got {pp}")
    vpp = plan.vpp or 1
    if plan.schedule == "interleaved":
        if pp < 2:
            raise PlanError("schedule", "interleaved needs pp >= 2")
        if plan.vpp is None or plan.vpp < 2:
            raise PlanError("vpp", "the interleaved schedule needs --vpp >= 2 (virtual stages per GPU)")
    elif plan.framework == "torch" and plan.schedule in TORCH_MULTI_STAGE:
        vpp = torch_schedule_vpp(plan.schedule, plan.vpp, pp)
    elif plan.schedule in ("looped_bfs", "zbv", "dualpipev"):
        raise PlanError("schedule", f"{plan.schedule} is torch.distributed.pipelining's schedule: use --framework torch")
    elif plan.framework == "torch" and plan.schedule == "dualpipe":
        # torch.distributed.pipelining 2.13 has no two-copy DualPipe (schedules.py), only DualPipeV
        raise PlanError("schedule", "dualpipe (two copies of the model) is not a torch.distributed.pipelining "
                        "schedule: use dualpipev, its one-copy V-shaped form, or --framework megatron")
    elif plan.vpp not in (None, 1):
        raise PlanError("vpp", f"virtual stages only apply to --schedule interleaved (got {plan.schedule})")
    if plan.schedule == "dualpipe" and (pp < 2 or pp % 2):
        # deepseek-ai/DualPipe dualpipe.py DualPipe.step: "assert num_ranks % 2 == 0"
        raise PlanError("schedule", f"dualpipe needs an even pp >= 2 (its two directions meet in the middle); got {pp}")
    if plan.stage_layers is not None:
        split = list(plan.stage_layers)
        if len(split) != pp:
            raise PlanError("stage_layers", f"needs one entry per pipeline stage ({pp}); got {len(split)}")
        if any(n < 0 for n in split) or sum(split) != model.layers:
            raise PlanError("stage_layers", f"entries must be >= 0 and sum to the layer count "
                            f"({model.layers}); got sum {sum(split)}")
    else:
        split = default_stage_split(model.layers, pp)
    if vpp > 1:
        problem = interleaving_problem(split, vpp, plan.framework)
        if problem:
            raise PlanError("vpp", problem)
    stage_dense, stage_moe = (list(x) for x in _layer_kinds(model.moe_layer_flags, tuple(split)))
    if plan.schedule == "dualpipe":
        # DualPipe keeps two copies of the model: rank r holds stage r of one and stage
        # p - 1 - r of the other (DeepSeek-V3 §3.2.1: "two copies of the model parameters")
        split, stage_moe, stage_dense = ([a + b for a, b in zip(x, x[::-1], strict=True)]
                                         for x in (split, stage_moe, stage_dense))

    return vpp, split, stage_dense, stage_moe


@lru_cache(maxsize=256)
def _layer_kinds(moe_flags: tuple[bool, ...], split: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The dense and the MoE layers of each stage of a split, from the model's MoE flags per layer."""
    bounds = [0, *itertools.accumulate(split)]
    stage_moe = tuple(sum(moe_flags[bounds[i]:bounds[i + 1]]) for i in range(len(split)))
    return tuple(n - m for n, m in zip(split, stage_moe, strict=True)), stage_moe


def pipeline_rules(plan: Plan, model: ModelSpec, pp: int) -> int:
    """The virtual stages per GPU the plan's schedule runs on `pp` stages of the default split,
    checked as `resolve` checks them (a PlanError names the rule broken)."""
    return _pipeline(plan.model_copy(update={"stage_layers": None}) if plan.stage_layers else plan, model, pp)[0]


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
        for name, default in _adapter_defaults().items():
            if getattr(plan, name) != default:
                raise PlanError(name, "applies to --finetune lora or qlora only")
    if plan.finetune != "qlora" and plan.qlora_bits != _qlora_bits_default():
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
    vpp, split, stage_dense, stage_moe = _pipeline(plan, model, pp)
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


# `from trainplan import plan` is also the Python API's function (trainplan/api.py)
from .api import make_callable  # noqa: E402

make_callable(__name__)
