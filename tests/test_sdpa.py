"""Which SDPA kernel the GQA/VHA paths reach. CPU has a flash kernel that takes grouped KV heads (enable_gqa), as
CUDA's flash does in bf16/fp16; under sdpa_kernel([FLASH_ATTENTION]) a step that would fall back to the math path
raises instead. The fp32-on-CUDA special case (K/V expanded to the query heads) is checked here through model.sdpa."""
import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from model import GPT, GPTConfig, kv_expand_needed, plain_attention, sdpa
from nanovha.figures import sdpa_backends

SHAPES = {"gqa": dict(attn="gqa"), "vha": dict(attn="vha", vha_postmix_rank=2)}


def tiny(**kw):
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=64, block_size=32, n_layer=2, n_embd=64, n_head=8, n_kv_head=2, head_dim=16, **kw))


@pytest.mark.filterwarnings("ignore:Flash attention")  # the reasons it prints when it refuses
def test_flash_only_restriction_really_refuses_what_flash_cannot_take():
    """The guard the tests below rely on: math takes a value width unlike the key's, flash does not."""
    q, k, v = torch.randn(1, 4, 8, 16), torch.randn(1, 2, 8, 16), torch.randn(1, 2, 8, 8)
    with sdpa_kernel([SDPBackend.MATH]):
        F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]), pytest.raises(RuntimeError, match="No available kernel"):
        F.scaled_dot_product_attention(q, k, v, enable_gqa=True)


@pytest.mark.parametrize("name", ["gqa", "vha"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_training_step_prefill_and_decode_take_flash(name, dtype):
    """What gpu_check runs, at toy size: a training step in autocast (bf16) or fp32, a prefill and an SDPA decode
    step with weights and cache in dtype. None may reach the math path (it would raise here)."""
    model = tiny(**SHAPES[name])
    x = torch.randint(64, (2, 32))
    out = {}

    def train():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            out["loss"] = model(x, x)[1]
        out["loss"].backward()

    def serve():
        deployed = tiny(**SHAPES[name]).to(dtype).eval()  # model.py's own one-token attention: SDPA
        deployed.setup_cache(2, 32)
        out["logits"] = [deployed.prefill(x[:, :16])] + [deployed.decode_one_token(x[:, t:t + 1], t) for t in (16, 17)]

    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        used = {"train": sdpa_backends(train)[0], "serve": sdpa_backends(serve)[0]}
    assert used == {"train": ["flash"], "serve": ["flash"]}, used  # SDPA was called, and no other backend ran
    assert out["loss"].isfinite() and all(p.grad is not None for p in model.parameters() if p.requires_grad)
    assert all(lg.isfinite().all() for lg in out["logits"])
    with sdpa_kernel([SDPBackend.MATH]):  # the detector tells the math path apart
        assert sdpa_backends(serve)[0] == ["math"]


@pytest.mark.parametrize("causal", [True, False])
def test_expand_branch_equals_enable_gqa(causal):
    """The fp32-on-CUDA branch (repeat_interleave, enable_gqa=False), forced on CPU: the same outputs and gradients."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, h, 12, 16, generator=g, dtype=torch.float64, requires_grad=True) for h in (8, 2, 2))
    outs = []
    for expand in (True, False):
        y = sdpa(q, k, v, is_causal=causal, expand_kv=expand)
        outs.append((y, *torch.autograd.grad((y * y.detach().sin()).sum(), (q, k, v))))
    assert all((a - b).abs().max() < 1e-12 for a, b in zip(*outs))
    if causal:  # and both equal the readable reference
        assert (outs[0][0] - plain_attention(q, k, v)).abs().max() < 1e-12


def test_expand_is_only_for_float32_grouped_heads_on_cuda():
    assert kv_expand_needed("cuda", torch.float32, 16, 2)
    assert not kv_expand_needed("cuda", torch.bfloat16, 16, 2) and not kv_expand_needed("cuda", torch.float16, 16, 2)
    assert not kv_expand_needed("cuda", torch.float32, 16, 16)  # MHA: mem-efficient takes equal heads as they are
    assert not kv_expand_needed("cpu", torch.float32, 16, 2)  # CPU flash takes enable_gqa in every dtype
    q, k = torch.randn(1, 8, 4, 16), torch.randn(1, 2, 4, 16)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):  # on CPU the default stays the grouped flash call
        assert (sdpa(q, k, k) - sdpa(q, k, k, expand_kv=True)).abs().max() < 1e-5
