"""data/recall and row datasets in train.py: the generators are deterministic and right (checked by a solver
written here from the tokens alone), the curriculum ramps, held-out rows come from their own stream, the loss
reads only the answers, and a row run trains, logs accuracy and resumes exactly."""
import json
import pickle

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import run
from data.recall import tasks
from model import GPT, GPTConfig


def solve(x, spec):
    """The answer expected at each position of row x (-1 where none), from its tokens alone."""
    x, y = list(map(int, x)), [-1] * len(x)
    sep = x.index(tasks.SEP)
    if spec["task"] == "mqar":
        story = x[:sep]
        pairs = [(story[i], story[i + 1]) for i in range(0, len(story), 2) if story[i] >= tasks.first_key(spec)
                 and i + 1 < len(story) and story[i + 1] >= tasks.first_value(spec)]  # the filler gap has no pairs
        table = dict(pairs)
        assert len(table) == len(pairs), "a key repeats"
        for t in range(sep + 1, len(x)):
            if x[t] != tasks.PAD:
                assert x[t] in table, "a query for a key that was never given"
                y[t] = table[x[t]]
        assert sorted(k for k in x[sep + 1:] if k != tasks.PAD) == sorted(table), "the queries are not the keys"
    elif spec["task"] == "vt":
        story = x[:next(t for t, tok in enumerate(x) if tok < tasks.first_key(spec))]  # up to the gap's filler or SEP
        nxt, assigned = {}, set()
        for src, name in zip(story[0::2], story[1::2]):
            assert name not in assigned and (src >= tasks.first_value(spec) or src in assigned), "bad assignment order"
            assert src not in nxt, "two names assigned from one source: not a chain"
            nxt[src], _ = name, assigned.add(name)
        t = sep
        while t < len(x) and x[t] == tasks.SEP:  # SEP value, then the chain one hop per token, to its end
            j = t + 1
            assert x[j] >= tasks.first_value(spec)
            while j + 1 < len(x) and x[j + 1] not in (tasks.SEP, tasks.PAD):
                assert nxt[x[j]] == x[j + 1]
                y[j], j = x[j + 1], j + 1
            assert x[j] not in nxt, "the answer stops before the chain's end"
            t = j + 1
    else:
        needles = [t for t in range(len(x)) if x[t] == tasks.NEEDLE]
        assert len(needles) == 2 and x[needles[1] - 1] == tasks.SEP and needles[1] - 1 == sep
        k = spec["n_digits"]
        assert x[needles[0] + 1:needles[0] + 1 + k] == x[needles[1] + 1:needles[1] + 1 + k]
        for j in range(k):
            y[needles[1] + j] = x[needles[1] + 1 + j]
    return y


SPECS = [tasks.make_spec("mqar", n_pairs=8, n_keys=32, n_values=16, gap=5), tasks.make_spec("mqar"),
         tasks.make_spec("vt", n_chains=3, n_hops=5, gap=4), tasks.make_spec("passkey", length=60, n_digits=3),
         tasks.make_spec("mqar", n_pairs=6, n_keys=32, n_values=16, gap=12, gap_start=0),
         tasks.make_spec("vt", n_chains=2, n_hops=3, gap=9, gap_start=2)]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s["task"])
def test_generators_are_right_deterministic_and_padded(spec):
    T = tasks.row_length(spec)
    for frac in (0.0, 0.4, 1.0):
        x, y = tasks.batch(spec, 20, np.random.default_rng(7), frac)
        assert x.shape == y.shape == (20, T) and x.min() >= 0 and x.max() < tasks.vocab_size(spec)
        for row_x, row_y in zip(x, y):
            assert list(row_y) == solve(row_x, spec)
        again = tasks.batch(spec, 20, np.random.default_rng(7), frac)
        assert (again[0] == x).all() and (again[1] == y).all()
        used = (x != tasks.PAD).sum(1)  # the curriculum: shorter rows early, padded at the end with no targets
        assert (y[x == tasks.PAD] == -1).all()
        if frac == 1.0:
            assert (used == T).all()


