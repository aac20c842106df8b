"""
What a recall (MQAR) run has learned in its first steps, to tell a run that stalls from one that
learns. train.py itself trains each probed prefix: one fresh run per step count K (--max_iters=K;
the run's lr_decay_iters and curriculum_iters stay as they were, so the first K steps are the
full run's), and each checkpoint is probed on rows at the easiest curriculum level and at full
difficulty:

    prev   layer 0: attention from each value token v_i to its own key k_i (the position before it), best head
    match  layer 1: attention from a query q = k_i to the value v_i after its key, best head
    grad   the gradient norm of each block on one batch at that step's curriculum level
    acc    held-out accuracy at step K (the prefix run's last eval)

The key-value circuit is prev then match: layer 0 copies k_i into v_i's position, layer 1 finds
it from q.

    python lab/recall_probe.py --run=out-confirm/runs/n_keys=64,n_values=64/gqa2/seed1027 --steps=25,50,100
    python lab/recall_probe.py --run=... --extra="--data_stream=1"     # the same init, other batches
"""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402
import torch  # noqa: E402

import model as model_module  # noqa: E402
from data.recall import tasks  # noqa: E402
from nanovha.config import flat_defaults, settings  # noqa: E402
from nanovha.loading import load_model  # noqa: E402

run = ""  # a train.py run folder with its args.json (sweep.py writes one per run)
extra = ""  # train.py overrides on top of its args, e.g. "--data_stream=1"
steps = "25,50,75,100,150,200,300"
out_dir = ""  # where the prefix runs go (default: <run>/probe, or <run>/probe-<extra>)
rows = 64  # probe rows per level
seed = 0  # the probe rows' stream

defaults = flat_defaults(globals())
PLAIN = model_module.plain_attention  # restored after every probe


def fail(msg):
    sys.exit(f"error: {msg}")


def recorded_attention():
    """Wraps model.plain_attention so each call also keeps its attention weights (B, H, Tq, Tk)
    in a list."""
    weights = []

    def recording(q, k, v):
        group = q.size(1) // k.size(1)
        # (B, H, T, d): query head j reads KV head j // group
        k_all = k.repeat_interleave(group, dim=1)
        scores = q @ k_all.transpose(-2, -1) / q.size(-1) ** 0.5  # (B, H, T, T)
        future = torch.ones(scores.shape[-2:], dtype=torch.bool).triu(1)
        # softmax(q k^T / sqrt(d)), causal
        weights.append(scores.masked_fill(future, float("-inf")).softmax(-1))
        return PLAIN(q, k, v)
    return weights, recording


def circuit_scores(weights, x, n_pairs):
    """(prev, match): layer 0's best-head mean attention v_i -> k_i, layer 1's best-head mean
    attention q -> v_i. x (B, T): MQAR rows k1 v1 ... kP vP [gap] SEP q1 ... qP (keys distinct
    within a row)."""
    B, T = x.shape
    value_pos = torch.arange(1, 2 * n_pairs, 2)  # (P,)
    # (B, H, P) -> (H,) -> best head
    prev = weights[0][:, :, value_pos, value_pos - 1].mean(dim=(0, 2)).max()
    queries = torch.arange(T - n_pairs, T)  # (P,): the last P positions
    key_of = (x[:, queries, None] == x[:, None, 0:2 * n_pairs:2])  # (B, P, P): query j asks key i
    target = 2 * key_of.float().argmax(-1) + 1  # (B, P): the value position after the matching key
    rows = torch.arange(B)[:, None]
    match = weights[1][rows, :, queries[None, :], target]  # (B, P, H)
    return prev.item(), match.mean(dim=(0, 1)).max().item()


