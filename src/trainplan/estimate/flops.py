"""Training FLOPs from the model spec (a multiply-add counts 2; DESIGN §3).

Per token and layer, forward:

* GEMMs: 2 x the weights a token meets (for MoE layers the top-k routed experts, the shared
  experts and the router): 2·N_active per token, the "6N" rule's forward third.
* attention scores and weighted sum: 2·s·(heads·d_qk) + 2·s·(heads·d_v) per token when every
  query sees all s keys (what `torch.utils.flop_counter` counts for SDPA); a causal mask
  halves the useful work (`causal=True`; FlashAttention-2 §4.1).

The one convention of a plan's model FLOPs (the MFU and TFLOP/s numerator): causal attention
counts its causal half, the work a causal kernel does (FlashAttention-2 skips the blocks above
the diagonal, Dao 2023 §3.1.1; its §4.1 benchmarks count causal FLOPs as half) and what the time model
prices (estimate/time.py). PaLM (Chowdhery et al. 2022, App. B: 6N + 12·L·H·Q·T) and
Megatron-LM (training.py num_floating_point_operations) count the full s² instead; at 4K tokens
that differs by a few percent, at 128K it doubles the count and would report more FLOP/s than
the accelerator has (calibration.py keeps those counts to compare with the papers' figures).
  On sliding-window layers (Mistral, Gemma 2/3, gpt-oss) a causal kernel attends at most the
  window: w - w²/(2s) keys per query on average when s > w (norm_features.window_keys).
* output head: 2·h·V per token.

Backward costs 2x the forward GEMMs (input and weight gradients), 1x where the weights are
frozen (LoRA/QLoRA's base and output head: input gradients only), and the rank-r adapters add
2·r·(fan_in + fan_out) per token and targeted linear forward, twice that backward. The attention backward
is 2.5x its forward for fused kernels (they recompute the scores: five s²-sized matmuls
against two) and 2x when the scores are materialised (eager). Model FLOPs exclude
recomputation (PaLM's MFU definition); hardware FLOPs add a second forward of every fully
recomputed layer, or of the attention core under selective recompute. A non-reentrant
checkpoint with early stop (PyTorch >= 2.1) ends each block's recomputation once nothing
after it is saved (`skip_last`): before a dense block's MLP down projection, and before an MoE
block's shared experts' down projection when no gate scales their output (the routed
experts' outputs are saved by their weighting, a gated shared output by its gate).

Functions take numbers or numpy arrays.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ..specs.model import ModelSpec
from .norm_features import causal_keys
from .scalars import floats, values, where

ATTN_BWD_FUSED = 2.5  # flash/SDPA backward: 5 matmuls vs 2 in forward
ATTN_BWD_EAGER = 2.0  # materialised scores: 2 bmm per forward bmm
GEMM_BWD = 2.0


@dataclass(frozen=True)
class LayerFlops:
    dense_gemm: float  # forward GEMM FLOPs per token of a dense layer
    moe_gemm: float  # ... of an MoE layer (top-k experts + shared + router)
    dense_last: float  # ... of a dense layer's last linear (the MLP's down projection)
    moe_last: float  # ... of an MoE layer's ungated shared experts' down projection (0 without)
    attn_per_key: float  # forward attention FLOPs per token per attended key
    head: float  # forward output-head FLOPs per token


@lru_cache(maxsize=256)
def layer_flops(model: ModelSpec) -> LayerFlops:
    def gemm(index: int) -> float:
        total = 0.0
        for lin in model.layer_linears(index):
            n = model.top_k if lin.expert else lin.count
            total += 2.0 * n * lin.fan_in * lin.fan_out
        return total

    dense_i, moe_i = model.first_layer(False), model.first_layer(True)
    last = model.layer_linears(dense_i)[-1] if dense_i is not None else None  # the MLP's down projection
    qk = model.q_dim  # heads x qk head dim
    v = model.attn_out_dim  # heads x v head dim
    return LayerFlops(
        dense_gemm=gemm(dense_i) if dense_i is not None else 0.0,
        moe_gemm=gemm(moe_i) if moe_i is not None else 0.0,
        dense_last=2.0 * last.fan_in * last.fan_out if last is not None else 0.0,
        moe_last=(2.0 * model.hidden * model.shared_ffn_total
                  if moe_i is not None and not model.shared_expert_gate else 0.0),
        attn_per_key=2.0 * qk + 2.0 * v,
        head=2.0 * model.hidden * model.vocab,
    )


@lru_cache(maxsize=256)
def lora_flops(model: ModelSpec, targets: tuple, rank: int) -> tuple[float, float]:
    """Forward FLOPs per token of one dense and one MoE layer's LoRA adapters (x·A, then ·B, on
    each targeted linear; routed experts' adapters for the top-k experts a token meets)."""
    def per_layer(index):
        if index is None:
            return 0.0
        return sum(2.0 * rank * (lin.fan_in + lin.fan_out) * (model.top_k if lin.expert else lin.count)
                   for lin in model.layer_linears(index) if lin.name in targets)

    return per_layer(model.first_layer(False)), per_layer(model.first_layer(True))


# the projections of a layer's normalised input, whose input gradient the first layer of a frozen
# model skips (its input, the frozen embedding's output, needs none)
ATTENTION_INPUTS = ("q", "k", "v", "qkv")


