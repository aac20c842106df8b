"""The CUDA paths at their real shapes, on the CPU without allocating: config/fineweb/vha.py (120M, 32 x 1024 tokens
a micro-batch) and a 128K KV cache run forward, backward, prefill and decode on the meta device, where a hidden
.item() (a host sync) or a tensor made on another device fails, and the memory of the cache and of a training step
is counted from shapes. sdpa's CUDA branch (K/V expanded in float32) runs on fake CUDA tensors, which a CPU build of
torch accepts. (The whole model on fake CUDA tensors does not run on a CPU build: rope_cos_sin's float64 copy asks
for a real CUDA device. Named in docs/gpu.md.)"""
import pytest
import torch
import torch.nn.functional as F

import model
from model import GPT, GPTConfig
from nanovha.config import config_file_values
from nanovha.costs import kv_bytes_per_token

CONTEXT_128K = 131072
GPT2_VOCAB = 50257


def fineweb(name):
    """GPTConfig and micro-batch (rows, tokens) of config/fineweb/<name>.py (vha's twins are diffs applied after it)."""
    values = config_file_values("config/fineweb/vha.py")
    if name != "vha":
        values = {**values, **config_file_values(f"config/fineweb/{name}.py", values)}
    fields = {k: v for k, v in values.items() if k in GPTConfig.__dataclass_fields__}
    return GPTConfig(**fields, vocab_size=GPT2_VOCAB), (values["batch_size"], values["block_size"])


def on_meta(cfg):
    with torch.device("meta"):
        return GPT(cfg)


def saved_activation_bytes(net, fn):
    """Bytes autograd saves for the backward during fn() (parameters and their views left out: counted apart)."""
    params, kept = {id(p) for p in net.parameters()}, {}

    def pack(t):
        base = t if t._base is None else t._base  # a view saved: its base is what stays in memory, once
        if id(base) not in params:
            kept[id(base)] = base
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, sum(t.numel() * t.element_size() for t in kept.values())


def test_a_training_step_at_the_real_shape_runs_on_meta_and_fits_80_gb():
    """Forward and backward of a whole micro-batch (32 x 1024) on meta: no .item(), no stray device. Memory: float32
    weights, gradients and AdamW's two moments (16 B a parameter) plus the activations eager float32 autograd saves,
    an upper bound of the bf16 compiled step; the docs promise one 80 GB GPU."""
    cfg, (rows, tokens) = fineweb("vha")
    net = on_meta(cfg).train()
    idx = torch.zeros(rows, tokens, dtype=torch.long, device="meta")
    (logits, loss), activations = saved_activation_bytes(net, lambda: net(idx, idx))
    assert logits.shape == (rows, tokens, GPT2_VOCAB) and loss.shape == () and loss.device.type == "meta"
    loss.backward()
    assert all(p.grad is not None and p.grad.shape == p.shape for p in net.parameters())
    state = 16 * net.num_params()
    logits_bytes = rows * tokens * cfg.padded_vocab * 4  # the float32 logits alone: a floor for what is saved
    assert activations > logits_bytes and state + activations < 80e9


@pytest.mark.parametrize("name", ["vha", "gqa2"])  # unfolded VHA, and the shape it folds into
def test_prefill_and_decode_with_a_128k_cache_on_meta(name):
    """A bf16 cache of 131,072 positions, counted not allocated: its bytes are the model's own per-token accounting
    x 128K; a 32K prefill and the one-token step at the last position (int, and the static (1,) tensor of the
    CUDA-graph path) keep the shapes."""
    cfg, _ = fineweb(name)
    net = on_meta(cfg).to(torch.bfloat16).eval()
    caches = net.setup_cache(1, CONTEXT_128K)
    cache_bytes = sum(t.numel() * t.element_size() for c in caches for t in (c.k, c.v))
    assert all(c.k.dtype == torch.bfloat16 and c.k.device.type == "meta" for c in caches)
    assert cache_bytes == kv_bytes_per_token(cfg, torch.bfloat16) * CONTEXT_128K
    assert cache_bytes < 2e9  # 16Q/2KV at 128K: well inside any GPU next to 120M parameters
    prompt = torch.zeros(1, 32768, dtype=torch.long, device="meta")
    assert net.prefill(prompt).shape == (1, GPT2_VOCAB)
    token = torch.zeros(1, 1, dtype=torch.long, device="meta")
    assert net.decode_one_token(token, CONTEXT_128K - 1).shape == (1, GPT2_VOCAB)
    pos = torch.tensor([CONTEXT_128K - 1], device="meta")
    assert net.decode_one_token(token, pos).shape == (1, GPT2_VOCAB)
    with pytest.raises(ValueError, match="exceed the cache"):
        net.decode_one_token(token, CONTEXT_128K)


def test_sdpa_takes_its_cuda_branch_on_fake_cuda_tensors(monkeypatch):
    """On CUDA in float32 no fused kernel takes enable_gqa, so sdpa expands K/V to the query heads; in bf16 it passes
    the 2 KV heads with enable_gqa. Traced on fake CUDA tensors: the arguments the CUDA kernel would get."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    seen, real = [], F.scaled_dot_product_attention

    def record(q, k, v, **kw):
        seen.append((q.device.type, k.size(1), q.dtype, kw["enable_gqa"]))
        return real(q, k, v, **kw)
    monkeypatch.setattr(model.F, "scaled_dot_product_attention", record)
    with FakeTensorMode():
        for dtype in (torch.float32, torch.bfloat16):
            q = torch.empty(2, 16, 1024, 64, device="cuda", dtype=dtype)  # (B, H_q, T, hd)
            kv = torch.empty(2, 2, 1024, 64, device="cuda", dtype=dtype)  # (B, H_kv, T, hd)
            assert model.sdpa(q, kv, kv, is_causal=True).shape == q.shape
    assert seen == [("cuda", 16, torch.float32, False), ("cuda", 2, torch.bfloat16, True)]
