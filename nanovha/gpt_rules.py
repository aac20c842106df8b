"""
The rules GPTConfig keeps (model.py calls check_config when a config is made): the None defaults
filled, and every setting the model cannot build refused with a ValueError naming the rule and
the fix. Each attention kind adds its own rules (its check_config: GQA's and VHA's here, MLA's
and MFA's in nanovha/mla_mfa.py).
"""
from dataclasses import fields
from typing import Literal, get_args, get_origin


def check(ok, msg):
    """A GPTConfig rule: raises ValueError naming the rule and the fix."""
    if not ok:
        raise ValueError(f"GPTConfig: {msg}")


def check_config(cfg, attention):
    """cfg: a GPTConfig being made; attention: model.ATTENTION (attn= name -> its module)."""
    for name in ("vocab_size", "block_size", "n_layer", "n_embd", "n_head", "n_kv_head"):
        value = getattr(cfg, name)
        check(type(value) is int, f"{name} must be an int, got {value!r}")
        check(value >= 1, f"{name} must be >= 1, got {value}")
    hint = "" if "mla" in attention else " (mla, mfa: import nanovha.mla_mfa first)"
    check(cfg.attn in attention, f"attn must be one of {tuple(attention)}, got {cfg.attn!r}{hint}")
    for f in fields(cfg):  # the Literal fields take one of their values
        allowed, value = get_args(f.type), getattr(cfg, f.name)
        check(get_origin(f.type) is not Literal or value in allowed,
              f"{f.name} must be one of {allowed}, got {value!r}")
    check(cfg.n_head % cfg.n_kv_head == 0, f"n_head % n_kv_head != 0 ({cfg.n_head} % "
          f"{cfg.n_kv_head}): each KV head must serve the same number of query heads")
    if cfg.head_dim is None:
        check(cfg.n_embd % cfg.n_head == 0,
              f"n_embd % n_head != 0 ({cfg.n_embd} % {cfg.n_head}); set head_dim explicitly")
        cfg.head_dim = cfg.n_embd // cfg.n_head
    check(cfg.head_dim >= 2 and cfg.head_dim % 2 == 0,
          f"head_dim must be even for RoPE, got {cfg.head_dim}")
    cfg.mlp_hidden = 3 * cfg.n_embd if cfg.mlp_hidden is None else cfg.mlp_hidden
    check(cfg.mlp_hidden >= 1, f"mlp_hidden must be >= 1 (or None: 3 * n_embd), got {cfg.mlp_hidden}")
    check(0.0 <= cfg.dropout < 1.0, f"dropout must be in [0, 1), got {cfg.dropout}")
    attention[cfg.attn].check_config(cfg)  # the kind's own rules (and MLA's derived widths)
    if cfg.vha_postmix_rank is None:
        cfg.vha_postmix_rank = max(1, cfg.n_head // 4)
    check(not cfg.has_postmix or 1 <= cfg.vha_postmix_rank <= cfg.n_attn_head,
          f"vha_postmix_rank must be in [1, {cfg.n_attn_head}] (the heads it mixes), "
          f"got {cfg.vha_postmix_rank}")


def gqa_vha_rules(cfg):
    """GQA's and VHA's rules (Attention.check_config): no other kind's knobs; VHA has premix or
    postmix."""
    check(cfg.q_rank is None, f"q_rank={cfg.q_rank} is the low-rank query of attn='mla' or 'mfa' "
                              f"(>= 1); attn={cfg.attn!r} has a full W_q: drop q_rank")
    check(cfg.mla_kv_rank is None and cfg.mla_rope_dim is None,
          f"mla_kv_rank / mla_rope_dim are attn='mla' knobs; attn={cfg.attn!r}: drop them")
    if cfg.attn == "vha":
        check(cfg.vha_premix or cfg.vha_postmix, "attn='vha' needs vha_premix or vha_postmix (or use attn='gqa')")
        check(cfg.vha_premix or cfg.n_q_proj % cfg.n_kv_head == 0,  # postmix only: H_p heads attend
              f"postmix-only VHA attends with H_p = n_head // n_kv_head = {cfg.n_q_proj} heads, "
              f"which must be a multiple of n_kv_head={cfg.n_kv_head}")
