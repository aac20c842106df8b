"""
The one prepared GPU check, for the GPU machine as it is lent: its own python3 and torch (2.7 or
later; 2.11 there), no package index, no hub, about 15 minutes of device time with the start. Seven
sections, most valuable first, in at most total_s (5.5 minutes, so one try fits a 6-minute call and
a rerun fits too: nanovha/gpu_plan.py), nothing to carry; docs/gpu.md has the command to paste and
what each section measures.

    python3 scripts/gpu_check.py --report_dir=$OUT               # every section
    python3 scripts/gpu_check.py --sections=smoke --section_s=smoke:200 --report_dir=$OUT/rerun
    python scripts/gpu_check.py --dry_run=True                   # toy sizes on the CPU: every path that runs there

1. preflight: versions and the torch >= 2.7 gate, the device and its free memory, cc, Python.h,
   triton, numpy, libcuda, a one-kernel torch.compile probe, one summary line
2. correctness: bf16 against a float64 reference on every timed path (forward, eager and compiled
   decode), the fold
3. smoke: train.py, config/fineweb/vha.py + smoke.py at 2 layers (compile + bf16) on
   data/shakespeare when carried, else on data/synthetic, made in place offline: the loss must fall
4. limits: copy bandwidth and a bf16 matmul, beside the spec sheet
5. train: bench.py, VHA and its same-deploy GQA twin (compile, bf16, fused AdamW), interleaved: 2
   layers of the 120M's shape first (a cold compile measured), then the 120M if time is left
6. decode: bench_decode.py, MHA and folded VHA under CUDA graphs at 128K, eager beside
7. kernels: the SDPA backend (profiler op names) of training, prefill and decode steps; FAIL on the
   math path

Each section runs in its own process group with a time limit, importing only what it needs; each
subprocess it starts has the time the section has left. Every figure is printed and appended to
report_dir/figures/<section>.jsonl the moment it is measured (one JSON line per model and
context), report.md and report.json (with those figures) are written again after each section, and
every log stays in report_dir/logs, so a cut keeps what was measured. When the preflight finds that
torch.compile cannot work here, every later section runs eager and says so. Correctness, smoke,
train and decode print their compile counters (graphs, graph breaks, CUDA-graph skips); the report
marks a section that compiled more graphs than planned. Nothing in the tests depends on a GPU.
"""
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from nanovha.config import at_least, flat_defaults, settings  # noqa: E402
from nanovha.variants import GQA_N  # noqa: E402
from nanovha.gpu_plan import (DRY_RUN_SCALE, PLAN, SECTIONS, TOTAL_S, big_run_problem, budget_problem,  # noqa: E402
                              compile_probe, counters_line, decode_graphs, decode_lines, over_plan,
                              parse_sections, run_logged, section_limits, toolchain_lines, train_lines,
                              version_gate)
from nanovha.gpu_report import append_figure, decode_rows, read_figures, section_result, write_report  # noqa: E402

# -----------------------------------------------------------------------------
dry_run = False  # CPU, toy sizes: checks that every step of this script runs
sections = ",".join(SECTIONS)  # any of them, comma-separated, run in this order
report_dir = "out-gpu-check"  # report.md, report.json, figures/, logs/ (on the lent machine: $OUT)
data_dir = ""  # the smoke section's token bins; "": data/shakespeare if prepared, else data/synthetic (made here)
total_s = TOTAL_S  # the whole check; a section that cannot get 20 s more is skipped, and says so
compile = True  # False: every section eager (as when the preflight finds that torch.compile cannot work here)
smoke_iters = 100
decode_variants = "mha,vha_folded"  # mha, mqa, gqaN, vha_folded (vha_folded has gqa2's shape: one of the two)
contexts = "131072"  # CUDA-graph decode contexts (the breakdown adds context 1)
section_s = ""  # other limits for a rerun, e.g. "smoke:200,train:150" (the plan's: gpu_plan.PLAN)
only = ""  # internal: run this one section in this process
deadline = 0.0  # internal: the section's end, seconds since the epoch
# -----------------------------------------------------------------------------
defaults = flat_defaults(globals())  # the knobs above
SECTION_S = section_limits("")  # the plan's; --section_s changes some
TITLES = dict(preflight="1. preflight: versions, the device, what the compiled sections need",
              correctness="2. correctness: bf16 on every timed path vs a float64 reference",
              smoke="3. smoke: train.py (config/fineweb/vha.py + smoke.py, 2 layers), compile + bf16",
              limits="4. limits: copy bandwidth and a large matmul, measured here",
              train="5. train: VHA vs its same-deploy GQA twin, 2 layers then the 120M (bench.py: compile, bf16)",
              decode="6. decode: MHA and folded VHA under CUDA graphs (bench_decode.py), eager beside",
              kernels="7. SDPA kernels (profiler): training, prefill and decode steps")
