"""scripts/gpu_check.py is prepared for a GPU but must not first fail there: its dry run takes every section on the CPU
(each in its own process, the report written after each, the carried data used, else data made in place), a hung
process is cut at its limit, the section limits fit the budget, and the parts only a GPU reaches (CUDA op names, the
decode and training lines, the compile counters) are fed made-up inputs here."""
import json
import os
import subprocess
import sys
import time

import pytest

from conftest import ROOT, load_script, run
from test_bench import TINY_DECODE, last_json

from nanovha import gpu_plan, gpu_report


@pytest.fixture(scope="module")
def gpu_check():
    return load_script("scripts/gpu_check.py")  # defines only: the check runs under __main__


def section_lines(report_dir):
    return {s["name"]: s for s in json.load(open(os.path.join(report_dir, "report.json")))["sections"]}


@pytest.mark.slow  # every section of the check, on the CPU: about a minute
def test_gpu_check_dry_run_reports_every_section(char_data, tmp_path):
    out = tmp_path / "report"
    proc = run("scripts/gpu_check.py", "--dry_run=True", f"--data_dir={char_data}", f"--report_dir={out}",
               env={"MPLCONFIGDIR": str(tmp_path)})
    done = section_lines(out)
    assert list(done) == ["preflight", "correctness", "smoke", "limits", "train", "decode", "kernels"]
    assert all(s["status"] == "done" for s in done.values()), {k: s["status"] for k, s in done.items()}
    said = {k: "\n".join(s["lines"]) for k, s in done.items()}
    # the version gate, cc, Python.h, triton, numpy, python, the compile probe; then the summary
    assert said["preflight"].count("PASS") == 7 and "FAIL" not in said["preflight"]
    summary = done["preflight"]["lines"][-1]
    assert summary.startswith("preflight: torch ") and "compile on (a one-kernel probe in " in summary
    assert all(s["figures"] for s in done.values())  # every section's figures, as measured, in report.json
    assert said["correctness"].count("PASS") == 6 and "FAIL" not in said["correctness"]  # float64 fold + 5 bf16 paths
    assert "compile counters: 1 graphs (planned 1), 0 graph breaks, 0 CUDA-graph skips" in said["correctness"]
    train = [x for x in done["kernels"]["lines"] if x.startswith("train ")]
    assert len(train) == 4 and all(" flash " in x and "MATH" not in x for x in train)  # CPU flash takes enable_gqa
    assert sum("prefill 64" in x and " flash " in x for x in done["kernels"]["lines"]) == 2  # every decode variant
    assert said["train"].count("VHA / gqa2 tokens/s") == 2 and "of the measured matmul" in said["train"]  # 2 runs
    assert [f["n_layer"] for f in done["train"]["figures"]] == [1] * 4 + [2] * 4  # each: 2 first steps, 2 rows
    eager = [x for x in done["decode"]["lines"] if " eager " in x]
    assert len(eager) == 4 and all("launch-bound" in x and "GB/s" not in x for x in eager)  # 2 variants x 2 contexts
    assert said["decode"].count("context-1 step") == 2 and said["decode"].count("the attention alone") == 2
    for name in ("smoke", "train", "decode"):  # compile is off in the dry run: said, not hidden
        assert "compile counters: none (compile off in this run)" in said[name]
    # the carried data: named in the report and given to train.py
    assert f"data {char_data};" in said["smoke"] and "checkpoint written: False" in said["smoke"]
    assert f"--data_dir={char_data}" in (out / "logs" / "smoke.log").read_text().splitlines()[0]
    assert {f"section_{name}.log" for name in done} <= set(os.listdir(out / "logs"))
    assert "DRY RUN" in (out / "report.md").read_text() and proc.stdout.count("=== ") == 7


def test_gpu_check_runs_only_the_sections_asked_for(tmp_path):
    run("scripts/gpu_check.py", "--dry_run=True", "--sections=limits", f"--report_dir={tmp_path / 'r'}")
    done = section_lines(tmp_path / "r")
    assert list(done) == ["limits"] and "copy bandwidth" in done["limits"]["lines"][0]


