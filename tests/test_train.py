import json
import math
import os
import subprocess
import sys

import pytest
import torch

from conftest import TINY_MODEL, optional, run
from nanovha.checkpoint import load_checkpoint
from nanovha.generate import generate
from test_model import make


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


def test_the_learning_rate_is_warmup_then_cosine_to_min_lr(trained):
    """The lr column against the formula (TINY_MODEL: lr 3e-3, warmup 5; lr_decay_iters = max_iters = 80,
    min_lr = lr / 10): lr (it + 1) / (warmup + 1), then min_lr + (1 + cos(pi (it - warmup) / (decay - warmup)))
    (lr - min_lr) / 2."""
    peak, warmup, decay, floor = 3e-3, 5, 80, 3e-4
    rows = [r for r in read_log(trained) if "loss" in r]
    assert [r["iter"] for r in rows] == list(range(80))
    for r in rows:
        it = r["iter"]
        want = (peak * (it + 1) / (warmup + 1) if it < warmup
                else floor + 0.5 * (1 + math.cos(math.pi * (it - warmup) / (decay - warmup))) * (peak - floor))
        assert r["lr"] == pytest.approx(want, rel=1e-12, abs=0), it
    assert all(math.isfinite(r["grad_norm"]) and r["grad_norm"] > 0 for r in rows)  # clipping at 1.0 sees the norm


def test_adamw_decays_matrices_and_postmix_not_norms_or_premix():
    model = make(attn="vha", n_head=8, n_kv_head=2)
    decay, no_decay = model.optimizer_groups(0.1)
    name = {id(p): n for n, p in model.named_parameters()}
    decayed, kept = {name[id(p)] for p in decay["params"]}, {name[id(p)] for p in no_decay["params"]}
    assert (decay["weight_decay"], no_decay["weight_decay"]) == (0.1, 0.0)
    assert decayed | kept == set(name.values()) and not decayed & kept
    assert {n.split(".")[-1] for n in kept} == {"premix", "weight"} and all("norm" in n or "premix" in n for n in kept)
    assert any(n.endswith("postmix_U") for n in decayed) and any(n.endswith("postmix_V") for n in decayed)
    assert "embed.weight" in decayed and all("norm" not in n and "premix" not in n for n in decayed)


def test_accumulated_micro_batches_give_the_gradient_of_the_whole_batch():
    """train.py divides each of k micro-batch losses by k: the summed gradients equal one batch of k * B, float64."""
    model = make(attn="vha", n_head=8, n_kv_head=2)
    x = torch.randint(0, 37, (8, 16), generator=torch.Generator().manual_seed(0))
    y = torch.randint(0, 37, (8, 16), generator=torch.Generator().manual_seed(1))
    model(x, y)[1].backward()
    whole = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    for xs, ys in zip(x.split(2), y.split(2)):  # k = 4 micro-batches of 2
        (model(xs, ys)[1] / 4).backward()
    assert all(torch.allclose(p.grad, g, rtol=1e-12, atol=1e-15) for p, g in zip(model.parameters(), whole))


@pytest.mark.slow  # four short runs
def test_gradient_clipping_acts_on_the_norm_over_grad_clip_only(char_data, tmp_path):
    """clip_grad_norm_ at grad_clip, on real runs: the logged grad_norm is the norm before clipping; a threshold
    just above every step's norm gives the unclipped run bit for bit, one just below the smallest changes it."""
    def train(name, clip):
        out = tmp_path / name
        run("train.py", f"--data_dir={char_data}", f"--out_dir={out}", "--max_iters=6", "--eval_interval=6",
            "--always_save_checkpoint=True", f"--grad_clip={clip}", *TINY_MODEL)
        norms = [r["grad_norm"] for r in read_log(out) if "grad_norm" in r]
        return norms, load_checkpoint(str(out / "ckpt.pt"))["model"]

    _, off = train("off", 0)
    norms, huge = train("huge", 1e9)  # measures the norms, never clips
    above_norms, above = train("above", 1.01 * max(norms))
    below_norms, below = train("below", 0.99 * min(norms))
    assert len(norms) == 6 and above_norms == norms and below_norms[0] == norms[0]  # step 0: before any clip
    assert all(torch.equal(off[k], huge[k]) and torch.equal(off[k], above[k]) for k in off)
    assert not all(torch.equal(off[k], below[k]) for k in off)


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


def test_sample_char(trained):
    proc = run("sample.py", f"--out_dir={trained}", "--start=ROMEO:", "--num_samples=2", "--max_new_tokens=20",
               "--device=cpu")
    texts = proc.stdout.split("---------------")
    assert texts[0].startswith("ROMEO:") and len(texts) == 3
    greedy = [run("sample.py", f"--out_dir={trained}", "--start=KING", "--num_samples=1", "--max_new_tokens=20",
                  "--temperature=0", f"--seed={s}").stdout.split("---")[0] for s in (1, 2)]
    assert greedy[0] == greedy[1]  # greedy ignores the seed


def test_sample_is_model_generate_and_reads_a_prompt_file(trained, tmp_path):
    """sample.py --start=FILE: at temperature 0 prints what model.generate gives on the loaded checkpoint."""
    from data.common import load_tokenizer
    from nanovha.checkpoint import load_checkpoint, model_from_checkpoint
    (tmp_path / "prompt.txt").write_text("ROMEO:\nthe king")
    text = run("sample.py", f"--out_dir={trained}", f"--start=FILE:{tmp_path / 'prompt.txt'}", "--num_samples=1",
               "--max_new_tokens=12", "--temperature=0").stdout.split("\n---------------")[0]
    ckpt = load_checkpoint(os.path.join(trained, "ckpt.pt"))
    encode, decode = load_tokenizer(ckpt["meta"])
    with torch.no_grad():
        prompt = torch.tensor([encode("ROMEO:\nthe king")])
        want = generate(model_from_checkpoint(ckpt).eval(), prompt, 12, temperature=0)
    assert text == decode(want[0].tolist()) and len(text) == len("ROMEO:\nthe king") + 12


