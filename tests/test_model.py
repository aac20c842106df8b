import math

import pytest
import torch
import torch.nn.functional as F

from nanovha.costs import flops_per_token, kv_bytes_per_token
from nanovha.generate import generate
from nanovha.engine.attention import decode_attention, use_decode_layout, use_engine
from nanovha.bridges.qwen3 import fuse_projections, split_projections
from nanovha.health import vha_health
from model import GPT, GPTConfig, one_token_attention, plain_attention, rope_cos_sin

VARIANTS = {
    "mha": dict(attn="gqa", n_head=8, n_kv_head=8),
    "gqa": dict(attn="gqa", n_head=8, n_kv_head=2),
    "mqa": dict(attn="gqa", n_head=8, n_kv_head=1),
    "vha": dict(attn="vha", n_head=8, n_kv_head=2),
    "vha_kv1": dict(attn="vha", n_head=8, n_kv_head=1),
    "vha_kv4": dict(attn="vha", n_head=8, n_kv_head=4),
    "premix_only": dict(attn="vha", n_head=8, n_kv_head=2, vha_postmix=False),
    "postmix_only": dict(attn="vha", n_head=8, n_kv_head=2, vha_premix=False),
    "vha_silu": dict(attn="vha", n_head=8, n_kv_head=2, vha_postmix_act="silu"),
    "vha_no_qknorm": dict(attn="vha", n_head=8, n_kv_head=2, qk_norm=False, tie_embeddings=False),
}


def make(dtype=torch.float64, seed=0, scramble=True, **kw):
    """A tiny model; `scramble` moves every weight (premix, postmix, norms too) far from its init so
    that a wrong index or a missing term shows up in the outputs."""
    torch.manual_seed(seed)
    args = dict(vocab_size=37, block_size=48, n_layer=2, n_embd=64)
    args.update(kw)
    model = GPT(GPTConfig(**args)).to(dtype)
    if scramble:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "premix" in name:
                    p.add_(0.3 * torch.randn_like(p))
                elif "postmix" in name or "norm" in name:
                    p.copy_(1.0 * ("norm" in name) + 0.3 * torch.randn_like(p))
                else:
                    p.normal_(0, 0.15)
    return model.eval()


@pytest.mark.parametrize("name", VARIANTS)
def test_shapes_and_head_counts(name):
    model = make(dtype=torch.float32, **VARIANTS[name])
    cfg = model.cfg
    x = torch.randint(0, 37, (3, 11))
    logits, loss = model(x, x)
    assert logits.shape == (3, 11, 37) and loss.ndim == 0 and torch.isfinite(loss)
    attn = model.blocks[0].attn
    assert attn.qkv_proj.weight.shape == ((cfg.n_q_proj + 2 * cfg.n_kv_head) * cfg.head_dim, 64)  # [W_q; W_k; W_v]
    assert attn.o_proj.weight.shape == (64, cfg.n_attn_head * cfg.head_dim)
    if cfg.attn == "vha":  # VHA: H_p = H_v / H_kv physical projections
        assert cfg.n_q_proj == cfg.n_head // cfg.n_kv_head
    if cfg.has_premix:
        assert attn.premix.shape == (cfg.n_kv_head, cfg.head_dim, cfg.head_dim) and cfg.n_attn_head == cfg.n_head
    if cfg.has_postmix:
        assert attn.postmix_U.shape == attn.postmix_V.shape == (cfg.n_attn_head, cfg.vha_postmix_rank)


