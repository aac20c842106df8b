"""
The one prepared GPU check, for the GPU machine as it is lent: its own python3 and torch (2.11 or
later), no package index, no hub, about 15 minutes of device time with the start. Seven sections,
most valuable first, in at most total_s (6 minutes, so a rerun fits too: nanovha/gpu_plan.py),
nothing to carry; docs/gpu.md has the command to paste and what each section measures.

    python3 scripts/gpu_check.py --report_dir=$OUT               # every section
    python3 scripts/gpu_check.py --sections=smoke --section_s=smoke:200 --report_dir=$OUT/rerun
    python scripts/gpu_check.py --dry_run=True                   # toy sizes on the CPU: every path that runs there

1. preflight: versions, the device and its free memory, cc and Python.h, triton, numpy 2.
correctness: bf16 against a float64 reference on every timed path (forward, eager and compiled
decode), the fold 3. smoke: train.py, config/fineweb/vha.py + smoke.py (compile + bf16) on
data/shakespeare when carried, else on
   data/synthetic, made in place offline: the loss must fall
4. limits: copy bandwidth and a bf16 matmul, beside the spec sheet 5. train: bench.py, the 120M
VHA and its same-deploy GQA twin (compile, bf16, fused AdamW), interleaved 6. decode:
bench_decode.py, MHA and folded VHA under CUDA graphs at 128K, eager beside (launch-bound) 7.
kernels: the SDPA backend (profiler op names) of training, prefill and decode steps; FAIL on the
math path

Each section runs in its own process group with a time limit, importing only what it needs; each
subprocess it starts has the time the section has left. report.md and report.json are written
again after each section and every log stays in report_dir/logs, so a cut keeps what was
measured. Correctness, smoke, train and decode print their compile counters (graphs, graph
breaks, CUDA-graph skips); the report marks a section that compiled more graphs than planned.
Nothing in the tests depends on a GPU.
"""
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from nanovha.config import at_least, flat_defaults, settings  # noqa: E402
from nanovha.variants import GQA_N, overrides  # noqa: E402
from nanovha.gpu_plan import (DRY_RUN_SCALE, PLAN, SECTIONS, TOTAL_S, budget_problem, counters_line,  # noqa: E402
                              decode_graphs, decode_lines, describe, over_plan, parse_sections, run_logged,
                              section_limits, toolchain_lines, train_lines)

# -----------------------------------------------------------------------------
dry_run = False  # CPU, toy sizes: checks that every step of this script runs
sections = ",".join(SECTIONS)  # any of them, comma-separated, run in this order
report_dir = "out-gpu-check"  # report.md, report.json, logs/ (on the lent machine: $OUT)
data_dir = ""  # the smoke section's token bins; "": data/shakespeare if prepared, else data/synthetic (made here)
total_s = TOTAL_S  # the whole check; a section that cannot get 20 s more is skipped, and says so
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
              smoke="3. smoke: train.py (config/fineweb/vha.py + smoke.py), compile + bf16",
              limits="4. limits: copy bandwidth and a large matmul, measured here",
              train="5. train: 120M VHA vs its same-deploy GQA twin (bench.py: compile, bf16, fused AdamW)",
              decode="6. decode: MHA and folded VHA under CUDA graphs (bench_decode.py), eager beside",
              kernels="7. SDPA kernels (profiler): training, prefill and decode steps")
CARRIED, MADE_HERE = os.path.join(ROOT, "data", "shakespeare"), os.path.join(ROOT, "data", "synthetic")
# what this section says: printed as it goes (the log keeps it) and written to its JSON at the end
lines = []


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


def say(line):
    print(line, flush=True)
    lines.append(line)


def left():
    return deadline - time.time()


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
    said)."""
    log = os.path.join(report_dir, "logs", f"{tag}.log")
    rc, wall, text = run_logged([sys.executable, os.path.join(ROOT, script), *args], log, left() - 5)
    if rc != 0:
        tail = [x for x in text.strip().splitlines() if x][-1:] or [""]
        say(f"FAIL: {script} " + (f"cut at the section's time limit after {wall:.0f} s" if rc is None
                                  else f"exited {rc}: {tail[0]}") + f" (log: logs/{tag}.log)")
        return None
    say(f"{script}: {wall:.0f} s wall (log: logs/{tag}.log)")
    return text


def last_json(text):
    """The last JSON line a benchmark printed (its result), or None when it failed."""
    return text and json.loads([x for x in text.strip().splitlines() if x.startswith("{")][-1])


def measured_limits():
    """The limits section's figures from this run ({} when it did not run)."""
    path = os.path.join(report_dir, "sections", "limits.json")
    return json.load(open(path))["figures"] if os.path.exists(path) else {}


