"""
The recall KV-budget sweep: token-level multi-query associative recall (data/recall, MQAR)
learned by small models that differ only in their attention (MHA, GQA-4, GQA-2, MQA, VHA and its
ablations, MLA, MFA), every variant with the same steps, batches, schedule and seeds, compared
seed by seed (paired differences).

    python sweep.py                # 10 variants x 2 points x 10 seeds = 200 runs of <= 1500 steps, 2 at a time
                                   #   (a run stops once 99% of the held-out answers are right)
    python sweep.py --quick        # 4 variants x 2 points x 2 seeds: a pipeline check
    python sweep.py report         # rebuild sweep.md, sweep.json, sweep.csv and sweep.png from the finished runs
    python sweep.py robust         # the recipe under small changes (level rounding, ramp length, data stream, init
                                   #   not shared): MHA/GQA-4/GQA-2 x 5 seeds each; then its report
    python sweep.py robust-report  # rebuild robust.md
    (how long each takes, on which CPU: docs/recall.md)

The primary measure is learning speed: steps to 50/90/99% held-out accuracy (interpolated between
the evals, every 25 steps) and the area under the accuracy curve; final accuracy and success (>=
90%) are reported too, for points where runs fail. Any knob below can be overridden with
--key=value; runs resume (experiments.py).
"""
import csv
import hashlib
import os
import subprocess
import sys
import time

import numpy as np
import torch

from data.recall import tasks
from model import fold_to_gqa
from nanovha.config import SEED_MAX, at_least
from nanovha.costs import kv_bytes_per_token
from lab.experiments import (area, choose_variants, fmt, hold_root, load_results, parse_command, parse_primary,
                                 pyplot, read_json, ROOT, run_all, same_run, steps_to, train, write_json)
from nanovha.loading import load_model
from nanovha.outputs import save_figure
from lab.sweep_report import change_section, paired_section, primary_section, success_rate
from nanovha.variants import overrides

# -----------------------------------------------------------------------------
# defaults (overridden by --smoke / --quick, i.e. config/sweep/<size>.py, then by --key=value)
device = "auto"
seed = 200  # seeds 200, 201, ...: the recipe was chosen on 100-109
jobs = 2  # tiny models: two runs at a time, one thread each, use 2 cores best
threads = 1
# runs/<point>/<variant>/seed<N>/ + sweep.json, sweep.csv, sweep.md, sweep.png
sweep_root = "out-sweep"
sweep_seeds = 10
task = "mqar"
sweep_variants = "all"  # or a comma list of SWEEP_VARIANTS
task_args = ""  # task knobs for every point, e.g. "n_pairs=16,gap=0" (data/recall/tasks.py DEFAULTS)
points = "n_keys=64,n_values=64;n_keys=128,n_values=128"  # ';' between points; a point may also set n_head, head_dim
sweep_iters = 1500
curriculum_iters = 750
sweep_eval_interval = 25
n_val = 512
sweep_batch_size = 0  # rows per step for every point; 0: the recipe's, 64 rows up to 64 keys and 128 above
# a run stops at its first eval with this held-out accuracy; its curve stays there afterwards
stop_at_acc = 0.99
sweep_model_args = ""  # extra train.py overrides for every sweep run
success = 0.9  # a run "succeeds" when its final held-out accuracy reaches this
primary = ""  # a plan's comparisons, e.g. "vha-gqa2,mha-gqa2": AUC at the first point, Holm-corrected over these
robust_variants = "mha,gqa4,gqa2"  # python sweep.py robust: these variants ...
robust_seeds = 5
robust_point = -1  # ... at this point (an index into points)
# the variants swept (nanovha/variants.py: their train.py overrides on config/recall_mqar.py, for
# its 8 query heads of dim 8 and width 64 unless a point sets n_head / head_dim / n_embd); mla and
# mfa get GQA-2's cache
SWEEP_VARIANTS = ("mha", "gqa4", "gqa2", "gqa2_half_q", "mqa", "vha", "premix_only", "postmix_only", "mla", "mfa")
COMPARISONS = [("mha", "gqa2"), ("mha", "gqa4"), ("gqa4", "gqa2"), ("gqa2", "mqa"), ("mha", "mqa"), ("vha", "gqa2"),
               ("vha", "gqa4"), ("vha", "mha"), ("vha", "gqa2_half_q"), ("premix_only", "gqa2"),
               ("postmix_only", "gqa2"), ("vha", "premix_only"), ("vha", "postmix_only"), ("mla", "gqa2"),
               ("mfa", "gqa2"), ("vha", "mla"), ("vha", "mfa")]
