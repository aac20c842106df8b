"""
What a model costs, from its config alone: FLOPs per token (MFU in train.py, the paper-scale rows
of bench.py) and the bytes its KV cache holds per token (bench_decode.py, the memory figures in
the docs).
"""
import torch


def kv_values_per_token(cfg):
    """Numbers cached per token: per layer a key and a value per KV head, or MLA's latent and
    RoPE key."""
    if cfg.attn == "mla":
        return cfg.n_layer * (cfg.mla_kv_rank + cfg.mla_rope_dim)
    return cfg.n_layer * 2 * cfg.n_kv_head * cfg.head_dim


def kv_bytes_per_token(cfg, dtype=torch.bfloat16):
    """Bytes the cache holds per token: kv_values_per_token x the element size."""
    return kv_values_per_token(cfg) * torch.empty((), dtype=dtype).element_size()


def flops_per_token(cfg, T, training=False):
    """Convention: forward = 2 x MACs of every matmul (lm_head, premix, postmix included)
    + causal attention 2 * H_v * head_dim * T per layer (QK^T and AV over T/2 keys on
    average; MLA: QK^T over d + d_R, AV over d); training = 3 x forward. MLA counts its training
    form (keys and values up-projected, the naive path); its absorbed decode does other work per
    token. The LM head counts padded_vocab rows, what the matmul runs (num_params counts the
    padded rows too)."""
    D, d, H = cfg.n_embd, cfg.head_dim, cfg.n_attn_head
    mla = cfg.attn == "mla"
    q_width = H * (d + cfg.mla_rope_dim) if mla else cfg.n_q_proj * d  # query numbers per token
    macs = D * sum(cfg.qkv_split) + H * d * D + 3 * D * cfg.mlp_hidden  # fused projection, W_o, MLP
    if cfg.q_rank:
        macs += cfg.q_rank * q_width  # q_up of the low-rank query (MLA, MFA)
    if mla:
        macs += cfg.mla_kv_rank * H * 2 * d  # kv_up: per-head keys and values from the latent
    if cfg.has_premix:
        macs += H * d * d  # every virtual head: one d x d map
    if cfg.has_postmix:
        macs += 2 * H * cfg.vha_postmix_rank * d  # U^T then V
    attention = H * (2 * d + cfg.mla_rope_dim) * T if mla else 2 * H * d * T  # FLOPs per layer
    fwd = cfg.n_layer * (2 * macs + attention) + 2 * D * cfg.padded_vocab
    return 3 * fwd if training else fwd
