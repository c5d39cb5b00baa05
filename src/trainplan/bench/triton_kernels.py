"""Our own Triton kernels for the fusion, tiling and attention suites. Import through
`triton_support.kernels(device)`: on a CPU the module must be imported with
TRITON_INTERPRET=1 set (Triton reads it when a kernel is decorated), which runs every program
instance in NumPy: slow, but the same kernel source, so CI checks its arithmetic.

Each kernel is written to be read next to the seed text it illustrates:
* fusion (seed 002, operator fusion): bias + GELU + dropout + residual in one pass over HBM;
* tiling (seed 002): a row-at-a-time matmul that reuses nothing on chip vs a blocked one whose
  BM x BK and BK x BN tiles are reused BN and BM times from on-chip memory;
* attention (seed 000 / 004 Algorithm "FlashAttention with online softmax"): a forward pass
  that never writes the S x S scores, keeping a running max m and denominator l per row.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
LOG2E = 1.4426950408889634  # exp(x) = exp2(x * log2 e): exp2 is the native instruction


# ---------------------------------------------------------------------------- fusion
@triton.jit
def _bias_gelu_dropout_residual(x_ptr, bias_ptr, res_ptr, out_ptr, n, cols, p, seed, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < n
    h = tl.load(x_ptr + offs, mask=inside).to(tl.float32) + tl.load(bias_ptr + offs % cols, mask=inside).to(tl.float32)
    gelu = 0.5 * h * (1.0 + tl.math.erf(h * 0.7071067811865476))  # exact (erf) GELU, as F.gelu
    keep = tl.rand(seed, offs) >= p  # Philox counter-based: the mask is never stored
    y = tl.where(keep, gelu / (1.0 - p), 0.0) + tl.load(res_ptr + offs, mask=inside).to(tl.float32)
    tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=inside)


def bias_gelu_dropout_residual(x, bias, residual, p: float, seed: int, out=None, block: int = 1024):
    """residual + dropout(gelu(x + bias), p) in one kernel: reads x and residual, writes out."""
    import torch

    out = torch.empty_like(x) if out is None else out
    n = x.numel()
    _bias_gelu_dropout_residual[(triton.cdiv(n, block),)](x, bias, residual, out, n, bias.numel(), p, seed,
                                                          BLOCK=block)
    return out


# ---------------------------------------------------------------------------- tiling
@triton.jit
def _rowwise_matmul(a_ptr, b_ptr, c_ptr, M, N, K, sam, sak, sbk, sbn, scm, scn, BN: tl.constexpr, BK: tl.constexpr):
    # one program = one row of C, BN columns wide: B's K x BN strip is read again for every
    # row, so each element of B is fetched M times and the kernel is paced by memory
    row = tl.program_id(0)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    ks = tl.arange(0, BK)
    acc = tl.zeros((BN,), dtype=tl.float32)
    for k0 in range(0, K, BK):
        kk = k0 + ks
        a = tl.load(a_ptr + row * sam + kk * sak, mask=kk < K, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + kk[:, None] * sbk + cols[None, :] * sbn, mask=(kk[:, None] < K) & (cols[None, :] < N),
                    other=0.0).to(tl.float32)
        acc += tl.sum(a[:, None] * b, axis=0)
    tl.store(c_ptr + row * scm + cols * scn, acc.to(c_ptr.dtype.element_ty), mask=cols < N)


def rowwise_matmul(a, b, out=None, bn: int = 128, bk: int = 32):
    import torch

    m, k = a.shape
    n = b.shape[1]
    out = torch.empty((m, n), device=a.device, dtype=a.dtype) if out is None else out
    _rowwise_matmul[(m, triton.cdiv(n, bn))](a, b, out, m, n, k, *a.stride(), *b.stride(), *out.stride(), BN=bn, BK=bk)
    return out


@triton.jit
def _tiled_matmul(a_ptr, b_ptr, c_ptr, M, N, K, sam, sak, sbk, sbn, scm, scn,
                  BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr):
    # programs are numbered so that GROUP_M consecutive ones share a column of B tiles (L2 reuse)
    pid = tl.program_id(0)
    tiles_m, tiles_n = tl.cdiv(M, BM), tl.cdiv(N, BN)
    group = pid // (GROUP_M * tiles_n)
    first_m = group * GROUP_M
    rows_in_group = min(tiles_m - first_m, GROUP_M)
    tile_m = first_m + (pid % (GROUP_M * tiles_n)) % rows_in_group
    tile_n = (pid % (GROUP_M * tiles_n)) // rows_in_group
    rm = (tile_m * BM + tl.arange(0, BM)) % M  # wrap instead of masking the loads; the store is masked
    rn = (tile_n * BN + tl.arange(0, BN)) % N
    rk = tl.arange(0, BK)
    a_tile = a_ptr + rm[:, None] * sam + rk[None, :] * sak
    b_tile = b_ptr + rk[:, None] * sbk + rn[None, :] * sbn
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        a = tl.load(a_tile, mask=rk[None, :] < K - k0, other=0.0)
        b = tl.load(b_tile, mask=rk[:, None] < K - k0, other=0.0)
        acc = tl.dot(a, b, acc)  # each loaded tile feeds BM*BN*BK multiply-adds
        a_tile += BK * sak
        b_tile += BK * sbk
    cm = tile_m * BM + tl.arange(0, BM)
    cn = tile_n * BN + tl.arange(0, BN)
    tl.store(c_ptr + cm[:, None] * scm + cn[None, :] * scn, acc.to(c_ptr.dtype.element_ty),
             mask=(cm[:, None] < M) & (cn[None, :] < N))


def tiled_matmul(a, b, out=None, bm: int = 128, bn: int = 128, bk: int = 64, group_m: int = 8,
                 num_warps: int = 4, num_stages: int = 3):
    import torch

    m, k = a.shape
    n = b.shape[1]
    out = torch.empty((m, n), device=a.device, dtype=a.dtype) if out is None else out
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
    _tiled_matmul[grid](a, b, out, m, n, k, *a.stride(), *b.stride(), *out.stride(), BM=bm, BN=bn, BK=bk,
                        GROUP_M=group_m, num_warps=num_warps, num_stages=num_stages)
    return out


# ---------------------------------------------------------------------------- attention
@triton.jit
def _attend_blocks(acc, m_i, l_i, q, k_base, v_base, rm, lo, hi, S, qk_scale,
                   D: tl.constexpr, BN: tl.constexpr, DIAGONAL: tl.constexpr, EVEN: tl.constexpr):
    """Fold key/value blocks [lo, hi) into the running (acc, m, l) of one query block."""
    rd = tl.arange(0, D)
    for start in range(lo, hi, BN):
        rn = start + tl.arange(0, BN)
        if EVEN:
            k = tl.load(k_base + rn[:, None] * D + rd[None, :])
        else:
            k = tl.load(k_base + rn[:, None] * D + rd[None, :], mask=rn[:, None] < S, other=0.0)
        s = tl.dot(q, tl.trans(k)) * qk_scale  # scores in log2 units, fp32, never stored
        if DIAGONAL:
            s = tl.where(rm[:, None] >= rn[None, :], s, float("-inf"))
        if not EVEN:
            s = tl.where(rn[None, :] < S, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))  # running row max (numerical stability)
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)  # rescales what was accumulated under the old max
        l_i = l_i * alpha + tl.sum(p, 1)
        if EVEN:
            v = tl.load(v_base + rn[:, None] * D + rd[None, :])
        else:
            v = tl.load(v_base + rn[:, None] * D + rd[None, :], mask=rn[:, None] < S, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _flash_forward(q_ptr, k_ptr, v_ptr, o_ptr, S, qk_scale, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                   CAUSAL: tl.constexpr, EVEN: tl.constexpr):
    block = tl.program_id(0)
    base = tl.program_id(1).to(tl.int64) * S * D  # one (batch, head) per program column
    rm = block * BM + tl.arange(0, BM)
    rd = tl.arange(0, D)
    if EVEN:
        q = tl.load(q_ptr + base + rm[:, None] * D + rd[None, :])
    else:
        q = tl.load(q_ptr + base + rm[:, None] * D + rd[None, :], mask=rm[:, None] < S, other=0.0)
    m_i = tl.full((BM,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BM,), dtype=tl.float32)
    acc = tl.zeros((BM, D), dtype=tl.float32)
    if CAUSAL:
        # blocks wholly below the diagonal need no mask; the diagonal block does
        acc, m_i, l_i = _attend_blocks(acc, m_i, l_i, q, k_ptr + base, v_ptr + base, rm, 0, block * BM, S, qk_scale,
                                       D, BN, False, EVEN)
        acc, m_i, l_i = _attend_blocks(acc, m_i, l_i, q, k_ptr + base, v_ptr + base, rm, block * BM,
                                       (block + 1) * BM, S, qk_scale, D, BN, True, EVEN)
    else:
        acc, m_i, l_i = _attend_blocks(acc, m_i, l_i, q, k_ptr + base, v_ptr + base, rm, 0, S, S, qk_scale,
                                       D, BN, False, EVEN)
    out = acc / l_i[:, None]
    if EVEN:
        tl.store(o_ptr + base + rm[:, None] * D + rd[None, :], out.to(o_ptr.dtype.element_ty))
    else:
        tl.store(o_ptr + base + rm[:, None] * D + rd[None, :], out.to(o_ptr.dtype.element_ty), mask=rm[:, None] < S)


def flash_attention(q, k, v, causal: bool = True, out=None, bm: int = 128, bn: int = 64,
                    num_warps: int | None = None, num_stages: int = 3):
    """softmax(q kᵀ / sqrt(d)) v for contiguous (batch, heads, seq, head_dim) tensors, without
    materialising the scores: memory O(seq), not O(seq²)."""
    import torch

    b, h, s, d = q.shape
    if d not in (16, 32, 64, 128, 256):
        raise ValueError(f"head_dim must be a power of two from 16 to 256 (got {d})")
    if bm % bn:
        raise ValueError(f"the query block ({bm}) must be a multiple of the key block ({bn})")
    q, k, v = (t.contiguous() for t in (q, k, v))
    out = torch.empty_like(q) if out is None else out
    warps = num_warps or (8 if d >= 128 else 4)
    _flash_forward[(triton.cdiv(s, bm), b * h)](q, k, v, out, s, LOG2E / d**0.5, D=d, BM=bm, BN=bn, CAUSAL=causal,
                                                EVEN=s % bm == 0, num_warps=warps, num_stages=num_stages)
    return out