def test_each_section_is_reported_when_it_ends_and_a_slow_one_is_cut(gpu_check, char_data, tmp_path, monkeypatch):
    """limits runs; correctness (about 20 s) gets 3 s and is cut: the report is written after each, and keeps the
    first section's figures and the cut one's status."""
    snapshots = []
    write = gpu_check.write_report
    monkeypatch.setattr(gpu_check, "write_report", lambda report_dir, titles, header, done: (
        write(report_dir, titles, header, done), snapshots.append((tmp_path / "report.md").read_text())))
    monkeypatch.setattr(gpu_check, "report_dir", str(tmp_path))
    monkeypatch.setattr(gpu_check, "SECTION_S", dict(gpu_check.SECTION_S, correctness=3))
    t0 = time.time()
    done = gpu_check.run_sections(["limits", "correctness"], "header", ["--dry_run=True", f"--report_dir={tmp_path}",
                                                                       f"--data_dir={char_data}"])
    assert time.time() - t0 < 30 and [s["name"] for s in done] == ["limits", "correctness"]
    # written before the first section, then after each
    assert len(snapshots) == 3 and "copy bandwidth" in snapshots[1] and "correctness" not in snapshots[1]
    assert done[1]["status"] == "cut at its limit of 3 s (FAIL)" and "copy bandwidth" in snapshots[2]


def test_a_hung_process_and_its_children_are_cut_at_the_limit(gpu_check, tmp_path):
    """A process that starts a child and both sleep: cut at 1 s with its whole group; what it printed is kept."""
    child = tmp_path / "child.pid"
    script = (f"import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; "
              f"time.sleep(60)']); open({str(child)!r}, 'w').write(str(p.pid)); print('started', flush=True); "
              "time.sleep(60)")
    t0 = time.time()
    rc, wall, text = gpu_check.run_logged([sys.executable, "-c", script], str(tmp_path / "log"), 1, own_group=True)
    assert rc is None and wall < 10 and time.time() - t0 < 10 and "started" in text
    pid = int(child.read_text())
    for _ in range(100):  # the kill is sent; the child is reaped by init shortly after
        if not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z":
            break
        time.sleep(0.05)
    else:
        raise AssertionError("the hung process's child survived")


@pytest.mark.parametrize("args, message", [  # one row per bad setting: one line, before any section runs
    (["--sections=kernels,warp"], "sections must be a comma-separated subset of "
                                  "preflight,correctness,smoke,limits,train,decode,kernels, got 'kernels,warp'"),
    (["--decode_variants=mha,mla"], "decode_variants: gpu_check knows mha, mqa, gqaN and vha_folded, got 'mha,mla'"),
    (["--data_dir=/no/such/folder"], "the smoke section trains on /no/such/folder/ (train.bin, val.bin, meta.pkl), "
                                     "which is not there: give a prepared --data_dir, or none (carried "
                                     "data/shakespeare, else data/synthetic made here)"),
    (["--total_s=100"], "the limits of sections preflight,correctness,smoke,limits,train,decode,kernels add up to "
                        "{limits} s, more than total_s=100: raise --total_s or leave sections out"),
    (["--section_s=smoke:abc"], "section_s takes section:seconds pairs, e.g. smoke:200 (sections "
                                "preflight,correctness,smoke,limits,train,decode,kernels), got 'smoke:abc'"),
    (["--sections=smoke,train", "--section_s=smoke:300"],
     "the limits of sections smoke,train add up to {smoke_300_train} s, more than total_s={total}: raise --total_s "
     "or leave sections out"),
    (["--total_s=400"], "total_s=400 leaves no rerun: a start ({start} s) and two runs of 400 + {overhead} s exceed "
                        "the {device_s} s of device time"),
    (["--sections=limits", "--report_dir={old}"], "report_dir {old} already holds a report: give a new --report_dir "
                                                  "(or remove that one)"),
])
def test_gpu_check_bad_setting_is_a_one_line_error(args, message, tmp_path):
    old = tmp_path / "old"
    old.mkdir()
    (old / "report.md").write_text("an earlier check")
    proc = run("scripts/gpu_check.py", "--dry_run=True", f"--report_dir={tmp_path / 'new'}",
               *[a.format(old=old) for a in args], check=False)
    plan = dict(limits=sum(limit for limit, _, _ in gpu_plan.PLAN.values()), start=gpu_plan.START_S,
                overhead=gpu_plan.CALL_OVERHEAD_S, device_s=gpu_plan.DEVICE_S, total=gpu_plan.TOTAL_S,
                smoke_300_train=300 + gpu_plan.PLAN["train"][0])
    assert proc.returncode != 0 and proc.stderr.strip() == f"error: {message.format(old=old, **plan)}"
    assert not proc.stdout
    assert (old / "report.md").read_text() == "an earlier check" and not (tmp_path / "new").exists()


