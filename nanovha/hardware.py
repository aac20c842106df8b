"""
What this machine is, and the precision rules that follow from it: the CPU's kind and instruction
sets, the dtype a run should use where nothing is timed, TF32 on a GPU, and the memory left.

    dtype, why = choose_dtype("cuda", "auto")          # ("bfloat16", "bfloat16 autocast: this GPU has bf16")
    print(cpu_kind())   # 'AMD EPYC 9B14 (family 25, model 17; AVX512, AVX512_BF16)'

CUDA keeps a rule: bf16 autocast where the GPU has it, float16 with a GradScaler where it does
not. On a CPU whether bf16 pays depends on the CPU, the model's width and the runtime, not on the
instruction set alone, so "auto" is timed there on the run's own work (nanovha/timing.py for
training, nanovha/engine/plan.py for decode, which use cpu_bf16_support and cpu_kind from here).
"""
import os
import platform

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
    nanovha/timing.py, train_plan). An explicit bf16 on a CPU without it is kept, and the line is a warning
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


def choose_decode_dtype(device_type, dtype):
    """The weights' and KV cache's dtype for generation off the CPU -> (dtype, why in a few words).
    "auto": bf16 where the GPU has it (else float32); float32 elsewhere. A CPU times its choice
    (nanovha/engine/plan.py)."""
    if dtype != "auto":
        return dtype, "asked for"
    if device_type == "cuda":
        bf16 = torch.cuda.is_bf16_supported()
        return ("bfloat16", "this GPU has bf16") if bf16 else ("float32", "this GPU has no bf16")
    return "float32", f"the default on {device_type}"


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


def allow_tf32():
    """TF32 for the float32 matmuls autocast leaves on a GPU (cuDNN's convolutions use it by
    default). One call that every torch from 2.4 on takes: set_float32_matmul_precision("high")
    is what inductor itself reads. The per-backend fp32_precision flags of torch >= 2.9 are left
    alone: once they are set, torch raises on every read of the legacy getters (pytorch#166387),
    and inductor and other libraries read them."""
    torch.set_float32_matmul_precision("high")


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


