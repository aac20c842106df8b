"""
What the engine puts in place on the model it runs (GPT.set_decode, through use_engine): the
one-token attention, each KV head read once for its group (SDPA, or our C++ op, as the plan
chose), and the KV memory, every layer's cache in one allocation of 2 MB pages;
and the decode weight layout. Each is the same math as model.py's own path along another road
(tests/test_model.py and tests/test_mla_mfa.py check them in float64).

    use_engine(model, "nanovha")   # model.decode_one_token now runs our op over paged memory
"""
import functools
import math
import mmap

import torch
import torch.nn as nn
import torch.nn.functional as F


CACHE_BLOCK = 64  # KV caches hold whole blocks of this many positions: a compiled step's length is a multiple


def cache_zeros(numel, dtype, device):
    """numel zeros (1-D) to hold every layer's KV cache. On a Linux CPU an anonymous mapping with
    2 MB pages asked for (transparent huge pages): a decode step streams the whole cache, and in
    4 KB pages every 4 KB of it is a TLB miss and a restart of the hardware prefetcher
    (docs/benchmarks.md has what it changes)."""
    nbytes = numel * dtype.itemsize
    if device.type != "cpu" or not hasattr(mmap, "MADV_HUGEPAGE") or nbytes < (2 << 20):
        return torch.zeros(numel, dtype=dtype, device=device)
    memory = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # zeros, not yet touched
    memory.madvise(mmap.MADV_HUGEPAGE)
    return torch.frombuffer(memory, dtype=torch.uint8).view(dtype)  # the tensor keeps the mapping alive


class PagedKV:
    """A model's KV memory (GPT.set_decode): every layer's cache as consecutive views of one
    cache_zeros allocation, max_len rounded up to whole blocks of CACHE_BLOCK positions (the
    compiled step's cache length is a multiple of it). tensors: the latest [k0, v0, k1, v1, ...],
    what a compiled step takes as its inputs."""

    def __init__(self):
        self.tensors = []

    def __call__(self, batch_size, max_len, dims, dtype, device):
        """dims: each layer's (heads, k_dim, v_dim) -> [(k (B, heads, T, k_dim), v (B, heads, T, v_dim))]."""
        max_len = -(-max_len // CACHE_BLOCK) * CACHE_BLOCK
        shapes = [(batch_size, heads, max_len, width) for heads, k_dim, v_dim in dims for width in (k_dim, v_dim)]
        sizes = [math.prod(shape) for shape in shapes]
        memory = cache_zeros(sum(sizes), dtype, device)
        self.tensors = [part.view(shape) for part, shape in zip(memory.split(sizes), shapes)]
        return list(zip(self.tensors[0::2], self.tensors[1::2]))


DECODE_KERNELS = ("sdpa", "nanovha", "nanovha_dot")  # the static decode step's one-token attention, safest first
OP_PATHS = {"nanovha": 0, "nanovha_dot": 1}  # the path each asks our op for (csrc/): its default, or VDPBF16PS


def static_attention(q, k, v, start_pos, kernel="sdpa", scale=None):
    """One decoded token over a static cache: q (B, H_kv, G, d), k (B, H_kv, T, d), v (B, H_kv,
    T, d_v), positions 0..start_pos written ((1,) tensor) -> (B, H_kv, G, d_v), by `kernel`:
    "sdpa" (model.py's own, each KV head's group as its query rows) or ours (csrc/, once kernel.py
    has loaded it; "nanovha_dot" asks for its VDPBF16PS path), as the plan timed them."""
    if kernel in OP_PATHS and q.device.type == "cpu":
        return torch.ops.nanovha.decode_attention(q, k, v, start_pos, scale or q.size(-1) ** -0.5, OP_PATHS[kernel])
    visible = torch.arange(k.size(2), device=k.device) <= start_pos  # (T,): the positions written
    return F.scaled_dot_product_attention(q, k, v, attn_mask=visible[None], scale=scale)


def decode_attention(q, k, v, start_pos, scale=None, kernel="sdpa"):
    """One decoded token q (B, H, 1, d) over the cache k, v (B, H_kv, T, d) -> (B, H, 1, d_v),
    each KV head read once for its whole group, by `kernel` (static_attention). start_pos a (1,)
    tensor: the static (compiled) step, k and v the whole cache; an int (eager): they hold the past."""
    B, H, _, d = q.shape
    if not isinstance(start_pos, torch.Tensor):  # every position held is visible
        start_pos = torch.tensor([k.size(2) - 1], device=q.device)
    qg = q.view(B, k.size(1), H // k.size(1), d)  # (B, H_kv, group, d): heads j = g*group + i
    return static_attention(qg, k, v, start_pos, kernel, scale).view(B, H, 1, v.size(-1))  # (B, H, 1, d_v)


def use_engine(model, kernel="sdpa"):
    """Puts the engine in place on model (GPT.set_decode): its one-token attention by `kernel`,
    and paged KV memory (kept where the model has it already: a compiled step reads its tensors)."""
    memory = model.kv_memory if isinstance(model.kv_memory, PagedKV) else PagedKV()
    return model.set_decode(functools.partial(decode_attention, kernel=kernel), memory)


@torch.no_grad()
def use_decode_layout(model):
    """Stores every Linear weight W (out, in) as a transposed-contiguous view: the same values,
    shape and state_dict, in (in, out) order. At batch 1 each weight is read once per token, by x
    @ W^T, which streams W faster in this order on CPU (bench_decode.py --weight_layout=out_in
    times the other). Returns model."""
    for m in model.modules():
        if isinstance(m, nn.Linear):
            m.weight.data = m.weight.data.t().contiguous().t()
    return model