CARRIED, MADE_HERE = os.path.join(ROOT, "data", "shakespeare"), os.path.join(ROOT, "data", "synthetic")
TRAIN_LAYERS = (2, 12)  # the train section's runs: the small model first, then the 120M (config/fineweb/vha.py)
# a test's simulated hang: "section:n" stops that section after its n-th figure, until its limit cuts it
STALL = os.environ.get("NANOVHA_GPU_CHECK_STALL", "")
# what this section says: printed as it goes (the log keeps it) and written to its JSON at the end
lines = []
figures_made = []


def prepared(folder):
    return all(os.path.isfile(os.path.join(folder, f)) for f in ("train.bin", "val.bin", "meta.pkl"))


def smoke_data(given):
    """The smoke section's data: the folder given; else the carried Shakespeare bins when
    prepared; else data/synthetic (made by the smoke section when missing, offline)."""
    return given or (CARRIED if prepared(CARRIED) else MADE_HERE)


def problems(chosen):
    """Settings that cannot work, as one line, before any section runs; None if all is well."""
    bad = [v for v in decode_variants.split(",")
           if v not in ("mha", "mqa", "vha_folded") and not GQA_N.fullmatch(v)]  # nanovha/variants.py's names
    if bad or not decode_variants:
        return f"decode_variants: gpu_check knows mha, mqa, gqaN and vha_folded, got {decode_variants!r}"
    if os.path.exists(os.path.join(report_dir, "report.md")):
        return f"report_dir {report_dir} already holds a report: give a new --report_dir (or remove that one)"
    if "smoke" in chosen and data_dir and not prepared(data_dir):
        return (f"the smoke section trains on {data_dir}/ (train.bin, val.bin, meta.pkl), which is not there: "
                "give a prepared --data_dir, or none (carried data/shakespeare, else "
                "data/synthetic made here)")
    return budget_problem(total_s, {name: SECTION_S[name] for name in chosen})


def torch_problem():
    """One line when this python cannot import torch (the check's one need besides the repo), else
    None."""
    try:
        import torch  # noqa: F401 (the sections import it; asked here so its absence is one line)
    except (ImportError, OSError) as e:
        return (f"this python ({sys.executable}) cannot import torch ({type(e).__name__}: {e}): install it with "
                f"`{sys.executable} -m pip install torch` (2.7 or later), then run the check again")
    return None


def say(line):
    print(line, flush=True)
    lines.append(line)


def figure(**measured):
    """One figure of this section, printed and appended to figures/<section>.jsonl the moment it is
    measured; STALL (a test's) hangs the section after its n-th, as a slow step would."""
    append_figure(os.path.join(report_dir, "figures", f"{only or 'section'}.jsonl"), measured)
    figures_made.append(measured)
    if STALL == f"{only}:{len(figures_made)}":
        time.sleep(3600)


def left():
    return deadline - time.time()


