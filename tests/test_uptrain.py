"""uptrain.py (the conversion comparison): the smoke pipeline runs end to end (teacher, both conversions, warm-ups
with and without distillation, scratch baselines, the fold and export of the warmed VHA), the report has every row,
a second invocation skips every finished run, and the paired differences in results.json are the hand-computed ones."""
import json
import math
import os

import numpy as np
import pytest

import uptrain
from conftest import run
from lab import experiments
from lab.experiments import read_json


@pytest.fixture(scope="module")
def smoke(char_data, tmp_path_factory):
    root = tmp_path_factory.mktemp("uptrain")
    args = ["--smoke", f"--out_root={root}", f"--data_dir={char_data}"]
    return root, run("uptrain.py", *args, timeout=600).stdout, args


@pytest.mark.slow  # 22 runs, a teacher, two conversions and a fold: about a minute on 2 cores
def test_smoke_pipeline_reports_every_row(smoke):
    root, out, _ = smoke
    assert "reduced comparison" in out
    assert os.path.exists(root / "converted" / "vha" / "ckpt.pt") and os.path.exists(
        root / "converted" / "gqa" / "ckpt.pt")
    report = (root / "report.md").read_text()
    for v in uptrain.WARM | uptrain.SCRATCH:
        assert f"| {v} |" in report
    for _, _, what, _ in uptrain.COMPARISONS:
        assert f"| {what} |" in report
    assert "| teacher (GQA 8Q/8KV)" in report
    deployed = report.split("## The deployed model")[1]  # the warmed VHA folded, exported and run in transformers
    assert "-> " in deployed and "gqa, n_head=8, n_kv_head=2" in deployed
    assert "greedy 48 tokens: identical; greedy text equal to sample.py's" in deployed.split("transformers check")[1]
    res = read_json(root / "results.json")
    assert len(res["runs"]) == len(uptrain.VARIANTS) * 2 and len(res["comparisons"]) == len(uptrain.COMPARISONS)
    R = {(r["variant"], r["seed"]): r for r in res["runs"]}
    for seed in (0, 1):  # before warm-up: the iteration-0 eval, before any update, so distillation cannot change it
        assert R[("vha_warm", seed)]["val_before"] == R[("vha_warm_kd", seed)]["val_before"]
        assert R[("gqa_uptrain", seed)]["val_before"] == R[("gqa_uptrain_kd", seed)]["val_before"]
        assert R[("vha_warm", seed)]["iters"] == 3 and R[("vha_scratch_full", seed)]["iters"] == 30
        assert R[("vha_warm_kd_long", seed)]["iters"] == R[("gqa_uptrain_kd_long", seed)]["iters"] == 15
    assert R[("vha_warm", 0)]["val_before"] != R[("vha_warm", 1)]["val_before"]  # the seed changes the eval batches


@pytest.mark.slow
def test_paired_difference_is_the_hand_computation(smoke):
    root, _, _ = smoke
    res = read_json(root / "results.json")
    val = {(r["variant"], r["seed"]): r for r in res["runs"]}
    for c in res["comparisons"]:
        d = np.array([val[(c["first"], s)][c["metric"]] - val[(c["second"], s)][c["metric"]] for s in (0, 1)])
        assert c["n"] == 2 and math.isclose(c["mean"], d.mean(), rel_tol=1e-12, abs_tol=1e-15)
        assert math.isclose(c["se"], abs(d[0] - d[1]) / 2, rel_tol=1e-9, abs_tol=1e-15)  # SD/sqrt(2) of two values
        assert c["resolved"] == (c["se"] > 0 and abs(c["mean"]) / c["se"] > 12.706)  # t(1 df), two-sided 5%


@pytest.mark.slow
def test_second_invocation_skips_every_finished_run(smoke):
    root, _, args = smoke
    results = (sorted(root.glob("runs/*/seed*/result.json")) + sorted(root.glob("converted/*/ckpt.pt"))
               + [root / "teacher" / "ckpt.pt"])
    before = {p: os.path.getmtime(p) for p in results}
    out = run("uptrain.py", *args).stdout
    # every run and the three conversions
    assert out.count("done before, skipped") == len(uptrain.VARIANTS) * 2 + len(uptrain.CONVERSIONS)
    assert "teacher (GQA 8Q/8KV, 30 iters): trained before" in out
    assert {p: os.path.getmtime(p) for p in results} == before