def test_gpu_check_without_a_gpu_says_so(tmp_path):
    proc = run("scripts/gpu_check.py", "--sections=limits", f"--report_dir={tmp_path}", check=False)
    assert proc.returncode != 0 and proc.stderr.strip() == (
        "error: no CUDA device: this is the GPU check (use --dry_run to check the script on a CPU)")


def test_sdpa_backend_names_cuda_and_cpu_ops(gpu_check):
    """The profiler's op names on CUDA (flash, mem-efficient, cuDNN), CPU and the math path, as torch 2.13 names
    them."""
    names = {"aten::_scaled_dot_product_flash_attention": "flash", "aten::_flash_attention_forward": "flash",
             "aten::_scaled_dot_product_flash_attention_backward": "flash",
             "aten::_scaled_dot_product_flash_attention_for_cpu": "flash",
             "aten::_scaled_dot_product_efficient_attention": "mem-efficient",
             "aten::_efficient_attention_forward": "mem-efficient",
             "aten::_scaled_dot_product_cudnn_attention": "cuDNN",
             "aten::_scaled_dot_product_attention_math": "math",
             "aten::_scaled_dot_product_attention_math_for_mps": "math",
             "aten::scaled_dot_product_attention": None, "aten::bmm": None, "aten::_softmax": None}
    from nanovha.hardware import sdpa_backend
    assert {n: sdpa_backend(n) for n in names} == names
    assert gpu_plan.describe([], []) == "no SDPA (grouped matmuls)"
    assert gpu_plan.describe(["math"], ["aten::_scaled_dot_product_attention_math"]).startswith("MATH PATH: math")


def test_decode_lines_set_compiled_rows_against_the_measured_copy_and_label_eager_ones(gpu_check):
    """Made-up rows at 128K on a GPU whose copy measured 4,000 GB/s: 800 GB/s is 20%; the KV part (201.3 MB in
    0.056 ms = 3,595 GB/s) is 90%; the eager row gets no bandwidth figure."""
    rows = [dict(variant="vha_folded", runtime="graphs", ctx=131072, decode_tok_s=3000.0, gb_s=800.0),
            dict(variant="vha_folded", runtime="eager", ctx=131072, decode_tok_s=400.0, gb_s=107.0)]
    brk = dict(variant="vha_folded", ms_top=0.333, ms_ctx1=0.277, kv_ms=0.056, kv_gb_s=201.3e6 / 0.056 / 1e6,
               attn_ms=0.07, attn_gb_s=201.3e6 / 0.07 / 1e6)
    result = dict(results=rows, breakdown=[brk], op_floor_ms=0.25)
    lines = gpu_check.decode_lines(result, 4000.0)
    assert "800.0 GB/s of weights + KV = 20% of the measured copy" in lines[0]
    assert "launch-bound" in lines[1] and "GB/s" not in lines[1]
    assert any("KV part 0.056 ms: 3595 GB/s = 90% of the measured copy" in x for x in lines)
    assert any("the attention alone 0.070 ms: 2876 GB/s of K/V = 72%" in x for x in lines)
    brk["kv_gb_s"] = None  # no slower than context 1: said, not divided
    assert any("n/a (no slower than context 1)" in x for x in gpu_check.decode_lines(result, 4000.0))


def test_train_lines_give_mfu_of_the_spec_and_of_the_measured_matmul(gpu_check):
    rows = [dict(variant="vha", heads="8->16Q/2KV", params_m=119.0, flops_per_token=0.794e9, tok_s=400_000.0,
                 mfu=0.321),
            dict(variant="gqa2", heads="16->16Q/2KV", params_m=123.6, flops_per_token=0.817e9, tok_s=380_000.0,
                 mfu=0.314)]
    lines = gpu_check.train_lines(dict(results=rows), 800.0)  # 0.794e9 x 4e5 = 317.6 TFLOP/s of 800 measured
    assert "MFU 32.1% of the spec, 39.7% of the measured matmul" in lines[0]
    assert lines[-1] == "VHA / gqa2 tokens/s: 1.053x (interleaved steps)"