def compiling():
    """(True, "") when this section compiles as planned; (False, why) under --compile=False or when
    the preflight found that torch.compile cannot work here: the section then runs eager."""
    if not compile:
        return False, "--compile=False"
    probe = [f for f in read_figures(report_dir, "preflight") if "compile_ok" in f]
    return (True, "") if not probe or probe[-1]["compile_ok"] else (False, probe[-1]["why"])


def say_eager(why):
    say(f"EAGER: torch.compile is off for this section ({why}); its figures are eager ones")


def say_counters(name, counters, cuda_graphs, planned=None):
    """The section's compile counters beside its plan (planned: the settings' own), FAIL on a
    graph break or a CUDA-graph skip -> the counters with the plan, for the report's status."""
    planned = PLAN[name][1] if planned is None else planned
    line, fails = counters_line(counters, planned, cuda_graphs)
    say(line)
    for fail in fails:
        say(f"FAIL: {fail}")
    return counters and dict(counters, planned=planned)


def run_script(script, args, tag):
    """One of the repo's scripts in this section's time -> its log's text (or None, the failure
    said; log_text(tag) still reads what it printed)."""
    log = os.path.join(report_dir, "logs", f"{tag}.log")
    rc, wall, text = run_logged([sys.executable, os.path.join(ROOT, script), *args], log, left() - 5)
    if rc != 0:
        tail = [x for x in text.strip().splitlines() if x][-1:] or [""]
        say(f"FAIL: {script} " + (f"cut at the section's time limit after {wall:.0f} s" if rc is None
                                  else f"exited {rc}: {tail[0]}") + f" (log: logs/{tag}.log)")
        return None
    say(f"{script}: {wall:.0f} s wall (log: logs/{tag}.log)")
    return text


def log_text(tag):
    return open(os.path.join(report_dir, "logs", f"{tag}.log")).read()


def last_json(text):
    """The last JSON line a benchmark printed (its result), or None when it failed."""
    return text and json.loads([x for x in text.strip().splitlines() if x.startswith("{")][-1])


def measured_limits():
    """The limits section's figures from this run, as far as it got ({} when it did not run)."""
    return {k: v for f in read_figures(report_dir, "limits") for k, v in f.items()}


# ---- 1. preflight ----
def check_preflight():
    """One line each, in seconds: what this machine has, what the compiled sections need besides
    torch, whether torch.compile works here (a one-kernel probe), and one summary line."""
    import torch
    from nanovha.hardware import cpu_kind, gpu_spec
    gate_ok, gate = version_gate(torch.__version__)
    say(f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN "
        f"{torch.backends.cudnn.version()}")
    say(f"{gate}  {'PASS' if gate_ok else 'FAIL'}")
    found = dict(torch=torch.__version__, cuda=torch.version.cuda, device=f"CPU (dry run): {cpu_kind()}")
    if device == "cuda":
        p = torch.cuda.get_device_properties(0)
        free, total = torch.cuda.mem_get_info()
        peak, hbm = gpu_spec(p.name)
        found.update(device=p.name, peak=peak, hbm=hbm, free_gib=free / 2**30)
        say(f"device {p.name}, compute capability {p.major}.{p.minor}, {p.multi_processor_count} SMs; memory "
            f"{free / 2**30:.1f} GiB free of {total / 2**30:.1f} GiB; spec " + (
                f"{peak / 1e12:.0f} TFLOP/s dense bf16, HBM {hbm / 1e12:.2f} TB/s" if hbm else "unknown"))
    else:
        say(f"device {found['device']}")
    figure(**found)
    rows = toolchain_lines(cuda=device == "cuda")
    for name, ok, detail in rows:
        say(f"{name:9s} {detail}  {'PASS' if ok else 'FAIL'}")
    figure(toolchain={name: ok for name, ok, _ in rows})
    data = smoke_data(data_dir)
    say(f"smoke data: {data} " + ("(prepared)" if prepared(data) else "(not there: the smoke section makes it)"))
    ok, why = probe_compile(gate_ok, gate)
    figure(compile_ok=ok, why=why)
    memory = f", {found['free_gib']:.1f} GiB free" if "free_gib" in found else ""
    say(f"preflight: torch {torch.__version__}, {found['device']}{memory}; " + (
        f"compile on ({why}): every section as planned" if ok else
        f"EAGER ONLY ({why}): every later section runs eager and says so"))
    return found