def test_budgets_and_warm_up_argv():
    _, cfg = uptrain.parse_args([])
    assert (cfg["teacher_iters"], cfg["warm_iters"], cfg["freeze_iters"], cfg["n_seeds"]) == (1200, 120, 30, 5)
    warm = uptrain.run_args(cfg, "vha_warm_kd", 3, "/tmp/x")
    assert (warm[0].endswith(os.path.join("converted", "vha", "ckpt.pt")) and "--seed=3" in warm
            and "--freeze_iters=30" in warm)
    assert "--distill_alpha=0.7" in warm and any(a.startswith("--teacher=") for a in warm)
    plain = uptrain.run_args(cfg, "gqa_uptrain", 3, "/tmp/x")
    assert plain[0].endswith(os.path.join("converted", "gqa", "ckpt.pt")) and not any("distill" in a for a in plain)
    schedule = lambda a: [x for x in a if x.startswith(("--learning_rate", "--min_lr", "--warmup_iters", "--max_iters",
                                                          "--freeze"))]
    assert schedule(warm) == schedule(plain)  # one schedule for every warm-up variant
    long = uptrain.run_args(cfg, "gqa_uptrain_kd_long", 3, "/tmp/x")
    assert (cfg["long_warm_iters"], cfg["long_freeze_iters"]) == (600, 150)
    assert ("--max_iters=600" in long and "--lr_decay_iters=600" in long and "--freeze_iters=150" in long
            and "--distill_alpha=0.7" in long)
    assert [a for a in long if a.startswith(("--learning_rate", "--min_lr", "--warmup_iters"))] == [
        a for a in warm if a.startswith(("--learning_rate", "--min_lr", "--warmup_iters"))]  # only the length differs
    fitted = uptrain.run_args(cfg, "vha_fit_warm_kd", 3, "/tmp/x")  # the other conversion, the same schedule
    assert fitted[0].endswith(os.path.join("converted", "vha_fit", "ckpt.pt")) and fitted[1:] == warm[1:]
    assert uptrain.CONVERSIONS["vha_fit"] == ["--to=vha", "--physical=fit"]
    scratch = uptrain.run_args(cfg, "gqa_scratch_short", 3, "/tmp/x")
    assert (scratch[:2] == ["config/vha_small.py", "config/ablations/gqa2.py"]
            and "--max_iters=120" in scratch)
    with pytest.raises(SystemExit, match="uptrain_warmup_iters"):
        uptrain.parse_args(["--teacher_iters=50"])


def test_variants_choose_the_runs_and_the_teacher_eval_always_runs():
    _, cfg = uptrain.parse_args(["--variants=vha_fit_warm_kd,vha_warm_kd"])
    assert cfg["variant_list"] == ["teacher_eval", "vha_warm_kd", "vha_fit_warm_kd"]  # in VARIANTS' order
    with pytest.raises(SystemExit, match="unknown variant"):
        uptrain.parse_args(["--variants=vha_warm,vha_best"])


def test_the_primary_comparisons_are_holm_corrected(tmp_path):
    """Constructed val losses, 5 seeds: fitted - group 0 = -0.01 + noise at 10% (t = 14.1) and +0.001 + noise at 50%
    (t = 1.41): p from experiments.t_p_value, Holm over the two rejects the first only; the table below is
    exploratory."""
    noise = [0.002, -0.002, 0.001, -0.001, 0.0]  # mean 0, sd 0.00158
    losses = {"teacher_eval": [1.5] * 5, "vha_warm_kd": [1.70] * 5, "vha_fit_warm_kd": [1.69 + e for e in noise],
              "vha_warm_kd_long": [1.55] * 5, "vha_fit_warm_kd_long": [1.551 + e for e in noise]}
    for variant, values in losses.items():
        for seed, loss in enumerate(values):
            folder = tmp_path / "runs" / variant / f"seed{seed}"
            folder.mkdir(parents=True)
            (folder / "result.json").write_text(json.dumps({"variant": variant, "seed": seed, "args": [], "iters": 1,
                                                            "val_before": 3.0, "val_loss": loss}))
    _, cfg = uptrain.parse_args(["report", f"--out_root={tmp_path}",
                                 "--primary=vha_fit_warm_kd-vha_warm_kd,vha_fit_warm_kd_long-vha_warm_kd_long"])
    uptrain.cmd_report(cfg)
    report = (tmp_path / "report.md").read_text()
    rows = {line.split(" | ")[0]: line for line in report.splitlines() if line.startswith("| vha_fit")}
    se = 0.0015811 / 5 ** 0.5
    p_long = experiments.t_p_value(0.001 / se, 4)
    assert rows["| vha_fit_warm_kd - vha_warm_kd"].endswith("| rejected |")
    assert rows["| vha_fit_warm_kd_long - vha_warm_kd_long"].endswith(f"| {p_long:.2g} | not rejected |")
    assert "| -0.0100 ± 0.0007 (14.1 SE, n=5) |" in rows["| vha_fit_warm_kd - vha_warm_kd"]
    assert "exploratory: each test on its own" in report
    assert report.index("## Primary comparisons (Holm-corrected)") < report.index("## Paired differences")
