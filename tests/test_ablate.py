"""ablate.py: the smoke LM grid and the smoke recall sweep run end to end and write parseable results; finished
runs are skipped and a half-finished one resumes to the same numbers; folded VHA scores exactly like unfolded;
the paired statistics and the report's verdicts come from the numbers."""
import csv
import json
import os
import shutil

import pytest

import ablate
from conftest import run
from checkpoint import load_checkpoint

ENV = {"OMP_NUM_THREADS": "1"}  # tiny models: a second thread only fights over a shared CPU


@pytest.fixture(scope="module")
def smoke(char_data, tmp_path_factory):
    root = tmp_path_factory.mktemp("ablate")
    proc = run("ablate.py", "--smoke", f"--out_root={root}", f"--lm_data_dir={char_data}",
               env={**ENV, "MPLCONFIGDIR": str(root / "mpl")})
    return root, proc.stdout, [f"--out_root={root}", f"--lm_data_dir={char_data}"]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep")
    proc = run("ablate.py", "sweep", "--smoke", f"--sweep_root={root}", env={**ENV, "MPLCONFIGDIR": str(root / "mpl")})
    return root, proc.stdout


def test_smoke_grid_writes_parseable_results(smoke):
    root, out, _ = smoke
    assert "reduced grid" in out
    rows = ablate.read_json(root / "results.json")
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


def test_rerun_skips_finished_runs(smoke, capsys):
    root, _, args = smoke
    path = root / "runs" / "vha" / "seed1337" / "result.json"
    before = os.path.getmtime(path)
    assert run_grid(args, capsys).count("done before, skipped") == 1
    assert os.path.getmtime(path) == before


def test_half_finished_run_resumes_to_the_same_result(smoke, tmp_path, capsys):
    root, _, args = smoke
    done = ablate.read_json(root / "runs" / "vha" / "seed1337" / "result.json")
    grid = tmp_path / "grid"  # a copy of the grid in which the run stopped after its checkpoint at step 2 (of 4)
    shutil.copytree(root, grid, ignore=shutil.ignore_patterns("*.pt", "*.png"))
    folder = grid / "runs" / "vha" / "seed1337"
    (folder / "args.json").write_text((folder / "args.json").read_text().replace(str(root), str(grid)))
    for name in ("result.json", "log.jsonl"):
        os.remove(folder / name)
    run("train.py", *ablate.read_json(folder / "args.json"), "--max_iters=2", env=ENV)
    assert load_checkpoint(folder / "ckpt.pt")["iter_num"] == 2
    assert "resumed at step 2" in run_grid([f"--out_root={grid}", args[1]], capsys)
    resumed = ablate.read_json(folder / "result.json")
    assert resumed["val_loss"] == done["val_loss"] and resumed["curve"] == done["curve"]


def test_smoke_sweep_writes_results_and_folded_vha_scores_identically(sweep, tmp_path):
    root, out = sweep
    rows = ablate.read_json(root / "sweep.json")
    assert sorted((r["variant"], r["seed"]) for r in rows) == [("gqa2", 1337), ("gqa2", 1338), ("vha", 1337), ("vha", 1338)]
    for r in rows:
        assert 0 <= r["acc"] <= 1 and r["curve"][-1] == [6, r["acc"]] and r["kv_bytes_per_token"] == 2 * 2 * 1 * 8 * 2
    gqa, vha = ([r for r in rows if r["variant"] == v and r["seed"] == 1337][0] for v in ("gqa2", "vha"))
    assert gqa["args"][3:] != vha["args"][3:] and "--attn=vha" in vha["args"]
    for r in rows:  # the deployed (folded) model gives the same argmax everywhere, so the same score
        if r["variant"] == "vha":
            assert r["acc_folded"] == r["acc_unfolded"] == pytest.approx(r["acc"]) and r["fold_same_predictions"]
        else:
            assert "acc_folded" not in r
    report = (root / "sweep.md").read_text()
    assert "| vha vs gqa2 | n_keys=16,n_values=16 |" in report and "Folded == unfolded: 2 VHA-family runs" in report
    assert "2 of 2 give the same argmax" in report and os.path.getsize(root / "sweep.png") > 1000
    with open(root / "sweep.csv") as f:
        assert len(list(csv.DictReader(f))) == 4
    moved = shutil.copytree(root, tmp_path / "moved")  # a results root moved elsewhere keeps its finished runs
    again = run("ablate.py", "sweep", "--smoke", f"--sweep_root={moved}", env={**ENV, "MPLCONFIGDIR": str(moved / "mpl")})
    assert again.stdout.count("done before, skipped") == 4
    assert ablate.read_json(moved / "sweep.json") == rows


def test_a_moved_run_is_the_same_run_but_other_settings_are_refused(tmp_path):
    args = ["config/recall_mqar.py", "--data_dir=/a/data/mqar_n_keys64_1f2e", "--out_dir=/a/runs/p/vha/seed1337", "--seed=1337"]
    assert ablate.same_run(args, [x.replace("/a/", "/b/c/") for x in args])
    assert not ablate.same_run(args, args[:-1] + ["--seed=1338"])
    assert not ablate.same_run(args, [args[0], "--data_dir=/a/data/mqar_n_keys128_1f2e", *args[2:]])
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    ablate.write_json(str(run_dir / "args.json"), args)
    with pytest.raises(SystemExit, match="was started with other settings"):
        ablate.train({"threads": 1}, str(run_dir), args[:-1] + ["--seed=1338"], 1)
    assert ablate.read_json(run_dir / "args.json") == args  # the record of the finished run is untouched