@pytest.mark.parametrize("kw, message", [
    (dict(n_head=8, n_kv_head=3), "n_head % n_kv_head"),
    (dict(n_embd=60, n_head=8, n_kv_head=2), "n_embd % n_head"),
    (dict(n_head=8, n_kv_head=2, head_dim=7), "head_dim must be even"),
    (dict(attn="mqa"), "attn must be"),
    (dict(attn="vha", n_head=8, n_kv_head=2, vha_postmix_rank=9), "vha_postmix_rank must be in"),
    (dict(attn="vha", n_head=8, n_kv_head=2, vha_postmix_rank=0), "vha_postmix_rank must be in"),
    (dict(attn="vha", vha_premix=False, vha_postmix=False), "needs vha_premix or vha_postmix"),
    (dict(attn="vha", n_head=8, n_kv_head=4, vha_premix=False), "postmix-only"),
    (dict(attn="vha", vha_postmix_act="gelu"), "vha_postmix_act"),
    (dict(n_layer=0), "n_layer must be >= 1"),
])
def test_invalid_configs_name_the_rule(kw, message):
    with pytest.raises(ValueError, match=message):
        GPTConfig(**dict(dict(n_embd=64, n_head=8, n_kv_head=2), **kw))


def test_derived_defaults():
    cfg = GPTConfig(n_embd=256, n_head=16, n_kv_head=2, attn="vha")
    assert (cfg.head_dim, cfg.mlp_hidden, cfg.vha_postmix_rank, cfg.n_q_proj, cfg.n_attn_head) == (16, 768, 4, 8, 16)
    assert GPTConfig(n_embd=64, n_head=2, n_kv_head=1, attn="vha").vha_postmix_rank == 1


def test_postmix_is_exact_identity_at_init():
    model = make(scramble=False, attn="vha", n_head=8, n_kv_head=2)
    attn = model.blocks[0].attn
    assert torch.count_nonzero(attn.postmix_V) == 0 and attn.postmix_U.abs().max() > 0
    a = torch.randn(2, 8, 5, 8, dtype=torch.float64)
    assert torch.equal(attn.apply_postmix(a), a)
    P = attn.premix.detach()
    assert P.shape == (2, 8, 8) and (P - torch.eye(8)).abs().max() < 1.0 and not torch.equal(P[0], P[1])


def reference_vha_attention(attn, x, cos, sin):
    """The doc's equations, one head at a time, in float64 (no batched tricks)."""
    cfg = attn.cfg
    B, T, D = x.shape
    d, H_p, H_kv, H = cfg.head_dim, cfg.n_q_proj, cfg.n_kv_head, cfg.n_attn_head
    W = attn.qkv_proj.weight  # rows [W_q; W_k; W_v]
    Wq = W[: H_p * d].view(H_p, d, D)
    Wk = W[H_p * d: (H_p + H_kv) * d].view(H_kv, d, D)
    Wv = W[(H_p + H_kv) * d:].view(H_kv, d, D)

    def rms(t, w):
        return w * t / torch.sqrt(t.pow(2).mean(-1, keepdim=True) + cfg.norm_eps)

    def rope(t):  # t: (T, d)
        half = d // 2
        return t * cos + torch.cat([-t[:, half:], t[:, :half]], -1) * sin

    outs = []
    for b in range(B):
        heads = []
        for j in range(H):
            if cfg.has_premix:
                g, h = divmod(j, H_p)  # virtual head j = g*H_p + h
                q = (x[b] @ Wq[h].T) @ attn.premix[g]
                kv = g
            else:
                q, kv = x[b] @ Wq[j].T, j // (H // H_kv)
            k, v = x[b] @ Wk[kv].T, x[b] @ Wv[kv].T
            if cfg.qk_norm:
                q, k = rms(q, attn.q_norm.weight), rms(k, attn.k_norm.weight)
            q, k = rope(q), rope(k)
            scores = (q @ k.T) / math.sqrt(d) + torch.full((T, T), float("-inf"), dtype=x.dtype).triu(1)
            heads.append(scores.softmax(-1) @ v)  # (T, d)
        if cfg.has_postmix:
            M = torch.eye(H, dtype=x.dtype) + attn.postmix_V @ attn.postmix_U.T
            act = F.silu if cfg.vha_postmix_act == "silu" else (lambda z: z)
            z = [sum(attn.postmix_U[h, r] * heads[h] for h in range(H)) for r in range(cfg.vha_postmix_rank)]
            heads = [heads[j] + sum(attn.postmix_V[j, r] * act(z[r]) for r in range(cfg.vha_postmix_rank))
                     for j in range(H)]
            if cfg.vha_postmix_act == "linear":  # the same thing as the operator M on the head axis
                assert cfg.has_postmix and M.shape == (H, H)
        outs.append(torch.cat(heads, -1) @ attn.o_proj.weight.T)  # (T, D)
    return torch.stack(outs)


