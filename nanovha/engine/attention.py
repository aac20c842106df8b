"""
What the engine puts in place on the model it runs (GPT.set_decode, through use_engine): the
one-token attention, each KV head read once for its group (SDPA split along the cache, or our C++
op, as the plan chose), and the KV memory, every layer's cache in one allocation of 2 MB pages;
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


CACHE_BLOCK = 64  # KV caches hold whole blocks of this many positions (see split_kv_attention)


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


@torch.compiler.assume_constant_result
def cpu_threads():
    """torch's CPU thread count, a constant to torch.compile (a step is compiled for one count)."""
    return torch.get_num_threads()


def split_kv_attention(q, k, v, visible, scale=None, splits=None):
    """One-token decode over a static cache, flash-decoding style -> (B, H_kv, G, d_v).
    q (B, H_kv, G, d): each KV head's G query heads as query rows; k (B, H_kv, T, d),
    v (B, H_kv, T, d_v); visible (T,): the positions written.
    A CPU SDPA call works on one (batch, head) per thread, so with fewer KV heads than threads
    (MQA, MFA, MLA's latent) the cache is cut into S chunks along T, each attended on its own,
    and the chunks' outputs are merged by their log-sum-exps: out = sum_s softmax_s(lse_s) out_s
    (exact, up to rounding). splits=None: as many chunks as idle threads; the tests set it."""
    B, H_kv, G, d = q.shape
    T = k.size(2)
    if q.device.type != "cpu":  # a GPU runs many heads' blocks at once: no split
        S = 1
    else:
        S = cpu_threads() // (B * H_kv) if splits is None else splits
        S = 1 << (min(S, CACHE_BLOCK).bit_length() - 1) if S >= 1 else 1  # a power of 2
    if S < 2 or T % S or v.size(-1) != d:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=visible[None], scale=scale)
    n = T // S
    # (B, H_kv*S, G, d): chunks as heads
    qs = q[:, :, None].expand(B, H_kv, S, G, d).reshape(B, H_kv * S, G, d)
    # (B, H_kv*S, n, d): chunk s of KV head g
    ks, vs = k.view(B, H_kv * S, n, d), v.view(B, H_kv * S, n, d)
    seen = visible.view(S, n)  # (S, n)
    bias = torch.zeros(S, n, dtype=q.dtype, device=q.device).masked_fill(~seen, float("-inf"))
    bias = bias[None, :, None].expand(H_kv, S, 1, n).reshape(1, H_kv * S, 1, n)  # (1, H_kv*S, 1, n)
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(qs, ks, vs, 0.0, False,
                                                                           attn_mask=bias, scale=scale)
    # a chunk not yet written
    lse = lse.view(B, H_kv, S, G).masked_fill(~seen.any(dim=1)[:, None], float("-inf"))
    acc = torch.promote_types(q.dtype, torch.float32)  # bf16 chunks merge in float32
    w = lse.to(acc).softmax(dim=2)[..., None]  # (B, H_kv, S, G, 1): chunk s's share of the softmax mass
    return (out.view(B, H_kv, S, G, d).to(acc) * w).sum(dim=2).to(q.dtype)  # (B, H_kv, G, d)


DECODE_KERNELS = ("sdpa", "nanovha")  # the static decode step's one-token attention, the safe one first


def static_attention(q, k, v, start_pos, kernel="sdpa", scale=None):
    """One decoded token over a static cache: q (B, H_kv, G, d), k (B, H_kv, T, d), v (B, H_kv,
    T, d_v), positions 0..start_pos written ((1,) tensor) -> (B, H_kv, G, d_v), by `kernel`
    (the attention's decode_kernel, set by the plan): "sdpa" (split_kv_attention) or "nanovha"
    (our C++ op, nanovha/engine/csrc/, once nanovha/engine/kernel.py has loaded it)."""
    if kernel == "nanovha" and q.device.type == "cpu":
        return torch.ops.nanovha.decode_attention(q, k, v, start_pos, scale or q.size(-1) ** -0.5)
    visible = torch.arange(k.size(2), device=k.device) <= start_pos  # (T,): the positions written
    return split_kv_attention(q, k, v, visible, scale)


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
