"""Hugging Face `transformers` models with random weights (no network, no checkpoint): what
most users actually train. Optional extra `hf`.

A model given as a config.json is built from that config as written: only its sizes are
replaced by the (scaled-down) spec's, and its dropout probabilities by the plan's; its
activation function, residual layout, biases and everything else that decides what is saved
for backward are kept. A catalog model is built from a config of its family that states the
spec's activation function and residual layout."""

from __future__ import annotations

from ..errors import PlanError
from ..specs.model import ModelSpec

# The config keys that carry a spec's sizes, per model_type (the inverse of specs/hf.py).
_DECODER = dict(layers="num_hidden_layers", hidden="hidden_size", heads="num_attention_heads",
                kv_heads="num_key_value_heads", head_dim="head_dim", ffn="intermediate_size",
                vocab="vocab_size", max_position="max_position_embeddings")
SIZE_KEYS = {
    "gpt2": dict(layers="n_layer", hidden="n_embd", heads="n_head", ffn="n_inner", vocab="vocab_size",
                 max_position="n_positions"),
    "gpt_neox": dict(layers="num_hidden_layers", hidden="hidden_size", heads="num_attention_heads",
                     ffn="intermediate_size", vocab="vocab_size", max_position="max_position_embeddings"),
    "llama": _DECODER, "mistral": _DECODER, "qwen2": _DECODER, "qwen3": _DECODER,
    "mixtral": {**_DECODER, "experts": "num_local_experts", "top_k": "num_experts_per_tok",
                "expert_ffn": "intermediate_size"},
    "qwen2_moe": {**_DECODER, "experts": "num_experts", "top_k": "num_experts_per_tok",
                  "expert_ffn": "moe_intermediate_size"},
    "qwen3_moe": {**_DECODER, "experts": "num_local_experts", "top_k": "num_experts_per_tok",
                  "expert_ffn": "moe_intermediate_size"},
    # the norms / attention masks / soft-capping families (specs/hf_families_norms.py)
    **{kind: _DECODER for kind in ("gemma", "gemma2", "gemma3_text", "olmo", "olmo2", "cohere", "cohere2")},
    "olmoe": {**_DECODER, "experts": "num_experts", "top_k": "num_experts_per_tok", "expert_ffn": "intermediate_size"},
    "gpt_oss": {**_DECODER, "experts": "num_local_experts", "top_k": "num_experts_per_tok",
                "expert_ffn": "intermediate_size"},
    # multi-head latent attention (DeepSeek-V3): the latent ranks and head widths are sizes too
    "deepseek_v3": {**{k: v for k, v in _DECODER.items() if k != "head_dim"}, "experts": "n_routed_experts",
                    "top_k": "num_experts_per_tok", "expert_ffn": "moe_intermediate_size",
                    "first_dense_layers": "first_k_dense_replace", "q_lora_rank": "q_lora_rank",
                    "kv_lora_rank": "kv_lora_rank", "qk_rope_head_dim": "qk_rope_head_dim",
                    "qk_nope_head_dim": "qk_nope_head_dim", "v_head_dim": "v_head_dim"},
}
# families with partial rotary, parallel residuals and their own bias layouts (specs/hf_families_residual.py)
_MIXTRAL_LIKE = {**_DECODER, "experts": "num_local_experts", "top_k": "num_experts_per_tok",
                 "expert_ffn": "intermediate_size"}
SIZE_KEYS.update({
    **dict.fromkeys(("phi", "phi3", "stablelm", "granite", "starcoder2", "glm", "glm4", "internlm3"), _DECODER),
    "phimoe": _MIXTRAL_LIKE, "granitemoe": _MIXTRAL_LIKE, "deepseek_v2": SIZE_KEYS["deepseek_v3"],
    "falcon": dict(layers="num_hidden_layers", hidden="hidden_size", heads="num_attention_heads",
                   kv_heads="num_kv_heads", ffn="ffn_hidden_size", vocab="vocab_size",
                   max_position="max_position_embeddings"),
    "gptj": {**SIZE_KEYS["gpt2"], "rotary_dim": "rotary_dim"},
})
# Dropout probabilities of each family's config (the plan's --dropout decides dropout).
DROPOUT_KEYS = ("attn_pdrop", "embd_pdrop", "resid_pdrop", "summary_first_dropout", "attention_dropout",
                "hidden_dropout", "classifier_dropout", "residual_dropout", "embedding_dropout")
