"""
The GPU check's plan (scripts/gpu_check.py): its sections in the order of their value, each with
a time limit and the torch.compile graphs it is planned to build, the budget those limits must
fit, the preflight's one-line checks (the toolchain, the torch version gate, a one-kernel compile
probe), the rule that starts the 120M after the small model only when time is left, the
compile-counter line every compiling section prints, and the report lines made from the
benchmarks' JSON; the runner that cuts a section at its limit (run_logged). No torch at import:
the check's parent process reads the plan.
"""
import ctypes.util
import importlib
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time

# A lent machine: 15 minutes of device time in all, its start (1-2 minutes) included; one try of the
# check is one call of at most 6 minutes (TIMEOUT_S, the device tool's timeout_s in docs/gpu.md),
# and it must fit twice (a rerun after a fix) with the start.
DEVICE_S = 900
START_S = 120
CALL_OVERHEAD_S = 30  # a call's own overhead: process start, copying $OUT back
TIMEOUT_S = 360  # one try: the command's timeout
TOTAL_S = TIMEOUT_S - CALL_OVERHEAD_S  # 330: gpu_check.py's default --total_s; 120 + 2 x (330 + 30) = 840 <= 900
DRY_RUN_SCALE = 3  # the dry run's limits and total: a busy 2-core CPU compiles correctness's toy step cold in ~50 s
MIN_TORCH = (2, 7)  # the compiled decode (torch.export, AOTInductor packages) needs torch 2.7 or later

def decode_graphs(n_variants, n_contexts):
    """Graphs bench_decode.py --compile=graphs compiles: each variant at each context and at
    context 1 (the breakdown's floor), and the op-floor model once. Counted on the CPU for one
    context: 1 variant 3, 2 variants 5 (tests/test_gpu_check.py, slow)."""
    return n_variants * (n_contexts + 1) + 1


# name: (time limit s, graphs planned on CUDA, how the plan was counted on a CPU). Most valuable
# first: a section cut by the total still leaves every earlier one reported. Counted with compile
# on, at toy size (counts do not depend on size): hardware.compile_counters() after the section's
# own calls.
PLAN = dict(
    preflight=(30, 0, "no compile in the section: versions, the device, the toolchain, and a one-kernel "
                      "compile probe in a child process"),
    correctness=(40, 1, "the one-token step, compiled once and replayed (the dry run compiles it too: 1 graph)"),
    smoke=(70, 2, "train.py at 2 layers of the 120M's shape: the training and the eval graph, 2 at every "
                  "eval (tests/test_compile.py)"),
    limits=(15, 0, "no compile: a copy and one matmul"),
    train=(100, 2, "bench.py --compile=True: one graph per model, vha and gqa2, in each run (2 layers, then "
                   "the 120M if time is left; counted on the CPU: 2 a run)"),
    decode=(50, decode_graphs(2, 1), "bench_decode.py --compile=graphs, 2 variants x 1 context (decode_graphs; "
                                     "counted on the CPU: 5)"),
    kernels=(25, 0, "eager under the profiler"),
)
SECTIONS = tuple(PLAN)


def section_limits(text):
    """"smoke:200,train:150" (a rerun's --section_s) -> {section: limit s}, the plan's for the
    rest; ValueError (one line) on a bad entry."""
    limits = {name: limit for name, (limit, _, _) in PLAN.items()}
    for entry in filter(None, text.split(",")):
        name, _, seconds = entry.partition(":")
        if name not in PLAN or not seconds.isdigit() or int(seconds) < 1:
            raise ValueError(f"section_s takes section:seconds pairs, e.g. smoke:200 (sections {','.join(PLAN)}), "
                             f"got {entry!r}")
        limits[name] = int(seconds)
    return limits


def budget_problem(total_s, limits=None):
    """Why these section limits ({name: s}; the plan's) or this total cannot work, as one line,
    or None."""
    limits = limits or {name: limit for name, (limit, _, _) in PLAN.items()}
    if sum(limits.values()) > total_s:
        return (f"the limits of sections {','.join(limits)} add up to {sum(limits.values())} s, more than "
                f"total_s={total_s}: raise --total_s or leave sections out")
    if START_S + 2 * (total_s + CALL_OVERHEAD_S) > DEVICE_S:
        return (f"total_s={total_s} leaves no rerun: a start ({START_S} s) and two runs of {total_s} + "
                f"{CALL_OVERHEAD_S} s exceed the {DEVICE_S} s of device time")
    return None


