"""The validation matrix: architectures x attention x recompute x precision recipe on one
process, plus sharded layouts (TP, ZeRO-1, FSDP2 as ZeRO-2 and ZeRO-3, hybrid-sharded FSDP2,
TP x FSDP2, expert parallelism, ZeRO-2 as DeepSpeed and Megatron run it) in local processes,
and pure bf16, LoRA, recomputing some layers, dropout and
fp16.
Small enough for a 2-core CI machine; used by the test suite and by
`scripts/validation_report.py` (docs/validation.md)."""

from __future__ import annotations

import itertools

ARCHITECTURES = ("gpt2", "llama-3-8b", "mixtral-8x7b")
ATTENTION = ("flash", "eager")
RECOMPUTE = ("none", "selective", "full")
# (precision, framework): fp32; autocast bf16 with fp32 weights; bf16 weights with fp32
# master copies; and Megatron's fused kernels with fp32 main gradients.
RECIPES = (("fp32", "torch"), ("bf16", "torch"), ("bf16", "deepspeed"), ("bf16", "megatron"))

SHARDED = (
    ("tensor parallel 2", dict(gpus=2, tp=2, precision="fp32", framework="torch")),
    ("ZeRO-1 (DDP + ZeroRedundancyOptimizer), dp 2", dict(gpus=2, zero=1, precision="bf16", framework="torch")),
    ("ZeRO-3 (FSDP2), dp 2", dict(gpus=2, zero=3, precision="bf16", framework="fsdp")),
)
TWO_D = ("TP 2 x FSDP2 dp 2", dict(model="llama-3-8b", gpus=4, tp=2, zero=3, precision="bf16", framework="fsdp"))
# dp 4 tells the fp32 shards (1 byte per parameter) from the bf16 copies kept gathered (2)
SHARD_GRAD_OP = ("ZeRO-2 (FSDP2 SHARD_GRAD_OP), dp 4",
                 dict(model="llama-3-8b", gpus=4, zero=2, precision="bf16", framework="fsdp"))
HYBRID = ("HSDP: FSDP2 sharded over 2, replicated x 2",
          dict(model="llama-3-8b", gpus=4, dp_shard=2, zero=3, precision="bf16", framework="fsdp"))
# pure 16-bit training: the model cast to bf16, torch.optim's state in bf16 too
PURE16 = (("pure bf16 (torch.optim on a bf16 model)",
           dict(model="llama-3-8b", gpus=1, precision="bf16", framework="torch", master_weights=False)),
          ("pure bf16, ZeRO-3 (FSDP2), dp 2",
           dict(model="llama-3-8b", gpus=2, zero=3, precision="bf16", framework="fsdp", master_weights=False)))
# LoRA (rank 16 on every linear, the base frozen in bf16), one process
LORA = (("LoRA rank 16, bf16 base (deepspeed)", dict(model="llama-3-8b", gpus=1, finetune="lora", framework="deepspeed")),
        ("LoRA rank 16, bf16 base (megatron)", dict(model="llama-3-8b", gpus=1, finetune="lora", framework="megatron")),
        ("LoRA rank 16 on a mixture of experts", dict(model="mixtral-8x7b", gpus=1, finetune="lora",
                                                       framework="deepspeed")),
        ("LoRA on shared and routed experts", dict(model="qwen1.5-moe-a2.7b", gpus=1, finetune="lora",
                                                   framework="deepspeed")),
        # PEFT's fp32 adapters under autocast beside the bf16 base
        ("LoRA under autocast (fp32 adapters, torch)", dict(model="llama-3-8b", gpus=1, finetune="lora",
                                                            framework="torch")),
        # a reentrant checkpoint needs an input that requires grad: the embedding's output
        ("LoRA + full recompute (reentrant)", dict(model="llama-3-8b", gpus=1, finetune="lora",
                                                   framework="deepspeed", recompute="full")),
        ("LoRA + full recompute (non-reentrant, early stop)", dict(model="llama-3-8b", gpus=1, finetune="lora",
                                                                   framework="fsdp", recompute="full")),
        # PEFT's lora_dropout: each adapter keeps its dropped input and mask, not the shared input
        ("LoRA with dropout on the adapters", dict(model="llama-3-8b", gpus=1, finetune="lora", lora_dropout=0.1,
                                                   framework="deepspeed")),
        ("LoRA with adapter dropout + selective recompute", dict(model="mixtral-8x7b", gpus=1, finetune="lora",
                                                                 lora_dropout=0.1, framework="megatron",
                                                                 recompute="selective")))
