"""scripts/gpu_check.py is prepared for a GPU but must not first fail there: its dry run takes every step on the CPU."""
from conftest import run


def test_gpu_check_dry_run_reports_every_section(tmp_path):
    proc = run("scripts/gpu_check.py", "--dry_run=True", env={"MPLCONFIGDIR": str(tmp_path)})
    report = proc.stdout[proc.stdout.index("REPORT"):]
    for title in ("1. correctness", "2. SDPA kernel", "3. smoke", "4. bench_decode.py"):
        assert title in report
    assert report.count("PASS") == 2 and "FAIL" not in report  # the float32 and bf16 correctness lines
    assert "flash_attention" in report  # CPU SDPA runs its flash kernel for these shapes
    assert "val loss 10.8" in report  # random GPT-2 tokens: the loss stays near ln 50257 = 10.82
    assert report.count("vha_folded") == 4  # two contexts, eager and the (dry-run) compiled pass
    assert "error" not in proc.stderr.lower()


def test_gpu_check_refuses_without_cuda():
    proc = run("scripts/gpu_check.py", check=False)
    assert proc.returncode != 0 and proc.stderr.strip() == (
        "error: no CUDA device: this is the GPU check (use --dry_run to check the script on a CPU)")
