"""Multi-head latent attention (DeepSeek-V2/V3, arXiv 2405.04434 §2.1; 2412.19437 §2.1.1) for
`trainplan validate`: the reference layer and how a model with it is scaled down.

The layer is written the way Megatron-Core's MLASelfAttention (multi_latent_attention.py
@d98e8a64) and transformers' DeepseekV3Attention run it: the query through its low-rank
down-projection, RMSNorm and up-projection (or one projection without q_lora_rank); one
down-projection to the KV latent plus the shared rotary key, the latent normalised and
up-projected to the per-head non-rotary keys and the values; RoPE on the rotary parts only;
q = [q_nope, q_rope], k = [k_nope, k_rope repeated to every head], and q, k, v made
contiguous for the attention kernel (Megatron-Core's query/key/value .contiguous())."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..specs.model import ModelSpec
from .models import _at_least_fp32


def scaled_mla_fields(spec: ModelSpec, hidden: int, heads: int, head_dim: int) -> dict:
    """The MLA widths of a model scaled to `hidden` with `heads` heads: the latent ranks in
    proportion to the hidden size and the per-head widths in proportion to `head_dim`/v_head_dim,
    rounded to multiples of 8 (the nope : rope : v ratios of the full model are kept)."""
    ratio, per_head = hidden / spec.hidden, head_dim / spec.v_head_dim

    def r8(x):
        return max(8, int(round(x / 8)) * 8)
    return dict(q_lora_rank=r8(spec.q_lora_rank * ratio) if spec.q_lora_rank else None,
                kv_lora_rank=r8(spec.kv_lora_rank * ratio),
                qk_rope_head_dim=r8(spec.qk_rope_head_dim * per_head),
                qk_nope_head_dim=r8(spec.qk_nope_head_dim * per_head),
                v_head_dim=r8(spec.v_head_dim * per_head), head_dim=None)


class FusedAttentionFn(torch.autograd.Function):
    """A fused causal attention kernel whose values are narrower than its queries and keys
    (MLA: v_head_dim < qk head width), as cuDNN's and Transformer Engine's kernels take them:
    keeps q, k, v, its output (written [b, s, heads, v_head_dim], so the output projection reads
    it without a copy) and the fp32 log-sum-exp per head and row, nothing of size s². PyTorch's
    CPU flash kernel needs one head width for q, k and v (SDPA would fall back to its math
    kernel, which keeps the probabilities), so it is written out here: the forward's two
    products, and FlashAttention's backward (Dao 2023, Algorithm 2): the scores recomputed from
    q, k and the log-sum-exp, then dV, dP, dQ and dK (five products)."""

    @staticmethod
    def forward(ctx, q, k, v, scale):
        with torch.autocast(device_type=q.device.type, enabled=False):  # the kernel's own fp32 math
            return FusedAttentionFn._forward(ctx, q, k, v, scale)

    @staticmethod
    def _forward(ctx, q, k, v, scale):
        s = q.shape[-2]
        causal = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)
        scores = ((_at_least_fp32(q) @ _at_least_fp32(k).transpose(-1, -2)) * scale).masked_fill(causal, float("-inf"))
        lse = scores.logsumexp(dim=-1)
        out = (torch.exp(scores - lse[..., None]) @ _at_least_fp32(v)).to(v.dtype).transpose(1, 2).contiguous()
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad):
        with torch.autocast(device_type=grad.device.type, enabled=False):
            return FusedAttentionFn._backward(ctx, grad)

    @staticmethod
    def _backward(ctx, grad):
        q, k, v, out, lse = ctx.saved_tensors
        s = q.shape[-2]
        causal = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)
        qf, kf, vf = _at_least_fp32(q), _at_least_fp32(k), _at_least_fp32(v)
        g, o = _at_least_fp32(grad).transpose(1, 2), _at_least_fp32(out).transpose(1, 2)
        probs = torch.exp(((qf @ kf.transpose(-1, -2)) * ctx.scale).masked_fill(causal, float("-inf"))
                          - lse[..., None])
        dv = probs.transpose(-1, -2) @ g
        dp = g @ vf.transpose(-1, -2)
        ds = probs * (dp - (g * o).sum(-1, keepdim=True)) * ctx.scale
        return (ds @ kf).to(q.dtype), (ds.transpose(-1, -2) @ qf).to(k.dtype), dv.to(v.dtype), None


class MLAttention(nn.Module):
    def __init__(self, spec: ModelSpec, attention: str, dropout: float, selective: bool = False,
                 fused: bool = False):
        super().__init__()
        from .models import RMSNorm

        self.spec, self.attention, self.p, self.selective = spec, attention, dropout, selective
        h, a = spec.hidden, spec.heads
        self.nope, self.rope, self.vd = spec.qk_nope_head_dim, spec.qk_rope_head_dim, spec.v_head_dim
        self.heads = a
        if spec.q_lora_rank:
            self.q_a = nn.Linear(h, spec.q_lora_rank, bias=False)
            self.q_norm = RMSNorm(spec.q_lora_rank, fused=fused)
            self.q = nn.Linear(spec.q_lora_rank, a * (self.nope + self.rope), bias=False)
        else:
            self.q_a = None
            self.q = nn.Linear(h, a * (self.nope + self.rope), bias=False)
        self.kv_a = nn.Linear(h, spec.kv_lora_rank + self.rope, bias=False)
        self.kv_norm = RMSNorm(spec.kv_lora_rank, fused=fused)
        self.kv_b = nn.Linear(spec.kv_lora_rank, a * (self.nope + self.vd), bias=False)
        self.o = nn.Linear(a * self.vd, h, bias=spec.bias)

    def forward(self, x, cos, sin, causal):
        from .models import _rotate

        b, s, _ = x.shape
        a, nope, rope, vd = self.heads, self.nope, self.rope, self.vd
        q = self.q(self.q_norm(self.q_a(x))) if self.q_a is not None else self.q(x)
        q_nope, q_pe = q.view(b, s, a, nope + rope).transpose(1, 2).split([nope, rope], dim=-1)
        latent, k_pe = self.kv_a(x).split([self.spec.kv_lora_rank, rope], dim=-1)
        kv = self.kv_b(self.kv_norm(latent)).view(b, s, a, nope + vd).transpose(1, 2)
        k_nope, v = kv.split([nope, vd], dim=-1)
        k_pe = k_pe.view(b, 1, s, rope)
        q_pe, k_pe = _rotate(q_pe, cos, sin), _rotate(k_pe, cos, sin)
        q = torch.cat([q_nope, q_pe], dim=-1)
        k = torch.cat([k_nope, k_pe.expand(b, a, s, rope)], dim=-1)
        v = v.contiguous()
        if self.selective:
            out = checkpoint(self.core, q, k, v, causal, use_reentrant=True)
        else:
            out = self.core(q, k, v, causal)
        if out.shape[1] == a:  # [b, heads, s, d] from the eager or dropout path
            out = out.transpose(1, 2)
        out = out.reshape(b, s, a * vd)
        return F.dropout(self.o(out), self.p, self.training)

    def core(self, q, k, v, causal):
        p = self.p if self.training else 0.0
        scale = 1.0 / math.sqrt(self.nope + self.rope)
        if self.attention == "eager":
            probs = ((q @ k.transpose(-1, -2)) * scale).masked_fill(causal, float("-inf")).softmax(dim=-1)
            return F.dropout(probs, p, self.training) @ v
        if p:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p, scale=scale)
        if torch.is_autocast_enabled(q.device.type):  # autocast casts a fused kernel's inputs
            low = torch.get_autocast_dtype(q.device.type)
            q, k, v = q.to(low), k.to(low), v.to(low)
        return FusedAttentionFn.apply(q, k, v, scale)