RECOMPUTED = ("ZeRO-3 (FSDP2) + full recompute, dp 2",
              dict(model="llama-3-8b", gpus=2, zero=3, precision="bf16", framework="fsdp", recompute="full"))
# full recompute of each stage's first half of the layers (scaled: 1 of 2)
SOME_RECOMPUTED = (("full recompute of half the layers",
                    dict(model="llama-3-8b", gpus=1, framework="megatron", recompute="full", recompute_layers=16)),
                   ("LoRA + full recompute of half the layers",
                    dict(model="llama-3-8b", gpus=1, finetune="lora", framework="torch", recompute="full",
                         recompute_layers=16)))


# dropout (on the CPU attention then runs materialised), with LoRA too; Megatron's fp16 keeps
# its gradients in fp16 (no fp32 main_grad)
OTHER = (("dropout 0.1", dict(model="llama-3-8b", gpus=1, framework="megatron", dropout=0.1)),
         ("LoRA + dropout 0.1", dict(model="llama-3-8b", gpus=1, framework="torch", finetune="lora", dropout=0.1)),
         ("fp16, fp16 gradients (megatron)", dict(model="llama-3-8b", gpus=1, framework="megatron",
                                                  precision="fp16")),
         # Adafactor factors each adapter matrix (A: in + r, B: r + out state elements)
         ("LoRA with Adafactor", dict(model="llama-3-8b", gpus=1, framework="torch", finetune="lora",
                                      optimizer="adafactor")),
         # a fused QKV projection with RoPE keeps the whole fused output (v is a view of it)
         ("fused QKV with RoPE", dict(model="gpt-neox-20b", gpus=1, framework="deepspeed")),
         # GQA 28/4 scaled to 8/2 so that tensor parallelism splits the KV heads
         ("tensor parallel 2 (GQA with QKV biases)", dict(model="qwen2.5-7b", gpus=2, tp=2, precision="fp32",
                                                          framework="torch")))


# Sequence parallelism (DTensor, validate/sequence.py), hidden 128, sequence 64; and context
# parallelism, which validate refuses on the CPU (sequence.check_context_parallel says why)
SP_SCALE = dict(hidden=128, seq_len=64, mbs=2)
SEQUENCE_PARALLEL = (
    ("TP 2 + SP", dict(model="llama-3-8b", gpus=2, tp=2, sp=True, precision="fp32", framework="torch")),
    ("TP 2 + SP, autocast bf16", dict(model="llama-3-8b", gpus=2, tp=2, sp=True, precision="bf16",
                                      framework="torch")),
    ("TP 2 + SP x FSDP2 dp 2", dict(model="llama-3-8b", gpus=4, tp=2, sp=True, zero=3, precision="bf16",
                                    framework="fsdp")))
# Context parallelism (validate/context_parallel.py): torch's context_parallel ring attention
# with the CPU flash kernel in its op table; the all-gather exchange is not torch's (refused)
CP_SCALE = dict(hidden=128, seq_len=64, mbs=2)
CONTEXT_PARALLEL = (("CP 2 (ring)", dict(model="llama-3-8b", gpus=2, cp=2, precision="fp32", framework="torch")),
                    ("CP 2 (ring), autocast bf16", dict(model="llama-3-8b", gpus=2, cp=2, precision="bf16",
                                                        framework="torch")),
                    ("CP 4 (ring)", dict(model="llama-3-8b", gpus=4, cp=4, precision="fp32", framework="torch")),
                    ("CP 2 (all-gather)", dict(model="llama-3-8b", gpus=2, cp=2, cp_comm="allgather",
                                               precision="fp32", framework="torch")))
# Expert parallelism across ranks (validate/expert_parallel.py): Mixtral's experts split over
# 2 ranks, copies dispatched by all-to-all under a fixed routing (balanced: the planner's uniform
# routing; skewed 70/30 between the ranks to show the spread)
EXPERT_PARALLEL = (("EP 2 (experts split over 2 ranks, all-to-all dispatch)",
                    dict(model="mixtral-8x7b", gpus=2, ep=2, precision="fp32", framework="torch")),
                   ("EP 2 under bf16 autocast", dict(model="mixtral-8x7b", gpus=2, ep=2, precision="bf16",
                                                     framework="torch")),
                   # Megatron-Core: the gate weights dispatched with the copies into the weighted SwiGLU
                   ("EP 2, Megatron-Core experts (bf16)", dict(model="mixtral-8x7b", gpus=2, ep=2, precision="bf16",
                                                               framework="megatron")))
