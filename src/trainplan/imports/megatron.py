"""Megatron-LM launch scripts and arguments files as plans.

The flags and their defaults are Megatron-LM's (megatron/training/arguments.py): a flag that is
absent means Megatron's default, not trainplan's (dropout 0.1, no overlapped gradient
reduction, fp32 without --bf16/--fp16; the model's defaults: megatron_model.py).
The model is the catalog's when its architecture matches one (the vocabulary, when the
arguments fix it, included), else a Hugging Face configuration built from the flags.
"""

from __future__ import annotations

import math
from pathlib import Path

from ..errors import PlanError
from ..plan_types import RecomputeModule
from . import Imported, bad, defaults
from .megatron_model import model_options
from .shell import command_words

# flags that take no value (megatron/training/arguments.py store_true / store_false)
SWITCHES = {
    "--bf16", "--fp16", "--swiglu", "--sequence-parallel", "--group-query-attention", "--use-distributed-optimizer",
    "--overlap-grad-reduce", "--overlap-param-gather", "--tp-comm-overlap", "--use-flash-attn",
    "--untie-embeddings-and-output-weights", "--disable-bias-linear", "--add-qkv-bias", "--qk-layernorm",
    "--cross-entropy-loss-fusion", "--recompute-activations", "--optimizer-cpu-offload", "--multi-latent-attention",
    "--grad-reduce-in-bf16", "--use-precision-aware-optimizer", "--use-torch-fsdp2", "--use-megatron-fsdp",
    "--no-position-embedding", "--use-rotary-position-embeddings", "--moe-router-enable-expert-bias",
    "--moe-shared-expert-gate", "--fp8-param-gather", "--overlap-moe-expert-parallel-comm",
}
# switches that shape the model (replaced by a model named alongside)
MODEL_SWITCHES = {"--swiglu", "--group-query-attention", "--untie-embeddings-and-output-weights", "--disable-bias-linear",
                  "--add-qkv-bias", "--qk-layernorm", "--multi-latent-attention", "--no-position-embedding",
                  "--use-rotary-position-embeddings", "--moe-router-enable-expert-bias", "--moe-shared-expert-gate"}
