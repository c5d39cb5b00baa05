"""Reference PyTorch implementations of the catalog's architectures, built from a
ModelSpec at any size: GPT-2 style (LayerNorm, learned positions, fused QKV with biases,
GELU), Llama style (RMSNorm, RoPE, GQA, SwiGLU) and mixture-of-experts layers (top-k routed
and shared experts). By default written the way Hugging Face `transformers` writes them
(eager RMSNorm and SwiGLU, SDPA or eager attention); `fused=True` swaps in autograd
Functions that keep exactly what Megatron's fused RMSNorm, SwiGLU and unpermute kernels
keep, and `gate_in_act=True` has fused SwiGLU experts multiply by their gate weights inside
the activation, as Megatron-Core's weighted SwiGLU does. torch is imported lazily by callers
of this module."""

from __future__ import annotations

import math
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..estimate.activations import DEFAULT_EXPERTS_IMPL
from ..specs.model import ModelSpec


class FusedRMSNormFn(torch.autograd.Function):
    """What a fused RMSNorm kernel (Apex, Transformer Engine, Liger) keeps for backward:
    the input and the fp32 reciprocal RMS."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        xf = _upcast(x)
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return (xf * rstd).to(x.dtype) * weight

    @staticmethod
    def backward(ctx, grad):
        x, weight, rstd = ctx.saved_tensors
        normed = _upcast(x) * rstd
        g = _upcast(grad) * _upcast(weight)
        dx = rstd * (g - normed * (g * normed).mean(-1, keepdim=True))
        dw = (_upcast(grad) * normed).reshape(-1, x.shape[-1]).sum(0)
        return dx.to(x.dtype), dw.to(weight.dtype), None


def _upcast(t):
    """16-bit tensors to fp32 for the statistics; fp32/fp64 unchanged."""
    return t.float() if t.dtype in (torch.bfloat16, torch.float16) else t


class FusedSwiGLUFn(torch.autograd.Function):
    """A fused SwiGLU kernel (Megatron's bias_swiglu): keeps gate and up, recomputes silu."""

    @staticmethod
    def forward(ctx, gate, up):
        ctx.save_for_backward(gate, up)
        return F.silu(gate) * up

    @staticmethod
    def backward(ctx, grad):
        gate, up = ctx.saved_tensors
        sig = torch.sigmoid(gate)
        silu = gate * sig
        return grad * up * sig * (1 + gate * (1 - sig)), grad * silu


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6, fused: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps, self.fused = eps, fused

    def forward(self, x):
        if self.fused:
            return FusedRMSNormFn.apply(x, self.weight, self.eps)
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def _norm(spec: ModelSpec, dim: int, fused: bool = False) -> nn.Module:
    return nn.LayerNorm(dim) if spec.norm == "layernorm" else RMSNorm(dim, fused=fused)


class WeightedSwiGLUFn(torch.autograd.Function):
    """Megatron-Core's weighted SwiGLU (fused_bias_swiglu.py WeightedSwiGLUFunction, the experts'
    activation at @d98e8a64): silu(gate) · up · w with w each routed copy's gate weight; keeps
    gate, up and w, and gives w's gradient from them, so no expert output is kept for it."""

    @staticmethod
    def forward(ctx, gate, up, weight):
        ctx.save_for_backward(gate, up, weight)
        return F.silu(gate) * up * weight

    @staticmethod
    def backward(ctx, grad):
        gate, up, weight = ctx.saved_tensors
        sig = torch.sigmoid(gate)
        silu = gate * sig
        g = grad * weight
        return (g * up * sig * (1 + gate * (1 - sig)), g * silu,
                (grad * silu * up).sum(dim=-1, keepdim=True).to(weight.dtype))


class IndexAddFn(torch.autograd.Function):
    """Scatter-add that keeps only the index (a fused unpermute kernel)."""

    @staticmethod
    def forward(ctx, out, index, source):
        ctx.save_for_backward(index)
        return out.index_add(0, index, source)

    @staticmethod
    def backward(ctx, grad):
        (index,) = ctx.saved_tensors
        return grad, None, grad.index_select(0, index)


def rope_tables(seq: int, dim: int, device, dtype, base: float = 10000.0):
    inv = 1.0 / (base ** (torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim))
    ang = torch.outer(torch.arange(seq, device=device, dtype=torch.float32), inv)
    emb = torch.cat([ang, ang], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rope_dim(spec: ModelSpec) -> int:
    """The width RoPE rotates: a head (its first `rotary_fraction`), or MLA's rotary part."""
    return spec.rotary_dim


def _rotate(x, cos, sin, concat: bool = False):
    """RoPE on the first cos.shape[-1] dims of x; with `concat` (partial rotary, as transformers'
    GPT-NeoX, Phi and GLM write it) the rotated part and the rest are concatenated."""
    dim = cos.shape[-1]
    if concat:
        return torch.cat([_rotate(x[..., :dim], cos, sin), x[..., dim:]], dim=-1)
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rot * sin


class Attention(nn.Module):
    def __init__(self, spec: ModelSpec, attention: str, dropout: float, selective: bool = False,
                 fused: bool = False):
        super().__init__()
        self.spec, self.attention, self.p, self.selective = spec, attention, dropout, selective
        # heads held by this rank (tensor parallelism divides them)
        self.heads, self.kv_heads = spec.heads, spec.n_kv_heads
        h, q, kv = spec.hidden, spec.q_dim, spec.kv_dim
        self.fused = spec.fused_qkv  # GPT-2's c_attn: one QKV projection
        if self.fused:
            self.qkv = nn.Linear(h, q + 2 * kv, bias=spec.qkv_bias)
        else:
            self.q = nn.Linear(h, q, bias=spec.qkv_bias)
            self.k = nn.Linear(h, kv, bias=spec.qkv_bias)
            self.v = nn.Linear(h, kv, bias=spec.qkv_bias)
        self.o = nn.Linear(q, h, bias=spec.bias)
        if spec.qk_norm:  # Qwen3: RMSNorm over each head of q and k, before RoPE
            self.q_norm, self.k_norm = RMSNorm(spec.dim_head, fused=fused), RMSNorm(spec.dim_head, fused=fused)

    def forward(self, x, cos, sin, causal):
        b, s, _ = x.shape
        a, kvh, d = self.heads, self.kv_heads, self.spec.dim_head
        if self.fused:
            q, k, v = self.qkv(x).split([a * d, kvh * d, kvh * d], dim=-1)
        else:
            q, k, v = self.q(x), self.k(x), self.v(x)
        q, k = q.view(b, s, a, d), k.view(b, s, kvh, d)
        if self.spec.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        partial = cos is not None and cos.shape[-1] < d
        if partial and not self.spec.rope_concat:  # GPT-J: partial rotary before the heads' transpose
            q, k = (_rotate(t, cos[:, None], sin[:, None], True) for t in (q, k))
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = v.view(b, s, kvh, d).transpose(1, 2)
        if cos is not None and not (partial and not self.spec.rope_concat):
            concat = self.spec.rope_concat
            q, k = _rotate(q, cos, sin, concat), _rotate(k, cos, sin, concat)
        if self.selective:  # recompute the attention core in backward (Korthikanti et al.)
            out = checkpoint(self.core, q, k, v, causal, use_reentrant=True)
        else:
            out = self.core(q, k, v, causal)
        out = out.transpose(1, 2).contiguous().view(b, s, a * d)
        return F.dropout(self.o(out), self.p, self.training)

    def core(self, q, k, v, causal):
        a, kvh, d = self.heads, self.kv_heads, self.spec.dim_head
        p = self.p if self.training else 0.0
        if self.attention == "eager":
            if kvh != a and self.spec.kv_broadcast:  # Falcon's eager broadcast: a copy per head
                k = k.repeat_interleave(a // kvh, dim=1)
                v = v.repeat_interleave(a // kvh, dim=1)
            elif kvh != a:  # repeat K/V to every query head as transformers' repeat_kv does (expand and
                # reshape: a copy, or a view of the one KV head a rank holds)
                b_, _, s_, _ = k.shape
                k = k[:, :, None].expand(b_, kvh, a // kvh, s_, d).reshape(b_, a, s_, d)
                v = v[:, :, None].expand(b_, kvh, a // kvh, s_, d).reshape(b_, a, s_, d)
            scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(d))
            probs = scores.masked_fill(causal, float("-inf")).softmax(dim=-1)
            return F.dropout(probs, p, self.training) @ v
        if self.attention == "cudnn" and q.is_cuda:  # the kernel the plan priced, not SDPA's first choice
            from torch.nn.attention import SDPBackend, sdpa_kernel

            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p, enable_gqa=kvh != a)
        if self.spec.kv_broadcast and kvh == 1 != a:  # Falcon's multi-query: one K/V head broadcast, SDPA's math kernel
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p, enable_gqa=kvh != a)


def _gelu_new(x):  # transformers' NewGELUActivation, op for op
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def _gelu_fast(x):  # transformers' FastGELUActivation, op for op
    return 0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))


# The activation functions of ModelSpec.activation written with the ops of transformers 5.x
# `activations.py` (what each op keeps for backward is what the planner prices); None: one
# GELU (ungated) or SiLU (gated) kernel.
ACTIVATION_FNS = {
    "gelu": F.gelu, "gelu_pytorch_tanh": partial(F.gelu, approximate="tanh"), "silu": F.silu, "swish": F.silu,
    "gelu_new": _gelu_new, "gelu_fast": _gelu_fast, "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),
    "relu": F.relu, "relu2": lambda x: torch.square(F.relu(x)),
}


class MLP(nn.Module):
    def __init__(self, spec: ModelSpec, dropout: float, ffn: int | None = None, fused: bool = False):
        super().__init__()
        h, f = spec.hidden, ffn or spec.ffn
        self.swiglu, self.p, self.fused = spec.mlp == "swiglu", dropout, fused
        default = F.silu if self.swiglu else partial(F.gelu, approximate="tanh")
        self.act = ACTIVATION_FNS[spec.activation] if spec.activation else default
        bias = spec.bias if spec.mlp_bias is None else spec.mlp_bias
        self.up = nn.Linear(h, f, bias=bias)
        self.down = nn.Linear(f, h, bias=bias)
        if self.swiglu:
            self.gate = nn.Linear(h, f, bias=bias)

    def forward(self, x, weight=None):
        """`weight`: each row's gate weight, applied inside a fused SwiGLU (MoE experts)."""
        if self.swiglu and self.fused and weight is not None:
            return self.down(WeightedSwiGLUFn.apply(self.gate(x), self.up(x), weight))
        if self.swiglu and self.fused:
            y = FusedSwiGLUFn.apply(self.gate(x), self.up(x))
        elif self.swiglu:
            y = self.act(self.gate(x)) * self.up(x)
        elif self.fused:  # a fused kernel keeping its input, whatever the activation
            y = F.gelu(self.up(x), approximate="tanh")
        else:
            y = self.act(self.up(x))
        return F.dropout(self.down(y), self.p, self.training)


class MoE(nn.Module):
    """Top-k routed experts plus optional shared experts, written like transformers'
    Mixtral/Qwen-MoE sparse blocks: softmax router in fp32, gather each expert's tokens,
    run the expert MLP, weight and scatter-add back; the shared experts last, scaled by a
    sigmoid gate where the model has one. With `gate_in_act` fused SwiGLU experts take the
    gate weights inside their activation (Megatron-Core) instead of weighting their output."""

    def __init__(self, spec: ModelSpec, dropout: float, fused: bool = False, gate_in_act: bool = False):
        super().__init__()
        self.spec, self.fused = spec, fused
        # transformers 5's grouped experts unless the spec says eager; fused kernels run the loop
        # with a fused unpermute (IndexAddFn)
        self.grouped = (spec.experts_impl or DEFAULT_EXPERTS_IMPL) == "grouped" and not fused
        self.gate_in_act = gate_in_act and fused and spec.mlp == "swiglu"
        self.router = nn.Linear(spec.hidden, spec.experts, bias=False)
        self.experts = nn.ModuleList(MLP(spec, 0.0, spec.expert_ffn or spec.ffn, fused)
                                     for _ in range(spec.experts))
        shared = spec.shared_ffn_total
        self.shared = MLP(spec, 0.0, shared, fused) if spec.shared_experts else None
        # Qwen-MoE scales the shared experts' output by a sigmoid gate of the token
        self.shared_gate = nn.Linear(spec.hidden, 1, bias=False) if spec.shared_expert_gate else None
        self.p = dropout

    def forward(self, x):
        b, s, h = x.shape
        flat = x.reshape(-1, h)
        probs = F.softmax(self.router(flat), dim=-1, dtype=torch.float)
        weights, chosen = torch.topk(probs, self.spec.top_k, dim=-1)
        if self.grouped:
            out = self._grouped(flat, weights, chosen)
        else:
            weights = weights.to(x.dtype)
            out = torch.zeros_like(flat)
            for e, expert in enumerate(self.experts):
                token, slot = torch.where(chosen == e)
                if token.numel() == 0:
                    continue
                if self.gate_in_act:
                    y = expert(flat[token], weights[token, slot, None])
                else:
                    y = expert(flat[token]) * weights[token, slot, None]
                out = IndexAddFn.apply(out, token, y) if self.fused else out.index_add(0, token, y)
        return self.combine(flat, out, (b, s, h))

    def combine(self, flat, routed, shape):
        """The routed experts' output plus the shared experts' (sigmoid-gated where the model
        gates them), then dropout, in the input's shape."""
        if self.shared is not None:
            shared = self.shared(flat)
            if self.shared_gate is not None:
                shared = torch.sigmoid(self.shared_gate(flat)) * shared
            routed = routed + shared
        return F.dropout(routed.view(shape), self.p, self.training)

    def _grouped(self, flat, weights, chosen):
        """transformers 5's `grouped_mm_experts_forward` (integrations/moe.py), with each expert's
        rows run by its own MLP: the routed copies sorted by expert and gathered, the experts run
        in their weights' dtype (grouped_mm is not autocast), weighted by the fp32 gate weights,
        put back in order and summed over each token's k copies."""
        k, h = self.spec.top_k, flat.shape[-1]
        expert_ids, perm = torch.sort(chosen.reshape(-1))
        inputs = flat[perm // k]
        gate = weights.reshape(-1)[perm]
        counts = torch.bincount(expert_ids, minlength=len(self.experts)).tolist()
        up = self.experts[0].up
        dtype = getattr(up, "base", up).weight.dtype  # a LoRA-wrapped linear keeps its weight in `base`
        with torch.autocast(device_type=flat.device.type, enabled=False):
            rows, start = [], 0
            for expert, n in zip(self.experts, counts, strict=True):
                if n:
                    rows.append(expert(inputs[start:start + n].to(dtype)))
                start += n
            weighted = torch.cat(rows) * gate.unsqueeze(-1)
        inverse = torch.empty_like(perm)
        inverse[perm] = torch.arange(perm.numel(), device=perm.device)
        return weighted[inverse].view(-1, k, h).sum(dim=1).to(flat.dtype)


class Block(nn.Module):
    def __init__(self, spec: ModelSpec, attention: str, dropout: float, moe: bool = False,
                 selective: bool = False, fused: bool = False, gate_in_act: bool = False):
        super().__init__()
        self.norm1 = _norm(spec, spec.hidden, fused)
        # GPT-J, Phi: one norm feeds attention and MLP
        self.norm2 = None if spec.shared_norm else _norm(spec, spec.hidden, fused)
        if spec.is_mla:
            from .mla import MLAttention

            self.attn = MLAttention(spec, attention, dropout, selective, fused)
        else:
            self.attn = Attention(spec, attention, dropout, selective, fused)
        self.mlp = MoE(spec, dropout, fused, gate_in_act) if moe else MLP(spec, dropout, fused=fused)
        self.parallel = spec.parallel_residual

    def forward(self, x, cos, sin, causal):
        if self.parallel:  # GPT-NeoX: attention and MLP both read the layer's input
            normed = self.norm1(x)
            return x + self.attn(normed, cos, sin, causal) + self.mlp(normed if self.norm2 is None else self.norm2(x))
        x = x + self.attn(self.norm1(x), cos, sin, causal)
        return x + self.mlp(self.norm2(x))


def _at_least_fp32(t):
    return t.to(torch.promote_types(t.dtype, torch.float32))


class FusedCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy over rows of `logits` that keeps what a fused loss kernel keeps
    (flash-attn's cross_entropy, Apex xentropy): the logits in their own dtype and one fp32
    log-sum-exp per row, no fp32 copy of the logits; the gradient is written in the logits'
    dtype."""

    @staticmethod
    def forward(ctx, logits, targets):
        lse = torch.logsumexp(_at_least_fp32(logits), dim=-1)
        picked = _at_least_fp32(logits.gather(-1, targets[:, None]).squeeze(-1))
        ctx.save_for_backward(logits, lse, targets)
        return (lse - picked).mean()

    @staticmethod
    def backward(ctx, grad):
        logits, lse, targets = ctx.saved_tensors
        probs = torch.exp(_at_least_fp32(logits) - lse[:, None])
        probs[torch.arange(len(targets), device=targets.device), targets] -= 1.0
        return (probs * (grad / len(targets))).to(logits.dtype), None


class LoRALinear(nn.Module):
    """A frozen linear with a trainable low-rank update (Hu et al. 2021): y = x·Wᵀ + (x·A)·B,
    A of in x r, B of r x out (B starts at zero, so the update starts at nothing); with
    `dropout`, the adapter reads a dropped-out copy of x (PEFT's lora_dropout)."""

    def __init__(self, base: nn.Linear, rank: int, dropout: float = 0.0):
        super().__init__()
        self.base, self.p = base, dropout
        for w in base.parameters():
            w.requires_grad_(False)
        self.lora_a = nn.Parameter(torch.randn(base.in_features, rank, dtype=base.weight.dtype) / rank)
        self.lora_b = nn.Parameter(torch.zeros(rank, base.out_features, dtype=base.weight.dtype))

    def forward(self, x):
        # peft casts the adapter's input to the adapter's dtype first (lora/layer.py Linear.forward)
        h = x.to(self.lora_a.dtype)
        h = F.dropout(h, self.p, self.training) if self.p else h
        return self.base(x) + (h @ self.lora_a) @ self.lora_b


def apply_lora(model: nn.Module, targets, rank: int, dropout: float = 0.0) -> None:
    """LoRA on every linear named in `targets` (q, k, v, o, gate, up, down); every other
    parameter frozen (the embedding, norms and output head too)."""
    for w in model.parameters():
        w.requires_grad_(False)
    for module in list(model.modules()):
        for name in targets:
            child = getattr(module, name, None)
            if isinstance(child, nn.Linear):
                setattr(module, name, LoRALinear(child, rank, dropout))


class DecoderLM(nn.Module):
    """Embedding, blocks, final norm, output head and the cross-entropy loss (PyTorch's, on
    fp32 logits, or `fused_loss`: one that keeps the 16-bit logits). Full recompute checkpoints
    each block: reentrant, or (`early_stop`) non-reentrant, whose recomputation ends once every
    saved tensor is back (before the block's last linear, PyTorch >= 2.1)."""

    def __init__(self, spec: ModelSpec, attention: str = "sdpa", dropout: float = 0.0,
                 recompute: str = "none", fused: bool = False, fused_loss: bool = False, early_stop: bool = False,
                 recompute_layers: int | None = None, gate_in_act: bool = False):
        super().__init__()
        self.spec, self.recompute, self.attention = spec, recompute, attention
        self.early_stop = early_stop  # full recompute: non-reentrant checkpoint, which stops early
        # full recompute checkpoints the first `recompute_layers` blocks (Megatron's "block"
        # method), every block when None
        self.checkpointed = spec.layers if recompute_layers is None else recompute_layers
        self.embed = nn.Embedding(spec.vocab, spec.hidden)
        self.pos = nn.Embedding(spec.max_position, spec.hidden) if spec.position == "learned" else None
        self.blocks = nn.ModuleList(
            Block(spec, "eager" if attention == "eager" else "sdpa", dropout, spec.is_moe_layer(i),
                  selective=recompute == "selective", fused=fused, gate_in_act=gate_in_act)
            for i in range(spec.layers))
        self.norm = _norm(spec, spec.hidden, fused)
        self.head = nn.Linear(spec.hidden, spec.vocab, bias=spec.head_bias)
        if spec.tied_embeddings:
            self.head.weight = self.embed.weight
        self.p = dropout
        self.fused_loss = fused_loss

    def forward(self, ids, targets):
        b, s = ids.shape
        x = self.embed(ids)
        if self.pos is not None:
            x = x + self.pos(torch.arange(s, device=ids.device))
        x = F.dropout(x, self.p, self.training)
        cos = sin = causal = None
        if self.spec.position == "rotary":
            cos, sin = rope_tables(s, rope_dim(self.spec), ids.device, x.dtype)
        if self.attention == "eager":  # one boolean causal mask per forward, shared by the layers
            causal = torch.ones(s, s, dtype=torch.bool, device=ids.device).triu(1)
        full = self.recompute == "full" and self.checkpointed > 0
        if full and not self.early_stop and not x.requires_grad:
            # A reentrant checkpoint's output needs a gradient only if an input does: under LoRA
            # the frozen embedding's output is made to require one, as transformers'
            # enable_input_require_grads does for gradient checkpointing.
            x.requires_grad_()
        for i, blk in enumerate(self.blocks):
            if full and i < self.checkpointed:  # keep only the block's input
                x = checkpoint(blk, x, cos, sin, causal, use_reentrant=not self.early_stop)
            else:
                x = blk(x, cos, sin, causal)
        logits = self.head(self.norm(x))
        if self.fused_loss:
            return FusedCrossEntropy.apply(logits.view(b * s, -1), targets.view(-1))
        return F.cross_entropy(logits.float().view(b * s, -1), targets.view(-1))
