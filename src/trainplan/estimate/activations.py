"""Bytes saved for backward, derived from the tensors each op saves.

One rule covers every architecture: walk the ops of a layer, and for each op count the
tensors autograd keeps for its backward (deduplicated: a tensor saved by two ops counts once).
What each op saves, per token, for hidden size h, query width q, key/value widths k, v,
MLP width f (elements; `act` bytes each unless stated):

* norm (LayerNorm / fused RMSNorm): its input h, plus fp32 statistics (mean and rstd for
  LayerNorm, rstd for RMSNorm). Eager RMSNorm (`x * rsqrt(mean(x²)) * w`, Hugging Face and
  `torch.nn.functional.rms_norm` on CPU) upcasts to fp32 and keeps the fp32 input and the
  fp32 normalised input: 2h x 4 bytes.
* linear: its input (the previous op's output), only when its weight is trainable.
* attention core: q, k, v (new tensors after RoPE, or views of the fused QKV output; their
  storage is q + k + v either way), then
    - flash (FlashAttention), triton (FlashAttention in Triton) and sdpa
      (`torch.nn.functional.scaled_dot_product_attention`, which dispatches to its flash or
      memory-efficient kernels): the output and the fp32
      log-sum-exp per head. The kernels return the output in (batch, seq, heads, dim)
      memory order, so the transpose back before the output projection is a view and the
      projection's saved input is the same storage (measured on torch 2.13, CPU);
    - eager (materialised scores): the softmax output, a·s² per sequence, plus with dropout
      its 1-byte mask and the dropped copy; keys and values repeated to every query head
      for GQA; the output projection's input (a contiguous copy of probs @ V); and once per
      micro-batch the s² boolean causal mask (`masked_fill` keeps it).
* RoPE: the cos and sin tables (seq x rotary dim each), once per micro-batch.
* MLP: the activation function keeps what its ops keep (ACTIVATION_SAVES, below: F.gelu keeps
  its input, so a GELU MLP keeps 2f with the down projection's input; transformers' gelu_new
  5f, gelu_fast 8f); gated (SwiGLU): the activation's tensors, its output, up and their product
  (4f with SiLU); a fused SwiGLU kernel keeps gate and up and recomputes silu (3f). Fused
  kernels (Megatron's bias-GELU and SwiGLU) run any activation as one kernel keeping its input.
* dropout: a 1-byte mask per element (CUDA's bool mask).
* MoE: fp32 router probabilities (E), int64 top-k indices and per routed token its indices
  and gate weight; the dispatched copies of each token (k·h expert inputs), the expert
  outputs before weighting (k·h; not where the experts apply the gate weights inside their
  activation, Megatron-Core's weighted SwiGLU) and, with an eager `index_add` combine, after
  (k·h); expert MLP intermediates for k tokens; shared experts like a dense MLP. transformers 5's
  grouped experts (`grouped_mm`, its default) sort the copies by expert and combine them by a
  reshape and sum: no weighted copy, one more int64 index per copy, fp32 gate weights, and,
  as `torch._grouped_mm` is not autocast, the experts run in the weights' dtype.

Checks: with flash attention and no dropout a GPT layer keeps 16·sbh elements; with
16-bit activations and 1-byte dropout masks that is Korthikanti et al. 2023's 34·sbh
bytes, and eager attention adds their 5·a·s²·b (Table 2). Tensor parallelism splits what is
inside the attention heads and the MLP; sequence parallelism splits the rest
(norm inputs, dropout masks) over the same ranks; context parallelism splits tokens.

Every function takes numbers or numpy arrays and broadcasts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from .memo import cached_hash
from .scalars import bools, floats, maximum, minimum, values, where

ATTENTION = ("flash", "sdpa", "eager", "triton", "cudnn")
ATTENTION_CODE = {name: i for i, name in enumerate(ATTENTION)}
# "selective-op": torchtitan's per-op selective activation checkpointing (op_sac_saved)
RECOMPUTE = ("none", "selective", "full", "selective-op")
RECOMPUTE_CODE = {name: i for i, name in enumerate(RECOMPUTE)}
# Megatron-Core's selective recompute modules (megatron/core/transformer/transformer_config.py
# @d98e8a64, recompute_modules; default ["core_attn"]). "layernorm", "mla_up_proj" and "moe_act"
# use output-discarding checkpointing: the module's output, kept by the op after it, is dropped
# after the forward and recomputed from the module's input before the backward needs it.
RECOMPUTE_MODULES = ("core_attn", "layernorm", "mla_up_proj", "moe_act")

FP32 = 4
TOKEN_ID_BYTES = 8  # int64 token ids, kept by the embedding's backward
INDEX_BYTES = 8  # int64 indices (top-k choices, gather/scatter indices)
MASK_BYTES = 1  # torch.bool dropout mask (CUDA); CPU kernels keep a mask in the input dtype

# What an MLP activation function keeps for backward, in tensors as wide as its input:
# (tensors kept besides its output, 1 if it keeps its output). From the ops of transformers
# 5.x `activations.py` (ACT2FN) and what PyTorch's derivatives save (derivatives.yaml: mul of
# two tensors keeps both, pow keeps its input, tanh and sigmoid and relu their output, a
# product with a Python number nothing); measured with saved_tensors_hooks on torch 2.13
# (tests/test_hf_activations.py). None: one kernel keeping its input (F.gelu, F.silu, and
# Megatron's fused GELU: the convention of fused kernels, whatever the activation).
ACTIVATION_SAVES = {
    None: (1, 0),
    "gelu": (1, 0),  # GELUActivation: F.gelu (erf) keeps x
    "gelu_pytorch_tanh": (1, 0),  # GELUTanh: F.gelu(x, approximate="tanh") keeps x
    "silu": (1, 0), "swish": (1, 0),  # F.silu / nn.SiLU keep x
    # NewGELUActivation: 0.5*x * (1 + tanh(c*(x + 0.044715*pow(x, 3)))): pow keeps x, tanh its
    # output t, the last product 0.5*x and 1 + t
    "gelu_new": (4, 0),
    # FastGELUActivation: 0.5*x * (1 + tanh(x*0.7978845608 * (1 + 0.044715*x*x))): x and
    # 0.044715*x (their product), x*0.79788 and 1 + 0.044715*x*x (theirs), t, 0.5*x, 1 + t
    "gelu_fast": (7, 0),
    "quick_gelu": (2, 0),  # QuickGELUActivation: x * sigmoid(1.702*x) keeps x and the sigmoid
    "relu": (0, 1),  # nn.ReLU: its backward reads the output
    "relu2": (1, 0),  # ReLUSquaredActivation: square(relu(x)) keeps relu(x) (relu's output, square's input)
}
# gpt-oss's clamped SwiGLU (GptOssExperts._apply_gate): the two clamps keep gate and up (one
# storage, the gate_up output, 2f), then gate·sigmoid(α·gate) keeps the clamped gate and the
# sigmoid, and (up + 1)·glu keeps both factors: 4 more than the product its down projection
# keeps besides gate and up (counted as a gated MLP's 3f: kept 4 in place of SiLU's 1)
CLAMPED_SWIGLU_SAVES = (4, 0)
# The planner's experts implementation when a model states none: transformers 5's default.
DEFAULT_EXPERTS_IMPL = "grouped"


@dataclass(frozen=True)
class LayerShape:
    """Per-token widths of one transformer layer (whole model, before any parallel split)."""

    hidden: int
    heads: int
    kv_heads: int  # key/value heads (= heads for MHA and MLA)
    q: int  # query width
    k: int  # key width
    v: int  # value width
    attn_out: int  # attention output width (input of the output projection)
    latent: int  # MLA latent widths kept replicated (q_lora + kv_lora + rope), 0 otherwise
    ffn: int  # dense MLP width
    mlp_matrices: int  # 2 for GELU, 3 for SwiGLU
    layernorm: bool
    qkv_projections: int = 3  # linears reading the attention input (1 when QKV is fused)
    rotary: bool = False
    experts: int = 0
    top_k: int = 0
    expert_ffn: int = 0
    shared_ffn: int = 0  # total width of the shared experts
    shared_gate: bool = False  # a sigmoid gate scales the shared experts' output (Qwen-MoE)
    capacity_factor: float = 1.0
    activation_saves: tuple = (1, 0)  # ACTIVATION_SAVES of the MLP's activation function
    latent_rope: int = 0  # MLA: the shared rotary key's width inside `latent` (not normalised)
    latent_norms: int = 0  # MLA: RMSNorms on the latents (2 with a query latent, else 1)
    parallel_residual: bool = False  # the MLP's norm reads the attention norm's input (GPT-NeoX)
    grouped_experts: bool = False  # transformers' grouped experts (else an eager index_add loop)
    qk_norm: bool = False  # RMSNorm over each head of q and k (Qwen3)
    head_dim: int = 0  # width of one head (for the per-head norms' statistics)
    shared_norm: bool = False  # parallel residual with one norm feeding attention and MLP (GPT-J, Phi)
    rope_concat: bool = False  # RoPE's q is a concatenation (partial rotary), laid out heads-major
    # norms, attention masks and soft-capping (estimate/norm_features.py)
    post_norms: int = 0  # norms on a block's output besides the two before them (Gemma 2/3's sandwich: 2)
    python_layernorm: bool = False  # a LayerNorm written in PyTorch ops (Cohere): keeps 3 fp32 tensors
    qk_norm_all: bool = False  # the q/k norms span all heads (OLMo 2): one statistic per token
    attn_softcap: bool = False  # cap·tanh(scores/cap): eager keeps the tanh output
    sliding_share: float = 0.0  # share of the layers attending through a sliding window
    sliding_window: int = 0
    attention_sinks: bool = False  # gpt-oss: a sink logit joins every softmax
    final_softcap: bool = False  # cap·tanh(logits/cap) on the output head (Gemma 2)
    clip_qkv: bool = False  # q, k and v clamped in place (OLMo): each clamp keeps a copy of its input
    kv_repeat_view: bool = True  # eager's repeat of a rank's one KV head is a view (transformers' repeat_kv)

    def __hash__(self) -> int:  # the memoised layer terms key on it: hashed once
        return cached_hash(self)


def _adapted(shape: LayerShape, saves) -> dict:
    """1 for each LoRA target this layer has (a GELU MLP has no gate; a fused QKV projection
    counts as its q, k and v parts, as the parameter count does), 0 otherwise."""
    s = saves or {}
    return {n: s.get(n, 0) * (n != "gate" or shape.mlp_matrices == 3)
            for n in ("q", "k", "v", "o", "gate", "up", "down")}


def adapter_inputs(shape: LayerShape, saves, *, moe: bool, tp) -> float:
    """Per token: the elements LoRA's adapters read as input (the targeted linears' inputs:
    the hidden width for q, k, v, gate and up, the attention output for o, the MLP width for
    down, split by TP where the linear is row-parallel), once per routed copy in the experts."""
    on = _adapted(shape, saves)
    attn = (on["q"] + on["k"] + on["v"]) * shape.hidden + on["o"] * shape.attn_out / tp

    def mlp(width):
        return (on["gate"] + on["up"]) * shape.hidden + on["down"] * width / tp

    if not moe:
        return attn + mlp(shape.ffn)
    return attn + shape.top_k * shape.capacity_factor * mlp(shape.expert_ffn) + (shape.shared_ffn > 0) * mlp(
        shape.shared_ffn)


def layer_terms(shape: LayerShape, *, moe: bool, tokens, seq, tp, sp, act_bytes,
                linear_in_bytes, residual_bytes=None, autocast=0, attention, recompute, fused, dropout,
                saves=None, mask_bytes=MASK_BYTES, adapter_rank=0, adapter_dropout=0, modules=None,
                fp8_cache=None, gate_in_act=0, sp_gathered=0, adapter_copies=0, cp_output_copy=0,
                heads_major_copy=0) -> dict:
    """Bytes one layer saves for one micro-batch, by term.

    tokens: tokens per micro-batch on this rank (mbs·seq/cp); seq: the sequence length a
    rank's attention scores span; tp: tensor-parallel size; sp: 1 with sequence
    parallelism; attention: ATTENTION_CODE; recompute: RECOMPUTE_CODE (full recompute is
    applied by the caller); fused: 1 for fused norm/SwiGLU kernels; dropout: 1 when
    dropout is on; saves: 0/1 per LoRA target name for whether a linear's input is kept
    (None = full training, every linear trainable; under LoRA the norms' weights are frozen
    too); adapter_rank: LoRA's rank, whose x·A each adapter keeps for B's gradient;
    adapter_dropout: 1 when each adapter drops out its input, keeping the dropped copy and its
    mask for A's gradient instead of the input; adapter_copies: 1 when each adapter keeps its own
    16-bit copy of its input instead (peft's fp32 adapters under autocast); modules: 0/1 per output-discarding recompute
    module (RECOMPUTE_MODULES but core_attn, which `recompute` = selective carries), see
    `discard_recomputed`; fp8_cache: 0/1 per tensor kept in a low-precision format beyond the
    linears' inputs (FP8_CACHED), see `cache_low_precision`; gate_in_act: 1 where fused SwiGLU
    experts multiply by their gate weights inside the activation, before the down projection;
    sp_gathered: 1 where, under sequence parallelism, the linears reading a block's all-gathered
    input keep the gathered (full-sequence) tensor (`sp_gathers_saved_inputs`, conventions.toml);
    cp_output_copy: 1 where context parallelism's ring attention hands back its output in a
    layout the output projection's input is a copy of (`cp_ring_output_copy`, conventions.toml);
    heads_major_copy: 1 where a fused attention kernel returns its output in its query's memory
    order (PyTorch's CPU kernels; the CUDA kernels return (batch, seq, heads, dim) whatever the
    query's), see `_heads_major_output`.
    """
    c = _layer_context(shape, tokens=tokens, seq=seq, tp=tp, sp=sp, act_bytes=act_bytes,
                       linear_in_bytes=linear_in_bytes, residual_bytes=residual_bytes, autocast=autocast,
                       attention=attention, recompute=recompute, fused=fused, dropout=dropout, saves=saves,
                       mask_bytes=mask_bytes, adapter_dropout=adapter_dropout, sp_gathered=sp_gathered,
                       adapter_copies=adapter_copies)
    t = _attention_terms(c, cp_output_copy=cp_output_copy, heads_major_copy=heads_major_copy)
    _mlp_norm_terms(t, c)
    if moe:
        _moe_terms(t, c, gate_in_act=gate_in_act)
    else:
        t["mlp"] = tokens * _mlp_elems(shape.ffn, shape.mlp_matrices, fused, c.save["down"],
                                       act_bytes, linear_in_bytes, shape.activation_saves) / tp
    _lora_terms(t, c, saves=saves, moe=moe, adapter_rank=adapter_rank, adapter_dropout=adapter_dropout)
    if modules:
        discard_recomputed(t, shape, modules, moe=moe, tokens=tokens, tp=tp, linear_in_bytes=linear_in_bytes,
                           save_down=c.save["down"])
    if fp8_cache:
        cache_low_precision(t, shape, fp8_cache, moe=moe, tokens=tokens, tp=tp, act_bytes=act_bytes)
    return t


class _LayerContext(NamedTuple):
    """What every block of `layer_terms` reads: its arguments (see there) and what it derives
    from them once."""

    shape: LayerShape
    tokens: object
    seq: object
    tp: object
    act_bytes: object
    linear_in_bytes: object
    residual_bytes: object
    autocast: object
    recompute: object
    fused: object
    dropout: object
    mask_bytes: object
    frozen: float  # 1.0 under LoRA: the norms' weights are frozen too
    own_copy: object  # 1 where each adapter keeps its own input
    save: dict  # per linear (q, k, v, o, gate, up, down): 1 where its input is kept
    save_attn_in: object
    save_mlp_in: object
    rep: object  # the divisor of tensors tensor parallelism replicates (sequence parallelism shards)
    rep_in: object  # ... of what is computed from a block's all-gathered input
    eager_norm: object  # 1 where a norm runs unfused and is not a LayerNorm
    norm: object  # one norm's saved bytes per token
    eager: object  # materialised attention
    no_recompute: object


def _layer_context(shape: LayerShape, *, tokens, seq, tp, sp, act_bytes, linear_in_bytes, residual_bytes, autocast,
                   attention, recompute, fused, dropout, saves, mask_bytes, adapter_dropout, sp_gathered,
                   adapter_copies) -> _LayerContext:
    """`layer_terms`' arguments and the quantities its blocks share."""
    residual_bytes = act_bytes if residual_bytes is None else residual_bytes
    frozen = float(saves is not None)
    s = saves or {}
    own_copy = maximum(adapter_dropout, adapter_copies)  # each adapter keeps its own input
    save = {n: s.get(n, 1) * (1 - own_copy * (saves is not None))
            for n in ("q", "k", "v", "o", "gate", "up", "down")}
    rep = where(sp, tp, 1)  # divisor for replicated-by-TP tensors
    # ... and for what is computed from a block's all-gathered input: Megatron keeps the
    # sequence shard and gathers it again in backward (Korthikanti et al. 2023 §4.2.2); DTensor
    # keeps the gathered tensor (sp_gathered)
    rep_in = where(values(sp_gathered) > 0, 1, rep)
    eager_norm = (1 - values(fused)) * (0 if shape.layernorm else 1)
    stats = 2 if shape.layernorm else 1
    return _LayerContext(
        shape=shape, tokens=tokens, seq=seq, tp=tp, act_bytes=act_bytes, linear_in_bytes=linear_in_bytes,
        residual_bytes=residual_bytes, autocast=autocast, recompute=recompute, fused=fused, dropout=dropout,
        mask_bytes=mask_bytes, frozen=frozen, own_copy=own_copy, save=save,
        save_attn_in=maximum(maximum(save["q"], save["k"]), save["v"]), save_mlp_in=maximum(save["gate"], save["up"]),
        rep=rep, rep_in=rep_in, eager_norm=eager_norm,
        norm=norm_bytes(shape.hidden, eager_norm, residual_bytes, stats, frozen),
        eager=bools(values(attention) == ATTENTION_CODE["eager"]), no_recompute=values(recompute) == 0)


def _attention_terms(c: _LayerContext, *, cp_output_copy, heads_major_copy) -> dict:
    """The attention block's saved tensors (`layer_terms`), by term."""
    shape, tokens, tp, act_bytes, recompute = c.shape, c.tokens, c.tp, c.act_bytes, c.recompute
    h, eager, no_recompute, autocast = shape.hidden, c.eager, c.no_recompute, c.autocast
    fused_attn = ~eager
    # With tp > kv_heads each rank keeps one whole KV head (replicated), so K/V divide by
    # min(tp, kv_heads); eager attention's repeated K/V divide like the queries.
    copies_kv = (shape.kv_heads > tp) | (not shape.kv_repeat_view)  # a view of one head otherwise
    kv_div = where(eager & (values(recompute) == 0) & copies_kv, tp, minimum(tp, shape.kv_heads))
    t = {}
    t["attn_norm"] = tokens * c.norm / c.rep
    # torch.autocast casts a shared fp32 input once per linear that reads it (only weights
    # are cached), so q, k and v projections each keep their own 16-bit copy.
    qkv_copies = 1 + autocast * (shape.qkv_projections - 1)
    t["attn_input"] = tokens * h * c.save_attn_in * c.linear_in_bytes * qkv_copies / c.rep_in
    t["mla_latents"] = tokens * _latent_bytes(shape, c.eager_norm, act_bytes, c.frozen) / c.rep_in
    # Eager GQA repeats K/V to every query head; the repeated copies are saved unless the
    # attention core is recomputed (then its inputs, the unrepeated K/V, are kept). transformers'
    # repeat_kv (expand, reshape) copies only when a rank holds more than one KV head: one head
    # (MQA, or tp >= kv_heads) is repeated as a view of itself; a broadcast into SDPA's math kernel
    # (Falcon's `kv_broadcast`) copies it.
    repeats = eager & no_recompute & copies_kv
    k_w = where(repeats, shape.q, shape.k)
    v_w = where(repeats, shape.attn_out, shape.v)
    # Under autocast RoPE's fp32 tables promote q and k to fp32; the attention kernel casts
    # them back, but a recomputed attention core keeps its fp32 inputs.
    qk_bytes = where((values(recompute) == 1) & bool(shape.rotary) & (autocast > 0), c.residual_bytes, act_bytes)
    t["qkv"] = tokens * ((shape.q / tp + k_w / kv_div) * qk_bytes + v_w / kv_div * act_bytes)
    # A fused QKV projection with RoPE: the rotated q and k are new tensors, but v stays a view
    # of the fused output, so keeping v keeps all of it (GPT-NeoX, Phi-3; measured in validate)
    # under a fused kernel. Eager attention's matmul views its operand as (batch·heads, seq,
    # dim): a strided view of the fused output merges batch and heads only for one sequence, so
    # with more it copies v and keeps the copy (as eager GQA keeps repeated copies), not the
    # fused output (measured: GPT-NeoX, eager, micro-batches of 1 and 2; eager attention runs
    # without context parallelism, so tokens / seq is the micro-batch). MLA's q and k are
    # concatenations of their non-rotary and rotary parts (new tensors) and its v is made
    # contiguous for the attention kernel (Megatron-Core multi_latent_attention.py @d98e8a64: query, key and value
    # .contiguous()), so its up-projections' outputs are not kept: q, k and v only.
    one_sequence = bools(values(tokens) <= values(c.seq))
    fused_rope = ((shape.qkv_projections == 1) & bool(shape.rotary)
                  & ~(eager & ~(one_sequence & (k_w == shape.k))) & (shape.latent == 0))
    t["qkv"] = t["qkv"] + tokens * (shape.q / tp + shape.k / kv_div) * act_bytes * fused_rope
    # Qwen3's per-head RMSNorm on q and k (before RoPE): what a norm over each head keeps, for
    # the q and k widths this rank holds, with one fp32 statistic per head
    q_heads, k_heads = shape.q / tp, shape.k / kv_div
    head_stats = (q_heads + k_heads) / max(shape.head_dim, 1) * FP32
    t["qk_norm"] = shape.qk_norm * tokens * ((q_heads + k_heads) * where(c.eager_norm, 2 * FP32, act_bytes)
                                             + head_stats)
    # a fused kernel's output, kept by the kernel for its backward (unless the core is recomputed)
    # and as the output projection's input for its weight's (or adapter's) gradient: one storage
    t["attn_out"] = tokens * shape.attn_out * act_bytes / tp * fused_attn * maximum(no_recompute, c.save["o"])
    t["attn_lse"] = tokens * shape.heads * FP32 / tp * fused_attn * no_recompute
    # ... unless the output projection's input is a copy of it (torch's ring attention under
    # context parallelism, conventions.toml `cp_ring_output_copy`)
    t["cp_output_copy"] = (tokens * shape.attn_out * act_bytes / tp * fused_attn * no_recompute * c.save["o"]
                           * values(cp_output_copy))
    t["proj_input"] = tokens * shape.attn_out * c.linear_in_bytes / tp * eager * c.save["o"]
    if shape.rope_concat:
        _heads_major_output(t, shape, tokens=tokens, tp=tp, linear_in_bytes=c.linear_in_bytes, fused_attn=fused_attn,
                            save_o=c.save["o"], heads_major_copy=heads_major_copy)
    scores = tokens * c.seq * shape.heads / tp  # a·s² per sequence = a·s per token
    keep_scores = eager * no_recompute
    t["attn_scores"] = scores * (act_bytes + c.dropout * (c.mask_bytes + act_bytes)) * keep_scores
    t["attn_dropout_mask"] = tokens * h * c.mask_bytes * c.dropout / c.rep
    return t


def _mlp_norm_terms(t: dict, c: _LayerContext) -> None:
    """The MLP block's norm, input and dropout mask (`layer_terms`), into `t`."""
    shape, tokens, h = c.shape, c.tokens, c.shape.hidden
    mlp_copies = 1 + c.autocast * (shape.mlp_matrices - 2)
    # with a parallel residual the MLP's norm reads the attention norm's input: one storage (an
    # eager RMSNorm's fp32 upcast is that input itself when the residual stream is fp32)
    shared_input = shape.parallel_residual * h * where(c.eager_norm, FP32 * (values(c.residual_bytes) == FP32),
                                                          c.residual_bytes)
    t["mlp_norm"] = tokens * (c.norm - shared_input) / c.rep
    t["mlp_input"] = tokens * h * c.save_mlp_in * c.linear_in_bytes * mlp_copies / c.rep_in
    if shape.shared_norm:
        _share_norm(t, c.save_attn_in, c.save_mlp_in, c.autocast)
    t["mlp_dropout_mask"] = tokens * h * c.mask_bytes * c.dropout / c.rep


def _moe_terms(t: dict, c: _LayerContext, *, gate_in_act) -> None:
    """A mixture-of-experts MLP's saved tensors (`layer_terms`): router, dispatched copies,
    experts and shared experts, into `t`."""
    shape, tokens, tp, h, fused, frozen = c.shape, c.tokens, c.tp, c.shape.hidden, c.fused, c.frozen
    act_bytes, residual_bytes, linear_in_bytes, autocast = c.act_bytes, c.residual_bytes, c.linear_in_bytes, c.autocast
    save, save_mlp_in, rep_in = c.save, c.save_mlp_in, c.rep_in
    e, k, cf = shape.experts, shape.top_k, shape.capacity_factor
    # fp32 router probabilities, int64 top-k indices, and per routed token its int64
    # token and slot indices and its gate weight
    # grouped experts (transformers 5's grouped_mm; fused kernels run their own permutation):
    # the sort's permutation and its inverse are kept too, the gate weights stay fp32, and
    # grouped_mm, not autocast, runs the experts in the weights' dtype (the residual's)
    grouped = shape.grouped_experts * (1 - values(fused))
    t["router"] = tokens * (e * FP32 + k * INDEX_BYTES * (3 + grouped)
                            + k * where(grouped, FP32, residual_bytes)) / rep_in
    expert_bytes = where(grouped, residual_bytes, act_bytes)
    # Routed copies of each token: the gathered expert inputs (under autocast, instead, each
    # expert input projection's own 16-bit cast of them), the expert outputs kept by the
    # gate-weight multiply and, with an eager `index_add` combine, the weighted outputs
    # (its derivative formula reads `source`; a fused unpermute kernel and the grouped
    # reshape-and-sum do not).
    # Where the experts apply the gate weights inside their activation (gate_in_act, with
    # a fused SwiGLU: Megatron-Core's weighted_bias_swiglu_impl, experts.py @d98e8a64), its
    # saved input serves the weights' gradient too and the combine is a plain sum: no
    # expert output is kept. (Megatron's unfused fallback multiplies the activation's
    # output eagerly; that case keeps the expert outputs here, as before.)
    # (under LoRA the gathered inputs only for the gate and up adapters' gradients)
    # (the gathered copy is what the experts' input projections keep: in FP8 under fp8, where
    # the 16-bit gather is freed once cast, or dispatched in FP8 as DeepSeek-V3 §3.3.3 does)
    inputs = where(grouped, residual_bytes,
                   (1 - autocast) * linear_in_bytes + autocast * (shape.mlp_matrices - 1) * act_bytes)
    weighted_act = values(gate_in_act) * values(fused) * (shape.mlp_matrices == 3)
    per_copy = (inputs * save_mlp_in + expert_bytes * (1 - weighted_act)
                + residual_bytes * (1 - values(fused)) * (1 - grouped))
    t["expert_dispatch"] = tokens * k * cf * h * per_copy / rep_in
    # The block's normalised input is kept by the linears that read it directly, for their
    # weight gradients: the router and the shared experts' gate (frozen under LoRA) and the
    # shared experts' input projections (under LoRA, when adapted). They share one copy,
    # or under autocast each casts the fp32 input itself.
    shared_in = save_mlp_in * (shape.shared_ffn > 0)
    readers = (1 - frozen) * (1 + shape.shared_gate) + shared_in * (shape.mlp_matrices - 1)
    copies = where(autocast > 0, readers, minimum(readers, 1))
    t["mlp_input"] = tokens * h * linear_in_bytes * copies / rep_in
    t["expert_mlp"] = tokens * k * cf * _mlp_elems(shape.expert_ffn, shape.mlp_matrices, fused, save["down"],
                                                  expert_bytes, where(grouped, residual_bytes, linear_in_bytes),
                                                  shape.activation_saves) / tp
    t["shared_expert_mlp"] = tokens * _mlp_elems(shape.shared_ffn, shape.mlp_matrices, fused, save["down"],
                                                act_bytes, linear_in_bytes, shape.activation_saves) / tp
    # the gate's multiply keeps both factors: the sigmoid (one per token) and the shared output
    t["shared_expert_gate"] = tokens * (h + 1) * act_bytes * shape.shared_gate / rep_in


def _lora_terms(t: dict, c: _LayerContext, *, saves, moe: bool, adapter_rank, adapter_dropout) -> None:
    """LoRA's adapters' saved tensors (`layer_terms`), into `t`."""
    shape, tokens = c.shape, c.tokens
    # LoRA: each adapter keeps its r-wide x·A for B's weight gradient: once per token in attention
    # and dense MLPs, once per routed copy in the experts (and per token in shared experts)
    on = _adapted(shape, saves)
    attn_adapters = on["q"] + on["k"] + on["v"] + on["o"]
    mlp_adapters = on["gate"] + on["up"] + on["down"]
    mlp_passes = shape.top_k * shape.capacity_factor + (shape.shared_ffn > 0) if moe else 1
    t["lora_adapters"] = tokens * adapter_rank * c.act_bytes * (attn_adapters + mlp_adapters * mlp_passes)
    t["lora_dropout"] = (tokens * (c.own_copy * c.act_bytes + adapter_dropout * c.mask_bytes)
                         * adapter_inputs(shape, saves, moe=moe, tp=c.tp))


# Saved tensors an FP8 recipe may keep in low precision besides the linears' inputs, with their
# bytes per element. DeepSeek-V3 (arXiv 2412.19437 §3.3.3, "Low-Precision Storage"): the input
# of the linear after attention, which attention's backward also reads, in its E5M6 format (12
# bits), and the MoE SwiGLU's input in FP8 (its output recomputed: recompute module moe_act).
FP8_CACHED = {"attn_out": 1.5, "moe_act_input": 1.0}


def cache_low_precision(t: dict, shape: LayerShape, cached: dict, *, moe: bool, tokens, tp, act_bytes) -> None:
    """Re-price the tensors `cached` names (0/1 each) at FP8_CACHED bytes instead of act_bytes."""
    on = floats(cached.get("attn_out", 0))
    t["attn_out"] = t["attn_out"] * (1 - on * (1 - FP8_CACHED["attn_out"] / act_bytes))
    if moe and shape.mlp_matrices == 3:
        on = floats(cached.get("moe_act_input", 0))
        # a fused SwiGLU's input: gate and up, 2f per routed copy
        t["expert_mlp"] = t["expert_mlp"] - on * tokens * shape.top_k * shape.capacity_factor * (
            2 * shape.expert_ffn * (act_bytes - FP8_CACHED["moe_act_input"])) / tp


def discard_recomputed(t: dict, shape: LayerShape, modules: dict, *, moe: bool, tokens, tp, linear_in_bytes,
                       save_down) -> None:
    """What output-discarding recomputation leaves unsaved (Megatron-Core, transformer_config.py
    recompute_modules; DeepSeek-V3 §3.2.3 recomputes the RMSNorms and the MLA up-projections,
    §3.3.3 the MoE SwiGLU's output):

    * layernorm: the two norms' outputs, which the linears reading them keep as their inputs
      (the attention's input projections; the MLP's, or the router's and shared experts');
    * mla_up_proj: MLA's per-head queries, keys and values, the up-projections' outputs after
      RoPE, recomputed from the kept latents;
    * moe_act: the experts' SwiGLU output, the down projection's input (its input, gate and up,
      stays)."""
    ln = floats(modules.get("layernorm", 0))
    t["attn_input"] = t["attn_input"] * (1 - ln)
    t["mlp_input"] = t["mlp_input"] * (1 - ln)
    up = floats(modules.get("mla_up_proj", 0)) * (shape.latent > 0)
    t["qkv"] = t["qkv"] * (1 - up)
    if moe and shape.mlp_matrices == 3:
        act = floats(modules.get("moe_act", 0))
        t["expert_mlp"] = t["expert_mlp"] - act * tokens * shape.top_k * shape.capacity_factor * (
            shape.expert_ffn * linear_in_bytes * save_down) / tp


def _heads_major_output(t: dict, shape: LayerShape, *, tokens, tp, linear_in_bytes, fused_attn, save_o,
                        heads_major_copy) -> None:
    """transformers' partial rotary (`apply_rotary_pos_emb` of Phi, Phi-3, StableLM, GLM,
    GPT-NeoX: torch.cat of the rotated and the passed-through parts) makes q a new tensor laid out
    (batch, heads, seq, dim). A kernel that returns its output in its query's memory order
    (PyTorch's CPU SDPA kernels) then returns it heads-major, and the transpose back to (batch,
    seq, heads·dim) before the output projection is a copy, which the projection keeps as its
    input (measured on torch 2.13, CPU: one attention-output-wide tensor per layer)."""
    t["proj_input"] = t["proj_input"] + (tokens * shape.attn_out * linear_in_bytes / tp * fused_attn * save_o
                                         * values(heads_major_copy))


def _share_norm(t: dict, save_attn_in, save_mlp_in, autocast) -> None:
    """One norm feeding attention and MLP (GPT-J's ln_1, Phi's input_layernorm, Falcon-7B's
    `parallel_attn`): no second norm, and the MLP's input projection keeps the normalised input
    the attention's projections already keep (one storage), unless autocast casts its own copy or
    only the MLP's input is kept (LoRA)."""
    t["mlp_norm"] = t["mlp_norm"] * 0
    only_mlp = maximum(values(save_mlp_in) - values(save_attn_in), 0)
    t["mlp_input"] = t["mlp_input"] * where(values(autocast) > 0, 1, only_mlp)


def _latent_bytes(shape: LayerShape, eager_rms, act_bytes, frozen=0):
    """Per token, MLA's latents (DeepSeek-V2 §2.1.2-2.1.3; Megatron-Core multi_latent_attention.py
    @d98e8a64, transformers' DeepseekV3Attention): the query latent (q_a's output) and the KV
    down-projection's output [latent | shared rotary key] go through an RMSNorm each and the
    normalised latents into the up-projections, which keep them as their inputs. A fused norm
    keeps its input (the whole kv_a output: the latent is a view of it) and one fp32 statistic;
    an eager one (F.rms_norm on the CPU, LlamaRMSNorm) keeps its fp32 upcast instead (the input
    itself, rotary key included, when it is fp32 already) and the fp32 normalised latent for
    its weight's gradient (not when the weight is frozen). The rotary key is not normalised and
    RoPE on it keeps only its cos/sin tables; measured in validate (mla.py)."""
    rope = shape.latent_rope
    normed = shape.latent - rope
    eager_rms = values(eager_rms)
    kept_input = where(eager_rms, normed * FP32 + rope * FP32 * (values(act_bytes) == FP32),
                          shape.latent * act_bytes)
    normalised = eager_rms * (1 - frozen) * normed * FP32
    return kept_input + normalised + normed * act_bytes + shape.latent_norms * FP32


def norm_bytes(h, eager_rms, residual_bytes, stats, frozen=0):
    """Per token: the norm's input (residual dtype) and fp32 statistics; an eager RMSNorm
    upcasts to fp32 first (transformers' LlamaRMSNorm, F.rms_norm on CPU) and keeps the fp32
    input and the fp32 normalised input instead, the latter only for its weight's gradient (not
    kept when the weight is `frozen`: LoRA)."""
    return where(eager_rms, (2 - frozen) * h * FP32, h * residual_bytes) + stats * FP32


def _mlp_elems(f, matrices, fused, save_down, act_bytes, linear_in_bytes, activation_saves=(1, 0)):
    """Bytes per token inside the MLP (between its input and output projections).
    activation_saves: ACTIVATION_SAVES of its activation function (one kernel keeping its
    input when the kernels are fused)."""
    fused = values(fused)
    kept = where(fused, 1, activation_saves[0])
    keeps_out = where(fused, 0, activation_saves[1])
    if matrices == 2:  # the activation's tensors; its output, kept as the down projection's input
        return f * act_bytes * kept + f * maximum(linear_in_bytes * save_down, act_bytes * keeps_out)
    # gated: the activation's tensors, its output and up (kept by their product; a fused SwiGLU
    # recomputes the output), and their product, the down projection's input
    return f * act_bytes * (kept + 2 - fused) + f * linear_in_bytes * save_down


def op_sac_matmuls(shape: LayerShape, tp, kv_div) -> list[tuple[float, float]]:
    """A dense layer's matmuls in forward order: (input width, output width per token on this
    rank). Column-parallel outputs split by TP; row-parallel ones (the attention output and
    MLP down projections) are partial sums as wide as the hidden size before TP's reduction."""
    h = shape.hidden
    if shape.qkv_projections == 1:
        attn = [(h, shape.q / tp + (shape.k + shape.v) / kv_div)]
    else:
        attn = [(h, shape.q / tp), (h, shape.k / kv_div), (h, shape.v / kv_div)]
    mlp = [(h, shape.ffn / tp)] * (shape.mlp_matrices - 1) + [(shape.ffn / tp, h)]
    return attn + [(shape.attn_out / tp, h)] + mlp


def op_sac_saved(shape: LayerShape, *, tokens, tp, sp, act_bytes, low_precision_mm=0.0):
    """Bytes a dense layer keeps per micro-batch under torchtitan's per-op selective activation
    checkpointing (torchtitan 0.3, distributed/activation_checkpoint.py `SelectiveAC`, the
    `selective` mode's default): the checkpoint keeps the block's input, and the policy saves
    the outputs of the ops in its save list - SDPA (its output and fp32 log-sum-exp), every
    second `mm` of the block counted in forward order (the 1st, 3rd, ...; the 2nd, 4th, ... are
    recomputed), and the reduce-scatters of sequence parallelism - and recomputes everything
    else (norms, RoPE, the activation function, all-gathers) in the backward, one block at a
    time. `_scaled_mm` (float8 linears; low_precision_mm = 1) is in the save list but not
    counted as an `mm`, so every float8 matmul's output is kept. Outputs are 16-bit."""
    kv_div = minimum(tp, shape.kv_heads)
    lp = floats(low_precision_mm)
    kept = sum(width * maximum(lp, float(i % 2 == 0))
               for i, (_, width) in enumerate(op_sac_matmuls(shape, tp, kv_div)))
    block_input = shape.hidden / where(sp, tp, 1)
    reduce_scatters = 2 * shape.hidden / tp * (values(sp) > 0)
    sdpa = shape.attn_out / tp * act_bytes + shape.heads / tp * FP32
    return tokens * ((block_input + kept + reduce_scatters) * act_bytes + sdpa)
