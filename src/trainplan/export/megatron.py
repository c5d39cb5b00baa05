"""Megatron-LM command-line arguments (megatron/training/arguments.py) for a plan.

The file holds one flag (with its value) per line and nothing else, so that
`torchrun pretrain_gpt.py $(cat megatron_args.txt) --lr ... --data-path ...` reads it whole;
what the user still chooses and where Megatron runs otherwise than the plan are notes
(printed on stderr by the CLI). Flag names, types and choices are those of the parser at the
commit named in tests/data/megatron_flags.json (scripts/megatron_flags.py).
"""

from __future__ import annotations

from ..errors import PlanError
from ..estimate.recipe import recipe
from ..plan import te_prefers_cudnn

# What a Megatron-LM run needs and a plan does not decide: left to the user, never invented.
USER_CHOICES = ("--lr", "--min-lr", "--lr-decay-style", "--lr-warmup-iters", "--weight-decay",
                "--train-iters (or --train-samples)", "--data-path", "--tokenizer-type", "--save / --load")
# Megatron Core's apply_rope_scaling (megatron/core/models/common/embeddings/rope_utils.py at
# core_v0.16.1) takes the factor from --rope-scaling-factor; the rest are its fixed defaults.
LLAMA3_ROPE_FIXED = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position": 8192}
# MLATransformerConfig's YaRN defaults (megatron/core/transformer/transformer_config.py):
# original_max_position_embeddings and beta_fast/slow have no flag
YARN_FIXED = {"original_max_position": 4096, "beta_fast": 32.0, "beta_slow": 1.0}
TANH_GELU = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast")  # the tanh approximation, spelt three ways
OPTIMIZERS = {"adamw": "adam", "adam": "adam", "sgd": "sgd", "sgd-momentum": "sgd"}  # Megatron's adam is AdamW


def _refuse(field: str, what: str) -> PlanError:
    return PlanError(field, f"Megatron-LM cannot express {what}")


# The spec's norm, mask and soft-capping features (specs/hf_families_norms.py) Megatron's GPT
# model has no flag for, by field: (its value in a Llama layer, what Megatron-LM cannot express).
NORM_FEATURES = {
    "norm_position": ("pre", "norms after a block (post or sandwich norms)"),
    "norm_weight": (True, "a norm without a weight"),
    "norm_bias": (True, "a LayerNorm without a bias"),
    "qk_norm_scope": ("head", "q/k norms over all heads or with a weight per head (its --qk-layernorm is per head)"),
    "attn_softcap": (None, "attention soft-capping"),
    "final_softcap": (None, "final-logit soft-capping"),
    "sliding_window": (None, "a sliding attention window (on every layer or per layer type)"),
    "attention_sinks": (False, "attention sinks"),
    "swiglu_limit": (None, "a clamped SwiGLU"),
    "expert_bias": (False, "biases on the routed experts and the router"),
    "clip_qkv": (None, "q, k and v clamped"),
    "mlp_only_layers": ((), "dense MLP layers listed between MoE layers"),
}


def _refuse_norm_features(m) -> None:
    for field, (plain, what) in NORM_FEATURES.items():
        if getattr(m, field) != plain and not (field == "norm_bias" and m.norm != "layernorm"):
            raise _refuse(f"model.{field}", what)