# python sweep.py robust: the recipe with one thing changed at a time (config overrides of this script)
ROBUSTNESS = {
    # each level reached later (rounded down)
    "mix_floor": lambda c: dict(sweep_model_args="--curriculum_mode=mix_floor"),
    # the ramp 10% shorter
    "ramp_short": lambda c: dict(curriculum_iters=round(0.9 * c["curriculum_iters"])),
    "ramp_long": lambda c: dict(curriculum_iters=round(1.1 * c["curriculum_iters"])),  # 10% longer
    # other batches, the same init
    "data_stream_1": lambda c: dict(sweep_model_args="--data_stream=1"),
    # the same batches, no weights shared
    "independent_init": lambda c: dict(sweep_model_args="--paired_init=False"),
}
# what a sweep point may set besides task knobs
MODEL_KNOBS = ("n_head", "head_dim", "n_embd", "n_layer")
# rows per step unless --sweep_batch_size: (rows, up to this many keys, rows above)
RECIPE_ROWS = (64, 64, 128)
LEVELS = (0.5, 0.9, 0.99)  # learning speed: steps to these held-out accuracies
LIMITS = {k: at_least(1) for k in ("sweep_seeds", "robust_seeds", "jobs", "n_val", "sweep_eval_interval")}
# -----------------------------------------------------------------------------


def parse_args(argv):
    command, cfg = parse_command(argv, ("run", "report", "robust", "robust-report"), globals(), LIMITS)
    cfg["variant_list"] = choose_variants(cfg["sweep_variants"], SWEEP_VARIANTS)
    cfg["robust_list"] = choose_variants(cfg["robust_variants"], SWEEP_VARIANTS)
    if cfg["sweep_batch_size"] < 0:
        sys.exit(f"error: sweep_batch_size={cfg['sweep_batch_size']}: give rows per step >= 1, or 0 for the recipe's")
    if cfg["seed"] + max(cfg["sweep_seeds"], cfg["robust_seeds"]) - 1 > SEED_MAX:
        sys.exit(f"error: seed={cfg['seed']}: its runs take seeds up to seed + sweep_seeds - 1, past 2^63-1; "
                 f"lower --seed")
    cfg["point_list"] = parse_points(cfg)
    cfg["primary_list"] = parse_primary(cfg["primary"], cfg["variant_list"])
    if not -len(cfg["point_list"]) <= cfg["robust_point"] < len(cfg["point_list"]):
        sys.exit(f"error: robust_point={cfg['robust_point']} is not an index into the "
                 f"{len(cfg['point_list'])} points")
    return command, cfg


def knobs(text, what):
    """'a=1,b=2' -> {'a': 1, 'b': 2} (integer values)."""
    out = {}
    for item in filter(None, (t.strip() for t in text.split(","))):
        key, _, value = item.partition("=")
        try:
            out[key.strip()] = int(value)
        except ValueError:
            sys.exit(f"error: {what}: {item!r} is not key=integer (e.g. n_keys=128)")
    return out


def parse_points(cfg):
    """The sweep points: [(name, task spec, train.py model overrides)], each checked now, not an
    hour in."""
    base, points = knobs(cfg["task_args"], "task_args"), []
    for text in filter(None, (p.strip() for p in cfg["points"].split(";"))):
        point = knobs(text, "points")
        model = {k: v for k, v in point.items() if k in MODEL_KNOBS}
        try:
            spec = tasks.make_spec(cfg["task"], **base, **{k: v for k, v in point.items() if k not in MODEL_KNOBS})
        except ValueError as e:
            sys.exit(f"error: sweep point {text!r}: {e} (a point may also set "
                     f"{', '.join(MODEL_KNOBS)})")
        points.append((text.replace(" ", ""), spec, model))
    if not points:
        sys.exit("error: points is empty: give at least one, e.g. "
                 "--points='n_keys=128,n_values=128'")
    return points