# ---- 1. preflight ----
def check_preflight():
    """One line each, in seconds: what this machine has, and what the compiled sections need
    besides torch."""
    import torch
    from nanovha.hardware import cpu_kind, gpu_spec
    say(f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN "
        f"{torch.backends.cudnn.version()}")
    figures = dict(torch=torch.__version__, cuda=torch.version.cuda, device=f"CPU (dry run): {cpu_kind()}")
    if device == "cuda":
        p = torch.cuda.get_device_properties(0)
        free, total = torch.cuda.mem_get_info()
        peak, hbm = gpu_spec(p.name)
        figures.update(device=p.name, peak=peak, hbm=hbm, free_gib=free / 2**30)
        say(f"device {p.name}, compute capability {p.major}.{p.minor}, {p.multi_processor_count} SMs; memory "
            f"{free / 2**30:.1f} GiB free of {total / 2**30:.1f} GiB; spec " + (
                f"{peak / 1e12:.0f} TFLOP/s dense bf16, HBM {hbm / 1e12:.2f} TB/s" if hbm else "unknown"))
    else:
        say(f"device {figures['device']}")
    for name, ok, detail in toolchain_lines(cuda=device == "cuda"):
        say(f"{name:9s} {detail}  {'PASS' if ok else 'FAIL'}")
    data = smoke_data(data_dir)
    say(f"smoke data: {data} " + ("(prepared)" if prepared(data) else "(not there: the smoke section makes it)"))
    return figures


# ---- 4. limits ----
def check_limits():
    import torch
    from nanovha.hardware import copy_bandwidth, gpu_spec, matmul_peak
    peak, hbm = gpu_spec(torch.cuda.get_device_name()) if device == "cuda" else (None, None)
    mib, n = (16, 256) if dry_run else (1024, 8192)
    dtype = torch.float32 if dry_run else torch.bfloat16
    bw, flops = copy_bandwidth(device, mib), matmul_peak(device, dtype, n)
    say(f"copy bandwidth {bw / 1e9:,.0f} GB/s (a {mib} MiB copy, read + write)"
        + (f" = {bw / hbm:.0%} of the {hbm / 1e12:.2f} TB/s spec" if hbm else ""))
    say(f"matmul {n}^3 {str(dtype)[6:]} {flops / 1e9:,.0f} GFLOP/s"
        + (f" = {flops / peak:.0%} of the {peak / 1e12:.0f} TFLOP/s dense bf16 spec" if peak else ""))
    return dict(copy_gb_s=bw / 1e9, matmul_tflop_s=flops / 1e12)


# ---- 2. correctness ----
def max_rel(a, ref):
    return ((a.double() - ref).abs().max() / ref.abs().max()).item()


