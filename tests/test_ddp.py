"""
Two processes on CPU (gloo, through torchrun) train what one process trains: the same global batch
(gradient_accumulation_steps is global), so the same loss curve up to float rounding; only rank 0
writes; and a 2-process run resumes from its checkpoint, also after one of its processes was killed.
"""
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import torch

from nanovha.checkpoint import load_checkpoint
from conftest import ROOT, TINY_MODEL, last_iter
from test_train import read_log

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def torchrun(*args):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "train.py",
           *map(str, args)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=ENV)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def curve(out):
    """(iter, loss, lr, grad_norm, train_loss, val_loss) rows, wall-clock fields dropped. grad_norm is the norm of the
    gradient clipping sees: under DDP the average over processes, which must equal one process's whole batch (a sum
    over ranks, or a missing 1 / accumulation, doubles it)."""
    return [(r["iter"], r.get("loss"), r.get("lr"), r.get("grad_norm"), r.get("train_loss"), r.get("val_loss"))
            for r in read_log(out)]


@pytest.mark.slow  # three runs with two processes each
def test_two_processes_match_one_and_resume(char_data, tmp_path):
    args = [f"--data_dir={char_data}", "--max_iters=20", "--lr_decay_iters=20", "--eval_interval=10",
            "--gradient_accumulation_steps=2", "--dropout=0.1", *TINY_MODEL]
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
    assert all(r[3] > 0 for r in a if r[3] is not None) and sum(r[3] is not None for r in a) == 20
    w1, w2 = (load_checkpoint(os.path.join(d, "ckpt.pt"))["model"] for d in (one, two))
    assert all(torch.allclose(w1[k], w2[k], rtol=1e-4, atol=1e-6) for k in w1)  # the same weights after 20 steps


def worker_pids(launcher):
    """{rank: pid} of torchrun's workers: its child processes, by the RANK in their environment."""
    pids = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) != launcher.pid:  # the parent's pid
                    continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
            pids[int(env[b"RANK"])] = int(pid)
        except (OSError, KeyError, ValueError):  # gone meanwhile, or not a worker
            pass
    return pids


def launch_past_first_checkpoint(part, args, max_iters):
    """torchrun of train.py on 2 processes -> (the launcher, {rank: pid}) once the log is past iteration 12, so the
    checkpoint of iteration 10 is on disk."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "train.py",
           f"--out_dir={part}", *args]
    job = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        while len(pids := worker_pids(job)) < 2 or last_iter(part) < 12:
            assert job.poll() is None and last_iter(part) < max_iters, "the run ended before it could be stopped"
            time.sleep(0.001)
    except BaseException:
        job.kill()
        raise
    return job, pids


def assert_one_line_naming_rank_1(err, part):
    """The survivor's report: one line, no rank's traceback (torchrun adds its own report), naming the stopped rank
    and a whole checkpoint to resume from."""
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1 and "RuntimeError" not in err, err
    m = re.fullmatch(r"error: rank 0: process rank 1 of this job died \(or hangs\) at iteration (\d+); "
                     r"(.*) \(iteration (\d+)\) is kept: relaunch with --init_from=resume", errors[0])
    assert m and m[2] == os.path.join(part, "ckpt.pt") and int(m[3]) <= int(m[1]), errors
    assert load_checkpoint(m[2])["iter_num"] == int(m[3]) >= 10  # the checkpoint it names is whole
    assert not [n for n in os.listdir(part) if n.startswith(".tmp")]


@pytest.mark.slow  # about 32 s: three runs, and the survivor waits 5 s for the roll call
@pytest.mark.skipif(not os.path.exists("/proc/self/environ"), reason="finds torchrun's workers in /proc (Linux)")
def test_a_killed_process_stops_the_job_in_one_line_and_it_resumes_exactly(char_data, tmp_path):
    args = [f"--data_dir={char_data}", "--max_iters=60", "--eval_interval=10", "--gradient_accumulation_steps=2",
            "--dropout=0.1", *TINY_MODEL]
    full, part = str(tmp_path / "full"), str(tmp_path / "part")
    proc = subprocess.run([sys.executable, "train.py", f"--out_dir={full}", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env=ENV)
    assert proc.returncode == 0, proc.stderr

    job, pids = launch_past_first_checkpoint(part, args, 60)
    try:
        os.kill(pids[1], signal.SIGKILL)
        killed = time.time()
        out, err = job.communicate(timeout=60)  # not ddp_timeout, nor gloo's default 30 minutes
        stopped = time.time() - killed
    finally:
        job.kill()
        job.wait()
    assert job.returncode != 0 and stopped < 60, (stopped, err)
    assert_one_line_naming_rank_1(err, part)

    torchrun(f"--out_dir={part}", "--init_from=resume", *args)  # to the end, on 2 processes again
    a, b = curve(full), curve(part)
    assert [r[0] for r in a] == [r[0] for r in b] and len(a) == 67  # 60 train rows + evals at 0, 10, ..., 60
    for ra, rb in zip(a, b):
        for x, y in zip(ra[1:], rb[1:]):
            assert (x is None) == (y is None) and (x is None or x == pytest.approx(y, rel=1e-5, abs=1e-6)), (ra, rb)


@pytest.mark.slow  # about 25 s: the survivor waits out --ddp_timeout, then the roll call
@pytest.mark.skipif(not os.path.exists("/proc/self/environ"), reason="finds torchrun's workers in /proc (Linux)")
def test_a_hung_process_stops_the_job_after_ddp_timeout_in_one_line(char_data, tmp_path):
    """SIGSTOP keeps rank 1's connections open, so nothing fails but the collective's wait: rank 0 stops after
    --ddp_timeout (not gloo's default 30 minutes) with one line naming rank 1, and its checkpoint is whole."""
    part, timeout = str(tmp_path / "part"), 8
    job, pids = launch_past_first_checkpoint(part, [f"--data_dir={char_data}", "--max_iters=400", "--eval_interval=10",
                                                    "--gradient_accumulation_steps=2", f"--ddp_timeout={timeout}",
                                                    *TINY_MODEL], 400)
    try:
        os.kill(pids[1], signal.SIGSTOP)
        stopped = time.time()
        while os.path.exists(f"/proc/{pids[0]}") and time.time() - stopped < 120:  # rank 0 waits, then reports
            time.sleep(0.05)
        waited = time.time() - stopped
    finally:
        for pid in pids.values():  # the stopped rank cannot act on torchrun's SIGTERM
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        out, err = job.communicate(timeout=60)
    assert timeout <= waited < timeout + 30, (waited, err)
    assert_one_line_naming_rank_1(err, part)