def probe_compile(gate_ok, gate):
    """(ok, why): the version gate, then one kernel compiled in a child process, in the time left."""
    if not compile:
        say("compile probe: not run (--compile=False)")
        return False, "--compile=False"
    if not gate_ok:
        return False, gate
    ok, seconds, line = compile_probe(device, os.path.join(report_dir, "logs", "compile_probe.log"), left() - 5)
    say(line)
    if ok is None:  # slow is not broken: compile stays on
        return True, f"the one-kernel probe was not done in {seconds:.0f} s"
    return ok, (f"a one-kernel probe in {seconds:.1f} s" if ok else
                line.removeprefix("compile probe: ").removesuffix("  FAIL") + " (logs/compile_probe.log)")


# ---- 4. limits ----
def check_limits():
    import torch
    from nanovha.hardware import copy_bandwidth, gpu_spec, matmul_peak
    peak, hbm = gpu_spec(torch.cuda.get_device_name()) if device == "cuda" else (None, None)
    mib, n = (16, 256) if dry_run else (1024, 8192)
    dtype = torch.float32 if dry_run else torch.bfloat16
    bw = copy_bandwidth(device, mib)
    say(f"copy bandwidth {bw / 1e9:,.0f} GB/s (a {mib} MiB copy, read + write)"
        + (f" = {bw / hbm:.0%} of the {hbm / 1e12:.2f} TB/s spec" if hbm else ""))
    figure(copy_gb_s=bw / 1e9, copy_mib=mib)
    flops = matmul_peak(device, dtype, n)
    say(f"matmul {n}^3 {str(dtype)[6:]} {flops / 1e9:,.0f} GFLOP/s"
        + (f" = {flops / peak:.0%} of the {peak / 1e12:.0f} TFLOP/s dense bf16 spec" if peak else ""))
    figure(matmul_tflop_s=flops / 1e12, matmul_n=n, dtype=str(dtype)[6:])
    return dict(copy_gb_s=bw / 1e9, matmul_tflop_s=flops / 1e12)


# ---- 2. correctness ----
def check_correctness():
    """bf16 against a float64 reference on every timed path (nanovha/gpu_sections.py), the compiled
    step last, or not at all where compile cannot work here."""
    from nanovha.gpu_sections import correctness
    from nanovha.hardware import compile_counters
    compiled, why = compiling()
    if not compiled:
        say_eager(why)
    measured = correctness(device, dry_run, compiled, say, figure)
    counters = say_counters("correctness", compile_counters() if compiled else None, cuda_graphs=not dry_run)
    return dict(measured, compile_counters=counters)


# ---- 7. SDPA kernels ----
def check_kernels():
    from nanovha.gpu_sections import sdpa_kernels
    return dict(failed=sdpa_kernels(device, dry_run, decode_variants.split(","), say, figure))