# ---- the compile counters: every compiling section prints one line, the parent compares it with the plan ----
def counters_line(counters, planned, cuda_graphs):
    """hardware.compile_counters()'s dict -> (the line, FAIL reasons). A graph break is a FAIL
    (fullgraph=True should make it an error); so is a CUDA-graph skip where the section's figures
    claim CUDA graphs (cuda_graphs)."""
    if counters is None:
        return "compile counters: none (compile off in this run)", []
    graphs, breaks, skips = (counters[k] for k in ("compiled_graphs", "graph_breaks", "cudagraph_skips"))
    line = (f"compile counters: {graphs} graphs (planned {planned}), {breaks} graph breaks, "
            f"{skips} CUDA-graph skips"
            + ("  OVER PLAN" if graphs > planned else ""))
    fails = ([f"{breaks} graph breaks"] if breaks else []) + ([f"{skips} CUDA-graph skips"] if skips and cuda_graphs
                                                              else [])
    return line, fails


def over_plan(name, counters, planned=None):
    """' (compiled G graphs, planned P)' for the report's status when a section compiled more
    than planned (the plan's, unless the settings planned otherwise), else ''."""
    planned = PLAN[name][1] if planned is None else planned
    graphs = (counters or {}).get("compiled_graphs", 0)
    return f" (compiled {graphs} graphs, planned {planned})" if graphs > planned else ""


# ---- the preflight: one line each, a second or two, before any compile ----
def toolchain_lines(cuda=True):
    """(name, ok, detail) for what the compiled sections need besides torch: a C compiler and
    Python.h (Triton builds its launcher with them; on a CPU inductor compiles C++), triton (CUDA
    only), numpy (train.py's data, bench_decode.py)."""
    cc = os.environ.get("CC") or next((p for p in map(shutil.which, ("cc", "gcc", "clang")) if p), None)
    header = os.path.join(sysconfig.get_paths()["include"], "Python.h")
    rows = [("cc", bool(cc), cc or "no C compiler (cc, gcc, clang) on PATH, none in $CC"),
            ("Python.h", os.path.isfile(header), header + ("" if os.path.isfile(header) else ": missing"))]
    for module in ("triton", "numpy"):
        try:
            version = getattr(importlib.import_module(module), "__version__", "?")
            rows.append((module, True, f"{module} {version}"))
        except Exception as e:  # a broken install is as bad as none: the line says which
            needed = cuda or module != "triton"  # a CPU's inductor writes C++, not Triton
            rows.append((module, not needed, f"cannot import {module}: {type(e).__name__}: {e}"
                         + ("" if needed else " (not needed on a CPU)")))
    if cuda:  # Triton links its launcher against the driver's libcuda.so.1
        lib = os.environ.get("TRITON_LIBCUDA_PATH") or ctypes.util.find_library("cuda")
        rows.append(("libcuda", bool(lib), lib or "no libcuda on the loader's path (ldconfig -p), none in "
                                                  "$TRITON_LIBCUDA_PATH"))
    rows.append(("python", True, f"{sys.version.split()[0]} at {sys.executable}"))
    return rows


def version_gate(version):
    """torch's version ("2.11.0+cu130") -> (ok, the line): the compiled paths need MIN_TORCH."""
    numbers = tuple(int(x) for x in version.split("+")[0].split(".")[:2])
    floor = ".".join(map(str, MIN_TORCH))
    return numbers >= MIN_TORCH, (f"torch {version} {'>=' if numbers >= MIN_TORCH else '<'} {floor} (the compiled "
                                  f"decode needs {floor} or later)")


# one pointwise kernel compiled and run in a child process: what every compiled section needs (on a
# GPU: Triton, which builds its launcher with the C compiler, Python.h and libcuda)
PROBE = ("import sys, time, torch; t0 = time.time(); "
         "f = torch.compile(lambda x: x * 2 + 1, fullgraph=True); "
         "assert f(torch.ones(8, device=sys.argv[1])).sum().item() == 24, 'wrong result'; "
         "print(f'{time.time() - t0:.1f}')")


def compile_probe(device, log_path, timeout):
    """PROBE on device in a child process, cut at timeout s -> (ok, seconds, the line); ok is None
    when it was cut: slow (a cold machine's first compile), not known to be broken."""
    rc, wall, text = run_logged([sys.executable, "-c", PROBE, device], log_path, timeout)
    if rc == 0:
        seconds = float(text.strip().splitlines()[-1])
        return True, seconds, f"compile probe: one kernel compiled and run in {seconds:.1f} s  PASS"
    if rc is None:
        return None, wall, (f"compile probe: not done in {wall:.0f} s (slow, not known to be broken: the "
                            f"compiled sections compile; a cut one keeps what it measured)")
    why = ([x for x in text.strip().splitlines() if x.strip()][-1:] or [f"exit {rc}"])[0].strip()[:300]
    return False, wall, f"compile probe: {why}  FAIL"


def big_run_problem(left_s, small_wall_s, layers):
    """Why the full-size run (layers) should not start after the small one, as one line, or None: it
    needs at least the small run's wall time (the same kernels, now cached, but more layers to trace)."""
    if left_s < small_wall_s:
        return (f"SKIPPED the {layers}-layer run: {left_s:.0f} s left in the section, less than the small run "
                f"took ({small_wall_s:.0f} s; the full size traces more layers); rerun with --sections=train "
                f"--section_s=train:300")
    return None