def _model_args(m) -> list[tuple[str, object]]:
    """The model's own flags: the architecture Megatron builds must be the planned one."""
    a: list[tuple[str, object]] = [
        ("--num-layers", m.layers), ("--hidden-size", m.hidden), ("--num-attention-heads", m.heads),
        ("--ffn-hidden-size", m.ffn)]
    if m.head_dim is not None and not m.is_mla and m.head_dim * m.heads != m.hidden:
        a.append(("--kv-channels", m.head_dim))
    if m.n_kv_heads != m.heads and not m.is_mla:
        a += [("--group-query-attention", True), ("--num-query-groups", m.n_kv_heads)]
    if m.parallel_residual:
        raise _refuse("model.parallel_residual", "a parallel residual (GPT-NeoX / GPT-J blocks): its GPT model "
                      "adds attention and MLP in sequence")
    _refuse_norm_features(m)
    act = m.activation
    if m.mlp == "swiglu":
        if act not in (None, "silu", "swish"):
            raise _refuse("model.activation", f"a gated MLP with {act} (its --swiglu gates with SiLU)")
        a.append(("--swiglu", True))
    elif act == "relu2":
        a.append(("--squared-relu", True))
    elif act in TANH_GELU:
        # Megatron Core's fused bias-GELU (fusions/fused_bias_gelu.py, on by default with biases)
        # is the tanh approximation GPT-2's gelu_new computes; without biases it runs exact F.gelu
        if not m.bias:
            raise _refuse("model.activation", f"{act} without MLP biases (it runs the tanh GELU only in its "
                          "fused bias-GELU kernel)")
    elif act == "gelu":
        if m.bias:
            a.append(("--no-bias-gelu-fusion", True))  # exact F.gelu, not the fused tanh form
    elif act is not None:
        raise _refuse("model.activation", f"{act} (its MLP runs GELU, --squared-relu or --swiglu)")
    a.append(("--normalization", "RMSNorm" if m.norm == "rmsnorm" else "LayerNorm"))
    if m.norm_eps is not None:
        a.append(("--norm-epsilon", m.norm_eps))
    if m.qk_norm:
        a.append(("--qk-layernorm", True))
    if m.position == "rotary":
        if m.rope_theta is None:
            raise PlanError("model.rope_theta", "is not stated in the model's spec; Megatron-LM would rotate with "
                            "its default base 10,000 (give rope_theta in the spec or its config.json)")
        if m.rope_theta != int(m.rope_theta):
            raise _refuse("model.rope_theta", f"a rotary base of {m.rope_theta} (--rotary-base is an integer)")
        a += [("--position-embedding-type", "rope"), ("--rotary-base", int(m.rope_theta))]
        a += _rotary_share_args(m)
        a += _rope_scaling_args(m)
    elif m.position == "learned":
        a.append(("--position-embedding-type", "learned_absolute"))
    else:
        a += [("--position-embedding-type", "none"), ("--no-position-embedding", True)]
    if not m.tied_embeddings:
        a.append(("--untie-embeddings-and-output-weights", True))
    if not m.bias:
        a.append(("--disable-bias-linear", True))
        if m.qkv_bias:
            a.append(("--add-qkv-bias", True))
    elif not m.qkv_bias:
        raise _refuse("model.qkv_bias", "biases on the output and MLP linears without them on Q, K and V")
    if m.is_mla:
        a += [("--multi-latent-attention", True), ("--kv-lora-rank", m.kv_lora_rank),
              ("--qk-head-dim", m.qk_nope_head_dim), ("--qk-pos-emb-head-dim", m.qk_rope_head_dim),
              ("--v-head-dim", m.v_head_dim)]
        if m.q_lora_rank is not None:
            a.append(("--q-lora-rank", m.q_lora_rank))
    if m.is_moe:
        a += _moe_args(m)
    return a


def _rotary_share_args(m) -> list[tuple[str, object]]:
    """Partial and pair-wise RoPE. Megatron Core rotates the first `rotary_percent` of each
    head's width and passes the rest, as transformers' partial rotary does; `rotary_interleaved`
    rotates adjacent pairs (GPT-J, GLM), which its multi-latent attention refuses
    (rope_utils._apply_rotary_pos_emb_bshd, TransformerConfig.__post_init__ at core_v0.16)."""
    a: list[tuple[str, object]] = []
    if m.rotary_fraction < 1:
        if m.is_mla:
            raise _refuse("model.rotary_fraction", "partial rotary inside multi-latent attention (its rotated "
                          "width is --qk-pos-emb-head-dim)")
        a.append(("--rotary-percent", m.rotary_fraction))
    if m.rope_interleaved:
        if m.is_mla:
            raise _refuse("model.rope_interleaved", "interleaved RoPE with multi-latent attention")
        a.append(("--rotary-interleaved", True))
    return a


