"""scripts/gpu_check.py is prepared for a GPU but must not first fail there: its dry run takes every step on the CPU,
and the parts only a GPU reaches (CUDA op names, the decode target) are fed made-up inputs here."""
import importlib.util
import os
import re

import pytest

from conftest import ROOT, run


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", os.path.join(ROOT, "scripts", "gpu_check.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # defines only: the check runs under __main__
    return module


@pytest.mark.slow  # every section of the check, on the CPU
def test_gpu_check_dry_run_reports_every_section(tmp_path):
    proc = run("scripts/gpu_check.py", "--dry_run=True", env={"MPLCONFIGDIR": str(tmp_path)})
    report = proc.stdout[proc.stdout.index("REPORT"):]
    for title in ("1. correctness", "2. SDPA kernels", "3. smoke", "4. bench_decode.py"):
        assert title in report
    # float32 and bf16 correctness, the detector, no math path
    assert "FAIL" not in report and report.count("PASS") == 4
    lines = report.splitlines()
    train = [line for line in lines if line.strip().startswith("train ")]
    # CPU flash takes enable_gqa
    assert len(train) == 4 and all(" flash " in line and "MATH" not in line for line in train)
    assert sum("prefill 64" in line and " flash " in line for line in lines) == 4  # every decode variant
    assert [line for line in lines if "MATH PATH" in line] == [
        next(line for line in lines if "forced SDPBackend.MATH" in line)]
    assert "checkpoint written: False" in report and "val loss 10.8" in report  # random GPT-2 tokens: ln 50257 = 10.82
    rows_512 = [line for line in lines if re.match(r"\s*vha_folded\s+eager\s+512\s", line)]
    assert len(rows_512) == 2  # the eager pass and the (dry-run, so eager) graph pass
    assert report.count("context-1 step") == 5  # the breakdown: 4 variants eager, folded VHA in the graph pass
    assert "error" not in proc.stderr.lower()


def test_gpu_check_runs_only_the_sections_asked_for():
    proc = run("scripts/gpu_check.py", "--dry_run=True", "--sections=kernels")
    report = proc.stdout[proc.stdout.index("REPORT"):]
    assert "2. SDPA kernels" in report and "sections kernels" in report
    assert not any(t in report for t in ("1. correctness", "3. smoke", "4. bench_decode.py"))


@pytest.mark.parametrize("arg, message", [
    ("--sections=kernels,warp",
     "sections must be a comma-separated subset of correctness,kernels,smoke,decode, got 'kernels,warp'"),
    ("--decode_variants=mha,mla", "decode_variants: gpu_check knows mha, mqa, gqaN and vha_folded, got 'mha,mla'"),
])
def test_gpu_check_bad_setting_is_a_one_line_error(arg, message):
    proc = run("scripts/gpu_check.py", "--dry_run=True", arg, check=False)
    assert proc.returncode != 0 and proc.stderr.strip() == f"error: {message}" and not proc.stdout


def test_gpu_check_refuses_without_cuda():
    proc = run("scripts/gpu_check.py", check=False)
    assert proc.returncode != 0 and proc.stderr.strip() == (
        "error: no CUDA device: this is the GPU check (use --dry_run to check the script on a CPU)")


def test_sections_parse_in_the_checks_order(gpu_check):
    assert gpu_check.parse_sections("decode,smoke") == ["smoke", "decode"]
    assert gpu_check.parse_sections("correctness,kernels,smoke,decode") == list(gpu_check.SECTIONS)
    with pytest.raises(ValueError):
        gpu_check.parse_sections("")


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


def test_decode_target_is_judged_on_the_kv_part(gpu_check):
    """A made-up CUDA-graph result at 128K on a 4.8 TB/s GPU: the KV part moves 3.6 TB/s (75%), the whole step far
    less."""
    row = dict(variant="vha_folded", ctx=131072, decode_tok_s=3000.0, gb_s=800.0, ttft_ms=20.0)
    brk = dict(variant="vha_folded", ms_top=0.333, ms_ctx1=0.277, kv_ms=0.056, kv_gb_s=201.3e6 / 0.056 / 1e6)
    result = dict(results=[row], breakdown=[brk], op_floor_ms=0.25)
    lines = gpu_check.decode_lines(result, True, 4.8e12)
    target = [line for line in lines if line.startswith("target")]
    assert len(target) == 1 and "75%  PASS" in target[0] and "0.277 of the 0.333 ms step" in target[0]
    assert any("17% of HBM spec" in line for line in lines)  # the whole step: (weights + KV) / time
    # eager: not judged
    assert not any(line.startswith("target") for line in gpu_check.decode_lines(result, False, 4.8e12))
    brk["kv_gb_s"] = None  # no slower than context 1: reported, and the target fails rather than crashing
    assert "0%  FAIL" in gpu_check.decode_lines(result, True, 4.8e12)[-1]
