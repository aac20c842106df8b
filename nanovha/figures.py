"""
What the benchmarks set their figures against, and how they show them: each GPU's spec-sheet
peaks, the peaks measured here (a tensor copy's bandwidth, a matmul's FLOP/s), what torch really
ran (the SDPA backend of a step, the compile counters), the tables they print and the figure
bench_decode.py draws.

    peak_flops, hbm = gpu_spec("NVIDIA H100 80GB HBM3")   # (989e12, 3.35e12); (None, None) if unknown
    backends, ops = sdpa_backends(step)                    # (["flash"], ["aten::_scaled_dot_product_flash..."])
"""
import re
import statistics

import torch

from nanovha.outputs import save_figure
from nanovha.timing import timed

# Spec-sheet peaks of each GPU under its exact torch.cuda.get_device_name(): dense bf16 (fp16 where
# the GPU has no bf16) tensor FLOP/s without sparsity, and HBM/GDDR bytes/s. A name not listed is
# matched only when its last word is an unambiguous model number (a vGPU profile like "-48Q" dropped
# first): "NVIDIA L40-48Q" is an L40, never an L4; "RTX 4090 D" or "4090 Laptop GPU" (other chips)
# and bare "H100" or "A100" (variants differ) stay unknown: (None, None), so no MFU is made up.
GPU_SPECS = {
    "NVIDIA H200": (989e12, 4.8e12), "NVIDIA H200 NVL": (835e12, 4.8e12),
    "NVIDIA GH200 480GB": (989e12, 4.0e12),
    "NVIDIA H100 80GB HBM3": (989e12, 3.35e12), "NVIDIA H100 PCIe": (756e12, 2.0e12),
    "NVIDIA H100 NVL": (835e12, 3.9e12),
    "NVIDIA A100-SXM4-80GB": (312e12, 2.039e12), "NVIDIA A100-SXM4-40GB": (312e12, 1.555e12),
    "NVIDIA A100 80GB PCIe": (312e12, 1.935e12), "NVIDIA A100-PCIE-40GB": (312e12, 1.555e12),
    "NVIDIA L40S": (362e12, 0.864e12), "NVIDIA L40": (181e12, 0.864e12), "NVIDIA L4": (121e12, 0.3e12),
    "NVIDIA A10": (125e12, 0.6e12), "NVIDIA RTX A6000": (155e12, 0.768e12),
    "NVIDIA GeForce RTX 4090": (165e12, 1.008e12), "NVIDIA GeForce RTX 3090": (71e12, 0.936e12),
    "Tesla V100-SXM2-16GB": (125e12, 0.9e12), "Tesla V100-SXM2-32GB": (125e12, 0.9e12), "Tesla T4": (65e12, 0.32e12),
}
FAMILY = {"H200": "NVIDIA H200", "L40S": "NVIDIA L40S", "L40": "NVIDIA L40", "L4": "NVIDIA L4", "A10": "NVIDIA A10",
          # unambiguous tokens
          "4090": "NVIDIA GeForce RTX 4090", "3090": "NVIDIA GeForce RTX 3090", "T4": "Tesla T4"}


def gpu_spec(name):
    """(peak FLOP/s, bytes/s) of the GPU named `name` (torch.cuda.get_device_name()), or (None,
    None)."""
    if name in GPU_SPECS:
        return GPU_SPECS[name]
    words = re.sub(r"-\d+[A-Z]$", "", name).split()  # "NVIDIA L40-48Q" -> ["NVIDIA", "L40"]
    return GPU_SPECS[FAMILY[words[-1]]] if words and words[-1] in FAMILY else (None, None)


def compile_counters():
    """What torch.compile did so far in this process: graphs compiled (training and eval: 2; more
    at every eval means recompiles), graph breaks, and the compiled graphs CUDA graphs skipped
    (reduce-overhead falls back to plain kernel launches for those)."""
    from torch._dynamo.utils import counters
    return {"compiled_graphs": counters["stats"]["unique_graphs"],
            "graph_breaks": sum(counters["graph_break"].values()),
            "cudagraph_skips": counters["inductor"]["cudagraph_skips"]}


