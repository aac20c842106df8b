"""
nanoVHA model: a Qwen3-style decoder with GQA and Virtual Head Attention (VHA), in one file.

Reads top to bottom: RMSNorm, RoPE, KV cache, attention (GQA + VHA premix/postmix; MLA), MLP, block, config (with
the cost accounting), model (forward, prefill/decode, generate), and the fold. Checkpoint I/O is nanovha/checkpoint.py;
what premix and postmix learned (health signals) nanovha/health.py.

Head counts, as the paper and docs/ name them: H_v = n_head, the query heads that attend (VHA: virtual heads);
H_kv = n_kv_head, the KV heads; H_p = n_q_proj = H_v / H_kv, VHA's physical query projections.

VHA in one picture (H_v=8 virtual query heads, H_kv=2 KV heads, H_p=H_v/H_kv=4 physical q projections):

    physical q heads     q0   q1   q2   q3            (W_q has only H_p*d rows)
                          |    |    |    |
    premix, group g=0:  q0P0 q1P0 q2P0 q3P0  -> virtual heads j=0..3 --> attend KV head 0
    premix, group g=1:  q0P1 q1P1 q2P1 q3P1  -> virtual heads j=4..7 --> attend KV head 1

    virtual head j = g*H_p + h  reads KV head j // H_p   (the usual GQA grouping)

After attention, postmix mixes the H_v head outputs with M = I + V U^T (low rank r), then W_o.
Both maps are linear, so after training they fold into W_q and W_o (see fold_to_gqa, at the end):
the deployed model is a plain GQA model with n_head=H_v, n_kv_head=H_kv.
"""
import math
import zlib
from dataclasses import asdict, dataclass
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        # computed in at least float32 (like Qwen3), so bf16 activations keep the normalisation exact
        xf = x.to(torch.promote_types(x.dtype, torch.float32))
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def rope_cos_sin(positions, head_dim, theta, dtype):
    """Rotate-half RoPE tables for integer `positions` (T,), each (T, head_dim).
    Angles are computed in float64, then cast, so long positions keep their precision."""
    where = "cpu" if positions.device.type == "mps" else positions.device  # MPS has no float64
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64, device=where) / head_dim)
    angles = positions.to(where, torch.float64)[:, None] * inv_freq[None, :]  # (T, hd/2)
    angles = torch.cat([angles, angles], dim=-1)  # (T, hd): frequency i pairs dims i and i + hd/2
    return angles.cos().to(positions.device, dtype), angles.sin().to(positions.device, dtype)


def apply_rope(x, cos, sin):
    """x: (B, H, T, hd). Rotates each pair (x_i, x_{i+hd/2}) by its position's angle."""
    x1, x2 = x.chunk(2, dim=-1)
    rotated_half = torch.cat([-x2, x1], dim=-1)
    return x * cos + rotated_half * sin


class KVCache(nn.Module):
    """Preallocated cache for one layer: k (B, heads, max_len, k_dim) and v (B, heads, max_len, v_dim).
    GQA: keys and values of the KV heads; MLA: k holds the latent c_kv and v the shared RoPE key (1 "head")."""

    def __init__(self, batch_size, heads, max_len, k_dim, v_dim, dtype, device):
        super().__init__()
        k = torch.zeros(batch_size, heads, max_len, k_dim, dtype=dtype, device=device)
        v = torch.zeros(batch_size, heads, max_len, v_dim, dtype=dtype, device=device)
        self.register_buffer("k", k, persistent=False)
        self.register_buffer("v", v, persistent=False)

    def update(self, start, k, v):
        """Writes k, v (B, H_kv, T, hd) at start..; returns the filled prefix for an int start, the whole
        cache for a (1,) tensor start (static shapes: the caller masks positions after start)."""
        if isinstance(start, torch.Tensor):
            self.k.index_copy_(2, start, k)
            self.v.index_copy_(2, start, v)
            return self.k, self.v
        end = start + k.size(2)
        self.k[:, :, start:end] = k
        self.v[:, :, start:end] = v
        return self.k[:, :, :end], self.v[:, :, :end]


def plain_attention(q, k, v):
    """The obvious causal attention, for reading and testing: repeat KV heads, mask, softmax.
    q: (B, H_q, Tq, hd), k/v: (B, H_kv, Tk, hd); query i sits at position Tk - Tq + i."""
    group = q.size(1) // k.size(1)
    k = k.repeat_interleave(group, dim=1)  # (B, H_q, Tk, hd): query head j reads KV head j // group
    v = v.repeat_interleave(group, dim=1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, H_q, Tq, Tk)
    Tq, Tk = q.size(2), k.size(2)
    future = torch.ones(Tq, Tk, dtype=torch.bool, device=q.device).triu(Tk - Tq + 1)
    scores = scores.masked_fill(future, float("-inf"))
    return scores.softmax(dim=-1) @ v  # (B, H_q, Tq, hd)


