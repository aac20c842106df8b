"""ablate.py: the smoke grid runs end to end and writes parseable results; finished runs are skipped and a
half-finished one resumes to the same numbers; folded VHA scores exactly like unfolded; the report's
verdicts come from the numbers."""
import csv
import json
import os
import shutil
from dataclasses import asdict

import pytest
import torch

import ablate
from conftest import run
from data.recall import tasks
from model import load_checkpoint, model_from_checkpoint, save_checkpoint
from test_recall import greedy_answer, one_thread  # noqa: F401 (an autouse fixture)

ENV = {"OMP_NUM_THREADS": "1"}  # tiny models: a second thread only fights over a shared CPU


@pytest.fixture(scope="module")
def smoke(char_data, tmp_path_factory):
    root = tmp_path_factory.mktemp("ablate")
    proc = run("ablate.py", "--smoke", f"--out_root={root}", f"--lm_data_dir={char_data}",
               env={**ENV, "MPLCONFIGDIR": str(root / "mpl")})
    return root, proc.stdout, [f"--out_root={root}", f"--lm_data_dir={char_data}"]


def run_dir(root, kind):
    return root / "runs" / "vha" / "seed1337" / kind


def test_smoke_grid_writes_parseable_results(smoke):
    root, out, _ = smoke
    assert "reduced grid" in out
    rows = ablate.read_json(root / "results.json")
    assert sorted(r["kind"] for r in rows) == ["lm", "recall"]
    for r in rows:
        assert r["variant"] == "vha" and r["val_loss"] > 0 and r["params"] > 0 and r["kv_bytes_per_token"] == 32
        assert r["flops_per_token"] > 0 and r["tok_per_s"] > 0 and r["curve"][-1][0] == r["tokens"]
    recall = next(r for r in rows if r["kind"] == "recall")["recall"]
    assert set(recall) == set(tasks.TASKS) and all(set(c) == {"96", "128"} for c in recall.values())
    assert recall["mqar"]["96"]["n"] == 3 * 3  # 3 examples x 3 queries
    with open(root / "results.csv") as f:
        assert len(list(csv.DictReader(f))) == 2
    report = (root / "report.md").read_text()
    assert "VHA (premix + postmix): 54.5" in report and "mqar@128*" in report
    assert os.path.getsize(root / "ablate.png") > 1000


def run_grid(args, capsys):
    """python ablate.py --smoke ARGS, in this process (the training runs are still subprocesses)."""
    capsys.readouterr()
    ablate.cmd_run(ablate.parse_args(["--smoke", *args])[1])
    return capsys.readouterr().out


def test_rerun_skips_finished_runs(smoke, capsys):
    root, _, args = smoke
    before = {k: os.path.getmtime(run_dir(root, k) / "result.json") for k in ("lm", "recall")}
    out = run_grid(args, capsys)
    assert out.count("done before, skipped") == 2
    assert before == {k: os.path.getmtime(run_dir(root, k) / "result.json") for k in ("lm", "recall")}


def test_half_finished_run_resumes_to_the_same_result(smoke, tmp_path, capsys):
    root, _, args = smoke
    done = ablate.read_json(run_dir(root, "lm") / "result.json")
    # a copy of the grid in which the LM run stopped after its checkpoint at step 2 (of 4)
    grid = tmp_path / "grid"
    shutil.copytree(root, grid, ignore=shutil.ignore_patterns("*.pt", "*.png"))
    shutil.copy(run_dir(root, "recall") / "ckpt.pt", run_dir(grid, "recall"))
    for path in grid.glob("runs/*/*/*/args.json"):  # the recorded train.py arguments name the folder
        path.write_text(path.read_text().replace(str(root), str(grid)))
    for name in ("result.json", "log.jsonl"):
        os.remove(run_dir(grid, "lm") / name)
    recorded = ablate.read_json(run_dir(grid, "lm") / "args.json")
    run("train.py", *recorded, "--max_iters=2", env=ENV)
    assert load_checkpoint(run_dir(grid, "lm") / "ckpt.pt")["iter_num"] == 2
    out = run_grid([f"--out_root={grid}", args[1]], capsys)
    assert "lm: resumed at step 2" in out and "recall: done before, skipped" in out
    resumed = ablate.read_json(run_dir(grid, "lm") / "result.json")
    assert resumed["val_loss"] == done["val_loss"] and resumed["curve"] == done["curve"]
    # other eval settings: the finished recall run is evaluated again, not retrained
    out = run_grid([f"--out_root={grid}", args[1], "--eval_examples=2"], capsys)
    assert "lm: done before, skipped" in out and "recall: trained before" in out
    assert ablate.read_json(run_dir(grid, "recall") / "result.json")["recall"]["mqar"]["96"]["n"] == 2 * 3


