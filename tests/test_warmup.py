"""Warm-up from a converted checkpoint (train.py --init_from=PATH --freeze_iters --teacher --distill_alpha): a tiny GQA
4Q/4KV teacher, convert.py to VHA over 2 KV heads, warmed up with freezing and distillation. Frozen weights are
bit-identical through the freeze (AdamW gives them nothing, not even weight decay) and move after it; a run killed and
resumed reproduces the uninterrupted one's log; kd_loss is its equation; every bad combination is one line."""
import math
import os
import shutil

import pytest
import torch
import torch.nn.functional as F

from conftest import TINY_MODEL, run
from nanovha.checkpoint import load_checkpoint, save_checkpoint
from nanovha.distill import frozen_params, is_attention, kd_loss
from test_model import make
from test_reliability import fails, snapshot
from test_train import losses, read_log

# the tiny model of conftest, minus what a warm-up takes from its checkpoint (n_kv_head; attn is the default vha)
TINY = [a for a in TINY_MODEL if not a.startswith("--n_kv_head")]
WARM = ["--freeze_iters=4", "--distill_alpha=0.7", "--distill_temperature=2.0"]


@pytest.fixture(scope="module")
def start(char_data, tmp_path_factory):
    """(teacher ckpt, converted ckpt): a GQA 4Q/4KV model trained 20 iterations, converted to VHA over 2 KV heads."""
    root = tmp_path_factory.mktemp("warm")
    teacher, conv = str(root / "teacher"), str(root / "conv")
    run("train.py", f"--data_dir={char_data}", f"--out_dir={teacher}", "--max_iters=20", "--eval_interval=20",
        "--attn=gqa", "--n_kv_head=4", *TINY)
    run("convert.py", f"--src={teacher}/ckpt.pt", f"--out_dir={conv}", "--n_kv_head=2")
    return os.path.join(teacher, "ckpt.pt"), os.path.join(conv, "ckpt.pt")


@pytest.fixture(scope="module")
def warm_runs(char_data, start, tmp_path_factory):
    """An uninterrupted 8-iteration warm-up, and the same run stopped at 4, the end of the freeze (freeze_iters >
    max_iters is refused; the checkpoint of 4 is copied aside), resumed to 8 without naming the teacher or the
    freeze."""
    teacher, conv = start
    root = tmp_path_factory.mktemp("runs")
    full, part = str(root / "full"), str(root / "part")
    common = [f"--data_dir={char_data}", "--eval_interval=2", "--lr_decay_iters=8", *TINY]
    first = [f"--init_from={conv}", f"--teacher={teacher}", *WARM]
    run("train.py", f"--out_dir={full}", "--max_iters=8", *common, *first)
    run("train.py", f"--out_dir={part}", "--max_iters=4", *common, *first)
    shutil.copy(os.path.join(part, "ckpt.pt"), os.path.join(root, "at4.pt"))
    run("train.py", f"--out_dir={part}", "--max_iters=8", "--init_from=resume", *common)
    return full, part, os.path.join(root, "at4.pt")


def weights(path):
    return load_checkpoint(path)["model"]


@pytest.mark.slow  # the warm_runs fixture: teacher, conversion, two warm-ups and a resume
def test_warmup_freezes_then_trains_everything(start, warm_runs):
    conv, (full, _, at4) = weights(start[1]), warm_runs
    rows = read_log(full)
    assert [r["iter"] for r in rows if "val_loss" in r] == [0, 2, 4, 6, 8]
    steps = [r for r in rows if "loss" in r]
    assert len(steps) == 8 and all(math.isfinite(r["loss"]) and 0 <= r["teacher_share"] < 1 for r in steps)
    frozen = [n for n in conv if not is_attention(n)]
    assert any("mlp" in n for n in frozen) and any("norm" in n for n in frozen) and "embed.weight" in frozen
    after_freeze, end = weights(at4), weights(os.path.join(full, "ckpt.pt"))
    for n in conv:  # iteration 4: frozen weights bit-identical (weight decay 0.1 included), attention moved
        assert torch.equal(after_freeze[n], conv[n]) == (n in frozen), n
    assert all(not torch.equal(end[n], conv[n]) for n in frozen if "embed" in n or "mlp" in n)  # then they train


@pytest.mark.slow  # the warm_runs fixture: teacher, conversion, two warm-ups and a resume
def test_resumed_warmup_reproduces_the_uninterrupted_run(start, warm_runs):
    full, part, _ = warm_runs
    assert losses(read_log(part)) == losses(read_log(full))
    assert torch.equal(torch.cat([t.flatten() for t in weights(os.path.join(part, "ckpt.pt")).values()]),
                       torch.cat([t.flatten() for t in weights(os.path.join(full, "ckpt.pt")).values()]))
    config = load_checkpoint(os.path.join(part, "ckpt.pt"))["config"]
    assert (config["freeze_iters"], config["distill_alpha"], config["teacher"]) == (4, 0.7, start[0])  # as first given


