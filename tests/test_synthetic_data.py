"""data/synthetic/prepare.py: GPT-2-vocab token bins made offline in a second, for smoke runs (the GPU check). What
train.py reads, with structure a model can learn: inside a phrase the next token is determined by the current one."""
import pickle

import numpy as np

from conftest import run
from data.dataset import Dataset


def test_synthetic_bins_are_gpt2_ids_train_py_reads_and_mostly_determined(tmp_path):
    out = tmp_path / "syn"
    run("data/synthetic/prepare.py", "--out_dir", out, "--train_tokens", 65536, env={"PIP_NO_INDEX": "1"})
    meta = pickle.load(open(out / "meta.pkl", "rb"))
    assert meta["vocab_size"] == 50257 and meta["tokenizer"] == "gpt2" and "not text" in meta["source"]
    data = Dataset(str(out), block_size=1024)  # the checks train.py makes: counts, dtype, ids below the vocab
    assert data.vocab_size == 50257 and meta["train_tokens"] == 65536 and meta["val_tokens"] == 4096
    ids = np.fromfile(out / "train.bin", dtype=np.uint16).astype(np.int64)
    assert ids.max() < 50257 and len(np.unique(ids)) > 1000
    # bigram entropy: each id but <|endoftext|> has one successor, so a bigram model is almost always right
    pairs = np.unique(ids[:-1] * 50257 + ids[1:])
    successors = np.bincount(pairs // 50257, minlength=50257)
    eot = meta["eot_token"]
    assert successors[eot] > 100 and successors[np.arange(50257) != eot].max() == 1
    again = tmp_path / "again"
    run("data/synthetic/prepare.py", "--out_dir", again, "--train_tokens", 65536)
    assert (again / "train.bin").read_bytes() == (out / "train.bin").read_bytes()  # seeded: the same bins


def test_synthetic_bad_size_is_one_line(tmp_path):
    proc = run("data/synthetic/prepare.py", "--out_dir", tmp_path, "--train_tokens", 10, check=False)
    assert proc.returncode != 0 and proc.stderr.strip() == (
        "error: --train_tokens must be at least 4096 (a few windows of 1024), got 10")
