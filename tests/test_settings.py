"""Every number a command takes is checked in its one settings() call (nanovha/config.py), before any work or write:
one row per (command, bad setting, the one line it must print). Each row runs the command in this process, as
`python <command> ...` would (it stops in its settings block, so torch is imported once), and checks that nothing
was written: its out_dir (or results root) stays absent and the repository's top level is unchanged."""
import os
import runpy
import sys

import pytest

from conftest import ROOT
from nanovha.config import COMMON_LIMITS, ConfigError, Limit, at_least, at_most, configure, limit_problem

BIG = 10**9  # a generation of a billion positions: gigabytes allocated up front (sample.py: tests/test_reliability.py)
CASES = [  # (command, flags (OUT: a fresh folder under tmp_path; FILE: a config file there), the expected line)
    ("train.py", ["--learning_rate=1e999"], "config key 'learning_rate' must be a finite number, got inf"),
    ("train.py", ["FILE:learning_rate = float('nan')"], "config key 'learning_rate' must be a finite number, got nan"),
    ("train.py", [f"--seed={2**63}"], f"seed must be in 0..2^63-1, got {2**63}"),
    ("train.py", ["--seed=-1"], "seed must be in 0..2^63-1, got -1"),
    ("train.py", ["--DATA_ROOT=/tmp"], "unknown config key 'DATA_ROOT'"),  # an imported constant is not a key
    ("sample.py", ["--temperature=1e999"], "config key 'temperature' must be a finite number, got inf"),
    ("sample.py", [f"--seed={2**64}"], f"seed must be in 0..2^63-1, got {2**64}"),
    ("bench.py", ["--threads=-1"], "threads must be >= 0, got -1"),
    ("bench.py", [f"--seed={2**63}"], "seed must be in 0..2^63-1"),
    ("bench.py", ["--PAPER_VOCAB=5"], "unknown config key 'PAPER_VOCAB'"),
    ("bench_decode.py", ["--threads=-1"], "threads must be >= 0, got -1"),
    ("bench_decode.py", ["--seed=-7"], "seed must be in 0..2^63-1, got -7"),
    ("fold.py", [f"--gen_tokens={BIG}"], f"gen_tokens must be <= {2**20} (its tokens and KV cache are allocated"),
    ("fold.py", ["--plan_tokens=0"], "plan_tokens must be >= 1, got 0"),
    ("sweep.py", [f"--seed={2**63}"], "seed must be in 0..2^63-1"),
    ("sweep.py", ["--threads=-1"], "threads must be >= 0, got -1"),
    ("sweep.py", ["--stop_at_acc=1e999"], "config key 'stop_at_acc' must be a finite number, got inf"),
    ("ablate.py", ["--jobs=0"], "jobs must be >= 1, got 0"),
    ("uptrain.py", [f"--teacher_seed={2**63}"], "teacher_seed must be in 0..2^63-1"),
    ("sweep.py", ["--ROOT=/tmp"], "unknown config key 'ROOT'"),
    ("lab/cpu_report.py", [f"--gen_tokens={BIG}"], f"gen_tokens must be <= {2**20}"),
    ("lab/vector_rates.py", ["--rounds=0"], "rounds must be >= 1, got 0"),
]
OUT_FLAG = {"sweep.py": "--sweep_root", "ablate.py": "--out_root", "uptrain.py": "--out_root",
            "bench.py": None, "bench_decode.py": "--plot", "lab/cpu_report.py": "--work_dir",
            "lab/vector_rates.py": None}


@pytest.mark.parametrize("command, flags, expected", CASES, ids=[f"{c} {' '.join(f)}" for c, f, _ in CASES])
def test_a_bad_number_is_one_line_before_any_write(command, flags, expected, tmp_path, monkeypatch):
    out = tmp_path / "out"
    where = OUT_FLAG.get(command, "--out_dir")
    argv = [f"{where}={out}"] if where else []
    for flag in flags:
        if flag.startswith("FILE:"):
            (tmp_path / "bad.py").write_text(flag[5:] + "\n")
            flag = str(tmp_path / "bad.py")
        argv.append(flag)
    top = sorted(os.listdir(ROOT))
    monkeypatch.setattr(sys, "argv", [os.path.join(ROOT, command), *argv])
    monkeypatch.chdir(ROOT)
    with pytest.raises(SystemExit) as stop:
        runpy.run_path(os.path.join(ROOT, command), run_name="__main__")
    line = str(stop.value.code)
    assert line.startswith("error: ") and "\n" not in line and expected in line, line
    assert not out.exists(), f"{command} wrote {out}"
    assert sorted(os.listdir(ROOT)) == top


LIMIT_CASES = [  # (limit, value, the problem or None): limits are data (a Limit, tuple or list), never eval'd text
    (at_least(1), 0, "k must be >= 1, got 0"),
    (at_least(1), 1, None),
    (at_least(1), None, None),  # None: "derive the default", checked where it is derived
    (("a", "b"), "c", "k must be one of a, b, got 'c'"),
    (("a", "b"), "a", None),
    (Limit("even", lambda v: v % 2 == 0), 3, "k must be even, got 3"),
    ([at_least(1), at_most(9)], 10, "k must be <= 9, got 10"),  # a list: every limit holds
    ([at_least(1), at_most(9)], 0, "k must be >= 1, got 0"),
    (COMMON_LIMITS["seed"], 2**63 - 1, None),
    (COMMON_LIMITS["seed"], 2**63, "k must be in 0..2^63-1, got 9223372036854775808"),
]


@pytest.mark.parametrize("limit, value, problem", LIMIT_CASES)
def test_limits_are_data(limit, value, problem):
    assert limit_problem("k", value, limit) == problem


def test_a_non_finite_float_is_refused_however_it_is_given(tmp_path):
    (tmp_path / "c.py").write_text("lr = float('inf')\n")
    for argv in (["--lr=1e999"], ["--lr=-1e999"], [str(tmp_path / "c.py")]):
        with pytest.raises(ConfigError, match="must be a finite number"):
            configure({"lr": 1e-3}, argv)
    assert configure({"lr": 1e-3}, ["--lr=1e300"])["lr"] == 1e300
