"""
Token-level recall tasks, one example per row, in the style of the Zoology MQAR benchmark and
RULER. Generated here, deterministic per seed; nothing is downloaded.

A row is (x, y), both (T,) int: x is the input, y[t] the answer the model must predict at
position t, or -1 where there is none (the loss and the score read only the answers). Rows
shorter than T (early in a curriculum) are padded with PAD, whose targets are -1; attention is
causal, so padding at the end changes nothing before it.

Vocabulary: PAD, SEP, NEEDLE, then 16 filler tokens, n_keys key tokens, n_values value tokens.

  mqar     k1 v1 k2 v2 ... kP vP [gap] SEP q1 q2 ... qP         the queries are all P keys, shuffled;
           y:                                   v(q1) ... v(qP)   answers are not fed back as input
  vt       c1 a1  a1 a2  c2 b1  a2 a3 ... [gap] SEP c1 a1 a2 a3 SEP c2 b1 ...   chains of assignments
           (source, name), interleaved; the query names a chain's value, the answer walks the chain
           y:                                     a1 a2 a3 -1     b1 ...        one hop per token to its end
  passkey  f f f NEEDLE d1 d2 d3 d4 f f ... f SEP NEEDLE d1 d2 d3 d4   the needle at a random depth
           y:                                         d1 d2 d3 d4

Keys are distinct within a row, values are drawn with replacement. The curriculum knob of each
task (CURRICULUM) ramps from the spec's `curriculum_start` to its full value as training
progresses: the number of pairs (mqar), the chain length (vt) or the context length (passkey).
With `gap_start` below `gap`, the gap ramps too, from `gap_start` to `gap` on the same schedule:
short gaps first.
"""
import numpy as np

PAD, SEP, NEEDLE, N_SPECIAL, N_FILLER = 0, 1, 2, 3, 16
TASKS = ("mqar", "vt", "passkey")
# each task's knobs and their defaults; `gap`: filler tokens between the story and the queries,
# `gap_start`: the gap the curriculum starts from (None: the full gap from the first step)
DEFAULTS = {
    "mqar": dict(n_pairs=16, n_keys=128, n_values=128, gap=0, gap_start=None, curriculum_start=2),
    "vt": dict(n_chains=2, n_hops=4, n_keys=128, n_values=128, gap=0, gap_start=None, curriculum_start=1),
    "passkey": dict(length=128, n_digits=4, n_keys=1, n_values=10, curriculum_start=16),
}
# the knob the curriculum ramps
CURRICULUM = {"mqar": "n_pairs", "vt": "n_hops", "passkey": "length"}
EVAL_SEED = 20261  # the held-out rows' own stream; training rows come from train.py's (seed, iter) streams


def make_spec(task, **knobs):
    """A task spec: the task name and all its knobs (defaults filled in), checked."""
    if task not in DEFAULTS:
        raise ValueError(f"unknown recall task {task!r}; known: {', '.join(TASKS)}")
    unknown = set(knobs) - set(DEFAULTS[task])
    if unknown:
        raise ValueError(f"{task} has no knob {', '.join(sorted(unknown))}; its knobs: "
                         f"{', '.join(DEFAULTS[task])}")
    spec = dict(DEFAULTS[task], **knobs, task=task)
    if "gap" in spec and spec["gap_start"] is None:
        spec["gap_start"] = spec["gap"]
    full, start = spec[CURRICULUM[task]], spec["curriculum_start"]
    low = {"n_pairs": 1, "n_hops": 1, "length": 2 * spec.get("n_digits", 0) + 3}[CURRICULUM[task]]
    if not low <= start <= full:
        raise ValueError(f"{task}: need {low} <= curriculum_start <= {CURRICULUM[task]} ({full}), got {start}")
    if task == "mqar" and spec["n_pairs"] > spec["n_keys"]:
        raise ValueError(f"mqar: n_pairs={spec['n_pairs']} > n_keys={spec['n_keys']}, but keys are distinct in a row")
    if task == "vt" and (spec["n_chains"] * spec["n_hops"] > spec["n_keys"] or spec["n_chains"] > spec["n_values"]):
        raise ValueError(f"vt: {spec['n_chains']} chains x {spec['n_hops']} hops need that many "
                         f"distinct key tokens "
                         f"(n_keys={spec['n_keys']}) and n_chains <= n_values={spec['n_values']}")
    if min(v for k, v in spec.items() if k not in ("task", "gap", "gap_start")) < 1 or spec.get("gap", 0) < 0:
        raise ValueError(f"{task}: every knob must be >= 1 (gap >= 0), got {spec}")
    if "gap" in spec and not 0 <= spec["gap_start"] <= spec["gap"]:
        raise ValueError(f"{task}: need 0 <= gap_start <= gap ({spec['gap']}), got {spec['gap_start']}")
    return spec


