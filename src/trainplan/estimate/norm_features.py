"""What norms placed after a block, PyTorch-written LayerNorms, soft-capping, sliding-window masks
and attention sinks save for backward, and what a sliding window saves in attention work.

Each function adjusts `activations.layer_terms`' per-layer terms (or adds head and stage terms);
all take numbers or numpy arrays. From the ops of transformers 5.x's modeling files (read at
5.24) and PyTorch's derivatives (derivatives.yaml); measured on tiny configs of each family
(tests/test_hf_families.py):

* sandwich norms (Gemma 2/3: `post_attention_layernorm`, `post_feedforward_layernorm` on each
  block's output): each keeps what a norm keeps (`norm_bytes`), its input being the block's
  output in the activations' dtype. OLMo 2's post-norms replace the pre-norms: the same two norms.
* one norm for attention and MLP (Cohere's parallel block): `shared_norm`, as GPT-J's and Phi's
  (activations._share_norm).
* CohereLayerNorm (`(x - mean) * rsqrt(var + eps) * w` in fp32 ops): `pow` keeps x - mean, the
  second x - mean and the rsqrt are kept by their product, and the normalised x by the weight's
  product: 3 fp32 tensors of h and one fp32 statistic (2 when the weight is frozen).
* Cohere's q/k norms (`use_qk_norm`): the same LayerNorm over each head of q and of k (a weight
  per head): 3 fp32 tensors of the q and k widths and one statistic per head.
* OLMo's `clip_qkv`: q, k and v clamped in place; each in-place clamp keeps a copy of the tensor it
  overwrites (its backward reads the unclamped values): q + k + v per token.
* attention soft-capping (Gemma 2), eager: `tanh(scores / cap)` keeps its output, a·s² per
  sequence in the scores' dtype; a flash kernel caps inside (nothing kept); transformers'
  SDPA refuses it.
* final-logit soft-capping: `tanh(logits / cap)` keeps its output, V per token, in the logits' dtype.
* sliding-window layers under SDPA, once the sequence reaches the window (transformers then
  passes an explicit mask, masking_utils._ignore_causal_mask_sdpa): the kernel keeps its own
  floating-point copy of the boolean mask (mbs·s² in the queries' dtype) and transformers
  repeats K and V to every query head (`use_gqa_in_sdpa` is false with a mask; a copy unless a
  rank holds one KV head, as eager's repeat in `activations.layer_terms`); the boolean
  mask itself is kept once per micro-batch. Eager attention materialises the scores anyway,
  and a flash kernel takes the window as an argument.
* attention sinks (gpt-oss, eager): the softmax runs over the scores joined with the sink logit
  (s + 1 columns, the sink's sliced off after) and keeps the int64 indices of the max its input
  is shifted by (`cat` and the shift keep nothing).

Time: the sandwich norms add their passes over h to a layer's elementwise work and eager
soft-capping three passes over the scores (`extra_norm_passes`, `softcap_passes`).

Attention work: a causal kernel with a window of w keys does, per query, min(i + 1, w) key
blocks: over s queries on average w - w²/(2s) keys when s > w (s/2 when it is not), what
FlashAttention-2's local attention skips to; materialised scores (eager, SDPA with a mask)
compute all s² anyway.
"""

from __future__ import annotations

from .activations import ATTENTION_CODE, FP32, INDEX_BYTES, LayerShape, norm_bytes
from .scalars import floats, maximum, minimum, values, where


def window_keys(seq, window):
    """Keys a causal query attends on average, with a sliding window of `window` keys."""
    seq = floats(seq)
    return where(seq > window, window - window * window / (2.0 * maximum(seq, 1.0)), 0.5 * seq)


def causal_keys(seq, sliding_share: float, window: int):
    """Average keys per query over a model's layers, causal: its sliding layers' `window_keys`,
    the others' s/2."""
    if not sliding_share:
        return 0.5 * floats(seq)
    return (1 - sliding_share) * 0.5 * floats(seq) + sliding_share * window_keys(seq, window)


# Memory passes over h per token of one norm's forward (read the input, write the output; a
# second read for the statistics is cached), as estimate/stage.py prices a layer's norms and residual adds
NORM_PASSES = 3


