"""sweep.py (the recall KV-budget sweep): the smoke sweep runs end to end, a moved results root keeps its runs,
folded VHA scores exactly like unfolded; learning speed is read off the accuracy curve as defined; folders
written by the old ablate.py sweep still report; the robustness report runs; and the recipe in
config/recall_mqar.py learns where the old ramp curriculum stalled."""
import csv
import json
import os
import shutil

import pytest

import sweep
from conftest import run
from lab import experiments
from lab.experiments import read_json

ENV = {"OMP_NUM_THREADS": "1"}  # tiny models: a second thread only fights over a shared CPU


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep")
    proc = run("sweep.py", "--smoke", f"--sweep_root={root}", env={**ENV, "MPLCONFIGDIR": str(root / "mpl")})
    return root, proc.stdout


@pytest.mark.slow  # the smoke sweep: 4 runs + report
def test_smoke_sweep_writes_results_and_folded_vha_scores_identically(smoke, tmp_path):
    root, out = smoke
    rows = read_json(root / "sweep.json")
    assert sorted((r["variant"], r["seed"]) for r in rows) == [("gqa2", 200), ("gqa2", 201), ("vha", 200), ("vha", 201)]
    for r in rows:
        assert 0 <= r["acc"] <= 1 and r["curve"][-1] == [6, r["acc"]] and r["kv_bytes_per_token"] == 2 * 2 * 1 * 8 * 2
        # tiny runs never learn: the budget, a lower bound
        assert r["steps_to_90"] == 6 and 0 <= r["auc"] <= r["acc"] + 1e-9
    gqa, vha = ([r for r in rows if r["variant"] == v and r["seed"] == 200][0] for v in ("gqa2", "vha"))
    assert gqa["args"][3:] != vha["args"][3:] and "--attn=vha" in vha["args"] and "--stop_at_acc=0.99" in vha["args"]
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
    again = run("sweep.py", "--smoke", f"--sweep_root={moved}", env={**ENV, "MPLCONFIGDIR": str(moved / "mpl")})
    assert again.stdout.count("done before, skipped") == 4
    assert read_json(moved / "sweep.json") == rows


@pytest.mark.slow
def test_robustness_runs_each_change_and_reports(smoke, tmp_path):
    root = shutil.copytree(smoke[0], tmp_path / "root")  # the recipe's row is the sweep's own runs
    out = run("sweep.py", "robust", "--smoke", f"--sweep_root={root}",
              env={**ENV, "MPLCONFIGDIR": str(root / "mpl")}).stdout
    report = (root / "robust.md").read_text()
    for name in ["recipe", *sweep.ROBUSTNESS]:
        assert f"| {name} | 0/" in report
    assert out.count("done before, skipped") == 1  # the recipe's gqa2 seed 200 (robust_seeds=1 in --smoke)
    args = read_json(root / "robust" / "independent_init" / "runs" / "n_keys=16,n_values=16" / "gqa2" / "seed200"
                     / "result.json")["args"]
    assert "--paired_init=False" in args and "--n_layer=1" in args  # the change comes after the preset's own overrides
    short = read_json(root / "robust" / "ramp_short" / "runs" / "n_keys=16,n_values=16" / "gqa2" / "seed200"
                      / "result.json")
    assert "--curriculum_iters=3" in short["args"]  # 10% off the smoke preset's 3 steps rounds back to 3


def test_folders_from_the_old_ablate_sweep_still_report(tmp_path, monkeypatch):
    # a result.json as ablate.py sweep wrote it (eval every 50 steps, no early stop, its own steps_to fields)
    for variant, seed, curve in [("gqa2", 1, [[0, 0.0], [50, 0.5], [100, 1.0]]),
                                 ("mha", 1, [[0, 0.0], [50, 0.9], [100, 1.0]]),
                                 ("gqa2", 2, [[0, 0.0], [50, 0.1], [100, 0.1]]),
                                 ("mha", 2, [[0, 0.0], [50, 0.9], [100, 1.0]])]:
        folder = tmp_path / "runs" / "n_keys=64,n_values=64" / variant / f"seed{seed}"
        folder.mkdir(parents=True)
        res = {"point": "n_keys=64,n_values=64", "variant": variant, "seed": seed, "args": [], "spec": {"task": "mqar"},
               "iters": 100, "acc": curve[-1][1], "exact": 0.0, "curve": curve, "steps_to_50": None,
               "steps_to_90": None,
               "params": 1, "kv_bytes_per_token": 64, "train_s": 1.0, "wall_s": 1.0}
        (folder / "result.json").write_text(json.dumps(res))
    monkeypatch.setenv("MPLCONFIGDIR", str(tmp_path / "mpl"))
    _, cfg = sweep.parse_args(["report", f"--sweep_root={tmp_path}", "--points=n_keys=64,n_values=64",
                               "--sweep_variants=mha,gqa2"])
    sweep.cmd_report(cfg)
    rows = {(r["variant"], r["seed"]): r for r in read_json(tmp_path / "sweep.json")}
    # from the curve
    assert rows["gqa2", 1]["steps_to_90"] == pytest.approx(90) and rows["gqa2", 2]["steps_to_90"] == 100
    assert rows["mha", 2]["steps_to_90"] == 50
    line = next(x for x in (tmp_path / "sweep.md").read_text().splitlines() if x.startswith("| mha vs gqa2 |"))
    # steps over all seeds, 50 - 90 and 50 - 100: gqa2 failed on seed 2 (its 100 is the budget), so not tested
    assert "| -45 (n=2, not tested) | - | -40 (n=1: not judged) | - |" in line  # then seed 1 alone, conditional
    assert "| 1 / 0 (p = 1) |" in line  # success (>= 90% at the end): seed 2 only for mha
    report = (tmp_path / "sweep.md").read_text()
    assert "| gqa2 | 64 | 1 | 1/2 (1%-99%) |" in report  # Clopper-Pearson: 1 of 2, 1.3% to 98.7%
    assert "Primary comparisons" not in report and "(exploratory)" not in report  # no plan given


