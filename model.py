"""
nanoVHA model: a Qwen3-style decoder with GQA and Virtual Head Attention (VHA), in one file.

Reads top to bottom: RMSNorm, RoPE, KV cache, attention (GQA + VHA premix/postmix), MLP, block,
config, model, and the fold. It needs no engine: nanovha/engine/ only makes decode fast, by putting
its own one-token attention and KV memory in place (GPT.set_decode; docs/architecture.md).

VHA in one picture, head counts as the paper names them: H_v = n_head = 8 (virtual) query heads attend,
H_kv = n_kv_head = 2 KV heads, H_p = n_q_proj = H_v / H_kv = 4 physical query projections:

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
from dataclasses import asdict, dataclass
from typing import Literal, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from nanovha.gpt_rules import check_config, gqa_vha_rules
from nanovha.paired_init import init_weights


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        # in at least float32 (like Qwen3), so bf16 activations keep the normalisation exact
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
    """One layer's cache, zeroed: k (B, heads, max_len, k_dim), v (B, heads, max_len, v_dim), its part of one
    allocation for every layer (GPT.setup_cache); MLA keeps its [latent ; RoPE key] rows in k, v empty."""

    def __init__(self, k, v):
        super().__init__()
        self.register_buffer("k", k, persistent=False)
        self.register_buffer("v", v, persistent=False)

    def update(self, start, k, v):
        """Writes k, v (B, H_kv, T, hd) at start..; returns the filled prefix for an int start, the
        whole cache for a (1,) tensor start (static shapes: the caller masks positions after start)."""
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


def one_token_attention(q, k, v, start_pos, scale=None):
    """One decoded token q (B, H, 1, d) over the cache k (B, H_kv, T, d), v (B, H_kv, T, d_v) ->
    (B, H, 1, d_v). Each KV head's group of H / H_kv query heads become its query rows, so each KV
    head is read once and any SDPA kernel takes it. start_pos an int: k and v hold exactly the
    past; a (1,) tensor: they are the whole static cache, positions after start_pos masked."""
    B, H, _, d = q.shape
    qg = q.view(B, k.size(1), H // k.size(1), d)  # (B, H_kv, group, d): head j = g*group + i
    mask = (torch.arange(k.size(2), device=q.device) <= start_pos)[None] if torch.is_tensor(start_pos) else None
    out = F.scaled_dot_product_attention(qg, k, v, attn_mask=mask, scale=scale)  # (B, H_kv, group, d_v)
    return out.view(B, H, 1, v.size(-1))


def kv_expand_needed(device_type, dtype, H_q, H_kv):
    """True only for grouped heads in float32 on CUDA, where no fused SDPA kernel takes enable_gqa."""
    return device_type == "cuda" and dtype == torch.float32 and H_q != H_kv


def sdpa(q, k, v, is_causal=False, dropout_p=0.0, expand_kv=None):
    """plain_attention fused (F.scaled_dot_product_attention over grouped heads): q (B, H_q, Tq, hd),
    k/v (B, H_kv, Tk, hd) -> (B, H_q, Tq, hd). expand_kv=None decides by device and (autocast) dtype;
    True/False forces it (the tests run the CUDA branch on CPU)."""
    if expand_kv is None:
        dtype = torch.get_autocast_dtype("cuda") if q.is_cuda and torch.is_autocast_enabled("cuda") else q.dtype
        expand_kv = kv_expand_needed(q.device.type, dtype, q.size(1), k.size(1))
    # SPECIAL CASE, fp32 on CUDA: expand, else GQA runs the math path (flash/cuDNN: fp16/bf16 only;
    # mem-efficient: no GQA, pytorch#139586)
    if expand_kv:
        group = q.size(1) // k.size(1)
        k = k.repeat_interleave(group, dim=1)  # (B, H_q, Tk, hd): head j reads KV head j // group
        v = v.repeat_interleave(group, dim=1)
    return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, dropout_p=dropout_p,
                                          enable_gqa=not expand_kv)


class Attention(nn.Module):
    """GQA attention; with attn="vha" it adds Q premix and postmix, in this order:
    projections -> premix -> QK-norm -> RoPE -> causal attention -> postmix -> W_o."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        d, D = cfg.head_dim, cfg.n_embd
        # q, k and v in one projection (nanoGPT's c_attn): one matrix-vector product per decoded token
        self.qkv_split = cfg.qkv_split  # rows [W_q (H_p*d); W_k (H_kv*d); W_v (H_kv*d)]
        self.qkv_proj = nn.Linear(D, sum(self.qkv_split), bias=False)
        self.o_proj = nn.Linear(cfg.n_attn_head * d, D, bias=False)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(d, cfg.norm_eps)  # one weight shared by all heads (Qwen3)
            self.k_norm = RMSNorm(d, cfg.norm_eps)
        if cfg.has_premix:
            # Q premix: q_j = q_h @ P[g] for virtual head j = g*H_p + h; P near the identity
            noise = 0.1 / math.sqrt(d) * torch.randn(cfg.n_kv_head, d, d)
            self.premix = nn.Parameter(torch.eye(d).repeat(cfg.n_kv_head, 1, 1) + noise)  # (H_kv, d, d)
        if cfg.has_postmix:
            # postmix: a'_j = a_j + sum_r V[j, r] act(sum_h U[h, r] a_h), i.e. a' = (I + V U^T) a
            H, r = cfg.n_attn_head, cfg.vha_postmix_rank
            self.postmix_U = nn.Parameter(0.01 * torch.randn(H, r))
            self.postmix_V = nn.Parameter(torch.zeros(H, r))  # V=0: exactly the identity at init
        self.cache_dims = (cfg.n_kv_head, d, d)  # KVCache: heads, key width, value width
        self.kv_cache = None
        self.decode_attention = None  # one_token_attention's stand-in, if the engine set one (GPT.set_decode)

    def apply_premix(self, q):
        """(B, T, H_p, d) -> (B, T, H_v, d), virtual head j = g*H_p + h gets q_h @ P[g]. One matmul:
        q @ [P[0] | P[1] | ...] computes every (h, g) pair at once."""
        (B, T, H_p, d), H_kv = q.shape, self.premix.size(0)
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
        return a + (self.postmix_V @ z).view(B, H, T, d)  # (B, H, T, d)

    def postmix_matrix(self):
        """M = I + V U^T, (H, H): the linear postmix as one operator on the head axis."""
        V, U = self.postmix_V, self.postmix_U
        return torch.eye(V.size(0), dtype=V.dtype, device=V.device) + V @ U.t()

    def project(self, x):
        """x (B, T, D) -> q (B, T, H_p, d), k and v (B, T, H_kv, d): one matmul x [W_q; W_k; W_v]^T."""
        cfg, (B, T, _), d = self.cfg, x.shape, self.cfg.head_dim
        q, k, v = self.qkv_proj(x).split(self.qkv_split, dim=-1)  # (B, T, H_p*d | H_kv*d | H_kv*d)
        return q.view(B, T, cfg.n_q_proj, d), k.view(B, T, cfg.n_kv_head, d), v.view(B, T, cfg.n_kv_head, d)

    def attend(self, q, k, v, start_pos):
        """Causal attention of q (B, H, T, d) over k, v (B, H_kv, T, d), through the KV cache when
        decoding -> (B, H, T, d). Each KV head serves H / H_kv query heads."""
        cfg, T = self.cfg, q.size(2)
        if start_pos is not None:  # a (1,) tensor start_pos: a compiled step's static shapes
            k, v = self.kv_cache.update(start_pos, k, v)  # (B, H_kv, start_pos+T, d); static: all of it
        if T == 1 and start_pos is not None:  # one token: each KV head read once for its group
            return (self.decode_attention or one_token_attention)(q, k, v, start_pos)
        if cfg.attn_impl == "plain":
            return plain_attention(q, k, v)
        # prefill starts at 0 and training has no cache, so the causal mask is the square one
        assert start_pos in (None, 0) or T == 1, "multi-token steps after prefill are not supported"
        return sdpa(q, k, v, is_causal=T > 1, dropout_p=cfg.dropout if self.training else 0.0)

    def forward(self, x, cos, sin, start_pos=None):
        """x: (B, T, D) -> (B, T, D). start_pos=None: training/no cache; else the cache at start_pos."""
        cfg, (B, T, _) = self.cfg, x.shape
        q, k, v = self.project(x)  # 1. (B, T, H_p, d), (B, T, H_kv, d), (B, T, H_kv, d)
        if cfg.has_premix:
            q = self.apply_premix(q)  # 2. (B, T, H_v, d): one virtual head per (physical head, KV group)
        if cfg.qk_norm:  # 3. after premix, so premix stays a plain linear map on q
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, heads, T, d)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)  # 4.
        a = self.attend(q, k, v, start_pos)  # 5. (B, H, T, d)
        a_flat = lambda a: a.transpose(1, 2).reshape(B, T, -1)  # (B, H, T, d) -> (B, T, H*d)
        if cfg.has_postmix and cfg.vha_postmix_act == "linear" and self.training and start_pos is None:
            # the training fast path: 6 and 7 in one matmul, W_o (M a) = (W_o M) a, M folded into W_o
            # once per step (D*H*H*d MACs) instead of mixing every token's heads
            W_o = fold_postmix(self.o_proj.weight, self.postmix_matrix())
            return F.linear(a_flat(a), W_o)  # (B, T, D)
        if cfg.has_postmix:
            a = self.apply_postmix(a)  # 6. a' = (I + V U^T) a over the head axis
        return self.o_proj(a_flat(a))  # 7. (B, T, D)

    check_config = staticmethod(gqa_vha_rules)  # no other kind's knobs; VHA has premix or postmix