def copy_bandwidth(device, mib=1024):
    """Bytes/s of a large tensor copy, read + write counted (device to device on a GPU): the peak
    a decode step that streams its weights and KV cache can reach."""
    src = torch.full((mib * 2**20 // 4,), 1.0, device=device)
    dst = torch.empty_like(src)
    device_type = src.device.type
    # 1st: warm-up
    seconds = statistics.median([timed(lambda: dst.copy_(src), device_type) for _ in range(6)][1:])
    return 2 * mib * 2**20 / seconds


def matmul_peak(device, dtype, n=1024):
    """FLOP/s of an n^3 matmul in dtype: a compute ceiling to set a kernel's FLOP/s against."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    return 2 * n**3 / statistics.median([timed(lambda: a @ a, a.device.type) for _ in range(6)][1:])


SDPA_OPS = (("attention_math", "math"), ("flash_attention", "flash"), ("efficient_attention", "mem-efficient"),
            ("cudnn_attention", "cuDNN"), ("fused_attention_overrideable", "overrideable"))


def sdpa_backend(name):
    """A profiler op name -> the SDPA backend it belongs to, or None. Flash:
    aten::_scaled_dot_product_flash_attention (_for_cpu on CPU), aten::_flash_attention_forward;
    the math path is one composite op, aten::_scaled_dot_product_attention_math (_for_mps on
    Apple), its matmuls and softmax then show as plain ops."""
    if not name.startswith("aten::_"):
        return None  # aten::scaled_dot_product_attention itself is only the dispatcher
    return next((backend for tag, backend in SDPA_OPS if tag in name), None)


def sdpa_backends(fn):
    """Runs fn under the profiler -> (sorted SDPA backends it used, sorted op names they came
    from)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    ops = sorted({e.name for e in prof.events() if sdpa_backend(e.name)})
    return sorted({sdpa_backend(n) for n in ops}), ops


def print_table(rows, columns, flush=False):
    """columns: (header, key, format); right-aligned, one line per row, '-' where a row has no
    value."""
    cells = [[h for h, _, _ in columns]] + [[fmt.format(r[k]) if r.get(k) is not None else "-" for _, k, fmt in columns]
                                            for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    for row in cells:
        print("  ".join(c.rjust(w) for c, w in zip(row, widths)), flush=flush)


def verdict(ok):
    return "PASS" if ok else "FAIL"


def plot_decode(rows, ctxs, path, runtimes, title):
    """Two panels against context: decode tokens/s of every (variant, runtime) row, and the KV
    cache allocated (the first runtime's rows). runtimes: the benchmark's, the first the one its
    targets judge."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for name, runtime in dict.fromkeys((r["variant"], r["runtime"]) for r in rows):
        mine = [r for r in rows if (r["variant"], r["runtime"]) == (name, runtime)]
        label = name if runtime in (runtimes[0], "llama.cpp") else f"{name} ({runtime})"
        style = ":" if runtime == "eager" and len(runtimes) == 2 else "--" if "vha" in name else "-"
        for ax, key in zip(axes, ("decode_tok_s", "kv_cache_mb")):
            if key == "decode_tok_s" or runtime == runtimes[0]:
                ax.plot([r["ctx"] for r in mine], [r[key] for r in mine], marker="o", label=label, ls=style)
    for ax, label in zip(axes, ("decode tokens/s", "KV cache allocated (MB)")):
        ax.set(xscale="log", xlabel="context (tokens)", ylabel=label)
        ax.set_xticks(ctxs, [f"{c // 1024}K" if c % 1024 == 0 else str(c) for c in ctxs])
        ax.minorticks_off()
        ax.grid(alpha=0.3)
    axes[1].set_yscale("log")
    axes[0].legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    print(f"wrote {path}")