@pytest.mark.parametrize("name", ["vha", "vha_kv1", "vha_kv4", "premix_only", "postmix_only", "vha_silu",
                                  "vha_no_qknorm", "gqa"])
@pytest.mark.parametrize("impl", ["sdpa", "plain"])
def test_attention_equals_per_head_reference_float64(name, impl):
    model = make(attn_impl=impl, **VARIANTS[name])
    attn = model.blocks[0].attn
    x = torch.randn(2, 9, 64, dtype=torch.float64)
    from model import rope_cos_sin
    cos, sin = rope_cos_sin(torch.arange(9), model.cfg.head_dim, model.cfg.rope_theta, torch.float64)
    with torch.no_grad():
        got = attn(x, cos, sin)
        want = reference_vha_attention(attn, x, cos, sin)
    assert (got - want).abs().max() < 1e-12


@pytest.mark.parametrize("name", ["mha", "gqa", "mqa", "vha", "vha_kv4", "premix_only", "postmix_only", "vha_silu",
                                  "vha_no_qknorm"])
@pytest.mark.parametrize("engine", [False, True], ids=["model's own", "the engine's"])
def test_cached_decode_equals_uncached_forward_float64(name, engine):
    model = make(**VARIANTS[name])
    if engine:  # its attention and paged KV memory (nanovha/engine/attention.py)
        use_engine(model)
    x = torch.randint(0, 37, (2, 30))
    with torch.no_grad():
        full = model(x)[0]
    model.setup_cache(batch_size=2, max_len=30)
    steps = [model.prefill(x[:, :12])]
    for pos in range(12, 29):
        steps.append(model.decode_one_token(x[:, pos:pos + 1], pos))
    assert (torch.stack(steps, 1) - full[:, 11:29]).abs().max() < 1e-12