def test_curriculum_ramps_the_difficulty_knob():
    spec = tasks.make_spec("mqar", n_pairs=16, curriculum_start=2)
    assert [tasks.level(spec, f) for f in (0, 0.5, 1, 2)] == [2, 9, 16, 16]
    for frac, pairs in ((0.0, 2), (0.5, 9), (1.0, 16)):
        _, y = tasks.batch(spec, 4, np.random.default_rng(0), frac)
        assert ((y >= 0).sum(1) == pairs).all()  # one answer per pair
    vt = tasks.make_spec("vt", n_chains=2, n_hops=4)
    assert ((tasks.batch(vt, 3, np.random.default_rng(0), 0.0)[1] >= 0).sum(1) == 2).all()  # 1 hop per chain
    with pytest.raises(ValueError, match="curriculum_start"):
        tasks.make_spec("mqar", n_pairs=4, curriculum_start=5)
    with pytest.raises(ValueError, match="no knob"):
        tasks.make_spec("mqar", n_hops=3)
    with pytest.raises(ValueError, match="distinct"):
        tasks.make_spec("mqar", n_pairs=40, n_keys=32)


def test_curriculum_modes_floor_and_mix():
    """floor holds each level until the ramp passes the next whole number (3 pairs at step 54 of a 750-step ramp from
    2 to 16, not at 27 as rounding gives); mix draws every row's level from the easiest up to the ramp's; ramp is one
    generator call at one level (the stream of every earlier run)."""
    s = tasks.make_spec("mqar", n_pairs=16, n_keys=128, n_values=128)
    assert [tasks.level(s, it / 750) for it in (26, 27)] == [2, 3] and [
        tasks.level(s, it / 750, "floor") for it in (53, 54)] == [2, 3]
    assert tasks.level(s, 1.0, "floor") == 16 and tasks.level(s, 1.0, "mix") == 16
    assert [tasks.level(s, it / 750, "mix_floor") for it in (53, 54)] == [2, 3]  # mix_floor: mix up to floor's level
    assert ((tasks.batch(s, 512, np.random.default_rng(5), 53 / 750, "mix_floor")[1] >= 0).sum(1) == 2).all()
    x, y = tasks.batch(s, 64, np.random.default_rng(5), 0.5)
    x0, y0 = tasks.mqar(np.random.default_rng(5), 64, dict(s, n_pairs=9))
    assert (np.array_equal(x[:, :x0.shape[1]], x0) and np.array_equal(y[:, :y0.shape[1]], y0)
            and (x[:, x0.shape[1]:] == tasks.PAD).all())
    x, y = tasks.batch(s, 512, np.random.default_rng(5), 1.0, "mix")
    pairs = (y >= 0).sum(1)  # answers per row = its number of pairs
    assert x.shape == (512, tasks.row_length(s)) and pairs.min() == 2 and pairs.max() == 16 and len(set(pairs)) == 15
    for row, p in zip(x[:50], pairs[:50]):  # every row is a whole mqar row of its level, then padding
        assert row[2 * p] == tasks.SEP and (row[3 * p + 1:] == tasks.PAD).all()


def test_the_gap_ramps_short_first():
    """gap_start < gap: the filler between story and queries grows on the curriculum's schedule; in "ramp" every
    row has the ramp's gap, in "mix" each row's is drawn up to it; at the end (and for the held-out rows) the rows
    are those of the fixed gap, and a spec written before the knob existed keeps the full gap."""
    s = tasks.make_spec("mqar", n_pairs=4, n_keys=16, n_values=16, gap=40, gap_start=0)
    fixed = tasks.make_spec("mqar", n_pairs=4, n_keys=16, n_values=16, gap=40)
    assert fixed["gap_start"] == 40 and [tasks.gap_level(s, f) for f in (0, 0.5, 1, 2)] == [0, 20, 40, 40]
    assert tasks.gap_level(s, 0.999) == 40 and tasks.gap_level(s, 0.999, "floor") == 39
    sep = lambda x: (x == tasks.SEP).argmax(1)  # the SEP after the story (2P tokens) and the gap
    for frac in (0.0, 0.5):
        x, _ = tasks.batch(s, 16, np.random.default_rng(3), frac)
        assert (sep(x) == 2 * tasks.level(s, frac) + tasks.gap_level(s, frac)).all()
    x, y = tasks.batch(s, 512, np.random.default_rng(3), 1.0, "mix")
    gaps = sep(x) - 2 * (y >= 0).sum(1)
    assert gaps.min() == 0 and gaps.max() == 40 and len(set(gaps)) > 30
    assert all(list(row_y) == solve(row_x, s) for row_x, row_y in zip(x, y))
    at_end = tasks.batch(s, 32, np.random.default_rng(3), 1.0)
    assert all(np.array_equal(a, b) for a, b in zip(at_end, tasks.batch(fixed, 32, np.random.default_rng(3))))
    old = {k: v for k, v in fixed.items() if k != "gap_start"}
    assert tasks.gap_level(old, 0.0) == 40 and np.array_equal(tasks.eval_rows(old, 8)[0], tasks.eval_rows(s, 8)[0])