def test_sample_bpe(tmp_path, monkeypatch):
    from conftest import tiny_text
    from data.common import prepare_string
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "tiktoken"))
    data = str(tmp_path / "bpe")
    prepare_string(tiny_text(20_000), data, "gpt2", "tiny test text")
    out = str(tmp_path / "out")
    run("train.py", f"--data_dir={data}", f"--out_dir={out}", "--max_iters=10", "--eval_interval=10", *TINY_MODEL)
    proc = run("sample.py", f"--out_dir={out}", "--start=ROMEO: what light", "--num_samples=1", "--max_new_tokens=8",
               "--temperature=0")
    from data.common import load_tokenizer
    from nanovha.checkpoint import load_checkpoint, model_from_checkpoint
    ckpt = load_checkpoint(os.path.join(out, "ckpt.pt"))
    encode, decode = load_tokenizer(ckpt["meta"])  # GPT-2 BPE: 8 new tokens, whatever their characters
    with torch.no_grad():
        want = generate(model_from_checkpoint(ckpt).eval(), torch.tensor([encode("ROMEO: what light")]), 8,
                                                            temperature=0)
    assert proc.stdout.split("\n---------------")[0] == decode(want[0].tolist())


def test_wandb_logging_offline(char_data, tmp_path):
    optional("wandb")
    out = str(tmp_path / "out")
    env = {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_CACHE_DIR": str(tmp_path / "cache"),
           "WANDB_CONFIG_DIR": str(tmp_path / "config"), "WANDB_SILENT": "true"}
    run("train.py", f"--data_dir={char_data}", f"--out_dir={out}", "--max_iters=6", "--eval_interval=3",
        "--wandb_log=True", "--wandb_run_name=test", *TINY_MODEL, env=env)
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and any(runs[0].rglob("*.wandb")), "wandb wrote no offline run"


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_each_dtype_path_trains_like_float32_and_resumes_exactly(char_data, tmp_path, dtype):
    """bf16 autocast, and fp16 autocast with GradScaler (its state saved and restored), on this CPU whatever it has
    (emulated where it must be: the model is tiny): 30 steps end within 0.05 of float32's val loss (the stated
    tolerance; rounding, not a bug, moves it), and a run resumed at 15 repeats the uninterrupted one exactly."""
    def train(out, dt, *extra):
        run("train.py", f"--data_dir={char_data}", f"--out_dir={tmp_path / out}", "--max_iters=30",
            "--eval_interval=15", "--lr_decay_iters=30", *TINY_MODEL, f"--dtype={dt}", *extra)
        return [(r["iter"], r.get("loss"), r.get("val_loss")) for r in read_log(tmp_path / out)]

    fp32, whole = train("fp32", "float32"), train("whole", dtype)
    assert abs(whole[-1][2] - fp32[-1][2]) < 0.05, (whole[-1], fp32[-1])
    train("part", dtype, "--max_iters=15")
    assert train("part", dtype, "--init_from=resume") == whole


TF32_AND_INDUCTOR = """
import torch
from model import GPT, GPTConfig
from nanovha.hardware import allow_tf32
allow_tf32()
torch.manual_seed(0)
model = GPT(GPTConfig(vocab_size=64, block_size=16, n_layer=1, n_embd=32, n_head=4, n_kv_head=2, attn="vha"))
x, a, b = torch.randint(64, (2, 16)), torch.randn(3, 8, 8), torch.randn(3, 8, 8)
step = torch.compile(lambda x: model(x, x)[1] + torch.einsum("bij,bjk->bik", a, b).sum() + torch.bmm(a, b).sum())
assert torch.allclose(step(x), model(x, x)[1] + 2 * (a @ b).sum(), rtol=1e-4, atol=1e-4)
getters = [torch.get_float32_matmul_precision(), torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32]
for holder in (torch.backends.cuda.matmul, torch.backends):  # torch >= 2.9
    getters.append(getattr(holder, "fp32_precision", None))
print(torch.__version__, *getters)
"""


def test_tf32_as_set_lets_inductor_compile_and_every_getter_read():
    """The project's TF32 setting (hardware.allow_tf32), then a float32 model step with a bmm and an einsum through
    inductor, then every TF32 getter: no error (torch >= 2.9 raises on the legacy getters once the per-backend
    fp32_precision flags are set, and inductor reads them). lab/torch211_check.sh runs it under torch 2.11 too."""
    from conftest import ROOT
    out = subprocess.run([sys.executable, "-c", TF32_AND_INDUCTOR], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[1:4] == ["high", "True", "True"], out.stdout


def test_tf32_is_set_in_one_place():
    """No TF32 flag written beside allow_tf32(): train.py and bench.py call it, nothing else sets one."""
    from conftest import ROOT
    for script in ("train.py", "bench.py", "lab/gpu_check.py", "lab/gpu_steps.py"):
        text = open(os.path.join(ROOT, script)).read()
        assert ".allow_tf32 =" not in text and "fp32_precision =" not in text and "set_float32_matmul" not in text
    assert "allow_tf32()" in open(os.path.join(ROOT, "train.py")).read()
    assert "allow_tf32()" in open(os.path.join(ROOT, "bench.py")).read()
