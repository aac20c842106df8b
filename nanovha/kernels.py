"""
The fast paths model.py calls, beside the attention it teaches: the same math along another road
(tests/test_model.py and tests/test_mla_mfa.py check each against plain_attention, in float64).
Torch only: model.py imports it.

    sdpa                       training and prefill: PyTorch's fused attention over grouped heads
    decode_attention           one decoded token: which of the ones below runs
    grouped_decode_attention   eager one-token decode: one matmul per KV head, the group's query heads as its rows
    static_attention           the static (compiled) decode step: the kernel chosen for it (decode_kernel_for)
    split_kv_attention           SDPA per KV head, the cache cut into chunks when there are fewer KV heads than
                                 threads (flash-decoding)
    torch.ops.nanovha.decode_attention   or ours (nanovha/csrc/decode_attention.cpp, loaded by
                                 nanovha/decode_kernel.py): the group as SIMD lanes, for a few query rows
    use_decode_layout(model)   Linear weights stored (in, out): streamed faster by x @ W^T at batch 1 on a CPU
    kv_memory, cache_zeros     the memory of the KV caches: one allocation, in 2 MB pages on a Linux CPU
"""
import contextlib
import math
import mmap

import torch
import torch.nn as nn
import torch.nn.functional as F


def kv_expand_needed(device_type, dtype, H_q, H_kv):
    """True only for grouped heads in float32 on CUDA, where no fused SDPA kernel takes
    enable_gqa."""
    return device_type == "cuda" and dtype == torch.float32 and H_q != H_kv


def sdpa(q, k, v, is_causal=False, dropout_p=0.0, expand_kv=None):
    """F.scaled_dot_product_attention over grouped heads: q (B, H_q, Tq, hd), k/v (B, H_kv, Tk,
    hd)
    -> (B, H_q, Tq, hd). expand_kv=None decides by device and (autocast) dtype; True/False forces it (the tests run
    the CUDA branch on CPU)."""
    if expand_kv is None:
        dtype = torch.get_autocast_dtype("cuda") if q.is_cuda and torch.is_autocast_enabled("cuda") else q.dtype
        expand_kv = kv_expand_needed(q.device.type, dtype, q.size(1), k.size(1))
    # SPECIAL CASE, fp32 on CUDA: expand, else GQA runs the math path (flash/cuDNN: fp16/bf16 only;
    # mem-efficient: no GQA, pytorch#139586)
    if expand_kv:
        group = q.size(1) // k.size(1)
        k = k.repeat_interleave(group, dim=1)  # (B, H_q, Tk, hd): head j reads KV head j // group
        v = v.repeat_interleave(group, dim=1)
    return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, dropout_p=dropout_p,
                                          enable_gqa=not expand_kv)


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


def kv_memory(batch_size, max_len, dims, dtype, device):
    """[(k, v)] per layer, zeroed, consecutive views of one cache_zeros allocation: dims holds each
    layer's (heads, k_dim, v_dim); k (B, heads, max_len, k_dim), v (B, heads, max_len, v_dim)."""
    shapes = [(batch_size, heads, max_len, width) for heads, k_dim, v_dim in dims for width in (k_dim, v_dim)]
    sizes = [math.prod(shape) for shape in shapes]
    parts = [part.view(shape) for part, shape in zip(cache_zeros(sum(sizes), dtype, device).split(sizes), shapes)]
    return list(zip(parts[0::2], parts[1::2]))


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


DECODE_KERNELS = ("sdpa", "nanovha")  # the static decode step's candidates, the safe one first
_decode_kernel = ["sdpa"]


@contextlib.contextmanager
def decode_kernel_for(name):
    """Within it, the static decode step calls kernel `name` (a compiled step bakes in the one
    set while it is traced; nanovha/plan.py times the two and picks)."""
    assert name in DECODE_KERNELS, name
    _decode_kernel.append(name)
    try:
        yield
    finally:
        _decode_kernel.pop()


def static_attention(q, k, v, start_pos, scale=None):
    """One decoded token over a static cache: q (B, H_kv, G, d), k (B, H_kv, T, d), v (B, H_kv,
    T, d_v), positions 0..start_pos written ((1,) tensor) -> (B, H_kv, G, d_v), by the kernel in
    force (decode_kernel_for)."""
    if _decode_kernel[-1] == "nanovha" and q.device.type == "cpu":
        return torch.ops.nanovha.decode_attention(q, k, v, start_pos, scale or q.size(-1) ** -0.5)
    visible = torch.arange(k.size(2), device=k.device) <= start_pos  # (T,): the positions written
    return split_kv_attention(q, k, v, visible, scale)


def grouped_decode_attention(q, k, v):
    """One-token decode (Tq=1) with one matmul per KV head: reads each cached K/V once, however
    many query heads share it (CPU SDPA with enable_gqa does per-query-head work at Tq=1). q: (B,
    H_q, 1, hd), k/v hold exactly the past. The compiled step does the same with SDPA over the
    group as query rows (attend)."""
    B, H_q, _, hd = q.shape
    H_kv = k.size(1)
    # (B, H_kv, group, hd): heads j = g*group + i; scaled
    qg = q.view(B, H_kv, H_q // H_kv, hd) * hd ** -0.5
    # (B, H_kv, group, Tk): scaling q is cheaper than scaling Tk scores
    scores = qg @ k.transpose(-2, -1)
    out = scores.softmax(dim=-1) @ v  # (B, H_kv, group, hd)
    return out.view(B, H_q, 1, hd)


def decode_attention(q, k, v, start_pos):
    """One decoded token q (B, H, 1, d) over the cache k, v (B, H_kv, T, d) -> (B, H, 1, d), each
    KV head read once for its whole group. start_pos a (1,) tensor: the static (compiled) step, k
    and v the whole cache, positions after start_pos masked; an int: k and v hold exactly the
    past (eager)."""
    if not isinstance(start_pos, torch.Tensor):
        return grouped_decode_attention(q, k, v)
    B, H, _, d = q.shape
    qg = q.view(B, k.size(1), H // k.size(1), d)  # (B, H_kv, group, d): heads j = g*group + i
    return static_attention(qg, k, v, start_pos).view(B, H, 1, d)  # (B, H_kv, group, d) -> (B, H, 1, d)


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
