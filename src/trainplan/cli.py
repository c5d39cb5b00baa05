"""Command line: `trainplan plan | models | gpus`.

Bad input prints one line `error: <field>: <rule>` on stderr and exits with status 2: a value a
command refuses (PlanError) and an option click cannot parse alike.

typer is imported when the typer app is built (`app`, built on first use): `plan`, `models`,
`gpus`, `search` and `export` with ordinary options run without it (trainplan.cli_fast), reading
the same declarations.
"""

from __future__ import annotations

import functools
import inspect
import json
import math
import os
import sys
from enum import Enum, StrEnum
from typing import TYPE_CHECKING, Annotated, get_args

from . import cli_fast
from .cli_fast import NOT_PLAIN as _NOT_PLAIN
from .cli_fast import echo as _echo
from .cli_fast import plain_value as _plain_value
from .errors import PlanError
from .files import check_output_path, non_finite_key, write_text_atomic
from .plan_types import (
    Attention,
    BackwardPrefetch,
    CpComm,
    Finetune,
    Framework,
    GradDtype,
    Optimizer,
    OptimizerImpl,
    Precision,
    Recompute,
    Schedule,
)

if TYPE_CHECKING:
    import typer  # imported by _typer_app(), which makes it the name the declarations below use

EXIT_BAD_INPUT = 2
MAX_DAYS = 36_500  # a deadline of a century
MAX_BENCH_TOKENS = 1 << 20  # bench --model: 1M tokens x a 16K-wide MLP is 32 GiB of bf16 operands


def _one_line(text: str) -> str:
    return " ".join(str(text).split("\n")).strip()


def _click():
    """click's exceptions, from the click typer runs on (its own copy in newer typers)."""
    import typer

    return sys.modules[typer.BadParameter.__module__]


def _usage_line(exc) -> str:
    """A usage error as `<option>: <what is wrong>`."""
    _clk = _click()
    param = getattr(exc, "param", None)
    if isinstance(exc, _clk.BadParameter) and param is not None and exc.param_hint is None:
        name = (getattr(param, "opts", None) or [param.name])[0]
        return f"{name}: {exc.message.removeprefix('Value error, ')}"
    if isinstance(exc, _clk.NoSuchOption):
        close = f"; did you mean {', '.join(exc.possibilities)}?" if exc.possibilities else ""
        return f"{exc.option_name}: no such option{close}"
    if getattr(exc, "option_name", None):  # an option given without its value
        return f"{exc.option_name}: {exc.message}"
    message = exc.format_message()
    return f"{'command' if message.startswith('No such command') else 'arguments'}: {message}"


class _PlainCoercion:
    """A parameter's values converted without building typer's validator for it (a pydantic
    TypeAdapter per option, some 60 per command, most of a command's start-up): defaults and
    plain literals here, anything else (a malformed number, say) through typer's own coercion,
    so its result and its error messages stay typer's."""

    def __init__(self, param):
        self.param = param
        self.typed = None

    def coerce(self, value, param, ctx):
        if not (param.multiple or param.nargs == -1):
            plain = _plain_value(param.type_descriptor.annotation, value)
            if plain is not _NOT_PLAIN:
                return plain
        if self.typed is None:
            from typer._coercion import build_runtime_param

            self.typed = build_runtime_param(param.type_descriptor)
        return self.typed.coerce(value, param=param, ctx=ctx)


def _plain_coercion(params) -> None:
    """Give each of a command's typer parameters (--help included) the plain coercion (see
    _PlainCoercion)."""
    for param in params:
        info = getattr(param, "type_descriptor", None)
        info = info and info.parameter_info
        if (getattr(param, "_runtime_param", 0) is None and info is not None and info.parser is None
                and info.min is None and info.max is None):
            param._runtime_param = _PlainCoercion(param)


@functools.cache
def _one_line_errors():
    """The typer group class whose usage errors (an unknown option, a value of the wrong type
    or out of range) are one line `error: <option>: <rule>`, exit status 2, like every other
    bad input."""
    import typer
    from typer.core import TyperGroup

    _clk = _click()
    no_args = getattr(_clk, "NoArgsIsHelpError", ())

    class OneLineErrors(TyperGroup):
        def parse_args(self, ctx, args):
            _plain_coercion(self.get_params(ctx))
            return super().parse_args(ctx, args)

        def resolve_command(self, ctx, args):
            name, command, rest = super().resolve_command(ctx, args)
            if command is not None:
                _plain_coercion(command.get_params(ctx))
            return name, command, rest

        def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
            if not standalone_mode:
                return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
            try:
                rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
            except no_args as exc:
                exc.show()
                sys.exit(exc.exit_code)
            except _clk.UsageError as exc:
                _echo(f"error: {_one_line(_usage_line(exc))}", err=True)
                sys.exit(EXIT_BAD_INPUT)
            except _clk.ClickException as exc:
                exc.show()
                sys.exit(exc.exit_code)
            except typer.Abort:
                _echo("Aborted!", err=True)
                sys.exit(1)
            sys.exit(rv if isinstance(rv, int) else 0)

    return OneLineErrors


HELP = "Plan and measure large-language-model training on GPUs."
_COMMANDS: list = []  # the commands, in the order typer lists them


def _command(fn):
    """Register a command (typer's app.command(), when the app is built)."""
    _COMMANDS.append(fn)
    return fn


def _print_version(value: bool) -> None:
    if value:
        import typer

        from . import __version__

        _echo(f"trainplan {__version__}")
        raise typer.Exit()


def _top(version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                               help="Print trainplan's version and exit")] = False) -> None:
    """Plan and measure large-language-model training on GPUs."""


FROM_HELP = ("A configuration to plan: a Megatron-LM launch script or arguments file, a DeepSpeed JSON (with "
             "--model or --hf-config: it names no model) or a torchtitan job (0.3's --module/--config command "
             "line, or a TOML job file). Options given alongside override the file's settings; what the file sets "
             "that trainplan does not understand is listed on stderr (docs/imports.md)")