def batch_rows(cfg, spec):
    """Rows per step at a point: --sweep_batch_size, or the recipe's (docs/recall.md: 64 rows
    learned every held-out run at 64 keys, 128 rows at 128 keys)."""
    rows, keys, above = RECIPE_ROWS
    return cfg["sweep_batch_size"] or (above if spec["n_keys"] > keys else rows)


def rows_text(cfg):
    rows, keys, above = RECIPE_ROWS
    return f"{cfg['sweep_batch_size']} rows" if cfg["sweep_batch_size"] else f"{rows} rows ({above} above {keys} keys)"


# ---- one run ----
def prepare_point(cfg, spec):
    """The point's dataset folder (meta.pkl + held-out val.npz), named by the spec and by the
    generator's own hash, so an edited task never reuses stale rows."""
    with open(tasks.__file__, "rb") as f:
        version = hashlib.sha256(f.read()).hexdigest()[:8]
    name = "_".join(f"{k}{v}" for k, v in spec.items() if k != "task")
    folder = os.path.abspath(os.path.join(cfg["sweep_root"], "data",
                                          f"{spec['task']}_{name}_val{cfg['n_val']}_{version}"))
    if not os.path.exists(os.path.join(folder, "meta.pkl")):
        cmd = [sys.executable, os.path.join(ROOT, "data", "recall", "prepare.py"), "--out_dir", folder,
               "--task", spec["task"], "--n_val", str(cfg["n_val"]),
               *[f"--{k}={v}" for k, v in spec.items() if k != "task"]]
        if subprocess.run(cmd, stdout=subprocess.DEVNULL).returncode != 0:
            sys.exit(1)  # prepare.py printed the error
    return folder


def sweep_args(cfg, point, variant, seed, run_dir, data_dir):
    """train.py's argv for one run: the base config, the same budget for every variant, then the
    variant's attention and the point's model knobs."""
    _, spec, model = point
    arch = overrides(variant, model.get("n_head", 8), model.get("head_dim", 8), model.get("n_embd", 64))
    knobs = {**model, **arch, "n_head": arch.get("n_head", model.get("n_head", 8))}
    iters = cfg["sweep_iters"]
    return ["config/recall_mqar.py", f"--data_dir={data_dir}", f"--out_dir={run_dir}", f"--seed={seed}",
            f"--max_iters={iters}", f"--lr_decay_iters={iters}", f"--curriculum_iters={cfg['curriculum_iters']}",
            f"--batch_size={batch_rows(cfg, spec)}", f"--block_size={tasks.row_length(spec)}",
            f"--eval_interval={cfg['sweep_eval_interval']}", f"--log_interval={iters}",
            f"--stop_at_acc={cfg['stop_at_acc']}", f"--device={cfg['device']}",
            *[f"--{k}={v}" for k, v in knobs.items()], *cfg["sweep_model_args"].split()]


@torch.no_grad()
def row_accuracy(model, data_dir, device):
    """(answer-token accuracy, argmax predictions) of a model on a row dataset's held-out rows."""
    with np.load(os.path.join(data_dir, "val.npz")) as f:
        x, y = torch.from_numpy(f["x"].astype(np.int64)), f["y"]
    pred = torch.cat([model.to(device).eval()(x[i:i + 256].to(device))[0].argmax(-1).cpu()
                      for i in range(0, len(x), 256)]).numpy()
    return tasks.score(pred, y)[0], pred