def vocab_size(spec):
    return N_SPECIAL + N_FILLER + spec["n_keys"] + spec["n_values"]


def first_key(spec):  # token ids: filler, then keys, then values
    return N_SPECIAL + N_FILLER


def first_value(spec):
    return N_SPECIAL + N_FILLER + spec["n_keys"]


def row_length(spec):
    """T: the length of a row at full difficulty."""
    s = spec
    return {"mqar": lambda: 3 * s["n_pairs"] + s["gap"] + 1,  # 2P story + gap + SEP + P queries
            "vt": lambda: 2 * s["n_chains"] * s["n_hops"] + s["gap"] + s["n_chains"] * (s["n_hops"] + 2),
            "passkey": lambda: s["length"]}[s["task"]]()


CURRICULUM_MODES = ("ramp", "floor", "mix", "mix_floor")


def ramp(start, full, frac, mode):
    """start + frac * (full - start), frac clipped to [0, 1], rounded (modes "ramp", "mix") or
    rounded down ("floor", "mix_floor": each value is reached later)."""
    exact = start + min(max(frac, 0.0), 1.0) * (full - start)
    return int(exact // 1 if mode.endswith("floor") else round(exact))


def level(spec, frac, mode="ramp"):
    """The curriculum knob's value at training progress frac in [0, 1], from curriculum_start to
    its full value (in the "mix" modes, rows then range up to it)."""
    return ramp(spec["curriculum_start"], spec[CURRICULUM[spec["task"]]], frac, mode)


def gap_level(spec, frac, mode="ramp"):
    """The gap at progress frac, from gap_start to gap (specs written before gap_start: the full
    gap)."""
    return ramp(spec.get("gap_start", spec["gap"]), spec["gap"], frac, mode)


def filler(rng, shape):
    return N_SPECIAL + rng.integers(N_FILLER, size=shape)


# ---- the generators: (rng, n rows, spec at the current level) -> x, y of (n, T_level) ----
def mqar(rng, n, s):
    P, K0, V0 = s["n_pairs"], first_key(s), first_value(s)
    keys = rng.random((n, s["n_keys"])).argsort(1)[:, :P]  # (n, P): P distinct keys per row
    values = rng.integers(s["n_values"], size=(n, P))  # (n, P)
    order = rng.random((n, P)).argsort(1)  # (n, P): the query order
    T = 3 * P + s["gap"] + 1
    x, y = np.full((n, T), PAD), np.full((n, T), -1)
    x[:, 0:2 * P:2], x[:, 1:2 * P:2] = K0 + keys, V0 + values  # k1 v1 k2 v2 ...
    x[:, 2 * P:2 * P + s["gap"]] = filler(rng, (n, s["gap"]))
    x[:, 2 * P + s["gap"]] = SEP
    q = 2 * P + s["gap"] + 1
    x[:, q:] = K0 + np.take_along_axis(keys, order, 1)  # (n, P) queries
    y[:, q:] = V0 + np.take_along_axis(values, order, 1)  # each query's value
    return x, y


def vt(rng, n, s):
    C, H, K0, V0 = s["n_chains"], s["n_hops"], first_key(s), first_value(s)
    # distinct variable names
    names = K0 + rng.random((n, s["n_keys"])).argsort(1)[:, :C * H].reshape(n, C, H)
    consts = V0 + rng.random((n, s["n_values"])).argsort(1)[:, :C]  # (n, C) distinct chain values
    # a random interleaving of the chains: slot i gets chain perm[i] // H, its hops stay in order
    # (n, C*H): which chain each assignment belongs to
    chain = rng.random((n, C * H)).argsort(1) // H
    # (n, C*H)
    hop = (np.cumsum(chain[:, :, None] == np.arange(C), 1) - 1)[np.arange(n)[:, None], np.arange(C * H), chain]
    rows = np.arange(n)[:, None]
    # (n, C*H)
    source = np.where(hop == 0, consts[rows, chain], names[rows, chain, np.maximum(hop - 1, 0)])
    # (n, 2CH): source, name pairs
    story = np.stack([source, names[rows, chain, hop]], 2).reshape(n, 2 * C * H)
    parts, targets = [story, filler(rng, (n, s["gap"]))], [np.full((n, 2 * C * H + s["gap"]), -1)]
    for c in rng.random((n, C)).argsort(1).T:  # query the chains in a random order per row
        # (n, H+2)
        parts.append(np.concatenate([np.full((n, 1), SEP), consts[rows[:, 0], c][:, None], names[rows[:, 0], c]], 1))
        targets.append(np.concatenate([np.full((n, 1), -1), names[rows[:, 0], c], np.full((n, 1), -1)], 1))
    return np.concatenate(parts, 1), np.concatenate(targets, 1)


def passkey(rng, n, s):
    L, k, V0 = s["length"], s["n_digits"], first_value(s)
    x, y = filler(rng, (n, L)), np.full((n, L), -1)
    digits = V0 + rng.integers(s["n_values"], size=(n, k))  # (n, k)
    depth = rng.integers(L - 2 * k - 2, size=n)  # the needle starts anywhere before the question
    for i in range(n):
        x[i, depth[i]] = NEEDLE
        x[i, depth[i] + 1:depth[i] + 1 + k] = digits[i]
    # the question, then the answer
    x[:, L - k - 2], x[:, L - k - 1], x[:, L - k:] = SEP, NEEDLE, digits
    y[:, L - k - 1:L - 1] = digits  # at NEEDLE predict d1, at d1 predict d2, ...
    return x, y


GENERATORS = {"mqar": mqar, "vt": vt, "passkey": passkey}


def batch(spec, n, rng, frac=1.0, mode="ramp"):
    """n rows at curriculum progress frac (1 = full difficulty), padded to row_length(spec): (x,
    y) int64. mode "ramp"/"floor": every row at level(spec, frac, mode). "mix"/"mix_floor": each
    row's level drawn uniformly from curriculum_start up to that level, so the easiest rows stay
    in every batch (at frac = 1 too). A ramped gap (gap_start < gap) follows the same mode:
    gap_level(spec, frac, mode), or each row's drawn up to it."""
    knob, top, mix = CURRICULUM[spec["task"]], level(spec, frac, mode), mode.startswith("mix")
    levels = rng.integers(spec["curriculum_start"], top + 1, size=n) if mix else np.full(n, top)
    full_gap = spec.get("gap", 0)
    gaps = np.full(n, full_gap)
    # drawn only when the gap ramps: fixed-gap rows stay as they were
    if spec.get("gap_start", full_gap) < full_gap:
        widest = gap_level(spec, frac, mode)
        gaps = rng.integers(spec["gap_start"], widest + 1, size=n) if mix else np.full(n, widest)
    T, xs, ys = row_length(spec), [], []
    # a generator call per (level, gap), padded to T
    for lv, g in sorted(set(zip(levels.tolist(), gaps.tolist()))):
        at = dict(spec, **{knob: lv}, **({"gap": g} if "gap" in spec else {}))
        x, y = GENERATORS[spec["task"]](rng, int(((levels == lv) & (gaps == g)).sum()), at)
        xs.append(np.pad(x, ((0, 0), (0, T - x.shape[1])), constant_values=PAD))
        ys.append(np.pad(y, ((0, 0), (0, T - y.shape[1])), constant_values=-1))
    return np.concatenate(xs), np.concatenate(ys)


def eval_rows(spec, n, seed=EVAL_SEED):
    """n held-out rows at full difficulty from their own stream (never one of train.py's)."""
    return batch(spec, n, np.random.default_rng([seed, TASKS.index(spec["task"])]), 1.0)


def meta(spec, n_val):
    """meta.pkl of a row dataset: train.py generates training rows from `rows`, val.npz holds
    held-out ones."""
    knobs = ", ".join(f"{k}={v}" for k, v in spec.items() if k != "task")
    return {"tokenizer": "rows", "vocab_size": vocab_size(spec), "rows": dict(spec), "row_length": row_length(spec),
            "val_rows": n_val, "source": f"recall task {spec['task']} ({knobs}), generated by "
                                         f"data/recall/tasks.py"}


def score(pred, y):
    """pred, y (n, T): (answer-token accuracy, exact match per row), over the positions where y
    >= 0."""
    answer = y >= 0
    right = (pred == y) & answer
    return float(right.sum() / answer.sum()), float((right.sum(1) == answer.sum(1)).mean())
