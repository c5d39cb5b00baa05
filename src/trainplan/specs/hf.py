"""Import a Hugging Face `config.json` (a local file or an already-parsed dict; no network).

Each supported `model_type` maps the transformers configuration keys of its
`configuration_*.py` onto a ModelSpec. Defaults follow those classes' own defaults; a key
given as null counts as absent (as transformers' `None` does).

Every key the import reads is checked first (`check_config`): integers within FIELD_RANGES,
true/false flags, strings; a configuration whose model would exceed catalog.MAX_PARAMS is
refused naming the key that makes it so.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

from pydantic import ValidationError

from ..errors import PlanError, from_pydantic
from ..files import read_json_file
from ..limits import MAX_LAYERS
from . import catalog, hf_families_norms
from .hf_families_residual import CONVERTERS as RESIDUAL_FAMILIES
from .hf_families_residual import rotary_fraction
from .model import ActivationKind, ModelSpec

# Activation functions whose saved tensors are modelled (transformers' ACT2FN names).
ACTIVATIONS = ActivationKind.__args__
# config.json's `experts_implementation` (transformers 5) -> ModelSpec.experts_impl
EXPERTS_IMPLEMENTATIONS = {"grouped_mm": "grouped", "eager": "eager"}


def _activation(c: dict, key: str, default: str) -> str:
    """The config's activation function, by transformers' name; any other is refused (what
    it saves for backward would be unknown)."""
    name = c.get(key, default)
    if not isinstance(name, str) or name not in ACTIVATIONS:
        raise PlanError(f"hf_config.{key}", f"unsupported activation function {name!r:.60}; "
                        f"supported: {', '.join(ACTIVATIONS)}")
    return name


def _experts_impl(c: dict) -> str | None:
    """The config's `experts_implementation`, when it states one."""
    name = c.get("experts_implementation")
    if name is None:
        return None
    if not isinstance(name, str) or name not in EXPERTS_IMPLEMENTATIONS:
        raise PlanError("hf_config.experts_implementation", f"unsupported experts implementation {name!r:.60}; "
                        f"supported: {', '.join(EXPERTS_IMPLEMENTATIONS)}")
    return EXPERTS_IMPLEMENTATIONS[name]

# The config.json keys the import reads, with the integers each may hold (bounds as ModelSpec's:
# far above any published model, far below what would make arithmetic on them meaningless).
LAYERS, WIDTH, FFN, HEADS = (1, MAX_LAYERS), (1, 1_000_000), (1, 10_000_000), (1, 100_000)
FIELD_RANGES: dict[str, tuple[int, int]] = {
    "num_hidden_layers": LAYERS, "n_layer": LAYERS,
    "hidden_size": WIDTH, "n_embd": WIDTH,
    "num_attention_heads": HEADS, "n_head": HEADS, "num_key_value_heads": HEADS,
    "head_dim": HEADS, "qk_rope_head_dim": (0, 100_000), "qk_nope_head_dim": (0, 100_000), "v_head_dim": HEADS,
    "intermediate_size": FFN, "n_inner": FFN, "moe_intermediate_size": FFN,
    "shared_expert_intermediate_size": (0, 10_000_000),
    "vocab_size": (1, 100_000_000),
    "max_position_embeddings": (1, 100_000_000), "n_positions": (1, 100_000_000),
    "num_local_experts": HEADS, "num_experts": HEADS, "n_routed_experts": HEADS,
    "num_experts_per_tok": HEADS, "n_shared_experts": (0, 1000),
    "decoder_sparse_step": LAYERS, "moe_layer_freq": LAYERS, "first_k_dense_replace": (0, MAX_LAYERS),
    "q_lora_rank": WIDTH, "kv_lora_rank": WIDTH,
    "num_kv_heads": HEADS, "ffn_hidden_size": FFN,  # Falcon
    **hf_families_norms.FIELD_RANGES,
}
FLAGS = ("tie_word_embeddings", "attention_bias", "mlp_bias", "use_parallel_residual", "parallel_attn",
         "new_decoder_architecture", "multi_query", "use_qkv_bias", "use_bias", "lm_head_bias",
         *hf_families_norms.FLAGS)
STRINGS = ("model_type", "topk_method", "_name_or_path")
MAX_ROPE_THETA = 1e12  # published: 1e4 (Llama 2) to 5e5 (Llama 3) and 1e6-1e7 (Qwen, long context)

# The config.json key behind each ModelSpec field, where it differs by model_type: the key a
# size problem is blamed on.
SPEC_KEYS = {"layers": "num_hidden_layers", "hidden": "hidden_size", "heads": "num_attention_heads",
             "kv_heads": "num_key_value_heads", "head_dim": "head_dim", "ffn": "intermediate_size",
             "vocab": "vocab_size", "max_position": "max_position_embeddings",
             "top_k": "num_experts_per_tok", "expert_ffn": "moe_intermediate_size",
             "shared_expert_ffn": "shared_expert_intermediate_size", "q_lora_rank": "q_lora_rank",
             "kv_lora_rank": "kv_lora_rank", "qk_rope_head_dim": "qk_rope_head_dim",
             "qk_nope_head_dim": "qk_nope_head_dim", "v_head_dim": "v_head_dim"}
