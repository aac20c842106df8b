"""
How many cores our attention op keeps busy, beside torch's own ops: at every thread count from 1 to
the machine's, the op (GQA-2, `layers` layers of 16 heads of dim 32 over a `context`-position bf16
cache), SDPA on the same cache, and the op followed by a torch matrix-vector product (what a decode
step does next) run `calls` times each; each prints its ms per call and the cores the process kept
busy (CPU seconds of all its threads / wall seconds). Our OpenMP calls bind to torch's runtime, so
busy cores never exceed the thread count: no second pool spins beside torch's.

    python lab/op_threads.py                    # docs/benchmarks.md has a run
"""
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402

from nanovha.config import at_least, flat_defaults, settings  # noqa: E402
from nanovha.engine import kernel as our_op  # noqa: E402
from nanovha.hardware import cpu_kind  # noqa: E402
from nanovha.engine.attention import static_attention  # noqa: E402

context = 16384
layers = 6
calls = 50
globals().update(settings(flat_defaults(globals()), sys.argv[1:], limits={k: at_least(1) for k in
                                                                          ("context", "layers", "calls")}))


def busy(fn):
    """(ms per call, busy cores) over `calls` calls after one warm-up."""
    fn()
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(calls):
        fn()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return wall / calls * 1e3, cpu / wall


def main():
    if not our_op.load():
        sys.exit(f"error: {our_op.why_not()}")
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 8, 32, generator=g).bfloat16()
    caches = [torch.randn(2, 1, 2, context, 32, generator=g).bfloat16() for _ in range(layers)]
    pos = torch.tensor([context - 1])
    w, x = torch.randn(2048, 512).bfloat16(), torch.randn(1, 512).bfloat16()
    fns = {"ours": lambda: [torch.ops.nanovha.decode_attention(q, k, v, pos, 0.18) for k, v in caches],
           "sdpa": lambda: [static_attention(q, k, v, pos, "sdpa", 0.18) for k, v in caches],
           "ours, then a GEMV": lambda: [(torch.ops.nanovha.decode_attention(q, k, v, pos, 0.18), x @ w.t())
                                         for k, v in caches]}
    print(f"{cpu_kind()}; torch {torch.__version__}; {layers} layers of GQA-2 at context {context}, bf16")
    for threads in range(1, (os.cpu_count() or 1) + 1):
        torch.set_num_threads(threads)
        for name, fn in fns.items():
            ms, cores = busy(fn)
            print(f"threads {threads}: {name:<18} {ms:7.3f} ms/call, {cores:.2f} cores busy")


if __name__ == "__main__":
    with torch.inference_mode():
        main()