def grouped_decode_attention(q, k, v):
    """One-token decode (Tq=1) with one matmul per KV head: reads each cached K/V once, however
    many query heads share it (CPU SDPA with enable_gqa does per-query-head work at Tq=1). q: (B, H_q, 1, hd),
    k/v hold exactly the past. The compiled step does the same with SDPA over the group as query rows (attend)."""
    B, H_q, _, hd = q.shape
    H_kv = k.size(1)
    qg = q.view(B, H_kv, H_q // H_kv, hd) * hd ** -0.5  # (B, H_kv, group, hd): heads j = g*group + i; scaled
    scores = qg @ k.transpose(-2, -1)  # (B, H_kv, group, Tk): scaling q is cheaper than scaling Tk scores
    out = scores.softmax(dim=-1) @ v  # (B, H_kv, group, hd)
    return out.view(B, H_q, 1, hd)


CACHE_BLOCK = 64  # KV caches hold whole blocks of this many positions (see split_kv_attention)


def split_kv_attention(q, k, v, visible, scale=None, splits=None):
    """One-token decode over a static cache, flash-decoding style: q (B, H_kv, G, d) holds each KV head's G
    query heads as query rows; k (B, H_kv, T, d), v (B, H_kv, T, d_v); visible (T,) the positions written.
    -> (B, H_kv, G, d_v). A CPU SDPA call works on one (batch, head) per thread, so with fewer KV heads than threads
    (MQA, MFA, MLA's latent) the cache is cut into S chunks along T, each attended on its own, and the chunks'
    outputs are merged by their log-sum-exps: out = sum_s softmax_s(lse_s) out_s (exact, up to rounding).
    splits=None: as many chunks as idle threads; the tests set it."""
    B, H_kv, G, d = q.shape
    T = k.size(2)
    S = torch.get_num_threads() // (B * H_kv) if splits is None else splits
    S = 1 << (min(S, CACHE_BLOCK).bit_length() - 1) if S >= 1 and q.device.type == "cpu" else 1  # a power of 2
    if S < 2 or T % S or v.size(-1) != d:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=visible[None], scale=scale)
    n = T // S
    qs = q[:, :, None].expand(B, H_kv, S, G, d).reshape(B, H_kv * S, G, d)  # (B, H_kv*S, G, d): chunks as heads
    ks, vs = k.view(B, H_kv * S, n, d), v.view(B, H_kv * S, n, d)  # (B, H_kv*S, n, d): chunk s of KV head g
    seen = visible.view(S, n)  # (S, n)
    bias = torch.zeros(S, n, dtype=q.dtype, device=q.device).masked_fill(~seen, float("-inf"))
    bias = bias[None, :, None].expand(H_kv, S, 1, n).reshape(1, H_kv * S, 1, n)  # (1, H_kv*S, 1, n)
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(qs, ks, vs, 0.0, False,
                                                                           attn_mask=bias, scale=scale)
    lse = lse.view(B, H_kv, S, G).masked_fill(~seen.any(dim=1)[:, None], float("-inf"))  # a chunk not yet written
    acc = torch.promote_types(q.dtype, torch.float32)  # bf16 chunks merge in float32
    w = lse.to(acc).softmax(dim=2)[..., None]  # (B, H_kv, S, G, 1): chunk s's share of the softmax mass
    return (out.view(B, H_kv, S, G, d).to(acc) * w).sum(dim=2).to(q.dtype)  # (B, H_kv, G, d)


def kv_expand_needed(device_type, dtype, H_q, H_kv):
    """True only for grouped heads in float32 on CUDA, where no fused SDPA kernel takes enable_gqa."""
    return device_type == "cuda" and dtype == torch.float32 and H_q != H_kv


def sdpa(q, k, v, is_causal=False, dropout_p=0.0, expand_kv=None):
    """F.scaled_dot_product_attention over grouped heads: q (B, H_q, Tq, hd), k/v (B, H_kv, Tk, hd) -> (B, H_q, Tq, hd).
    expand_kv=None decides by device and (autocast) dtype; True/False forces it (the tests run the CUDA branch on
    CPU)."""
    if expand_kv is None:
        dtype = torch.get_autocast_dtype("cuda") if q.is_cuda and torch.is_autocast_enabled("cuda") else q.dtype
        expand_kv = kv_expand_needed(q.device.type, dtype, q.size(1), k.size(1))
    # SPECIAL CASE, fp32 on CUDA: expand, else GQA runs the math path (flash/cuDNN: fp16/bf16 only; mem-efficient:
    # no GQA, pytorch#139586)
    if expand_kv:
        group = q.size(1) // k.size(1)
        k = k.repeat_interleave(group, dim=1)  # (B, H_q, Tk, hd): head j reads KV head j // group
        v = v.repeat_interleave(group, dim=1)
    return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, dropout_p=dropout_p, enable_gqa=not expand_kv)


