"""lab/recall_probe.py: the circuit scores read the right positions, recording the attention changes nothing, and
a probed prefix run is the full run's first steps."""
import json

import numpy as np
import pytest
import torch

from conftest import load_script, run
from data.recall import tasks
from model import GPT, GPTConfig


@pytest.fixture(scope="module")
def probe():
    return load_script("lab/recall_probe.py")  # defines only: the probe runs under __main__


def uniform_causal(B, H, T):
    w = torch.ones(T, T).tril()
    return (w / w.sum(-1, keepdim=True)).expand(B, H, T, T).clone()  # (B, H, T, T)


def test_circuit_scores_read_the_key_before_each_value_and_the_value_after_the_queried_key(probe):
    P, B, H = 3, 5, 4
    spec = tasks.make_spec("mqar", n_pairs=P, n_keys=16, n_values=16)
    x = torch.from_numpy(tasks.batch(spec, B, np.random.default_rng(0))[0])  # (B, 3P + 1)
    T = x.size(1)
    layer0, layer1 = uniform_causal(B, H, T), uniform_causal(B, H, T)
    layer0[:, 2] = 0  # head 2 of layer 0: every position attends to the one before it
    layer0[:, 2, 0, 0] = 1
    layer0[:, 2, torch.arange(1, T), torch.arange(0, T - 1)] = 1
    for b in range(B):  # head 1 of layer 1: each query on the value after its key, found here by token value
        for t in range(T - P, T):
            key_pos = [i for i in range(0, 2 * P, 2) if x[b, i] == x[b, t]][0]
            layer1[b, 1, t] = 0
            layer1[b, 1, t, key_pos + 1] = 1
    prev, match = probe.circuit_scores([layer0, layer1], x, P)
    assert prev == 1.0 and match == 1.0
    # uniform attention only: value v_i at position 2i+1 gives 1/(2i+2) to its key; a query at t gives 1/(t+1)
    prev, match = probe.circuit_scores([uniform_causal(B, H, T)] * 2, x, P)
    assert prev == pytest.approx(np.mean([1 / (2 * i + 2) for i in range(P)]), abs=1e-7)
    assert match == pytest.approx(np.mean([1 / (t + 1) for t in range(T - P, T)]), abs=1e-7)


def test_recording_the_attention_changes_no_logit_and_keeps_causal_weights(probe):
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=40, n_layer=2, n_embd=32, n_head=4, n_kv_head=2, block_size=16, attn="vha"))
    model.cfg.attn_impl = "plain"
    x = torch.randint(40, (3, 16))
    with torch.no_grad():
        plain = model(x)[0]
        weights, recording = probe.recorded_attention()
        probe.model_module.plain_attention = recording
        try:
            recorded = model(x)[0]
        finally:
            probe.model_module.plain_attention = probe.PLAIN
    assert torch.equal(plain, recorded)
    assert len(weights) == 2 and weights[0].shape == (3, 4, 16, 16)
    assert torch.allclose(weights[1].sum(-1), torch.ones(3, 4, 16), atol=1e-6)
    assert weights[1].triu(1).abs().max() == 0


def test_a_probed_prefix_is_the_full_runs_first_steps(probe, tmp_path):
    data, full = tmp_path / "data", tmp_path / "full"
    run("data/recall/prepare.py", "--n_keys=16", "--n_values=16", "--n_pairs=4", "--n_val=32", f"--out_dir={data}")
    args = ["config/recall_mqar.py", f"--data_dir={data}", "--seed=3", "--n_kv_head=2", "--n_embd=16",
            "--batch_size=8", "--block_size=13", "--max_iters=8", "--lr_decay_iters=8", "--curriculum_iters=4",
            "--warmup_iters=2", "--eval_interval=2"]
    run("train.py", *args, f"--out_dir={full}")
    json.dump(args + [f"--out_dir={full}"], open(full / "args.json", "w"))
    out = run("lab/recall_probe.py", f"--run={full}", "--steps=2,6", f"--out_dir={tmp_path / 'probe'}").stdout
    assert out.count("\n| 2 |") == 1 and out.count("\n| 6 |") == 1
    evals = {r["iter"]: r for r in map(json.loads, open(full / "log.jsonl")) if "val_loss" in r}
    prefix = [r for r in map(json.loads, open(tmp_path / "probe" / "step6" / "log.jsonl")) if "val_loss" in r]
    assert prefix[-1]["iter"] == 6 and prefix[-1]["val_loss"] == evals[6]["val_loss"]  # the same 6 steps, exactly
    rows = json.load(open(tmp_path / "probe" / "probe.json"))
    assert [r["step"] for r in rows] == [2, 6]
    assert all(0 <= r[k] <= 1 for r in rows for k in ("prev_easy", "match_easy", "prev_full", "match_full"))


@pytest.mark.parametrize("args, message", [
    (["--run=/nonexistent"], "has no args.json"),
    (["--steps=a,b"], "give step counts like"),
    (["--steps=0,5"], "must be >= 1"),
])
def test_bad_probe_input_is_one_line(tmp_path, args, message):
    (tmp_path / "args.json").write_text("[]")
    proc = run("lab/recall_probe.py", f"--run={tmp_path}", *args, check=False)
    assert proc.returncode != 0 and message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