def block_grads(model, x, y):
    """Gradient norm per block of each layer (W_qkv, W_o, premix/postmix, MLP) of the loss on one
    batch."""
    model.zero_grad(set_to_none=True)
    model(x, y)[1].backward()
    sums = {}
    for name, p in model.named_parameters():
        if p.grad is not None:
            # blocks.<i>.attn.qkv_proj.weight, blocks.<i>.mlp.up_proj.weight, embed.weight
            parts = name.split(".")
            if parts[0] != "blocks" or "norm" in name:
                continue  # the embedding (tied to the LM head) and the norms: not the circuit
            key = f"L{parts[1]}." + (parts[3].replace("_proj", "") if parts[2] == "attn" else parts[2])
            sums[key] = sums.get(key, 0.0) + p.grad.double().pow(2).sum().item()
    return {k: v ** 0.5 for k, v in sums.items()}


def probe(model, meta_rows, frac, mode):
    """The circuit scores at the easiest level and at full difficulty, and the block gradients at
    frac."""
    model.cfg.attn_impl = "plain"
    weights, recording = recorded_attention()
    out, rng = {}, np.random.default_rng(seed)
    full = meta_rows[tasks.CURRICULUM[meta_rows["task"]]]
    for name, P in (("easy", meta_rows["curriculum_start"]), ("full", full)):
        x, _ = tasks.batch(dict(meta_rows, n_pairs=P), rows, rng, 1.0)
        weights.clear()
        model_module.plain_attention = recording
        try:
            with torch.no_grad():
                model(torch.from_numpy(x[:, :3 * P + meta_rows["gap"] + 1]))
        finally:
            model_module.plain_attention = PLAIN
        out[f"prev_{name}"], out[f"match_{name}"] = circuit_scores(weights, torch.from_numpy(x), P)
    x, y = tasks.batch(meta_rows, 32, rng, frac, mode)
    out["grad"] = block_grads(model, torch.from_numpy(x), torch.from_numpy(y))
    return out


def main():
    args_path = os.path.join(run, "args.json")
    if not os.path.exists(args_path):
        fail(f"--run={run!r} has no args.json: give a train.py run folder that sweep.py or ablate.py wrote")
    try:
        ks = sorted({int(s) for s in steps.split(",")})
    except ValueError:
        fail(f"--steps={steps!r}: give step counts like 25,50,100")
    if not ks or ks[0] < 1:
        fail(f"--steps={steps!r}: every step count must be >= 1")
    args = [a for a in json.load(open(args_path)) if not a.startswith(("--out_dir=", "--max_iters=", "--stop_at_acc="))]
    args += extra.split()
    root = out_dir or os.path.join(run, "probe" + ("-" + extra.replace("--", "").replace(" ", "_") if extra else ""))
    print(f"{run} {extra}: prefix runs in {root}")
    print(f"| step | held-out acc | prev (2 pairs) | match (2 pairs) | prev (full) | match (full) | grad norms |")
    print("|---|---|---|---|---|---|---|")
    results = []
    for K in ks:
        run_dir = os.path.join(root, f"step{K}")
        ckpt = os.path.join(run_dir, "ckpt.pt")
        if not os.path.exists(ckpt):
            cmd = [sys.executable, os.path.join(ROOT, "train.py"), *args, f"--out_dir={run_dir}", f"--max_iters={K}",
                   "--stop_at_acc=0", "--log_interval=100000"]
            done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
            if done.returncode:
                fail(f"train.py stopped for step {K}: "
                     f"{(done.stderr or done.stdout).strip().splitlines()[-1]}")
        model, saved = load_model(ckpt)
        c = saved["config"]
        frac = min(1.0, K / c["curriculum_iters"]) if c["curriculum_iters"] else 1.0
        log = [json.loads(line) for line in open(os.path.join(run_dir, "log.jsonl"))]
        acc = [r["val_acc"] for r in log if "val_acc" in r][-1]
        r = dict(step=K, acc=acc, **probe(model, saved["meta"]["rows"], frac, c["curriculum_mode"]))
        results.append(r)
        grads = ", ".join(f"{k} {v:.3f}" for k, v in r["grad"].items())
        print(f"| {K} | {acc:.1%} | {r['prev_easy']:.2f} | {r['match_easy']:.2f} | "
              f"{r['prev_full']:.2f} "
              f"| {r['match_full']:.2f} | {grads} |")
    with open(os.path.join(root, "probe.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":  # importing defines only (the tests)
    globals().update(settings(defaults, sys.argv[1:]))
    main()
