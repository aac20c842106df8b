"""The lm-evaluation-harness on our Hugging Face exports (fold.py --export_hf), as the paper evaluates: lm-eval runs
the shipped task (data/shakespeare_mc) on a char-level and a GPT-2 BPE export with no model argument but the folder,
and every log-likelihood it computes equals our unfolded model's (float64) on the same tokens, after lm-eval's rule
that moves a context's trailing whitespace into the continuation. Without lm-eval these tests skip and say why, except
in CI (CI=true), where they fail. The task generator's own checks (seeded, whole lines, one-line errors) need none."""
import json
import os
import shutil

import pytest
import torch

from conftest import ROOT, TINY_MODEL, VERSE, load_script, optional, run, verse
from data.common import gpt2_encoding, gpt2_meta, prepare_string
from nanovha.bridges import lmeval
from nanovha.checkpoint import load_checkpoint, model_from_checkpoint
from test_fold import export_with_meta

TASK_DIR = os.path.join(ROOT, "data", "shakespeare_mc")
task_script = load_script("data/shakespeare_mc/prepare.py")
# lm-eval (float32) against our model (float64), per scored token and per unit of the largest |logit|: float32
# rounding is ~6e-8 per operation (measured here: 2e-8 char, 1e-7 BPE); a wrong token, a wrong split or a wrong
# prefix moves a log-likelihood by more than 1e-2 of the logit scale
PER_TOKEN = 1e-6


def lm_eval():
    """lm-eval with its hf extra (accelerate): a skip outside CI, a failure in it (conftest.optional)."""
    return optional("lm_eval.models.huggingface", "pip install -r requirements-lmeval.txt")


def make_task(folder, data_dir, n=24, context_chars=24):
    """The shipped task (yaml + loader) in folder, with items that prepare.py makes from data_dir's val.bin."""
    os.makedirs(folder, exist_ok=True)
    for name in ("shakespeare_mc.yaml", "prepare.py"):
        shutil.copy(os.path.join(TASK_DIR, name), folder)
    run("data/shakespeare_mc/prepare.py", f"--data_dir={data_dir}", f"--out={folder}/shakespeare_mc.jsonl", f"--n={n}",
        f"--context_chars={context_chars}")
    return folder


@pytest.fixture(scope="module")
def char_export(tmp_path_factory):
    """A tiny VHA model trained on the verse until it says its lines, folded and exported; the task from its val."""
    folder = str(tmp_path_factory.mktemp("lmeval_char"))
    data, out = os.path.join(folder, "data"), os.path.join(folder, "out")
    prepare_string(verse(), data, "char", "test verse")
    run("train.py", f"--data_dir={data}", f"--out_dir={out}", "--max_iters=300", "--eval_interval=300", *TINY_MODEL,
        "--block_size=64", "--log_interval=100")
    run("fold.py", "--compile_decode=False", f"--out_dir={out}", f"--export_hf={out}/hf", "--gen_tokens=10")
    return out, make_task(os.path.join(folder, "task"), data)


def compare(hf_dir, out, task_dir, meta):
    """lm-eval (Python API, the folder as its only model argument) on the task, against our unfolded model in float64
    on the same requests; also an empty context (lm-eval puts its prefix token, our bos, first) and a rolling one.
    -> (lm-eval's results, side_by_side's report)."""
    model = model_from_checkpoint(load_checkpoint(os.path.join(out, "ckpt.pt"))).double().eval()  # unfolded VHA
    lm, results, samples = lmeval.run_lm_eval(hf_dir, "shakespeare_mc", task_dir)
    assert lm.prefix_token_id == (meta["stoi"]["\n"] if meta["tokenizer"] == "char" else meta["eot_token"])
    ours = lmeval.loglikelihoods(model, meta, lm.prefix_token_id, [pair for s in samples for pair in s["arguments"]])
    report = lmeval.side_by_side(samples, ours)
    assert report["requests"] == 4 * len(samples) > 0 and report["greedy_agree"]  # lm-eval's is_greedy, too
    text = VERSE[0]  # within the 64-token context with the prefix: one window
    from lm_eval.api.instance import Instance
    (empty, _), = lm.loglikelihood([Instance("loglikelihood", {}, ("", text), 0)])
    rolling, = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text,), 0)])
    ll, _, n, scale = lmeval.loglikelihoods(model, meta, lm.prefix_token_id, [("", text)])[0]
    assert abs(empty - ll) <= PER_TOKEN * n * scale and abs(rolling - ll) <= PER_TOKEN * n * scale, (empty, rolling, ll)
    return results, report


@pytest.mark.slow
def test_lm_eval_scores_the_char_export_as_our_model_does(char_export, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    lm_eval()
    out, task = char_export
    meta = load_checkpoint(os.path.join(out, "ckpt.pt"))["meta"]
    results, report = compare(os.path.join(out, "hf"), out, task, meta)
    assert report["per_token"] <= PER_TOKEN, report
    # the folded export in lm-eval picks what the unfolded model picks, and the trained model knows its lines
    assert report["same_pick"] == report["items"] and results["acc,none"] == report["acc"] >= 0.9, (results, report)
    assert results["acc_norm,none"] == report["acc_norm"], (results, report)


@pytest.mark.slow
def test_lm_eval_scores_the_gpt2_export_as_our_model_does(char_export, tmp_path, monkeypatch):
    """A GPT-2 BPE export (random weights: the comparison needs no training) on the same text items: BPE merges across
    the moved whitespace, so the split where the context's ids end is exercised."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    lm_eval()
    meta = {**gpt2_meta(gpt2_encoding()), "source": "test"}
    torch.manual_seed(0)
    hf_dir = export_with_meta(str(tmp_path), meta, meta["vocab_size"])
    results, report = compare(hf_dir, str(tmp_path), char_export[1], meta)
    assert report["per_token"] <= PER_TOKEN and report["same_pick"] == report["items"], report
    assert (results["acc,none"], results["acc_norm,none"]) == (report["acc"], report["acc_norm"]), (results, report)


def test_the_shipped_task_is_what_the_script_makes(tmp_path):
    """Whole words, then two words: the true ones at `label` among four distinct choices; the same seed gives the same
    file; each item fits the demo's 256-token context; bad input is one line."""
    items = [json.loads(line) for line in open(os.path.join(TASK_DIR, "shakespeare_mc.jsonl"), encoding="utf-8")]
    assert len(items) == 100 and len({it["offset"] for it in items}) == 100
    for it in items:
        assert len(set(it["choices"])) == 4 and 0 <= it["label"] < 4 and it["context"].endswith(" ")
        assert all(len(c.split(" ")) == 2 and c[0].islower() and "\n" not in c for c in it["choices"])
        assert len(it["context"]) + max(map(len, it["choices"])) <= 256 and not it["context"][0].isspace()
    text = verse(4000)
    a, b = (task_script.make_items(text, 10, seed=1, context_chars=24) for _ in range(2))
    assert a == b != task_script.make_items(text, 10, seed=2, context_chars=24)
    for it in a:  # the true words are the ones that follow the context in the text
        true = it["choices"][it["label"]]
        assert text[it["offset"] - len(it["context"]):it["offset"] + len(true)] == it["context"] + true
    with pytest.raises(ValueError, match="need 10 .4 distinct.: give more text"):
        task_script.make_items(VERSE[0] * 3, 10, seed=0)
    proc = run("data/shakespeare_mc/prepare.py", f"--data_dir={tmp_path}", f"--out={tmp_path}/x.jsonl", check=False)
    assert proc.returncode != 0 and proc.stderr.strip().count("\n") == 0 and "val.bin not found" in proc.stderr