# flags read but not part of a plan: data, tokenizer files, schedule of the learning rate,
# logging, checkpoints, initialisation, numerics that change no byte or FLOP trainplan counts
NOT_PLANNED_PREFIXES = (
    "--lr", "--min-lr", "--decoupled-", "--weight-decay", "--adam-", "--sgd-momentum", "--init-method", "--train-",
    "--data-", "--split", "--vocab-file", "--merge-file", "--tokenizer-", "--tiktoken-", "--mock-data", "--save",
    "--load", "--no-load-", "--log-", "--eval-", "--tensorboard-", "--wandb-", "--num-workers", "--seed",
    "--distributed-timeout", "--distributed-backend", "--ckpt-", "--exit-", "--manual-gc", "--empty-unused-memory",
    "--use-mcore-models", "--use-legacy-models", "--profile", "--timing-log", "--use-checkpoint-", "--no-masked-softmax",
    "--no-bias-", "--no-gradient-accumulation-fusion", "--no-persist-layer-norm", "--no-rope-fusion",
    "--moe-aux-loss-coeff", "--moe-z-loss-coeff", "--moe-router-load-balancing-type", "--moe-token-dispatcher-type",
    "--moe-grouped-gemm", "--moe-router-dtype", "--moe-router-score-function", "--moe-router-pre-softmax",
    "--moe-permute-fusion", "--moe-input-jitter", "--moe-router-topk-scaling-factor", "--moe-router-bias-update-rate",
    "--rotary-base", "--rotary-percent", "--rotary-scaling-factor", "--use-rope-scaling", "--rotary-interleaved",
    "--apply-layernorm-1p", "--norm-epsilon", "--layernorm-epsilon", "--calculate-per-token-loss",
    "--no-create-attention-mask-in-dataloader", "--no-mmap-bin-files", "--attention-softmax-in-fp32",
    "--accumulate-allreduce-grads-in-fp32", "--fp8-amax-", "--fp8-margin", "--fp8-interval", "--fp8-recipe",
    "--transformer-impl", "--te-rng-tracker", "--make-vocab-size-divisible-by", "--reset-", "--eod-mask-loss",
    "--override-opt_param-scheduler", "--use-checkpoint-opt_param-scheduler", "--rampup-batch-size",
    "--check-for-nan-in-loss-and-grad", "--dataloader-type", "--object-storage-", "--finetune", "--pretrained-",
    "--bias-gelu-fusion", "--bias-swiglu-fusion", "--masked-softmax-fusion", "--async-save", "--no-save-",
    "--ddp-bucket-size", "--ddp-average-in-collective", "--tp-comm-", "--record-memory-history", "--memory-snapshot",
    "--log", "--wandb", "--enable-", "--use-pytorch-profiler", "--straggler-", "--rerun-", "--full-validation",
    "--mid-level-dataset-surplus", "--per-split-data-args-path", "--moe-router-num-groups", "--moe-router-group-topk",
    "--moe-shared-expert-overlap", "--moe-router-fusion", "--moe-token-drop-policy", "--moe-pad-expert-input-to-capacity",
    "--moe-flex-dispatcher-backend", "--moe-router-force-load-balancing", "--moe-enable-deepep", "--moe-deepep-num-sms",
    "--mtp-loss-scaling-factor", "--mscale", "--rope-type", "--beta-fast", "--beta-slow", "--original-max-position-embeddings", "--rope-scaling-factor",
)
# flags whose names say they shape the model: refused when not understood (the plan would be of
# another model)
MODEL_PREFIXES = (
    "--num-", "--hidden-", "--ffn-", "--kv-", "--qk-", "--q-", "--v-head", "--multi-", "--mla-", "--mtp-", "--moe-",
    "--position-embedding", "--normalization", "--group-query", "--squared-relu", "--openai-gelu", "--untie",
    "--add-", "--disable-bias", "--spec", "--hybrid-", "--heterogeneous-", "--is-hybrid", "--mamba", "--window-",
    "--sliding", "--yarn", "--expert-", "--attention-", "--softmax-", "--linear-attention", "--experimental-",
    "--decoder-", "--encoder-", "--max-position", "--rope-", "--use-rotary", "--vocab",
)
# Megatron-Core --recompute-modules that trainplan models (transformer_config.py)
RECOMPUTE_MODULES = RecomputeModule.__args__
def parse_flags(words: list[str]) -> tuple[dict[str, list[str]], list[str]]:
    """Flags with their values (the last of a repeated flag wins, as argparse's), and stray words."""
    flags: dict[str, list[str]] = {}
    stray: list[str] = []
    name = None
    for w in words:
        if w.startswith("--") and len(w) > 2 and not _is_number(w):
            key, eq, val = w.partition("=")
            flags[key] = [val] if eq else []
            name = None if eq or key in SWITCHES else key
        elif name is not None:
            flags[name].append(w)
        else:
            stray.append(w)
    return flags, stray


def _is_number(w: str) -> bool:
    try:
        float(w)
        return True
    except ValueError:
        return False


class Flags:
    """Typed access to the flags, remembering which were used."""

    def __init__(self, flags: dict[str, list[str]]):
        self.flags = flags
        self.used: set[str] = set()

    def has(self, name: str) -> bool:
        if name in self.flags:
            self.used.add(name)
            return True
        return False

    def str(self, name: str, default=None):
        if name not in self.flags:
            return default
        self.used.add(name)
        values = self.flags[name]
        if len(values) != 1:
            raise bad(name.lstrip("-"), f"{name} takes one value (got {len(values)}: {' '.join(values)[:60]!r})")
        return values[0]

    def int(self, name: str, default=None):
        v = self.str(name)
        if v is None:
            return default
        try:
            return int(v)
        except ValueError:
            raise bad(name.lstrip("-"), f"{name} must be an integer (got {v!r:.40})") from None

    def float(self, name: str, default=None):
        v = self.str(name)
        if v is None:
            return default
        try:
            out = float(v)
        except ValueError:
            out = math.nan
        if not math.isfinite(out):
            raise bad(name.lstrip("-"), f"{name} must be a finite number (got {v!r:.40})")
        return out


