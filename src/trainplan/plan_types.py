"""The plan's categorical choices, shared by the plan model and the CLI."""

from typing import Literal

Recompute = Literal["none", "selective", "full", "selective-op"]
# the pipeline schedules (estimate/pipeline.py: each one's in-flight rule and its source)
Schedule = Literal["gpipe", "1f1b", "interleaved", "zb", "dualpipe", "looped_bfs", "zbv", "dualpipev"]
Precision = Literal["fp32", "bf16", "fp16", "fp8"]
Optimizer = Literal["adamw", "adam", "sgd", "sgd-momentum", "adafactor", "adam-8bit", "lion"]
Attention = Literal["auto", "flash", "sdpa", "eager", "triton", "cudnn"]
Framework = Literal["deepspeed", "deepspeed-0.4", "megatron", "fsdp", "fsdp1", "torch"]
OptimizerImpl = Literal["fused", "foreach", "for-loop"]
Finetune = Literal["full", "lora", "qlora"]
GradDtype = Literal["fp32", "bf16", "fp16"]
CpComm = Literal["ring", "allgather"]
BackwardPrefetch = Literal["pre", "post", "none"]
# Megatron-Core's --recompute-modules (transformer_config.py recompute_modules) that trainplan
# models: with --recompute selective, the attention core (its default), the norms' outputs, MLA's
# up-projections with RoPE, and the experts' activation function
RecomputeModule = Literal["core_attn", "layernorm", "mla_up_proj", "moe_act"]
# saved tensors an FP8 recipe keeps in low precision besides the linears' inputs
# (estimate/activations.py FP8_CACHED; DeepSeek-V3 §3.3.3)
Fp8Cached = Literal["attn_out", "moe_act_input"]
