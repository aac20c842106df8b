"""
Nothing lost, round 3 (nanovha/outputs.py, the one output guard): every path a command writes is checked, before any
work, against what it reads, its other outputs and other runs' folders; data has one writer and a fingerprint; a
leftover never traps. Each refusal is one line, and the sha256 of every file is the same before and after.
"""
import hashlib
import json
import os
import shutil

import numpy as np
import pytest

from conftest import tiny_text
from test_reliability import fails, ok, run, train_args


def hashes(*folders):
    """sha256 of every file under the folders (and the folders' own listing), to prove a refusal changed nothing."""
    out = {}
    for folder in folders:
        for root, dirs, files in os.walk(folder):
            out[root] = sorted(dirs + files)
            for name in files:
                with open(os.path.join(root, name), "rb") as f:
                    out[os.path.join(root, name)] = hashlib.sha256(f.read()).hexdigest()
    return out


@pytest.fixture(scope="module")
def world(char_data, tmp_path_factory):
    """data/ (a char dataset), a/ (a finished VHA run on it), b/ (another run, GQA), hf/ (a non-empty folder)."""
    root = tmp_path_factory.mktemp("world")
    shutil.copytree(char_data, root / "data")
    ok(run("train.py", *train_args(root / "data", root / "a", "--max_iters=6", "--eval_interval=3")))
    ok(run("train.py", *train_args(root / "data", root / "b", "--max_iters=5", "--eval_interval=5", "--attn=gqa")))
    (root / "hf").mkdir()
    (root / "hf" / "README.md").write_text("someone's export\n")
    (root / "binary.txt").write_bytes(bytes(range(256)) * 4)
    return root


FOLD = ["--compile_decode=False", "--gen_tokens=4", "--eval_batches=1"]
REFUSED = {  # case: (command, its arguments ({w}: the world), the line's needle)
    "fold --out_name into another run": ("fold.py", ["--out_dir={w}/a", "--out_name=../b/ckpt.pt", *FOLD],
                                         "another run's folder"),
    "fold --out_name with a folder": ("fold.py", ["--out_dir={w}/a", "--out_name=sub/x.pt", *FOLD],
                                      "must be a plain file name"),
    "fold --export_gguf over another run's checkpoint": (
        "fold.py", ["--out_dir={w}/a", "--export_gguf={w}/b/ckpt.pt", "--overwrite=True", *FOLD],
        "another run's folder"),
    "fold --export_gguf over another run's log": (
        "fold.py", ["--out_dir={w}/a", "--export_gguf={w}/b/log.jsonl", "--overwrite=True", *FOLD],
        "another run's folder"),
    "fold --export_gguf over its own checkpoint": (
        "fold.py", ["--out_dir={w}/a", "--export_gguf={w}/a/ckpt.pt", "--overwrite=True", *FOLD],
        "would write over --ckpt_name"),
    "fold --export_gguf over the val.bin the proof reads": (
        "fold.py", ["--out_dir={w}/a", "--export_gguf={w}/data/val.bin", "--overwrite=True", *FOLD],
        "is not a GGUF file nanoVHA exported: nothing replaces it, whatever the flags"),
    "fold --export_gguf over a file that is no GGUF of ours": (
        "fold.py", ["--out_dir={w}/a", "--export_gguf={w}/data/val.bin", *FOLD], "is not a GGUF file nanoVHA exported"),
    "fold --export_gguf inside --export_hf": (
        "fold.py", ["--out_dir={w}/a", "--export_hf={w}/new_hf", "--export_gguf={w}/new_hf/model.safetensors", *FOLD],
        "are the same path, or one holds the other"),
    "fold --export_hf into a folder that is no export of ours": (
        "fold.py", ["--out_dir={w}/a", "--export_hf={w}/hf", *FOLD], "is not a Hugging Face export folder"),
    "fold --export_hf onto another run": (
        "fold.py", ["--out_dir={w}/a", "--export_hf={w}/b", "--overwrite=True", *FOLD], "another run's folder"),
    "convert over the default calibration file": (
        "convert.py", ["--src={w}/b/ckpt.pt", "--out_dir={w}/data", "--out_name=val.bin", "--overwrite=True"],
        "is not a nanoVHA checkpoint: nothing replaces it, whatever the flags"),
    "convert --out_name with ..": ("convert.py", ["--src={w}/a/ckpt.pt", "--out_dir={w}/c", "--out_name=../x.pt"],
                                   "must be a plain file name"),
    "convert into a training run's folder": (
        "convert.py", ["--src={w}/a/ckpt.pt", "--out_dir={w}/b", "--out_name=x.pt"], "another run's folder"),
    "convert a binary --calib": ("convert.py", ["--src={w}/b/ckpt.pt", "--out_dir={w}/c", "--calib={w}/binary.txt"],
                                 "binary.txt is not UTF-8 text"),
    "train into a file": ("train.py", ["--data_dir={w}/data", "--out_dir={w}/binary.txt"], "is a file, not a folder"),
    "train from a missing checkpoint (no empty folder left)": (
        "train.py", ["--data_dir={w}/data", "--out_dir={w}/new_run", "--init_from={w}/nope.pt"], "not found"),
    "train with its checkpoint onto its teacher's": (
        "train.py", ["--data_dir={w}/data", "--out_dir={w}/new_run", "--teacher={w}/new_run/ckpt.pt",
                     "--distill_alpha=0.5"], "would write over --teacher"),
    "prepare --input inside --out_dir": (
        "data/text/prepare.py", ["--input", "{w}/data/in.txt", "--out_dir", "{w}/data", "--overwrite"],
        "lies inside --out_dir"),
    "prepare over an existing dataset": (
        "data/text/prepare.py", ["--input", "{w}/binary.txt", "--out_dir", "{w}/data"], "already holds a dataset"),
    "prepare into a run's folder": (
        "data/recall/prepare.py", ["--out_dir", "{w}/b", "--n_val=4"], "another run's folder"),
    "shakespeare_mc --out over its own input": (
        "data/shakespeare_mc/prepare.py", ["--data_dir={w}/data", "--out={w}/data/val.bin"],
        "would write over --data_dir's val.bin"),
    "bench_decode --plot into a missing folder": (
        "bench_decode.py", ["--plot={w}/missing/decode.png", "--variants=mqa"], "does not exist"),
}