SPEC_KEYS_BY_TYPE = {
    "mixtral": {"experts": "num_local_experts", "expert_ffn": "intermediate_size"},
    "qwen2_moe": {"experts": "num_experts"}, "qwen3_moe": {"experts": "num_experts"},
    "deepseek_v3": {"experts": "n_routed_experts", "shared_experts": "n_shared_experts",
                    "first_dense_layers": "first_k_dense_replace"},
    "gpt2": {"layers": "n_layer", "hidden": "n_embd", "heads": "n_head", "ffn": "n_inner",
             "max_position": "n_positions"},
    "gptj": {"layers": "n_layer", "hidden": "n_embd", "heads": "n_head", "ffn": "n_inner",
             "max_position": "n_positions"},
    "falcon": {"kv_heads": "num_kv_heads", "ffn": "ffn_hidden_size"},
    "phimoe": {"experts": "num_local_experts", "expert_ffn": "intermediate_size"},
    "granitemoe": {"experts": "num_local_experts", "expert_ffn": "intermediate_size"},
    "deepseek_v2": {"experts": "n_routed_experts", "shared_experts": "n_shared_experts",
                    "first_dense_layers": "first_k_dense_replace"},
}


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_config(c: dict) -> None:
    """Each key the import reads holds a value of its kind and range (null: absent), and the
    head counts agree; a PlanError names the first key that does not."""
    for key, value in c.items():
        if value is None:
            continue
        if key in FIELD_RANGES:
            low, high = FIELD_RANGES[key]
            if _is_int(value) and value > MAX_LAYERS and key in ("num_hidden_layers", "n_layer"):  # ModelSpec's words
                raise PlanError(f"hf_config.{key}", f"at most {MAX_LAYERS:,} layers are planned (the deepest published "
                                f"models have about 128); got {value:,}")
            if not _is_int(value) or not low <= value <= high:
                raise PlanError(f"hf_config.{key}", f"must be an integer from {low:,} to {high:,} (got {value!r:.60})")
        elif key in FLAGS and not isinstance(value, bool):
            raise PlanError(f"hf_config.{key}", f"must be true or false (got {value!r:.60})")
        elif key in STRINGS and not isinstance(value, str):
            raise PlanError(f"hf_config.{key}", f"must be a string (got {value!r:.60})")
        elif key == "rope_theta" and not (isinstance(value, int | float) and not isinstance(value, bool)
                                          and math.isfinite(value) and 0 < value <= MAX_ROPE_THETA):
            raise PlanError("hf_config.rope_theta", f"must be a number in (0, {MAX_ROPE_THETA:.0e}] (got {value!r:.60})")
    if c.get("model_type") in ("gpt2", "deepseek_v3", "deepseek_v2", "gptj"):  # MLA: no KV groups; GPT-2/J: no GQA
        return
    heads, kv = c.get("num_attention_heads"), c.get("num_key_value_heads")
    if heads is not None and kv is not None and heads % kv:
        raise PlanError("hf_config.num_key_value_heads", f"must divide num_attention_heads ({heads}) for "
                        f"grouped-query attention (got {kv})")
    hidden = c.get("hidden_size")
    if heads is not None and hidden is not None and c.get("head_dim") is None and hidden % heads:
        raise PlanError("hf_config.num_attention_heads", f"must divide hidden_size ({hidden}) unless head_dim "
                        f"is given (got {heads})")


def check_size(spec: ModelSpec, model_type: str) -> None:
    """Refuse a model larger than catalog.MAX_PARAMS, naming the config key furthest above the
    catalog's largest value for it."""
    keys = {**SPEC_KEYS, **SPEC_KEYS_BY_TYPE.get(model_type, {})}
    problem = catalog.size_problem(spec)
    if problem:
        field, rule = problem
        raise PlanError(f"hf_config.{keys.get(field, field)}", rule)


def _common(c: dict) -> dict:
    return dict(
        layers=c["num_hidden_layers"],
        hidden=c["hidden_size"],
        heads=c["num_attention_heads"],
        kv_heads=c.get("num_key_value_heads") or c["num_attention_heads"],
        head_dim=c.get("head_dim"),
        ffn=c["intermediate_size"],
        vocab=c["vocab_size"],
        tied_embeddings=bool(c.get("tie_word_embeddings", False)),
        max_position=c.get("max_position_embeddings", 4096),
        mlp="swiglu",
        activation=_activation(c, "hidden_act", "silu"),  # LlamaConfig's default and the others'
        norm="rmsnorm",
        position="rotary",
    )