EP_ROUTINGS = ("balanced", "skewed")
# ZeRO-2 as DeepSpeed and Megatron run it (validate/zero2.py): replicated 16-bit parameters,
# full gradients reduce-scattered after the backward, the optimizer sharded
ZERO2 = (("ZeRO-2 (DeepSpeed stage 2), dp 2", dict(model="llama-3-8b", gpus=2, zero=2, precision="bf16",
                                                    framework="deepspeed")),
         ("ZeRO-2 (Megatron distributed optimizer), dp 2", dict(model="llama-3-8b", gpus=2, zero=2,
                                                                 precision="bf16", framework="megatron")))


def single_process_plans():
    for model, attention, recompute, (precision, framework) in itertools.product(
            ARCHITECTURES, ATTENTION, RECOMPUTE, RECIPES):
        yield dict(model=model, gpus=1, attention=attention, recompute=recompute, precision=precision,
                   framework=framework)


def sharded_plans():
    for model in ARCHITECTURES:
        for label, kw in SHARDED:
            yield label, dict(model=model, **kw)
    yield TWO_D
    yield SHARD_GRAD_OP
    yield HYBRID
    yield from PURE16
    yield from LORA
    yield RECOMPUTED
    yield from SOME_RECOMPUTED
    yield from OTHER


# Pipelines (torch.distributed.pipelining, one process per stage): every schedule of torch's at
# pp 2 and 4 with m = pp, 2 pp and 4 pp micro-batches; two stages per rank where it interleaves
PIPELINE_SCHEDULES = (("gpipe", None), ("1f1b", None), ("interleaved", 2), ("looped_bfs", 2), ("zb", 1), ("zb", 2),
                      ("zbv", 2), ("dualpipev", 2))


def pipeline_plans(pps=(2, 4), per_stage=(1, 2, 4)):
    """(schedule, pp, micro-batches, vpp, plan options) for `validate --pp`; fp32 under the torch
    convention, a Llama-style model scaled to hidden 64 and two layers per stage."""
    for pp in pps:
        for k in per_stage:
            for schedule, vpp in PIPELINE_SCHEDULES:
                yield schedule, pp, k * pp, vpp, dict(
                    model="llama-3-8b", gpus=pp, pp=pp, framework="torch", precision="fp32", schedule=schedule,
                    vpp=vpp, mbs=1, gbs=k * pp)


# Multi-head latent attention (DeepSeek-V3 scaled down in proportion, mla.py), one process
MLA = (("MLA, fp32", dict(model="deepseek-v3", gpus=1, precision="fp32", framework="torch")),
       ("MLA, bf16 autocast (torch)", dict(model="deepseek-v3", gpus=1, framework="torch")),
       ("MLA, bf16 (deepspeed)", dict(model="deepseek-v3", gpus=1, framework="deepspeed")),
       ("MLA, bf16 fused kernels (megatron)", dict(model="deepseek-v3", gpus=1, framework="megatron")),
       ("MLA, eager attention (deepspeed)", dict(model="deepseek-v3", gpus=1, framework="deepspeed",
                                                 attention="eager")))
# LoRA through peft on the transformers model (validate --impl transformers, peft_lora.py)
PEFT = (("peft LoRA, bf16 base, fp32 adapters under autocast", dict(model="llama-3-8b", gpus=1, finetune="lora",
                                                                   framework="torch")),
        ("peft LoRA, fp32", dict(model="llama-3-8b", gpus=1, finetune="lora", framework="torch", precision="fp32")),
        ("peft LoRA, fp32, lora_dropout 0.1", dict(model="llama-3-8b", gpus=1, finetune="lora", framework="torch",
                                                   precision="fp32", lora_dropout=0.1)),
        ("peft LoRA on q and v, bf16 base", dict(model="llama-3-8b", gpus=1, finetune="lora", framework="torch",
                                                 lora_targets=["q", "v"])),
        ("peft LoRA, bf16 base, lora_dropout 0.1 under autocast",
         dict(model="llama-3-8b", gpus=1, finetune="lora", framework="torch", lora_dropout=0.1)))
