"""nanovha/loading.py: load_model reads a checkpoint file, a run folder (its ckpt.pt) and a checkpoint dict into the
same model, and refuses everything else in one line that names the path and the fix."""
import os
from dataclasses import asdict

import pytest
import torch

from model import GPT, GPTConfig
from nanovha.checkpoint import save_checkpoint
from nanovha.loading import load_model, resolve


def tiny_checkpoint():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=37, block_size=16, n_layer=1, n_embd=32, n_head=4, n_kv_head=2, attn="vha"))
    return {"model": model.state_dict(), "model_args": asdict(model.cfg), "meta": {"vocab_size": 37}, "iter_num": 3}


@pytest.fixture
def run(tmp_path):
    """A run folder holding ckpt.pt, the checkpoint written to it."""
    ckpt = tiny_checkpoint()
    save_checkpoint(ckpt, str(tmp_path / "ckpt.pt"))
    return tmp_path, ckpt


@pytest.mark.parametrize("source", [lambda d: str(d), lambda d: str(d / "ckpt.pt"), lambda d: tiny_checkpoint()],
                         ids=["run-folder", "file", "dict"])
def test_every_source_gives_the_same_model_and_its_checkpoint(run, source):
    folder, saved = run
    model, ckpt = load_model(source(folder))
    x = torch.randint(37, (1, 8))
    want = load_model(saved)[0]
    assert torch.equal(model(x)[0], want(x)[0]) and ckpt["iter_num"] == 3 and ckpt["meta"] == {"vocab_size": 37}


def only_folded(d):
    os.rename(d / "ckpt.pt", d / "ckpt_folded.pt")
    return str(d)


def corrupt(d):
    (d / "ckpt.pt").write_bytes((d / "ckpt.pt").read_bytes()[:100])
    return str(d / "ckpt.pt")


def foreign(d):
    torch.save({"weights": torch.ones(2)}, d / "foreign.pt")
    return str(d / "foreign.pt")


def other_weights(d):
    ckpt = tiny_checkpoint()
    ckpt["model_args"]["n_embd"] = 64
    save_checkpoint(ckpt, str(d / "other.pt"))
    return str(d / "other.pt")


def empty_folder(d):
    os.makedirs(d / "empty")
    return str(d / "empty")


@pytest.mark.parametrize("make, kwargs, error, words", [
    (lambda d: str(d / "missing.pt"), {}, FileNotFoundError, ["missing.pt not found", "train one first"]),
    (only_folded, {}, FileNotFoundError, ["neither ckpt.pt nor config.json", "ckpt_folded.pt)"]),
    (empty_folder, {}, FileNotFoundError, ["neither ckpt.pt nor config.json", "give a checkpoint file"]),
    (corrupt, {}, ValueError, ["ckpt.pt is corrupt or truncated", "use an intact checkpoint"]),
    (foreign, {}, ValueError, ["foreign.pt is not a nanoVHA checkpoint"]),
    (other_weights, {}, ValueError, ["other.pt: the checkpoint's weights do not load", "has shape"]),
    (lambda d: str(d), {"hf": True}, FileNotFoundError, ["config.json not found: give a Hugging Face model folder"]),
], ids=["missing", "folder-without-ckpt.pt", "empty-folder", "corrupt", "foreign", "other-weights", "not-hf"])
def test_bad_sources_are_one_line_naming_the_fix(run, make, kwargs, error, words):
    with pytest.raises(error) as e:
        load_model(make(run[0]), **kwargs)
    message = str(e.value)
    assert "\n" not in message and all(w in message for w in words), message


def test_a_run_folder_names_its_checkpoint_and_a_file_stays_a_file(run):
    folder = run[0]
    assert resolve(str(folder)) == ("checkpoint", str(folder / "ckpt.pt"))
    assert resolve(str(folder / "ckpt_folded.pt")) == ("checkpoint", str(folder / "ckpt_folded.pt"))
    (folder / "config.json").write_text("{}")  # a Hugging Face folder, even with a ckpt.pt beside it
    assert resolve(str(folder)) == ("hf", str(folder))
