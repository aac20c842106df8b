"""ablate.py (the LM grid): the smoke grid runs end to end and writes parseable results; finished runs are
skipped and a half-finished one resumes to the same numbers; the report's verdicts come from paired numbers."""
import csv
import json
import os
import shutil

import pytest

import ablate
from lab import experiments
from conftest import run
from nanovha.checkpoint import load_checkpoint
from lab.experiments import read_json

ENV = {"OMP_NUM_THREADS": "1"}  # tiny models: a second thread only fights over a shared CPU


@pytest.fixture(scope="module")
def smoke(char_data, tmp_path_factory):
    root = tmp_path_factory.mktemp("ablate")
    proc = run("ablate.py", "--smoke", f"--out_root={root}", f"--lm_data_dir={char_data}",
               env={**ENV, "MPLCONFIGDIR": str(root / "mpl")})
    return root, proc.stdout, [f"--out_root={root}", f"--lm_data_dir={char_data}"]


@pytest.mark.slow  # the smoke LM grid
def test_smoke_grid_writes_parseable_results(smoke):
    root, out, _ = smoke
    assert "reduced grid" in out
    rows = read_json(root / "results.json")
    assert len(rows) == 1
    for r in rows:
        assert r["variant"] == "vha" and r["val_loss"] > 0 and r["params"] > 0 and r["kv_bytes_per_token"] == 32
        assert r["flops_per_token"] > 0 and r["tok_per_s"] > 0 and r["curve"][-1][0] == r["tokens"]
    with open(root / "results.csv") as f:
        assert len(list(csv.DictReader(f))) == 1
    assert "VHA (premix + postmix): 54.5" in (root / "report.md").read_text()
    assert os.path.getsize(root / "ablate.png") > 1000


def run_grid(args, capsys):
    """python ablate.py --smoke ARGS, in this process (the training runs are still subprocesses)."""
    capsys.readouterr()
    ablate.cmd_run(ablate.parse_args(["--smoke", *args])[1])
    return capsys.readouterr().out


@pytest.mark.slow  # the smoke LM grid
def test_rerun_skips_finished_runs(smoke, capsys):
    root, _, args = smoke
    path = root / "runs" / "vha" / "seed1337" / "result.json"
    before = os.path.getmtime(path)
    assert run_grid(args, capsys).count("done before, skipped") == 1
    assert os.path.getmtime(path) == before


@pytest.mark.slow  # the smoke LM grid
def test_half_finished_run_resumes_to_the_same_result(smoke, tmp_path, capsys):
    root, _, args = smoke
    done = read_json(root / "runs" / "vha" / "seed1337" / "result.json")
    grid = tmp_path / "grid"  # a copy of the grid in which the run stopped after its checkpoint at step 2 (of 4)
    shutil.copytree(root, grid, ignore=shutil.ignore_patterns("*.pt", "*.png"))
    folder = grid / "runs" / "vha" / "seed1337"
    (folder / "args.json").write_text((folder / "args.json").read_text().replace(str(root), str(grid)))
    for name in ("result.json", "log.jsonl"):
        os.remove(folder / name)
    run("train.py", *read_json(folder / "args.json"), "--max_iters=2", env=ENV)
    assert load_checkpoint(folder / "ckpt.pt")["iter_num"] == 2
    assert "resumed at step 2" in run_grid([f"--out_root={grid}", args[1]], capsys)
    resumed = read_json(folder / "result.json")
    assert resumed["val_loss"] == done["val_loss"] and resumed["curve"] == done["curve"]


def test_bad_input_is_a_one_line_error():
    with pytest.raises(SystemExit, match="unknown variant"):
        ablate.parse_args(["--variants=vha,gqa_9x"])
    with pytest.raises(SystemExit, match="unknown command"):
        ablate.parse_args(["train"])
    with pytest.raises(SystemExit, match="unknown command 'sweep'"):  # the recall sweep is sweep.py's
        ablate.parse_args(["sweep"])


def fake(variant, seed, loss):
    return {"variant": variant, "seed": seed, "args": [], "iters": 10, "block_size": 128, "tokens": 1000,
            "val_loss": loss, "train_loss": loss, "curve": [[0, 4.0], [500, loss + 0.1], [1000, loss]], "params": 1,
            "flops_per_token": 6, "kv_bytes_per_token": 512, "tok_per_s": 100.0, "train_s": 1.0, "wall_s": 2.0}


def test_lm_report_verdicts_are_paired(tmp_path, monkeypatch):
    # seed effects of +-0.05 shared by both variants; VHA is 0.01 lower in every seed: unresolvable unpaired,
    # resolved paired. The 4x-cache variant differs by noise only.
    seed_effect = {0: -0.05, 1: 0.0, 2: 0.05}
    numbers = {"vha": (1.60, [0.0, 0.001, -0.001]), "gqa2": (1.61, [0.0, 0.0, 0.0]),
               "gqa8": (1.60, [0.004, -0.006, 0.003])}
    for v, (loss, noise) in numbers.items():
        for i in range(3):
            os.makedirs(tmp_path / "runs" / v / f"seed{i}")
            (tmp_path / "runs" / v / f"seed{i}" / "result.json").write_text(
                json.dumps(fake(v, i, loss + seed_effect[i] + noise[i])))
    _, cfg = ablate.parse_args(["report", f"--out_root={tmp_path}", "--variants=vha,gqa2,gqa8"])
    monkeypatch.setenv("MPLCONFIGDIR", str(tmp_path / "mpl"))
    ablate.cmd_report(cfg)
    report = (tmp_path / "report.md").read_text()
    row = lambda name: [c.strip() for c in next(line for line in report.splitlines()
                                                if line.startswith(f"| {name} |")).split("|")[1:-1]]
    cells = row("vha vs gqa2")
    assert cells[1] == "+1.41" and cells[2].startswith("-0.0100 ± 0.0006") and cells[2].endswith("n=3)")
    assert cells[3] == "agrees, resolved"
    assert row("vha vs gqa8")[3].endswith("not resolved")
    assert "1 agree with the paper and are resolved" in report and "Primary comparisons" not in report
    _, cfg = ablate.parse_args(["report", f"--out_root={tmp_path}", "--variants=vha,gqa2,gqa8",
                                "--primary=vha-gqa2,vha-gqa8"])
    ablate.cmd_report(cfg)
    report = (tmp_path / "report.md").read_text()
    cells = row("vha - gqa2")  # t = 17.3 at 2 df: p = 0.0033 <= 0.05 / 2
    assert cells[1].startswith("-0.0100 ± 0.0006") and cells[4] == "rejected"
    assert cells[2] == "-0.0125 to -0.0075"  # -0.0100 -+ 4.303 x 0.000577
    assert row("vha - gqa8")[4] == "not rejected" and "checked on our numbers (exploratory)" in report


def test_gpu_preset_runs_the_fineweb_twins():
    _, cfg = ablate.parse_args(["--size=gpu"])
    assert cfg["variant_list"] == ["gqa8", "gqa2", "vha"]
    for v in cfg["variant_list"]:
        args = ablate.lm_args(cfg, v, 1337, "/tmp/x")
        files = ["config/fineweb/vha.py"] + ([] if v == "vha" else [f"config/fineweb/{v}.py"])
        assert args[:len(files)] == files and all(os.path.exists(os.path.join(experiments.ROOT, f)) for f in files)
        assert ("--dataset=fineweb_edu" in args and "--gradient_accumulation_steps=16" in args
                and "--block_size=1024" in args)
    assert ablate.tokens_per_run(cfg) == 4800 * 16 * 32 * 1024  # the budget config/fineweb/*.py state
