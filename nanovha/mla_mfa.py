"""
The attention kinds VHA is compared with, registered in model.py's attn= switch
(model.ATTENTION): importing this module adds attn="mla" and attn="mfa" (every command imports it
through nanovha/checkpoint.py). The cache / FLOPs / quality triangle stays one flag away:
`GPTConfig(attn="mla", ...)` builds the same GPT with another attention.

    MLAttention   DeepSeek-V2/V3's multi-head latent attention: a small latent cached, keys and values rebuilt
    MFAttention   StepFun's multi-matrix factorization attention: GQA with few wide KV heads and a low-rank query

Adding a kind: a class here (or in a module like this one) with `cache_dims`, `check_config` and
forward(x, cos, sin, start_pos), its entry in ATTENTION, its terms in nanovha/costs.py, and its
tests (CONTRIBUTING.md).
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from model import ATTENTION, Attention, RMSNorm, apply_rope, one_token_attention, plain_attention
from nanovha.gpt_rules import check


class MFAttention(Attention):
    """Multi-matrix factorization attention (StepFun's MFA, as Step-3 ships it): GQA with few KV
    heads of a large head_dim and a low-rank query, q = RMSNorm(x W_qa) W_qb (rank q_rank, W_qa
    fused into qkv_proj), so many query heads cost D*r + r*H*d weights instead of D*H*d. This is
    plain MFA, not the paper's key-reuse variant (MFA-KR, values partly built from keys): Step-3
    ships the plain form. Everything after the projection is GQA's."""

    def __init__(self, cfg):
        super().__init__(cfg)  # qkv_proj rows [W_qa (q_rank); W_k; W_v] (cfg.qkv_split)
        self.q_latent_norm = RMSNorm(cfg.q_rank, cfg.norm_eps)
        self.q_up = nn.Linear(cfg.q_rank, cfg.n_q_proj * cfg.head_dim, bias=False)  # W_qb

    def project(self, x):
        """x (B, T, D) -> q (B, T, H, d), k and v (B, T, H_kv, d)."""
        cfg, (B, T, _), d = self.cfg, x.shape, self.cfg.head_dim
        q, k, v = self.qkv_proj(x).split(self.qkv_split, dim=-1)  # (B, T, r | H_kv*d | H_kv*d)
        q = self.q_up(self.q_latent_norm(q))  # (B, T, r) -> (B, T, H*d)
        return q.view(B, T, cfg.n_q_proj, d), k.view(B, T, cfg.n_kv_head, d), v.view(B, T, cfg.n_kv_head, d)

    @staticmethod
    def check_config(cfg):
        """MFA's rules (GPTConfig calls it): a low-rank query, no MLA knobs."""
        check(cfg.q_rank is not None, "attn='mfa' factorizes the query: set q_rank (e.g. n_embd // 2)")
        check(cfg.q_rank >= 1, f"q_rank={cfg.q_rank} is the low-rank query of attn='mla' or 'mfa' (>= 1)")
        check(cfg.mla_kv_rank is None and cfg.mla_rope_dim is None,
              f"mla_kv_rank / mla_rope_dim are attn='mla' knobs; attn={cfg.attn!r}: drop them")


class MLAttention(nn.Module):
    """Multi-head latent attention (DeepSeek-V2/V3). Each token caches only a latent c_kv (r =
    mla_kv_rank wide) and one RoPE key k_R (d_R = mla_rope_dim) shared by all heads; per-head
    keys and values come back from c_kv:

        c_kv = RMSNorm(x W_dkv),   k_R = RoPE(x W_kR)                   (W_dkv, W_kR fused into qkv_proj)
        [k_C,h ; v_h] = W_ukv,h c_kv                                     (kv_up: d + d rows per head h)
        q_h = [q_C,h ; RoPE(q_R,h)] = rows of x W_q, or of RMSNorm(x W_dq) W_uq with q_rank
        a_h = softmax_t((q_C,h . k_C,h,t + q_R,h . k_R,t) / sqrt(d + d_R)) . v_h,t,   y = W_o [a_1; ...; a_H]

    Two decode paths, as DeepSeek-V3's inference code keeps them (mla_decode):
      naive:  up-project every cached c_kv to per-head k_C, v, then plain attention over d + d_R wide keys.
      absorb: q_C,h . (W_uk,h c) = (W_uk,h^T q_C,h) . c and sum_t p_t W_uv,h c_t = W_uv,h (sum_t p_t c_t): the
              query moves into latent space, attention runs over the cached c_kv itself (r wide, one "KV head"
              shared by all heads), and W_uv,h is applied once to the result. No per-head K/V is ever built.
    Training and prefill use the naive form. There is no per-head QK-norm (cfg.qk_norm must be
    False): an RMSNorm of k_C = W_uk c is not linear in c, so absorb could not move W_uk into the
    query. The latent norms (of c_kv, and of the query latent with q_rank) take its place, as in
    DeepSeek-V2/V3."""

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
        # rows per head h: [W_uk,h (d); W_uv,h (d)]
        self.kv_up = nn.Linear(r, H * 2 * d, bias=False)
        self.o_proj = nn.Linear(H * d, D, bias=False)
        self.cache_dims = (1, r + dR, 0)  # KVCache: one latent "head", k <- [c_kv ; k_R], v unused
        self.kv_cache = None
        self.decode_attention = None  # one_token_attention's stand-in, if the engine set one (GPT.set_decode)

    @staticmethod
    def check_config(cfg):
        """MLA's rules (GPTConfig calls it), and its derived widths r and d_R."""
        check(cfg.q_rank is None or cfg.q_rank >= 1, f"q_rank={cfg.q_rank} is the low-rank query of attn='mla' "
                                                     f"or 'mfa' (>= 1)")
        check(cfg.n_kv_head == cfg.n_head,
              f"attn='mla' up-projects a key and a value for every query head from the latent: "
              f"set n_kv_head = n_head ({cfg.n_head}), got {cfg.n_kv_head}; "
              f"the cache size is set by mla_kv_rank + mla_rope_dim")
        check(not cfg.qk_norm, "attn='mla' needs qk_norm=False: an RMSNorm of k = W_uk c_kv is not linear in c_kv, "
              "so the absorbed decode could not move W_uk into the query; MLA normalises its latents instead "
              "(DeepSeek-V2/V3)")
        cfg.mla_kv_rank = cfg.mla_kv_rank or 4 * cfg.head_dim
        cfg.mla_rope_dim = cfg.mla_rope_dim or max(2, cfg.head_dim // 2)
        check(cfg.mla_kv_rank >= 1, f"mla_kv_rank must be >= 1, got {cfg.mla_kv_rank}")
        check(cfg.mla_rope_dim >= 2 and cfg.mla_rope_dim % 2 == 0,
              f"mla_rope_dim must be even and >= 2 (RoPE pairs), got {cfg.mla_rope_dim}")

    def forward(self, x, cos, sin, start_pos=None):
        cfg = self.cfg
        B, T, _ = x.shape
        H, d, dR = cfg.n_head, cfg.head_dim, cfg.mla_rope_dim
        # (B, T, q width | r | d_R)
        q, c_kv, k_rope = self.qkv_proj(x).split(self.qkv_split, dim=-1)
        if cfg.q_rank:
            q = self.q_up(self.q_latent_norm(q))  # (B, T, H*(d+d_R))
        q = q.view(B, T, H, d + dR).transpose(1, 2)  # (B, H, T, d + d_R)
        q_nope, q_rope = q.split([d, dR], dim=-1)  # (B, H, T, d), (B, H, T, d_R)
        q_rope = apply_rope(q_rope, cos, sin)
        c_kv = self.kv_norm(c_kv)[:, None]  # (B, 1, T, r)
        # (B, 1, T, d_R): one RoPE key for every head
        k_rope = apply_rope(k_rope[:, None], cos, sin)
        static = isinstance(start_pos, torch.Tensor)
        kv = torch.cat([c_kv, k_rope], dim=-1)  # (B, 1, T, r + d_R): what a token caches
        if start_pos is not None:
            kv, _ = self.kv_cache.update(start_pos, kv, kv[..., :0])  # (B, 1, Tk, r + d_R)
        if T == 1 and start_pos is not None and cfg.mla_decode == "absorb":
            a = self.absorbed_attention(q_nope, q_rope, kv, start_pos)
        else:
            # (max_len,): written
            visible = torch.arange(kv.size(2), device=x.device) <= start_pos if static else None
            c_kv, k_rope = kv.split([cfg.mla_kv_rank, dR], dim=-1)  # (B, 1, Tk, r), (B, 1, Tk, d_R)
            a = self.naive_attention(q_nope, q_rope, c_kv, k_rope, visible, causal=T > 1)
        # (B, H, T, d) -> (B, T, H*d) -> (B, T, D)
        return self.o_proj(a.transpose(1, 2).reshape(B, T, H * d))

    def naive_attention(self, q_nope, q_rope, c_kv, k_rope, visible, causal):
        """Up-projects the latents to per-head keys and values, then ordinary attention. -> (B,
        H, T, d)"""
        B, H, T, d = q_nope.shape
        Tk = c_kv.size(2)
        kv = self.kv_up(c_kv[:, 0]).view(B, Tk, H, 2 * d).transpose(1, 2)  # (B, H, Tk, 2d)
        k_nope, v = kv.split([d, d], dim=-1)  # (B, H, Tk, d) each
        q = torch.cat([q_nope, q_rope], dim=-1)  # (B, H, T, d + d_R)
        # (B, H, Tk, d + d_R)
        k = torch.cat([k_nope, k_rope.expand(B, H, Tk, k_rope.size(-1))], dim=-1)
        if self.cfg.attn_impl == "plain" and visible is None:
            return plain_attention(q, k, v)
        # (1, Tk): broadcast over batch, heads, queries
        mask = None if visible is None else visible[None, :]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal and visible is None,
                                              dropout_p=self.cfg.dropout if self.training else 0.0)

    def absorbed_attention(self, q_nope, q_rope, kv, start_pos):
        """One decoded token, attention over the cached [c_kv ; k_R] rows kv (B, 1, Tk, r + d_R),
        start_pos a (1,) tensor (a static cache, written up to it) or an int (kv holds exactly the
        past). -> (B, H, 1, d)"""
        H, d, r = self.cfg.n_head, self.cfg.head_dim, self.cfg.mla_kv_rank
        W_uk, W_uv = self.kv_up.weight.view(H, 2 * d, r).split([d, d], dim=1)  # (H, d, r) each
        q_latent = q_nope @ W_uk  # (B, H, 1, d) @ (H, d, r) -> (B, H, 1, r): W_uk,h^T q_C,h
        q = torch.cat([q_latent, q_rope], dim=-1)  # (B, H, 1, r + d_R): H heads over one "KV head"
        # q . [c_t ; k_R,t] = q_latent . c_t + q_R . k_R,t; the cached row is the value too, of
        # which the first r columns are kept: sum_t p_t c_t. The H heads are the one KV head's group,
        # so the cache is read once for all of them (one_token_attention)
        scale = 1 / math.sqrt(d + q_rope.size(-1))
        a = (self.decode_attention or one_token_attention)(q, kv, kv, start_pos, scale)  # (B, H, 1, r + d_R)
        a_latent = a[..., :r]  # (B, H, 1, r): sum_t p_t c_t
        return a_latent @ W_uv.transpose(-2, -1)  # (B, H, 1, d): W_uv,h (sum_t p_t c_t)


ATTENTION.update(mla=MLAttention, mfa=MFAttention)
