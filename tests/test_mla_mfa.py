"""MLA and MFA: the same math along every path (naive == absorb, cached == uncached, static == dynamic), an
independent per-head loop of the MLA equations, config errors, cost accounting by hand, refusals."""
import math

import pytest
import torch

import nanovha.mla_mfa  # noqa: F401 (registers attn="mla" and "mfa")
from model import GPT, GPTConfig, fold_to_gqa
from nanovha.costs import flops_per_token, kv_bytes_per_token

MLA = dict(attn="mla", n_kv_head=8, qk_norm=False, mla_kv_rank=24, mla_rope_dim=8)
MFA = dict(attn="mfa", n_kv_head=1, head_dim=16, q_rank=32)


def make(seed=0, **kw):
    """A tiny float64 model with every weight (norms too) moved far from its init."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(**dict(dict(vocab_size=41, block_size=40, n_layer=2, n_embd=64, n_head=8), **kw))).double()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1.0 + 0.3 * torch.randn_like(p) if "norm" in name else 0.15 * torch.randn_like(p))
    return model.eval()


def decode_all(model, x, prompt, static=False):
    """Prefill x[:, :prompt], then decode the rest one token at a time; the logits of positions prompt-1.."""
    model.setup_cache(x.size(0), x.size(1))
    out = [model.prefill(x[:, :prompt])]
    for t in range(prompt, x.size(1)):
        pos = torch.tensor([t]) if static else t
        out.append(model.decode_one_token(x[:, t:t + 1], pos))
    return torch.stack(out, 1)


@pytest.mark.parametrize("kw", [MLA, dict(MLA, q_rank=16), MFA, dict(MFA, n_kv_head=2, head_dim=8),
                                dict(n_kv_head=8), dict(n_kv_head=2)],
                         ids=["mla", "mla_q_rank", "mfa", "mfa_2kv", "mha", "gqa2"])
@pytest.mark.parametrize("static", [False, True], ids=["int_pos", "static"])
def test_cached_decode_equals_the_uncached_forward_float64(kw, static):
    """Every decode path, the static one of the compiled step included (SDPA for MHA's one query per KV head, the
    grouped matmuls otherwise, MLA's shared latent), gives the uncached logits."""
    model, x = make(**kw), torch.randint(0, 41, (2, 14), generator=torch.Generator().manual_seed(1))
    full = model(x)[0]
    got = decode_all(model, x, 5, static)
    assert (got - full[:, 4:]).abs().max() < 1e-12


@pytest.mark.parametrize("q_rank", [None, 16])
def test_mla_absorb_equals_naive_decode_float64(q_rank):
    x = torch.randint(0, 41, (3, 12), generator=torch.Generator().manual_seed(2))
    absorb = decode_all(make(**dict(MLA, q_rank=q_rank, mla_decode="absorb")), x, 4)
    naive = decode_all(make(**dict(MLA, q_rank=q_rank, mla_decode="naive")), x, 4)
    assert (absorb - naive).abs().max() < 1e-12 and absorb.abs().max() > 1e-3


def reference_mla(attn, x, cos, sin):
    """The MLA equations for one layer, one head at a time, float64, written from the docstring."""
    c = attn.cfg
    B, T, D = x.shape
    H, d, dR, r = c.n_head, c.head_dim, c.mla_rope_dim, c.mla_kv_rank

    def rms(t, w):
        return w * t / torch.sqrt(t.pow(2).mean(-1, keepdim=True) + c.norm_eps)

    def rope(t):  # (T, dim): rotate-half, pair i with i + dim/2
        t1, t2 = t[..., : t.size(-1) // 2], t[..., t.size(-1) // 2:]
        return t * cos + torch.cat([-t2, t1], -1) * sin

    W = attn.qkv_proj.weight
    W_q, W_dkv, W_kr = W[: W.size(0) - r - dR], W[W.size(0) - r - dR: W.size(0) - dR], W[W.size(0) - dR:]
    W_ukv = attn.kv_up.weight.view(H, 2 * d, r)
    W_o = attn.o_proj.weight.view(D, H, d)
    out = torch.zeros(B, T, D, dtype=x.dtype)
    for b in range(B):
        q_all = x[b] @ W_q.t()
        if c.q_rank:
            q_all = rms(q_all, attn.q_latent_norm.weight) @ attn.q_up.weight.t()
        c_kv = rms(x[b] @ W_dkv.t(), attn.kv_norm.weight)  # (T, r)
        k_R = rope(x[b] @ W_kr.t())  # (T, d_R)
        for h in range(H):
            q_h = q_all[:, h * (d + dR):(h + 1) * (d + dR)]
            q_C, q_R = q_h[:, :d], rope(q_h[:, d:])
            k_C, v = c_kv @ W_ukv[h, :d].t(), c_kv @ W_ukv[h, d:].t()  # (T, d)
            scores = (q_C @ k_C.t() + q_R @ k_R.t()) / math.sqrt(d + dR)
            scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
            out[b] += (scores.softmax(-1) @ v) @ W_o[:, h].t()
    return out


@pytest.mark.parametrize("q_rank", [None, 16])
@pytest.mark.parametrize("impl", ["sdpa", "plain"])
def test_mla_equals_a_per_head_loop_of_its_equations_float64(q_rank, impl):
    from model import rope_cos_sin
    model = make(**dict(MLA, q_rank=q_rank, attn_impl=impl))
    attn, x = model.blocks[0].attn, torch.randn(2, 9, 64, dtype=torch.float64)
    cos, sin = rope_cos_sin(torch.arange(9), 8, model.cfg.rope_theta, torch.float64)
    assert (attn(x, cos, sin) - reference_mla(attn, x, cos, sin)).abs().max() < 1e-12


@pytest.mark.parametrize("kw, field", [
    (dict(MLA, qk_norm=True), "qk_norm=False"),
    (dict(MLA, n_kv_head=2), "set n_kv_head = n_head"),
    (dict(MLA, mla_rope_dim=3), "mla_rope_dim must be even"),
    (dict(MLA, mla_kv_rank=-1), "mla_kv_rank must be >= 1"),
    (dict(MFA, q_rank=None), "attn='mfa' factorizes the query: set q_rank"),
    (dict(attn="gqa", n_kv_head=2, q_rank=8), "q_rank=8 is the low-rank query of attn='mla' or 'mfa'"),
    (dict(attn="vha", n_kv_head=2, mla_kv_rank=8), "mla_kv_rank / mla_rope_dim are attn='mla' knobs"),
    (dict(MLA, mla_decode="fast"), "mla_decode must be one of"),
], ids=lambda v: v if isinstance(v, str) else "")
def test_config_errors_name_the_field(kw, field):
    with pytest.raises(ValueError, match="GPTConfig: .*" + field.replace("(", r"\(").replace(")", r"\)")):
        GPTConfig(vocab_size=41, n_layer=2, n_embd=64, n_head=8, **kw)


def test_cost_accounting_by_hand():
    """D=64, H=8, d=8, 2 layers, vocab 41 (V = 64 rows, padded), MLP hidden 192; MLA r=24, d_R=8, MFA one KV head of
    16, query rank 32."""
    D, H, d, L, V, M, T = 64, 8, 8, 2, 64, 192, 40  # V: embedding and LM head rows, 64 * ceil(41 / 64)
    mla = make(**MLA)
    # per layer: qkv_proj D x (H(d+d_R) + r + d_R), kv_up r x 2Hd, o_proj Hd x D, MLP 3 D M, norms 3 x D... listed
    mla_macs = D * (H * 16 + 24 + 8) + 24 * 2 * H * d + H * d * D + 3 * D * M
    assert flops_per_token(mla.cfg, T) == L * (2 * mla_macs + H * (2 * d + 8) * T) + 2 * D * V
    assert mla.num_params() == V * D + L * (mla_macs + 2 * D + 24) + D  # + attn/mlp norms, the latent norm; final norm
    assert kv_bytes_per_token(mla.cfg, torch.bfloat16) == L * (24 + 8) * 2 == 128
    mfa = make(**MFA)
    mfa_macs = D * (32 + 2 * 16) + 32 * H * 16 + H * 16 * D + 3 * D * M
    assert flops_per_token(mfa.cfg, T) == L * (2 * mfa_macs + 2 * H * 16 * T) + 2 * D * V
    assert mfa.num_params() == V * D + L * (mfa_macs + 2 * D + 32 + 2 * 16) + D  # + q_latent_norm, q_norm, k_norm
    assert kv_bytes_per_token(mfa.cfg, torch.bfloat16) == L * 2 * 1 * 16 * 2 == 128
    gqa2 = make(attn="gqa", n_kv_head=2)
    assert kv_bytes_per_token(gqa2.cfg, torch.bfloat16) == 128  # the same cache for the three


@pytest.mark.parametrize("kw", [MLA, MFA], ids=["mla", "mfa"])
def test_fold_and_the_qwen3_export_refuse_them(kw):
    import fold
    model = make(**kw)
    with pytest.raises(ValueError, match="nothing to fold"):
        fold_to_gqa(model)
    assert "is not a Qwen3 attention" in fold.hf_export_problem(model.cfg)


def test_training_step_learns_through_every_mla_and_mfa_weight():
    for kw in (dict(MLA, q_rank=16), MFA):
        model = make(**kw).train()
        x = torch.randint(0, 41, (2, 10))
        model(x, x)[1].backward()
        dead = [n for n, p in model.named_parameters() if p.grad is None or p.grad.abs().max() == 0]
        assert not dead, dead


@pytest.mark.parametrize("kw", [MLA, MFA, dict(n_kv_head=1)], ids=["mla", "mfa", "mqa"])
def test_static_decode_with_one_kv_head_equals_the_uncached_forward_float64(kw):
    """One KV head (or MLA's one latent row) for every query head: the static step's logits are the uncached ones."""
    model, x = make(**kw), torch.randint(0, 41, (2, 14), generator=torch.Generator().manual_seed(1))
    full = model(x)[0]
    got = decode_all(model, x, 5, static=True)
    assert (got - full[:, 4:]).abs().max() < 1e-12
