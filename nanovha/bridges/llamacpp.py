"""
llama.cpp (through llama-cpp-python) as a second CPU runtime for one of our plain GQA models, for
bench_decode.py: the model is written as GGUF by gguf.write_gguf, the context is filled by a real
prefill (llama.cpp's cache cannot be written from outside), then tokens are decoded one at a
time, each a llama_decode of one token.

    runner = LlamaCpp(model, meta, threads=2)   # None meta: stand-in tokens '[0]', '[1]', ... (speed ignores them)
    ttft = runner.fill(ctx=4096, prefill_len=2048)   # seconds for the first 2048 tokens, then the rest
    runner.step()                                    # one decoded token at position ctx, ctx+1, ...
"""
import os
import shutil
import tempfile
import time

import torch

from nanovha.bridges.gguf import write_gguf
from nanovha.bridges.qwen3 import first_mismatch, reference


def version():
    """llama-cpp-python's version, or None where it is not installed."""
    try:
        import llama_cpp
    except ImportError:
        return None
    return llama_cpp.__version__


def why_not(device_type):
    """Why llama.cpp cannot be timed beside this run, or None."""
    if version() is None:
        return "llama-cpp-python is not installed (pip install -r requirements-llamacpp.txt)"
    if device_type != "cpu":
        return f"this run is on {device_type}; llama-cpp-python is built here for the CPU"
    return None


class LlamaCpp:
    """One model in llama.cpp: its weights in the model's dtype, its KV cache in the same dtype
    as ours (llama.cpp defaults to f16), flash attention off (llama-cpp-python's default),
    `threads` threads for decode and prefill."""

    def __init__(self, model, meta=None, threads=None):
        import llama_cpp
        self.lib, self.threads = llama_cpp, threads or torch.get_num_threads()
        dtype = str(model.embed.weight.dtype).replace("torch.", "")
        # 30: ggml.h's enum (0.3.36 names no BF16)
        self.kv_type = {"float32": llama_cpp.GGML_TYPE_F32, "float16": llama_cpp.GGML_TYPE_F16,
                        "bfloat16": getattr(llama_cpp, "GGML_TYPE_BF16", 30)}[dtype]
        self.folder = tempfile.mkdtemp(prefix="nanovha_gguf_")
        self.path = os.path.join(self.folder, "model.gguf")
        write_gguf(model, self.path, meta, dtype)
        self.vocab_size, self.llm, self.gen = model.cfg.vocab_size, None, torch.Generator().manual_seed(0)
        self.ttft = {}  # prefill length -> seconds, set by the caller from fill()

    def load(self, n_ctx):
        """A fresh context with room for n_ctx positions (the cache is allocated for all of
        them)."""
        self.free()
        self.llm = self.lib.Llama(model_path=self.path, n_ctx=n_ctx, n_batch=512, n_ubatch=512, n_threads=self.threads,
                                  n_threads_batch=self.threads, type_k=self.kv_type, type_v=self.kv_type, verbose=False)
        return self

    def fill(self, ctx, prefill_len):
        """Prefills ctx random tokens (positions 0..ctx-1) in chunks of 512; returns the seconds
        the first min(ctx, prefill_len) of them took (time to first token)."""
        tokens = torch.randint(self.vocab_size, (ctx,), generator=self.gen).tolist()
        first = min(ctx, prefill_len)
        self.llm.reset()
        t0 = time.perf_counter()
        self.llm.eval(tokens[:first])
        ttft = time.perf_counter() - t0
        self.llm.eval(tokens[first:])
        return ttft

    def step(self):
        """Decodes one token at the next position (its logits are computed; llama-cpp-python
        keeps them in C)."""
        self.llm.eval([0])

    def free(self):
        if self.llm is not None:
            self.llm.close()
            self.llm = None

    def close(self):
        self.free()
        shutil.rmtree(self.folder, ignore_errors=True)


def runners(models, metas, device_type):
    """'<name>@llama.cpp' -> (LlamaCpp, name) for each of models (name -> one of our plain GQA
    models) that llama.cpp can run here; metas: name -> its dataset meta (stand-in tokens
    without). Prints what it could not time."""
    if models and (why := why_not(device_type)):
        print(f"llama.cpp: not timed: {why}")
        return {}
    out = {}
    for name, model in models.items():
        try:
            out[f"{name}@llama.cpp"] = (LlamaCpp(model, metas.get(name)), name)
        except ValueError as e:  # a model llama.cpp's qwen3 cannot express (e.g. qk_norm=False)
            print(f"llama.cpp: {name} not timed: {e}")
    if out:
        dtype = str(next(iter(models.values())).embed.weight.dtype)[6:]
        print(f"llama.cpp: llama-cpp-python {version()}, {dtype} weights and KV cache, "
              f"{torch.get_num_threads()} "
              f"threads, the context filled by a real prefill; one llama_decode per token")
    return out


@torch.no_grad()
def compare(path, model, tokens, gen_tokens, threads=1):
    """llama.cpp running the GGUF file at path (with an f32 KV cache) against model (ours,
    float32 or float64) on
    qwen3.reference's logits and greedy ids. -> (max |logit difference|, largest |logit|, None if gen_tokens greedy
    tokens are identical, else the index of the first that differs)."""
    import llama_cpp
    ours, prompt, expected = reference(model, tokens, gen_tokens)
    f32 = llama_cpp.GGML_TYPE_F32  # llama.cpp's default KV cache is f16: it alone moves logits by ~5e-4 of the largest
    llm = llama_cpp.Llama(model_path=path, n_ctx=max(len(tokens), len(prompt) + gen_tokens) + 1, n_threads=threads,
                          n_threads_batch=threads, logits_all=True, type_k=f32, type_v=f32, verbose=False)
    try:
        llm.eval(tokens)
        theirs = torch.tensor(llm.scores[:len(tokens)], dtype=torch.float64)  # (T, vocab)
        llm.reset()
        greedy = []
        for token in llm.generate(prompt, temp=0.0):  # llama.cpp's own greedy sampler
            greedy.append(token)
            if len(greedy) == gen_tokens:
                break
    finally:
        llm.close()
    return (ours - theirs).abs().max().item(), ours.abs().max().item(), first_mismatch(expected, greedy)