# Experts implementations (ModelSpec.experts_impl) by transformers' name, and back.
EXPERTS_IMPL = {"grouped": "grouped_mm", "eager": "eager"}
FROM_EXPERTS_IMPL = {v: k for k, v in EXPERTS_IMPL.items()}


def _transformers():
    try:
        import transformers
    except ImportError:
        raise PlanError("impl", "--impl transformers needs the transformers package: "
                        "pip install 'trainplan[hf]'") from None
    return transformers


def config_dict(spec: ModelSpec, user: dict | None = None) -> dict:
    """The config.json a model is built from: the user's (`user`) with its sizes set to the
    spec's, or, for a catalog model, one of the spec's family stating its activation function."""
    cfg = dict(user) if user is not None else _family_config(spec)
    kind = cfg.get("model_type")
    if kind not in SIZE_KEYS:
        raise PlanError("hf_config.model_type", f"validate builds {', '.join(SIZE_KEYS)} models with "
                        f"transformers; not {kind!r}")
    if kind in ("deepseek_v3", "deepseek_v2") and cfg.get("n_group") and cfg.get("n_routed_experts"):
        # group-limited routing: the groups keep their size (experts per group), so fewer experts
        # make fewer groups, of which at most as many are chosen
        per_group = max(1, cfg["n_routed_experts"] // cfg["n_group"])
        cfg["n_group"] = max(1, spec.experts // per_group)
        cfg["topk_group"] = min(cfg.get("topk_group", 1), cfg["n_group"])
    for field, key in SIZE_KEYS[kind].items():
        if field in ("head_dim", "rotary_dim") and field not in cfg:
            continue  # the family derives it from hidden / heads (or rotates whole heads)
        value = getattr(spec, "n_kv_heads" if field == "kv_heads" else "dim_head" if field == "head_dim" else field)
        cfg[key] = value
    if spec.shared_experts and kind == "qwen2_moe":
        cfg["shared_expert_intermediate_size"] = spec.shared_ffn_total
    _layer_pattern(spec, cfg)
    # token ids of the full vocabulary would fall outside a scaled-down one; unused in training
    cfg.update(bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return cfg


def _layer_pattern(spec: ModelSpec, cfg: dict) -> None:
    """The per-layer keys of the (scaled) spec: its attention types and, for Qwen-MoE, its dense
    layers in place of the config's; the expert count in whichever spelling the config uses."""
    if spec.layer_types is not None and ("layer_types" in cfg or spec.sliding_layers < spec.layers):
        cfg["layer_types"] = list(spec.layer_types)
    if cfg.get("model_type") in ("qwen2_moe", "qwen3_moe") and spec.is_moe:
        cfg["mlp_only_layers"] = list(spec.mlp_only_layers)
        cfg["decoder_sparse_step"] = 1
        for key in ("num_experts", "num_local_experts"):  # both spellings say the scaled count
            if key in cfg:
                cfg[key] = spec.experts


def _family_config(spec: ModelSpec) -> dict:
    """A config of the family a catalog spec belongs to."""
    neox = spec.mlp == "gelu" and spec.position == "rotary"
    unexpressed = [name for name, on in (
        ("shared_norm", spec.shared_norm), ("head_bias", spec.head_bias), ("mlp_bias", spec.mlp_bias is not None),
        ("kv_broadcast", spec.kv_broadcast),
        ("rotary_fraction", spec.rotary_fraction < 1 and not neox), ("rope_concat", spec.rope_concat and not neox),
    ) if on]
    if unexpressed:
        raise PlanError("model", f"validate --impl transformers builds a catalog model as Llama, Qwen2, Mixtral, "
                        f"Qwen2-MoE, GPT-2 or GPT-NeoX, which cannot state its {', '.join(unexpressed)}: pass the "
                        "model's config.json instead (built as written)")
    common = dict(tie_word_embeddings=spec.tied_embeddings)
    if spec.mlp == "gelu":
        # a spec without an activation runs one GELU kernel that keeps its input: F.gelu
        act = spec.activation or "gelu_pytorch_tanh"
        if spec.position == "learned":
            return dict(model_type="gpt2", activation_function=act, **common)
        return dict(model_type="gpt_neox", hidden_act=act, use_parallel_residual=spec.parallel_residual,
                    attention_bias=spec.qkv_bias, rotary_pct=spec.rotary_fraction, **common)
    common["hidden_act"] = spec.activation or "silu"
    if spec.experts_impl is not None:
        common["experts_implementation"] = EXPERTS_IMPL[spec.experts_impl]
    if spec.is_moe and spec.shared_experts:
        return dict(model_type="qwen2_moe", **common)
    if spec.is_moe:
        return dict(model_type="mixtral", **common)
    return dict(model_type="qwen2" if spec.qkv_bias else "llama", **common)


def hf_config(spec: ModelSpec, attention: str, user: dict | None = None):
    """The transformers config the model is built from (see `config_dict`)."""
    transformers = _transformers()
    cfg = config_dict(spec, user)
    kind = cfg.pop("model_type")
    cfg = {k: v for k, v in cfg.items() if k not in ("architectures", "transformers_version", "_name_or_path",
                                                     "torch_dtype", "dtype")}
    config = transformers.AutoConfig.for_model(kind, **cfg)
    config._attn_implementation = "eager" if attention == "eager" else "sdpa"
    return config


def sdpa_runs_math(spec: ModelSpec, device: str, attention: str) -> bool:
    """Whether the transformers model runs SDPA's math kernel (materialised probabilities, as
    eager attention keeps): it calls SDPA for any attention but eager (`hf_config`), and PyTorch
    falls back to the math kernel for K/V heads broadcast to more query heads (Falcon's
    multi-query: `ModelSpec.attention_kernel`) and, on the CPU, for MLA's values narrower than
    its queries and keys (the CPU flash kernel takes one head width; measured: DeepSeek-V2, -V3)."""
    if attention == "eager":
        return False
    mla = device == "cpu" and spec.is_mla and spec.v_head_dim != spec.qk_nope_head_dim + spec.qk_rope_head_dim
    return mla or spec.attention_kernel("sdpa") == "eager"


def dropout_settings(config: dict) -> dict:
    """The config's nonzero dropout probabilities, by key."""
    return {k: config[k] for k in DROPOUT_KEYS if isinstance(config.get(k), (int, float)) and config[k] > 0}


def build_hf_model(spec: ModelSpec, attention: str, recompute: str, device: str, early_stop: bool = False,
                   user: dict | None = None, dropout: float = 0.0):
    """The model, in fp32 (the plan's precision recipe is applied by the caller), in training
    mode; its dropout probabilities are the plan's."""
    import torch

    transformers = _transformers()
    if recompute == "selective":
        raise PlanError("recompute", "transformers models recompute whole layers only: use none or full")
    config = hf_config(spec, attention, user)
    for key in DROPOUT_KEYS:
        if isinstance(getattr(config, key, None), (int, float)):
            setattr(config, key, dropout)
    torch.manual_seed(0)
    try:
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).to(device)
    except ValueError as exc:
        if attention == "sdpa" and "scaled_dot_product_attention" in str(exc):
            # Gemma 2 (soft-capping) and gpt-oss (attention sinks) run eager or flash attention
            raise PlanError("attention", f"transformers runs {config.model_type} without SDPA (its attention "
                            "needs soft-capping or sinks): validate with --attention eager") from None
        raise
    model.train()
    if recompute == "full":
        # reentrant (transformers' default), or non-reentrant, which stops early (PyTorch >= 2.1)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": not early_stop})
    return model


def experts_impl(model) -> str | None:
    """The experts implementation a built model runs (its library's default unless the config
    states one); None for a dense model or one whose implementation is not modelled."""
    impl = getattr(model.config, "_experts_implementation", None)
    return FROM_EXPERTS_IMPL.get(impl)
