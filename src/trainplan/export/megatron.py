"""Megatron-LM command-line arguments (megatron/training/arguments.py) for a plan."""

from __future__ import annotations

import shlex

from ..errors import PlanError
from ..estimate.recipe import recipe
from ..plan import te_prefers_cudnn


def megatron_args(layout) -> str:
    p, m = layout.plan, layout.model
    a: list[tuple[str, object]] = [
        ("--num-layers", m.layers), ("--hidden-size", m.hidden), ("--num-attention-heads", m.heads),
        ("--ffn-hidden-size", m.ffn), ("--seq-length", layout.seq_len),
        ("--max-position-embeddings", max(m.max_position, layout.seq_len)),
        ("--tensor-model-parallel-size", layout.tp), ("--pipeline-model-parallel-size", layout.pp),
        ("--context-parallel-size", layout.cp),
        ("--micro-batch-size", layout.mbs), ("--global-batch-size", layout.gbs),
    ]
    flags: list[str] = []
    if m.n_kv_heads != m.heads:
        flags.append("--group-query-attention")
        a.append(("--num-query-groups", m.n_kv_heads))
    if m.mlp == "swiglu":
        flags.append("--swiglu")
    a.append(("--normalization", "RMSNorm" if m.norm == "rmsnorm" else "LayerNorm"))
    a.append(("--position-embedding-type", "rope" if m.position == "rotary" else "learned_absolute"))
    if not m.tied_embeddings:
        flags.append("--untie-embeddings-and-output-weights")
    if not m.bias:
        flags.append("--disable-bias-linear")
    if m.qkv_bias and not m.bias:
        flags.append("--add-qkv-bias")
    if m.is_moe:
        a += [("--num-experts", m.experts), ("--moe-router-topk", m.top_k),
              ("--moe-ffn-hidden-size", m.expert_ffn or m.ffn), ("--expert-model-parallel-size", layout.ep)]
    if layout.sp:
        flags.append("--sequence-parallel")
    if p.schedule == "dualpipe" and layout.pp > 1:
        raise PlanError("schedule", "Megatron-LM has no DualPipe schedule (DeepSeek's own engine, "
                        "deepseek-ai/DualPipe); export 1f1b, interleaved or zb")
    if p.pp_group is not None:
        a.append(("--microbatch-group-size-per-virtual-pipeline-stage", p.pp_group))
    if p.schedule == "interleaved":
        if any(n % layout.vpp for n in layout.stage_layers):
            raise PlanError("vpp", f"Megatron-LM's --num-layers-per-virtual-pipeline-stage needs every stage's layers "
                            f"{layout.stage_layers} divisible by {layout.vpp}; plan (or search) with --framework "
                            "megatron to keep to such splits, or export to torchtitan (virtual stages may differ "
                            "by a layer there)")
        a.append(("--num-layers-per-virtual-pipeline-stage", layout.stage_layers[0] // layout.vpp))
    if p.recompute != "none":
        a.append(("--recompute-granularity", p.recompute))
        if p.recompute == "full":
            a += [("--recompute-method", "block" if p.recompute_layers is not None else "uniform"),
                  ("--recompute-num-layers", p.recompute_layers if p.recompute_layers is not None else 1)]
    if p.optimizer_state_dtype not in (None, "fp32"):  # Adam's moments in 16 bits, the master copy fp32
        flags.append("--use-precision-aware-optimizer")
        a += [("--exp-avg-dtype", p.optimizer_state_dtype), ("--exp-avg-sq-dtype", p.optimizer_state_dtype)]
    if layout.zero >= 1:
        flags.append("--use-distributed-optimizer")
        if layout.dp_shard < layout.dp:  # the optimizer sharded within groups, replicated across them
            a.append(("--num-distributed-optimizer-instances", layout.dp // layout.dp_shard))
    if p.offload_optimizer:  # Megatron-Core's HybridDeviceOptimizer steps on the host
        flags.append("--optimizer-cpu-offload")
    if p.fused_loss:  # the fused vocabulary-parallel cross-entropy
        flags.append("--cross-entropy-loss-fusion")
    if p.precision in ("bf16", "fp8"):
        flags.append("--bf16")
    elif p.precision == "fp16":
        flags.append("--fp16")
    if p.precision in ("bf16", "fp8") and "bf16" in (p.grad_dtype, p.reduce_dtype):
        flags.append("--grad-reduce-in-bf16")  # the gradient buffer and its reduction in bf16, not fp32
    if p.precision == "fp8":
        a.append(("--fp8-format", "hybrid"))
    if p.attention != "eager":
        flags.append("--use-flash-attn")
    if p.overlap_dp:
        flags.append("--overlap-grad-reduce")
        if layout.zero >= 1:
            flags.append("--overlap-param-gather")
    if p.overlap_tp:
        flags.append("--tp-comm-overlap")
    a.append(("--attention-dropout", p.dropout))
    a.append(("--hidden-dropout", p.dropout))
    a.append(("--optimizer", "sgd" if p.optimizer.startswith("sgd") else "adam"))
    a.append(("--clip-grad", p.grad_clip))
    lines = [f"{k} {shlex.quote(str(v))}" for k, v in a] + flags
    notes = []
    if p.offload_params:
        notes.append("# offload params: Megatron-LM offloads the optimizer (--optimizer-cpu-offload), not the "
                     "parameters; the plan's memory keeps them on the host")
    if layout.zero >= 2:
        notes.append(f"# ZeRO-{layout.zero}: Megatron's distributed optimizer shards optimizer state (ZeRO-1); "
                     "use Megatron-FSDP for ZeRO-3")
    if p.precision != "fp32" and not p.master_weights:
        notes.append("# no master weights: Megatron-LM keeps fp32 main parameters and gradients in 16-bit training; "
                     "the plan's memory is pure 16-bit training's")
    if p.recompute == "full" and recipe(p).early_stop_checkpoint:
        notes.append("# recompute full: Megatron-LM re-runs every checkpointed layer whole; plan with "
                     "--no-recompute-early-stop to match")
    hopper_cudnn = te_prefers_cudnn(layout.gpu.name)
    if p.attention == "triton":
        kernel, option = ("cuDNN attention (Transformer Engine's choice here)", "cudnn") if hopper_cudnn else \
            ("FlashAttention-2 (--use-flash-attn)", "flash")
        notes.append(f"# attention triton: Megatron-LM runs {kernel}, 2-3.5x the speed of the Triton kernel "
                     f"(Dao 2023, Fig. 4d); plan with --attention {option} to match")
    if p.attention == "flash" and hopper_cudnn:
        notes.append(f"# attention flash: Transformer Engine prefers cuDNN attention on {layout.gpu.name}; "
                     "set NVTE_FUSED_ATTN=0 to run FlashAttention-2")
    if p.attention == "cudnn" and not hopper_cudnn:
        notes.append(f"# attention cudnn: Transformer Engine prefers FlashAttention-2 on {layout.gpu.name}; "
                     "set NVTE_FLASH_ATTN=0 to run cuDNN attention")
    if p.stage_layers is not None or len(set(layout.stage_layers)) > 1:
        notes.append(f"# uneven pipeline split {layout.stage_layers}: set --decoder-first-pipeline-num-layers "
                     "and --decoder-last-pipeline-num-layers accordingly")
    header = [f"# Megatron-LM arguments for {m.name} on {layout.gpus} x {layout.gpu.name} "
              f"(TP {layout.tp} PP {layout.pp} DP {layout.dp} CP {layout.cp}), generated by trainplan", *notes]
    return "\n".join(header) + "\n" + " \\\n".join(lines) + "\n"
