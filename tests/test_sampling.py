"""What sampling promises: greedy is the argmax, top-k never leaves the k best, a seed reproduces its text, and the
frequencies at temperature T follow softmax(logits / T)."""
import math

import pytest
import torch

from nanovha.generate import generate, sample_next
from test_model import make


def test_temperature_zero_and_top_k_one_are_the_argmax():
    logits = torch.randn(64, 50, generator=torch.Generator().manual_seed(0))
    gen = torch.Generator().manual_seed(1)
    assert torch.equal(sample_next(logits, 0.0), logits.argmax(-1))
    assert torch.equal(sample_next(logits, 1.3, top_k=1, generator=gen), logits.argmax(-1))


@pytest.mark.parametrize("k", [2, 5, 17])
def test_top_k_never_leaves_the_k_best(k):
    logits = torch.randn(8, 40, generator=torch.Generator().manual_seed(k))
    best = logits.topk(k).indices  # (8, k)
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        picked = sample_next(logits, 2.0, top_k=k, generator=gen)  # a high temperature: the tail would show
        assert (best == picked[:, None]).any(-1).all()


def test_frequencies_follow_the_tempered_softmax():
    """200,000 draws from one row at T = 0.7 against softmax(logits / T): Pearson's chi-square, 9 degrees of
    freedom; 27.9 is its 0.999 quantile (a fixed seed, so the test is deterministic)."""
    logits = torch.tensor([[1.0, 0.5, 0.0, -0.5, 2.0, 1.5, -1.0, 0.2, 0.8, -0.2]])
    n, T = 200_000, 0.7
    gen = torch.Generator().manual_seed(3)
    draws = torch.cat([sample_next(logits.expand(10_000, -1), T, generator=gen) for _ in range(n // 10_000)])
    observed = torch.bincount(draws, minlength=10).double()
    expected = n * (logits[0].double() / T).softmax(-1)
    chi2 = float(((observed - expected) ** 2 / expected).sum())
    assert chi2 < 27.9, chi2
    # the same draws at T = 1 would be far off: the test can tell the temperature
    wrong = n * logits[0].double().softmax(-1)
    assert float(((observed - wrong) ** 2 / wrong).sum()) > 1000


def test_a_seed_reproduces_its_text_and_another_seed_does_not():
    model = make(torch.float32, attn="vha", n_head=8, n_kv_head=2).eval()
    prompt = torch.tensor([[1, 2, 3]])

    def text(seed):
        with torch.no_grad():
            return generate(model, prompt, 30, temperature=1.0, top_k=10, generator=torch.Generator().manual_seed(seed))

    assert torch.equal(text(7), text(7)) and not torch.equal(text(7), text(8))


def test_top_k_past_the_vocab_is_the_whole_vocab():
    logits = torch.randn(4, 6, generator=torch.Generator().manual_seed(0))
    a = sample_next(logits, 1.0, top_k=1000, generator=torch.Generator().manual_seed(5))
    b = sample_next(logits, 1.0, top_k=None, generator=torch.Generator().manual_seed(5))
    assert torch.equal(a, b) and not math.isnan(float(a.float().mean()))


def test_generate_times_the_prefill_and_every_step_of_the_loop():
    """seconds: the prefill, the decode loop and its tokens (the whole-loop speed, on any device), and on a CPU one
    step per token, which together make up the loop."""
    model = make(torch.float32, attn="vha", n_head=8, n_kv_head=2).eval()
    seconds = {}
    with torch.no_grad():
        out = generate(model, torch.tensor([[1, 2, 3]]), 12, temperature=0, seconds=seconds)
    assert out.shape == (1, 15) and seconds["tokens"] == 12 and len(seconds["steps"]) == 12
    assert seconds["prefill"] > 0 and seconds["decode"] > 0 and min(seconds["steps"]) > 0
    assert sum(seconds["steps"]) == pytest.approx(seconds["decode"], rel=0.05)