@pytest.mark.slow  # three cold compiles on the CPU: about 45 s
def test_the_first_compiled_call_is_made_under_inference_mode(tmp_path):
    """torch.compile keys a graph on grad mode: a first call outside inference_mode and the timed calls inside it
    would compile every step twice. One variant at one context under --compile=graphs compiles three graphs: the
    step at that context, again at context 1 (the breakdown's floor), and the op-floor model."""
    args = [a for a in TINY_DECODE if a not in ("--compile=off", "--contexts=48,96")]
    out = last_json(run("bench_decode.py", *args, "--contexts=48", "--compile=graphs", "--eager=False",
                        "--variants=vha_folded", env={"MPLCONFIGDIR": str(tmp_path)}))
    assert out["compile_counters"]["compiled_graphs"] == 3 and out["compile_counters"]["graph_breaks"] == 0


def test_the_budget_adds_up_most_valuable_first(gpu_check):
    """The section limits fit the default total_s, and total_s fits twice (a rerun) with a machine's start in the
    device time lent; preflight, correctness and smoke (train.py itself) come first, the kernels last; every section
    has a planned compile count and says how it was counted."""
    limits = [limit for limit, _, _ in gpu_plan.PLAN.values()]
    assert sum(limits) <= gpu_check.total_s == gpu_plan.TOTAL_S
    assert gpu_plan.START_S + 2 * (gpu_check.total_s + gpu_plan.CALL_OVERHEAD_S) <= gpu_plan.DEVICE_S
    assert gpu_plan.budget_problem(gpu_check.total_s) is None
    assert gpu_plan.SECTIONS[:3] == ("preflight", "correctness", "smoke") and gpu_plan.SECTIONS[-1] == "kernels"
    assert set(gpu_check.TITLES) == set(gpu_plan.SECTIONS) and gpu_check.parse_sections(gpu_check.sections) == list(
        gpu_plan.SECTIONS)
    assert all(isinstance(graphs, int) and how for _, graphs, how in gpu_plan.PLAN.values())
    assert gpu_plan.PLAN["preflight"][0] <= 30  # seconds of checks and a one-kernel compile probe
    # the compiled sections start small: smoke at the small model's depth, train small first, then the 120M
    assert gpu_check.TRAIN_LAYERS == (2, 12) and f"--n_layer={gpu_check.TRAIN_LAYERS[0]}" in gpu_check.smoke_args(
        "data", "out")


def test_compile_counters_cannot_hide_a_skip_or_a_recompile():
    """Over the plan: marked on the line and in the report's status. A graph break always FAILs; a CUDA-graph skip
    FAILs where the section's figures claim CUDA graphs."""
    clean = dict(compiled_graphs=5, graph_breaks=0, cudagraph_skips=0)
    assert gpu_plan.counters_line(clean, 5, True) == (
        "compile counters: 5 graphs (planned 5), 0 graph breaks, 0 CUDA-graph skips", [])
    line, fails = gpu_plan.counters_line(dict(clean, compiled_graphs=7, cudagraph_skips=2), 5, cuda_graphs=True)
    assert line.endswith("OVER PLAN") and fails == ["2 CUDA-graph skips"]
    assert gpu_plan.counters_line(dict(clean, cudagraph_skips=2), 5, cuda_graphs=False)[1] == []  # no CUDA graphs
    assert gpu_plan.counters_line(dict(clean, graph_breaks=1), 5, cuda_graphs=False)[1] == ["1 graph breaks"]
    assert gpu_plan.counters_line(None, 2, True) == ("compile counters: none (compile off in this run)", [])
    planned = gpu_plan.PLAN["decode"][1]
    assert gpu_plan.over_plan("decode", dict(clean, compiled_graphs=planned + 1)) == (
        f" (compiled {planned + 1} graphs, planned {planned})")
    assert gpu_plan.over_plan("decode", dict(clean, compiled_graphs=planned)) == "" == gpu_plan.over_plan("smoke", None)
    assert gpu_plan.over_plan("decode", dict(clean, compiled_graphs=7), planned=gpu_plan.decode_graphs(3, 1)) == ""