def write_runs(root, aucs, point="n_keys=64,n_values=64", iters=100):
    """result.json files whose curves give these AUCs: {variant: [auc per seed]}, flat curves at the AUC."""
    for variant, values in aucs.items():
        for seed, auc in enumerate(values, start=1000):
            folder = root / "runs" / point / variant / f"seed{seed}"
            folder.mkdir(parents=True)
            res = {"point": point, "variant": variant, "seed": seed, "args": [], "spec": {"task": "mqar"},
                   "iters": iters, "acc": auc, "exact": 0.0, "curve": [[0, auc], [iters, auc]], "params": 1,
                   "kv_bytes_per_token": 64, "train_s": 1.0, "wall_s": 1.0}
            (folder / "result.json").write_text(json.dumps(res))


def test_the_primary_comparisons_are_holm_corrected_and_the_rest_marked_exploratory(tmp_path, monkeypatch):
    """Constructed AUCs over 6 seeds: mha - gqa2 = 0.10 + noise (t = 17.3), vha - gqa2 = 0.015 + 1.2 x the same noise
    (t = 2.17 at 5 df, p = 0.08): the primary table gives each p from experiments.t_p_value, its 95% interval and
    Holm's verdict over the two; the paired table below is marked exploratory."""
    noise = [0.01, -0.01, 0.02, -0.02, 0.0, 0.0]  # mean 0, sd 0.0141
    gqa2 = [0.5] * 6
    mha = [0.6 + e for e in noise]
    vha = [0.5 + 0.015 + 1.2 * e for e in noise]
    write_runs(tmp_path, {"mha": mha, "gqa2": gqa2, "vha": vha})
    monkeypatch.setenv("MPLCONFIGDIR", str(tmp_path / "mpl"))
    _, cfg = sweep.parse_args(["report", f"--sweep_root={tmp_path}", "--points=n_keys=64,n_values=64",
                               "--sweep_variants=mha,gqa2,vha", "--primary=vha-gqa2,mha-gqa2"])
    sweep.cmd_report(cfg)
    report = (tmp_path / "sweep.md").read_text()
    rows = {line.split(" | ")[0]: line for line in report.splitlines() if line.startswith("| vha - gqa2") or
            line.startswith("| mha - gqa2")}
    se = 0.0141421356 * 1.2 / 6 ** 0.5
    t = 0.015 / se
    p = experiments.t_p_value(t, 5)
    assert 0.05 < p < 0.1 and experiments.holm({"a": p, "b": 1e-6}) == {"a": False, "b": True}
    assert f"| {p:.2g} | not rejected |" in rows["| vha - gqa2"]
    assert "| +1.50 ± " in rows["| vha - gqa2"] and "n=6)" in rows["| vha - gqa2"]
    low, high = 0.015 - 2.571 * se, 0.015 + 2.571 * se  # t_crit(5) x SE
    assert f"| {low * 100:+.2f} to {high * 100:+.2f} |" in rows["| vha - gqa2"]
    assert rows["| mha - gqa2"].endswith("| rejected |") and "| +10.00 ± 0.58 (17.3 SE, n=6) |" in rows["| mha - gqa2"]
    assert "## Paired comparisons (exploratory)" in report and "the primary ones are above" in report
    assert report.index("## Primary comparisons (Holm-corrected)") < report.index("## Paired comparisons")
    with pytest.raises(SystemExit, match="not two of this run's variants"):
        sweep.parse_args(["report", "--sweep_variants=mha,gqa2", "--primary=vha-gqa2"])