def check_correctness():
    import torch
    from model import GPT, GPTConfig, fold_to_gqa
    from nanovha.hardware import compile_counters
    tol = 5e-2  # bf16: a few rounding steps of ~0.4% each through the layers
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=128, block_size=256, n_layer=2, n_embd=64 if dry_run else 512, n_head=16,
                    head_dim=16 if dry_run else 32, n_kv_head=2, attn="vha", vha_postmix_rank=2)
    vha = GPT(cfg).double()
    with torch.no_grad():  # premix and postmix off the identity, so the fold has something to fold
        for block in vha.blocks:
            block.attn.premix.add_(0.1 * torch.randn_like(block.attn.premix))
            block.attn.postmix_V.normal_(0, 0.3)
    folded = fold_to_gqa(vha)
    idx = torch.randint(cfg.vocab_size, (1, 64), generator=torch.Generator().manual_seed(0)).to(device)
    vha, folded = vha.to(device).eval(), folded.to(device).eval()
    with torch.inference_mode():
        ref = vha(idx)[0]  # (1, 64, vocab) float64, unfolded, uncached: the reference
        d64 = max_rel(folded(idx)[0], ref)
    say(f"float64: folded vs unfolded {d64:.1e}  {'PASS' if d64 < 1e-10 else 'FAIL'} (an exact fold: < 1e-10)")
    a16, f16 = vha.to(torch.bfloat16), folded.to(torch.bfloat16)

    def decoded(model, impl, compiled=False):
        """Logits of positions 31..62: a prefill of 32 tokens, then one token at a time."""
        model.cfg.decode_impl = impl
        model.setup_cache(1, 64)
        out = [model.prefill(idx[:, :32])]
        if compiled:  # the benchmark's graph step: a tensor position over the static cache
            step = torch.compile(model.decode_one_token, fullgraph=True,
                                 mode=None if dry_run else "reduce-overhead")
            pos = torch.tensor([32], device=device)
            for t in range(32, 63):
                out.append(step(idx[:, t:t + 1], pos).clone())
                pos.add_(1)
        else:
            out += [model.decode_one_token(idx[:, t:t + 1], t) for t in range(32, 63)]
        return torch.stack(out, 1)  # (1, 32, vocab)

    with torch.inference_mode():
        paths = {"forward, unfolded": max_rel(a16(idx)[0], ref), "forward, folded": max_rel(f16(idx)[0], ref),
                 "eager decode, grouped": max_rel(decoded(f16, "grouped"), ref[:, 31:63]),
                 "eager decode, sdpa": max_rel(decoded(f16, "sdpa"), ref[:, 31:63]),
                 "compiled step" + (" (dry run: no CUDA graphs)" if dry_run else ", CUDA graphs"):
                     max_rel(decoded(f16, "grouped", compiled=True), ref[:, 31:63])}
    for name, d in paths.items():
        say(f"bf16 {name:40s} {d:.1e} of the largest logit  {'PASS' if d <= tol else 'FAIL'} "
            f"(tolerance {tol:.0e})")
    counters = say_counters("correctness", compile_counters(), cuda_graphs=not dry_run)
    return dict(float64_fold=d64, **{f"bf16 {k}": v for k, v in paths.items()}, compile_counters=counters)


# ---- 3. SDPA kernels ----
def decode_model(variant, **shape):
    """A decode variant as bench_decode.py builds it (nanovha/variants.py): gqaN / mha / mqa
    directly, vha_folded through fold_to_gqa."""
    from model import GPT, GPTConfig, fold_to_gqa
    model = GPT(GPTConfig(**shape, **overrides(variant, shape["n_head"], shape["head_dim"], shape["n_embd"])))
    return fold_to_gqa(model) if variant == "vha_folded" else model


def check_kernels():
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from model import GPT, GPTConfig
    from nanovha.hardware import sdpa_backends
    # as deployed: SDPA in bf16 on CUDA, grouped fp32 on CPU
    decode_impl = "sdpa" if device == "cuda" else "grouped"
    bench_dtype = torch.bfloat16 if device == "cuda" else torch.float32
    failed = []
    train_shape = dict(vocab_size=512, block_size=1024, n_layer=1, n_embd=256 if dry_run else 768, n_head=16,
                       head_dim=64)
    x = torch.randint(512, (2, 128 if dry_run else 1024), device=device)

    def train_step(model, dtype):
        with torch.autocast(device, dtype=dtype, enabled=dtype != torch.float32):
            loss = model(x, x)[1]
        loss.backward()
    for name, kw in (("gqa", dict(n_kv_head=2)), ("vha", dict(n_kv_head=2, attn="vha", vha_postmix_rank=4))):
        model = GPT(GPTConfig(**train_shape, **kw)).to(device).train()
        for dtype in (torch.float32, torch.bfloat16):
            backends, ops = sdpa_backends(lambda: train_step(model, dtype))
            label = f"train {name} 16Q/2KV {'bf16 autocast' if dtype == torch.bfloat16 else 'float32'}"
            say(f"{label:32s} {describe(backends, ops)}")
            if "math" in backends or not backends:
                failed.append(label)
    shape = dict(vocab_size=128, block_size=1024, n_layer=1, n_embd=64 if dry_run else 512, n_head=16,
                 head_dim=16 if dry_run else 32, decode_impl=decode_impl)
    length = 64 if dry_run else 32768  # bench_decode's prefill_max on CUDA
    prompt = torch.randint(128, (1, length), device=device)
    for variant in decode_variants.split(","):
        torch.manual_seed(0)
        model = decode_model(variant, **shape).to(device, bench_dtype).eval()
        model.setup_cache(1, length + 2)
        token = prompt[:, :1]
        for label, step in ((f"prefill {length}", lambda: model.prefill(prompt)),
                            (f"decode step ({decode_impl})", lambda: model.decode_one_token(token, length)),
                            ("static step (graph path)",
                             lambda: model.decode_one_token(token, torch.tensor([length + 1], device=device)))):
            try:
                with torch.inference_mode():
                    backends, ops = sdpa_backends(step)
                line = describe(backends, ops)
            except torch.OutOfMemoryError:  # a math fallback at 32K builds 16 x 32K^2 scores
                backends, line = ["math"], "out of memory (a math fallback?)"
            say(f"{variant:10s} {label:24s} {line}")
            if label.startswith("prefill") and ("math" in backends or not backends):
                failed.append(f"{variant} {label}")
    model = GPT(GPTConfig(**train_shape, n_kv_head=2)).to(device).train()
    with sdpa_kernel([SDPBackend.MATH]):
        backends, ops = sdpa_backends(lambda: train_step(model, torch.float32))
    say(f"{'self-check: forced SDPBackend.MATH':32s} {describe(backends, ops)}  "
        f"{'PASS' if backends == ['math'] else 'FAIL'} (the detector sees the math path)")
    say("FAIL: the math path (or no SDPA) in " + ", ".join(failed) if failed else
        "no training or prefill step takes the math path  PASS")
    return dict(failed=failed)


