"""lab/gpu_check.py, the GPU check, on the CPU: its dry run (the same command at toy sizes) runs every step and
keeps a readable report when a step's child is killed midway; a step past its limit is stopped with everything it
started; a report never lands on something that is there."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import ROOT, run
from nanovha.processes import run_limited


@pytest.mark.slow  # every step at toy size with cold compiles: about 3 minutes on 2 cores
def test_the_dry_run_runs_every_step_and_a_killed_child_loses_only_its_step(tmp_path):
    out = tmp_path / "report"
    check = subprocess.Popen([sys.executable, "lab/gpu_check.py", f"--out={out}", "--dry_run", "--minutes=60"],
                             cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    first = check.stdout.readline()
    assert first.startswith("gpu check: 7 steps, at most 24 minutes") and "skipped" not in first, first
    while not (out / "smoke" / "log.jsonl").exists():  # the smoke run has trained a step: kill it there
        assert check.poll() is None, check.stdout.read()
        time.sleep(0.2)
    [pid] = subprocess.run(["pgrep", "-f", f"train.py .*{out}"], capture_output=True, text=True).stdout.split()
    os.kill(int(pid), signal.SIGKILL)
    said = first + check.communicate(timeout=900)[0]
    assert check.returncode == 1, said  # a step failed
    report = (out / "report.md").read_text()
    for step in ("preflight", "correctness", "kernels", "train-small", "train-120M", "decode"):
        assert f"## {step}: PASS" in report and f"{step}: PASS" in said, said
        lines = [json.loads(line) for line in (out / f"{step}.jsonl").read_text().splitlines()]
        assert lines and all(line.get("ok", True) for line in lines)
    assert "## smoke: FAIL" in report and "| mha | graphs | 256 |" in report and "| bf16 GQA SDPA" in report
    assert "| vha |" in report and "compiled_graphs" in report  # training rows and their compile counters


def test_a_step_past_its_limit_is_stopped_with_everything_it_started(tmp_path):
    """A child that starts a grandchild in a process group of its own (as ninja starts compilers): both killed."""
    marker = tmp_path / "grandchild"
    code = (f"import subprocess, time; subprocess.Popen(['sleep', '987654'], start_new_session=True);"
            f"open({str(marker)!r}, 'w').close(); time.sleep(1000)")
    with pytest.raises(subprocess.TimeoutExpired):
        run_limited([sys.executable, "-c", code], 3)
    time.sleep(0.2)
    assert marker.exists() and not subprocess.run(["pgrep", "-f", "sleep 987654"], capture_output=True).stdout


@pytest.mark.parametrize("where, needle", [("a_file", "exists and is not an empty folder"),
                                           ("full", "exists and is not an empty folder")])
def test_a_report_never_lands_on_what_is_there(tmp_path, where, needle):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("mine")
    (tmp_path / "a_file").write_text("mine")
    proc = run("lab/gpu_check.py", f"--out={tmp_path / where}", "--dry_run", check=False)
    assert proc.returncode == 1 and proc.stderr.startswith("error: ") and needle in proc.stderr, proc.stderr
    assert (tmp_path / "a_file").read_text() == "mine" and os.listdir(tmp_path / "full") == ["notes.txt"]