def test_the_change_between_points_is_a_paired_difference_of_differences(tmp_path, monkeypatch):
    """Constructed AUCs, 4 seeds: at the short point mha - gqa2 = 0.02 every seed; at the long one 0.02 + 0.05 +
    noise, so the change is +5.0 points with SE from the noise alone; vha - gqa2 does not change (+0.0)."""
    noise = [0.01, -0.01, 0.005, -0.005]  # mean 0, sd 0.00913
    short, long = "n_keys=64,n_values=64", "n_keys=64,n_values=64,gap=8"
    write_runs(tmp_path, {"mha": [0.52] * 4, "gqa2": [0.5] * 4, "vha": [0.51] * 4}, point=short)
    write_runs(tmp_path, {"mha": [0.47 + e for e in noise], "gqa2": [0.4] * 4, "vha": [0.41] * 4}, point=long)
    monkeypatch.setenv("MPLCONFIGDIR", str(tmp_path / "mpl"))
    _, cfg = sweep.parse_args(["report", f"--sweep_root={tmp_path}", f"--points={short};{long}",
                               "--sweep_variants=mha,gqa2,vha"])
    sweep.cmd_report(cfg)
    report = (tmp_path / "sweep.md").read_text()
    section = report[report.index("## How each comparison changes between points (exploratory)"):]
    rows = {line.split(" | ")[0]: line for line in section.splitlines() if line.startswith("| ")}
    se = 0.0091287 / 2  # sd / sqrt(4)
    assert f"| **+5.0 ± {se * 100:.1f} ({0.05 / se:.1f} SE, n=4)** |" in rows["| mha vs gqa2"]
    assert "| +7.0 ± 0.5 | +2.0 ± 0.0 |" in rows["| mha vs gqa2"]  # Δ there, Δ at the first point
    assert "| +0.0 ± 0.0 (0.0 SE, n=4) |" in rows["| vha vs gqa2"]


def test_bad_input_is_a_one_line_error():
    with pytest.raises(SystemExit, match="unknown variant"):
        sweep.parse_args(["--sweep_variants=mha,gqa3"])
    with pytest.raises(SystemExit, match="unknown command"):
        sweep.parse_args(["train"])
    with pytest.raises(SystemExit, match="no knob"):
        sweep.parse_args(["--points=n_hops=3"])
    with pytest.raises(SystemExit, match="key=integer"):
        sweep.parse_args(["--points=n_keys=big"])
    with pytest.raises(SystemExit, match="robust_point"):
        sweep.parse_args(["robust", "--robust_point=2"])
    with pytest.raises(SystemExit, match="sweep_batch_size=-1: give rows per step"):
        sweep.parse_args(["--sweep_batch_size=-1"])
    _, cfg = sweep.parse_args(["--points=n_keys=64;n_keys=32,head_dim=4"])
    assert [(p[1]["n_keys"], p[2]) for p in cfg["point_list"]] == [(64, {}), (32, {"head_dim": 4})]
    assert cfg["jobs"] == 2 and cfg["threads"] == 1


@pytest.mark.parametrize("flag, point, rows", [
    ([], "n_keys=64,n_values=64", 64),  # the recipe: 64 rows up to 64 keys
    ([], "n_keys=32,n_values=32", 64),
    ([], "n_keys=128,n_values=128", 128),  # and 128 above
    (["--sweep_batch_size=32"], "n_keys=128,n_values=128", 32),  # an explicit size for every point
    (["--sweep_batch_size=256"], "n_keys=64,n_values=64", 256),
])
def test_rows_per_step_follow_the_recipe_unless_given(flag, point, rows):
    _, cfg = sweep.parse_args([*flag, f"--points={point}"])
    args = sweep.sweep_args(cfg, cfg["point_list"][0], "gqa2", 200, "out", "data")
    assert [a for a in args if a.startswith("--batch_size=")] == [f"--batch_size={rows}"]


@pytest.mark.slow
def test_the_recipe_learns_where_the_old_ramp_stalled(tmp_path):
    """GQA-2, seed 100, 128 keys: with every row at the ramp's rounded level (the old recipe) it stayed at 9.4%
    held-out through step 1300; with the mix curriculum of config/recall_mqar.py it reaches 90% before the
    curriculum ends (step 750). About a minute at one thread (128 rows a step)."""
    data = tmp_path / "data"
    run("data/recall/prepare.py", "--n_keys=128", "--n_values=128", "--n_val=512", f"--out_dir={data}")
    run("train.py", "config/recall_mqar.py", f"--data_dir={data}", f"--out_dir={tmp_path / 'out'}", "--seed=100",
        "--n_kv_head=2", "--stop_at_acc=0.9", "--write_checkpoint=False", env=ENV)
    evals = [json.loads(line) for line in open(tmp_path / "out" / "log.jsonl") if '"val_acc"' in line]
    assert evals[-1].get("stopped") and evals[-1]["val_acc"] >= 0.9 and evals[-1]["iter"] <= 750, evals[-1]