class Attention(nn.Module):
    """GQA attention; with attn="vha" it adds Q premix and postmix, in this order:
    projections -> premix -> QK-norm -> RoPE -> causal attention -> postmix -> W_o.
    attn="mfa" (multi-matrix factorization attention, StepFun's MFA as Step-3 ships it) is GQA with few KV
    heads of a large head_dim and a low-rank query: q = RMSNorm(x W_qa) W_qb (rank q_rank, W_qa fused into
    qkv_proj), so many query heads cost D*r + r*H*d weights instead of D*H*d. This is plain MFA, not the paper's
    key-reuse variant (MFA-KR, values partly built from keys): Step-3 ships the plain form."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        d, D = cfg.head_dim, cfg.n_embd
        # q, k and v in one projection (nanoGPT's c_attn, gpt-fast's wqkv): one matrix-vector product per decoded
        # token instead of three. Rows: [W_q (H_p*d, the physical query heads); W_k (H_kv*d); W_v (H_kv*d)]
        self.qkv_split = cfg.qkv_split  # [H_p*d (or q_rank), H_kv*d, H_kv*d]
        self.qkv_proj = nn.Linear(D, sum(self.qkv_split), bias=False)
        if cfg.q_rank:  # MFA: rows [W_qa; W_k; W_v] above, then q = RMSNorm(x W_qa) W_qb
            self.q_latent_norm = RMSNorm(cfg.q_rank, cfg.norm_eps)
            self.q_up = nn.Linear(cfg.q_rank, cfg.n_q_proj * d, bias=False)
        self.o_proj = nn.Linear(cfg.n_attn_head * d, D, bias=False)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(d, cfg.norm_eps)  # one weight shared by all heads (Qwen3)
            self.k_norm = RMSNorm(d, cfg.norm_eps)
        if cfg.has_premix:
            # Q premix: q_j = q_h @ P[g] for virtual head j = g*H_p + h.  P: (H_kv, d, d), near identity.
            noise = 0.1 / math.sqrt(d) * torch.randn(cfg.n_kv_head, d, d)
            self.premix = nn.Parameter(torch.eye(d).repeat(cfg.n_kv_head, 1, 1) + noise)  # (H_kv, d, d)
        if cfg.has_postmix:
            # Postmix over heads: a'_j = a_j + sum_r V[j, r] act(sum_h U[h, r] a_h), i.e. a' = (I + V U^T) a.
            self.postmix_U = nn.Parameter(0.01 * torch.randn(cfg.n_attn_head, cfg.vha_postmix_rank))
            V = torch.zeros(cfg.n_attn_head, cfg.vha_postmix_rank)  # V=0: exact identity at init
            self.postmix_V = nn.Parameter(V)
        self.cache_dims = (cfg.n_kv_head, d, d)  # KVCache: heads, key width, value width
        self.kv_cache = None
        self.record_postmix = False  # when True, forward stores ||a' - a|| / ||a|| per token (VHA health)

    def apply_premix(self, q):
        """(B, T, H_p, d) -> (B, T, H_v, d), virtual head j = g*H_p + h gets q_h @ P[g]. One matmul:
        q @ [P[0] | P[1] | ...] computes every (h, g) pair at once."""
        B, T, H_p, d = q.shape
        H_kv = self.premix.size(0)
        P_cat = self.premix.permute(1, 0, 2).reshape(d, H_kv * d)  # (d, H_kv*d): column block g is P[g]
        q = (q @ P_cat).view(B, T, H_p, H_kv, d)  # [..., h, g, :] = q_h @ P[g]
        return q.transpose(2, 3).reshape(B, T, H_kv * H_p, d)  # (B, T, H_v, d), index g*H_p + h

    def apply_postmix(self, a):
        """a: (B, H, T, d) attention outputs -> a + V act(U^T a), mixing along the head axis."""
        B, H, T, d = a.shape
        flat = a.reshape(B, H, T * d)  # (B, H, T*d)
        z = self.postmix_U.t() @ flat  # (B, r, T*d): heads contracted to rank r
        if self.cfg.vha_postmix_act == "silu":
            z = F.silu(z)  # the paper's nonlinear ablation: not foldable
        delta = (self.postmix_V @ z).view(B, H, T, d)  # (B, H, T, d)
        if self.record_postmix:
            ratio = delta.float().norm(dim=(1, 3)) / a.float().norm(dim=(1, 3)).clamp_min(1e-12)  # (B, T)
            self.postmix_ratio = ratio.mean().item()
        return a + delta

    def postmix_matrix(self):
        """M = I + V U^T, (H, H): the linear postmix as one operator on the head axis."""
        V, U = self.postmix_V, self.postmix_U
        return torch.eye(V.size(0), dtype=V.dtype, device=V.device) + V @ U.t()

    def project(self, x):
        """x (B, T, D) -> q (B, T, H_p, d), k and v (B, T, H_kv, d): one matmul x [W_q; W_k; W_v]^T, split."""
        cfg, (B, T, _), d = self.cfg, x.shape, self.cfg.head_dim
        q, k, v = self.qkv_proj(x).split(self.qkv_split, dim=-1)
        if cfg.q_rank:
            q = self.q_up(self.q_latent_norm(q))  # MFA: (B, T, r) -> (B, T, H*d)
        return q.view(B, T, cfg.n_q_proj, d), k.view(B, T, cfg.n_kv_head, d), v.view(B, T, cfg.n_kv_head, d)

    def attend(self, q, k, v, start_pos):
        """Causal attention of q (B, H, T, d) over k, v (B, H_kv, T, d), through the KV cache when decoding ->
        (B, H, T, d). Each KV head serves H / H_kv query heads."""
        cfg, T = self.cfg, q.size(2)
        static = isinstance(start_pos, torch.Tensor)  # static-shape decode (torch.compile, CUDA graphs)
        if start_pos is not None:
            k, v = self.kv_cache.update(start_pos, k, v)  # (B, H_kv, start_pos+T, d); static: the whole cache
        if T == 1 and static:  # the compiled step: the group's query heads as query rows of one SDPA call per KV head
            B, H, _, d = q.shape
            visible = torch.arange(k.size(2), device=k.device) <= start_pos  # (max_len,): the positions written
            qg = q.view(B, k.size(1), H // k.size(1), d)  # (B, H_kv, group, d): heads j = g*group + i
            return split_kv_attention(qg, k, v, visible).view(B, H, 1, d)
        if T == 1 and start_pos is not None and cfg.decode_impl == "grouped":
            return grouped_decode_attention(q, k, v)  # the same grouping, as two matmuls (eager)
        if cfg.attn_impl == "plain":
            return plain_attention(q, k, v)
        # prefill starts at 0 and training has no cache, so the causal mask is the square one
        assert start_pos in (None, 0) or T == 1, "multi-token steps after prefill are not supported"
        return sdpa(q, k, v, is_causal=T > 1, dropout_p=cfg.dropout if self.training else 0.0)

    def forward(self, x, cos, sin, start_pos=None):
        """x: (B, T, D) -> (B, T, D). start_pos=None: training/no-cache; else write the KV cache at start_pos."""
        cfg, (B, T, _) = self.cfg, x.shape
        q, k, v = self.project(x)  # 1. (B, T, H_p, d), (B, T, H_kv, d), (B, T, H_kv, d)
        if cfg.has_premix:
            q = self.apply_premix(q)  # 2. (B, T, H_v, d): one virtual head per (physical head, KV group)
        if cfg.qk_norm:  # 3. after premix, so premix stays a plain linear map on q
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, heads, T, d)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)  # 4.
        a = self.attend(q, k, v, start_pos)  # 5. (B, H, T, d)
        merge = lambda a: a.transpose(1, 2).reshape(B, T, cfg.n_attn_head * cfg.head_dim)  # (B, H, T, d) -> (B, T, H*d)
        if cfg.has_postmix and cfg.vha_postmix_act == "linear" and start_pos is None and not self.record_postmix:
            # fast path for training: 6 and 7 in one matmul, W_o (M a) = (W_o M) a, M folded into W_o once per call
            # (D*H*H*d MACs) instead of mixing every token's heads
            return F.linear(merge(a), fold_postmix(self.o_proj.weight, self.postmix_matrix()))  # (B, T, D)
        if cfg.has_postmix:
            a = self.apply_postmix(a)  # 6. a' = (I + V U^T) a over the head axis (decoding, SiLU, health recording)
        return self.o_proj(merge(a))  # 7. (B, T, D)


class MLAttention(nn.Module):
    """Multi-head latent attention (DeepSeek-V2/V3). Each token caches only a latent c_kv (r = mla_kv_rank wide)
    and one RoPE key k_R (d_R = mla_rope_dim) shared by all heads; per-head keys and values come back from c_kv:

        c_kv = RMSNorm(x W_dkv),   k_R = RoPE(x W_kR)                   (W_dkv, W_kR fused into qkv_proj)
        [k_C,h ; v_h] = W_ukv,h c_kv                                     (kv_up: d + d rows per head h)
        q_h = [q_C,h ; RoPE(q_R,h)] = rows of x W_q, or of RMSNorm(x W_dq) W_uq with q_rank
        a_h = softmax_t((q_C,h . k_C,h,t + q_R,h . k_R,t) / sqrt(d + d_R)) . v_h,t,   y = W_o [a_1; ...; a_H]

    Two decode paths, as DeepSeek-V3's inference code keeps them (mla_decode):
      naive:  up-project every cached c_kv to per-head k_C, v, then plain attention over d + d_R wide keys.
      absorb: q_C,h . (W_uk,h c) = (W_uk,h^T q_C,h) . c and sum_t p_t W_uv,h c_t = W_uv,h (sum_t p_t c_t): the
              query moves into latent space, attention runs over the cached c_kv itself (r wide, one "KV head"
              shared by all heads), and W_uv,h is applied once to the result. No per-head K/V is ever built.
    Training and prefill use the naive form. There is no per-head QK-norm (cfg.qk_norm must be False): an
    RMSNorm of k_C = W_uk c is not linear in c, so absorb could not move W_uk into the query. The latent
    norms (of c_kv, and of the query latent with q_rank) take its place, as in DeepSeek-V2/V3."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        H, d, dR, r, D = cfg.n_head, cfg.head_dim, cfg.mla_rope_dim, cfg.mla_kv_rank, cfg.n_embd
        # one projection from x, rows [W_q (H*(d+d_R)) or W_dq (q_rank); W_dkv (r); W_kR (d_R)]
        self.qkv_split = cfg.qkv_split
        self.qkv_proj = nn.Linear(D, sum(self.qkv_split), bias=False)
        if cfg.q_rank:
            self.q_latent_norm = RMSNorm(cfg.q_rank, cfg.norm_eps)
            self.q_up = nn.Linear(cfg.q_rank, H * (d + dR), bias=False)
        self.kv_norm = RMSNorm(r, cfg.norm_eps)
        self.kv_up = nn.Linear(r, H * 2 * d, bias=False)  # rows per head h: [W_uk,h (d); W_uv,h (d)]
        self.o_proj = nn.Linear(H * d, D, bias=False)
        self.cache_dims = (1, r + dR, 0)  # KVCache: one latent "head", k <- [c_kv ; k_R], v unused
        self.kv_cache = None

    def forward(self, x, cos, sin, start_pos=None):
        cfg = self.cfg
        B, T, _ = x.shape
        H, d, dR = cfg.n_head, cfg.head_dim, cfg.mla_rope_dim
        q, c_kv, k_rope = self.qkv_proj(x).split(self.qkv_split, dim=-1)  # (B, T, q width | r | d_R)
        if cfg.q_rank:
            q = self.q_up(self.q_latent_norm(q))  # (B, T, H*(d+d_R))
        q = q.view(B, T, H, d + dR).transpose(1, 2)  # (B, H, T, d + d_R)
        q_nope, q_rope = q.split([d, dR], dim=-1)  # (B, H, T, d), (B, H, T, d_R)
        q_rope = apply_rope(q_rope, cos, sin)
        c_kv = self.kv_norm(c_kv)[:, None]  # (B, 1, T, r)
        k_rope = apply_rope(k_rope[:, None], cos, sin)  # (B, 1, T, d_R): one RoPE key for every head
        static = isinstance(start_pos, torch.Tensor)
        kv = torch.cat([c_kv, k_rope], dim=-1)  # (B, 1, T, r + d_R): what a token caches
        if start_pos is not None:
            kv, _ = self.kv_cache.update(start_pos, kv, kv[..., :0])  # (B, 1, Tk, r + d_R)
        visible = torch.arange(kv.size(2), device=x.device) <= start_pos if static else None  # (max_len,): written
        if T == 1 and start_pos is not None and cfg.mla_decode == "absorb":
            a = self.absorbed_attention(q_nope, q_rope, kv, visible)
        else:
            c_kv, k_rope = kv.split([cfg.mla_kv_rank, dR], dim=-1)  # (B, 1, Tk, r), (B, 1, Tk, d_R)
            a = self.naive_attention(q_nope, q_rope, c_kv, k_rope, visible, causal=T > 1)
        return self.o_proj(a.transpose(1, 2).reshape(B, T, H * d))  # (B, H, T, d) -> (B, T, H*d) -> (B, T, D)

    def naive_attention(self, q_nope, q_rope, c_kv, k_rope, visible, causal):
        """Up-projects the latents to per-head keys and values, then ordinary attention. -> (B, H, T, d)"""
        B, H, T, d = q_nope.shape
        Tk = c_kv.size(2)
        kv = self.kv_up(c_kv[:, 0]).view(B, Tk, H, 2 * d).transpose(1, 2)  # (B, H, Tk, 2d)
        k_nope, v = kv.split([d, d], dim=-1)  # (B, H, Tk, d) each
        q = torch.cat([q_nope, q_rope], dim=-1)  # (B, H, T, d + d_R)
        k = torch.cat([k_nope, k_rope.expand(B, H, Tk, k_rope.size(-1))], dim=-1)  # (B, H, Tk, d + d_R)
        if self.cfg.attn_impl == "plain" and visible is None:
            return plain_attention(q, k, v)
        mask = None if visible is None else visible[None, :]  # (1, Tk): broadcast over batch, heads, queries
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal and visible is None,
                                              dropout_p=self.cfg.dropout if self.training else 0.0)

    def absorbed_attention(self, q_nope, q_rope, kv, visible):
        """One decoded token, attention over the cached [c_kv ; k_R] rows kv (B, 1, Tk, r + d_R). -> (B, H, 1, d)"""
        H, d, r = self.cfg.n_head, self.cfg.head_dim, self.cfg.mla_kv_rank
        W_uk, W_uv = self.kv_up.weight.view(H, 2 * d, r).split([d, d], dim=1)  # (H, d, r) each
        q_latent = q_nope @ W_uk  # (B, H, 1, d) @ (H, d, r) -> (B, H, 1, r): W_uk,h^T q_C,h
        q = torch.cat([q_latent, q_rope], dim=-1).transpose(1, 2)  # (B, 1, H, r + d_R): H query rows, one KV head
        # q . [c_t ; k_R,t] = q_latent . c_t + q_R . k_R,t; the cached row is the value too, of which the first r
        # columns are kept: sum_t p_t c_t. One SDPA reads the cache once for every head (a (B, H, 1, r) query
        # would broadcast the cache to every head, copying it H times)
        if visible is None:
            visible = torch.ones(kv.size(2), dtype=torch.bool, device=kv.device)  # (Tk,): exactly the past
        a = split_kv_attention(q, kv, kv, visible, scale=1 / math.sqrt(d + q_rope.size(-1)))  # (B, 1, H, r + d_R)
        a_latent = a[..., :r].transpose(1, 2)  # (B, H, 1, r): sum_t p_t c_t
        return a_latent @ W_uv.transpose(-2, -1)  # (B, H, 1, d): W_uv,h (sum_t p_t c_t)