def _llama(c: dict) -> dict:
    d = _common(c)
    d["qkv_bias"] = bool(c.get("attention_bias", False))
    d["bias"] = bool(c.get("mlp_bias", False))
    return d


def _qwen2(c: dict) -> dict:
    return {**_common(c), "qkv_bias": True}  # Qwen2Attention always has q/k/v biases


def _mixtral(c: dict) -> dict:
    d = _common(c)
    d.update(experts=c.get("num_local_experts", 8), top_k=c.get("num_experts_per_tok", 2),
             expert_ffn=c["intermediate_size"], experts_impl=_experts_impl(c))
    return d


def _qwen2_moe(c: dict) -> dict:
    d = _qwen2(c)
    d.update(top_k=c["num_experts_per_tok"], expert_ffn=c["moe_intermediate_size"], experts_impl=_experts_impl(c),
             **hf_families_norms.sparse_layers(c, d["layers"], "num_experts"))
    shared = c.get("shared_expert_intermediate_size", 0)
    if shared:
        d.update(shared_experts=1, shared_expert_ffn=shared, shared_expert_gate=True)
    return d


def _deepseek_v3(c: dict) -> dict:
    d = _common(c)
    d.update(
        kv_heads=c["num_attention_heads"], head_dim=None,
        experts=c["n_routed_experts"], top_k=c["num_experts_per_tok"],
        expert_ffn=c["moe_intermediate_size"], shared_experts=c.get("n_shared_experts") or 0,
        first_dense_layers=c.get("first_k_dense_replace", 0), moe_layer_freq=c.get("moe_layer_freq", 1),
        router_bias=c.get("topk_method", "noaux_tc") == "noaux_tc",
        q_lora_rank=c.get("q_lora_rank"), kv_lora_rank=c["kv_lora_rank"],
        qk_rope_head_dim=c["qk_rope_head_dim"], qk_nope_head_dim=c["qk_nope_head_dim"],
        v_head_dim=c["v_head_dim"], experts_impl=_experts_impl(c),
    )
    return d


def _gpt2(c: dict) -> dict:
    h = c.get("n_embd", 768)
    return dict(
        layers=c.get("n_layer", 12), hidden=h, heads=c.get("n_head", 12),
        ffn=c.get("n_inner") or 4 * h, vocab=c.get("vocab_size", 50257),
        tied_embeddings=bool(c.get("tie_word_embeddings", True)),
        max_position=c.get("n_positions", 1024), mlp="gelu", norm="layernorm",
        activation=_activation(c, "activation_function", "gelu_new"),  # GPT2Config's default
        position="learned", qkv_bias=True, bias=True, fused_qkv=True,
    )


def _gpt_neox(c: dict) -> dict:
    return dict(
        layers=c["num_hidden_layers"], hidden=c["hidden_size"], heads=c["num_attention_heads"],
        ffn=c.get("intermediate_size") or 4 * c["hidden_size"], vocab=c["vocab_size"],
        tied_embeddings=bool(c.get("tie_word_embeddings", False)),
        max_position=c.get("max_position_embeddings", 2048), mlp="gelu", norm="layernorm",
        activation=_activation(c, "hidden_act", "gelu"),  # GPTNeoXConfig's defaults
        parallel_residual=bool(c.get("use_parallel_residual", True)),
        position="rotary", rotary_fraction=rotary_fraction(c, 0.25), rope_concat=True, qkv_bias=bool(c.get("attention_bias", True)),
        bias=bool(c.get("attention_bias", True)), fused_qkv=True,
    )


def _norm_family(convert) -> Callable[[dict], dict]:
    """A converter of hf_families_norms, given the shared fields and the activation reader."""
    def converter(c: dict) -> dict:
        d = convert(c, _common(c), _activation)
        return {**d, "experts_impl": _experts_impl(c)} if d.get("experts") else d
    return converter


CONVERTERS: dict[str, Callable[[dict], dict]] = {
    "llama": _llama,
    "mixtral": _mixtral,
    "qwen2": _qwen2,
    "qwen2_moe": _qwen2_moe,
    "deepseek_v3": _deepseek_v3,
    "gpt2": _gpt2,
    "gpt_neox": _gpt_neox,
    **RESIDUAL_FAMILIES,
    **{kind: _norm_family(convert) for kind, convert in hf_families_norms.FAMILIES.items()},
}


# What a user whose family is not read can write instead: a spec TOML (ModelSpec's fields).
BY_HAND_EXAMPLE = ('name = "my-model"\nsource = "config.json of my-model"\nlayers = 32\nhidden = 4096\nheads = 32\n'
                   'kv_heads = 8\nffn = 14336\nvocab = 128256\nmlp = "swiglu"\nnorm = "rmsnorm"\nposition = "rotary"')


