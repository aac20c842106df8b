"""
Generation: the loop around a model's prefill and one-token decode (gpt-fast's generate.py,
nanochat's engine), and how the next token is drawn from the logits. Torch only.

    out = generate(model, idx, max_new_tokens, temperature=0)   # greedy
    out = generate(model, idx, 100, temperature=0.8, top_k=200, decode=compiled_step)
"""
import time

import torch


def sample_next(logits, temperature=1.0, top_k=None, generator=None):
    """logits (B, vocab) -> next token ids (B,). temperature 0 picks the argmax."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float() / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(logits.softmax(dim=-1), 1, generator=generator).squeeze(-1)


@torch.no_grad()
def generate(model, idx, max_new_tokens, temperature=1.0, top_k=None, generator=None, decode=None, seconds=None):
    """Continues idx (B, T) -> (B, T + max_new_tokens); temperature=0 is greedy. Builds a cache
    of the needed size. decode: a stand-in for model.decode_one_token (a compiled one:
    nanovha/engine/compiled.py), given the position as a (1,) tensor. seconds: a dict that gets
    the prefill's seconds, the decode loop's and its tokens, and on a CPU each step's (perf_counter)."""
    B, T = idx.shape
    model.setup_cache(B, T + max_new_tokens)
    out = torch.cat([idx, idx.new_empty(B, max_new_tokens)], dim=1)  # (B, T + max_new_tokens)
    t0 = time.perf_counter()
    logits = model.prefill(idx)
    t1 = synchronized(idx.device)
    ends = [t1]  # on a CPU, when each step ended (a GPU's steps are only queued here)
    for pos in range(T, T + max_new_tokens):
        out[:, pos] = sample_next(logits, temperature, top_k, generator)
        if pos + 1 < T + max_new_tokens and decode is None:
            logits = model.decode_one_token(out[:, pos:pos + 1], pos)
        elif pos + 1 < T + max_new_tokens:
            logits = decode(out[:, pos:pos + 1], torch.tensor([pos], device=idx.device))
        if seconds is not None and idx.device.type == "cpu":
            ends.append(time.perf_counter())
    if seconds is not None:
        steps = [b - a for a, b in zip(ends, ends[1:])]
        seconds.update(prefill=t1 - t0, decode=synchronized(idx.device) - t1, tokens=max_new_tokens, steps=steps)
    return out


def synchronized(device):
    """perf_counter once the device's queued work is done."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()