# ---- 5. train ----
def check_train():
    """bench.py on the small model (2 layers of the 120M's shape: its kernels, and a cold compile
    measured), then on the 120M when the time left allows it; each run's figures appended by
    bench.py itself as they are measured."""
    compiled, why = compiling()
    if not compiled:
        say_eager(why)
    shape = (["--n_embd=64", "--head_dim=16", "--vocab_size=128", "--batch_size=2", "--block_size=64",
              "--train_steps=2", "--warmup=1", "--compile=False", "--dtype=float32", "--device=cpu"] if dry_run else
             ["--n_embd=768", "--head_dim=64", "--vocab_size=50304", "--batch_size=16", "--block_size=1024",
              "--train_steps=10", "--warmup=3", f"--compile={compiled}", "--dtype=bfloat16", "--device=cuda"])
    figures = os.path.join(report_dir, "figures", f"{only or 'train'}.jsonl")
    runs, counters = {}, None
    for n, layers in enumerate((1, 2) if dry_run else TRAIN_LAYERS):
        problem = n and big_run_problem(left() - 5, wall, layers)
        if problem:
            say(problem)
            break
        t0 = time.time()
        result = last_json(run_script("bench.py", [f"--n_layer={layers}", *shape, "--n_head=16", "--vha_kv_head=2",
                                                   "--train_variants=vha,gqa2", f"--figures={figures}"],
                                      f"train_{layers}_layers"))
        wall = time.time() - t0
        if not result:
            break
        say(f"{layers}-layer model " + ("(toy size)" if dry_run else "(the 120M)" if layers == TRAIN_LAYERS[1]
                                        else "(the 120M's width and kernels)") + ":")
        for line in train_lines(result, measured_limits().get("matmul_tflop_s")):
            say(line)
        counters = say_counters("train", result.get("compile_counters"), cuda_graphs=False)
        runs[f"{layers}_layers"] = result["results"]
    return dict(runs=runs, compile_counters=counters) if runs else None


# ---- 6. decode ----
def check_decode():
    """bench_decode.py; every row of its printed table is a figure, kept when a later part (the
    breakdown) is cut."""
    compiled, why = compiling()
    if dry_run:
        args = ["--contexts=128,256", "--n_layer=1", "--n_embd=64", "--head_dim=16", "--decode_steps=3",
                "--warmup=1", "--copy_mib=16", "--compile=off", "--device=cpu", "--dtype=float32"]
    else:
        args = [f"--contexts={contexts}", f"--compile={'graphs' if compiled else 'off'}", "--eager=True",
                "--device=cuda", "--dtype=bfloat16", "--decode_impl=sdpa", "--matmul_n=8192"]
    if not compiled:
        say_eager(why)
    text = run_script("bench_decode.py", [*args, f"--variants={decode_variants}", "--llama_cpp=False"], "decode")
    rows = decode_rows(text or log_text("decode"))
    for row in rows:
        figure(**row)
    result = last_json(text)
    if not result:
        for r in rows:
            say(f"measured before the end: {r['variant']:10s} {r['runtime']:7s} {r['ctx']:>6d} "
                f"{r['decode_tok_s']:9.1f} tok/s")
        return dict(rows=rows) if rows else None
    measured = measured_limits().get("copy_gb_s")
    copy_gb_s = measured or result["copy_gb_s"]
    say(f"set against the copy bandwidth of "
        f"{'the limits section' if measured else 'bench_decode.py'}: "
        f"{copy_gb_s:,.0f} GB/s")
    for line in decode_lines(result, copy_gb_s):
        say(line)
    planned = decode_graphs(len(decode_variants.split(",")), len(contexts.split(",")))
    counters = say_counters("decode", result.get("compile_counters") if compiled else None,
                            cuda_graphs=not dry_run, planned=planned)
    return dict(results=result["results"], breakdown=result["breakdown"], compile_counters=counters)


# ---- 3. smoke ----
def smoke_args(data, out):
    """train.py's arguments: the 120M's config at 2 layers (its compile is the train section's),
    100 iterations; toy sizes on the CPU in the dry run; eager where compile cannot work."""
    toy = ["--n_layer=1", "--n_embd=64", "--n_head=4", "--n_kv_head=2", "--head_dim=16", "--vha_postmix_rank=1",
           "--block_size=64", "--batch_size=2", "--gradient_accumulation_steps=1", "--max_iters=4",
           "--lr_decay_iters=4", "--warmup_iters=1", "--eval_interval=2", "--eval_iters=1", "--log_interval=1",
           "--compile=False", "--dtype=float32", "--device=cpu"] if dry_run else []
    return ["config/fineweb/vha.py", "config/fineweb/smoke.py", f"--data_dir={data}", f"--out_dir={out}",
            "--write_checkpoint=False", f"--max_iters={smoke_iters}", f"--lr_decay_iters={smoke_iters}",
            "--gradient_accumulation_steps=2", f"--warmup_iters={max(smoke_iters // 10, 1)}",
            f"--eval_interval={max(smoke_iters // 3, 1)}", f"--n_layer={TRAIN_LAYERS[0]}",
            *([] if compiling()[0] else ["--compile=False"]), *toy]