HF_CONFIG_HELP = "The model's Hugging Face config.json (as --model PATH does), e.g. beside a DeepSpeed --from"


def _given_options(ctx, options: dict) -> dict:
    """The plan options set on the command line (not the defaults)."""
    def given(name):
        source = ctx.get_parameter_source(name)
        return source is not None and source.name == "COMMANDLINE"

    return {k: v for k, v in options.items() if given(k)}


def _options_from(ctx, options: dict, from_file: str | None, hf_config: str | None) -> tuple[dict, dict | None]:
    """The plan options: as given, or a configuration file's with those given on top; the
    file's notes and what it did not understand on stderr."""
    from .api import plan_options

    if from_file is None and hf_config is None:
        return options, None
    messages: list[str] = []
    given = _given_options(ctx, options)
    if not from_file:  # --hf-config alone: every option as given or defaulted, the model from the file
        given = {**{k: v for k, v in options.items() if k != "model"}, **given}
    merged, report = plan_options(given, from_file, hf_config, messages)
    for line in messages:
        _echo(line, err=True)
    return merged, report


def _fail(err: PlanError) -> None:
    _echo(f"error: {_one_line(err)}", err=True)
    sys.exit(EXIT_BAD_INPUT)


def _echo_json(data) -> None:
    """Print strict JSON: a NaN or an infinity (which JSON has no word for) is an error naming
    the figure, never `NaN` or `Infinity` in the output."""
    try:
        text = json.dumps(data, indent=2, allow_nan=False)
    except ValueError:
        _fail(PlanError(non_finite_key(data) or "output", "is not a finite number; the inputs give no meaningful "
                        "figure here"))
    _echo(text)


def _read_inputs(plan_) -> None:
    """Read the plan's files (its model, its profile) up front, so that a bad one is refused by
    every command, whether or not it uses it, and once rather than per accelerator compared."""
    from .plan import load_model

    load_model(plan_)
    if plan_.gpu_profile:
        from .profile import load_profile

        load_profile(plan_.gpu_profile)


def _check_number(field: str, value: float | None, low: float, high: float, low_open: bool = False) -> None:
    """A finite number in [low, high] ((low, high] with low_open) or a PlanError naming the option."""
    if value is None:
        return
    ok = math.isfinite(value) and (low < value if low_open else low <= value) and value <= high
    if not ok:
        raise PlanError(field, f"must be a finite number in {'(' if low_open else '['}{low:g}, {high:g}] "
                        f"(got {value!r})")


def _with_status(work, quiet: bool, label: str):
    """`work(progress)` under a spinner on stderr that shows its progress messages; without
    one (progress=None) when the output is JSON."""
    if quiet:
        return work(None)
    from rich.console import Console

    with Console(stderr=True).status(label) as status:
        return work(status.update)


def _choices(name: str, literal) -> type[StrEnum]:
    """A CLI choice type built from the plan's Literal, so the allowed values live in one place."""
    return StrEnum(name, {v: v for v in get_args(literal)})


RecomputeOpt = _choices("RecomputeOpt", Recompute)
ScheduleOpt = _choices("ScheduleOpt", Schedule)
PrecisionOpt = _choices("PrecisionOpt", Precision)
AttentionOpt = _choices("AttentionOpt", Attention)
FrameworkOpt = _choices("FrameworkOpt", Framework)
CpCommOpt = _choices("CpCommOpt", CpComm)
BackwardPrefetchOpt = _choices("BackwardPrefetchOpt", BackwardPrefetch)
OptimizerOpt = _choices("OptimizerOpt", Optimizer)
OptimizerImplOpt = _choices("OptimizerImplOpt", OptimizerImpl)
FinetuneOpt = _choices("FinetuneOpt", Finetune)
GradDtypeOpt = _choices("GradDtypeOpt", GradDtype)


def _v(x):
    return x.value if isinstance(x, Enum) else x