def run_one(cfg, job):
    """One (point, variant, seed) run: trains it, keeps its accuracy curve, and for a foldable
    VHA scores the folded GQA model too. Writes result.json; returns a status word."""
    point, variant, seed, data_dir = job
    run_dir = os.path.abspath(os.path.join(cfg["sweep_root"], "runs", point[0], variant, f"seed{seed}"))
    result_path = os.path.join(run_dir, "result.json")
    args = sweep_args(cfg, point, variant, seed, run_dir, data_dir)
    if os.path.exists(result_path) and same_run(read_json(result_path)["args"], args):
        return "done before, skipped"
    t0 = time.time()
    rows, note = train(cfg, run_dir, args, cfg["sweep_iters"])
    curve = [[r["iter"], r["val_acc"]] for r in rows if "val_acc" in r]
    model = load_model(run_dir)[0]
    res = {"point": point[0], "variant": variant, "seed": seed, "args": args, "spec": point[1],
           "iters": cfg["sweep_iters"], "acc": curve[-1][1],
           "exact": [r["val_exact"] for r in rows if "val_exact" in r][-1], "curve": curve,
           "params": model.num_params(), "kv_bytes_per_token": kv_bytes_per_token(model.cfg, torch.bfloat16),
           "train_s": rows[-1]["time"]}
    # deployed form: plain GQA, scored the same way
    if model.cfg.attn == "vha" and model.cfg.vha_postmix_act == "linear":
        acc, pred = row_accuracy(model, data_dir, "cpu")
        folded = fold_to_gqa(model)
        res["acc_unfolded"], (res["acc_folded"], pred_folded) = acc, row_accuracy(folded, data_dir, "cpu")
        res["fold_same_predictions"] = bool((pred == pred_folded).all())
    res["wall_s"] = time.time() - t0
    write_json(result_path, res)
    return note + f"acc {res['acc']:.1%} at step {curve[-1][0]}, {res['wall_s']:.0f} s"


def run_grid(cfg, variants, seeds):
    points = cfg["point_list"]
    folders = {p[0]: prepare_point(cfg, p[1]) for p in points}
    # seed-major: every point has the same seeds finished at any time
    jobs = [(p, v, s, folders[p[0]]) for s in seeds for p in points for v in variants]
    print(f"recall sweep ({cfg['size']}): {len(points)} points x {len(variants)} variants x "
          f"{len(seeds)} seeds = "
          f"{len(jobs)} runs of <= {cfg['sweep_iters']} steps x {rows_text(cfg)}, {cfg['jobs']} at a "
          f"time; results in {cfg['sweep_root']}")
    run_all(cfg, jobs, lambda job: run_one(cfg, job), lambda job: f"{job[0][0]} {job[1]} seed {job[2]}")


def measures(r):
    """A result's numbers, from its stored curve (the one source of every measure)."""
    out = {f"steps_to_{round(lv * 100)}": steps_to(r["curve"], lv, r["iters"]) for lv in LEVELS}
    return dict(out, auc=area(r["curve"], r["iters"]), acc=r["acc"])


# ---- the report ----
def cmd_run(cfg):
    run_grid(cfg, cfg["variant_list"], [cfg["seed"] + i for i in range(cfg["sweep_seeds"])])
    cmd_report(cfg)


def results(cfg, root, variants):
    names = [p[0] for p in cfg["point_list"]]
    rows = load_results(root, ("*", "*", "seed*"), lambda r: r["variant"] in variants and r["point"] in names)
    for r in rows:
        r.update(measures(r))
    return rows