# ---- the report lines of the benchmarks' results (made-up inputs in tests/test_gpu_check.py) ----
def train_lines(result, matmul_tflop_s):
    """bench.py's JSON -> one line per model: tokens/s, MFU of the spec and of the matmul
    measured in this run."""
    out = []
    for r in result["results"]:
        spec = f"MFU {r['mfu']:.1%} of the spec" if r.get("mfu") else "MFU n/a (no spec for this device)"
        measured = r["flops_per_token"] * r["tok_s"] / 1e12 / matmul_tflop_s if matmul_tflop_s else None
        out.append(f"{r['variant']:6s} {r['heads']:12s} {r['params_m']:6.1f}M params "
                   f"{r['tok_s']:10,.0f} tok/s  {spec}"
                   + (f", {measured:.1%} of the measured matmul" if measured else ""))
    named = {r["variant"]: r for r in result["results"]}
    if "vha" in named and len(named) == 2:
        twin = next(v for v in named if v != "vha")
        out.append(f"VHA / {twin} tokens/s: {named['vha']['tok_s'] / named[twin]['tok_s']:.3f}x (interleaved steps)")
    return out


def decode_lines(result, copy_gb_s):
    """bench_decode.py's JSON -> the report lines: the compiled rows with GB/s as a fraction of
    the copy bandwidth measured in this run, the eager rows labelled launch-bound, and at the
    largest context the breakdown (the context-1 floor, the KV part) and the attention alone.
    (The compile counters: counters_line.)"""
    out = []
    for r in result["results"]:
        ctx = f"{r['ctx'] // 1024}K" if r["ctx"] % 1024 == 0 else str(r["ctx"])
        if r["runtime"] == "eager":
            bandwidth = "launch-bound (eager: per-op launches, not bytes, set its speed)"
        else:
            bandwidth = f"{r['gb_s']:7.1f} GB/s of weights + KV = {r['gb_s'] / copy_gb_s:.0%} of the measured copy"
        out.append(f"{r['variant']:10s} {r['runtime']:7s} {ctx:>5s} {r['decode_tok_s']:9.1f} tok/s  {bandwidth}")
    top = max(r["ctx"] for r in result["results"])
    out.append(f"at context {top}: op floor (the same launches at head dim 2) "
               f"{result['op_floor_ms']:.3f} ms/token")
    for b in result["breakdown"]:
        kv = (f"{b['kv_gb_s']:.0f} GB/s = {b['kv_gb_s'] / copy_gb_s:.0%} of the measured copy" if b["kv_gb_s"]
              else "n/a (no slower than context 1)")
        out.append(f"{b['variant']:10s} step {b['ms_top']:.3f} ms = context-1 step "
                   f"{b['ms_ctx1']:.3f} ms + KV part "
                   f"{b['kv_ms']:.3f} ms: {kv}")
        if b.get("attn_ms"):
            out.append(f"{'':10s} the attention alone {b['attn_ms']:.3f} ms: {b['attn_gb_s']:.0f} GB/s of K/V = "
                       f"{b['attn_gb_s'] / copy_gb_s:.0%} of the measured copy")
    return out


def describe(backends, ops):
    if not backends:
        return "no SDPA (grouped matmuls)"
    return ("MATH PATH: " if "math" in backends else "") + "/".join(backends) + f"  ({', '.join(ops)})"


def parse_sections(text):
    """"smoke,decode" -> ["decode", "smoke"], in the check's order; ValueError (one line) on an
    unknown name."""
    names = [s for s in text.split(",") if s]
    unknown = [s for s in names if s not in SECTIONS]
    if unknown or not names:
        raise ValueError(f"sections must be a comma-separated subset of {','.join(SECTIONS)}, got {text!r}")
    return [s for s in SECTIONS if s in names]


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # where the sections' commands run


# ---- processes: a time limit each, the whole process group cut at it, the output in a log ----
def run_logged(cmd, log_path, timeout, own_group=False):
    """Runs cmd with stdout and stderr into log_path -> (exit code, or None when cut at timeout
    seconds; wall s; the log's text). own_group: cmd and everything it starts form one process
    group, killed together at the limit (the sections); otherwise cmd alone is killed (its
    children share this process's group)."""
    t0 = time.time()
    with open(log_path, "w") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        # unbuffered: what a process printed is in its log when it is cut
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=own_group,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            rc = proc.wait(timeout=max(timeout, 1))
        except subprocess.TimeoutExpired:
            if own_group:
                os.killpg(proc.pid, signal.SIGKILL)
            else:
                proc.kill()
            proc.wait()
            rc = None
    with open(log_path) as f:
        return rc, time.time() - t0, f.read()