# attn= name -> its attention module; nanovha/mla_mfa.py adds "mla" and "mfa", the kinds VHA is compared with
ATTENTION = {"gqa": Attention, "vha": Attention}


class MLP(nn.Module):
    """SwiGLU: down(silu(x W_gate^T) * (x W_up^T)), gate and up in one projection (rows [W_gate; W_up])."""

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
        self.attn = ATTENTION[cfg.attn](cfg)
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
    attn: str = "gqa"  # "gqa" (MHA: n_kv_head == n_head; MQA: 1), "vha", "mla", "mfa" (ATTENTION)
    vha_premix: bool = True
    vha_postmix: bool = True
    vha_postmix_rank: Optional[int] = None  # default max(1, n_head // 4)
    vha_postmix_act: Literal["linear", "silu"] = "linear"  # silu: the paper's ablation; cannot fold
    q_rank: Optional[int] = None  # MLA/MFA: a low-rank query (None: full W_q); MFA needs it
    mla_kv_rank: Optional[int] = None  # MLA: width r of the cached latent (default 4 * head_dim)
    mla_rope_dim: Optional[int] = None  # MLA: width d_R of the shared RoPE key (default head_dim // 2)
    mla_decode: Literal["absorb", "naive"] = "absorb"  # MLA's decode: over the latent, or up-projected
    attn_impl: Literal["sdpa", "plain"] = "sdpa"  # plain: the readable reference

    def __post_init__(self):
        """Fills the None defaults and refuses what the model cannot build (nanovha/gpt_rules.py)."""
        check_config(self, ATTENTION)

    # derived: which VHA pieces are on, H_p, the heads that attend, the padded vocab, RoPE's width
    has_premix = property(lambda self: self.attn == "vha" and self.vha_premix)
    has_postmix = property(lambda self: self.attn == "vha" and self.vha_postmix)
    n_q_proj = property(lambda self: self.n_head // self.n_kv_head if self.attn == "vha" else self.n_head)
    # H_v: n_head, except postmix-only VHA, which attends with its H_p physical heads
    n_attn_head = property(lambda self: self.n_q_proj if self.attn == "vha" and not self.vha_premix
                           else self.n_head)
    padded_vocab = property(lambda self: 64 * -(-self.vocab_size // 64))  # rows: 50257 -> 50304
    rope_dim = property(lambda self: self.mla_rope_dim if self.attn == "mla" else self.head_dim)

    @property
    def qkv_split(self):
        """Rows of the fused projection: [W_q or low-rank W_qa; W_k; W_v]; MLA [W_q or W_dq; W_dkv; W_kR]."""
        d = self.head_dim
        if self.attn == "mla":
            return [self.q_rank or self.n_head * (d + self.mla_rope_dim), self.mla_kv_rank, self.mla_rope_dim]
        return [self.q_rank or self.n_q_proj * d, self.n_kv_head * d, self.n_kv_head * d]


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        seed = int(torch.randint(2**62, (1,), device="cpu"))  # first: every variant built after one
        self.embed = nn.Embedding(cfg.padded_vocab, cfg.n_embd)  # manual_seed(s) draws this same seed
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.norm = RMSNorm(cfg.n_embd, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.padded_vocab, bias=False)  # N a multiple of 64
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        self.kv_memory = None  # how setup_cache allocates, if the engine set it (set_decode)
        init_weights(self, seed)  # GPT-2's N(0, 0.02), drawn per parameter and head by name
        for w in (self.embed.weight, self.lm_head.weight):  # padded rows are 0 and stay 0: never looked
            torch.nn.init.zeros_(w[cfg.vocab_size:])  # up, logits sliced off, weight decay keeps them 0

    def optimizer_groups(self, weight_decay):
        """AdamW's groups (frozen parameters left out). Decay: matrices and postmix U, V (pulls I + V U^T
        toward the identity, the plain-GQA prior). No decay: norms, and premix P, whose centre is the
        identity, not zero: decay would shrink every virtual query toward nothing."""
        params = {n: p for n, p in self.named_parameters() if p.requires_grad}
        decay = [p for n, p in params.items() if p.dim() >= 2 and "premix" not in n]
        no_decay = [p for n, p in params.items() if p.dim() < 2 or "premix" in n]
        return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]

    def num_params(self, non_embedding=False):
        n = sum(p.numel() for p in self.parameters())  # tied weights are counted once
        tied = {id(self.embed.weight): self.embed.weight, id(self.lm_head.weight): self.lm_head.weight}
        return n - sum(w.numel() for w in tied.values()) if non_embedding else n

    def forward(self, idx, targets=None, start_pos=None):
        """idx (B, T) -> (logits (B, T, vocab_size), mean cross-entropy or None), from position 0; with
        start_pos (setup_cache first), through the KV cache, last position only (B, 1, vocab_size): an
        int, or a (1,) long tensor for a static-shape one-token step (torch.compile, AOTInductor)."""
        B, T = idx.shape
        cache = self.blocks[0].attn.kv_cache
        if start_pos is None and T > self.cfg.block_size:
            raise ValueError(f"sequence length {T} > block_size {self.cfg.block_size}")
        if start_pos is not None and cache is None:
            raise RuntimeError("no KV cache: call setup_cache(batch_size, max_len) first")
        if isinstance(start_pos, int) and start_pos + T > cache.k.size(2):
            raise ValueError(f"positions to {start_pos + T} exceed the cache ({cache.k.size(2)}): setup_cache more")
        cos, sin = self.rope_at(0 if start_pos is None else start_pos, T, idx.device)  # (T, rope_dim)
        x = self.drop(self.embed(idx))  # (B, T, D)
        for block in self.blocks:
            x = block(x, cos, sin, start_pos)
        x = self.norm(x if start_pos is None else x[:, -1:])  # (B, T or 1, D)
        # the matmul at the padded N; the real columns are a view (exact, free), no caller sees a padded id
        logits = self.lm_head(x)[..., :self.cfg.vocab_size]  # (B, T, padded_vocab) -> (B, T, vocab_size)
        loss = None
        if targets is not None:
            logits_f = logits.to(torch.promote_types(logits.dtype, torch.float32))  # bf16: loss in fp32
            loss = F.cross_entropy(logits_f.reshape(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss

    def rope_at(self, start_pos, T, device):
        """cos, sin (T, rope_dim) of positions start_pos.. (int or (1,) tensor): no table to size."""
        positions = torch.arange(T, device=device) + start_pos  # (T,)
        return rope_cos_sin(positions, self.cfg.rope_dim, self.cfg.rope_theta, self.embed.weight.dtype)

    # ---- decoding with a preallocated KV cache (gpt-fast style); the loop is nanovha/generate.py
    def setup_cache(self, batch_size, max_len):
        """A zeroed KVCache per layer for positions 0..max_len-1 (at least), in the weights' dtype ->
        the caches. Each cache is its own torch.zeros, unless set_decode gave a kv_memory."""
        dtype, device = self.embed.weight.dtype, self.embed.weight.device
        dims = [block.attn.cache_dims for block in self.blocks]  # (heads, k_dim, v_dim) per layer
        zeros = lambda heads, width: torch.zeros(batch_size, heads, max_len, width, dtype=dtype, device=device)
        memory = (self.kv_memory(batch_size, max_len, dims, dtype, device) if self.kv_memory
                  else [(zeros(heads, k_dim), zeros(heads, v_dim)) for heads, k_dim, v_dim in dims])
        for block, (k, v) in zip(self.blocks, memory):
            block.attn.kv_cache = KVCache(k, v)  # (B, heads, max_len, k_dim), (B, heads, max_len, v_dim)
        return [block.attn.kv_cache for block in self.blocks]

    def set_decode(self, attention=None, kv_memory=None):
        """What decode runs on: attention(q, k, v, start_pos, scale=None) in place of one_token_attention
        in every layer, and kv_memory(batch_size, max_len, dims, dtype, device) -> [(k, v)] per layer in
        place of torch.zeros. nanovha/engine/ sets its own; None, None: model.py's."""
        for block in self.blocks:
            block.attn.decode_attention = attention
        self.kv_memory = kv_memory
        return self

    @torch.no_grad()
    def prefill(self, idx):
        """Runs the prompt (B, T) from position 0, filling the cache -> last-position logits (B, vocab)."""
        return self(idx, start_pos=0)[0][:, -1]

    @torch.no_grad()
    def decode_one_token(self, token, pos):
        """token (B, 1) at position pos (int or (1,) tensor), the cache holding < pos -> (B, vocab)"""
        return self(token, start_pos=pos)[0][:, -1]


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
    """The plain GQA model with the same outputs as a VHA model: a new GPT, n_head = H_v query heads
    over the same H_kv KV heads, in the model's dtype and on its device.
    Premix:  W_q'[j] = P[g]^T W_q[h] for j = g*H_p + h (fold_premix)
    Postmix: W_o'[:, h] = sum_j M[j, h] W_o[:, j] with M = I + V U^T (fold_postmix)
    QK-norm and RoPE act per head after premix, so they carry over unchanged; K, V are untouched.
    Computed in float64, cast back to each weight's dtype."""
    c = model.cfg
    if c.attn != "vha":
        raise ValueError(f"nothing to fold: attn={c.attn!r} has no premix or postmix (only attn='vha' "
                         f"folds); use the checkpoint as it is")
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
    cfg = GPTConfig(**{**asdict(c), "attn": "gqa", "n_head": c.n_attn_head, "vha_postmix_rank": None})
    with torch.random.fork_rng(devices=[]), torch.device("meta"):  # no init: every weight is overwritten
        gqa = GPT(cfg)
    gqa.load_state_dict(state, assign=True)  # strict: the folded state holds every weight of a GQA model
    if cfg.tie_embeddings:  # assign gives each name its own Parameter: tie them again
        gqa.lm_head.weight = gqa.embed.weight
    return gqa.train(model.training)