def _stage_layers(f: Flags, layers: int | None, pp: int) -> list[int] | None:
    first = f.int("--decoder-first-pipeline-num-layers")
    last = f.int("--decoder-last-pipeline-num-layers")
    if first is None and last is None:
        return None
    if layers is None:
        raise bad("decoder-first-pipeline-num-layers", "an uneven pipeline split needs --num-layers in the arguments")
    ends = (first is not None) + (last is not None)
    middle = layers - (first or 0) - (last or 0)
    stages = pp - ends
    if stages < 0 or (stages == 0 and middle) or (stages and (middle < 0 or middle % stages)):
        raise bad("decoder-first-pipeline-num-layers", f"{layers} layers with first {first} and last {last} do not "
                  f"split evenly over the other {stages} of {pp} stages (Megatron-LM's rule)")
    rest = [middle // stages] * stages if stages else []
    return ([first] if first is not None else []) + rest + ([last] if last is not None else [])


def _recompute(f: Flags, out: dict, unknown: list[str]) -> None:
    gran = f.str("--recompute-granularity")
    if f.has("--recompute-activations"):
        gran = "selective"
    if gran is None:
        return
    if gran not in ("full", "selective"):
        raise bad("recompute-granularity", f"must be full or selective (got {gran!r:.40})")
    out["recompute"] = gran
    method, n = f.str("--recompute-method"), f.int("--recompute-num-layers")
    if gran == "full":
        if method == "block" and n is not None:
            out["recompute_layers"] = n
        elif method == "uniform" and n not in (None, 1):
            unknown.append(f"--recompute-num-layers {n} with uniform (chunks of layers; planned as each layer)")
    modules = f.flags.get("--recompute-modules")
    if modules is not None:
        f.used.add("--recompute-modules")
        known = [m for m in modules if m in RECOMPUTE_MODULES]
        unknown += [f"--recompute-modules {m}" for m in modules if m not in RECOMPUTE_MODULES]
        if known and gran == "selective":
            out["recompute_modules"] = known


def _precision(f: Flags, out: dict) -> None:
    out["precision"] = "bf16" if f.has("--bf16") else "fp16" if f.has("--fp16") else "fp32"
    fmt = f.str("--fp8-format")
    if fmt is not None:
        if fmt not in ("hybrid", "e4m3"):
            raise bad("fp8-format", f"--fp8-format {fmt!r:.40} is not planned; planned: hybrid, e4m3")
        out["precision"] = "fp8"
    if f.has("--grad-reduce-in-bf16"):
        out["grad_dtype"] = "bf16"
    dtypes = {"fp32": "fp32", "bf16": "bf16", "fp16": "fp16"}
    for flag, key in (("--megatron-fsdp-main-grads-dtype", "grad_dtype"), ("--megatron-fsdp-grad-comm-dtype",
                                                                             "reduce_dtype")):
        value = f.str(flag)
        if value is not None:
            if value not in dtypes:
                raise bad(flag.lstrip("-"), f"{flag} must be fp32, bf16 or fp16 (got {value!r:.40})")
            out[key] = dtypes[value]
    if f.has("--use-precision-aware-optimizer"):
        dt = {"bf16": "bf16", "fp16": "fp16", "fp32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16",
              "torch.float32": "fp32"}
        exp = f.str("--exp-avg-dtype", "fp32")
        f.str("--exp-avg-sq-dtype")
        if exp not in dt:
            raise bad("exp-avg-dtype", f"--exp-avg-dtype {exp!r:.40} is not planned; planned: fp32, bf16, fp16")
        if dt[exp] != "fp32":
            out["optimizer_state_dtype"] = dt[exp]


def _layout(f: Flags, out: dict, layers: int | None, unknown: list[str]) -> None:
    for flag, key in (("--tensor-model-parallel-size", "tp"), ("--pipeline-model-parallel-size", "pp"),
                      ("--context-parallel-size", "cp"), ("--expert-model-parallel-size", "ep"),
                      ("--micro-batch-size", "mbs"), ("--global-batch-size", "gbs"), ("--seq-length", "seq_len"),
                      ("--microbatch-group-size-per-virtual-pipeline-stage", "pp_group")):
        v = f.int(flag)
        if v is not None:
            out[key] = v
    etp = f.int("--expert-tensor-parallel-size")
    if etp is not None and etp != out.get("tp", 1):
        unknown.append(f"--expert-tensor-parallel-size {etp} (planned: experts split by TP {out.get('tp', 1)})")
    if f.has("--sequence-parallel"):
        out["sp"] = True
    pp = out.get("pp", 1)
    split = _stage_layers(f, layers, pp)
    if split is not None:
        out["stage_layers"] = split
    per_virtual = f.int("--num-layers-per-virtual-pipeline-stage")
    vpp = f.int("--virtual-pipeline-model-parallel-size")
    if per_virtual is not None:
        stage = (split or [layers // pp if layers else 0])[0]
        if not stage or stage % per_virtual:
            raise bad("num-layers-per-virtual-pipeline-stage", f"must divide the layers of each stage ({stage})")
        vpp = stage // per_virtual
    if vpp and vpp > 1:
        out.update(schedule="interleaved", vpp=vpp)
    distributed_optimizer = f.has("--use-distributed-optimizer")
    if f.has("--use-torch-fsdp2"):
        out["zero"] = 3
    elif f.has("--use-megatron-fsdp"):
        strategy = f.str("--data-parallel-sharding-strategy", "optim_grads_params")
        stages = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}
        if strategy not in stages:
            raise bad("data-parallel-sharding-strategy", f"must be one of {', '.join(stages)} (got {strategy!r:.40})")
        out["zero"] = stages[strategy]
    elif distributed_optimizer:
        out["zero"] = 1
    else:
        out["zero"] = 0
    instances = f.int("--num-distributed-optimizer-instances")
    if instances and instances > 1:
        out["_optimizer_instances"] = instances


def read_megatron(text: str, path: Path, model_given: bool = False) -> Imported:
    read = command_words(text)
    flags, stray = parse_flags(read.words)
    if not flags:
        raise bad("", f"{path} has no Megatron-LM arguments (a `torchrun ... pretrain_gpt.py --num-layers ...` line, "
                  "or --flags one after another)")
    script = Path(read.script).name if read.script else None
    if script and script.startswith("pretrain_") and not script.startswith("pretrain_gpt"):
        raise bad("", f"{path} runs {script}: trainplan plans decoder-only GPT-style models (pretrain_gpt.py), "
                  f"not the model {script} trains")
    f = Flags(flags)
    notes: list[str] = [f"read the arguments of {read.script}"] if read.script else []
    if read.from_vars:
        notes.append(f"no training command: read the flags of ${', $'.join(read.from_vars)}")
    unknown = [f"{u}" for u in read.unsure] + [f"stray word {w!r}" for w in stray[:5]]
    out: dict = {"framework": "megatron"}
    _layout(f, out, f.int("--num-layers"), unknown)
    if not model_given:
        out.update(model_options(f, out.get("tp", 1), path, notes))
    _precision(f, out)
    _recompute(f, out, unknown)
    opt = f.str("--optimizer", "adam")
    optimizers = {"adam": "adamw", "sgd": "sgd-momentum"}  # Megatron's adam is AdamW (decoupled weight decay)
    if opt not in optimizers:
        raise bad("optimizer", f"--optimizer {opt!r:.40} is not planned; planned: adam, sgd")
    out["optimizer"] = optimizers[opt]
    if opt == "sgd" and f.float("--sgd-momentum", 0.9) == 0:
        out["optimizer"] = "sgd"
    out["offload_optimizer"] = f.has("--optimizer-cpu-offload")
    out["overlap_dp"] = f.has("--overlap-grad-reduce")  # Megatron-LM's default: not overlapped
    f.has("--overlap-param-gather")
    out["overlap_tp"] = f.has("--tp-comm-overlap")
    out["ep_overlap"] = f.has("--overlap-moe-expert-parallel-comm")
    out["fused_loss"] = f.has("--cross-entropy-loss-fusion")
    backend = f.str("--attention-backend")
    backends = {"flash": "flash", "fused": "cudnn", "unfused": "eager", "local": "eager", "auto": None}
    if backend is not None and backend not in backends:
        raise bad("attention-backend", f"must be one of {', '.join(backends)} (got {backend!r:.40})")
    if backends.get(backend):
        out["attention"] = backends[backend]
    f.has("--use-flash-attn")
    meg = defaults()["megatron"]
    attn, hidden = f.float("--attention-dropout", meg["dropout"]), f.float("--hidden-dropout", meg["dropout"])
    if attn != hidden:
        notes.append(f"attention dropout {attn:g} and hidden dropout {hidden:g}: planned with {hidden:g} for both")
    out["dropout"] = hidden
    out["grad_clip"] = f.float("--clip-grad", meg["clip_grad"])
    capacity = f.str("--moe-expert-capacity-factor")
    if capacity is not None:
        unknown.append(f"--moe-expert-capacity-factor {capacity} (planned without a capacity: no token dropped)")
    out["fp8_params"] = f.has("--fp8-param-gather")
    ramps = [k for k in ("--rampup-batch-size", "--step-batch-size-schedule") if f.has(k)]
    if ramps:
        notes.append(f"{', '.join(ramps)}: planned at the final global batch {out.get('gbs', '(default)')}")
    gpus = launcher_gpus(read.launcher)
    if gpus:
        out["gpus"] = gpus
        notes.append(f"{gpus} GPUs from the launcher (--nproc_per_node x --nnodes); give --gpus for another count")
    instances = out.pop("_optimizer_instances", None)
    if instances:
        dp = (out.get("gpus") or 0) // (out.get("tp", 1) * out.get("pp", 1) * out.get("cp", 1))
        if not dp or dp % instances:
            unknown.append(f"--num-distributed-optimizer-instances {instances} (the data-parallel size is not known)")
        else:
            out["dp_shard"] = dp // instances
    ignored, refused, replaced = [], [], []
    for name in flags:
        if name in f.used:
            continue
        if name.startswith(NOT_PLANNED_PREFIXES):
            ignored.append(name)
        elif model_given and (name.startswith(MODEL_PREFIXES) or name in MODEL_SWITCHES):
            replaced.append(name)
        elif name in SWITCHES:
            ignored.append(name)
        elif name.startswith(MODEL_PREFIXES):
            refused.append(name)
        else:
            unknown.append(name)
    if refused and not model_given:
        raise PlanError(f"from.{refused[0].lstrip('-')}", f"{', '.join(refused)} shape{'s' if len(refused) == 1 else ''} "
                        "the model and trainplan does not understand "
                        f"{'it' if len(refused) == 1 else 'them'}: the plan would be of another model (name the model "
                        "with --model or --hf-config to plan it anyway)")
    if replaced:
        notes.append(f"the model named alongside replaces the file's: {', '.join(replaced)}")
    return Imported("megatron", out, ignored=ignored, unknown=unknown, notes=notes)


def launcher_gpus(launcher: list[str]) -> int | None:
    """GPUs the torchrun line starts: --nproc_per_node x --nnodes (integers only)."""
    flags, _ = parse_flags(launcher[1:])
    per = (flags.get("--nproc_per_node") or flags.get("--nproc-per-node") or [None])[0]
    nodes = (flags.get("--nnodes") or ["1"])[0]
    if per and per.isdigit() and nodes.isdigit():
        return int(per) * int(nodes)
    return None