def _rope_scaling_args(m) -> list[tuple[str, object]]:
    s = m.rope_scaling
    if s is None:
        return []
    if s.kind == "llama3":
        fixed = {k: getattr(s, k) for k in LLAMA3_ROPE_FIXED}
        if fixed != LLAMA3_ROPE_FIXED:
            raise _refuse("model.rope_scaling", f"Llama 3 rotary scaling with {fixed} (Megatron Core fixes "
                          f"{LLAMA3_ROPE_FIXED}; only the factor is a flag)")
        return [("--use-rope-scaling", True), ("--rope-scaling-factor", s.factor)]
    if s.kind != "yarn":
        raise _refuse("model.rope_scaling", f"{s.kind} rotary scaling (its GPT model scales by the llama3 rule or "
                      "YaRN)")
    fixed = {k: getattr(s, k) for k in YARN_FIXED}
    if fixed != YARN_FIXED or not m.is_mla:
        raise _refuse("model.rope_scaling", f"YaRN with {fixed}{'' if m.is_mla else ' outside multi-latent attention'}"
                      f" (its flags give the factor and mscale; MLATransformerConfig fixes {YARN_FIXED})")
    return [("--rope-type", "yarn"), ("--rotary-scaling-factor", s.factor), ("--mscale", s.mscale or 1.0),
            ("--mscale-all-dim", s.mscale_all_dim or 0.0)]


def _moe_args(m) -> list[tuple[str, object]]:
    a: list[tuple[str, object]] = [("--num-experts", m.experts), ("--moe-router-topk", m.top_k),
                                   ("--moe-ffn-hidden-size", m.expert_ffn or m.ffn)]
    if m.first_dense_layers or m.moe_layer_freq > 1:
        # a Python list expression Megatron evaluates (moe_freq_type): 1 for an MoE layer
        pattern = [0 if i < m.first_dense_layers or (i - m.first_dense_layers) % m.moe_layer_freq else 1
                   for i in range(m.layers)]
        runs, out = [], []
        for bit in pattern:
            if runs and runs[-1][0] == bit:
                runs[-1][1] += 1
            else:
                runs.append([bit, 1])
        out = "+".join(f"[{bit}]*{n}" for bit, n in runs)
        a.append(("--moe-layer-freq", f"({out})"))
    if m.shared_experts:
        a.append(("--moe-shared-expert-intermediate-size", m.shared_experts * (m.shared_expert_ffn or m.expert_ffn
                                                                              or m.ffn)))
        if m.shared_expert_gate:
            a.append(("--moe-shared-expert-gate", True))
    if m.router_score == "sigmoid":
        if not m.router_norm_topk:
            raise _refuse("model.router_norm_topk", "sigmoid routing without renormalised top-k weights")
        a.append(("--moe-router-score-function", "sigmoid"))
    elif not m.router_norm_topk:
        a.append(("--moe-router-pre-softmax", True))  # softmax over all experts, top-k not renormalised
    if m.router_bias:
        a.append(("--moe-router-enable-expert-bias", True))
    if m.router_scale != 1.0:
        a.append(("--moe-router-topk-scaling-factor", m.router_scale))
    if m.router_groups is not None:
        a += [("--moe-router-num-groups", m.router_groups), ("--moe-router-group-topk", m.router_group_topk)]
    if m.capacity_factor is not None:
        a.append(("--moe-expert-capacity-factor", m.capacity_factor))
    return a