@pytest.mark.parametrize("knobs, problem", [
    (dict(gap=8, gap_start=9), "0 <= gap_start <= gap"),
    (dict(gap=8, gap_start=-1), "0 <= gap_start <= gap"),
    (dict(gap_start=1), "0 <= gap_start <= gap"),
])
def test_a_bad_gap_start_is_refused(knobs, problem):
    with pytest.raises(ValueError, match=problem):
        tasks.make_spec("mqar", **knobs)


def test_held_out_rows_are_their_own_stream_and_score_right():
    spec = tasks.make_spec("mqar", n_pairs=8, n_keys=32)
    x, y = tasks.eval_rows(spec, 64)
    assert (tasks.eval_rows(spec, 64)[0] == x).all()
    train = tasks.batch(spec, 64, np.random.default_rng(1337), 1.0)[0]
    assert not {r.tobytes() for r in x} & {r.tobytes() for r in train}
    pred = np.where(y >= 0, y, 0)
    assert tasks.score(pred, y) == (1.0, 1.0)
    pred[0, y[0] >= 0] += 1  # one row entirely wrong: 1/64 of the answers, 1/64 of the rows
    assert tasks.score(pred, y) == pytest.approx((63 / 64, 63 / 64))
    guess = np.random.default_rng(0).integers(tasks.first_value(spec), tasks.vocab_size(spec), size=y.shape)
    assert tasks.score(guess, y)[0] < 0.03  # a uniform guess among 128 values: ~0.8%


def test_the_loss_reads_only_the_answers():
    spec = tasks.make_spec("mqar", n_pairs=4, n_keys=16, n_values=16)
    x, y = (torch.from_numpy(a) for a in tasks.batch(spec, 3, np.random.default_rng(0)))
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tasks.vocab_size(spec), block_size=16, n_layer=1, n_embd=16, n_head=2,
                          n_kv_head=1)).double()
    logits, loss = model(x, y)
    answers = y >= 0
    assert torch.allclose(loss, F.cross_entropy(logits[answers], y[answers]), rtol=1e-12, atol=0)


def prepare(tmp_path, *knobs):
    run("data/recall/prepare.py", "--out_dir", tmp_path, "--n_val", 32, *knobs)
    return pickle.load(open(tmp_path / "meta.pkl", "rb"))


def test_prepare_writes_a_row_dataset(tmp_path):
    meta = prepare(tmp_path, "--n_pairs", 6, "--n_keys", 24, "--gap", 3)
    assert meta["tokenizer"] == "rows" and meta["rows"]["n_pairs"] == 6 and meta["row_length"] == 3 * 6 + 3 + 1
    with np.load(tmp_path / "val.npz") as f:
        x, y = tasks.eval_rows(meta["rows"], 32)
        assert (f["x"] == x).all() and (f["y"] == y).all()
    bad = run("data/recall/prepare.py", "--out_dir", tmp_path / "b", "--n_pairs", 50, "--n_keys", 24, check=False)
    assert bad.returncode != 0 and bad.stderr.strip().startswith("error:") and "distinct" in bad.stderr


ROWS = ["--n_layer=1", "--n_embd=32", "--n_head=4", "--n_kv_head=2", "--head_dim=8", "--batch_size=16",
        "--block_size=13", "--eval_iters=1", "--log_interval=1", "--warmup_iters=2", "--learning_rate=3e-3",
        "--device=cpu", "--dtype=float32", "--rope_theta=1e6", "--attn=vha"]


def log_rows(out):
    return [json.loads(line) for line in open(out / "log.jsonl")]