def test_bad_input_is_a_one_line_error():
    with pytest.raises(SystemExit, match="unknown variant"):
        ablate.parse_args(["--variants=vha,gqa_9x"])
    with pytest.raises(SystemExit, match="unknown variant"):
        ablate.parse_args(["sweep", "--sweep_variants=mha,gqa3"])
    with pytest.raises(SystemExit, match="unknown command"):
        ablate.parse_args(["train"])
    with pytest.raises(SystemExit, match="no knob"):
        ablate.parse_args(["sweep", "--points=n_hops=3"])
    with pytest.raises(SystemExit, match="key=integer"):
        ablate.parse_args(["sweep", "--points=n_keys=big"])
    _, cfg = ablate.parse_args(["sweep", "--points=n_keys=64;n_keys=32,head_dim=4"])
    assert [(p[1]["n_keys"], p[2]) for p in cfg["point_list"]] == [(64, {}), (32, {"head_dim": 4})]
    assert cfg["jobs"] == 2 and cfg["threads"] == 1


# ---- paired statistics ----
def test_paired_differences_and_their_test():
    a, b = {1: 1.0, 2: 2.0, 3: 3.5}, {1: 0.5, 2: 1.5, 3: 2.5, 4: 9.0}  # seed 4 is not shared: left out
    n, mean, se, t, resolved = ablate.paired(a, b)
    assert n == 3 and mean == pytest.approx(2 / 3) and se == pytest.approx((1 / 12) ** 0.5 / 3 ** 0.5)
    assert t == pytest.approx(4.0) and not resolved  # df = 2 needs t > 4.303
    assert ablate.paired({1: 1.1, 2: 2.12, 3: 3.1}, {1: 1.0, 2: 2.0, 3: 3.0})[4]  # 0.1, 0.12, 0.1: t = 16
    assert ablate.paired({1: 1.0}, {1: 0.0})[:2] == (1, 1.0) and not ablate.paired({1: 1.0}, {1: 0.0})[4]
    same = lambda n: ablate.paired({s: 1.0 for s in range(n)}, {s: 0.0 for s in range(n)})  # every seed the same difference
    assert same(2)[3:] == (float("inf"), False) and not same(5)[4] and same(6)[4]  # exact sign test: 2 * 0.5**n < 0.05
    assert ablate.paired({1: 1.0, 2: 2.0}, {1: 1.0, 2: 2.0})[3:] == (0.0, False)


def test_mcnemar_counts_only_discordant_seeds():
    a = {s: True for s in range(10)}
    b = {s: s >= 6 for s in range(10)}  # 6 seeds only a, 0 only b: p = 2 / 2^6
    assert ablate.mcnemar(a, b) == (6, 0, pytest.approx(2 / 64))
    assert ablate.mcnemar(b, a)[2] == pytest.approx(2 / 64)
    assert ablate.mcnemar(a, a) == (0, 0, 1.0)
    assert ablate.mcnemar({1: True, 2: False}, {1: False, 2: True}) == (1, 1, 1.0)


def fake(variant, seed, loss):
    return {"variant": variant, "seed": seed, "args": [], "iters": 10, "block_size": 128, "tokens": 1000, "val_loss": loss,
            "train_loss": loss, "curve": [[0, 4.0], [500, loss + 0.1], [1000, loss]], "params": 1, "flops_per_token": 6,
            "kv_bytes_per_token": 512, "tok_per_s": 100.0, "train_s": 1.0, "wall_s": 2.0}


def test_lm_report_verdicts_are_paired(tmp_path, monkeypatch):
    # seed effects of +-0.05 shared by both variants; VHA is 0.01 lower in every seed: unresolvable unpaired,
    # resolved paired. The 4x-cache variant differs by noise only.
    seed_effect = {0: -0.05, 1: 0.0, 2: 0.05}
    numbers = {"vha": (1.60, [0.0, 0.001, -0.001]), "gqa_same_deploy": (1.61, [0.0, 0.0, 0.0]),
               "gqa_4x_cache": (1.60, [0.004, -0.006, 0.003])}
    for v, (loss, noise) in numbers.items():
        for i in range(3):
            os.makedirs(tmp_path / "runs" / v / f"seed{i}")
            (tmp_path / "runs" / v / f"seed{i}" / "result.json").write_text(json.dumps(fake(v, i, loss + seed_effect[i] + noise[i])))
    _, cfg = ablate.parse_args(["report", f"--out_root={tmp_path}", "--variants=vha,gqa_same_deploy,gqa_4x_cache"])
    monkeypatch.setenv("MPLCONFIGDIR", str(tmp_path / "mpl"))
    ablate.cmd_report(cfg)
    report = (tmp_path / "report.md").read_text()
    row = lambda name: [c.strip() for c in next(line for line in report.splitlines() if line.startswith(f"| {name} |")).split("|")[1:-1]]
    cells = row("vha vs gqa_same_deploy")
    assert cells[1] == "+1.41" and cells[2].startswith("-0.0100 ± 0.0006") and cells[2].endswith("n=3)")
    assert cells[3] == "agrees, resolved"
    assert row("vha vs gqa_4x_cache")[3].endswith("not resolved")
    assert "1 agree with the paper and are resolved" in report


def test_gpu_preset_runs_the_fineweb_twins():
    _, cfg = ablate.parse_args(["--size=gpu"])
    assert cfg["variant_list"] == ["gqa_4x_cache", "gqa_same_deploy", "vha"]
    for v in cfg["variant_list"]:
        args = ablate.lm_args(cfg, v, 1337, "/tmp/x")
        assert args[0] == f"config/fineweb/{v}.py" and os.path.exists(os.path.join(ablate.ROOT, args[0]))
        assert "--dataset=fineweb_edu" in args and "--gradient_accumulation_steps=16" in args and "--block_size=1024" in args
    assert ablate.tokens_per_run(cfg) == 4800 * 16 * 32 * 1024  # the budget config/fineweb/*.py state