def test_smoke_makes_its_data_offline_and_imports_no_torch(tmp_path):
    """No carried data: the smoke section makes data/synthetic in place (here a temp folder) and trains on it; the
    section itself only starts processes, so it never imports torch (nor does loading the script)."""
    code = f"""
import json, os, sys, time
sys.path.insert(0, {os.path.join(ROOT, "tests")!r})
from conftest import load_script
gc = load_script("scripts/gpu_check.py")
loaded_torch = "torch" in sys.modules
os.makedirs({str(tmp_path / "r" / "logs")!r})
gc.dry_run, gc.device, gc.report_dir, gc.deadline = True, "cpu", {str(tmp_path / "r")!r}, time.time() + 120
gc.CARRIED, gc.MADE_HERE = {str(tmp_path / "none")!r}, {str(tmp_path / "made")!r}
figures = gc.check_smoke()
print(json.dumps(dict(loaded_torch=loaded_torch, torch="torch" in sys.modules, lines=gc.lines, figures=figures)))
"""
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=240,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not out["loaded_torch"] and not out["torch"]
    assert f"data {tmp_path / 'made'};" in "\n".join(out["lines"]) and out["figures"]["val_loss"][0] > 10  # ln 50257
    assert sorted(os.listdir(tmp_path / "made")) == ["meta.pkl", "train.bin", "val.bin"]


def test_preflight_says_one_line_each_without_the_model(tmp_path):
    """Versions and the version gate, the device, the toolchain, the data, the probe (not run here: --compile=False)
    and a summary line, one line each; neither the model nor the compiler imported in the section's process."""
    code = f"""
import sys
sys.path.insert(0, {os.path.join(ROOT, "tests")!r})
from conftest import load_script
gc = load_script("scripts/gpu_check.py")
gc.dry_run, gc.device, gc.compile, gc.report_dir, gc.only = True, "cpu", False, {str(tmp_path)!r}, "preflight"
gc.check_preflight()
print("model" in sys.modules, "torch._dynamo" in sys.modules)
"""
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    said = [x for x in proc.stdout.strip().splitlines() if not x.startswith("FIGURE ")]
    assert said[-1] == "False False"  # neither the model nor the compiler is imported to say what is there
    assert said[0].startswith("torch ") and said[1].endswith("or later)  PASS") and said[2].startswith("device ")
    assert [x.split()[0] for x in said[3:8]] == ["cc", "Python.h", "triton", "numpy", "python"]
    assert said[8].startswith("smoke data: ") and said[9] == "compile probe: not run (--compile=False)"
    assert said[10].startswith("preflight: torch ") and said[10].endswith(
        "EAGER ONLY (--compile=False): every later section runs eager and says so")
    figures = gpu_report.read_figures(str(tmp_path), "preflight")
    assert figures[0]["torch"] and figures[-1] == dict(compile_ok=False, why="--compile=False")


def test_the_command_to_paste_is_one_line_under_2000_characters():
    """docs/gpu.md gives the one command the device tool runs, with its timeout: the check into $OUT, in
    total_s plus room for the processes' start."""
    text = open(os.path.join(ROOT, "docs", "gpu.md")).read()
    block = text.split("<!-- the command to paste -->")[1].split("```")[1]
    command = [x for x in block.splitlines() if x.startswith("command: ")][0].removeprefix("command: ")
    timeout = int([x for x in block.splitlines() if x.startswith("timeout_s: ")][0].split()[1])
    assert len(command) < 2000 and "python3 scripts/gpu_check.py" in command and "--report_dir=$OUT" in command
    assert gpu_plan.TOTAL_S < timeout <= gpu_plan.TOTAL_S + gpu_plan.CALL_OVERHEAD_S
    assert timeout == gpu_plan.TIMEOUT_S <= 360  # one try of a cold lent machine: about 6 minutes


def test_the_first_block_of_docs_gpu_is_that_command_and_downloads_nothing():
    """docs/gpu.md's first code block is what a lent machine that reaches only the package index runs first: the
    check, one command with one timeout within 6 minutes; no dataset, no hub, no other download before it."""
    text = open(os.path.join(ROOT, "docs", "gpu.md")).read()
    first = text.split("```")[1]
    assert first == text.split("<!-- the command to paste -->")[1].split("```")[1]
    commands = [x for x in first.splitlines() if x.startswith("command: ")]
    assert len(commands) == 1 and commands[0] == "command: python3 scripts/gpu_check.py --report_dir=$OUT"
    assert int(first.split("timeout_s: ")[1].split()[0]) <= 360
    before = text.split("```")[0]
    assert not any(word in first + before for word in ("pip install", "datasets", "prepare.py", "http", "wget"))


