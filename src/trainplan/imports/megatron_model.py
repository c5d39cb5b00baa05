"""The model a Megatron-LM command line describes: its flags as ModelSpec fields, matched with
the catalog, or as a Hugging Face configuration when no catalog entry has that shape.

Defaults are Megatron-LM's (megatron/training/arguments.py): the feed-forward width of
validate_args, learned absolute positions, LayerNorm, tied embeddings, biases; the vocabulary
padded as megatron/training/tokenizer/tokenizer.py pads it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from ..specs import catalog
from . import bad, defaults

if TYPE_CHECKING:
    from .megatron import Flags

# the architecture fields compared with the catalog (shared experts by their total width: Megatron's
# flags describe them as one MLP of the summed width)
ARCH = ("layers", "hidden", "heads", "n_kv_heads", "dim_head", "ffn", "mlp", "tied_embeddings", "norm", "position",
        "qkv_bias", "bias", "qk_norm", "parallel_residual", "experts", "top_k", "shared_ffn_total", "first_dense_layers",
        "moe_layer_freq", "kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")


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
    m = re.fullmatch(r"\(?\[0\]\s*\*\s*(\d+)\s*\+\s*\[1\]\s*\*\s*(\d+)\)?", text.replace(" ", ""))
    if m and int(m.group(1)) + int(m.group(2)) == layers:
        return int(m.group(1)), 1
    raise bad("moe-layer-freq", f"--moe-layer-freq {text!r:.60}: only an integer or ([0]*K+[1]*N) with K+N layers "
              "(dense first layers, then MoE) is planned")


def model_fields(f: Flags, tp: int, notes: list[str]) -> dict:
    """The model the flags describe, as ModelSpec fields (vocab None when the flags do not fix it)."""
    meg = defaults()["megatron"]
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
             bias=bias, qkv_bias=bias or f.has("--add-qkv-bias"),
             # with MLA, --qk-layernorm is the norms of its latent q and kv, part of MLA itself
             qk_norm=f.has("--qk-layernorm") and not f.has("--multi-latent-attention"),
             max_position=f.int("--max-position-embeddings") or f.int("--seq-length") or 4096)
    experts = f.int("--num-experts")
    if experts:
        first, freq = _moe_layer_freq(f.str("--moe-layer-freq"), layers)
        shared = f.int("--moe-shared-expert-intermediate-size")
        d.update(experts=experts, top_k=f.int("--moe-router-topk", meg["moe_router_topk"]),
                 expert_ffn=f.int("--moe-ffn-hidden-size") or d["ffn"], first_dense_layers=first, moe_layer_freq=freq,
                 shared_experts=1 if shared else 0, shared_expert_ffn=shared or None,
                 shared_expert_gate=f.has("--moe-shared-expert-gate"),
                 router_bias=f.has("--moe-router-enable-expert-bias"))
    if f.has("--multi-latent-attention"):
        d.update(kv_heads=None, head_dim=None, q_lora_rank=f.int("--q-lora-rank"),
                 kv_lora_rank=f.int("--kv-lora-rank", meg["kv_lora_rank"]),
                 qk_nope_head_dim=f.int("--qk-head-dim", meg["qk_head_dim"]),
                 qk_rope_head_dim=f.int("--qk-pos-emb-head-dim", meg["qk_pos_emb_head_dim"]),
                 v_head_dim=f.int("--v-head-dim", meg["v_head_dim"]))
    vocab = f.int("--vocab-size") or f.int("--padded-vocab-size")
    tokenizer = f.str("--tokenizer-type")
    if vocab is None and tokenizer is None and f.has("--vocab-file") and f.has("--merge-file"):
        tokenizer = "GPT2BPETokenizer"  # a BPE vocabulary and merges: GPT-2's tokenizer
    known = {k: v for k, v in meg["tokenizer_vocab"].items() if k != "source"}
    if vocab is None and tokenizer in known:
        vocab = known[tokenizer]
        notes.append(f"vocabulary {vocab:,} ({tokenizer})")
    d["vocab"] = vocab
    if vocab is not None:
        d["padded_vocab"] = padded_vocab(vocab, f.int("--make-vocab-size-divisible-by",
                                                      meg["make_vocab_size_divisible_by"]), tp)
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


def model_options(f: Flags, tp: int, path: Path, notes: list[str]) -> dict:
    d = model_fields(f, tp, notes)
    found = match_catalog(d)
    if found:
        m = found[0]
        if d["vocab"] is not None and m.vocab != d["padded_vocab"]:
            notes.append(f"Megatron-LM pads the vocabulary to {d['padded_vocab']:,}; planned with {m.name}'s {m.vocab:,}")
        base = (f.flags.get("--rotary-base") or [str(defaults()["megatron"]["rotary_base"])])[0]  # read, not planned
        rope = float(base) if d["position"] == "rotary" and base.replace(".", "", 1).isdigit() else None
        if rope is not None and getattr(m, "rope_theta", None) not in (None, rope):
            notes.append(f"RoPE base {rope:,.0f} (--rotary-base; {m.name} has {m.rope_theta:,.0f}): the same memory "
                         "and time")
        others = [x for x in found[1:] if x.vocab != m.vocab]
        if d["vocab"] is None and others:  # the choice decides the vocabulary: said, with how to make another
            notes.append(f"the arguments fix no vocabulary: planned as {m.name} ({m.vocab:,} tokens); the same shape "
                         f"with another vocabulary: {', '.join(f'{x.name} ({x.vocab:,})' for x in others)}: give "
                         "--vocab-size in the file or --model")
        elif len(found) > 1:
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
