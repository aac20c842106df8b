"""data/recall: the task generators are deterministic and right (checked by a solver written here from the
text alone), the eval set is held out of the training text, and scoring gives an oracle 100%, chance to
random guessing, and the same verdicts by teacher forcing as by greedy decoding."""
import pickle
import random
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import run
from data.common import load_tokenizer
from data.recall import tasks
from model import GPT, GPTConfig

V = len(tasks.ALPHABET)


@pytest.fixture(autouse=True)
def one_thread():  # tiny models: a second thread only fights over a shared CPU
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def solve(text):
    """Answers an example from its text alone, in order (independent of the generator's code)."""
    kind, body = text[:3], text[3:].rstrip("\n")
    if kind == "kv|":
        defs, queries = body.split("|")
        pairs = re.findall(r"([a-z]+)=(\d\d) ", defs)
        assert len({k for k, _ in pairs}) == len(pairs), "keys repeat"
        table = dict(pairs)
        return [table[k] for k in re.findall(r"([a-z]+)=\d\d", queries)]
    if kind == "vt|":
        story, question = body.split("|")
        value = re.match(r"(\d\d)\?", question).group(1)
        env, order = {}, []
        for var, rhs in re.findall(r"([A-Z]\d)=([A-Z]\d|\d\d)\.", story):
            assert var not in env, "a variable is assigned twice"
            env[var] = env[rhs] if rhs[0].isupper() else rhs  # KeyError if used before it is assigned
            order.append(var)
        assert len(set(env.values())) > 1, "no distractor chain"
        return [" ".join(v for v in order if env[v] == value)]
    if kind == "pk|":
        keys = re.findall(r"the pass key is (\d{5})\.", body)
        assert len(keys) == 1 and body.endswith("|the pass key is " + keys[0])
        return keys
    if kind == "cp|":
        source, copy = body.lstrip(".").split("|")
        assert source == copy
        return [copy]
    raise AssertionError(f"unknown task header {kind!r}")


@pytest.mark.parametrize("task", tasks.TRAIN_TASKS)
def test_generators_are_exact_length_deterministic_and_correct(task):
    for L in (tasks.MIN_LENGTH[task], 100, 257, 1024, 2048):
        for i in range(8):
            ex = tasks.make_example(task, L, random.Random(f"test/{i}"))
            text = ex["text"]
            assert len(text) == L and text.endswith("\n") and text.count("\n") == 1
            assert set(text) <= set(tasks.ALPHABET)
            assert [text[s:e] for s, e in ex["spans"]] == solve(text), text
            assert ex == tasks.make_example(task, L, random.Random(f"test/{i}"))  # same seed, same example
    with pytest.raises(ValueError):
        tasks.make_example(task, tasks.MIN_LENGTH[task] - 1, random.Random(0))