def extra_norm_passes(model) -> int:
    """Per-token passes over h a layer's norms add to a pre-norm layer's two (stage.py's 10):
    Gemma 2/3's two post-norms; a shared norm (Cohere, GPT-J) saves one."""
    return NORM_PASSES * ({"sandwich": 2}.get(model.norm_position, 0) - bool(model.shared_norm))


def softcap_passes(model) -> int:
    """Memory passes over the scores eager soft-capping adds (scores / cap, tanh, x cap: each
    reads and writes a·s²)."""
    return 6 if model.attn_softcap is not None else 0


def python_layernorm_bytes(h, frozen=0):
    """Per token, what CohereLayerNorm keeps (fp32 ops): x - mean twice, the normalised x (for its
    weight's gradient) and one fp32 statistic."""
    return (3 - frozen) * h * FP32 + FP32


def adjust_layer_terms(t: dict, shape: LayerShape, *, tokens, seq, tp, sp, act_bytes, residual_bytes, attention,
                       recompute, fused, autocast, frozen) -> dict:
    """The norm, mask and soft-capping terms of one layer, from `activations.layer_terms`' terms."""
    h = shape.hidden
    rep = where(sp, tp, 1)
    fused = values(fused)
    eager_rms = (1 - fused) * (0 if shape.layernorm else 1)
    stats = 2 if shape.layernorm else 1
    eager = values(attention) == ATTENTION_CODE["eager"]
    sdpa = values(attention) == ATTENTION_CODE["sdpa"]
    no_recompute = values(recompute) == 0
    t = dict(t)
    if shape.python_layernorm:
        python = python_layernorm_bytes(h, frozen) * (1 - fused)
        t["attn_norm"] = t["attn_norm"] * fused + tokens * python / rep
        t["mlp_norm"] = t["mlp_norm"] * fused + tokens * python / rep * (not shape.shared_norm)
    kv_div = minimum(tp, shape.kv_heads)
    if shape.python_layernorm and shape.qk_norm:  # Cohere's per-head q/k LayerNorms, in the same ops
        head_stats = (shape.q / tp + shape.k / kv_div) / max(shape.head_dim, 1) * FP32
        t["qk_norm"] = t["qk_norm"] * fused + tokens * (1 - fused) * (
            (shape.q / tp + shape.k / kv_div) * (3 - frozen) * FP32 + head_stats)
    if shape.clip_qkv:  # clamp_ in place keeps a copy of what it overwrites (ClampBackward1's self)
        t["clip_qkv"] = tokens * (shape.q / tp + (shape.k + shape.v) / kv_div) * act_bytes
    if shape.post_norms:
        t["post_norms"] = shape.post_norms * tokens * norm_bytes(h, eager_rms, act_bytes, stats, frozen) / rep
    if shape.qk_norm_all:  # one statistic per token for q and for k, not one per head
        t["qk_norm"] = t["qk_norm"] - tokens * ((shape.q / tp + shape.k / minimum(tp, shape.kv_heads))
                                                / max(shape.head_dim, 1) - 2) * FP32
    scores = tokens * seq * shape.heads / tp * eager * no_recompute
    if shape.attn_softcap:
        t["attn_softcap"] = scores * act_bytes
    if shape.attention_sinks:
        # the max's int64 indices and the softmax output's one more column (s + 1 keys)
        t["attention_sinks"] = tokens * shape.heads / tp * (INDEX_BYTES + act_bytes) * eager * no_recompute
    if shape.sliding_share:
        masked = sdpa * (values(seq) >= shape.sliding_window) * shape.sliding_share
        repeated = (shape.q - shape.k + shape.attn_out - shape.v) / tp * (shape.kv_heads > tp)  # a view of one head
        t["window_mask"] = masked * tokens * (seq * act_bytes + repeated * act_bytes)
    return t


def window_stage_bytes(shape: LayerShape, *, seq, cp, attention):
    """Per micro-batch: the boolean sliding-window mask SDPA's layers share (s² bytes)."""
    sdpa = values(attention) == ATTENTION_CODE["sdpa"]
    on = sdpa * (values(seq) >= shape.sliding_window) * (shape.sliding_share > 0)
    return on * (values(seq) / cp) ** 2


def final_softcap_bytes(vocab_padded, *, tokens, tp, logit_act_bytes):
    """Per micro-batch: the tanh output of the final-logit soft-capping."""
    return tokens * vocab_padded * logit_act_bytes / tp