class MLP(nn.Module):
    """SwiGLU: down(silu(x W_gate^T) * (x W_up^T)), with gate and up in one projection (rows [W_gate; W_up])."""

    def __init__(self, cfg):
        super().__init__()
        self.gate_up_proj = nn.Linear(cfg.n_embd, 2 * cfg.mlp_hidden, bias=False)
        self.down_proj = nn.Linear(cfg.mlp_hidden, cfg.n_embd, bias=False)

    def forward(self, x):
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)  # (B, T, hidden) each
        return self.down_proj(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.n_embd, cfg.norm_eps)
        self.attn = MLAttention(cfg) if cfg.attn == "mla" else Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.n_embd, cfg.norm_eps)
        self.mlp = MLP(cfg)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x, cos, sin, start_pos=None):
        x = x + self.drop(self.attn(self.attn_norm(x), cos, sin, start_pos))
        return x + self.drop(self.mlp(self.mlp_norm(x)))


@dataclass
class GPTConfig:
    vocab_size: int = 50304
    block_size: int = 1024  # training context; generation may go further with a larger cache
    n_layer: int = 12
    n_embd: int = 768
    n_head: int = 12  # query heads that attend (VHA: the virtual heads H_v)
    n_kv_head: int = 4
    head_dim: Optional[int] = None  # default n_embd // n_head
    mlp_hidden: Optional[int] = None  # default 3 * n_embd (Qwen3-1.7B: 6144 / 2048)
    rope_theta: float = 1e6
    qk_norm: bool = True
    tie_embeddings: bool = True
    dropout: float = 0.0
    norm_eps: float = 1e-6
    attn: str = "gqa"  # "gqa" (MHA: n_kv_head == n_head, MQA: n_kv_head == 1), "vha", "mla" or "mfa"
    vha_premix: bool = True
    vha_postmix: bool = True
    vha_postmix_rank: Optional[int] = None  # default max(1, n_head // 4)
    vha_postmix_act: str = "linear"  # or "silu" (the paper's nonlinear ablation; cannot fold)
    q_rank: Optional[int] = None  # MLA/MFA: low-rank query q = RMSNorm(x W_dq) W_uq (None: full W_q); MFA needs it
    mla_kv_rank: Optional[int] = None  # MLA: width r of the cached latent c_kv (default 4 * head_dim, DeepSeek 512/128)
    mla_rope_dim: Optional[int] = None  # MLA: width d_R of the shared RoPE key (default head_dim // 2, DeepSeek 64/128)
    mla_decode: str = "absorb"  # MLA one-token decode: "absorb" (attend over the latent) or "naive" (up-project)
    attn_impl: str = "sdpa"  # "sdpa" or "plain" (the readable reference)
    decode_impl: str = "grouped"  # one-token decode: "grouped" matmul per KV head, or "sdpa"

    def __post_init__(self):
        complete_and_check(self)  # derives the None defaults, refuses bad combinations (at the end of this file)

    # derived: which VHA pieces are on, physical q projections H_p, the query heads that attend, the padded vocab
    has_premix = property(lambda self: self.attn == "vha" and self.vha_premix)
    has_postmix = property(lambda self: self.attn == "vha" and self.vha_postmix)
    n_q_proj = property(lambda self: self.n_head // self.n_kv_head if self.attn == "vha" else self.n_head)  # H_p (VHA)
    # H_v, the heads that attend: n_head, except postmix-only VHA, which attends with its H_p physical heads
    n_attn_head = property(lambda self: self.n_q_proj if (self.attn == "vha" and not self.vha_premix) else self.n_head)
    padded_vocab = property(lambda self: 64 * -(-self.vocab_size // 64))  # embed/lm_head rows: 50257 -> 50304
    rope_dim = property(lambda self: self.mla_rope_dim if self.attn == "mla" else self.head_dim)  # width RoPE rotates
    # numbers cached per token: per layer MLA's latent and RoPE key, or a key and a value per KV head
    kv_values_per_token = property(lambda self: self.n_layer * (
        self.mla_kv_rank + self.mla_rope_dim if self.attn == "mla" else 2 * self.n_kv_head * self.head_dim))

    @property
    def qkv_split(self):
        """Rows of the fused projection from x: [W_q or its low-rank W_qa; W_k; W_v], for MLA [W_q or W_dq; W_dkv;
        W_kR]."""
        d = self.head_dim
        if self.attn == "mla":
            return [self.q_rank or self.n_head * (d + self.mla_rope_dim), self.mla_kv_rank, self.mla_rope_dim]
        return [self.q_rank or self.n_q_proj * d, self.n_kv_head * d, self.n_kv_head * d]

    # ---- cost accounting: from the shapes alone ----
    def flops_per_token(self, T, training=False):
        """Convention: forward = 2 x MACs of every matmul (lm_head, premix, postmix included)
        + causal attention 2 * H_v * head_dim * T per layer (QK^T and AV over T/2 keys on
        average; MLA: QK^T over d + d_R, AV over d); training = 3 x forward. MLA counts its training form
        (keys and values up-projected, the naive path); its absorbed decode does other work per token.
        The LM head counts padded_vocab rows, what the matmul runs (num_params counts the padded rows too)."""
        D, d, H = self.n_embd, self.head_dim, self.n_attn_head
        q_width = H * (d + self.mla_rope_dim) if self.attn == "mla" else self.n_q_proj * d  # query numbers per token
        macs = D * sum(self.qkv_split) + H * d * D + 3 * D * self.mlp_hidden  # fused projection, W_o, MLP
        if self.q_rank:
            macs += self.q_rank * q_width  # q_up of the low-rank query (MLA, MFA)
        if self.attn == "mla":
            macs += self.mla_kv_rank * H * 2 * d  # kv_up: per-head keys and values from the latent
        if self.has_premix:
            macs += H * d * d  # every virtual head: one d x d map
        if self.has_postmix:
            macs += 2 * H * self.vha_postmix_rank * d  # U^T then V
        if self.attn == "mla":
            attention = H * (2 * d + self.mla_rope_dim) * T  # FLOPs per layer
        else:
            attention = 2 * H * d * T
        fwd = self.n_layer * (2 * macs + attention) + 2 * D * self.padded_vocab
        return 3 * fwd if training else fwd

    def kv_bytes_per_token(self, dtype=torch.bfloat16):
        """Bytes the cache holds per token: layers x (2 x H_kv x head_dim, or MLA's r + d_R) x element size."""
        return self.kv_values_per_token * torch.empty((), dtype=dtype).element_size()


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        seed = int(torch.randint(2**62, (1,), device="cpu"))  # first: after manual_seed(s), every variant draws this
        self.embed = nn.Embedding(cfg.padded_vocab, cfg.n_embd)  # a multiple of 64 rows: the LM head's N is aligned
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.norm = RMSNorm(cfg.n_embd, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.padded_vocab, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        self.init_weights(seed)
        for w in (self.embed.weight, self.lm_head.weight):  # padded rows: 0, and they stay 0: never looked up, their
            torch.nn.init.zeros_(w[cfg.vocab_size:])  # logits sliced off (no gradient), weight decay keeps them at 0

    @torch.no_grad()
    def init_weights(self, seed):
        """GPT-2 init, N(0, 0.02) (o_proj, down_proj: 0.02 / sqrt(2 n_layer)); premix/postmix/norms keep their own. Each
        parameter, and each head's rows of qkv_proj and columns of o_proj, draws from a generator seeded by (seed, its
        name): variants built from one seed share every block whose name and shape agree (embeddings, MLPs, the KV heads
        they have in common, W_o of the same heads), so a paired comparison does not also compare initialisations."""
        d = self.cfg.head_dim
        for name, p in self.named_parameters():
            if p.dim() != 2 or "postmix" in name or p.is_meta:
                continue
            residual = name.endswith(("o_proj.weight", "down_proj.weight"))
            std = 0.02 / math.sqrt(2 * self.cfg.n_layer) if residual else 0.02
            parts = {"": p}  # block label -> the rows (or columns) it initialises
            if name.endswith("attn.qkv_proj.weight"):  # rows [W_q; W_k; W_v]: head h of each is block q.h, k.h, v.h
                parts = {f"{'qkv'[j]}.{h}": rows for j, part in enumerate(p.split(self.cfg.qkv_split))
                         for h, rows in enumerate(part.split(d) if part.size(0) % d == 0 else [part])}
            elif name.endswith("attn.o_proj.weight"):  # columns: head h is block "o.h"
                parts = {f"o.{h}": cols for h, cols in enumerate(p.split(d, dim=1))}
            for label, part in parts.items():
                gen = torch.Generator().manual_seed((seed + zlib.crc32(f"{name}/{label}".encode())) % 2**63)
                part.copy_(torch.randn(part.shape, generator=gen) * std)

    def num_params(self, non_embedding=False):
        n = sum(p.numel() for p in self.parameters())  # tied weights are counted once
        embeddings = {id(self.embed.weight): self.embed.weight, id(self.lm_head.weight): self.lm_head.weight}
        return n - sum(w.numel() for w in embeddings.values()) if non_embedding else n

    def forward(self, idx, targets=None, start_pos=None):
        """idx (B, T) -> (logits, mean cross-entropy or None). start_pos=None: a whole sequence from position 0
        (training, eval), logits (B, T, vocab_size). start_pos=int: positions start_pos.. through the KV cache
        (setup_cache first); a (1,) long tensor decodes one token with static shapes (torch.compile, CUDA graphs,
        AOTInductor). With a cache only the last position's logits come out: (B, 1, vocab_size)."""
        B, T = idx.shape
        cache = self.blocks[0].attn.kv_cache
        if start_pos is None and T > self.cfg.block_size:
            raise ValueError(f"sequence length {T} > block_size {self.cfg.block_size}")
        if start_pos is not None and cache is None:
            raise RuntimeError("no KV cache: call setup_cache(batch_size, max_len) first")
        if isinstance(start_pos, int) and start_pos + T > cache.k.size(2):
            raise ValueError(f"positions up to {start_pos + T} do not fit the cache ({cache.k.size(2)}); "
                             f"call setup_cache with a larger max_len")
        cos, sin = self.rope_at(0 if start_pos is None else start_pos, T, idx.device)  # (T, rope_dim) each
        x = self.drop(self.embed(idx))  # (B, T, D)
        for block in self.blocks:
            x = block(x, cos, sin, start_pos)
        x = self.norm(x if start_pos is None else x[:, -1:])  # (B, T or 1, D)
        # the matmul runs at the padded N; keeping the real columns is exact and free (a view; a -inf mask would cost
        # a write), and no caller ever sees a padded id
        logits = self.lm_head(x)[..., :self.cfg.vocab_size]  # (B, T, padded_vocab) -> (B, T, vocab_size)
        loss = None
        if targets is not None:
            logits_f = logits.to(torch.promote_types(logits.dtype, torch.float32))  # bf16 logits: loss in fp32
            loss = F.cross_entropy(logits_f.reshape(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss

    def rope_at(self, start_pos, T, device):
        """cos, sin (T, rope_dim) of positions start_pos..start_pos+T-1: start_pos an int, or a (1,) long tensor in a
        static-shape decode step. The angles are computed in float64 at every call (rope_cos_sin): no table to size."""
        positions = torch.arange(T, device=device) + start_pos  # (T,)
        return rope_cos_sin(positions, self.cfg.rope_dim, self.cfg.rope_theta, self.embed.weight.dtype)

    # ---- generation with a preallocated KV cache (gpt-fast style)
    def setup_cache(self, batch_size, max_len, dtype=None, device=None):
        """One KVCache per layer for positions 0..max_len-1 (in the weights' dtype unless given), rounded up to whole
        blocks of CACHE_BLOCK positions, which split_kv_attention can cut into equal chunks."""
        dtype, device = dtype or self.embed.weight.dtype, device or self.embed.weight.device
        max_len = -(-max_len // CACHE_BLOCK) * CACHE_BLOCK  # ceil to a whole number of blocks
        for block in self.blocks:
            heads, k_dim, v_dim = block.attn.cache_dims
            block.attn.kv_cache = KVCache(batch_size, heads, max_len, k_dim, v_dim, dtype, device)

    @torch.no_grad()
    def prefill(self, idx):
        """Runs the prompt (B, T) from position 0, filling the cache; returns last-position logits (B, vocab)."""
        return self(idx, start_pos=0)[0][:, -1]

    @torch.no_grad()
    def decode_one_token(self, token, pos):
        """token (B, 1) at position pos (int, or (1,) long tensor); the cache holds positions < pos. -> (B, vocab)"""
        return self(token, start_pos=pos)[0][:, -1]

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, generator=None, decode=None):
        """Continues idx (B, T); temperature=0 is greedy. Builds a cache of exactly the needed size. decode: a stand-in
        for decode_one_token (a compiled one: nanovha/compiled_decode.py), given the position as a (1,) tensor."""
        B, T = idx.shape
        self.setup_cache(B, T + max_new_tokens)
        out = torch.cat([idx, idx.new_empty(B, max_new_tokens)], dim=1)  # (B, T + max_new_tokens)
        logits = self.prefill(idx)
        for pos in range(T, T + max_new_tokens):
            out[:, pos] = sample_next(logits, temperature, top_k, generator)
            if pos + 1 < T + max_new_tokens and decode is None:
                logits = self.decode_one_token(out[:, pos:pos + 1], pos)
            elif pos + 1 < T + max_new_tokens:
                logits = decode(out[:, pos:pos + 1], torch.tensor([pos], device=idx.device))
        return out

    @torch.no_grad()
    def use_decode_layout(self):
        """Stores every Linear weight W (out, in) as a transposed-contiguous view: the same values, shape and
        state_dict, in (in, out) order. At batch 1 each weight is read once per token, by x @ W^T, which streams W
        faster in this order on CPU (bench_decode.py --weight_layout=out_in times the other). Returns self."""
        for m in self.modules():
            if isinstance(m, nn.Linear):
                m.weight.data = m.weight.data.t().contiguous().t()
        return self

def sample_next(logits, temperature=1.0, top_k=None, generator=None):
    """logits (B, vocab) -> next token ids (B,). temperature 0 picks the argmax."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float() / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(logits.softmax(dim=-1), 1, generator=generator).squeeze(-1)


# ---- the fold: a trained VHA model IS a GQA model ----
def fold_premix(W_q, P):
    """W_q (H_p*d, D), P (H_kv, d, d) -> the (H_v*d, D) query weight of the virtual heads:
    q_j = (x W_q[h]^T) P[g] = x (P[g]^T W_q[h])^T, so row block j = g*H_p + h is P[g]^T W_q[h]."""
    H_kv, d, _ = P.shape
    W = W_q.view(-1, d, W_q.size(1))  # (H_p, d, D)
    return torch.einsum("gce,hcD->gheD", P, W).reshape(-1, W_q.size(1))  # (H_kv, H_p, d, D) -> (H_v*d, D)


def fold_postmix(W_o, M):
    """W_o (D, H*d), M (H, H) = I + V U^T -> W_o' with W_o' a = W_o (M a) over the head axis:
    y = sum_j W_o[:, j] a'_j with a'_j = sum_h M[j, h] a_h, so W_o'[:, h] = sum_j M[j, h] W_o[:, j]."""
    H = M.size(0)
    W = W_o.view(W_o.size(0), H, -1)  # (D, H, d)
    return torch.einsum("Djc,jh->Dhc", W, M).reshape(W_o.shape)  # (D, H, d) -> (D, H*d)


@torch.no_grad()
def fold_to_gqa(model):
    """The plain GQA model with the same outputs as a VHA model: a new GPT, n_head = H_v query heads over the same
    H_kv KV heads, in the model's dtype and on its device.
    Premix:  W_q'[j] = P[g]^T W_q[h] for j = g*H_p + h (fold_premix)
    Postmix: W_o'[:, h] = sum_j M[j, h] W_o[:, j] with M = I + V U^T (fold_postmix)
    QK-norm and RoPE act per head after premix, so they carry over unchanged; K, V are untouched.
    Computed in float64, cast back to each weight's dtype."""
    c = model.cfg
    if c.attn != "vha":
        raise ValueError(f"nothing to fold: attn={c.attn!r} has no premix or postmix (only attn='vha' folds); "
                         f"use the checkpoint as it is")
    if c.has_postmix and c.vha_postmix_act != "linear":
        raise ValueError("cannot fold a SiLU postmix: silu(U^T a) is not linear in a, so no single "
                         "matrix M can be absorbed into W_o; only vha_postmix_act='linear' folds")
    state = {k: v for k, v in model.state_dict().items() if "premix" not in k and "postmix" not in k}
    for i, block in enumerate(model.blocks):
        a = block.attn
        if c.has_premix:  # the fold acts on the q rows of the fused projection; k and v rows stay
            W = a.qkv_proj.weight
            W_q, W_k, W_v = W.double().split(a.qkv_split)
            W_q = fold_premix(W_q, a.premix.double())
            state[f"blocks.{i}.attn.qkv_proj.weight"] = torch.cat([W_q, W_k, W_v]).to(W.dtype)
        if c.has_postmix:
            W_o = fold_postmix(a.o_proj.weight.double(), a.postmix_matrix().double())
            state[f"blocks.{i}.attn.o_proj.weight"] = W_o.to(a.o_proj.weight.dtype)
    cfg = GPTConfig(**dict(asdict(c), attn="gqa", n_head=c.n_attn_head, head_dim=c.head_dim, vha_postmix_rank=None))
    with torch.random.fork_rng(devices=[]), torch.device("meta"):  # no init: every weight is overwritten
        gqa = GPT(cfg)
    gqa.load_state_dict(state, assign=True)  # strict: the folded state holds every weight of a GQA model
    if cfg.tie_embeddings:  # assign gives each name its own Parameter: tie them again
        gqa.lm_head.weight = gqa.embed.weight
    return gqa.train(model.training)


# ---- GPTConfig's checks, out of the way of its fields ----
def complete_and_check(cfg):
    """Fills the derived defaults of a GPTConfig (head_dim, mlp_hidden, MLA ranks, postmix rank) and raises
    ValueError naming the fix for any combination the model cannot build."""
    def need(ok, msg):
        if not ok:
            raise ValueError(f"GPTConfig: {msg}")

    for name in ("vocab_size", "block_size", "n_layer", "n_embd", "n_head", "n_kv_head"):
        need(type(getattr(cfg, name)) is int, f"{name} must be an int, got {getattr(cfg, name)!r}")
        need(getattr(cfg, name) >= 1, f"{name} must be >= 1, got {getattr(cfg, name)}")
    for name, allowed in (("attn", ("gqa", "vha", "mla", "mfa")), ("attn_impl", ("sdpa", "plain")),
                          ("mla_decode", ("absorb", "naive")),
                          ("decode_impl", ("grouped", "sdpa")), ("vha_postmix_act", ("linear", "silu"))):
        need(getattr(cfg, name) in allowed, f"{name} must be one of {allowed}, got {getattr(cfg, name)!r}")
    need(cfg.n_head % cfg.n_kv_head == 0,
         f"n_head % n_kv_head != 0 ({cfg.n_head} % {cfg.n_kv_head}): "
         f"each KV head must serve the same number of query heads")
    if cfg.head_dim is None:
        need(cfg.n_embd % cfg.n_head == 0,
             f"n_embd % n_head != 0 ({cfg.n_embd} % {cfg.n_head}); set head_dim explicitly")
        cfg.head_dim = cfg.n_embd // cfg.n_head
    need(cfg.head_dim >= 2 and cfg.head_dim % 2 == 0, f"head_dim must be even for RoPE, got {cfg.head_dim}")
    if cfg.mlp_hidden is None:
        cfg.mlp_hidden = 3 * cfg.n_embd
    need(cfg.mlp_hidden >= 1, f"mlp_hidden must be >= 1 (or None: 3 * n_embd), got {cfg.mlp_hidden}")
    need(0.0 <= cfg.dropout < 1.0, f"dropout must be in [0, 1), got {cfg.dropout}")
    if cfg.attn == "vha":
        need(cfg.vha_premix or cfg.vha_postmix, "attn='vha' needs vha_premix or vha_postmix (or use attn='gqa')")
        if not cfg.vha_premix:  # postmix only: attend with the H_p physical heads, grouped over H_kv
            need(cfg.n_q_proj % cfg.n_kv_head == 0,
                 f"postmix-only VHA attends with H_p = n_head // n_kv_head = {cfg.n_q_proj} heads, "
                 f"which must be a multiple of n_kv_head={cfg.n_kv_head}")
    need(cfg.q_rank is None or (cfg.attn in ("mla", "mfa") and cfg.q_rank >= 1),
         f"q_rank={cfg.q_rank} is the low-rank query of attn='mla' or 'mfa' (>= 1); "
         f"attn={cfg.attn!r} has a full W_q: drop q_rank")
    need(cfg.attn != "mfa" or cfg.q_rank is not None, "attn='mfa' factorizes the query: set q_rank (e.g. n_embd // 2)")
    if cfg.attn == "mla":
        need(cfg.n_kv_head == cfg.n_head,
             f"attn='mla' up-projects a key and a value for every query head from the latent: "
             f"set n_kv_head = n_head ({cfg.n_head}), got {cfg.n_kv_head}; "
             f"the cache size is set by mla_kv_rank + mla_rope_dim")
        need(not cfg.qk_norm, "attn='mla' needs qk_norm=False: an RMSNorm of k = W_uk c_kv is not linear in c_kv, "
             "so the absorbed decode could not move W_uk into the query; MLA normalises its latents instead "
             "(DeepSeek-V2/V3)")
        cfg.mla_kv_rank = cfg.mla_kv_rank or 4 * cfg.head_dim
        cfg.mla_rope_dim = cfg.mla_rope_dim or max(2, cfg.head_dim // 2)
        need(cfg.mla_kv_rank >= 1, f"mla_kv_rank must be >= 1, got {cfg.mla_kv_rank}")
        need(cfg.mla_rope_dim >= 2 and cfg.mla_rope_dim % 2 == 0,
             f"mla_rope_dim must be even and >= 2 (RoPE pairs), got {cfg.mla_rope_dim}")
    else:
        need(cfg.mla_kv_rank is None and cfg.mla_rope_dim is None,
             f"mla_kv_rank / mla_rope_dim are attn='mla' knobs; attn={cfg.attn!r}: drop them")
    if cfg.vha_postmix_rank is None:
        cfg.vha_postmix_rank = max(1, cfg.n_head // 4)
    if cfg.has_postmix:
        need(1 <= cfg.vha_postmix_rank <= cfg.n_attn_head,
             f"vha_postmix_rank must be in [1, {cfg.n_attn_head}] (the heads it mixes), got {cfg.vha_postmix_rank}")
