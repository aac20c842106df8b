"""scripts/gpu_check.py is prepared for a GPU but must not first fail there: its dry run takes every section on the CPU
(each in its own process, the report written after each, the carried data used), a hung process is cut at its limit,
and the parts only a GPU reaches (CUDA op names, the decode and training lines) are fed made-up inputs here."""
import json
import os
import subprocess
import sys
import time

import pytest

from conftest import ROOT, load_script, run
from test_bench import TINY_DECODE, last_json


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
    assert list(done) == ["limits", "correctness", "kernels", "train", "decode", "smoke"]
    assert all(s["status"] == "done" for s in done.values()), {k: s["status"] for k, s in done.items()}
    said = {k: "\n".join(s["lines"]) for k, s in done.items()}
    assert said["correctness"].count("PASS") == 6 and "FAIL" not in said["correctness"]  # float64 fold + 5 bf16 paths
    train = [x for x in done["kernels"]["lines"] if x.startswith("train ")]
    assert len(train) == 4 and all(" flash " in x and "MATH" not in x for x in train)  # CPU flash takes enable_gqa
    assert sum("prefill 64" in x and " flash " in x for x in done["kernels"]["lines"]) == 3  # every decode variant
    assert "VHA / gqa2 tokens/s" in said["train"] and "of the measured matmul" in said["train"]
    eager = [x for x in done["decode"]["lines"] if " eager " in x]
    assert len(eager) == 6 and all("launch-bound" in x and "GB/s" not in x for x in eager)  # 3 variants x 2 contexts
    assert said["decode"].count("context-1 step") == 3 and said["decode"].count("the attention alone") == 3
    # the carried data: named in the report and given to train.py
    assert f"data {char_data};" in said["smoke"] and "checkpoint written: False" in said["smoke"]
    assert f"--data_dir={char_data}" in (out / "logs" / "smoke.log").read_text().splitlines()[0]
    assert {f"section_{name}.log" for name in done} <= set(os.listdir(out / "logs"))
    assert "DRY RUN" in (out / "report.md").read_text() and proc.stdout.count("=== ") == 6


def test_gpu_check_runs_only_the_sections_asked_for(tmp_path):
    run("scripts/gpu_check.py", "--dry_run=True", "--sections=limits", f"--report_dir={tmp_path / 'r'}")
    done = section_lines(tmp_path / "r")
    assert list(done) == ["limits"] and "copy bandwidth" in done["limits"]["lines"][0]


def test_each_section_is_reported_when_it_ends_and_a_slow_one_is_cut(gpu_check, char_data, tmp_path, monkeypatch):
    """limits runs; correctness (about 20 s) gets 3 s and is cut: the report is written after each, and keeps the
    first section's figures and the cut one's status."""
    snapshots = []
    write = gpu_check.write_report
    monkeypatch.setattr(gpu_check, "write_report", lambda header, done: (
        write(header, done), snapshots.append((tmp_path / "report.md").read_text())))
    monkeypatch.setattr(gpu_check, "report_dir", str(tmp_path))
    monkeypatch.setattr(gpu_check, "SECTION_S", dict(gpu_check.SECTION_S, correctness=3))
    t0 = time.time()
    done = gpu_check.run_sections(["limits", "correctness"], "header", ["--dry_run=True", f"--report_dir={tmp_path}",
                                                                       f"--data_dir={char_data}"])
    assert time.time() - t0 < 30 and [s["name"] for s in done] == ["limits", "correctness"]
    assert len(snapshots) == 2 and "copy bandwidth" in snapshots[0] and "correctness" not in snapshots[0]
    assert done[1]["status"] == "cut at its limit of 3 s (FAIL)" and "copy bandwidth" in snapshots[1]


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
                                  "limits,correctness,kernels,train,decode,smoke, got 'kernels,warp'"),
    (["--decode_variants=mha,mla"], "decode_variants: gpu_check knows mha, mqa, gqaN and vha_folded, got 'mha,mla'"),
    (["--data_dir=/no/such/folder"], "the smoke section trains on /no/such/folder/ (train.bin, val.bin, meta.pkl), "
                                     "which is not there: prepare it on a CPU machine (python data/shakespeare/"
                                     "prepare.py) and carry it along, or give --data_dir, or leave smoke out of "
                                     "--sections"),
    (["--sections=limits", "--report_dir={old}"], "report_dir {old} already holds a report: give a new --report_dir "
                                                  "(or remove that one)"),
])
def test_gpu_check_bad_setting_is_a_one_line_error(args, message, tmp_path):
    old = tmp_path / "old"
    old.mkdir()
    (old / "report.md").write_text("an earlier check")
    proc = run("scripts/gpu_check.py", "--dry_run=True", f"--report_dir={tmp_path / 'new'}",
               *[a.format(old=old) for a in args], check=False)
    assert proc.returncode != 0 and proc.stderr.strip() == f"error: {message.format(old=old)}" and not proc.stdout
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
    assert gpu_check.describe([], []) == "no SDPA (grouped matmuls)"
    assert gpu_check.describe(["math"], ["aten::_scaled_dot_product_attention_math"]).startswith("MATH PATH: math")


def test_decode_lines_set_compiled_rows_against_the_measured_copy_and_label_eager_ones(gpu_check):
    """Made-up rows at 128K on a GPU whose copy measured 4,000 GB/s: 800 GB/s is 20%; the KV part (201.3 MB in
    0.056 ms = 3,595 GB/s) is 90%; the eager row gets no bandwidth figure."""
    rows = [dict(variant="vha_folded", runtime="graphs", ctx=131072, decode_tok_s=3000.0, gb_s=800.0),
            dict(variant="vha_folded", runtime="eager", ctx=131072, decode_tok_s=400.0, gb_s=107.0)]
    brk = dict(variant="vha_folded", ms_top=0.333, ms_ctx1=0.277, kv_ms=0.056, kv_gb_s=201.3e6 / 0.056 / 1e6,
               attn_ms=0.07, attn_gb_s=201.3e6 / 0.07 / 1e6)
    result = dict(results=rows, breakdown=[brk], op_floor_ms=0.25,
                  compile_counters=dict(compiled_graphs=10, graph_breaks=0, cudagraph_skips=0))
    lines = gpu_check.decode_lines(result, 4000.0)
    assert "800.0 GB/s of weights + KV = 20% of the measured copy" in lines[0]
    assert "launch-bound" in lines[1] and "GB/s" not in lines[1]
    assert any("KV part 0.056 ms: 3595 GB/s = 90% of the measured copy" in x for x in lines)
    assert any("the attention alone 0.070 ms: 2876 GB/s of K/V = 72%" in x for x in lines)
    assert lines[-1] == "compile counters: 10 graphs, 0 graph breaks, 0 CUDA-graph skips"
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
