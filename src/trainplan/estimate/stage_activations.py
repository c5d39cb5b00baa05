"""What a stage saves for backward outside its layers (activations.py's rule, applied to the
model's ends): the embedding's token ids, position ids and dropout mask, the final norm, the
output head's input and the logits the loss keeps, the per-micro-batch tables every stage keeps
once, and full recomputation's checkpoint per layer. Numbers or numpy arrays, broadcast."""

from __future__ import annotations

from .activations import ATTENTION_CODE, FP32, MASK_BYTES, TOKEN_ID_BYTES, norm_bytes
from .scalars import values, where


def checkpoint_bytes(hidden, *, tokens, tp, sp, act_bytes):
    """Full recompute keeps only each layer's input (Korthikanti et al. 2023: 2sbh per layer
    in 16 bits; divided by t when sequence parallelism already splits it)."""
    return tokens * hidden * act_bytes / where(sp, tp, 1)


def stage_terms(*, seq, cp, rope_dim, act_bytes, attention) -> dict:
    """Per-micro-batch tensors every stage keeps once (not per layer): eager attention's
    causal mask (kept by `masked_fill`, or as a recomputed region's input) and RoPE tables."""
    eager = values(attention) == ATTENTION_CODE["eager"]
    return {
        "attention_mask": eager * (seq / cp) ** 2 * MASK_BYTES,
        "rope_tables": 2 * (seq / cp) * rope_dim * act_bytes,
    }


def embedding_terms(hidden, *, tokens, seq, cp, tp, sp, dropout, learned_positions,
                    mask_bytes=MASK_BYTES, frozen=0) -> dict:
    """The token ids (the loss keeps them as its targets too), the learned position ids and the
    dropout mask on the embedding's output; a `frozen` embedding (LoRA) needs no gradient, so it
    keeps no position ids and its output's dropout no mask."""
    return {
        "token_ids": tokens * TOKEN_ID_BYTES,
        "position_ids": (seq / cp) * TOKEN_ID_BYTES * learned_positions * (1 - frozen),
        "embedding_dropout_mask": tokens * hidden * mask_bytes * dropout / where(sp, tp, 1) * (1 - frozen),
    }


def head_terms(hidden, vocab_padded, *, tokens, tp, sp, act_bytes, linear_in_bytes, layernorm, fused,
               logit_bytes=FP32, frozen=0, sp_gathered=0) -> dict:
    """act_bytes here is the residual stream's dtype (the final norm's input); logit_bytes
    what the loss keeps per logit (fp32 log-probabilities, or a fused loss's 16-bit logits);
    frozen: the final norm and the output head are frozen (LoRA), so neither keeps what only
    its weight's gradient needs (the normalised input, the head's input); sp_gathered: the
    output layer keeps its all-gathered input under sequence parallelism (see `layer_terms`)."""
    # Final norm, the output layer's input and the logits the loss keeps (vocab-parallel
    # cross-entropy keeps its V/t slice; Korthikanti et al.'s 4sbv/t in fp32).
    rep = where(sp, tp, 1)
    eager_norm = (1 - values(fused)) * (0 if layernorm else 1)
    stats = 2 if layernorm else 1
    return {
        "final_norm": tokens * norm_bytes(hidden, eager_norm, act_bytes, stats, frozen) / rep,
        "head_input": tokens * hidden * linear_in_bytes * (1 - frozen) / where(values(sp_gathered) > 0, 1, rep),
        "logits": tokens * vocab_padded * logit_bytes / tp,
    }
