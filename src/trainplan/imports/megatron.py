"""Megatron-LM launch scripts and arguments files as plans.

The flags and their defaults are Megatron-LM's (megatron/training/arguments.py): a flag that is
absent means Megatron's default, not trainplan's (dropout 0.1, no overlapped gradient
reduction, fp32 without --bf16/--fp16, the feed-forward width of `_add_network_size_args`).
The model is the catalog's when its architecture matches one (the vocabulary, when the
arguments fix it, included), else a Hugging Face configuration built from the flags.
"""

from __future__ import annotations

import math
from pathlib import Path

from ..errors import PlanError
from ..plan_types import RecomputeModule
from ..specs import catalog
from . import Imported, bad
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
    "--mid-level-dataset-surplus", "--per-split-data-args-path",
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
TOKENIZER_VOCAB = {  # vocabularies of tokenizers Megatron-LM names, before its padding
    "GPT2BPETokenizer": 50257,  # GPT-2's BPE (gpt2-vocab.json)
    "Llama2Tokenizer": 32000,  # Llama 2's SentencePiece model
}
# Megatron-Core --recompute-modules that trainplan models (transformer_config.py)
RECOMPUTE_MODULES = RecomputeModule.__args__
# the architecture fields compared with the catalog
ARCH = ("layers", "hidden", "heads", "n_kv_heads", "dim_head", "ffn", "mlp", "tied_embeddings", "norm", "position",
        "qkv_bias", "bias", "qk_norm", "parallel_residual", "experts", "top_k", "shared_experts", "first_dense_layers",
        "moe_layer_freq", "kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")


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


class _Flags:
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


def _ffn_default(hidden: int, swiglu: bool) -> int:
    """Megatron-LM's feed-forward width when --ffn-hidden-size is absent (arguments.py
    validate_args: 4h, or for SwiGLU int(4h * 2/3 / 64) * 64)."""
    return int(4 * hidden * 2 / 3 / 64) * 64 if swiglu else 4 * hidden