def unsupported_family(model_type) -> str:
    """The refusal of a model_type no converter reads: what is supported, and how to describe
    the model by hand."""
    return (f"unsupported model_type {model_type!r:.60}; supported: {', '.join(sorted(CONVERTERS))}. "
            "Describe the model by hand in a spec TOML (the ModelSpec fields of docs/model-families.md, e.g. "
            + "; ".join(BY_HAND_EXAMPLE.splitlines()[2:]) + ") and pass its path: --model my-model.toml")


def from_dict(config: dict, name: str | None = None, source: str = "Hugging Face config.json") -> ModelSpec:
    if not isinstance(config, dict):
        raise PlanError("hf_config", "must be a JSON object (the contents of config.json)")
    config, source = hf_families_norms.language_model(config, source)
    check_config(config)
    # null: the class's default, except where null switches a feature off (no sliding window, no soft-cap)
    config = {k: v for k, v in config.items() if v is not None or k in hf_families_norms.NULL_IS_OFF}
    if config.get("sliding_window") == 0:  # transformers 5 saves an unused window (Qwen2-MoE's) as 0
        config["sliding_window"] = None
    model_type = config.get("model_type")
    if model_type not in CONVERTERS:
        raise PlanError("hf_config.model_type", unsupported_family(model_type))
    try:
        fields = CONVERTERS[model_type](config)
    except KeyError as exc:
        raise PlanError(f"hf_config.{exc.args[0]}", f"required for model_type {model_type!r}") from None
    except TypeError as exc:
        raise PlanError("hf_config", f"malformed {model_type} config ({exc})") from None
    fields.update(rope_norm_router(config))
    fields = {k: v for k, v in fields.items() if v is not None}
    name = name or config.get("_name_or_path") or model_type
    try:
        spec = ModelSpec(name=str(name), source=source, family=model_type, **fields)
    except ValidationError as exc:
        raise from_pydantic(exc, "hf_config.") from None
    check_size(spec, model_type)
    return spec


# Rotary base, its long-context scaling, the norm epsilon and the router, as config.json states
# them (transformers 5 also nests the rotary keys in `rope_parameters`); absent keys stay None
# (not stated) rather than taking a class default, so an export never repeats a guess.
NORM_EPS_KEYS = ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon")


def rope_norm_router(c: dict) -> dict:
    rope = c.get("rope_parameters") if isinstance(c.get("rope_parameters"), dict) else {}
    scaling = c.get("rope_scaling") if isinstance(c.get("rope_scaling"), dict) else rope
    theta = c.get("rope_theta", c.get("rotary_emb_base", rope.get("rope_theta")))
    out: dict = {"rope_theta": theta,
                 "norm_eps": next((c[k] for k in NORM_EPS_KEYS if c.get(k) is not None), None)}
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind == "llama3":
        out["rope_scaling"] = {"kind": "llama3", "factor": scaling.get("factor"),
                               "low_freq_factor": scaling.get("low_freq_factor"),
                               "high_freq_factor": scaling.get("high_freq_factor"),
                               "original_max_position": scaling.get("original_max_position_embeddings")}
    elif kind == "yarn":
        out["rope_scaling"] = {"kind": "yarn", "factor": scaling.get("factor"),
                               "original_max_position": scaling.get("original_max_position_embeddings"),
                               **{k: scaling.get(k) for k in ("beta_fast", "beta_slow", "mscale", "mscale_all_dim")}}
    elif kind in ("linear", "dynamic", "longrope"):  # frequencies only: kept by name for the exports
        factor = scaling.get("factor")
        out["rope_scaling"] = {"kind": kind, "factor": factor if isinstance(factor, (int, float)) and factor > 0 else None,
                               "original_max_position": scaling.get("original_max_position_embeddings")}
    elif kind not in (None, "default"):
        raise PlanError("hf_config.rope_scaling", f"rope type {kind!r} is not known; llama3, yarn, linear, dynamic "
                        "and longrope are")
    if c.get("scoring_func") is not None:
        out["router_score"] = c["scoring_func"]
    if c.get("norm_topk_prob") is not None:
        out["router_norm_topk"] = bool(c["norm_topk_prob"])
    elif c.get("model_type") == "qwen2_moe":  # Qwen2MoeConfig's default
        out["router_norm_topk"] = False
    for field, key in (("router_scale", "routed_scaling_factor"), ("router_groups", "n_group"),
                       ("router_group_topk", "topk_group")):
        out[field] = c.get(key)
    return out


def from_file(path: str | Path) -> ModelSpec:
    path = Path(path)
    config = read_json_file(path, "model")
    name = path.parent.name if path.name == "config.json" and path.parent.name else path.stem
    return from_dict(config, name=name, source=f"Hugging Face config.json at {path}")
