"""
The decode levers one at a time, on one folded-VHA-shaped model at one context: eager in both
weight layouts, torch.compile (inductor defaults, + freezing, + cpp_wrapper), AOTInductor
(without and with max_autotune), and llama.cpp on the same weights. Each lever runs in a fresh
process (inductor's settings are global); each prints its build time and median ms/token. What
bench_decode.py and sample.py use was chosen from this table (docs/benchmarks.md, compiled
decode).

    python lab/decode_levers.py                                    # the benchmark's 6 x 512 model, 1K context
    python lab/decode_levers.py --shape=demo --context=256 --threads=1   # the demo's 4 x 128 model
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402

from model import GPT, GPTConfig  # noqa: E402
from nanovha.config import at_least, flat_defaults, settings  # noqa: E402
from nanovha.engine.attention import use_decode_layout  # noqa: E402
from nanovha.timing import random_context  # noqa: E402

# bench: 6 layers x 512, 16 heads of dim 32, 2 KV heads, vocab 128; demo: 4 x 128, 8 of 16, vocab 65
shape = "bench"
context = 1024
steps = 40  # timed steps (after 5 untimed)
threads = 2
lever = ""  # internal: the one lever a child process runs
LEVERS = ["eager out_in", "eager in_out", "compile", "compile freezing", "compile cpp_wrapper", "aot", "aot autotune",
          "llama.cpp"]
SHAPES = {"bench": dict(vocab_size=128, n_layer=6, n_embd=512, n_head=16, head_dim=32),
          "demo": dict(vocab_size=65, n_layer=4, n_embd=128, n_head=8, head_dim=16)}


def model_of():
    torch.manual_seed(0)
    return GPT(GPTConfig(block_size=256, n_kv_head=2, attn="gqa", **SHAPES[shape])).eval()


def run_lever():
    """The child: one lever -> {"build_s", "ms"} on stdout."""
    model, token = model_of(), torch.zeros(1, 1, dtype=torch.long)
    if lever != "eager out_in":
        use_decode_layout(model)
    if lever == "llama.cpp":
        from nanovha.bridges.llamacpp import LlamaCpp
        runner = LlamaCpp(model, None, threads).load(context + steps + 8)
        runner.fill(context, 2048)
        step, build_s = runner.step, 0.0
    else:
        random_context(model, context, context + steps + 8)
        pos, t0 = torch.tensor([context]), time.perf_counter()
        if lever.startswith("eager"):
            step = lambda: (model.decode_one_token(token, int(pos)), pos.add_(1))
        elif lever.startswith("aot"):
            from nanovha.engine.compiled import compiled_decode
            compiled = compiled_decode(model, tempfile.mkdtemp(), autotune=lever.endswith("autotune"))
            step = lambda: (compiled(token, pos), pos.add_(1))
        else:
            import torch._inductor.config as inductor
            inductor.freezing = lever.endswith("freezing")
            inductor.cpp_wrapper = lever.endswith("cpp_wrapper")
            compiled = torch.compile(model.decode_one_token, fullgraph=True)
            step = lambda: (compiled(token, pos), pos.add_(1))
        with torch.inference_mode():
            step()  # compiles (the compile levers)
        build_s = time.perf_counter() - t0
    with torch.inference_mode():
        for _ in range(5):
            step()
        times = []
        for _ in range(steps):
            t = time.perf_counter()
            step()
            times.append(time.perf_counter() - t)
    print(json.dumps(dict(build_s=build_s, ms=statistics.median(times) * 1e3)))


if __name__ == "__main__":
    globals().update(settings(flat_defaults(globals()), sys.argv[1:], limits={"threads": at_least(1)}))
    torch.set_num_threads(threads)
    if lever:
        run_lever()
        sys.exit(0)
    from nanovha.hardware import cpu_kind
    print(f"{shape} model {SHAPES[shape]}, 2 KV heads, fp32, batch 1, context {context}, {threads} thread(s), "
          f"torch {torch.__version__}, {cpu_kind()}")
    rows = {}
    for name in LEVERS:
        args = [sys.executable, __file__, f"--lever={name}", f"--shape={shape}", f"--context={context}",
                f"--steps={steps}", f"--threads={threads}"]
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        proc = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, env=env)
        if proc.returncode != 0:
            print(f"{name:>20}: failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
            continue
        rows[name] = json.loads(proc.stdout.strip().splitlines()[-1])
        r = rows[name]
        print(f"{name:>20}: build {r['build_s']:6.1f} s, {r['ms']:.3f} ms/token")
    ref = rows.get("llama.cpp")
    if ref:
        print("ours / llama.cpp tok/s: " + ", ".join(f"{n} {ref['ms'] / r['ms']:.2f}x" for n, r in rows.items()
                                                     if n != "llama.cpp"))
    print(json.dumps(dict(shape=shape, context=context, threads=threads, cpu=cpu_kind(), levers=rows)))