def padded_vocab(vocab: int, divisible_by: int, tp: int) -> int:
    """Megatron-LM pads the vocabulary to a multiple of --make-vocab-size-divisible-by x TP
    (megatron/training/tokenizer/tokenizer.py _vocab_size_with_padding)."""
    multiple = divisible_by * tp
    return -(-vocab // multiple) * multiple


def _moe_layer_freq(text: str | None, layers: int) -> tuple[int, int]:
    """--moe-layer-freq as (first dense layers, frequency): an integer, or a pattern such as
    ([0]*3+[1]*58) (Megatron evaluates it as Python)."""
    if text is None:
        return 0, 1
    text = text.strip()
    if text.isdigit():
        return 0, int(text)
    import re

    m = re.fullmatch(r"\(?\[0\]\s*\*\s*(\d+)\s*\+\s*\[1\]\s*\*\s*(\d+)\)?", text.replace(" ", ""))
    if m and int(m.group(1)) + int(m.group(2)) == layers:
        return int(m.group(1)), 1
    raise bad("moe-layer-freq", f"--moe-layer-freq {text!r:.60}: only an integer or ([0]*K+[1]*N) with K+N layers "
              "(dense first layers, then MoE) is planned")


def model_fields(f: _Flags, tp: int, notes: list[str]) -> dict:
    """The model the flags describe, as ModelSpec fields (vocab None when the flags do not fix it)."""
    layers, hidden, heads = (f.int(k) for k in ("--num-layers", "--hidden-size", "--num-attention-heads"))
    missing = [k for k, v in (("--num-layers", layers), ("--hidden-size", hidden), ("--num-attention-heads", heads))
               if v is None]
    if missing:
        raise bad("model", f"the arguments do not describe a model ({', '.join(missing)} missing): name it with "
                  "--model or --hf-config")
    swiglu = f.has("--swiglu")
    gqa = f.has("--group-query-attention")
    groups = f.int("--num-query-groups")
    kv_channels = f.int("--kv-channels")
    position = f.str("--position-embedding-type", "learned_absolute")
    if f.has("--use-rotary-position-embeddings"):
        position = "rope"
    f.has("--no-position-embedding")  # with rope: no learned table, as rope implies
    positions = {"learned_absolute": "learned", "rope": "rotary", "none": "none", "mrope": None}
    if positions.get(position) is None:
        raise bad("position-embedding-type", f"--position-embedding-type {position!r:.40} is not planned; "
                  "planned: learned_absolute, rope, none")
    norm = f.str("--normalization", "LayerNorm")
    if norm not in ("LayerNorm", "RMSNorm"):
        raise bad("normalization", f"--normalization {norm!r:.40} is not planned; planned: LayerNorm, RMSNorm")
    bias = not f.has("--disable-bias-linear")
    d = dict(layers=layers, hidden=hidden, heads=heads, kv_heads=groups if gqa and groups else heads,
             head_dim=kv_channels if kv_channels and kv_channels * heads != hidden else None,
             ffn=f.int("--ffn-hidden-size") or _ffn_default(hidden, swiglu), mlp="swiglu" if swiglu else "gelu",
             tied_embeddings=not f.has("--untie-embeddings-and-output-weights"),
             norm="rmsnorm" if norm == "RMSNorm" else "layernorm", position=positions[position],
             bias=bias, qkv_bias=bias or f.has("--add-qkv-bias"), qk_norm=f.has("--qk-layernorm"),
             max_position=f.int("--max-position-embeddings") or f.int("--seq-length") or 4096)
    experts = f.int("--num-experts")
    if experts:
        first, freq = _moe_layer_freq(f.str("--moe-layer-freq"), layers)
        shared = f.int("--moe-shared-expert-intermediate-size")
        d.update(experts=experts, top_k=f.int("--moe-router-topk", 2),
                 expert_ffn=f.int("--moe-ffn-hidden-size") or d["ffn"], first_dense_layers=first, moe_layer_freq=freq,
                 shared_experts=1 if shared else 0, shared_expert_ffn=shared or None,
                 shared_expert_gate=f.has("--moe-shared-expert-gate"),
                 router_bias=f.has("--moe-router-enable-expert-bias"))
    if f.has("--multi-latent-attention"):
        d.update(kv_heads=None, head_dim=None, q_lora_rank=f.int("--q-lora-rank"),
                 kv_lora_rank=f.int("--kv-lora-rank", 32), qk_nope_head_dim=f.int("--qk-head-dim", 128),
                 qk_rope_head_dim=f.int("--qk-pos-emb-head-dim", 64), v_head_dim=f.int("--v-head-dim", 128))
    vocab = f.int("--vocab-size")
    tokenizer = f.str("--tokenizer-type")
    if vocab is None and tokenizer is None and f.has("--vocab-file") and f.has("--merge-file"):
        tokenizer = "GPT2BPETokenizer"  # a BPE vocabulary and merges: GPT-2's tokenizer
    if vocab is None and tokenizer in TOKENIZER_VOCAB:
        vocab = TOKENIZER_VOCAB[tokenizer]
        notes.append(f"vocabulary {vocab:,} ({tokenizer})")
    d["vocab"] = vocab
    if vocab is not None:
        d["padded_vocab"] = padded_vocab(vocab, f.int("--make-vocab-size-divisible-by", 128), tp)
    return d


def _arch(spec) -> dict:
    return {k: getattr(spec, k) for k in ARCH}


def match_catalog(d: dict) -> list:
    """Catalog models of exactly this architecture (and vocabulary, raw or padded, when known)."""
    from ..specs.model import ModelSpec

    fields = {k: v for k, v in d.items() if k not in ("padded_vocab",) and v is not None}
    fields.setdefault("vocab", 1)
    try:
        probe = ModelSpec(name="probe", source="flags", **fields)
    except Exception as exc:  # noqa: BLE001 - pydantic's error, reworded
        raise bad("model", f"the arguments' model is inconsistent ({str(exc).splitlines()[-1][:160]})") from None
    want = _arch(probe)
    out = [m for m in catalog.models() if _arch(m) == want
           and (d["vocab"] is None or m.vocab in (d["vocab"], d.get("padded_vocab")))]
    # the same shape under several names (GPT-3 and Megatron's padded GPT-3; Llama 3 and 3.1):
    # the one of Megatron's padded vocabulary, then of the same context length
    return sorted(out, key=lambda m: (m.vocab != d.get("padded_vocab"), m.max_position != d["max_position"]))


def hf_config(d: dict, name: str) -> dict:
    """A Hugging Face configuration of the model the flags describe (for a model not in the
    catalog): Llama-style dense, Mixtral-style MoE, DeepSeek-V3-style MLA, or GPT-2-style."""
    vocab = d.get("padded_vocab") or d["vocab"]
    if d.get("kv_lora_rank"):
        return {"model_type": "deepseek_v3", "_name_or_path": name, "num_hidden_layers": d["layers"],
                "hidden_size": d["hidden"], "num_attention_heads": d["heads"], "intermediate_size": d["ffn"],
                "vocab_size": vocab, "max_position_embeddings": d["max_position"],
                "tie_word_embeddings": d["tied_embeddings"], "n_routed_experts": d.get("experts", 0),
                "num_experts_per_tok": d.get("top_k"), "moe_intermediate_size": d.get("expert_ffn"),
                "n_shared_experts": 1 if d.get("shared_experts") else 0,
                "first_k_dense_replace": d.get("first_dense_layers", 0), "moe_layer_freq": d.get("moe_layer_freq", 1),
                "topk_method": "noaux_tc" if d.get("router_bias") else "greedy", "q_lora_rank": d.get("q_lora_rank"),
                "kv_lora_rank": d["kv_lora_rank"], "qk_rope_head_dim": d["qk_rope_head_dim"],
                "qk_nope_head_dim": d["qk_nope_head_dim"], "v_head_dim": d["v_head_dim"]}
    if d["mlp"] == "gelu":
        if not (d["bias"] and d["tied_embeddings"] and d["position"] == "learned" and d["norm"] == "layernorm"):
            raise bad("model", "a GELU model without biases, tied embeddings, learned positions and LayerNorm matches "
                      "no catalog model: name it with --model or --hf-config")
        return {"model_type": "gpt2", "_name_or_path": name, "n_layer": d["layers"], "n_embd": d["hidden"],
                "n_head": d["heads"], "n_inner": d["ffn"], "vocab_size": vocab, "n_positions": d["max_position"]}
    if d["position"] != "rotary" or d["norm"] != "rmsnorm" or d.get("shared_experts") or d["qk_norm"]:
        raise bad("model", "this SwiGLU model (its positions, norm, shared experts or QK norm) matches no catalog "
                  "model: name it with --model or --hf-config")
    cfg = {"model_type": "mixtral" if d.get("experts") else "llama", "_name_or_path": name,
           "num_hidden_layers": d["layers"], "hidden_size": d["hidden"], "num_attention_heads": d["heads"],
           "num_key_value_heads": d["kv_heads"], "head_dim": d["head_dim"], "intermediate_size": d["ffn"],
           "vocab_size": vocab, "max_position_embeddings": d["max_position"],
           "tie_word_embeddings": d["tied_embeddings"], "attention_bias": d["qkv_bias"], "mlp_bias": d["bias"]}
    if d.get("experts"):
        if d["expert_ffn"] != d["ffn"] or d.get("first_dense_layers") or d.get("moe_layer_freq", 1) != 1:
            raise bad("model", "this MoE model (its expert width or dense layers) matches no catalog model: name it "
                      "with --model or --hf-config")
        cfg.update(num_local_experts=d["experts"], num_experts_per_tok=d["top_k"])
    return cfg


def _model(f: _Flags, tp: int, path: Path, notes: list[str]) -> dict:
    d = model_fields(f, tp, notes)
    found = match_catalog(d)
    if found:
        m = found[0]
        if d["vocab"] is not None and m.vocab != d["padded_vocab"]:
            notes.append(f"Megatron-LM pads the vocabulary to {d['padded_vocab']:,}; planned with {m.name}'s {m.vocab:,}")
        if len(found) > 1:
            notes.append(f"the arguments' model is {m.name} (also {', '.join(x.name for x in found[1:])}: the same shape)")
        else:
            notes.append(f"the arguments' model is {m.name}")
        return {"model": m.name}
    if d["vocab"] is None:
        raise bad("model", "the arguments' model is in no catalog entry and they do not fix its vocabulary "
                  "(--vocab-size or a known --tokenizer-type): name it with --model or --hf-config")
    notes.append(f"the arguments' model is in no catalog entry: planned from its flags (vocabulary "
                 f"{d.get('padded_vocab') or d['vocab']:,} after Megatron-LM's padding)")
    return {"hf_config": hf_config(d, f"{path.stem} (Megatron-LM arguments)")}


def _stage_layers(f: _Flags, layers: int | None, pp: int) -> list[int] | None:
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


def _recompute(f: _Flags, out: dict, unknown: list[str]) -> None:
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


def _precision(f: _Flags, out: dict) -> None:
    out["precision"] = "bf16" if f.has("--bf16") else "fp16" if f.has("--fp16") else "fp32"
    fmt = f.str("--fp8-format")
    if fmt is not None:
        if fmt not in ("hybrid", "e4m3"):
            raise bad("fp8-format", f"--fp8-format {fmt!r:.40} is not planned; planned: hybrid, e4m3")
        out["precision"] = "fp8"
    if f.has("--grad-reduce-in-bf16"):
        out["grad_dtype"] = "bf16"
    if f.has("--use-precision-aware-optimizer"):
        dt = {"bf16": "bf16", "fp16": "fp16", "fp32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16",
              "torch.float32": "fp32"}
        exp = f.str("--exp-avg-dtype", "fp32")
        f.str("--exp-avg-sq-dtype")
        if exp not in dt:
            raise bad("exp-avg-dtype", f"--exp-avg-dtype {exp!r:.40} is not planned; planned: fp32, bf16, fp16")
        if dt[exp] != "fp32":
            out["optimizer_state_dtype"] = dt[exp]


def _layout(f: _Flags, out: dict, layers: int | None, unknown: list[str]) -> None:
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
    if f.has("--use-torch-fsdp2"):
        out["zero"] = 3
    elif f.has("--use-megatron-fsdp"):
        strategy = f.str("--data-parallel-sharding-strategy", "optim_grads_params")
        stages = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}
        if strategy not in stages:
            raise bad("data-parallel-sharding-strategy", f"must be one of {', '.join(stages)} (got {strategy!r:.40})")
        out["zero"] = stages[strategy]
    elif f.has("--use-distributed-optimizer"):
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
    f = _Flags(flags)
    notes: list[str] = [f"read the arguments of {read.script}"] if read.script else []
    unknown = [f"{u}" for u in read.unsure] + [f"stray word {w!r}" for w in stray[:5]]
    out: dict = {"framework": "megatron"}
    _layout(f, out, f.int("--num-layers"), unknown)
    if not model_given:
        out.update(_model(f, out.get("tp", 1), path, notes))
    else:  # the model named alongside; the file's model flags are read for the split only
        for k in list(flags):
            if k.startswith(("--num-layers", "--hidden-size", "--num-attention-heads")):
                f.used.add(k)
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
    attn, hidden = f.float("--attention-dropout", 0.1), f.float("--hidden-dropout", 0.1)  # Megatron's defaults
    if attn != hidden:
        notes.append(f"attention dropout {attn:g} and hidden dropout {hidden:g}: planned with {hidden:g} for both")
    out["dropout"] = hidden
    out["grad_clip"] = f.float("--clip-grad", 1.0)
    if f.has("--fp8-param-gather"):
        unknown.append("--fp8-param-gather (planned: parameters gathered in 16 bits)")
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
    ignored, refused = [], []
    for name in flags:
        if name in f.used:
            continue
        if name.startswith(NOT_PLANNED_PREFIXES) or name in SWITCHES:
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
    unknown += refused
    return Imported("megatron", out, ignored=ignored, unknown=unknown, notes=notes)


def launcher_gpus(launcher: list[str]) -> int | None:
    """GPUs the torchrun line starts: --nproc_per_node x --nnodes (integers only)."""
    flags, _ = parse_flags(launcher[1:])
    per = (flags.get("--nproc_per_node") or flags.get("--nproc-per-node") or [None])[0]
    nodes = (flags.get("--nnodes") or ["1"])[0]
    if per and per.isdigit() and nodes.isdigit():
        return int(per) * int(nodes)
    return None