def test_folded_vha_scores_identically(smoke):
    root, _, _ = smoke
    folder = run_dir(root, "recall")
    ckpt = load_checkpoint(folder / "ckpt.pt")
    vha = model_from_checkpoint(ckpt).eval()
    cfg, state = vha.fold_to_gqa()
    folded_ckpt = {k: v for k, v in ckpt.items() if k not in ("optimizer", "scaler")}
    save_checkpoint(dict(folded_ckpt, model=state, model_args=asdict(cfg)), folder / "ckpt_folded.pt")
    gqa = model_from_checkpoint(load_checkpoint(folder / "ckpt_folded.pt")).eval()
    assert gqa.cfg.attn == "gqa" and not any("mix" in k for k in gqa.state_dict())
    # examples whose answers are the VHA model's own greedy output: VHA scores 100%, and so must the fold
    with torch.no_grad():
        examples = [greedy_answer(vha, ex) for t in ("vt", "passkey") for ex in tasks.eval_set(t, 96, 4)]
    assert tasks.score(vha, examples) == tasks.score(gqa, examples) == [[True]] * len(examples)
    # and the CLI on both checkpoints, including contexts longer than the training block (128 > 96)
    common = [f"--out_dir={folder}", "--eval_examples=4", "--eval_lengths=96,128", "--device=cpu"]
    run("ablate.py", "eval", *common, "--ckpt_name=ckpt_folded.pt", env=ENV)
    ablate.cmd_eval(ablate.parse_args(["eval", *common])[1])
    a, b = (ablate.read_json(folder / f"recall_{n}.json")["recall"] for n in ("ckpt", "ckpt_folded"))
    assert a == b and set(a["mqar"]) == {"96", "128"}


def test_bad_input_is_a_one_line_error(smoke):
    root, _, _ = smoke
    with pytest.raises(SystemExit, match="unknown variant"):
        ablate.parse_args(["--variants=vha,gqa_9x"])
    with pytest.raises(SystemExit, match="unknown command"):
        ablate.parse_args(["train"])
    _, cfg = ablate.parse_args(["eval", f"--out_dir={root}", "--device=cpu"])
    with pytest.raises(SystemExit, match="not found"):
        ablate.cmd_eval(cfg)
    _, cfg = ablate.parse_args(["eval", f"--out_dir={run_dir(root, 'lm')}", "--device=cpu"])
    with pytest.raises(SystemExit, match="not trained on the recall tasks"):
        ablate.cmd_eval(cfg)


# ---- the report judges the paper's comparisons from the numbers ----
def fake(variant, seed, kind, loss, acc):
    r = {"variant": variant, "seed": seed, "kind": kind, "args": [], "iters": 10, "block_size": 128, "tokens": 1000,
         "val_loss": loss, "train_loss": loss, "curve": [[0, 4.0], [500, loss + 0.1], [1000, loss]], "params": 1,
         "flops_per_token": 6, "kv_bytes_per_token": 512, "tok_per_s": 100.0, "train_s": 1.0, "wall_s": 2.0}
    if kind == "recall":
        r["recall"] = {t: {"128": {"acc": acc, "n": 10, "chance": 0.0}, "256": {"acc": 0.0, "n": 10, "chance": 0.0}} for t in tasks.TASKS}
    return r


def test_report_verdicts_follow_the_data(tmp_path, monkeypatch):
    assert ablate.compare([1.60, 1.61, 1.605], [1.70, 1.71, 1.705], False, 1)[2].startswith("agrees, resolved")
    assert ablate.compare([1.70, 1.71, 1.705], [1.60, 1.61, 1.605], False, 1)[2].startswith("opposite, resolved")
    assert "within seed spread" in ablate.compare([1.60, 1.70, 1.65], [1.61, 1.71, 1.66], False, 1)[2]
    assert ablate.compare([1.6], [1.7], False, 1)[2].startswith("1 seed")
    # VHA: lower loss than same-deploy GQA beyond the spread, but recall only within it
    numbers = {"vha": (1.60, [0.50, 0.60, 0.55]), "gqa_same_deploy": (1.70, [0.52, 0.58, 0.54])}
    for v, (loss, accs) in numbers.items():
        for i, acc in enumerate(accs):
            for kind in ("lm", "recall"):
                path = tmp_path / "runs" / v / f"seed{i}" / kind
                os.makedirs(path)
                (path / "result.json").write_text(json.dumps(fake(v, i, kind, loss + 0.001 * i, acc)))
    _, cfg = ablate.parse_args(["report", f"--out_root={tmp_path}", "--variants=vha,gqa_same_deploy",
                                "--eval_lengths=128,256", "--recall_block_size=128"])
    monkeypatch.setenv("MPLCONFIGDIR", str(tmp_path / "mpl"))
    ablate.cmd_report(cfg)
    report = (tmp_path / "report.md").read_text()
    row = next(line for line in report.splitlines() if line.startswith("| vha vs gqa_same_deploy"))
    cells = [c.strip() for c in row.split("|")[1:-1]]
    assert cells[1] == "+1.41" and cells[2] == "-0.1000" and cells[3].startswith("agrees, resolved")
    assert cells[5].startswith("agrees, within seed spread")
    assert "1 agree with the paper beyond the seed spread" in report


def test_recall_near_chance_is_not_judged():
    def run_at(acc, chance, n=400):
        return {"block_size": 128, "recall": {t: {"128": {"acc": acc, "n": n, "chance": chance}} for t in tasks.TASKS}}
    floor = ablate.chance_floor(run_at(0.0, 0.01))
    assert 0.01 < floor < 0.02  # 1% + 3 SE of a 400-answer guess, averaged over three cells
    # two guessers 1.5 points apart, with tiny seed spread: "resolved" by SE, but both at chance
    M = {v: {"val_loss": [1.6, 1.61, 1.62], "recall": accs, "chance_floor": floor}
         for v, accs in (("vha", [0.0150, 0.0151, 0.0152]), ("gqa_same_deploy", [0.0001, 0.0002, 0.0003]))}
    row = next(line for line in ablate.comparison_lines(M) if line.startswith("| vha vs gqa_same_deploy"))
    assert "both at chance: not judged" in row
    M["vha"]["recall"] = [0.30, 0.31, 0.32]  # one side clearly above chance: judged again
    row = next(line for line in ablate.comparison_lines(M) if line.startswith("| vha vs gqa_same_deploy"))
    assert "agrees, resolved" in row