def cmd_report(cfg):
    """sweep.json/csv, sweep.md (per point: learning speed, accuracy, success; paired
    comparisons) and sweep.png."""
    rows = results(cfg, cfg["sweep_root"], cfg["variant_list"])
    if not rows:
        sys.exit(f"error: no finished sweep runs in {cfg['sweep_root']}/runs for these points and variants; "
                 "run python sweep.py first")
    write_json(os.path.join(cfg["sweep_root"], "sweep.json"), rows)
    cols = ["point", "variant", "seed", "acc", "exact", "steps_to_50", "steps_to_90", "steps_to_99", "auc", "params",
            "kv_bytes_per_token", "train_s"]
    with open(os.path.join(cfg["sweep_root"], "sweep.csv"), "w", newline="") as f:
        csv.writer(f).writerows([cols] + [[r[c] for c in cols] for r in rows])
    at = lambda p, v: {r["seed"]: r for r in rows if r["point"] == p and r["variant"] == v}
    variants = [v for v in cfg["variant_list"] if any(r["variant"] == v for r in rows)]
    points = [p[0] for p in cfg["point_list"] if any(r["point"] == p[0] for r in rows)]
    iters, th = rows[0]["iters"], cfg["success"]
    lines = ["# Recall KV-budget sweep", "",
             f"Task {rows[0]['spec']['task']}; every run: up to {iters} steps x {rows_text(cfg)}, "
             f"config/recall_mqar.py (curriculum over the first {cfg['curriculum_iters']} steps) plus the variant's "
             "heads; the same seeds (init blocks and batches) for every variant. Accuracy: answer tokens right on "
             f"{cfg['n_val']} held-out rows at full difficulty, every {cfg['sweep_eval_interval']} steps; a run stops "
             f"at its first eval >= {cfg['stop_at_acc']:.0%}. Steps to X%: interpolated between evals; a run that "
             f"never got there counts as {iters} (a lower bound). AUC: mean accuracy over the "
             f"{iters} steps. Success: "
             f"final accuracy >= {th:.0%} (exact 95% interval of the rate). Mean ± SE over seeds.", ""]
    for p in points:
        lines += [f"## Point {p}", "", "| variant | KV B/token (bf16) | params | success | steps "
                                       "to 50% | steps to 90% "
                  "| steps to 99% | AUC % | final accuracy % |", "|---|---|---|---|---|---|---|---|---|"]
        for v in variants:
            g = list(at(p, v).values())
            if g:
                lines.append(f"| {v} | {g[0]['kv_bytes_per_token']} | {g[0]['params']:,} | "
                             f"{success_rate(g, th)} | "
                             + " | ".join(fmt([r[f"steps_to_{round(lv * 100)}"] for r in g], 1, 0, "se")
                                          for lv in LEVELS)
                             + f" | {fmt([r['auc'] for r in g], 100, 1, 'se')} | "
                               f"{fmt([r['acc'] for r in g], 100, 1, 'se')} |")
        lines.append("")
    if cfg["primary_list"]:
        lines += primary_section(at, points[0], cfg["primary_list"])
    lines += paired_section(at, points, th, cfg["primary_list"], COMPARISONS)
    if len(points) > 1:
        lines += [""] + change_section(at, points, COMPARISONS)
    folds = [r for r in rows if "acc_folded" in r]
    if folds:
        gap = max(abs(r["acc_folded"] - r["acc_unfolded"]) for r in folds)
        lines += ["", f"Folded == unfolded: {len(folds)} VHA-family runs (linear postmix) were "
                      f"folded into plain GQA "
                  f"(fold_to_gqa) and scored again: the largest accuracy difference is "
                  f"{gap * 100:.2f} points, and "
                  f"{sum(r['fold_same_predictions'] for r in folds)} of {len(folds)} give the same argmax at "
                  "every position."]
    png = plot(rows, points, variants, cfg)
    if png:
        lines += ["", f"![recall sweep]({os.path.basename(png)})"]
    write_report(os.path.join(cfg["sweep_root"], "sweep.md"), lines,
                 "sweep.json, sweep.csv" + (f", {os.path.basename(png)}" if png else ""))


def write_report(path, lines, also):
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wrote {path}" + (f", {also}" if also else ""))


def plot(rows, points, variants, cfg):
    """Held-out accuracy vs step (mean over seeds) per variant, one panel per point."""
    plt = pyplot()
    if plt is None:
        return None
    fig, axes = plt.subplots(1, len(points), figsize=(6 * len(points), 4.2), squeeze=False)
    iters = rows[0]["iters"]
    grid = np.arange(0, iters + 1, cfg["sweep_eval_interval"])
    for ax, p in zip(axes[0], points):
        for i, v in enumerate(variants):
            g = [r for r in rows if r["point"] == p and r["variant"] == v]
            if g:  # each curve on a common grid of steps, flat after an early stop
                curves = [np.interp(grid, *zip(*r["curve"], (iters, r["curve"][-1][1]))) for r in g]
                ax.plot(grid, np.mean(curves, 0), color=f"C{i}", label=f"{v} ({len(g)})",
                        ls="-" if v.startswith(("vha", "premix", "postmix")) else "--")
        ax.set(xlabel="training step", ylabel="held-out accuracy (mean over seeds)", title=p, ylim=(-0.03, 1.03))
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    path = os.path.join(cfg["sweep_root"], "sweep.png")
    save_figure(fig, path)
    plt.close(fig)
    return path


