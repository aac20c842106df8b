"""
What this machine can do, in one place: the precision a run should use, a GPU's spec-sheet peaks,
and how the benchmarks time it (medians of interleaved calls).

    dtype, why = choose_dtype("cuda", "auto")          # ("bfloat16", "bfloat16 autocast: this GPU has bf16")
    peak_flops, hbm = gpu_spec("NVIDIA H100 80GB HBM3")   # (989e12, 3.35e12); (None, None) if unknown

CUDA keeps a rule: bf16 autocast where the GPU has it, float16 with a GradScaler where it does
not. On a CPU whether bf16 pays depends on the CPU, the model's width and the runtime, not on the
instruction set alone, so "auto" is timed there on the run's own work (nanovha/engine/plan.py, which
uses cpu_bf16_support and cpu_kind from here).
"""
import copy
import os
import platform
import re
import statistics
import time

import torch


def cpu_bf16_support():
    """(native, isa): whether this CPU runs bf16 natively, and the instruction set torch
    dispatches to. Native needs the instructions (AVX-512 BF16 or AMX tiles) and torch's AVX-512
    kernels in use (ATEN_CPU_CAPABILITY=avx2 forces the AVX2 ones, e.g. to mimic an older CPU)."""
    isa = torch.backends.cpu.get_cpu_capability()  # "AVX512", "AVX2", "DEFAULT", or an ARM name
    has_bf16 = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    return has_bf16 and isa.startswith("AVX512"), isa


def cpu_kind():
    """The CPU as lscpu names it, with its family and model (a bare 'AMD EPYC' is family 25 on
    Zen 3, 26 on Zen 5) and what torch runs on it: 'AMD EPYC (family 25, model 1; AVX2)',
    'Intel(R) Xeon(R) Platinum 8481C (family 6, model 143; AVX512, AVX512_BF16, AMX)'. Printed
    beside every CPU figure."""
    info = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                info.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    name = info.get("model name") or platform.processor() or platform.machine()
    family = f"family {info['cpu family']}, model {info['model']}; " if "cpu family" in info and "model" in info else ""
    features = [torch.backends.cpu.get_cpu_capability()]
    features += ["AVX512_BF16"] if torch.cpu._is_avx512_bf16_supported() else []
    features += ["AMX"] if torch.cpu._is_amx_tile_supported() else []
    return f"{name} ({family}{', '.join(features)})"


# the instruction sets a compiler's -march=native may use, as /proc/cpuinfo names them
ISA = ("sse4_2", "avx", "avx2", "fma", "f16c", "bmi2", "avx512f", "avx512dq", "avx512bw", "avx512vl",
       "avx512_vnni", "avx512_bf16", "avx512_fp16", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8")


def cpu_features():
    """The instruction sets of ISA this CPU has, sorted (none known off Linux)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":")[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        flags = []
    return sorted(set(flags) & set(ISA))


def choose_dtype(device_type, dtype):
    """-> (dtype, one line saying why), by rule where nothing is timed. On CUDA "auto" is bf16 autocast where
    supported, else float16 (+ GradScaler); float32 elsewhere (a CPU's "auto" is timed:
    nanovha/engine/plan.py). An explicit bf16 on a CPU without it is kept, and the line is a warning
    (starts with "warning:") that it is emulated."""
    if device_type == "cuda":
        bf16 = torch.cuda.is_bf16_supported()
        if dtype == "auto":
            return ("bfloat16", "bfloat16 autocast: this GPU has bf16") if bf16 else (
                "float16", "float16 autocast + GradScaler: this GPU has no bf16")
        return dtype, f"{dtype}: asked for"
    if device_type == "cpu":
        native, isa = cpu_bf16_support()
        if dtype == "auto":
            return "float32", f"float32: nothing to time bfloat16 on ({isa})"
        if dtype in ("bfloat16", "float16") and not native:
            return dtype, (f"warning: {dtype} was asked for, but this CPU has no native bf16 "
                           f"({isa}): it is emulated, "
                           f"many times slower than float32; drop --dtype (auto picks the faster here) "
                           "or pass --dtype=float32")
        return dtype, f"{dtype}: asked for"
    return ("float32", f"float32 on {device_type}") if dtype == "auto" else (dtype, f"{dtype}: asked for")


def training_step(model, x, y):
    """-> step(dtype): one forward + backward of a copy of `model` on (x, y) in that dtype (bf16/fp16: autocast),
    for choose_dtype. The run's model, its gradients and every random stream are left as they
    were; the copy is made at the first step, so a run that times nothing copies nothing."""
    probe = []

    def step(dtype):
        probe[:] = probe or [copy.deepcopy(model)]
        with torch.random.fork_rng(devices=[]), autocast_for(x.device.type, dtype):
            probe[0](x, y)[1].backward()
        probe[0].zero_grad(set_to_none=True)
    return step


def choose_decode_dtype(device_type, dtype):
    """The weights' and KV cache's dtype for generation off the CPU -> (dtype, one line saying
    why). "auto": bf16 where the GPU has it (else float32); float32 elsewhere. A CPU times its
    choice (nanovha/engine/plan.py)."""
    if dtype != "auto":
        return dtype, f"{dtype}: asked for"
    if device_type == "cuda":
        bf16 = torch.cuda.is_bf16_supported()
        return ("bfloat16", "bfloat16: this GPU has bf16") if bf16 else ("float32", "float32: this GPU has no bf16")
    return "float32", f"float32 on {device_type}"


def choose_compile(device_type, compile):
    """torch.compile for training -> (on, one line saying why). None: on for CUDA (fused kernels,
    minutes of compile against hours of training), off elsewhere (a CPU pays its compile up
    front, more than a short run gains; docs/training.md)."""
    if compile is not None:
        return compile, f"compile {compile}: asked for"
    return device_type == "cuda", f"compile {device_type == 'cuda'}: the default on {device_type}"


def torch_dtype(name):
    """A dtype's name as the commands take it ("float32", "bfloat16", ...) -> the torch.dtype."""
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
            "float64": torch.float64}[name]