@pytest.mark.slow  # cold compiles on the CPU: about a minute
def test_the_planned_compile_counts_are_what_the_cpu_counts(tmp_path):
    """The plan's graphs for train and decode, counted on the CPU at toy size with compile on, the GPU check's
    variants (the counts do not depend on the size)."""
    train = last_json(run("bench.py", "--n_layer=1", "--n_embd=64", "--head_dim=16", "--vocab_size=128",
                          "--batch_size=2", "--block_size=64", "--train_steps=2", "--warmup=1", "--compile=True",
                          "--device=cpu", "--n_head=16", "--vha_kv_head=2", "--train_variants=vha,gqa2"))
    assert train["compile_counters"]["compiled_graphs"] == gpu_plan.PLAN["train"][1]
    gc = load_script("scripts/gpu_check.py")
    decode = last_json(run("bench_decode.py", "--contexts=128", "--n_layer=1", "--n_embd=64", "--head_dim=16",
                           "--decode_steps=3", "--warmup=1", "--copy_mib=16", "--compile=graphs", "--eager=False",
                           "--device=cpu", "--dtype=float32", f"--variants={gc.decode_variants}", "--llama_cpp=False",
                           env={"MPLCONFIGDIR": str(tmp_path)}))
    assert decode["compile_counters"]["compiled_graphs"] == gpu_plan.PLAN["decode"][1] == gpu_plan.decode_graphs(
        len(gc.decode_variants.split(",")), len(gc.contexts.split(",")))


# ---- issue 55: a cold lent machine, one try of about 6 minutes ----
def test_a_cut_process_keeps_what_it_printed_without_flushing(tmp_path):
    """The benchmarks print their figures without flushing; a process cut at its limit must still leave them in its
    log (run_logged runs it unbuffered)."""
    script = "import time; print('measured: 123 tok/s'); time.sleep(60)"
    rc, wall, text = gpu_plan.run_logged([sys.executable, "-c", script], str(tmp_path / "log"), 3)
    assert rc is None and "measured: 123 tok/s" in text


def test_bench_appends_each_model_s_figures_the_moment_they_are_measured(tmp_path):
    """bench.py --figures: each model's first step (the compile, when compiled), then each model's timed row, one
    JSON line each, printed as FIGURE lines too; the rows are the final JSON's."""
    path = tmp_path / "figures" / "train.jsonl"
    proc = run("bench.py", "--n_layer=1", "--n_embd=32", "--head_dim=8", "--n_head=4", "--vha_kv_head=2",
               "--batch_size=2", "--block_size=16", "--train_steps=1", "--warmup=1", "--device=cpu",
               "--train_variants=vha,gqa2", f"--figures={path}")
    figures = [json.loads(x) for x in path.read_text().splitlines()]
    assert [(f["variant"], "first_step_s" in f, "tok_s" in f) for f in figures] == [
        ("vha", True, False), ("gqa2", True, False), ("vha", False, True), ("gqa2", False, True)]
    assert [f["tok_s"] for f in figures[2:]] == [r["tok_s"] for r in last_json(proc)["results"]]
    assert all(f["n_layer"] == 1 and f["compile"] is False for f in figures) and proc.stdout.count("FIGURE {") == 4


def test_decode_rows_are_read_from_bench_decode_s_table_even_when_it_is_cut(tmp_path):
    """bench_decode.py prints its table before the breakdown: every (variant, runtime, context) row is a figure,
    read from the printed table; a log cut after the table (no JSON) gives the same rows, a line cut mid-write none."""
    proc = run("bench_decode.py", *TINY_DECODE, "--variants=mha,vha_folded", env={"MPLCONFIGDIR": str(tmp_path)})
    rows, want = gpu_report.decode_rows(proc.stdout), last_json(proc)["results"]
    assert [(r["variant"], r["runtime"], r["ctx"]) for r in rows] == [(r["variant"], r["runtime"], r["ctx"])
                                                                       for r in want]
    assert all(abs(r["decode_tok_s"] - w["decode_tok_s"]) <= 0.05 for r, w in zip(rows, want))
    printed = proc.stdout.splitlines()  # one table, or one per context: killed after its last row
    last = next(i for i in range(len(printed)) if gpu_report.decode_rows("\n".join(printed[:i + 1])) == rows)
    cut = "\n".join(printed[:last + 1])
    assert gpu_report.decode_rows(cut) == rows and gpu_report.decode_rows(cut[:-20]) == rows[:-1]


