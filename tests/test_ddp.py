"""
Two processes on CPU (gloo, through torchrun) train what one process trains: the same global batch
(gradient_accumulation_steps is global), so the same loss curve up to float rounding; only rank 0
writes; and a 2-process run resumes from its checkpoint.
"""
import os
import subprocess
import sys

import pytest

from conftest import ROOT, TINY_MODEL
from test_train import read_log

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def torchrun(*args):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "train.py", *map(str, args)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=ENV)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def curve(out):
    """(iter, loss, lr, train_loss, val_loss) rows, wall-clock fields dropped."""
    return [(r["iter"], r.get("loss"), r.get("lr"), r.get("train_loss"), r.get("val_loss")) for r in read_log(out)]


def test_two_processes_match_one_and_resume(char_data, tmp_path):
    args = [f"--data_dir={char_data}", "--max_iters=20", "--lr_decay_iters=20", "--eval_interval=10", "--gradient_accumulation_steps=2",
            "--dropout=0.1", *TINY_MODEL]
    one, two = str(tmp_path / "one"), str(tmp_path / "two")
    proc = subprocess.run([sys.executable, "train.py", f"--out_dir={one}", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env=ENV)
    assert proc.returncode == 0, proc.stderr

    first = torchrun(f"--out_dir={two}", *args[:1], "--max_iters=10", *args[2:])  # stops at 10 ...
    assert "2 process(es)" in first.stdout and first.stdout.count("step 10:") == 1  # rank 0 alone prints
    assert sorted(os.listdir(two)) == ["ckpt.pt", "log.jsonl"]  # ... and alone writes
    torchrun(f"--out_dir={two}", "--init_from=resume", *args)  # ... and resumes to 20 on 2 processes

    a, b = curve(one), curve(two)
    assert [r[0] for r in a] == [r[0] for r in b] and len(a) == 23  # 20 train rows + evals at 0, 10, 20, no duplicates
    for ra, rb in zip(a, b):
        for x, y in zip(ra[1:], rb[1:]):
            assert (x is None) == (y is None) and (x is None or x == pytest.approx(y, rel=1e-5, abs=1e-6)), (ra, rb)