# ---- robustness of the recipe ----
def robust_cfgs(cfg):
    """(name, config) for the recipe itself (the sweep's own runs) and each ROBUSTNESS change, at
    one point."""
    point = [cfg["point_list"][cfg["robust_point"]]]
    out = [("recipe", dict(cfg, point_list=point))]
    for name, changes in ROBUSTNESS.items():
        change = changes(cfg)
        extra = " ".join(filter(None, (cfg["sweep_model_args"], change.get("sweep_model_args", ""))))
        out.append((name, dict(cfg, **{**change, "sweep_model_args": extra, "point_list": point,
                                       "sweep_root": os.path.join(cfg["sweep_root"], "robust", name)})))
    return out


def cmd_robust(cfg):
    seeds = [cfg["seed"] + i for i in range(cfg["robust_seeds"])]
    for name, c in robust_cfgs(cfg):
        os.makedirs(c["sweep_root"], exist_ok=True)
        c["size"] = f"{cfg['size']}, {name}"
        run_grid(c, cfg["robust_list"], seeds)
    cmd_robust_report(cfg)


def cmd_robust_report(cfg):
    """robust.md: success and learning speed of the baselines under each change of the recipe,
    and what sharing the init between variants does to the spread of paired differences."""
    th, table = cfg["success"], {}
    lines = ["# The recall recipe under small changes", "",
             f"Point {cfg['point_list'][cfg['robust_point']][0]}; each row changes "
             "one thing in the recipe (python sweep.py robust). Success: final held-out accuracy >= "
             f"{th:.0%}; steps to 90%: mean ± SE over seeds.", "",
             "| change | " + " | ".join(f"{v}: success | {v}: steps to 90%" for v in cfg["robust_list"]) + " |",
             "|---" * (1 + 2 * len(cfg["robust_list"])) + "|"]
    for name, c in robust_cfgs(cfg):
        rows = results(c, c["sweep_root"], cfg["robust_list"])
        table[name] = {v: {r["seed"]: r for r in rows if r["variant"] == v} for v in cfg["robust_list"]}
        cells = [f"{sum(r['acc'] >= th for r in g.values())}/{len(g)} | "
                 f"{fmt([r['steps_to_90'] for r in g.values()], 1, 0, 'se')}"
                 if g else "- | -" for g in table[name].values()]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "## Shared init and the spread of paired differences", "",
              "SD over seeds of the paired difference in steps to 90%, with every variant of a seed starting from "
              "the same blocks (recipe) and with independent inits (independent_init), on the seeds where both "
              "variants learned in both settings.", "", "| comparison | SD, shared init | SD, "
                                                        "independent init | n |",
              "|---|---|---|---|"]
    for a, b in [(a, b) for a, b in COMPARISONS if a in cfg["robust_list"] and b in cfg["robust_list"]]:
        sd = {}
        for name in ("recipe", "independent_init"):
            A, B = table[name][a], table[name][b]
            sd[name] = {s: A[s]["steps_to_90"] - B[s]["steps_to_90"] for s in set(A) & set(B)
                        if min(A[s]["acc"], B[s]["acc"]) >= th}
        seeds = sorted(set(sd["recipe"]) & set(sd["independent_init"]))
        if len(seeds) > 1:
            lines.append(f"| {a} - {b} | " + " | ".join(f"{np.std([sd[k][s] for s in seeds], ddof=1):.0f}"
                                                         for k in ("recipe", "independent_init"))
                         + f" | {len(seeds)} |")
    write_report(os.path.join(cfg["sweep_root"], "robust.md"), lines, "")


def main():
    command, cfg = parse_args(sys.argv[1:])
    # one sweep per root: two would race on its runs and reports
    lock = hold_root(cfg["sweep_root"], "--sweep_root")
    if cfg["threads"]:
        torch.set_num_threads(cfg["threads"])
    {"run": cmd_run, "report": cmd_report, "robust": cmd_robust, "robust-report": cmd_robust_report}[command](cfg)


if __name__ == "__main__":
    main()
