"""Hugging Face `transformers` models with random weights, built from a ModelSpec (no
network, no checkpoint): what most users actually train. Optional extra `hf`."""

from __future__ import annotations

from ..errors import PlanError
from ..specs.model import ModelSpec


def hf_config(spec: ModelSpec, attention: str):
    """A transformers config of the family the spec belongs to."""
    try:
        from transformers import AutoConfig
    except ImportError:
        raise PlanError("impl", "--impl transformers needs the transformers package: "
                        "pip install 'trainplan[hf]'") from None
    attn = "eager" if attention == "eager" else "sdpa"
    common = dict(vocab_size=spec.vocab, tie_word_embeddings=spec.tied_embeddings, bos_token_id=None,
                  eos_token_id=None, pad_token_id=None)
    if spec.is_mla:
        raise PlanError("model", "multi-head latent attention is not built from transformers here")
    if spec.mlp == "gelu":
        if spec.position == "learned":
            kw = dict(n_embd=spec.hidden, n_layer=spec.layers, n_head=spec.heads, n_inner=spec.ffn,
                      n_positions=spec.max_position, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                      activation_function="gelu_pytorch_tanh", **common)
            cfg = AutoConfig.for_model("gpt2", **kw)
        else:
            kw = dict(hidden_size=spec.hidden, num_hidden_layers=spec.layers, num_attention_heads=spec.heads,
                      intermediate_size=spec.ffn, max_position_embeddings=spec.max_position,
                      hidden_act="gelu_pytorch_tanh", **common)
            cfg = AutoConfig.for_model("gpt_neox", **kw)
    else:
        kw = dict(hidden_size=spec.hidden, num_hidden_layers=spec.layers, num_attention_heads=spec.heads,
                  num_key_value_heads=spec.n_kv_heads, head_dim=spec.dim_head,
                  intermediate_size=spec.ffn, max_position_embeddings=spec.max_position, **common)
        if spec.is_moe and spec.shared_experts:
            kind = "qwen2_moe"
            kw.update(num_experts=spec.experts, num_experts_per_tok=spec.top_k,
                      moe_intermediate_size=spec.expert_ffn,
                      shared_expert_intermediate_size=(spec.shared_expert_ffn or spec.expert_ffn) * spec.shared_experts)
        elif spec.is_moe:
            kind = "mixtral"
            kw.update(num_local_experts=spec.experts, num_experts_per_tok=spec.top_k, intermediate_size=spec.expert_ffn)
        else:
            kind = "qwen2" if spec.qkv_bias else "llama"
        cfg = AutoConfig.for_model(kind, **kw)
    cfg._attn_implementation = attn
    return cfg


def build_hf_model(spec: ModelSpec, attention: str, recompute: str, device: str, early_stop: bool = False):
    import torch
    from transformers import AutoModelForCausalLM

    if recompute == "selective":
        raise PlanError("recompute", "transformers models recompute whole layers only: use none or full")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(hf_config(spec, attention)).to(device)
    model.train()
    if recompute == "full":
        # reentrant (transformers' default), or non-reentrant, which stops early (PyTorch >= 2.1)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": not early_stop})
    return model
