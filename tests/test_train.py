import json
import os

import pytest

from conftest import TINY_MODEL, run


def read_log(out_dir):
    with open(os.path.join(out_dir, "log.jsonl")) as f:
        return [json.loads(line) for line in f]


def losses(rows):
    """Per-iteration train losses and eval losses, without the wall-clock fields."""
    return [(r["iter"], r.get("loss"), r.get("lr"), r.get("train_loss"), r.get("val_loss")) for r in rows]


@pytest.fixture(scope="module")
def trained(char_data, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("run"))
    run("train.py", f"--data_dir={char_data}", f"--out_dir={out}", "--max_iters=80", "--eval_interval=40", *TINY_MODEL)
    return out


def test_tiny_training_lowers_the_loss(trained):
    evals = [r for r in read_log(trained) if "val_loss" in r]
    assert [r["iter"] for r in evals] == [0, 40, 80]
    assert evals[-1]["val_loss"] < evals[0]["val_loss"] - 1.0, evals
    assert evals[-1]["premix_dev"] > 0 and evals[-1]["postmix_sigma_max"] > 0  # VHA pieces trained
    assert os.path.exists(os.path.join(trained, "ckpt.pt"))


@pytest.mark.parametrize("attn_args", [  # VHA in the quick suite, the other kinds in the slow one
    pytest.param(["--attn=vha"], id="vha"),
    pytest.param(["--attn=gqa", "--dropout=0.1"], id="gqa", marks=pytest.mark.slow),
    pytest.param(["--attn=mla", "--n_kv_head=4", "--qk_norm=False", "--mla_kv_rank=12", "--mla_rope_dim=4"], id="mla",
                 marks=pytest.mark.slow),
    pytest.param(["--attn=mfa", "--n_kv_head=1", "--head_dim=16", "--q_rank=16"], id="mfa", marks=pytest.mark.slow)])
def test_resume_reproduces_the_uninterrupted_run_exactly(char_data, tmp_path, attn_args):
    common = [f"--data_dir={char_data}", "--eval_interval=10", "--lr_decay_iters=30", *TINY_MODEL, *attn_args]
    full, part = str(tmp_path / "full"), str(tmp_path / "part")
    run("train.py", f"--out_dir={full}", "--max_iters=30", *common)
    run("train.py", f"--out_dir={part}", "--max_iters=20", *common)
    run("train.py", f"--out_dir={part}", "--max_iters=30", "--init_from=resume", *common)
    assert losses(read_log(part)) == losses(read_log(full))
    assert len([r for r in read_log(full) if "loss" in r]) == 30
    sample = run("sample.py", f"--out_dir={part}", "--start=ROMEO:", "--max_new_tokens=12", "--temperature=0").stdout
    assert sample.startswith("ROMEO:") and len(sample.split("\n---")[0]) >= 6 + 12  # every attention kind generates


def test_write_checkpoint_false_trains_and_logs_but_writes_no_checkpoint(char_data, tmp_path):
    """What gpu_check's smoke run uses: the evals and the log as usual, no ckpt.pt (1.4 GB at the smoke's size)."""
    out = str(tmp_path / "out")
    run("train.py", f"--data_dir={char_data}", f"--out_dir={out}", "--max_iters=6", "--eval_interval=3",
        "--write_checkpoint=False",
        *TINY_MODEL)
    assert [r["iter"] for r in read_log(out) if "val_loss" in r] == [0, 3, 6]
    assert sorted(os.listdir(out)) == ["log.jsonl"]


def test_unknown_key_and_bad_type_are_errors(char_data, tmp_path):
    proc = run("train.py", "--n_layers=2", check=False)
    assert proc.returncode != 0 and "unknown config key 'n_layers'" in proc.stderr
    proc = run("train.py", "--max_iters=lots", check=False)
    assert proc.returncode != 0 and "'max_iters' wants a int" in proc.stderr
    proc = run("train.py", "config/does_not_exist.py", check=False)
    assert proc.returncode != 0 and "does not exist" in proc.stderr
    proc = run("train.py", f"--data_dir={char_data}", f"--out_dir={tmp_path}", "--n_head=6", "--n_kv_head=4",
               check=False)
    assert proc.returncode != 0 and "n_head % n_kv_head != 0" in proc.stderr


def test_sample_char(trained):
    proc = run("sample.py", f"--out_dir={trained}", "--start=ROMEO:", "--num_samples=2", "--max_new_tokens=20",
               "--device=cpu")
    texts = proc.stdout.split("---------------")
    assert texts[0].startswith("ROMEO:") and len(texts) == 3
    greedy = [run("sample.py", f"--out_dir={trained}", "--start=KING", "--num_samples=1", "--max_new_tokens=20",
                  "--temperature=0", f"--seed={s}").stdout.split("---")[0] for s in (1, 2)]
    assert greedy[0] == greedy[1]  # greedy ignores the seed


def test_sample_bpe(tmp_path, monkeypatch):
    from conftest import tiny_text
    from data.common import prepare_string
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "tiktoken"))
    data = str(tmp_path / "bpe")
    prepare_string(tiny_text(20_000), data, "gpt2", "tiny test text")
    out = str(tmp_path / "out")
    run("train.py", f"--data_dir={data}", f"--out_dir={out}", "--max_iters=10", "--eval_interval=10", *TINY_MODEL)
    proc = run("sample.py", f"--out_dir={out}", "--start=ROMEO: what light", "--num_samples=1", "--max_new_tokens=8")
    assert proc.stdout.startswith("ROMEO: what light")


def test_wandb_logging_offline(char_data, tmp_path):
    pytest.importorskip("wandb", reason="wandb is an optional dependency (requirements-dev.txt installs it)")
    out = str(tmp_path / "out")
    env = {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_CACHE_DIR": str(tmp_path / "cache"),
           "WANDB_CONFIG_DIR": str(tmp_path / "config"), "WANDB_SILENT": "true"}
    run("train.py", f"--data_dir={char_data}", f"--out_dir={out}", "--max_iters=6", "--eval_interval=3",
        "--wandb_log=True", "--wandb_run_name=test", *TINY_MODEL, env=env)
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and any(runs[0].rglob("*.wandb")), "wandb wrote no offline run"