def _plan_options(
    model: Annotated[str, typer.Option(help="Catalog name (see `trainplan models`), or the path of a Hugging Face config.json or a spec .toml: a path when it contains a / or ends in .json or .toml (./gpt2 is a file, gpt2 always the catalog's)")] = "llama-3-8b",
    gpu: Annotated[str, typer.Option(help="Accelerator (see `trainplan gpus`)")] = "H100-SXM",
    gpus: Annotated[int | None, typer.Option(help="Total GPUs (default tp x pp x cp x dp)")] = None,
    gpus_per_node: Annotated[int | None, typer.Option(help="GPUs per node: those one scale-up link joins (NVLink domain; default: the accelerator's, 8 for most, 72 for GB200 NVL72, a TPU slice's chips)")] = None,
    tp: Annotated[int, typer.Option(help="Tensor-parallel size")] = 1,
    pp: Annotated[int, typer.Option(help="Pipeline-parallel stages")] = 1,
    dp: Annotated[int | None, typer.Option(help="Data-parallel size (derived from --gpus when omitted)")] = None,
    cp: Annotated[int, typer.Option(help="Context-parallel size")] = 1,
    ep: Annotated[int, typer.Option(help="Expert-parallel size (MoE)")] = 1,
    ep_node_limit: Annotated[int | None, typer.Option(help="Node-limited MoE routing: each token to experts on at most N nodes, sent once per node (DeepSeek-V3: 4; DeepEP); default: no limit (NCCL all-to-all)")] = None,
    ep_overlap: Annotated[bool, typer.Option("--ep-overlap/--no-ep-overlap", help="Expert-parallel all-to-alls hidden behind another micro-batch's compute (DualPipe, Megatron-Core --overlap-moe-expert-parallel-comm); default: exposed")] = False,
    zero: Annotated[int | None, typer.Option(help="ZeRO stage 0-3 (3 = FSDP's FULL_SHARD, 2 = SHARD_GRAD_OP; FSDP has no 1); default: the framework's (3 for fsdp and fsdp1, 0 otherwise)")] = None,
    dp_shard: Annotated[int | None, typer.Option(help="Hybrid sharding (HSDP): ZeRO shards over groups of this many data-parallel ranks and all-reduces across the dp / dp_shard groups (FSDP HYBRID_SHARD, torchtitan data_parallel_shard_degree, Megatron --num-distributed-optimizer-instances, DeepSpeed MiCS); default: all dp ranks")] = None,
    sp: Annotated[bool | None, typer.Option("--sp/--no-sp", help="Sequence parallelism (with TP); plan: off unless --sp; search: on with TP unless --no-sp")] = None,
    mbs: Annotated[int, typer.Option(help="Micro-batch size (sequences)")] = 1,
    gbs: Annotated[int | None, typer.Option(help="Global batch (sequences); gradient accumulation = gbs / (dp x mbs)")] = None,
    seq_len: Annotated[int | None, typer.Option(help="Sequence length (default min(model max, 4096))")] = None,
    recompute: Annotated[RecomputeOpt, typer.Option(help="Activation recomputation: selective re-runs the attention core (Megatron), full each layer, selective-op saves every second matmul and the attention output (torchtitan's per-op checkpointing)")] = RecomputeOpt("none"),
    recompute_layers: Annotated[int | None, typer.Option(help="With --recompute full: recompute only the first N layers of each stage, or virtual stage when interleaved (Megatron's --recompute-method block); default all")] = None,
    recompute_modules: Annotated[str | None, typer.Option(help="With --recompute selective: what it recomputes, comma-separated (Megatron-Core --recompute-modules): core_attn (default), layernorm, mla_up_proj, moe_act")] = None,
    fp8_cache: Annotated[str | None, typer.Option(help="With --precision fp8: saved tensors kept in low precision besides the linears' inputs, comma-separated (DeepSeek-V3 §3.3.3): attn_out (E5M6), moe_act_input (FP8)")] = None,
    fused_kernels: Annotated[bool | None, typer.Option("--fused-kernels/--no-fused-kernels", help="Fused norm and SwiGLU kernels that save only their inputs (Megatron's, Liger Kernel's, Apex's); default: the framework's (on for megatron)")] = None,
    tp_backward_overlap: Annotated[bool | None, typer.Option("--tp-backward-overlap/--no-tp-backward-overlap", help="The backward's TP collectives beside the weight-gradient GEMMs (Megatron's async all-reduce of column-parallel input gradients); default: the framework's (on for megatron)")] = None,
    recompute_early_stop: Annotated[bool | None, typer.Option("--recompute-early-stop/--no-recompute-early-stop", help="Non-reentrant checkpointing stops recomputing before each block's last linear (PyTorch >= 2.1); default: the framework's (on for fsdp)")] = None,
    schedule: Annotated[ScheduleOpt, typer.Option(help="Pipeline schedule")] = ScheduleOpt("1f1b"),
    vpp: Annotated[int | None, typer.Option(help="Virtual stages per GPU (interleaved schedule)")] = None,
    pp_group: Annotated[int | None, typer.Option(help="Interleaved schedule: contiguous micro-batches per virtual stage (Megatron-Core --microbatch-group-size-per-virtual-pipeline-stage, in [pp, micro-batches]; Llama 3's N); default pp")] = None,
    stage_layers: Annotated[str | None, typer.Option(help="Layers per pipeline stage, e.g. 7,8,8,7")] = None,
    precision: Annotated[PrecisionOpt, typer.Option(help="fp32, or 16-bit / fp8 mixed precision with fp32 master weights")] = PrecisionOpt("bf16"),
    grad_dtype: Annotated[GradDtypeOpt | None, typer.Option(help="Override the framework's gradient dtype")] = None,
    master_weights: Annotated[bool, typer.Option("--master-weights/--no-master-weights", help="Keep fp32 master weights under 16-bit mixed precision (default); --no-master-weights: pure 16-bit training, weights and gradients in the compute dtype with no fp32 copy")] = True,
    optimizer_state_dtype: Annotated[GradDtypeOpt | None, typer.Option(help="Optimizer state dtype (AdamW's moments): default fp32, or the weights' dtype under --no-master-weights (torch.optim); Transformer Engine FusedAdam exp_avg_dtype, Megatron --exp-avg-dtype")] = None,
    reduce_dtype: Annotated[GradDtypeOpt | None, typer.Option(help="Dtype of the data-parallel gradient reduction (default: the gradients' own; FSDP reduce_dtype, DeepSpeed communication_data_type)")] = None,
    optimizer: Annotated[OptimizerOpt, typer.Option(help="Optimizer")] = OptimizerOpt("adamw"),
    optimizer_impl: Annotated[OptimizerImplOpt | None, typer.Option(help="How the optimizer step runs: fused (one kernel: Apex/TE FusedAdam, torch fused=True), foreach (torch.optim's default on GPUs) or for-loop (one kernel per operation and tensor); default: the framework's (fused for deepspeed, megatron, fsdp; foreach for fsdp1, torch)")] = None,
    grad_clip: Annotated[float, typer.Option(help="Gradient-norm clipping threshold, 0 = off (Megatron --clip-grad, torchtitan max_norm, DeepSpeed gradient_clipping): each step reads the gradients for their norm and scales them (Megatron only when the norm exceeds it)")] = 1.0,
    offload_optimizer: Annotated[bool, typer.Option("--offload-optimizer", help="Optimizer state and master weights on CPU")] = False,
    offload_params: Annotated[bool, typer.Option("--offload-params", help="Parameters on CPU (ZeRO-3)")] = False,
    attention: Annotated[AttentionOpt, typer.Option(help="auto (what the framework runs: cuDNN for megatron on Hopper, else FlashAttention-2), flash (FlashAttention-2), sdpa (PyTorch SDPA), triton (FlashAttention in Triton, e.g. MPT attn_impl=triton), cudnn (cuDNN fused attention: Transformer Engine's choice on Hopper) or eager (materialised scores)")] = AttentionOpt("auto"),
    fp8_params: Annotated[bool, typer.Option("--fp8-params", help="With --precision fp8: the compute weights held in FP8, no 16-bit copy, gathered in FP8 (Megatron --fp8-param-gather, torchao float8 all-gather)")] = False,
    fused_loss: Annotated[bool, typer.Option("--fused-loss", help="A fused cross-entropy kernel (flash-attn, Apex xentropy, Liger): no fp32 copy of the logits")] = False,
    dropout: Annotated[float, typer.Option(help="Dropout probability (0 = off)")] = 0.0,
    framework: Annotated[FrameworkOpt, typer.Option(help="Byte conventions: deepspeed, megatron, fsdp (FSDP2), fsdp1 (FullyShardedDataParallel) or torch (DDP + autocast)")] = FrameworkOpt("deepspeed"),
    finetune: Annotated[FinetuneOpt, typer.Option(help="full, lora or qlora")] = FinetuneOpt("full"),
    lora_rank: Annotated[int, typer.Option(help="LoRA rank")] = 16,
    lora_targets: Annotated[str, typer.Option(help="LoRA target linears: q,k,v,o,gate,up,down")] = "q,k,v,o,gate,up,down",
    qlora_bits: Annotated[int, typer.Option(help="QLoRA base-weight bits: 4 (NF4) or 8")] = 4,
    lora_dropout: Annotated[float, typer.Option(help="Dropout on each LoRA adapter's input (PEFT's lora_dropout; 0 = off)")] = 0.0,
    overlap_tp: Annotated[bool, typer.Option("--overlap-tp", help="Overlap TP collectives with GEMMs (Megatron --tp-comm-overlap)")] = False,
    overlap_dp: Annotated[bool, typer.Option("--overlap-dp/--no-overlap-dp", help="Reduce gradients during the backward")] = True,
    backward_prefetch: Annotated[BackwardPrefetchOpt, typer.Option(help="ZeRO-3/FSDP: gather the next layer's parameters before the current layer's gradients (pre: overlapped; FSDP2, DeepSpeed, FSDP1 BACKWARD_PRE), after them (post: the gather exposed; FSDP1 BACKWARD_POST, Composer's default) or on demand (none: gather and scatter exposed)")] = BackwardPrefetchOpt("pre"),
    cp_comm: Annotated[CpCommOpt, typer.Option(help="Context-parallel K/V exchange: ring (passed around, overlapped with attention; Megatron/TE) or allgather (gathered before attention, exposed; Llama 3)")] = CpCommOpt("ring"),
    tokens: Annotated[float | None, typer.Option(help="Training tokens (default 20 x parameters, Chinchilla)")] = None,
    price: Annotated[float | None, typer.Option(help="USD per GPU-hour (default: the catalog's)")] = None,
    pue: Annotated[float | None, typer.Option(help="Data-centre power usage effectiveness (default 1.1)")] = None,
    grid_kg_per_kwh: Annotated[float | None, typer.Option(help="Grid carbon intensity, kg CO2 per kWh (default 0.429)")] = None,
    gpu_mtbf_hours: Annotated[float | None, typer.Option(help="Mean time between failures per GPU, hours (default 50,800)")] = None,
    checkpoint_gbs: Annotated[float | None, typer.Option(help="Checkpoint write bandwidth per node, GB/s (default 10)")] = None,
    gpu_profile: Annotated[str | None, typer.Option(help="Path of a calibrated hardware profile (TOML, from `trainplan bench --profile`) to use instead of the defaults")] = None,
    sharp: Annotated[bool, typer.Option("--sharp", help="In-network all-reduce: NVLS inside a node, SHARP across nodes")] = False,
    scale_up_gbs: Annotated[float | None, typer.Option(help="Link between the GPUs of a node (NVLink-class), per GPU, bidirectional GB/s (default: the accelerator's catalog entry)")] = None,
    nic_gbps: Annotated[float | None, typer.Option(help="Network between nodes, per GPU, Gb/s (default: the accelerator's catalog entry; e.g. 100 for 2 x 400G NICs per 8 GPUs)")] = None,
    data_workers: Annotated[int | None, typer.Option(help="Data-loader workers per data-parallel rank (default 8)")] = None,
    tokenize_rate: Annotated[float | None, typer.Option(help="Tokens/s per worker when tokenizing on the fly (default: pre-tokenized data)")] = None,
    storage_gbs: Annotated[float | None, typer.Option(help="Effective storage read GB/s per data-parallel rank (default: not a limit)")] = None,
    data_bytes_per_token: Annotated[float | None, typer.Option(help="Bytes read per token (default 4 for raw text, 2 or 4 for token ids)")] = None,
    h2d_gbs: Annotated[float | None, typer.Option(help="Host-to-device GB/s per GPU (default 25, PCIe Gen4 x16)")] = None,
    host_gbs: Annotated[float | None, typer.Option(help="Host memory GB/s per node, which an offloaded optimizer steps at (default 200)")] = None,
    prefetch: Annotated[bool, typer.Option("--prefetch/--no-prefetch", help="Load the next batches while the step runs")] = True,
    overhead_gib: Annotated[float | None, typer.Option(help="Runtime memory outside the allocator (GiB)")] = None,
    fragmentation: Annotated[float | None, typer.Option(help="Allocator fragmentation, fraction of allocated")] = None,
) -> None:
    """The plan options, declared once: `plan`, `validate` (and later commands) take them all."""