def check_smoke():
    data = smoke_data(data_dir)
    if not prepared(data):  # data/synthetic: GPT-2 ids made here in a second, no network
        if run_script("data/synthetic/prepare.py", ["--out_dir", data], "smoke_data") is None:
            return None
    compiled, why = compiling()
    if not compiled:
        say_eager(why)
    out = os.path.join(report_dir, "smoke_run")
    t0 = time.time()
    finished = run_script("train.py", smoke_args(data, out), "smoke") is not None
    wall = time.time() - t0
    log = os.path.join(out, "log.jsonl")
    rows = [json.loads(x) for x in open(log)] if os.path.exists(log) else []  # written by train.py as it goes
    steps, evals = [r for r in rows if "tok_per_s" in r], [r for r in rows if "val_loss" in r]
    for r in evals:
        figure(**{k: r[k] for k in ("iter", "val_loss", "time") if k in r})
    if not steps or not evals:
        return None
    tok_s = statistics.median(r["tok_per_s"] for r in steps[1:] or steps)
    mfu = statistics.median(r["mfu"] for r in steps[1:] or steps) if "mfu" in steps[0] else None
    figure(tok_s=tok_s, mfu=mfu, steps=steps[-1]["iter"] + 1)
    first, last = evals[0]["val_loss"], evals[-1]["val_loss"]
    say(f"data {data}; {steps[-1]['iter'] + 1} steps in {wall:.0f} s wall"
        + ("" if finished else " (cut: what log.jsonl held)") + f", the first done at "
        f"{steps[0]['time']:.0f} s (compiling); checkpoint written: "
        f"{os.path.exists(os.path.join(out, 'ckpt.pt'))}")
    say(f"tokens/s {tok_s:,.0f} (median after the first step), MFU "
        f"{f'{mfu:.1%}' if mfu else 'n/a (no known peak)'}")
    falls = last < first - 1.0
    say(f"val loss {first:.3f} -> {last:.3f}" + ("" if dry_run else f"  {'PASS' if falls else 'FAIL'} (falls by > 1)"))
    counted = {k: evals[-1][k] for k in ("compiled_graphs", "graph_breaks", "cudagraph_skips") if k in evals[-1]}
    counters = say_counters("smoke", counted or None, cuda_graphs=False)
    return dict(tok_s=tok_s, mfu=mfu, val_loss=[first, last], compile_counters=counters)


# ---- the sections, each in its own process; the report written again after every one ----
def run_sections(chosen, header, argv):
    """Each section in its own process group, cut at its limit; the report written after each ->
    the sections."""
    for folder in ("logs", "sections", "figures"):
        os.makedirs(os.path.join(report_dir, folder), exist_ok=True)
    end, done = time.time() + total_s, []
    write_report(report_dir, TITLES, header, done)
    for name in chosen:
        limit = min(SECTION_S[name], end - time.time())
        print(f"\n=== {TITLES[name]} (limit {limit:.0f} s)", flush=True)
        if limit < min(20, SECTION_S[name]):
            done.append(dict(name=name, status="skipped: the check's total_s is spent", wall_s=0.0, lines=[]))
        else:
            cmd = [sys.executable, os.path.abspath(__file__), *argv, f"--only={name}",
                   f"--deadline={time.time() + limit}"]
            log = os.path.join(report_dir, "logs", f"section_{name}.log")
            rc, wall, text = run_logged(cmd, log, limit, own_group=True)
            done.append(dict(name=name, wall_s=wall, **section_status(name, rc, limit, text)))
            print("\n".join(done[-1]["lines"][-40:]), flush=True)
        write_report(report_dir, TITLES, header, done)
    return done