# ---- 4. training throughput ----
def check_train():
    shape = (["--n_layer=1", "--n_embd=64", "--head_dim=16", "--vocab_size=128", "--batch_size=2", "--block_size=64",
              "--train_steps=2", "--warmup=1", "--compile=False", "--dtype=float32", "--device=cpu"] if dry_run else
             ["--n_layer=12", "--n_embd=768", "--head_dim=64", "--vocab_size=50304", "--batch_size=16",
              "--block_size=1024", "--train_steps=10", "--warmup=3", "--compile=True", "--dtype=bfloat16",
              "--device=cuda"])
    result = last_json(run_script("bench.py", [*shape, "--n_head=16", "--vha_kv_head=2", "--train_variants=vha,gqa2"],
                                  "train"))
    if not result:
        return None
    for line in train_lines(result, measured_limits().get("matmul_tflop_s")):
        say(line)
    return dict(results=result["results"], compile_counters=say_counters("train", result.get("compile_counters"),
                                                                          cuda_graphs=False))


# ---- 5. decode ----
def check_decode():
    if dry_run:
        args = ["--contexts=128,256", "--n_layer=1", "--n_embd=64", "--head_dim=16", "--decode_steps=3",
                "--warmup=1", "--copy_mib=16", "--compile=off", "--device=cpu", "--dtype=float32"]
    else:
        args = [f"--contexts={contexts}", "--compile=graphs", "--eager=True", "--device=cuda", "--dtype=bfloat16",
                "--decode_impl=sdpa", "--matmul_n=8192"]
    result = last_json(run_script("bench_decode.py", [*args, f"--variants={decode_variants}", "--llama_cpp=False"],
                                  "decode"))
    if not result:
        return None
    measured = measured_limits().get("copy_gb_s")
    copy_gb_s = measured or result["copy_gb_s"]
    say(f"set against the copy bandwidth of "
        f"{'the limits section' if measured else 'bench_decode.py'}: "
        f"{copy_gb_s:,.0f} GB/s")
    for line in decode_lines(result, copy_gb_s):
        say(line)
    planned = decode_graphs(len(decode_variants.split(",")), len(contexts.split(",")))
    counters = say_counters("decode", result.get("compile_counters"), cuda_graphs=not dry_run, planned=planned)
    return dict(results=result["results"], breakdown=result["breakdown"], compile_counters=counters)