def dtype_name(dtype):
    """torch.bfloat16 -> "bfloat16": how a dtype is printed and kept in files."""
    return str(dtype).removeprefix("torch.")


def autocast_for(device_type, dtype):
    """The autocast context of a run in `dtype`: bf16/fp16 autocast, none for float32/float64
    (weights in that dtype)."""
    return torch.autocast(device_type, dtype=torch_dtype(dtype), enabled=dtype in ("bfloat16", "float16"))


def allow_tf32(backends=torch.backends):
    """TF32 on for CUDA float32 matmuls (cuBLAS) and convolutions (cuDNN), through one API -> the
    API used: torch 2.9 added fp32_precision beside the legacy allow_tf32 flags, and a process that
    mixes them raises when a flag is read, so the new API where torch has it, else the legacy one."""
    if hasattr(backends.cuda.matmul, "fp32_precision"):  # torch >= 2.9
        backends.cuda.matmul.fp32_precision = "tf32"
        backends.cudnn.conv.fp32_precision = "tf32"
        return "fp32_precision"
    backends.cuda.matmul.allow_tf32 = True
    backends.cudnn.allow_tf32 = True
    return "allow_tf32"


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


# ---- timing, for the benchmarks: medians of interleaved calls, the device synchronised around each ----
def compile_counters():
    """What torch.compile did so far in this process: graphs compiled (training and eval: 2; more
    at every eval means recompiles), graph breaks, and the compiled graphs CUDA graphs skipped
    (reduce-overhead falls back to plain kernel launches for those)."""
    from torch._dynamo.utils import counters
    return {"compiled_graphs": counters["stats"]["unique_graphs"],
            "graph_breaks": sum(counters["graph_break"].values()),
            "cudagraph_skips": counters["inductor"]["cudagraph_skips"]}


def synchronize(device_type):
    """Waits for the device's queued work (CPU work is synchronous: nothing to wait for)."""
    if device_type == "cuda":
        torch.cuda.synchronize()
    elif device_type == "mps":
        torch.mps.synchronize()


def timed(fn, device_type="cpu", clock=time.perf_counter):
    """Seconds one call of fn takes, with the device's queued work finished before and after."""
    synchronize(device_type)
    t0 = clock()
    fn()
    synchronize(device_type)
    return clock() - t0


def measure(fns, rounds, min_s=0.0, warmup=1, device_type="cpu", clock=time.perf_counter):
    """The one timing harness (the benchmarks and nanovha/engine/plan.py): {name: fn} ->
    ({name: [seconds per call, one per round]}, {name: seconds of its first call}). `warmup`
    untimed rounds, then `rounds` rounds in which every fn runs in an order rotated by one each
    round, so machine noise hits them alike; within a round a fn is called again until min_s has
    passed (a 2-ms step is repeated, not timed once)."""
    names, first, times = list(fns), {}, {name: [] for name in fns}
    for _ in range(warmup):
        for name in names:
            first.setdefault(name, timed(fns[name], device_type, clock))
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            spent, calls = 0.0, 0
            while calls == 0 or spent < min_s:
                spent += timed(fns[name], device_type, clock)
                calls += 1
            times[name].append(spent / calls)
    return times, first


def interleaved(fns, n_timed, warmup, device_type="cpu", clock=time.perf_counter):
    """The median seconds per call of each fn over n_timed interleaved rounds (measure), after
    `warmup` untimed ones."""
    times = measure(fns, n_timed, warmup=warmup, device_type=device_type, clock=clock)[0]
    return {name: statistics.median(ts) for name, ts in times.items()}


def others_busy(read=None):
    """-> stop(): call it when a timing ends; it returns the cores other processes (and the
    hypervisor: steal) kept busy meanwhile, from /proc/stat and /proc/self/stat, or None where
    those cannot be read."""
    def snapshot():
        try:
            with open("/proc/stat") as f:
                cpu = [int(v) for v in f.readline().split()[1:]]
            with open("/proc/self/stat") as f:
                mine = f.read().rsplit(")", 1)[1].split()
            # all, busy, this process
            return sum(cpu), sum(cpu) - cpu[3] - cpu[4], int(mine[11]) + int(mine[12])
        except (OSError, IndexError, ValueError):
            return None
    read = read or snapshot
    start = read()

    def stop():
        end = read()
        if start is None or end is None or end[0] <= start[0]:
            return None
        total, busy, mine = (e - s for e, s in zip(end, start))
        return max(0.0, (busy - mine) / (total / (os.cpu_count() or 1)))
    return stop


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


def available_memory(device):
    """Bytes this process can still allocate on device: the GPU's free memory, or MemAvailable
    (Linux) on a CPU; None where it is not known."""
    if str(device).startswith("cuda"):
        return torch.cuda.mem_get_info(torch.device(device))[0]
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f)
        return int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None


def memory_problem(need_bytes, device, what, fix):
    """Why need_bytes (for `what`) would not fit in what device has available (90% of it), or
    None."""
    have = available_memory(device)
    if have is None or need_bytes <= 0.9 * have:
        return None
    return f"{what}: {need_bytes / 2**30:,.1f} GiB needed, {device} has {have / 2**30:,.1f} GiB available; {fix}"


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
