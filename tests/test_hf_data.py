"""Data prepared with a Hugging Face tokenizer folder (--tokenizer=hf --hf_tokenizer=FOLDER): a WordLevel tokenizer of
70,000 ids (the text's characters at ids 69,9xx, so every id needs uint32), built offline. Its meta carries the
folder's tokenizer files, so a Qwen3 imported from that folder (70,016 rows, more than the tokenizer's ids, as Qwen3's
151,936 > ~151,669) reads it and one with another tokenizer of the same size does not; train.py warms a converted
model up on it; an unprepared dataset is refused before its prepare script downloads anything; old uint16 folders
still read."""
import json
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT, optional, run, tiny_text

transformers = optional("transformers")
from nanovha.preflight import vocab_problem
from nanovha.bridges.qwen3 import model_from_hf
from data import common
from data.dataset import Dataset
from test_hf_import import save_qwen3

N_IDS, ROWS = 70_000, 70_016
TEXT = tiny_text(6_000)
TINY = ["--device=cpu", "--dtype=float32", "--compile=False", "--batch_size=2", "--block_size=32", "--eval_iters=2",
        "--log_interval=1", "--warmup_iters=0"]


def big_tokenizer(folder, seed=0):
    """A one-token-per-character tokenizer with N_IDS ids: fillers, then the characters (shuffled by seed: another
    tokenizer of the same size), then <|endoftext|> as the eos."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    chars = sorted(set(TEXT + "<|endoftext>"))
    np.random.default_rng(seed).shuffle(chars) if seed else None
    vocab = {f"<f{i}>": i for i in range(N_IDS - len(chars) - 1)}
    vocab.update({c: len(vocab) + i for i, c in enumerate(chars)})
    vocab["<|endoftext|>"] = N_IDS - 1
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>").save_pretrained(folder)


def prepare(tmp, folder, name):
    (tmp / "in.txt").write_text(TEXT, encoding="utf-8")
    args = ["--input", str(tmp / "in.txt"), "--out_dir", str(tmp / name), "--tokenizer", "hf",
            "--hf_tokenizer", str(folder)]
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "data", "text", "prepare.py"), *args],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    with open(tmp / name / "meta.pkl", "rb") as f:
        return str(tmp / name), pickle.load(f)


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    """(Qwen3 folder with the 70,000-id tokenizer and 70,016 rows, its data, another tokenizer's data of the same
    size)."""
    tmp = tmp_path_factory.mktemp("hfdata")
    save_qwen3(str(tmp / "qwen"), tokenizer=False, vocab_size=ROWS, hidden_size=32, intermediate_size=48, head_dim=16)
    big_tokenizer(str(tmp / "qwen"))
    big_tokenizer(str(tmp / "other_tok"), seed=1)
    return str(tmp / "qwen"), prepare(tmp, tmp / "qwen", "data"), prepare(tmp, tmp / "other_tok", "other")


def test_hf_prepare_writes_uint32_and_matches_the_import(qwen):
    folder, (data_dir, meta), (_, other) = qwen
    assert (meta["tokenizer"] == "hf" and meta["vocab_size"] == N_IDS and meta["dtype"] == "uint32"
            and meta["eot_token"] == N_IDS - 1)
    train = np.fromfile(os.path.join(data_dir, "train.bin"), dtype=np.uint32)
    # uint16 would wrap them
    assert len(train) == meta["train_tokens"] == int(0.9 * len(TEXT)) and train.min() > 65_535
    assert common.load_tokenizer(meta)[1](train.tolist()) == TEXT[:len(train)]
    data = Dataset(data_dir, 32)
    assert data.splits["train"].dtype == np.uint32 and np.array_equal(data.splits["train"], train)
    model_meta = model_from_hf(folder)[1]
    assert model_meta["vocab_size"] == ROWS and model_meta["hf_tokenizer_sha256"] == meta["hf_tokenizer_sha256"]
    assert vocab_problem(model_meta, "the model", meta, "the data") is None  # 70,000 ids fit 70,016 rows
    assert other["vocab_size"] == meta["vocab_size"] and other["hf_tokenizer_sha256"] != meta["hf_tokenizer_sha256"]
    assert "another Hugging Face tokenizer" in vocab_problem(model_meta, "the model", other, "the data")
    assert "past the 69000 rows" in vocab_problem({**model_meta, "vocab_size": 69_000}, "the model", meta, "the data")
    assert "carries no Hugging Face tokenizer files" in vocab_problem({**model_meta, "hf_tokenizer_files": None},
                                                                      "the model", meta, "the data")


def test_old_uint16_folders_still_read(tmp_path):
    out = str(tmp_path / "old")
    common.write_split(np.arange(100) % 50, np.arange(60) % 50, out, {"tokenizer": "gpt2", "vocab_size": 50257})
    with open(os.path.join(out, "meta.pkl"), "rb") as f:
        meta = pickle.load(f)
    assert meta.pop("dtype") == "uint16" and os.path.getsize(os.path.join(out, "train.bin")) == 200
    with open(os.path.join(out, "meta.pkl"), "wb") as f:  # as written before the dtype was recorded
        pickle.dump(meta, f)
    data = Dataset(out, 16)
    assert data.splits["val"].dtype == np.uint16 and data.splits["val"].tolist() == (np.arange(60) % 50).tolist()
    assert common.read_bin(os.path.join(out, "train.bin")).tolist() == (np.arange(100) % 50).tolist()


@pytest.mark.slow  # import, convert, then train.py with a teacher
def test_warmup_of_a_converted_qwen3_on_its_tokenizers_data(qwen, tmp_path):
    folder, (data_dir, _), _ = qwen
    conv = tmp_path / "conv"
    run("convert.py", f"--src={folder}", f"--out_dir={conv}", "--n_kv_head=1", f"--calib={data_dir}/val.bin",
        "--calib_len=32")
    out = tmp_path / "warm"
    run("train.py", f"--init_from={conv}", f"--teacher={folder}", "--distill_alpha=0.5", "--freeze_iters=1",
        f"--data_dir={data_dir}", f"--out_dir={out}", "--max_iters=2", "--eval_interval=2", *TINY)
    rows = [json.loads(line) for line in open(out / "log.jsonl")]
    assert [r["iter"] for r in rows if "loss" in r] == [0, 1] and all(
        np.isfinite(r.get("loss", r.get("val_loss"))) for r in rows)
    # ln(70,016) = 11.2: the imported weights, not garbage ids
    assert rows[-1]["iter"] == 2 and rows[-1]["val_loss"] < 12


def test_another_hf_tokenizer_and_an_unprepared_dataset_are_refused(qwen, tmp_path):
    folder, _, (other_dir, _) = qwen
    proc = run("train.py", f"--init_from={folder}", f"--data_dir={other_dir}", f"--out_dir={tmp_path / 'a'}",
               "--max_iters=1", *TINY, check=False)
    assert (proc.returncode != 0 and "vocab mismatch: the checkpoint" in proc.stderr
            and "another Hugging Face tokenizer" in proc.stderr)
    empty = tmp_path / "fw_qwen"
    proc = run("train.py", f"--init_from={folder}", "--dataset=fineweb_edu", f"--data_dir={empty}",
               f"--out_dir={tmp_path / 'b'}", "--max_iters=1", *TINY, check=False)
    line = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode != 0 and (
        "is not prepared yet and data/fineweb_edu/prepare.py would write gpt2 ids" in line), proc.stderr
    assert (f"python data/fineweb_edu/prepare.py --tokenizer=hf --hf_tokenizer={os.path.abspath(folder)} "
            f"--out_dir={empty}") in line
    assert "preparing" not in proc.stdout and not empty.exists()


def test_fineweb_script_with_an_hf_tokenizer(qwen, tmp_path):
    stub = tmp_path / "stub" / "datasets"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("def load_dataset(path, name, split, streaming):\n"
                                      "    return ({'text': 'ROMEO: <|endoftext|>'} for _ in range(100))\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "stub")}
    script = os.path.join(ROOT, "data", "fineweb_edu", "prepare.py")
    proc = subprocess.run([sys.executable, script, "--num_tokens", "210", "--val_frac", "0.1", "--out_dir", "fw",
                           "--tokenizer=hf", f"--hf_tokenizer={qwen[0]}"],
                          cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    with open(tmp_path / "fw" / "meta.pkl", "rb") as f:
        meta = pickle.load(f)
    train = np.fromfile(tmp_path / "fw" / "train.bin", dtype=np.uint32)
    encode, decode = common.load_tokenizer(meta)
    # the text's marker is plain text
    doc = common.HFEncoding(qwen[0]).encode_ordinary("ROMEO: <|endoftext|>") + [N_IDS - 1]
    assert (len(doc) == 21 and train.tolist() == doc * 9 and meta["dtype"] == "uint32"
            and meta["eot_token"] == N_IDS - 1)
    proc = subprocess.run([sys.executable, script, "--tokenizer=hf", "--out_dir", "fw2"], cwd=tmp_path, env=env,
                          capture_output=True, text=True)
    assert (proc.returncode != 0 and "--tokenizer=hf and --hf_tokenizer=FOLDER" in proc.stderr
            and not (tmp_path / "fw2").exists())
