"""
What each path of our op streams, against SDPA, for every group size the decode variants have: one
KV head's group of 1 (MHA) to 16 (MQA) query heads, 6 layers at 16K positions, head dim 32, in bf16
and float32, over copies of the caches used in turn so that they come from memory, not the last-level
cache (docs/benchmarks.md: our op's paths). "path" names the op's default path for the shape; the dot
columns time its VDPBF16PS path, asked for, where this CPU has it for the shape (bf16, groups 4-16).

    python lab/op_paths.py               # about a minute on 2 cores, after our op is built
    python lab/op_paths.py --head_dim=64
"""
import functools
import itertools
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import torch  # noqa: E402

from nanovha.config import at_least, flat_defaults, settings  # noqa: E402
from nanovha.engine import kernel as our_op  # noqa: E402
from nanovha.engine.attention import OP_PATHS, PagedKV, static_attention  # noqa: E402
from nanovha.figures import copy_bandwidth  # noqa: E402
from nanovha.hardware import cpu_kind  # noqa: E402
from nanovha.timing import measure  # noqa: E402

context = 16384
head_dim = 32
layers = 6
query_heads = 16
memory_gb = 1.2  # the copies of the caches together: more than a last-level cache holds
calls = 12
config = settings(flat_defaults(globals()), sys.argv[1:],
                  limits={k: at_least(1) for k in ("context", "head_dim", "layers", "query_heads", "calls")})
globals().update(config)


def main():
    if not our_op.load():
        sys.exit(f"error: {our_op.why_not()}")
    bw = copy_bandwidth("cpu")
    print(f"{cpu_kind()}; torch {torch.__version__}, {torch.get_num_threads()} threads; copy bandwidth "
          f"{bw / 1e9:.1f} GB/s; {layers} layers at context {context}, head dim {head_dim}")
    print("dtype     KV heads group  path     ours ms   GB/s of copy    dot ms of copy   SDPA ms   GB/s")
    for dtype in (torch.bfloat16, torch.float32):
        for group in (1, 2, 4, 8, 16):
            heads = query_heads // group
            dims = [(heads, head_dim, head_dim)] * layers
            nbytes = 2 * layers * heads * context * head_dim * dtype.itemsize
            n_copies = max(6, int(memory_gb * 1e9 // nbytes))  # at least 2 for each of up to 3 kernels (timed)
            copies = [PagedKV()(1, context, dims, dtype, torch.device("cpu")) for _ in range(n_copies)]
            for k, v in (kv for caches in copies for kv in caches):
                k.normal_()
                v.normal_()
            q, pos = torch.randn(1, heads, group, head_dim).to(dtype), torch.tensor([context - 1])
            names = [torch.ops.nanovha.decode_attention_path(q, *copies[0][0], pos, p) for p in OP_PATHS.values()]
            path, dot = names[0], names[1] == "dot"  # the default path, and whether the dot path is another
            kernels = ("nanovha", "nanovha_dot", "sdpa") if dot else ("nanovha", "sdpa")
            ms = {kernel: s * 1e3 for kernel, s in timed(copies, q, pos, kernels).items()}
            of_copy = {kernel: nbytes / (t / 1e3) / bw for kernel, t in ms.items()}
            dot_cols = f"{ms['nanovha_dot']:8.2f} {of_copy['nanovha_dot']:7.0%}" if dot else f"{'-':>8} {'-':>7}"
            print(f"{str(dtype)[6:]:<9} {heads:>8} {group:>5}  {path:<6} {ms['nanovha']:8.2f} "
                  f"{nbytes / ms['nanovha'] / 1e6:6.1f} {of_copy['nanovha']:7.0%}  {dot_cols}  {ms['sdpa']:8.2f} "
                  f"{nbytes / ms['sdpa'] / 1e6:6.1f}", flush=True)


def timed(copies, q, pos, kernels):
    """{kernel: the median seconds of one token's attention over every layer}, each call on the
    kernel's next copy, the kernels in interleaved rounds after one untimed pass over every copy,
    so that none is timed on caches just filled. Each kernel starts its turn through the copies at
    another place, so that none reads a copy another has just left in the cache."""
    def one_token(kernel, caches):
        for k, v in next(caches):
            static_attention(q, k, v, pos, kernel)
    fns = {}
    for i, kernel in enumerate(kernels):
        start = i * len(copies) // len(kernels)  # (the copies: at least 2 per kernel)
        fns[kernel] = functools.partial(one_token, kernel, itertools.cycle(copies[start:] + copies[:start]))
    times = measure(fns, rounds=calls, warmup=len(copies))[0]
    return {kernel: statistics.median(ts) for kernel, ts in times.items()}


if __name__ == "__main__":
    with torch.inference_mode():
        main()