@pytest.mark.parametrize("case", REFUSED, ids=list(REFUSED))
def test_refused_in_one_line_and_nothing_changes(world, case):
    command, args, needle = REFUSED[case]
    if "in.txt" in " ".join(args):
        (world / "data" / "in.txt").write_text(tiny_text(2000))
    before = hashes(world)
    fails(run(command, *[a.format(w=world) for a in args]), needle)
    assert hashes(world) == before
    assert not (world / "new_run").exists() and not (world / "c").exists()


def test_a_dangling_symlink_as_out_dir(char_data, tmp_path):
    os.symlink(tmp_path / "gone", tmp_path / "link")
    fails(run("train.py", *train_args(char_data, tmp_path / "link")), "is a symlink to", "which does not exist")
    assert os.listdir(tmp_path) == ["link"]


def test_two_sweeps_on_one_root(tmp_path):
    """The second sweep on a root stops in one line naming the first (here: this process holds the root)."""
    from nanovha.outputs import holding
    with holding(str(tmp_path)):
        fails(run("sweep.py", "report", f"--sweep_root={tmp_path}"),
              f"is being written by another process (pid {os.getpid()})")


def test_prepare_waits_for_no_training_run(world):
    """A training run holds its data folder shared: a prepare into it stops in one line, nothing replaced."""
    from nanovha.outputs import hold
    lock = hold(str(world / "data"), shared=True)
    try:
        before = hashes(world)
        fails(run("data/text/prepare.py", "--input", world / "binary.txt", "--out_dir", world / "data", "--overwrite"),
              f"is being read by a training run (pid {os.getpid()})")
        assert hashes(world) == before
    finally:
        lock.close()


