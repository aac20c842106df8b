"""
nanoVHA model: a Qwen3-style decoder with GQA and Virtual Head Attention (VHA), in one file.

Reads top to bottom: RMSNorm, RoPE, attention (GQA + VHA premix/postmix, KV cache), MLP, block,
config, model (forward, prefill/decode, generate, cost accounting, VHA health, fold), checkpoints.

VHA in one picture (H_v=8 virtual query heads, H_kv=2 KV heads, H_p=H_v/H_kv=4 physical q projections):

    physical q heads     q0   q1   q2   q3            (W_q has only H_p*d rows)
                          |    |    |    |
    premix, group g=0:  q0P0 q1P0 q2P0 q3P0  -> virtual heads j=0..3 --> attend KV head 0
    premix, group g=1:  q0P1 q1P1 q2P1 q3P1  -> virtual heads j=4..7 --> attend KV head 1

    virtual head j = g*H_p + h  reads KV head j // H_p   (the usual GQA grouping)

After attention, postmix mixes the H_v head outputs with M = I + V U^T (low rank r), then W_o.
Both maps are linear, so after training they fold into W_q and W_o (see GPT.fold_to_gqa):
the deployed model is a plain GQA model with n_head=H_v, n_kv_head=H_kv.
"""
import math
import os
import tempfile
from dataclasses import asdict, dataclass, fields
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
    """Preallocated cache for one layer: (B, n_kv_head, max_len, head_dim) for keys and values."""

    def __init__(self, batch_size, n_kv_head, max_len, head_dim, dtype, device):
        super().__init__()
        shape = (batch_size, n_kv_head, max_len, head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("positions", torch.arange(max_len, device=device), persistent=False)  # for static masks

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


def grouped_decode_attention(q, k, v, visible=None):
    """One-token decode (Tq=1) with one matmul per KV head: reads each cached K/V once, however
    many query heads share it (CPU SDPA does per-query-head work at Tq=1). q: (B, H_q, 1, hd).
    visible: None (k, v hold exactly the past) or a (Tk,) bool mask of the positions to attend."""
    B, H_q, _, hd = q.shape
    H_kv = k.size(1)
    qg = q.view(B, H_kv, H_q // H_kv, hd) * hd ** -0.5  # (B, H_kv, group, hd): heads j = g*group + i; scaled
    scores = qg @ k.transpose(-2, -1)  # (B, H_kv, group, Tk): scaling q is cheaper than scaling Tk scores
    if visible is not None:
        scores = scores.masked_fill(~visible, float("-inf"))
    out = scores.softmax(dim=-1) @ v  # (B, H_kv, group, hd)
    return out.view(B, H_q, 1, hd)


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


class Attention(nn.Module):
    """GQA attention; with attn="vha" it adds Q premix and postmix, in this order:
    projections -> premix -> QK-norm -> RoPE -> causal attention -> postmix -> W_o."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        d, D = cfg.head_dim, cfg.n_embd
        # q, k and v in one projection (nanoGPT's c_attn, gpt-fast's wqkv): one matrix-vector product per decoded
        # token instead of three. Rows: [W_q (H_p*d, the physical query heads); W_k (H_kv*d); W_v (H_kv*d)]
        self.qkv_split = [cfg.n_q_proj * d, cfg.n_kv_head * d, cfg.n_kv_head * d]
        self.qkv_proj = nn.Linear(D, sum(self.qkv_split), bias=False)
        self.o_proj = nn.Linear(cfg.n_attn_head * d, D, bias=False)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(d, cfg.norm_eps)  # one weight shared by all heads (Qwen3)
            self.k_norm = RMSNorm(d, cfg.norm_eps)
        if cfg.has_premix:
            # Q premix: q_j = q_h @ P[g] for virtual head j = g*H_p + h.  P: (H_kv, d, d), near identity.
            self.premix = nn.Parameter(torch.eye(d).repeat(cfg.n_kv_head, 1, 1) + 0.1 / math.sqrt(d) * torch.randn(cfg.n_kv_head, d, d))
        if cfg.has_postmix:
            # Postmix over heads: a'_j = a_j + sum_r V[j, r] act(sum_h U[h, r] a_h), i.e. a' = (I + V U^T) a.
            self.postmix_U = nn.Parameter(0.01 * torch.randn(cfg.n_attn_head, cfg.vha_postmix_rank))
            self.postmix_V = nn.Parameter(torch.zeros(cfg.n_attn_head, cfg.vha_postmix_rank))  # V=0: exact identity at init
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
            z = F.silu(z)  # the paper's nonlinear ablation: no longer foldable
        delta = (self.postmix_V @ z).view(B, H, T, d)  # (B, H, T, d)
        if self.record_postmix:
            self.postmix_ratio = (delta.float().norm(dim=(1, 3)) / a.float().norm(dim=(1, 3)).clamp_min(1e-12)).mean().item()
        return a + delta

    def postmix_matrix(self):
        """M = I + V U^T, (H, H): the linear postmix as one operator on the head axis."""
        V, U = self.postmix_V, self.postmix_U
        return torch.eye(V.size(0), dtype=V.dtype, device=V.device) + V @ U.t()

    @torch.no_grad()
    def health(self):
        """This layer's VHA health in float64 (definitions in GPT.vha_health): premix_dev per group (H_kv,),
        premix_group_div, postmix_M, postmix_sigma_max, postmix_offdiag_share."""
        c, out = self.cfg, {}
        if c.has_premix:
            E = (self.premix.double() - torch.eye(c.head_dim, dtype=torch.float64, device=self.premix.device)).flatten(1)  # (H_kv, d*d)
            out["premix_dev"] = E.norm(dim=1)  # ||P_g - I||_F
            if c.n_kv_head > 1:
                pair = (E[:, None] - E[None]).pow(2).sum(-1)  # (H_kv, H_kv): ||P_g - P_g'||^2
                out["premix_group_div"] = pair.sum() / (c.n_kv_head * (c.n_kv_head - 1)) / E.pow(2).sum(1).mean().clamp_min(1e-30)
        if c.has_postmix:
            M = self.postmix_matrix().double()
            eye = torch.eye(M.size(0), dtype=M.dtype, device=M.device)
            out["postmix_M"] = M
            out["postmix_sigma_max"] = torch.linalg.matrix_norm(M - eye, ord=2)  # of V U^T
            out["postmix_offdiag_share"] = (M * (1 - eye)).pow(2).sum() / M.pow(2).sum()
        return out

    def forward(self, x, cos, sin, start_pos=None):
        """x: (B, T, D). start_pos=None: training/no-cache; else write the KV cache at start_pos."""
        cfg = self.cfg
        B, T, _ = x.shape
        d = cfg.head_dim
        q, k, v = self.qkv_proj(x).split(self.qkv_split, dim=-1)  # x [W_q; W_k; W_v]^T, split by columns
        q = q.view(B, T, cfg.n_q_proj, d)  # (B, T, H_p, d)
        k = k.view(B, T, cfg.n_kv_head, d)  # (B, T, H_kv, d)
        v = v.view(B, T, cfg.n_kv_head, d)
        if cfg.has_premix:
            q = self.apply_premix(q)  # (B, T, H_v, d)
        if cfg.qk_norm:  # after premix, so premix stays a plain linear map on q
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, heads, T, d)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        static = isinstance(start_pos, torch.Tensor)  # static-shape decode (torch.compile, CUDA graphs)
        if start_pos is not None:
            k, v = self.kv_cache.update(start_pos, k, v)  # (B, H_kv, start_pos+T, d); static: the whole cache
        if T == 1 and start_pos is not None and (cfg.decode_impl == "grouped" or static):
            visible = self.kv_cache.positions <= start_pos if static else None  # (max_len,): written positions
            a = grouped_decode_attention(q, k, v, visible)
        elif cfg.attn_impl == "plain":
            a = plain_attention(q, k, v)
        else:  # prefill starts at 0 and training has no cache, so the causal mask is the square one
            assert start_pos in (None, 0) or T == 1, "multi-token steps after prefill are not supported"
            a = F.scaled_dot_product_attention(q, k, v, is_causal=T > 1, enable_gqa=True,
                                               dropout_p=cfg.dropout if self.training else 0.0)
        # training: fold M into W_o once per call (D*H*H*d MACs), W_o (M a) = (W_o M) a, instead of mixing
        # every token's heads; decoding one token, the SiLU ablation and health recording mix explicitly
        fold_into_o = cfg.has_postmix and cfg.vha_postmix_act == "linear" and start_pos is None and not self.record_postmix
        if cfg.has_postmix and not fold_into_o:
            a = self.apply_postmix(a)  # (B, H, T, d)
        a = a.transpose(1, 2).reshape(B, T, cfg.n_attn_head * d)  # (B, H, T, d) -> (B, T, H*d)
        if fold_into_o:
            return F.linear(a, fold_postmix(self.o_proj.weight, self.postmix_matrix()))  # (B, T, D)
        return self.o_proj(a)  # (B, T, D)


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
        self.attn = Attention(cfg)
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
    attn: str = "gqa"  # "gqa" (MHA: n_kv_head == n_head, MQA: n_kv_head == 1) or "vha"
    vha_premix: bool = True
    vha_postmix: bool = True
    vha_postmix_rank: Optional[int] = None  # default max(1, n_head // 4)
    vha_postmix_act: str = "linear"  # or "silu" (the paper's nonlinear ablation; cannot fold)
    attn_impl: str = "sdpa"  # "sdpa" or "plain" (the readable reference)
    decode_impl: str = "grouped"  # one-token decode: "grouped" matmul per KV head, or "sdpa"

    def __post_init__(self):
        def need(ok, msg):
            if not ok:
                raise ValueError(f"GPTConfig: {msg}")

        for name in ("vocab_size", "block_size", "n_layer", "n_embd", "n_head", "n_kv_head"):
            need(getattr(self, name) >= 1, f"{name} must be >= 1, got {getattr(self, name)}")
        for name, allowed in (("attn", ("gqa", "vha")), ("attn_impl", ("sdpa", "plain")),
                              ("decode_impl", ("grouped", "sdpa")), ("vha_postmix_act", ("linear", "silu"))):
            need(getattr(self, name) in allowed, f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        need(self.n_head % self.n_kv_head == 0,
             f"n_head % n_kv_head != 0 ({self.n_head} % {self.n_kv_head}): each KV head must serve the same number of query heads")
        if self.head_dim is None:
            need(self.n_embd % self.n_head == 0, f"n_embd % n_head != 0 ({self.n_embd} % {self.n_head}); set head_dim explicitly")
            self.head_dim = self.n_embd // self.n_head
        need(self.head_dim >= 2 and self.head_dim % 2 == 0, f"head_dim must be even for RoPE, got {self.head_dim}")
        if self.mlp_hidden is None:
            self.mlp_hidden = 3 * self.n_embd
        need(0.0 <= self.dropout < 1.0, f"dropout must be in [0, 1), got {self.dropout}")
        if self.attn == "vha":
            need(self.vha_premix or self.vha_postmix, "attn='vha' needs vha_premix or vha_postmix (or use attn='gqa')")
            if not self.vha_premix:  # postmix only: attend with the H_p physical heads, grouped over H_kv
                need(self.n_q_proj % self.n_kv_head == 0,
                     f"postmix-only VHA attends with H_p = n_head // n_kv_head = {self.n_q_proj} heads, "
                     f"which must be a multiple of n_kv_head={self.n_kv_head}")
        if self.vha_postmix_rank is None:
            self.vha_postmix_rank = max(1, self.n_head // 4)
        if self.has_postmix:
            need(1 <= self.vha_postmix_rank <= self.n_attn_head,
                 f"vha_postmix_rank must be in [1, {self.n_attn_head}] (the heads it mixes), got {self.vha_postmix_rank}")

    # derived: which VHA pieces are on, physical q projections H_p, and the query heads that attend
    has_premix = property(lambda self: self.attn == "vha" and self.vha_premix)
    has_postmix = property(lambda self: self.attn == "vha" and self.vha_postmix)
    n_q_proj = property(lambda self: self.n_head // self.n_kv_head if self.attn == "vha" else self.n_head)  # H_p (VHA)
    n_attn_head = property(lambda self: self.n_head if (self.attn == "gqa" or self.vha_premix) else self.n_q_proj)  # H_v


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.norm = RMSNorm(cfg.n_embd, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        for name, p in self.named_parameters():  # GPT-2 init; premix/postmix/norms keep their own
            if p.dim() == 2 and "postmix" not in name:
                std = 0.02 / math.sqrt(2 * cfg.n_layer) if name.endswith(("o_proj.weight", "down_proj.weight")) else 0.02
                torch.nn.init.normal_(p, mean=0.0, std=std)

    def num_params(self, non_embedding=False):
        n = sum(p.numel() for p in self.parameters())  # tied weights are counted once
        if non_embedding:
            n -= self.embed.weight.numel()
            if not self.cfg.tie_embeddings:
                n -= self.lm_head.weight.numel()
        return n

    def forward(self, idx, targets=None, start_pos=None):
        """idx (B, T) -> (logits, mean cross-entropy or None).
        start_pos=None: a whole sequence from position 0 (training, eval); logits (B, T, vocab).
        start_pos=int: positions start_pos.. through the KV cache (setup_cache first); a (1,) long tensor
        decodes one token with static shapes (for torch.compile / CUDA graphs). Logits (B, 1, vocab):
        generation only reads the last position."""
        B, T = idx.shape
        if start_pos is None:
            if T > self.cfg.block_size:
                raise ValueError(f"sequence length {T} > block_size {self.cfg.block_size}")
            cos, sin = rope_cos_sin(torch.arange(T, device=idx.device), self.cfg.head_dim, self.cfg.rope_theta, self.embed.weight.dtype)
        elif getattr(self, "rope_cos", None) is None:
            raise RuntimeError("no KV cache: call setup_cache(batch_size, max_len) first")
        elif isinstance(start_pos, torch.Tensor):
            cos, sin = self.rope_cos[start_pos], self.rope_sin[start_pos]  # (1, hd)
        elif start_pos + T > self.rope_cos.size(0):
            raise ValueError(f"positions up to {start_pos + T} do not fit the cache ({self.rope_cos.size(0)}); "
                             f"call setup_cache with a larger max_len")
        else:
            cos, sin = self.rope_cos[start_pos:start_pos + T], self.rope_sin[start_pos:start_pos + T]  # (T, hd)
        x = self.drop(self.embed(idx))  # (B, T, D)
        for block in self.blocks:
            x = block(x, cos, sin, start_pos)
        x = self.norm(x if start_pos is None else x[:, -1:])  # (B, T or 1, D)
        logits = self.lm_head(x)
        loss = None
        if targets is not None:
            logits_f = logits.to(torch.promote_types(logits.dtype, torch.float32))  # bf16 logits: loss in fp32
            loss = F.cross_entropy(logits_f.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss

    # ---- generation with a preallocated KV cache (gpt-fast style) ----
    def setup_cache(self, batch_size, max_len, dtype=None, device=None):
        """One KVCache per layer for positions 0..max_len-1, and the RoPE table of those positions
        (angles in float64, cast once here: a decode step then only slices it)."""
        p = self.embed.weight
        device = device or p.device
        for block in self.blocks:
            block.attn.kv_cache = KVCache(batch_size, self.cfg.n_kv_head, max_len, self.cfg.head_dim, dtype or p.dtype, device)
        cos, sin = rope_cos_sin(torch.arange(max_len, device=device), self.cfg.head_dim, self.cfg.rope_theta, p.dtype)
        self.register_buffer("rope_cos", cos, persistent=False)  # buffers: static inputs for CUDA graphs
        self.register_buffer("rope_sin", sin, persistent=False)

    @torch.no_grad()
    def prefill(self, idx):
        """Runs the prompt (B, T) from position 0, filling the cache; returns last-position logits (B, vocab)."""
        return self(idx, start_pos=0)[0][:, -1]

    @torch.no_grad()
    def decode_one_token(self, token, pos):
        """token (B, 1) at position pos (int, or (1,) long tensor); the cache holds positions < pos. -> (B, vocab)"""
        return self(token, start_pos=pos)[0][:, -1]

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, generator=None):
        """Continues idx (B, T); temperature=0 is greedy. Builds a cache of exactly the needed size."""
        B, T = idx.shape
        self.setup_cache(B, T + max_new_tokens)
        out = torch.empty(B, T + max_new_tokens, dtype=idx.dtype, device=idx.device)
        out[:, :T] = idx
        logits = self.prefill(idx)
        for pos in range(T, T + max_new_tokens):
            out[:, pos] = sample_next(logits, temperature, top_k, generator)
            if pos + 1 < T + max_new_tokens:
                logits = self.decode_one_token(out[:, pos:pos + 1], pos)
        return out

    @torch.no_grad()
    def use_decode_layout(self):
        """Stores every Linear weight W (out, in) as a transposed-contiguous view: the same values, shape and
        state_dict, only the memory order changes to (in, out). At batch 1 each weight is read once per token
        by a matrix-vector product, and on CPU x @ W^T streams W from memory about 2x faster in this order
        (bench_decode.py --weight_layout=out_in shows the difference). Returns self."""
        for m in self.modules():
            if isinstance(m, nn.Linear):
                m.weight.data = m.weight.data.t().contiguous().t()
        return self

    # ---- cost accounting ----
    def flops_per_token(self, T, training=False):
        """Convention: forward = 2 x MACs of every matmul (lm_head, premix, postmix included)
        + causal attention 2 * n_attn_head * head_dim * T per layer (QK^T and AV over T/2 keys on
        average); training = 3 x forward."""
        c = self.cfg
        D, d, H = c.n_embd, c.head_dim, c.n_attn_head
        macs = D * d * (c.n_q_proj + 2 * c.n_kv_head) + H * d * D + 3 * D * c.mlp_hidden  # projections, MLP
        if c.has_premix:
            macs += H * d * d  # every virtual head: one d x d map
        if c.has_postmix:
            macs += 2 * H * c.vha_postmix_rank * d  # U^T then V
        fwd = c.n_layer * (2 * macs + 2 * H * d * T) + 2 * D * c.vocab_size
        return 3 * fwd if training else fwd

    def kv_bytes_per_token(self, dtype=torch.bfloat16):
        c = self.cfg
        return c.n_layer * 2 * c.n_kv_head * c.head_dim * torch.empty((), dtype=dtype).element_size()

    # ---- VHA health (cheap, no grad): is premix/postmix learning anything? ----
    @torch.no_grad()
    def vha_health(self, idx=None):
        """Layer means of: premix_dev ||P_g - I||_F; premix_group_div mean_{g!=g'} ||P_g - P_g'||^2 /
        mean_g ||P_g - I||^2 (0 = groups identical, about 2 = independent); postmix_sigma_max sigma_max(V U^T);
        postmix_offdiag_share (share of ||M||_F^2 off the diagonal); with a batch idx, postmix_rel_delta
        ||a' - a|| / ||a|| per token (0 at init)."""
        c, attns = self.cfg, [b.attn for b in self.blocks]
        rows = [a.health() for a in attns]
        out = {k: sum(float(r[k].mean()) for r in rows) / len(rows) for k in rows[0] if k != "postmix_M"}
        if c.has_postmix and idx is not None:  # one eval-mode forward that records ||a' - a|| / ||a||
            was_training = self.training
            for a in attns:
                a.record_postmix = True
            try:
                self.eval()(idx)
            finally:
                for a in attns:
                    a.record_postmix = False
                self.train(was_training)
            out["postmix_rel_delta"] = sum(a.postmix_ratio for a in attns) / len(attns)
        return out

    # ---- fold: a trained VHA model IS a GQA model ----
    @torch.no_grad()
    def fold_to_gqa(self):
        """Returns (GPTConfig, state_dict) of the plain GQA model with identical outputs.
        Premix:  W_q'[j] = P[g]^T W_q[h] for j = g*H_p + h (fold_premix)
        Postmix: W_o'[:, h] = sum_j M[j, h] W_o[:, j] with M = I + V U^T (fold_postmix)
        QK-norm and RoPE act per head after premix, so they carry over unchanged; K, V are untouched.
        Computed in float64, cast back to each weight's dtype."""
        c = self.cfg
        if c.attn != "vha":
            raise ValueError("nothing to fold: this model is already plain GQA/MHA/MQA (attn='gqa')")
        if c.has_postmix and c.vha_postmix_act != "linear":
            raise ValueError("cannot fold a SiLU postmix: silu(U^T a) is not linear in a, so no single "
                             "matrix M can be absorbed into W_o; only vha_postmix_act='linear' folds")
        sd = {k: v for k, v in self.state_dict().items() if "premix" not in k and "postmix" not in k}
        for i, block in enumerate(self.blocks):
            a = block.attn
            if c.has_premix:  # the fold acts on the q rows of the fused projection; k and v rows stay
                W = a.qkv_proj.weight
                W_q, W_k, W_v = W.double().split(a.qkv_split)
                sd[f"blocks.{i}.attn.qkv_proj.weight"] = torch.cat([fold_premix(W_q, a.premix.double()), W_k, W_v]).to(W.dtype)
            if c.has_postmix:
                W_o = fold_postmix(a.o_proj.weight.double(), a.postmix_matrix().double())
                sd[f"blocks.{i}.attn.o_proj.weight"] = W_o.to(a.o_proj.weight.dtype)
        gqa = dict(asdict(c), attn="gqa", n_head=c.n_attn_head, head_dim=c.head_dim, vha_postmix_rank=None)
        return GPTConfig(**gqa), sd


def sample_next(logits, temperature=1.0, top_k=None, generator=None):
    """logits (B, vocab) -> next token ids (B,). temperature 0 picks the argmax."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float() / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(logits.softmax(dim=-1), 1, generator=generator).squeeze(-1)


# ---- checkpoints: written atomically, loaded with clear errors, in one place ----
def save_checkpoint(obj, path):
    """torch.save to a temp file in the same folder, fsync, then rename: a crash mid-write
    leaves the previous file intact."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp_" + os.path.basename(path))
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def load_checkpoint(path, device="cpu"):
    """Returns the checkpoint dict; raises a clear error for a missing, corrupt or foreign file."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"checkpoint {path} not found: train one first (python train.py ...) or pass the right --out_dir")
    try:
        ckpt = torch.load(path, map_location=device, weights_only=True)  # never runs code from the file
    except Exception as e:
        reason = str(e).strip().split("\n")[0].split(". ")[0][:160]
        raise ValueError(f"checkpoint {path} is corrupt or truncated ({type(e).__name__}: {reason}); "
                         f"use an intact checkpoint or retrain") from None
    if not isinstance(ckpt, dict) or "model" not in ckpt or "model_args" not in ckpt:
        raise ValueError(f"{path} is not a nanoVHA checkpoint (no 'model'/'model_args' entries)")
    return ckpt


# checkpoints written before the fused projections name each projection; their rows stack into the fused ones
UNFUSED_PROJECTIONS = {"attn.qkv_proj.weight": ("attn.q_proj.weight", "attn.k_proj.weight", "attn.v_proj.weight"),
                       "mlp.gate_up_proj.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight")}


def fuse_projections(state):
    """A state dict with separate q/k/v and gate/up projections -> the same weights under the fused names
    (rows concatenated in the fused order), so old checkpoints load exactly. Other entries pass through."""
    state = dict(state)
    for key in [k for k in state if k.endswith(UNFUSED_PROJECTIONS["attn.qkv_proj.weight"][0])]:
        layer = key[: -len(UNFUSED_PROJECTIONS["attn.qkv_proj.weight"][0])]  # 'blocks.3.'
        for fused, parts in UNFUSED_PROJECTIONS.items():
            if all(layer + p in state for p in parts):
                state[layer + fused] = torch.cat([state.pop(layer + p) for p in parts])
    return state


def split_projections(state, cfg):
    """The inverse of fuse_projections: fused q/k/v and gate/up rows back under the separate names (the
    layout Hugging Face's Qwen3 uses)."""
    state, d = dict(state), cfg.head_dim
    rows = {"attn.qkv_proj.weight": [cfg.n_q_proj * d, cfg.n_kv_head * d, cfg.n_kv_head * d],
            "mlp.gate_up_proj.weight": [cfg.mlp_hidden, cfg.mlp_hidden]}
    for key in [k for k in state if k.endswith(tuple(rows))]:
        fused = next(f for f in rows if key.endswith(f))
        layer = key[: -len(fused)]
        for name, part in zip(UNFUSED_PROJECTIONS[fused], state.pop(key).split(rows[fused])):
            state[layer + name] = part
    return state


def model_from_checkpoint(ckpt, device="cpu"):
    """Builds the GPT of a checkpoint dict; strips torch.compile's '_orig_mod.' prefix and fuses the
    projections of checkpoints written before q/k/v and gate/up were fused."""
    known = {f.name for f in fields(GPTConfig)}
    prefix = "_orig_mod."
    try:
        model = GPT(GPTConfig(**{k: v for k, v in ckpt["model_args"].items() if k in known}))
        model.load_state_dict(fuse_projections({k[len(prefix):] if k.startswith(prefix) else k: v for k, v in ckpt["model"].items()}))
    except (TypeError, ValueError, KeyError, AttributeError, RuntimeError) as e:
        reason = str(e).strip().split("\n")[0][:200]
        raise ValueError(f"the checkpoint holds no loadable model ({type(e).__name__}: {reason}); "
                         f"use a checkpoint written by train.py or fold.py") from None
    return model.to(device)