def first_input_grad_skipped(recompute, reentrant_checkpoint):
    """1 where a frozen model's first layer skips its input gradients, 0 where it computes them:
    a reentrant checkpoint (no early stop) of the first layer gives gradients only if an input
    needs one, so the frozen embedding's output is made to (transformers'
    enable_input_require_grads) and the first layer's input gradients are computed."""
    return 1.0 - (values(recompute) == 2) * float(reentrant_checkpoint)


@lru_cache(maxsize=256)
@lru_cache(maxsize=256)
def op_sac_recomputed(model: ModelSpec) -> float:
    """Forward FLOPs per token of the matmuls per-op selective checkpointing re-runs in a dense
    layer: the 2nd, 4th, ... in forward order (torchtitan's SelectiveAC saves every second mm's
    output; activations.op_sac_saved)."""
    linears = [2.0 * lin.fan_in * lin.fan_out for lin in model.layer_linears(0)]
    if model.fused_qkv:  # one matmul for q, k and v (activations.op_sac_matmuls counts it once)
        linears = [sum(linears[:3])] + linears[3:]
    return sum(f for i, f in enumerate(linears) if i % 2 == 1)


def _first_input_grad_flops(model: ModelSpec, targets: tuple, rank: int) -> float:
    """Per token: the input-gradient FLOPs of the first layer's attention input projections and
    of their LoRA adapters' A."""
    return sum(2.0 * lin.fan_in * lin.fan_out + (2.0 * lin.fan_in * rank if lin.name in targets else 0.0)
               for lin in model.layer_linears(0) if lin.name in ATTENTION_INPUTS)


def step_flops(model: ModelSpec, *, tokens, seq, dense_layers, moe_layers, head, attention_eager,
               recompute, causal=False, vocab_padded=None, skip_last=False, lora_targets=None,
               lora_rank=0, reentrant_checkpoint=False, recompute_share=1.0, low_precision_mm=0.0) -> dict:
    """Forward, backward, recompute FLOPs for `tokens` tokens of sequences of length `seq`.

    dense_layers/moe_layers: layers counted (a stage's, or the model's); head: 1 when the
    output head is included; attention_eager: 1 for materialised scores; recompute: the
    RECOMPUTE_CODE (0 none, 1 selective, 2 full, 3 selective-op); causal: halve the attention work;
    skip_last: a full recomputation stops after each block's last saved tensor (see above);
    lora_targets, lora_rank (LoRA/QLoRA, as `estimate.stage.lora_arguments` gives them; None: full
    training): the base weights are frozen, no weight gradients, and rank-r adapters train on the
    targeted linears; reentrant_checkpoint: see `first_input_grad_skipped`; recompute_share: the
    share of the layers a full recomputation re-runs (`estimate.stage.recomputed_share`);
    low_precision_mm: 1 when the linears run in float8 (per-op checkpointing saves them all).
    """
    lf = layer_flops(model)
    # a causal kernel's keys per query: s/2, fewer on sliding-window layers (norm_features.causal_keys)
    keys = where(causal, causal_keys(seq, model.sliding_share, model.sliding_window or 0), seq)
    attn_fwd = tokens * lf.attn_per_key * keys * (dense_layers + moe_layers)
    frozen = lora_targets is not None
    targets = tuple(lora_targets or ())
    lora_dense, lora_moe = lora_flops(model, targets, int(lora_rank)) if frozen else (0.0, 0.0)
    adapters_fwd = tokens * (lora_dense * dense_layers + lora_moe * moe_layers)
    first_input_grad = (tokens * _first_input_grad_flops(model, targets, int(lora_rank))
                        * first_input_grad_skipped(recompute, reentrant_checkpoint)) if frozen else 0.0
    gemm_fwd = tokens * (lf.dense_gemm * dense_layers + lf.moe_gemm * moe_layers) + adapters_fwd
    head_flops = lf.head if vocab_padded is None else 2.0 * model.hidden * vocab_padded
    head_fwd = tokens * head_flops * head
    attn_bwd = attn_fwd * where(attention_eager, ATTN_BWD_EAGER, ATTN_BWD_FUSED)
    forward = gemm_fwd + attn_fwd + head_fwd
    backward = (1.0 if frozen else GEMM_BWD) * (gemm_fwd - adapters_fwd + head_fwd) \
        + GEMM_BWD * adapters_fwd + attn_bwd - first_input_grad
    rc = values(recompute)
    # per-op selective checkpointing (activations.op_sac_saved) re-runs every second matmul of
    # each (dense) layer; float8 matmuls are all saved (low_precision_mm)
    op_sac = tokens * op_sac_recomputed(model) * (1 - floats(low_precision_mm)) * (
        dense_layers + moe_layers) * recompute_share
    full = gemm_fwd + attn_fwd - where(skip_last, tokens * (lf.dense_last * dense_layers + lf.moe_last * moe_layers),
                                          0.0)
    recomputed = where(rc == 2, full * recompute_share, where(rc == 1, attn_fwd, where(rc == 3, op_sac, 0.0)))
    model_flops = forward + backward
    return {"forward": forward, "backward": backward, "recompute": recomputed,
            "model": model_flops, "hardware": model_flops + recomputed,
            "attention_forward": attn_fwd, "gemm_forward": gemm_fwd, "head_forward": head_fwd}