@pytest.mark.slow  # the warm_runs fixture: teacher, conversion, two warm-ups and a resume
def test_resume_refuses_other_warmup_settings(char_data, warm_runs):
    part = warm_runs[1]
    before = snapshot(part)
    fails(run("train.py", f"--out_dir={part}", f"--data_dir={char_data}", "--max_iters=10", "--init_from=resume",
              "--distill_alpha=0.5", *TINY, check=False),
          "a resumed run keeps its checkpoint's warm-up, seed and data settings (its batches depend on them), "
          "but you set distill_alpha=0.5 (checkpoint: 0.7)")
    assert snapshot(part) == before


def hand_kd(s, t, y, T, alpha):
    """The equation, position by position, in float64."""
    ce, kl, n = 0.0, 0.0, 0
    rows = zip(s.reshape(-1, s.size(-1)).tolist(), t.reshape(-1, t.size(-1)).tolist(), y.reshape(-1).tolist())
    for z_s, z_t, target in rows:
        if target < 0:
            continue
        log_z = math.log(sum(math.exp(v) for v in z_s))
        ce += log_z - z_s[target]
        log_ps = [v / T - math.log(sum(math.exp(w / T) for w in z_s)) for v in z_s]
        log_pt = [v / T - math.log(sum(math.exp(w / T) for w in z_t)) for v in z_t]
        kl += sum(math.exp(b) * (b - a) for a, b in zip(log_ps, log_pt))
        n += 1
    return (1 - alpha) * ce / n + alpha * T * T * kl / n


@pytest.mark.parametrize("alpha, T", [(0.0, 1.0), (0.7, 1.0), (0.7, 2.5), (1.0, 0.5)])
def test_kd_loss_is_its_equation(alpha, T):
    g = torch.Generator().manual_seed(0)
    s = torch.randn(2, 5, 7, generator=g, dtype=torch.float64) * 2
    t = torch.randn(2, 5, 7, generator=g, dtype=torch.float64) * 2
    y = torch.randint(7, (2, 5), generator=g)
    y[0, :3] = -1  # a row dataset: only the answers count
    loss = kd_loss(s, t, y, T, alpha)
    assert loss.dtype == torch.float64 and abs(loss.item() - hand_kd(s, t, y, T, alpha)) < 1e-12
    t_elsewhere = t.clone()
    t_elsewhere[0, :3] += 5 * torch.randn(3, 7, generator=g, dtype=torch.float64)  # the teacher where y = -1: ignored
    assert abs(kd_loss(s, t_elsewhere, y, T, alpha).item() - loss.item()) < 1e-12
    if alpha == 0:  # plain CE
        assert loss.item() == F.cross_entropy(s.reshape(-1, 7), y.reshape(-1), ignore_index=-1).item()
    if alpha == 1:  # pure KL: zero at the teacher itself
        assert abs(kd_loss(t, t, y, T, 1.0).item()) < 1e-12


def test_frozen_params_are_everything_but_attention():
    model = make(attn="vha", n_head=8, n_kv_head=2)
    names = {n for n, p in model.named_parameters() if any(p is q for q in frozen_params(model))}
    trained = {n for n, _ in model.named_parameters()} - names
    assert trained and all(any(k in n for k in ("qkv_proj", "o_proj", "premix", "postmix")) for n in trained)
    qk_norms = {f"blocks.{i}.attn.{k}_norm.weight" for i in range(2) for k in "qk"}
    assert {n for n in names if ".attn." in n} == qk_norms  # QK-norm too


def bad_copy(path, tmp_path, **changes):
    ckpt = load_checkpoint(path)
    ckpt.update(changes)
    out = str(tmp_path / f"bad_{len(os.listdir(tmp_path))}.pt")
    save_checkpoint(ckpt, out)
    return out


def garbage(tmp_path):
    path = tmp_path / "garbage.pt"
    path.write_bytes(b"not a checkpoint")
    return str(path)


HF_META = {"tokenizer": "hf", "vocab_size": 151936}


def longer_copy(ckpt, folder):
    """A copy of the checkpoint claiming a 64-token context."""
    return bad_copy(ckpt, folder, model_args={**load_checkpoint(ckpt)["model_args"], "block_size": 64})