def test_a_run_folder_given_as_a_checkpoint(world):
    from nanovha.checkpoint import load_checkpoint
    with pytest.raises(ValueError, match=r"is a folder, not a checkpoint file; give the file \(.*ckpt.pt\)"):
        load_checkpoint(str(world / "a"))


def test_resume_refuses_changed_data(char_data, tmp_path):
    """The same length and the same characters, other text: the fingerprint the checkpoint recorded differs."""
    data, out = tmp_path / "data", tmp_path / "out"
    shutil.copytree(char_data, data)
    ok(run("train.py", *train_args(data, out, "--max_iters=6", "--eval_interval=6")))
    ids = np.fromfile(data / "train.bin", dtype=np.uint16)
    ids[:1000] = ids[:1000][::-1].copy()  # a prepare that replaced the text under the run
    ids.tofile(data / "train.bin")
    before = hashes(tmp_path)
    fails(run("train.py", *train_args(data, out, "--max_iters=8", "--init_from=resume")),
          "train.bin in", "changed since", "--init_from=")
    assert hashes(tmp_path) == before


def test_a_log_with_no_checkpoint_does_not_trap(char_data, tmp_path):
    """--eval_only=True on a new folder leaves a log and no checkpoint; a new run starts there, the old log kept."""
    out = tmp_path / "out"
    ok(run("train.py", *train_args(char_data, out, "--eval_only=True")))
    assert sorted(os.listdir(out)) == ["log.jsonl"]
    old = (out / "log.jsonl").read_bytes()
    proc = ok(run("train.py", *train_args(char_data, out, "--max_iters=6", "--eval_interval=6")))
    assert "kept as" in proc.stdout and (out / "log.jsonl.old").read_bytes() == old
    assert (out / "ckpt.pt").exists()


def test_resume_skips_log_rows_it_cannot_read(world, tmp_path):
    out = shutil.copytree(world / "a", tmp_path / "out")
    with open(out / "log.jsonl", "ab") as f:
        f.write(b'{"no_iter": 1}\n[1, 2]\n\xff\xfe not text\n{"iter": "x"}\n')
    proc = ok(run("train.py", *train_args(world / "data", out, "--max_iters=9", "--eval_interval=3",
                                          "--init_from=resume")))
    assert "are not log rows" in proc.stdout and "moved to" in proc.stdout
    assert len((out / "log.jsonl.unreadable").read_bytes().splitlines()) == 4
    assert max(r["iter"] for r in map(json.loads, (out / "log.jsonl").read_text().splitlines())) == 9


def test_a_staged_folder_appears_whole_or_not_at_all(tmp_path):
    from nanovha.outputs import staged
    target = tmp_path / "export"
    target.mkdir()
    (target / "old.txt").write_text("old")
    with pytest.raises(RuntimeError):
        with staged(str(target)) as tmp:
            (tmp_path / tmp / "new.txt").write_text("half")
            raise RuntimeError("the writer died")
    assert os.listdir(tmp_path) == ["export"] and os.listdir(target) == ["old.txt"]
    with staged(str(target)) as tmp:
        (tmp_path / tmp / "new.txt").write_text("new")
    assert os.listdir(tmp_path) == ["export"] and os.listdir(target) == ["new.txt"]


def test_a_file_written_whole_or_not_at_all(tmp_path):
    """written_whole (checkpoints, plan files, compiled packages): a writer that dies leaves the old file and no temp
    file; one that finishes replaces it, in a folder made for it."""
    from nanovha.outputs import written_whole
    path = tmp_path / "runs" / "ckpt.pt"
    with written_whole(str(path)) as tmp:
        open(tmp, "w").write("old")
    with pytest.raises(RuntimeError):
        with written_whole(str(path)) as tmp:
            open(tmp, "w").write("half")
            raise RuntimeError("the writer died")
    assert os.listdir(path.parent) == ["ckpt.pt"] and path.read_text() == "old"
    with written_whole(str(path)) as tmp:
        open(tmp, "w").write("new")
    assert os.listdir(path.parent) == ["ckpt.pt"] and path.read_text() == "new"