@functools.cache
def _plan_option_names() -> tuple[str, ...]:
    return tuple(inspect.signature(_plan_options).parameters)


def with_plan_options(fn):
    """Give a command every plan option in front of its own; it receives them in `options`.
    (A `ctx: typer.Context` parameter, when present, stays first.) The signature typer reads is
    set when the app is built (_typer_signature)."""
    @functools.wraps(fn)
    def command(**kwargs):
        options = {k: _v(kwargs.pop(k)) for k in _plan_option_names()}
        return fn(options=options, **kwargs)

    command.plan_options_of = fn
    return command


def _typer_signature(command) -> None:
    """The signature typer reads for a command with the plan options: its context, every plan
    option, then its own."""
    fn = getattr(command, "plan_options_of", None)
    if fn is None or "__signature__" in vars(command):
        return
    plan_params = list(inspect.signature(_plan_options, eval_str=True).parameters.values())
    params = [p for p in inspect.signature(fn, eval_str=True).parameters.values() if p.name != "options"]
    head = [p for p in params if p.annotation is typer.Context]
    own = [p for p in params if p.annotation is not typer.Context]
    command.__signature__ = inspect.Signature(head + plan_params + own)


@_command
@with_plan_options
def plan(
    ctx: typer.Context,
    options: dict,
    from_file: Annotated[str | None, typer.Option("--from", help=FROM_HELP)] = None,
    hf_config: Annotated[str | None, typer.Option("--hf-config", help=HF_CONFIG_HELP)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan as JSON")] = False,
    explain: Annotated[bool, typer.Option("--explain", help="Print each term's formula with numbers")] = False,
    timeline: Annotated[str | None, typer.Option(help="Draw the simulated pipeline schedule to a .png or .svg file")] = None,
) -> None:
    """Will it fit, how fast, at what cost? Per-GPU memory per pipeline stage, step time,
    MFU and the whole training run for a model, cluster and layout."""
    from .plan import make_plan
    from .report import evaluate, to_json

    try:
        if timeline is not None:
            check_output_path(timeline, "timeline")  # before any work
        options, imported = _options_from(ctx, options, from_file, hf_config)
        result = evaluate(make_plan(**options))
        data = to_json(result)
        if imported is not None:
            data["import"] = imported
    except PlanError as err:
        _fail(err)
    if timeline:
        from .timeline import draw_timeline

        try:
            draw_timeline(result, timeline)
        except PlanError as err:
            _fail(err)
    if as_json:
        _echo_json(data)
        return
    from .render import render_plan

    render_plan(data)
    if timeline:
        _echo(f"timeline written to {timeline}")
    if explain:
        from .explain import explain_lines, explain_time_lines

        _echo("")
        _echo("\n".join(explain_lines(result)))
        _echo("")
        _echo("\n".join(explain_time_lines(result)))


@_command
@with_plan_options
def validate(
    options: dict,
    layers: Annotated[int | None, typer.Option(help="Run with this many layers (default: the model's, or 2 when scaled down)")] = None,
    hidden: Annotated[int | None, typer.Option(help="Run at this hidden size (default: the model's, or 256 when scaled down)")] = None,
    vocab: Annotated[int | None, typer.Option(help="Run with this vocabulary (default: the model's, or 512 when scaled down)")] = None,
    experts: Annotated[int | None, typer.Option(help="Cap the routed experts (default 8 when scaled down)")] = None,
    device: Annotated[str, typer.Option(help="auto, cpu or cuda")] = "auto",
    impl: Annotated[str, typer.Option(help="reference (trainplan's PyTorch models) or transformers (Hugging Face, random weights)")] = "reference",
    as_json: Annotated[bool, typer.Option("--json", help="Print the comparison as JSON")] = False,
) -> None:
    """Run the plan's model for real in PyTorch and print predicted vs measured per term."""
    from .plan import make_plan

    try:
        plan_ = make_plan(**options)
        _read_inputs(plan_)
        from .validate.run import Scale
        from .validate.run import validate as run_validate

        if impl not in ("reference", "transformers"):
            raise PlanError("impl", f"must be reference or transformers (got {impl!r:.40})")
        if device not in ("auto", "cpu", "cuda"):
            raise PlanError("device", f"must be auto, cpu or cuda (got {device!r:.40})")
        for name, value, high in (("layers", layers, 1024), ("hidden", hidden, 65_536), ("vocab", vocab, 1 << 20),
                                  ("experts", experts, 1024)):
            if value is not None and not 1 <= value <= high:
                raise PlanError(name, f"must be an integer from 1 to {high:,} (a model run for real, here) "
                                f"(got {value})")
        scale = Scale(layers=layers, hidden=hidden, vocab=vocab, experts=experts)
        data = _with_status(lambda progress: run_validate(plan_, scale, device, progress=progress, impl=impl),
                            as_json, "measuring…")
    except PlanError as err:
        _fail(err)
    if as_json:
        _echo_json(data)
        return
    from .render import render_validation

    render_validation(data)


@_command
@with_plan_options
def export(
    ctx: typer.Context,
    options: dict,
    to: Annotated[str, typer.Option("--to", help="megatron (an arguments file for $(cat FILE)), deepspeed (JSON) or torchtitan (a launch script)")] = "megatron",
    output: Annotated[str | None, typer.Option("-o", "--output", help="Write to this file instead of stdout")] = None,
) -> None:
    """Print a ready-to-run configuration for the plan in Megatron-LM, DeepSpeed or torchtitan.
    The plan is made under the target's framework conventions; what the target cannot express
    is refused (exit 2), and what is left to you is noted on stderr."""
    from .export import check_target, export_layout, target_framework
    from .plan import make_plan, resolve

    try:
        if output is not None:
            check_output_path(output, "output")  # before any work
        check_target(to)
        options["framework"] = target_framework(to, options["framework"] if _given(ctx, "framework") else None)
        plan_ = make_plan(**options)
        _read_inputs(plan_)
        result = export_layout(resolve(plan_), to)
        if output is not None:
            write_text_atomic(output, result.text, "output")  # never a partial file
    except PlanError as err:
        _fail(err)
    _emit_export(result, output)


def _given(ctx: typer.Context, name: str) -> bool:
    source = ctx.get_parameter_source(name)
    return source is not None and source.name == "COMMANDLINE"


def _emit_export(result, output: str | None) -> None:
    """The file's text on stdout (or in the file), the notes on stderr."""
    if output is None:
        _echo(result.text, nl=False)
    for note in result.notes:
        _echo(f"note: {note}", err=True)
    if output is not None:
        _echo(f"written to {output}", err=True)


@_command
@with_plan_options
def search(
    ctx: typer.Context,
    options: dict,
    top: Annotated[int, typer.Option(help="How many layouts to show")] = 5,
    objective: Annotated[str, typer.Option(help="time (most tokens per second) or cost (fewest dollars per token: on one accelerator and GPU count the same order; across --compare-gpus, each at its price)")] = "time",
    max_tp: Annotated[int | None, typer.Option(help="Largest TP to try, at least 1 (default: GPUs per node)")] = None,
    pareto: Annotated[bool, typer.Option("--pareto", help="The memory vs throughput Pareto front instead")] = False,
    plot: Annotated[str | None, typer.Option(help="With --pareto or --max-model: draw it to a .png/.svg")] = None,
    max_model: Annotated[bool, typer.Option("--max-model", help="The largest Llama-style model each of DDP and ZeRO-1/2/3 can train here")] = False,
    min_gpus: Annotated[bool, typer.Option("--min-gpus", help="The fewest GPUs that train --tokens within --days")] = False,
    days: Annotated[float | None, typer.Option(help=f"Deadline for --min-gpus, in days (more than 0, at most {MAX_DAYS:,})")] = None,
    compare_gpus: Annotated[str | None, typer.Option(help="Compare accelerators instead of --gpu: the best layout on each of these (comma-separated, or all), ranked by --objective; with --min-gpus, the fewest of each that meet --days")] = None,
    export_to: Annotated[str | None, typer.Option("--export", help="Print the best layout's megatron / deepspeed / torchtitan config")] = None,
    from_file: Annotated[str | None, typer.Option("--from", help=FROM_HELP + "; its model, batch, precision and optimizer are kept, its layout searched unless given alongside")] = None,
    hf_config: Annotated[str | None, typer.Option("--hf-config", help=HF_CONFIG_HELP)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON")] = False,
) -> None:
    """Find the fastest (or cheapest) layout that fits: layout options you give stay fixed,
    the others (TP, PP, CP, EP, ZeRO, micro-batch, recompute, schedule) are searched; or
    compare accelerators (--compare-gpus)."""
    from .export import check_target, target_framework
    from .plan import MAX_GPUS, make_plan
    from .search import LAYOUT_DIMENSIONS
    from .search import search as run_search

    def given(name):
        return _given(ctx, name)

    fixed = {d for d in LAYOUT_DIMENSIONS if given(d)}
    try:
        if not 1 <= top <= 1000:
            raise PlanError("top", "must be between 1 and 1000")
        _check_number("days", days, 0, MAX_DAYS, low_open=True)
        if max_tp is not None and not 1 <= max_tp <= MAX_GPUS:
            raise PlanError("max_tp", f"must be an integer from 1 to {MAX_GPUS:,} (got {max_tp})")
        options, imported = _options_from(ctx, options, from_file, hf_config)
        if export_to is not None:  # ranked under the target's own conventions, in what it can express
            from .export import FIXED_DIMENSIONS

            check_target(export_to, "export")
            options["framework"] = target_framework(export_to, options["framework"] if given("framework") else None)
            fixed |= set(FIXED_DIMENSIONS[export_to])
        plan_ = make_plan(**options)
        _read_inputs(plan_)
        if compare_gpus is not None:
            _compare_gpus(options, compare_gpus, fixed, given("gpu"), pareto or max_model, min_gpus, days,
                          objective, max_tp, export_to, as_json)
            return
        if pareto or max_model or min_gpus:
            _search_variants(plan_, fixed, pareto, max_model, min_gpus, days, plot, max_tp, as_json)
            return
        data = _with_status(lambda progress: run_search(plan_, fixed, top=max(top, EXPORT_CANDIDATES) if export_to
                                                        else top, objective=objective, max_tp=max_tp,
                                                        progress=progress), as_json, "searching…")
        if export_to:
            result = _export_best(plan_, data["best"], export_to)
    except PlanError as err:
        _fail(err)
    if export_to:
        _emit_export(result, None)
        return
    if as_json:
        if imported is not None:
            data["import"] = imported
        _echo_json(data)
        return
    from .render import render_search

    render_search(data)


EXPORT_CANDIDATES = 50  # layouts `search --export` tries, fastest first, for one its target can express


def _export_best(plan_, best: list[dict], target: str):
    """The fastest of the ranked layouts the target can express, exported; when none is, the
    fastest one's refusal."""
    from .export import export_layout
    from .plan import resolve

    first = None
    for row in best:
        par = row["parallel"]
        dims = {k: par[k] for k in ("tp", "pp", "cp", "ep", "zero", "mbs", "gbs", "recompute", "schedule", "sp")}
        dims["vpp"] = par["vpp"] if par["schedule"] == "interleaved" else None
        try:
            return export_layout(resolve(plan_.model_copy(update={**dims, "dp": None, "gpus": row["gpu"]["gpus"]})),
                                 target)
        except PlanError as err:
            first = first or err
    if first is None:
        raise PlanError("export", "no layout fits, so there is nothing to export")
    raise PlanError(first.field, f"none of the {len(best)} fastest layouts exports to {target}; the fastest: "
                    f"{first.rule}")


def _compare_gpus(options, accelerators, fixed, gpu_given, other_variant, min_gpus, days, objective, max_tp,
                  export_to, as_json) -> None:
    from .render import render_gpu_comparison
    from .search import accelerator_plans, compare_gpus

    if gpu_given:
        raise PlanError("compare_gpus", "replaces --gpu: name every accelerator to compare in --compare-gpus")
    if other_variant:
        raise PlanError("compare_gpus", "compares the best layouts (or, with --min-gpus, the fewest GPUs); "
                        "not with --pareto or --max-model")
    if export_to:
        raise PlanError("export", "exports one plan: search one accelerator (--gpu) to export its best layout")
    if min_gpus and days is None:
        raise PlanError("days", "--min-gpus needs --days (the deadline)")
    plans = accelerator_plans(options, accelerators)
    data = _with_status(lambda progress: compare_gpus(plans, fixed, objective=objective, max_tp=max_tp,
                                                      days=days if min_gpus else None, progress=progress),
                        as_json, "comparing accelerators…")
    if as_json:
        _echo_json(data)
    else:
        render_gpu_comparison(data)


def _search_variants(plan_, fixed, pareto, max_model, min_gpus, days, plot, max_tp, as_json) -> None:
    from . import search as S
    from .render import render_max_model, render_min_gpus, render_pareto

    if sum((pareto, max_model, min_gpus)) > 1:
        raise PlanError("search", "choose one of --pareto, --max-model, --min-gpus")
    if min_gpus:
        if days is None:
            raise PlanError("days", "--min-gpus needs --days (the deadline)")
        data = S.min_gpus(plan_, fixed, days, max_tp=max_tp)
        render = render_min_gpus
    elif pareto:
        data = S.pareto(plan_, fixed, max_tp=max_tp)
        render = render_pareto
    else:
        data = S.max_model(plan_)
        render = render_max_model
    if plot:
        from .plots import draw_search_plot

        draw_search_plot(data, plot, "pareto" if pareto else "max_model")
    if as_json:
        data = {k: v for k, v in data.items() if k != "all"}
        _echo_json(data)
    else:
        render(data)
        if plot:
            _echo(f"plot written to {plot}")


@_command
def bench(
    suites: Annotated[list[str] | None, typer.Argument(help="gemm, memory, alignment, fusion, tiling, attention, recompute, collectives (default: all); or `compare [RUN_ID…]`")] = None,
    quick: Annotated[bool, typer.Option("--quick", help="Small sizes (seconds on a CPU)")] = False,
    device: Annotated[str, typer.Option(help="auto, cpu or cuda")] = "auto",
    gpu: Annotated[str | None, typer.Option(help="Catalog accelerator to compare with (percent of peak; needed for --profile)")] = None,
    profile: Annotated[str | None, typer.Option(help="Write a calibrated hardware profile (TOML) for `plan --gpu-profile`")] = None,
    model: Annotated[str | None, typer.Option(help="Also measure this catalog model's GEMM shapes (QKV, attention out, MLP, logits)")] = None,
    tokens: Annotated[int, typer.Option(help=f"Tokens per GEMM for --model (micro-batch x sequence; 1 to {MAX_BENCH_TOKENS:,})")] = 4096,
    plot: Annotated[str | None, typer.Option(help="Draw the GEMM curve, a measured roofline, attention time and memory, and the recompute trade (.png/.svg)")] = None,
    report: Annotated[str | None, typer.Option(help="Write a Markdown report: headline figures with targets, then every suite")] = None,
    db: Annotated[str | None, typer.Option(help="Results store (SQLite; default $XDG_DATA_HOME/trainplan/bench.sqlite)")] = None,
    save: Annotated[bool, typer.Option("--save/--no-save", help="Store the run in the results store")] = True,
    as_json: Annotated[bool, typer.Option("--json", help="Print the results as JSON")] = False,
) -> None:
    """Measure the accelerator (or CPU): GEMM TFLOP/s, memory bandwidth, alignment, fusion,
    tiling, attention, recompute and collectives, each kernel checked against float64 first;
    store the run; optionally write a profile the planner uses instead of defaults.
    `trainplan bench compare [RUN_ID…]` lines up stored runs."""
    import sqlite3

    from .bench import store
    from .bench.run import run_bench, write_profile

    suites = suites or []
    if suites[:1] == ["compare"]:
        try:
            ids = [int(x) for x in suites[1:]]
            if not all(1 <= i < 2 ** 63 for i in ids):
                raise ValueError
        except ValueError:
            _fail(PlanError("run", f"run ids are positive integers (got {' '.join(suites[1:])})"))
        try:
            table = store.compare(store.load(ids or None, db))
        except PlanError as err:
            _fail(err)
        except (OSError, ValueError, KeyError, TypeError, OverflowError, sqlite3.Error) as exc:  # a file that is no results store
            _fail(PlanError("db", f"{db or store.default_path()} is not a trainplan results store "
                            f"({type(exc).__name__}: {exc})"))
        if as_json:
            _echo_json(table)
            return
        from .render import render_bench_compare

        render_bench_compare(table)
        return
    try:
        # refuse a bad output path or a profile without a datasheet before measuring
        for field, path in (("plot", plot), ("report", report), ("profile", profile)):
            if path is not None:
                check_output_path(path, field)
        if plot:
            from .plots import pyplot_for

            pyplot_for(plot, "plot")
        if report:
            from .bench.report import check_path

            check_path(report)
        if not 1 <= tokens <= MAX_BENCH_TOKENS:  # the GEMM's operands are allocated for real
            raise PlanError("tokens", f"must be a positive number of tokens up to {MAX_BENCH_TOKENS:,} (got {tokens})")
        if profile and not gpu:
            raise PlanError("gpu", "a profile compares measurements with a datasheet: name the accelerator with --gpu")
        writer = store.RunWriter(db) if save else None  # opened before measuring; each suite kept as it ends
        try:
            results = _with_status(lambda progress: run_bench(suites, device, quick, gpu, progress=progress,
                                                              model=model, tokens=tokens, store=writer),
                                   as_json, "measuring…")
            run_id = writer.finish() if writer else None
        finally:
            if writer:
                writer.close()
        eff = write_profile(results, profile) if profile else None
        if plot:
            from .bench.plots import draw_bench_plot

            draw_bench_plot(results, plot)
        if report:
            from .bench.report import write_report

            write_report(results, report)
    except PlanError as err:
        _fail(err)
    if as_json:
        _echo_json({**results, "profile": eff, "run_id": run_id})
        return
    from .render import render_bench

    render_bench(results)
    if eff:
        from .bench.run import CURVES

        shape = eff.get("gemm_shape")
        _echo(f"profile written to {profile}: " + ", ".join(f"{k} {v:.3f}" for k, v in eff.items()
                                                              if k not in CURVES)
              + (f", GEMM curve over {len(eff['gemm_curve']['n'])} sizes" if "gemm_curve" in eff else "")
              + (f" and {len(eff['gemm_k_curve']['k'])} inner dimensions" if "gemm_k_curve" in eff else "")
              + (f", GEMM shape fit (main loop {shape['mainloop']:.3f}, k0 {shape['k0']:.0f}, "
                 f"{shape['overhead_us']:.1f} us per kernel, {100 * shape['mean_error']:.1f}% mean error)"
                 if shape else "")
              + (f", FlashAttention curve over {len(eff['flash_curve']['seq'])} sequence lengths"
                 if "flash_curve" in eff else ""))
    if plot:
        _echo(f"figure written to {plot}")
    if report:
        _echo(f"report written to {report}")
    if run_id is not None:
        _echo(f"stored as run {run_id} in {db or store.default_path()}", err=True)


@_command
def serve(
    host: Annotated[str, typer.Option(help="Interface to listen on (loopback by default)")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port")] = 8000,
    allow_host: Annotated[list[str] | None, typer.Option(help="Another name the server may be addressed by (repeatable): requests naming any other host are refused, against DNS rebinding; default: loopback's names and --host")] = None,
) -> None:
    """Serve the parallel-strategy explorer and its JSON API (English and 简体中文)."""
    if not 0 <= port <= 65535:
        _fail(PlanError("port", f"must be a TCP port from 0 to 65535 (got {port})"))
    try:
        import uvicorn

        from .web.app import create_app
        from .web.body import LOOPBACK_HOSTS
    except ImportError:
        _fail(PlanError("serve", "needs the web extra: pip install 'trainplan[web]'"))
    names = LOOPBACK_HOSTS | {host.strip("[]").lower()} | {h.lower() for h in allow_host or []}
    if host in ("0.0.0.0", "::") and not allow_host:
        names = None  # every interface: the names it is reached by are not known
        _echo("warning: on every interface the Host check is off; name the server with --allow-host",
                   err=True)
    _echo(f"trainplan explorer on http://{host}:{port}/  (API: /api/plan, /openapi.json)")
    uvicorn.run(create_app(allowed_hosts=names), host=host, port=port, log_level="warning")


@_command
def models(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """List the model catalog with exact parameter counts."""
    from .specs.catalog import model_rows

    rows = model_rows()
    if as_json:
        _echo_json(rows)
        return
    from .render import render_models

    render_models(rows)


@_command
def gpus(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """List the accelerator catalog, with the time model's error on each one's published runs."""
    from .estimate.accuracy import prediction_accuracy
    from .specs.catalog import gpu_rows

    rows = [{**g, "accuracy": prediction_accuracy(g["name"])} for g in gpu_rows()]
    if as_json:
        _echo_json(rows)
        return
    from .render import render_gpus

    render_gpus(rows)


@functools.cache
def _typer_app() -> typer.Typer:
    """The typer app of every command (typer imported here, and made the name the commands'
    option declarations use)."""
    global typer
    import typer

    app = typer.Typer(cls=_one_line_errors(), add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                      pretty_exceptions_enable=False, help=HELP)
    app.callback()(_top)
    for command in _COMMANDS:
        _typer_signature(command)
        app.command()(command)
    return app


def __getattr__(name: str):
    if name == "app":  # `from trainplan.cli import app`: the typer app, built on first use
        return _typer_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _app_for(args: list[str]) -> typer.Typer:
    """The app with only the command the command line names (building the click commands of
    all of them, some 300 options, is a good part of start-up); the whole app when the first
    argument names none (no command, --help, a mistyped one: the group lists or suggests them)."""
    app = _typer_app()
    name = args[0] if args else None
    chosen = [c for c in app.registered_commands if (c.name or c.callback.__name__) == name]
    if len(chosen) != 1:
        return app
    one = typer.Typer(cls=_one_line_errors(), add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                      pretty_exceptions_enable=False, help=app.info.help)
    one.registered_commands = chosen
    one.callback()(lambda: None)  # a group, as the whole app is, not a lone command
    return one


FAST_COMMANDS = ("plan", "models", "gpus", "search", "export")
FAST_REFUSED = frozenset({"--from", "--hf-config"})  # they read files that print notes: typer's path


@functools.cache
def _fast_params(name: str):
    """The parameters of a fast-path command as cli_fast reads them, or None."""
    command = next(c for c in _COMMANDS if c.__name__ == name)
    fn = getattr(command, "plan_options_of", None)
    if fn is None:
        return command, cli_fast.read_params(command, globals())
    own = cli_fast.read_params(fn, globals(), skip=("options",))
    plan = cli_fast.read_params(_plan_options, globals())
    if own is None or plan is None:
        return command, None
    return command, [p for p in own if p.is_context] + plan + [p for p in own if not p.is_context]


def _fast(args: list[str]):
    """(command, keyword arguments) when the fast path reads this command line, else None."""
    if not args or args[0] not in FAST_COMMANDS:
        return None
    command, params = _fast_params(args[0])
    if params is None:
        return None
    kwargs = cli_fast.parse(params, args[1:], FAST_REFUSED)
    return None if kwargs is None else (command, kwargs)


def main() -> None:
    # numpy's bundled OpenBLAS starts a thread per core when numpy is imported, which costs the
    # process about 0.1 CPU-s on two cores, more on more; the planner's arrays need no BLAS
    # threads (element-wise work and one tiny least-squares fit), so the command asks for one
    # unless the user chose a number (OpenBLAS reads OPENBLAS_NUM_THREADS before OMP_NUM_THREADS)
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    args = sys.argv[1:]
    try:
        fast = _fast(args)
        if fast is not None:
            cli_fast.run(*fast)
        _app_for(args)()
    except PlanError as err:  # raised outside a command body (e.g. a broken catalog)
        print(f"error: {err}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)


if __name__ == "__main__":
    main()