# ---- 6. smoke ----
def check_smoke():
    data = smoke_data(data_dir)
    if not prepared(data):  # data/synthetic: GPT-2 ids made here in a second, no network
        if run_script("data/synthetic/prepare.py", ["--out_dir", data], "smoke_data") is None:
            return None
    toy = ["--n_layer=1", "--n_embd=64", "--n_head=4", "--n_kv_head=2", "--head_dim=16", "--vha_postmix_rank=1",
           "--block_size=64", "--batch_size=2", "--gradient_accumulation_steps=1", "--max_iters=4",
           "--lr_decay_iters=4", "--warmup_iters=1", "--eval_interval=2", "--eval_iters=1", "--log_interval=1",
           "--compile=False", "--dtype=float32", "--device=cpu"] if dry_run else []
    out = os.path.join(report_dir, "smoke_run")
    args = ["config/fineweb/vha.py", "config/fineweb/smoke.py", f"--data_dir={data}", f"--out_dir={out}",
            "--write_checkpoint=False", f"--max_iters={smoke_iters}", f"--lr_decay_iters={smoke_iters}",
            "--gradient_accumulation_steps=2", f"--warmup_iters={max(smoke_iters // 10, 1)}",
            f"--eval_interval={max(smoke_iters // 3, 1)}", *toy]
    t0 = time.time()
    if run_script("train.py", args, "smoke") is None:
        return None
    wall = time.time() - t0
    rows = [json.loads(x) for x in open(os.path.join(out, "log.jsonl"))]
    steps, evals = [r for r in rows if "tok_per_s" in r], [r for r in rows if "val_loss" in r]
    tok_s = statistics.median(r["tok_per_s"] for r in steps[1:] or steps)
    mfu = statistics.median(r["mfu"] for r in steps[1:] or steps) if "mfu" in steps[0] else None
    first, last = evals[0]["val_loss"], evals[-1]["val_loss"]
    say(f"data {data}; {steps[-1]['iter'] + 1} steps in {wall:.0f} s wall, the first done at "
        f"{steps[0]['time']:.0f} s (compiling); checkpoint written: "
        f"{os.path.exists(os.path.join(out, 'ckpt.pt'))}")
    say(f"tokens/s {tok_s:,.0f} (median after the first step), MFU "
        f"{f'{mfu:.1%}' if mfu else 'n/a (no known peak)'}")
    falls = last < first - 1.0
    say(f"val loss {first:.3f} -> {last:.3f}" + ("" if dry_run else f"  {'PASS' if falls else 'FAIL'} (falls by > 1)"))
    counted = {k: evals[-1][k] for k in ("compiled_graphs", "graph_breaks", "cudagraph_skips") if k in evals[-1]}
    counters = say_counters("smoke", counted or None, cuda_graphs=False)
    return dict(tok_s=tok_s, mfu=mfu, val_loss=[first, last], compile_counters=counters)


# ---- the report: written again after every section ----
def write_report(header, done):
    body = [header, ""]
    for s in done:
        body += [f"## {TITLES[s['name']]}", "", f"{s['status']}, {s['wall_s']:.0f} s wall", "", "```", *s["lines"],
                 "```", ""]
    with open(os.path.join(report_dir, "report.md"), "w") as f:
        f.write("\n".join(body))
    with open(os.path.join(report_dir, "report.json"), "w") as f:
        json.dump(dict(header=header, sections=done), f, indent=1)


def run_sections(chosen, header, argv):
    """Each section in its own process group, cut at its limit; the report written after each ->
    the sections."""
    os.makedirs(os.path.join(report_dir, "logs"), exist_ok=True)
    os.makedirs(os.path.join(report_dir, "sections"), exist_ok=True)
    end, done = time.time() + total_s, []
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
            result = section_result(name) if rc == 0 else None
            # done: the section's own lines; cut or crashed: what its log holds after the command
            # line
            said = result["lines"] if result else text.splitlines()[1:]
            status = ("done" if rc == 0 else f"cut at its limit of {limit:.0f} s" if rc is None else f"exited {rc}")
            counters = ((result or {}).get("figures") or {}).get("compile_counters") or {}
            status += over_plan(name, counters, counters.get("planned"))
            failed = rc != 0 or any("FAIL" in x for x in said)
            done.append(dict(name=name, status=status + (" (FAIL)" if failed else ""), wall_s=wall, lines=said))
            print("\n".join(said[-40:]), flush=True)
        write_report(with_device(header), done)
    return done


def section_result(name):
    """What a section wrote to sections/<name>.json ({lines, figures}), or None."""
    path = os.path.join(report_dir, "sections", f"{name}.json")
    return json.load(open(path)) if os.path.exists(path) else None


def with_device(header):
    """The header with the preflight's device, torch and CUDA when it ran (the parent never
    touches the GPU)."""
    pre = (section_result("preflight") or {}).get("figures")
    if not pre:
        return header
    spec = (f"spec {pre['peak'] / 1e12:.0f} TFLOP/s dense bf16, HBM {pre['hbm'] / 1e12:.2f} TB/s" if pre.get("hbm")
            else "no spec-sheet figures")
    return f"{header}\n\nDevice {pre['device']}: torch {pre['torch']}, CUDA {pre['cuda']}, {spec}"


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
        problem = None if only else problems(chosen)
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
    sys.exit(1 if any("FAIL" in s["status"] or s["status"].startswith("skipped") for s in done) else 0)