@pytest.mark.slow
def test_row_training_logs_accuracy_follows_the_curriculum_and_resumes_exactly(tmp_path):
    data = tmp_path / "data"
    prepare(data, "--n_pairs", 4, "--n_keys", 8, "--n_values", 8, "--curriculum_start", 1)
    common = ["train.py", *ROWS, f"--data_dir={data}", "--max_iters=8", "--lr_decay_iters=8", "--eval_interval=2",
              "--curriculum_iters=6"]
    run(*common, f"--out_dir={tmp_path / 'a'}")
    evals = [r for r in log_rows(tmp_path / "a") if "val_loss" in r]
    assert [r["difficulty"] for r in evals] == [1, 2, 3, 4, 4]  # pairs: 1 + 3 * it/6, rounded
    assert all(0 <= r["val_acc"] <= 1 and 0 <= r["val_exact"] <= r["val_acc"] for r in evals)
    assert evals[-1]["val_loss"] < evals[0]["val_loss"]
    run(*common, f"--out_dir={tmp_path / 'b'}", "--max_iters=4")
    run(*common, f"--out_dir={tmp_path / 'b'}", "--init_from=resume")
    assert log_rows(tmp_path / "b")[-1]["val_loss"] == log_rows(tmp_path / "a")[-1]["val_loss"]
    strip = lambda rows: [{k: v for k, v in r.items() if k not in ("time", "tok_per_s")} for r in rows]
    assert strip(log_rows(tmp_path / "b")) == strip(log_rows(tmp_path / "a"))
    short = run(*common, f"--out_dir={tmp_path / 'c'}", "--block_size=8", check=False)
    assert short.returncode != 0 and "raise --block_size" in short.stderr


@pytest.mark.slow
def test_data_stream_changes_the_batches_paired_init_the_weights_and_stop_at_acc_stops_for_good(tmp_path):
    data = tmp_path / "data"
    prepare(data, "--n_pairs", 4, "--n_keys", 8, "--n_values", 8, "--curriculum_start", 1)
    common = ["train.py", *ROWS, f"--data_dir={data}", "--max_iters=2", "--lr_decay_iters=2", "--eval_interval=2"]
    first = lambda out, key: next(r[key] for r in log_rows(tmp_path / out) if key in r)  # iteration 0's value
    for name, extra in [("a", []), ("stream", ["--data_stream=1"]), ("unpaired", ["--paired_init=False"])]:
        run(*common, f"--out_dir={tmp_path / name}", *extra)
    assert first("stream", "val_loss") == first("a", "val_loss") and first("stream", "loss") != first("a", "loss")
    assert first("unpaired", "val_loss") != first("a", "val_loss")  # another init, scored on the same held-out rows
    stop = [*common[:-3], "--max_iters=40", "--lr_decay_iters=40", "--eval_interval=4", "--stop_at_acc=0.15",
            f"--out_dir={tmp_path / 's'}"]
    out = run(*stop).stdout
    evals = [r for r in log_rows(tmp_path / "s") if "val_acc" in r]
    assert evals[-1]["stopped"] and evals[-1]["val_acc"] >= 0.15 > max(r["val_acc"] for r in evals[:-1]), out
    assert evals[-1]["iter"] < 40 and f"stopped at step {evals[-1]['iter']}" in out
    run(*stop, "--init_from=resume")  # a stopped run resumed: evaluated again at its checkpoint, stopped again
    assert [r for r in log_rows(tmp_path / "s") if "val_acc" in r][-1]["iter"] == evals[-1]["iter"]


def test_a_row_dataset_without_its_held_out_rows_is_reported(tmp_path):
    data = tmp_path / "data"
    prepare(data, "--n_pairs", 4, "--n_keys", 8)
    (data / "val.npz").unlink()
    meta = (data / "meta.pkl").read_bytes()
    proc = run("train.py", *ROWS, f"--data_dir={data}", f"--out_dir={tmp_path / 'o'}", "--max_iters=2", check=False)
    assert (proc.returncode != 0 and proc.stderr.strip().startswith("error: the dataset in")
            and "incomplete or corrupt" in proc.stderr)
    assert (data / "meta.pkl").read_bytes() == meta and not (data / "val.npz").exists()  # nothing prepared over it