def layout_string(split: list[int], vpp: int) -> str:
    """Megatron Core's --pipeline-model-parallel-layout (PipelineParallelLayerLayout): the
    virtual stages in order (rank r's chunk c is stage c * pp + r), each its decoder layers
    `t`, the embedding `E` first and the loss `L` last, e.g. "Et*7|t*8|...|t*7L"."""
    pp = len(split)
    stages = [split[r] // vpp for _ in range(vpp) for r in range(pp)]
    parts = [f"t*{n}" if n else "" for n in stages]
    parts[0], parts[-1] = "E" + parts[0], parts[-1] + "L"
    return "|".join(parts)


def _pipeline_args(layout) -> list[tuple[str, object]]:
    """Uneven first and last stages are Megatron's --decoder-first/last-pipeline-num-layers;
    any other split is its --pipeline-model-parallel-layout."""
    p, split = layout.plan, list(layout.stage_layers)
    a: list[tuple[str, object]] = []
    if layout.pp == 1:
        return a
    if p.schedule == "dualpipe":
        raise _refuse("schedule", "DualPipe (DeepSeek's own engine, deepseek-ai/DualPipe); export 1f1b "
                      "or interleaved")
    if p.schedule not in ("1f1b", "interleaved"):
        raise _refuse("schedule", f"the {p.schedule} schedule (its training loop runs 1F1B, and interleaved "
                      "1F1B with virtual stages); export 1f1b or interleaved")
    if any(n % layout.vpp for n in split):
        raise _refuse("vpp", f"{layout.vpp} virtual stages on the split {split}: each stage's layers must "
                      f"divide by {layout.vpp}; plan (or search) with --framework megatron to keep to such "
                      "splits, or export to torchtitan (virtual stages may differ by a layer there)")
    middle = split[1:-1]
    if len(set(split)) == 1:
        if layout.vpp > 1:
            a.append(("--num-virtual-stages-per-pipeline-rank", layout.vpp))
    elif layout.pp > 2 and len(set(middle)) == 1 and layout.vpp == 1:
        a += [("--decoder-first-pipeline-num-layers", split[0]), ("--decoder-last-pipeline-num-layers", split[-1])]
    else:
        a.append(("--pipeline-model-parallel-layout", layout_string(split, layout.vpp)))
    if layout.vpp > 1 and p.pp_group is not None:
        a.append(("--microbatch-group-size-per-virtual-pipeline-stage", p.pp_group))
    return a


def _training_args(layout) -> list[tuple[str, object]]:
    p = layout.plan
    a: list[tuple[str, object]] = []
    if p.recompute == "selective":
        a.append(("--recompute-granularity", "selective"))
        if p.recompute_modules:
            a.append(("--recompute-modules", " ".join(p.recompute_modules)))
    elif p.recompute == "full":
        a += [("--recompute-granularity", "full"),
              ("--recompute-method", "block" if p.recompute_layers is not None else "uniform"),
              ("--recompute-num-layers", p.recompute_layers if p.recompute_layers is not None else 1)]
    if p.optimizer not in OPTIMIZERS:
        raise _refuse("optimizer", f"{p.optimizer} (its --optimizer takes adam (AdamW), sgd, muon)")
    a.append(("--optimizer", OPTIMIZERS[p.optimizer]))
    if p.optimizer == "sgd":
        a.append(("--sgd-momentum", 0.0))
    if p.optimizer_state_dtype not in (None, "fp32"):  # Adam's moments in 16 bits, the master copy fp32
        a += [("--use-precision-aware-optimizer", True), ("--exp-avg-dtype", p.optimizer_state_dtype),
              ("--exp-avg-sq-dtype", p.optimizer_state_dtype)]
    if layout.zero == 1:
        a.append(("--use-distributed-optimizer", True))
        if layout.dp_shard < layout.dp:  # the optimizer sharded within groups, replicated across them
            a.append(("--num-distributed-optimizer-instances", layout.dp // layout.dp_shard))
    elif layout.zero >= 2:  # Megatron-FSDP: gradients (ZeRO-2) and parameters (ZeRO-3) sharded too
        if layout.dp_shard < layout.dp:
            raise _refuse("dp_shard", f"ZeRO-{layout.zero} within groups of {layout.dp_shard} (Megatron-FSDP "
                          "shards over all data-parallel ranks)")
        a += [("--use-megatron-fsdp", True), ("--use-distributed-optimizer", True),
              ("--data-parallel-sharding-strategy", "optim_grads" if layout.zero == 2 else "optim_grads_params"),
              ("--ckpt-format", "fsdp_dtensor")]
    if p.offload_params:
        raise _refuse("offload_params", "parameters offloaded to the host (--optimizer-cpu-offload moves "
                      "the optimizer only)")
    if p.offload_optimizer:  # Megatron-Core's HybridDeviceOptimizer steps on the host
        a.append(("--optimizer-cpu-offload", True))
    if p.fused_loss:  # the fused vocabulary-parallel cross-entropy
        a.append(("--cross-entropy-loss-fusion", True))
    if p.precision != "fp32" and not p.master_weights:
        raise _refuse("master_weights", "pure 16-bit training (it keeps fp32 main parameters; plan with "
                      "--master-weights)")
    if p.precision in ("bf16", "fp8"):
        a.append(("--bf16", True))
    elif p.precision == "fp16":
        a.append(("--fp16", True))
    if p.precision in ("bf16", "fp8") and "bf16" in (p.grad_dtype, p.reduce_dtype):
        a.append(("--grad-reduce-in-bf16", True))  # the gradient buffer and its reduction in bf16, not fp32
    if p.precision == "fp8":
        a.append(("--fp8-format", "hybrid"))
        if p.fp8_params:  # the compute weights held and gathered in FP8
            if layout.zero == 0:  # validate_args: "only supported with distributed optimizer"
                raise _refuse("fp8_params", "FP8 weights without the distributed optimizer (--fp8-param-gather "
                              "needs it); plan with --zero 1")
            a.append(("--fp8-param-gather", True))
    if p.attention == "eager":
        a += [("--attention-backend", "unfused")]
    else:
        a.append(("--use-flash-attn", True))
    if p.overlap_dp:
        a.append(("--overlap-grad-reduce", True))
        if layout.zero >= 1:
            a.append(("--overlap-param-gather", True))
    if p.overlap_tp:
        a.append(("--tp-comm-overlap", True))
    a += [("--attention-dropout", p.dropout), ("--hidden-dropout", p.dropout), ("--clip-grad", p.grad_clip)]
    return a


def notes(layout) -> list[str]:
    """Where Megatron-LM runs otherwise than the plan, and what the user still sets."""
    p = layout.plan
    out = [f"yours to set (a plan does not decide them): {', '.join(USER_CHOICES)}; the tokenizer is "
           f"the model's ({layout.model.vocab:,} tokens)"]
    if layout.zero >= 2:  # Megatron-LM's validate_args checks the launch environment
        out.append("launch with CUDA_DEVICE_MAX_CONNECTIONS unset or above 1 (Megatron-FSDP requires it)")
    elif layout.tp > 1 or layout.cp > 1:
        out.append("launch with CUDA_DEVICE_MAX_CONNECTIONS=1 (Megatron-LM requires it with tensor or context "
                   "parallelism)")
    if p.recompute == "full" and recipe(p).early_stop_checkpoint:
        out.append("recompute full: Megatron-LM re-runs every checkpointed layer whole; plan with "
                   "--no-recompute-early-stop to match")
    hopper_cudnn = te_prefers_cudnn(layout.gpu.name)
    if p.attention == "triton":
        kernel, option = ("cuDNN attention (Transformer Engine's choice here)", "cudnn") if hopper_cudnn else \
            ("FlashAttention-2 (--use-flash-attn)", "flash")
        out.append(f"attention triton: Megatron-LM runs {kernel}, 2-3.5x the speed of the Triton kernel "
                   f"(Dao 2023, Fig. 4d); plan with --attention {option} to match")
    if p.attention == "flash" and hopper_cudnn:
        out.append(f"attention flash: Transformer Engine prefers cuDNN attention on {layout.gpu.name}; "
                   "set NVTE_FUSED_ATTN=0 to run FlashAttention-2")
    if p.attention == "cudnn" and not hopper_cudnn:
        out.append(f"attention cudnn: Transformer Engine prefers FlashAttention-2 on {layout.gpu.name}; "
                   "set NVTE_FLASH_ATTN=0 to run cuDNN attention")
    return out


def megatron_flags(layout) -> list[tuple[str, object]]:
    """The plan as (flag, value) pairs; True marks a flag without a value."""
    m = layout.model
    a = _model_args(m)
    a += [("--seq-length", layout.seq_len), ("--max-position-embeddings", max(m.max_position, layout.seq_len)),
          ("--tensor-model-parallel-size", layout.tp), ("--pipeline-model-parallel-size", layout.pp),
          ("--context-parallel-size", layout.cp)]
    if layout.cp > 1:
        a.append(("--cp-comm-type", "all_gather" if layout.plan.cp_comm == "allgather" else "p2p"))
    if m.is_moe:
        a.append(("--expert-model-parallel-size", layout.ep))
    if layout.sp:
        a.append(("--sequence-parallel", True))
    a += _pipeline_args(layout)
    a += [("--micro-batch-size", layout.mbs), ("--global-batch-size", layout.gbs)]
    return a + _training_args(layout)


def megatron_args(layout) -> str:
    lines = []
    for flag, value in megatron_flags(layout):
        lines.append(flag if value is True else f"{flag} {value}")
    return "\n".join(lines) + "\n"