def test_filler_is_the_repeated_noise_with_the_pieces_whole():
    ex = tasks.make_example("passkey", 700, random.Random(3))
    body = ex["text"][3:ex["text"].index("|", 3)]
    needle = re.search(r" the pass key is \d{5}\.", body)
    assert needle and body[needle.start() - 1] == "."  # inserted at a sentence end
    rest = body[:needle.start()] + body[needle.end():]
    assert rest in tasks.NOISE * (len(rest) // len(tasks.NOISE) + 2)  # nothing but the noise sentences, in order


def test_mqar_asks_several_queries_and_scales_keys():
    ex = tasks.make_example("mqar", 1024, random.Random(0))
    assert len(ex["spans"]) == 32
    long = tasks.make_example("mqar", 8192, random.Random(0))  # > 26^2 pairs: 3-letter keys, still correct
    assert [long["text"][s:e] for s, e in long["spans"]] == solve(long["text"])


def test_streams_are_deterministic_and_separate():
    a = tasks.text_stream(5000, 256, 0, "train")
    assert a == tasks.text_stream(5000, 256, 0, "train")
    assert a != tasks.text_stream(5000, 256, 1, "train") and a != tasks.text_stream(5000, 256, 0, "val")
    assert tasks.eval_set("vt", 128, 3) == tasks.eval_set("vt", 128, 5)[:3]  # a larger n only adds examples
    first = a.split("\n")[0] + "\n"
    assert first not in tasks.text_stream(5000, 256, 0, "train", exclude={first})  # exclusion works


def test_prepare_writes_a_char_dataset_without_eval_examples(tmp_path):
    run("data/recall/prepare.py", "--out_dir", tmp_path, "--max_len", 256, "--train_chars", 300_000, "--val_chars", 20_000)
    meta = pickle.load(open(tmp_path / "meta.pkl", "rb"))
    assert meta["tokenizer"] == "char" and meta["vocab_size"] == V and meta["stoi"] == tasks.STOI
    encode, decode = load_tokenizer(meta)
    assert decode(encode("kv|ab=42 |ab=42\n")) == "kv|ab=42 |ab=42\n"
    train = tasks.decode(np.memmap(tmp_path / "train.bin", dtype=np.uint16, mode="r"))
    lines = train.split("\n")[:-1]
    assert len(train) >= 300_000 and {line[:3] for line in lines} == {"kv|", "vt|", "pk|", "cp|"}
    assert max(map(len, lines)) + 1 <= 256  # examples up to --max_len
    mqar = np.array([len(line) + 1 for line in lines if line.startswith("kv|")])  # log-uniform over 32..256:
    assert abs(np.mean(mqar < 64) - 1 / 3) < 0.05 and abs(np.mean(mqar >= 128) - 1 / 3) < 0.05  # a third per octave
    held_out = [ex["text"] for t in tasks.TASKS for L in (128, 256) for ex in tasks.eval_set(t, L, 50)]
    assert not [t for t in held_out if t in train]


# ---- scoring ----
class Oracle(torch.nn.Module):
    """Knows every example: its logits put all mass on the true next token (shift=1), or on the
    current one (shift=0, an off-by-one model that must score ~0)."""

    def __init__(self, examples, shift=1):
        super().__init__()
        self.texts = {ex["text"][:-1]: ex["text"] for ex in examples}
        self.shift = shift

    def forward(self, idx):
        full = [tasks.encode(self.texts[tasks.decode(row)]) for row in idx]
        nxt = torch.tensor(np.stack([t[self.shift:self.shift + idx.size(1)] for t in full]))
        return F.one_hot(nxt, V).float(), None


class Guesser(torch.nn.Module):
    """Uniform random guesses among the digits (the answer alphabet of mqar and passkey)."""

    def forward(self, idx):
        logits = torch.rand(*idx.shape, V, generator=torch.Generator().manual_seed(int(idx.sum())))
        digits = torch.tensor([c.isdigit() for c in tasks.ALPHABET])
        return logits.masked_fill(~digits, -1.0), None


def accuracy(model, examples, **kw):
    right = [r for ex in tasks.score(model, examples, **kw) for r in ex]
    return sum(right) / len(right)


def test_oracle_scores_100_and_off_by_one_scores_0():
    examples = [ex for t in tasks.TASKS for L in (128, 300) for ex in tasks.eval_set(t, L, 6)]
    assert accuracy(Oracle(examples), examples, batch_size=4) == 1.0
    assert accuracy(Oracle(examples, shift=0), examples) < 0.05


def test_random_guessing_scores_near_chance():
    mqar = tasks.eval_set("mqar", 512, 60)  # 60 x 16 queries
    acc = accuracy(Guesser(), mqar)
    assert abs(acc - tasks.chance("mqar")) < 0.01, acc
    assert accuracy(Guesser(), tasks.eval_set("passkey", 256, 40)) == 0.0  # chance 1e-5


def greedy_answer(model, ex, change_last=False):
    """ex with its answer replaced by the model's own greedy continuation (optionally last token changed)."""
    (s, e), = ex["spans"]
    x = torch.from_numpy(tasks.encode(ex["text"]))[None]
    ids = model.generate(x[:, :s], e - s, temperature=0)[0, s:e].clone()
    if change_last:
        ids[-1] = (ids[-1] + 1) % V
    return dict(ex, text=ex["text"][:s] + tasks.decode(ids) + ex["text"][e:])


def test_teacher_forcing_agrees_with_greedy_decoding():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=V, block_size=256, n_layer=2, n_embd=32, n_head=4, n_kv_head=2, attn="vha")).double().eval()
    base = tasks.eval_set("vt", 96, 3) + tasks.eval_set("passkey", 200, 3)
    good = [greedy_answer(model, ex) for ex in base]
    bad = [greedy_answer(model, ex, change_last=True) for ex in base]
    for examples, want in ((good, True), (bad, False), (base, None)):
        forced, greedy = tasks.score(model, examples), tasks.score(model, examples, greedy=True)
        assert forced == greedy
        if want is not None:
            assert forced == [[want]] * len(examples)