def test_a_section_cut_at_its_limit_keeps_its_figures_and_every_earlier_one(tmp_path):
    """The dry run with a simulated hang (NANOVHA_GPU_CHECK_STALL): limits measures the copy bandwidth, then hangs
    and is cut at its limit; report.json keeps the preflight's figures and the cut section's copy figure."""
    out = tmp_path / "r"
    proc = run("scripts/gpu_check.py", "--dry_run=True", "--sections=preflight,limits", "--compile=False",
               "--section_s=limits:4", f"--report_dir={out}", check=False, env={"NANOVHA_GPU_CHECK_STALL": "limits:1"})
    done = section_lines(out)
    assert proc.returncode == 1 and done["preflight"]["status"] == "done"
    assert done["preflight"]["figures"][0]["torch"] and done["preflight"]["figures"][-1]["compile_ok"] is False
    assert done["limits"]["status"] == f"cut at its limit of {4 * gpu_plan.DRY_RUN_SCALE} s (FAIL)"
    assert [sorted(f) for f in done["limits"]["figures"]] == [["copy_gb_s", "copy_mib"]]  # the matmul: never
    assert done["limits"]["lines"][0].startswith("copy bandwidth") and not any(
        x.startswith("FIGURE") for x in done["limits"]["lines"])
    assert "1 figures" in (out / "report.md").read_text()


@pytest.mark.parametrize("left, small_wall, skipped", [(200, 60, False), (60, 60, False), (59, 60, True)])
def test_the_120m_starts_after_the_small_model_only_when_time_is_left(left, small_wall, skipped):
    problem = gpu_plan.big_run_problem(left, small_wall, 12)
    assert (problem or "").startswith(f"SKIPPED the 12-layer run: {left} s left in the section, less than the small "
                                      f"run took ({small_wall} s;") if skipped else problem is None


def test_the_train_section_says_what_it_skipped_and_why(gpu_check, tmp_path, monkeypatch):
    """The small model runs first; when the rule says no, the 120M is skipped, said, and marked in the status."""
    monkeypatch.setattr(gpu_check, "big_run_problem", lambda left, wall, layers: f"SKIPPED the {layers}-layer run")
    for name, value in dict(dry_run=True, report_dir=str(tmp_path), only="train", deadline=time.time() + 120,
                            lines=[], figures_made=[]).items():
        monkeypatch.setattr(gpu_check, name, value)
    os.makedirs(tmp_path / "logs")
    result = gpu_check.check_train()
    assert list(result["runs"]) == ["1_layers"] and gpu_check.lines[-1] == "SKIPPED the 2-layer run"
    assert {f["n_layer"] for f in gpu_report.read_figures(str(tmp_path), "train")} == {1}
    os.makedirs(tmp_path / "sections")
    (tmp_path / "sections" / "train.json").write_text(json.dumps(dict(lines=gpu_check.lines, figures=result)))
    assert gpu_check.section_status("train", 0, 100, "")["status"] == "done (part skipped)"


@pytest.mark.parametrize("version, ok", [("2.11.0+cu130", True), ("2.7.0", True), ("2.13.0+cpu", True),
                                         ("2.10.0a0+git1234", True), ("2.6.0+cu124", False), ("1.13.1", False)])
def test_the_torch_version_gate(version, ok):
    assert gpu_plan.version_gate(version) == (ok, f"torch {version} {'>=' if ok else '<'} 2.7 (the compiled decode "
                                                  "needs 2.7 or later)")


@pytest.mark.parametrize("device, timeout, ok, said", [
    ("no_such_device", 60, False, "RuntimeError: Expected one of cpu"),  # broken: the check runs eager
    ("cpu", 1, None, "not done in 1 s (slow, not known to be broken")])  # slow (a cold start): compile stays on
def test_a_compile_probe_that_fails_or_is_cut_says_so_in_one_line(tmp_path, device, timeout, ok, said):
    result, _, line = gpu_plan.compile_probe(device, str(tmp_path / "log"), timeout)
    assert result is ok and line.startswith(f"compile probe: {said}") and "\n" not in line
    assert line.endswith("  FAIL") == (ok is False) and (ok is not False or "device string: no_such_device" in line)


@pytest.mark.parametrize("knob, probe, expected", [
    (True, None, (True, "")),  # no preflight in this run: as planned
    (True, dict(compile_ok=True, why="a one-kernel probe in 1.0 s"), (True, "")),
    (True, dict(compile_ok=False, why="cc: not found"), (False, "cc: not found")),
    (False, dict(compile_ok=True, why="a one-kernel probe in 1.0 s"), (False, "--compile=False"))])