BAD = {  # id: (args given (teacher, conv, tmp_path), needles)
    "freeze past max_iters": (lambda t, c, p: [f"--init_from={c}", "--freeze_iters=20"],
                              ["freeze_iters=20 must be in [0, max_iters=10]"]),
    "alpha above 1": (lambda t, c, p: [f"--teacher={t}", "--distill_alpha=1.5"],
                      ["distill_alpha=1.5 must be in [0, 1]"]),
    "temperature 0": (lambda t, c, p: [f"--teacher={t}", "--distill_alpha=0.5", "--distill_temperature=0"],
                      ["distill_temperature=0.0 must be > 0"]),
    "teacher with alpha 0": (lambda t, c, p: [f"--init_from={c}", f"--teacher={t}"],
                             ["drop --teacher or set --distill_alpha > 0"]),
    "alpha without teacher": (lambda t, c, p: [f"--init_from={c}", "--distill_alpha=0.7"],
                              ["needs a teacher", "--teacher=PATH"]),
    "teacher missing": (lambda t, c, p: [f"--init_from={c}", "--teacher=no/such/ckpt.pt", "--distill_alpha=0.7"],
                        ["cannot load teacher=no/such/ckpt.pt", "not found"]),
    "teacher corrupt": (lambda t, c, p: [f"--init_from={c}", f"--teacher={garbage(p)}", "--distill_alpha=0.7"],
                        ["cannot load teacher=", "corrupt or truncated"]),
    "teacher of another tokenizer": (
        lambda t, c, p: [f"--init_from={c}", f"--teacher={bad_copy(t, p, meta=HF_META)}", "--distill_alpha=0.7"],
        ["vocab mismatch: the teacher", "hf tokenizer (151936 tokens)", "prepare the data with the model's tokenizer"]),
    "student of another tokenizer": (
        lambda t, c, p: [f"--init_from={bad_copy(c, p, meta=HF_META)}"],
        ["vocab mismatch: the checkpoint", "hf tokenizer (151936 tokens)", "--tokenizer=hf"]),
    "a char model's own Hugging Face export": (  # its own run's checkpoint is the fix, not FineWeb's recipe
        lambda t, c, p: [f"--init_from={bad_copy(c, p, meta={'tokenizer': 'hf', 'vocab_size': 65})}"],
        ["vocab mismatch: the checkpoint", "exported from a char-level nanoVHA run", "--init_from=RUN/ckpt.pt"]),
    "student without meta": (lambda t, c, p: [f"--init_from={bad_copy(c, p, meta=None)}"],
                             ["carries no tokenizer description"]),
    "student missing": (lambda t, c, p: ["--init_from=no/such.pt"],
                        ["cannot start from init_from=no/such.pt", "not found"]),
    "student corrupt": (lambda t, c, p: [f"--init_from={garbage(p)}"],
                        ["cannot start from init_from=", "corrupt or truncated"]),
    "student not loadable": (lambda t, c, p: [f"--init_from={bad_copy(c, p, model={})}"],
                             ["weights do not load: missing weights"]),
    "a model knob at train.py's default contradicts": (  # attn='vha' is the default: still compared
        lambda t, c, p: [f"--init_from={t}", "--attn=vha"],
        ["a new run keeps its checkpoint's model, but you set attn='vha' (checkpoint: 'gqa')"]),
    "model knob contradicts": (
        lambda t, c, p: [f"--init_from={c}", "--n_layer=3"],
        ["a new run keeps its checkpoint's model, but you set n_layer=3 (checkpoint: 2); drop them"]),
    "block_size past the checkpoint's": (lambda t, c, p: [f"--init_from={c}", "--block_size=64"],
                                         ["block_size=64 is past the checkpoint's 32"]),
    "teacher context too short": (
        lambda t, c, p: [f"--init_from={longer_copy(c, p)}", "--block_size=64", f"--teacher={t}",
                         "--distill_alpha=0.7"],
        ["the teacher", "at most 32 tokens, this run's are 64"]),
}


@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_bad_warmup_settings(char_data, start, tmp_path, case):
    make_args, needles = BAD[case]
    out = tmp_path / "out"
    args = make_args(*start, tmp_path)
    fails(run("train.py", f"--data_dir={char_data}", f"--out_dir={out}", "--max_iters=10", *TINY, *args, check=False),
          *needles)
    assert not (out / "ckpt.pt").exists() and not (out / "log.jsonl").exists()


def test_init_from_its_own_checkpoint_is_resume(char_data, start, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    shutil.copy(start[1], out / "ckpt.pt")
    before = snapshot(out)
    for given in (out / "ckpt.pt", out):  # the file, or the out_dir holding it
        fails(run("train.py", f"--data_dir={char_data}", f"--out_dir={out}", f"--init_from={given}", *TINY,
                  check=False),
              "is this out_dir's own checkpoint: continuing it is --init_from=resume")
    assert snapshot(out) == before