@pytest.mark.parametrize("engine", [False, True], ids=["model's own", "the engine's"])
def test_a_bf16_cache_decodes_like_the_bf16_forward(engine):
    """Weights and cache in bf16: the cached decode and the uncached forward round differently, but stay within 3% of
    the logit scale of each other and pick the same next token almost everywhere."""
    model = make(dtype=torch.float32, **VARIANTS["vha"]).to(torch.bfloat16)
    if engine:
        use_engine(model)
    x = torch.randint(0, 37, (2, 30), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = model(x)[0].float()
        caches = model.setup_cache(batch_size=2, max_len=30)
        steps = [model.prefill(x[:, :12])] + [model.decode_one_token(x[:, p:p + 1], p) for p in range(12, 29)]
    cached = torch.stack(steps, 1).float()
    assert caches[0].k.dtype == torch.bfloat16
    assert (cached - full[:, 11:29]).abs().max() <= 0.03 * full.abs().max()
    assert (cached.argmax(-1) == full[:, 11:29].argmax(-1)).float().mean() >= 0.9


@pytest.mark.parametrize("attend", [one_token_attention, decode_attention], ids=["model's own", "the engine's"])
def test_one_token_attention_matches_plain_attention_float64(attend):
    torch.manual_seed(0)
    for H_kv in (1, 2, 4, 16):
        q = torch.randn(3, 16, 1, 32, dtype=torch.float64)
        k, v = torch.randn(2, 3, H_kv, 100, 32, dtype=torch.float64)
        for start in (k.size(2) - 1, torch.tensor([k.size(2) - 1])):  # eager (the past), static (masked)
            assert (attend(q, k, v, start) - plain_attention(q, k, v)).abs().max() < 1e-13


def test_generate_greedy_is_argmax_of_full_forward():
    model = make(**VARIANTS["vha"])
    prompt = torch.randint(0, 37, (2, 5))
    out = generate(model, prompt, max_new_tokens=10, temperature=0)
    seq = prompt
    with torch.no_grad():
        for _ in range(10):
            seq = torch.cat([seq, model(seq)[0][:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(out, seq)
    gen = torch.Generator().manual_seed(1)
    sampled = generate(model, prompt, max_new_tokens=10, temperature=1.0, top_k=5, generator=gen)
    assert sampled.shape == (2, 15) and torch.equal(sampled[:, :5], prompt)


def test_cost_accounting_by_hand():
    cfg = dict(vocab_size=100, block_size=64, n_layer=3, n_embd=64, n_head=8, n_kv_head=2, mlp_hidden=96)
    T, D, d = 64, 64, 8
    gqa, vha = GPT(GPTConfig(**cfg)), GPT(GPTConfig(attn="vha", vha_postmix_rank=2, **cfg))
    attn_flops = 2 * 8 * d * T
    gqa_macs = D * d * (8 + 4) + 8 * d * D + 3 * D * 96
    vha_macs = D * d * (4 + 4) + 8 * d * D + 3 * D * 96 + 8 * d * d + 2 * 8 * 2 * d
    lm_head = 2 * D * 128  # vocab 100 runs padded to 128 = 64 * ceil(100 / 64) rows
    assert flops_per_token(gqa.cfg, T) == 3 * (2 * gqa_macs + attn_flops) + lm_head
    assert flops_per_token(vha.cfg, T) == 3 * (2 * vha_macs + attn_flops) + lm_head
    assert flops_per_token(vha.cfg, T, training=True) == 3 * flops_per_token(vha.cfg, T)
    assert kv_bytes_per_token(gqa.cfg, torch.bfloat16) == 3 * 2 * 2 * 8 * 2
    assert kv_bytes_per_token(gqa.cfg, torch.float32) == 2 * kv_bytes_per_token(gqa.cfg, torch.bfloat16)
    n_embed = 128 * 64  # the padded rows are parameters too
    assert gqa.num_params() - gqa.num_params(non_embedding=True) == n_embed  # tied: counted once
    per_layer_extra = 2 * d * d + 2 * 8 * 2 - 4 * d * D  # premix + U, V - the 4 missing q heads
    assert vha.num_params() - gqa.num_params() == 3 * per_layer_extra


def test_vha_health_signals():
    model = make(scramble=False, **VARIANTS["vha"])
    h = vha_health(model, torch.randint(0, 37, (2, 16)))
    assert h["postmix_sigma_max"] == 0 and h["postmix_offdiag_share"] == 0 and h["postmix_rel_delta"] == 0
    d = model.cfg.head_dim
    assert h["premix_dev"] == pytest.approx(0.1 / math.sqrt(d) * d, rel=0.3)  # ||0.1/sqrt(d) N||_F ~ 0.1 sqrt(d)
    assert 1.0 < h["premix_group_div"] < 3.0  # independent draws: about 2
    scrambled = vha_health(make(**VARIANTS["vha"]), torch.randint(0, 37, (2, 16)))
    assert scrambled["postmix_sigma_max"] > 0.1 and 0 < scrambled["postmix_offdiag_share"] < 1
    assert scrambled["postmix_rel_delta"] > 0.01
    assert vha_health(make(**VARIANTS["gqa"])) == {}


@pytest.mark.parametrize("name", ["gqa", "vha"])
def test_fused_projections_equal_separate_ones_float64(name):
    """x [W_q; W_k; W_v]^T split by columns == x W_q^T, x W_k^T, x W_v^T (and gate/up alike); split and fuse
    are inverses, so a checkpoint with separate projections loads into exactly the same model."""
    model = make(attn=name, n_head=8, n_kv_head=2)
    cfg, state = model.cfg, model.state_dict()
    parts = split_projections(state, cfg)
    assert not any("qkv_proj" in k or "gate_up_proj" in k for k in parts)
    assert {k: v.tolist() for k, v in fuse_projections(parts).items()} == {k: v.tolist() for k, v in state.items()}
    x = torch.randn(2, 5, cfg.n_embd, dtype=torch.float64)
    a, mlp = model.blocks[1].attn, model.blocks[1].mlp
    q, k, v = a.qkv_proj(x).split(a.qkv_split, dim=-1)
    for got, key in ((q, "q_proj"), (k, "k_proj"), (v, "v_proj")):
        assert torch.allclose(got, x @ parts[f"blocks.1.attn.{key}.weight"].t(), rtol=0, atol=1e-14)
    ref = (F.silu(x @ parts["blocks.1.mlp.gate_proj.weight"].t())
           * (x @ parts["blocks.1.mlp.up_proj.weight"].t())) @ mlp.down_proj.weight.t()
    assert torch.allclose(mlp(x), ref, rtol=0, atol=1e-14)


def test_decode_layout_changes_memory_order_only():
    model = make(attn="gqa", n_head=8, n_kv_head=2)
    x = torch.randint(0, 37, (2, 9))
    before, state = generate(model, x, 6, temperature=0), {k: v.clone() for k, v in model.state_dict().items()}
    logits = model(x)[0]
    use_decode_layout(model)
    w = model.blocks[0].attn.qkv_proj.weight
    assert w.shape == state["blocks.0.attn.qkv_proj.weight"].shape and w.t().is_contiguous() and not w.is_contiguous()
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert torch.allclose(model(x)[0], logits, rtol=0, atol=1e-12)
    assert torch.equal(generate(model, x, 6, temperature=0), before)


# ---- the vocab is padded to a multiple of 64 inside the model; callers only ever see the tokenizer's ids ----
@pytest.mark.parametrize("vocab, padded", [(37, 64), (64, 64), (65, 128), (50257, 50304)])  # 50257: GPT-2 BPE
@pytest.mark.parametrize("tied", [True, False])
def test_padded_rows_exist_but_no_padded_id_is_ever_returned(vocab, padded, tied):
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=vocab, block_size=16, n_layer=1, n_embd=16, n_head=2, n_kv_head=1,
                          tie_embeddings=tied)).eval()
    assert model.cfg.padded_vocab == padded and model.cfg.vocab_size == vocab
    assert model.embed.weight.shape == model.lm_head.weight.shape == (padded, 16)
    assert (torch.count_nonzero(model.lm_head.weight[vocab:]) == 0
            and torch.count_nonzero(model.lm_head.weight[:vocab]) > 0)
    # padded rows that would win every argmax and take all the probability, were they not sliced off
    with torch.no_grad():
        model.lm_head.weight[vocab:] = 1e3 * torch.randn(padded - vocab, 16)
    x = torch.randint(0, vocab, (2, 6))
    logits, loss = model(x, x)
    assert logits.shape == (2, 6, vocab) and torch.isfinite(loss)
    model.setup_cache(2, 8)
    assert model.prefill(x).shape == model.decode_one_token(x[:, :1], 6).shape == (2, vocab)
    for temperature, top_k in ((0, None), (1.0, None), (1.0, 3)):
        out = generate(model, x, 8, temperature=temperature, top_k=top_k, generator=torch.Generator().manual_seed(0))
        assert int(out.max()) < vocab


def unpadded_reference(model, idx):
    """The model without padding, by hand: embedding and LM head from the first vocab_size rows only.
    -> (B, T, vocab)"""
    V, c = model.cfg.vocab_size, model.cfg
    cos, sin = rope_cos_sin(torch.arange(idx.size(1)), c.rope_dim, c.rope_theta, model.embed.weight.dtype)
    x = model.embed.weight[:V][idx]  # (B, T, D): a (V, D) table
    for block in model.blocks:
        x = block(x, cos, sin)
    return model.norm(x) @ model.lm_head.weight[:V].t()  # (B, T, V)


@pytest.mark.parametrize("tied", [True, False])
def test_padded_logits_loss_and_gradients_equal_the_unpadded_model_float64(tied):
    model = make(vocab_size=37, tie_embeddings=tied, **VARIANTS["vha"])  # scrambled: the padded rows are non-zero too
    assert torch.count_nonzero(model.lm_head.weight[37:]) > 0
    x, y = torch.randint(0, 37, (2, 2, 13)).unbind(0)
    y[0, :4] = -1  # ignored targets stay ignored
    logits, loss = model(x, y)
    want = unpadded_reference(model, x)
    assert logits.shape == want.shape == (2, 13, 37) and (logits - want).abs().max() < 1e-12
    keep = y >= 0  # cross-entropy by hand over the 37 real ids: logsumexp - the target's logit
    nll = want.logsumexp(-1) - want.gather(-1, y.clamp_min(0)[..., None])[..., 0]  # (B, T)
    assert abs(loss.item() - nll[keep].mean().item()) < 1e-12
    loss.backward()
    for w in (model.embed.weight, model.lm_head.weight):  # never looked up, sliced off: no gradient
        assert torch.count_nonzero(w.grad[37:]) == 0 and torch.count_nonzero(w.grad[:37]) > 0


def test_one_seed_gives_variants_the_same_init_where_shapes_agree():
    """init_weights seeds each parameter and head block by name: MHA, GQA-2 and VHA built after the same
    torch.manual_seed share the embedding, MLPs, the KV heads they have in common and W_o; another seed differs."""
    def build(seed=100, **kw):
        torch.manual_seed(seed)
        return dict(GPT(GPTConfig(vocab_size=275, block_size=49, n_layer=2, n_embd=64, n_head=8, head_dim=8,
                                  **kw)).named_parameters())
    mha, gqa2, vha = build(n_kv_head=8, attn="gqa"), build(n_kv_head=2, attn="gqa"), build(n_kv_head=2, attn="vha")
    # rows: q heads (8 or VHA's 4 physical), then k heads, then v heads, 8 rows each
    qkv = "blocks.1.attn.qkv_proj.weight"
    for name in ("embed.weight", "blocks.0.mlp.gate_up_proj.weight", "blocks.1.mlp.down_proj.weight",
                 "blocks.0.attn.o_proj.weight"):
        assert torch.equal(mha[name], gqa2[name]) and torch.equal(vha[name], gqa2[name]), name
    assert torch.equal(mha[qkv][64:80], gqa2[qkv][64:80])  # k heads 0, 1
    # q heads 0-3; k, v
    assert torch.equal(vha[qkv][:32], gqa2[qkv][:32]) and torch.equal(vha[qkv][32:64], gqa2[qkv][64:96])
    assert not torch.equal(mha[qkv][64:72], mha[qkv][72:80])  # heads are not copies of each other
    other = build(seed=101, n_kv_head=2, attn="gqa")
    assert not torch.equal(other["embed.weight"], gqa2["embed.weight"])
    torch.manual_seed(100)
    a, b = (GPT(GPTConfig(vocab_size=64, n_layer=1, n_embd=32, n_head=4, n_kv_head=2)),
            GPT(GPTConfig(vocab_size=64, n_layer=1, n_embd=32, n_head=4, n_kv_head=2)))
    # two models in a row still differ: the seed is drawn, not read
    assert not torch.equal(a.embed.weight, b.embed.weight)
    assert abs(gqa2["blocks.0.mlp.gate_up_proj.weight"].std().item() - 0.02) < 0.001