def section_status(name, rc, limit, text):
    """A section's end -> {status, lines}: done, cut or crashed; a part skipped or a FAIL said."""
    result = section_result(report_dir, name) if rc == 0 else None
    # done: the section's own lines; cut or crashed: what its log holds after the command line (its
    # figures are in figures/<name>.jsonl)
    said = result["lines"] if result else [x for x in text.splitlines()[1:] if not x.startswith("FIGURE ")]
    status = ("done" if rc == 0 else f"cut at its limit of {limit:.0f} s" if rc is None else f"exited {rc}")
    counters = ((result or {}).get("figures") or {}).get("compile_counters") or {}
    status += over_plan(name, counters, counters.get("planned"))
    status += " (part skipped)" if any(x.startswith("SKIPPED") for x in said) else ""
    failed = rc != 0 or any("FAIL" in x for x in said)
    return dict(status=status + (" (FAIL)" if failed else ""), lines=said)


def run_one(name):
    """One section, in this process: its lines and figures to sections/<name>.json."""
    figures = {"preflight": check_preflight, "limits": check_limits, "correctness": check_correctness,
               "kernels": check_kernels, "train": check_train, "decode": check_decode, "smoke": check_smoke}[name]()
    with open(os.path.join(report_dir, "sections", f"{name}.json"), "w") as f:
        json.dump(dict(lines=lines, figures=figures), f, default=str)


if __name__ == "__main__":
    try:
        globals().update(settings(defaults, sys.argv[1:], limits={"smoke_iters": at_least(1), "total_s": at_least(1)}))
        # run in ROOT
        report_dir, data_dir = os.path.abspath(report_dir), data_dir and os.path.abspath(data_dir)
        internal = ("--only=", "--deadline=", "--report_dir=", "--data_dir=")
        given = [a for a in sys.argv[1:] if not a.startswith(internal)]
        given += [f"--report_dir={report_dir}", f"--data_dir={data_dir}"]
        chosen = parse_sections(sections)
        SECTION_S = section_limits(section_s)
        problem = None if only else torch_problem() or problems(chosen)
        if problem:
            raise ValueError(problem)
        if dry_run:  # the budget above is the GPU's; a CPU gets more time for the same sections
            SECTION_S, total_s = {k: DRY_RUN_SCALE * v for k, v in SECTION_S.items()}, DRY_RUN_SCALE * total_s
    except ValueError as e:
        sys.exit(f"error: {e}")
    device = "cpu" if dry_run else "cuda"
    if only:
        run_one(only)
        sys.exit(0)
    if not dry_run:
        # the parent only asks whether there is a device: no CUDA context, no GPU memory held
        import torch
        if not torch.cuda.is_available():
            sys.exit("error: no CUDA device: this is the GPU check (use --dry_run to check the script on a CPU)")
    header = (f"GPU check, sections {','.join(chosen)} in at most {total_s} s (limits "
              + ", ".join(f"{n} {SECTION_S[n]} s" for n in chosen) + ")"
              + (f"; DRY RUN: toy sizes on the CPU, eager, mostly float32, limits x{DRY_RUN_SCALE} (no figure here "
                 "says anything about a GPU)" if dry_run else ""))
    done = run_sections(chosen, header, given)
    print("\n" + "=" * 100 + f"\nREPORT ({os.path.join(report_dir, 'report.md')}; paste it into docs/gpu.md)\n"
          + open(os.path.join(report_dir, "report.md")).read())
    sys.exit(1 if any("FAIL" in s["status"] or "skipped" in s["status"] for s in done) else 0)