def test_the_preflight_s_verdict_decides_whether_a_section_compiles(gpu_check, tmp_path, monkeypatch, knob, probe,
                                                                    expected):
    monkeypatch.setattr(gpu_check, "report_dir", str(tmp_path))
    monkeypatch.setattr(gpu_check, "compile", knob)
    if probe:
        gpu_report.append_figure(str(tmp_path / "figures" / "preflight.jsonl"), probe)
    assert gpu_check.compiling() == expected


@pytest.mark.parametrize("section, script, eager_arg", [("check_smoke", "train.py", "--compile=False"),
                                                        ("check_train", "bench.py", "--compile=False"),
                                                        ("check_decode", "bench_decode.py", "--compile=off")])
def test_when_compile_cannot_work_every_later_section_runs_eager_and_says_so(gpu_check, char_data, tmp_path,
                                                                             monkeypatch, section, script, eager_arg):
    started = []
    monkeypatch.setattr(gpu_check, "run_script", lambda name, args, tag: started.append((name, args)))
    for name, value in dict(dry_run=False, report_dir=str(tmp_path), data_dir=char_data, lines=[]).items():
        monkeypatch.setattr(gpu_check, name, value)
    gpu_report.append_figure(str(tmp_path / "figures" / "preflight.jsonl"), dict(compile_ok=False, why="no cc"))
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "decode.log").write_text("")
    assert getattr(gpu_check, section)() is None
    assert started[0][0] == script and eager_arg in started[0][1]
    assert gpu_check.lines[0] == "EAGER: torch.compile is off for this section (no cc); its figures are eager ones"


def test_correctness_runs_its_eager_paths_when_compile_cannot_work(tmp_path):
    code = f"""
import sys
sys.path.insert(0, {os.path.join(ROOT, "tests")!r})
from conftest import load_script
from nanovha.gpu_report import append_figure
gc = load_script("scripts/gpu_check.py")
gc.dry_run, gc.device, gc.report_dir, gc.only = True, "cpu", {str(tmp_path)!r}, "correctness"
append_figure({str(tmp_path / "figures" / "preflight.jsonl")!r}, dict(compile_ok=False, why="no cc"))
gc.check_correctness()
print("torch._dynamo" in sys.modules and bool(__import__("torch")._dynamo.utils.counters["stats"]["unique_graphs"]))
"""
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr
    said = [x for x in proc.stdout.strip().splitlines() if not x.startswith("FIGURE ")]
    assert said[-1] == "False" and sum(x.endswith("(tolerance 5e-02)") and "PASS" in x for x in said) == 4
    assert said[0] == "EAGER: torch.compile is off for this section (no cc); its figures are eager ones"
    assert any(x.endswith("not run (eager only)") for x in said)
    assert "compile counters: none (compile off in this run)" in said
    assert len(gpu_report.read_figures(str(tmp_path), "correctness")) == 5  # the fold and 4 bf16 paths


def test_without_torch_the_check_says_how_to_install_it_in_one_line(tmp_path):
    fake = tmp_path / "no_torch" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'torch'\", name='torch')\n")
    for args in (["--dry_run=True"], []):
        proc = run("scripts/gpu_check.py", *args, f"--report_dir={tmp_path / 'r'}", check=False,
                   env={"PYTHONPATH": str(fake.parent)})
        assert proc.returncode == 1 and not proc.stdout and proc.stderr.strip() == (
            f"error: this python ({sys.executable}) cannot import torch (ModuleNotFoundError: No module named "
            f"'torch'): install it with `{sys.executable} -m pip install torch` (2.7 or later), then run the check "
            "again")
    assert not (tmp_path / "r").exists()


def test_the_torch211_check_runs_the_slow_compiled_tests():
    """scripts/torch211_check.sh SUITE=slow: the slow tests that compile, in files that have them."""
    text = open(os.path.join(ROOT, "scripts", "torch211_check.sh")).read()
    files = text.split('SLOW_COMPILED="')[1].split('"')[0].split()
    assert '-m slow $SLOW_COMPILED' in text and len(files) == 4
    for path in files:
        source = open(os.path.join(ROOT, path)).read()
        assert "pytest.mark.slow" in source and "compile" in source, path
