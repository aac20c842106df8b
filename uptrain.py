"""
The conversion comparison at demo scale: from a trained GQA model with 4x the cache, which
smaller-cache model is better after a short warm-up, VHA (convert.py's premix fit) or GQA
uptraining (mean-pooled KV heads), and does the warmed VHA reach a VHA trained from scratch on
the full budget?

    python uptrain.py --jobs=2 --threads=1   # the comparison: teacher 1200 iters, 9 warm-ups x 5
                                             # seeds (120 iters; the three *_long 600), 4 scratch
                                             # baselines x 5 seeds
    python uptrain.py --variants=vha_warm,vha_warm_kd   # only these runs (and the teacher's evals)
    python uptrain.py --quick         # teacher 300 iters, 2 seeds, context 128: a pipeline check
    python uptrain.py --smoke         # a tiny model, 30 teacher iters, 2 seeds: the test's pipeline
    python uptrain.py report          # rebuild report.md and results.json from the finished runs

The pipeline (every run resumes and is skipped once done, experiments.py):
  1. teacher: config/vha_small.py + config/ablations/gqa8.py (GQA 8Q/8KV), teacher_iters iterations
  2. convert.py the teacher to VHA (4 physical -> 8 virtual query heads over 2 KV heads; vha: the
     physical heads are the teacher's group 0, vha_fit: fitted with premix, convert.py
     --physical=fit) and to GQA 8Q/2KV by mean pooling: the same deployed shape, a 4x smaller cache
  3. warm-up each for warmup_frac of the teacher's iterations, with and without distillation, seeds
     seed .. seed+n_seeds-1. From a checkpoint the seed changes only the batches (train.py's rng)
     and the eval batches, so each seed's variants are compared on the same batches (paired). Val
     loss before warm-up is the iteration-0 eval of each warm-up run (before any update: what
     train.py --eval_only=True would print), and the teacher is evaluated on each seed's eval
     batches by an eval-only run (the gap to the teacher is per seed). The distilled warm-ups also
     run for long_warmup_frac (the *_long variants): how much of the gap a longer warm-up closes.
  4. from scratch, the same seeds: VHA (the demo) and same-deploy GQA (config/ablations/gqa2.py), at
     the teacher's budget and at the warm-up budget, the demo's schedule scaled to the budget.

The teacher runs alone with --threads=2 (under --threads=1 it would get one core), the rest
--jobs=2 --threads=1. The results, what they say and how long they took on which CPU:
docs/convert.md, "The comparison". Any knob below can be overridden with --key=value after the
size preset.
"""
import os
import sys
import time

import torch

from nanovha.config import COMMON_LIMITS, at_least
from lab.experiments import hold_root
from lab.experiments import (choose_variants, fmt, fmt_paired, load_results, paired, parse_command, parse_primary,
                                 primary_lines, read_json, run_all, run_script, same_run, t_crit, train, write_json)

# -----------------------------------------------------------------------------
# defaults (overridden by --smoke / --quick, i.e. config/uptrain/<size>.py, then by --key=value)
device = "auto"
jobs = 1  # runs at once
threads = 0  # CPU threads per run (0: torch's default)
# teacher/, converted/{vha,gqa}/, runs/<variant>/seed<N>/, report.md, results.json
out_root = "out-uptrain"
dataset = "shakespeare_char"
data_dir = ""  # any folder with train.bin/val.bin/meta.pkl
teacher_iters = 1200  # the demo's budget
teacher_seed = 1337  # not one of the warm-up seeds
seed = 0  # warm-up and scratch seeds seed .. seed+n_seeds-1
n_seeds = 5
variants = "all"  # or a comma list of VARIANTS: the runs to make (teacher_eval always)
primary = ""  # a plan's comparisons, e.g. "vha_fit_warm_kd-vha_warm_kd": val loss, Holm-corrected over these
warmup_frac = 0.1  # warm-up iters = warmup_frac * teacher_iters ...
freeze_frac = 0.25  # ... the first freeze_frac of them frozen
# the *_long warm-ups (distilled): how far a longer warm-up closes the gap to the scratch VHA
long_warmup_frac = 0.5
distill_alpha = 0.7
distill_temperature = 1.0
# the warm-up schedule, the same for every variant: chosen for the GQA baseline's uptraining (the
# demo's lr / 3, a short linear warmup, cosine to lr / 10) and NOT tuned on VHA (nor on GQA: it is a
# guess, not a sweep)
uptrain_lr = 2e-3 / 3
uptrain_warmup_iters = 10
batch_size = 16
block_size = 256
eval_iters = 20
evals = 4  # evals per run after iteration 0
log_interval = 10
model_args = ""  # extra train.py overrides for the teacher and the scratch runs (warm-ups take the checkpoint's shape)
dtype = ""  # "": config/vha_small.py's auto (fp32 where bf16 would be emulated)
CONVERSIONS = {  # converted/<name>/: convert.py's arguments (besides --src, --out_dir and --n_kv_head=2)
    "vha": ["--to=vha"],  # the physical query heads are the teacher's group 0
    # physical heads and premix fitted together (convert.py)
    "vha_fit": ["--to=vha", "--physical=fit"],
    "gqa": ["--to=gqa"]}
WARM = {  # variant: (converted model, distill, long warm-up?)
    "vha_warm": ("vha", False, False), "vha_warm_kd": ("vha", True, False), "gqa_uptrain": ("gqa", False, False),
    "gqa_uptrain_kd": ("gqa", True, False), "vha_warm_kd_long": ("vha", True, True),
    "gqa_uptrain_kd_long": ("gqa", True, True), "vha_fit_warm": ("vha_fit", False, False),
    "vha_fit_warm_kd": ("vha_fit", True, False), "vha_fit_warm_kd_long": ("vha_fit", True, True)}
# 8Q/2KV both
VHA_FILES, GQA_FILES = ["config/vha_small.py"], ["config/vha_small.py", "config/ablations/gqa2.py"]
SCRATCH = {  # variant: (config files, full budget? else the warm-up's)
    "vha_scratch_full": (VHA_FILES, True), "gqa_scratch_full": (GQA_FILES, True),
    "vha_scratch_short": (VHA_FILES, False), "gqa_scratch_short": (GQA_FILES, False)}
VARIANTS = ("teacher_eval", *WARM, *SCRATCH)
TEACHER_FILES = ["config/vha_small.py", "config/ablations/gqa8.py"]
# (first, second, what is compared, metric): Δ = first - second, per seed
LIMITS = {**{k: at_least(1) for k in ("n_seeds", "teacher_iters", "evals")}, "teacher_seed": COMMON_LIMITS["seed"]}
COMPARISONS = [
    ("vha_scratch_full", "gqa_scratch_full",
     "from scratch, full budget: VHA vs same-deploy GQA (the paper's claim)",
     "val_loss"),
    ("vha_warm", "gqa_uptrain", "before warm-up: VHA converted vs GQA mean-pooled", "val_before"),
    ("vha_warm", "gqa_uptrain", "after warm-up, no distillation: VHA vs GQA uptraining",
     "val_loss"),
    ("vha_warm_kd", "gqa_uptrain_kd", "after warm-up, distillation: VHA vs GQA uptraining",
     "val_loss"),
    ("vha_warm_kd", "vha_warm", "VHA: distillation vs none", "val_loss"),
    ("gqa_uptrain_kd", "gqa_uptrain", "GQA: distillation vs none", "val_loss"),
    ("vha_warm", "vha_scratch_full", "TARGET: VHA warm (short budget) vs VHA scratch (full "
                                     "budget), no distillation",
     "val_loss"),
    ("vha_warm_kd", "vha_scratch_full", "TARGET: VHA warm (short budget) vs VHA scratch (full "
                                        "budget), distillation",
     "val_loss"),
    ("vha_warm", "vha_scratch_short", "same budget: VHA warm vs VHA scratch, no distillation",
     "val_loss"),
    ("vha_warm_kd", "vha_scratch_short", "same budget: VHA warm vs VHA scratch, distillation",
     "val_loss"),
    ("gqa_uptrain", "gqa_scratch_short", "same budget: GQA uptraining vs GQA scratch", "val_loss"),
    ("vha_warm_kd_long", "gqa_uptrain_kd_long",
     "long warm-up, distillation: VHA vs GQA uptraining", "val_loss"),
    ("vha_warm_kd_long", "vha_scratch_full",
     "TARGET, long warm-up: VHA warm vs VHA scratch (full budget), distillation", "val_loss"),
    ("vha_fit_warm_kd", "vha_warm_kd",
     "before warm-up: physical Q heads fitted vs the teacher's group 0",
     "val_before"),
    ("vha_fit_warm", "vha_warm",
     "after warm-up, no distillation: physical Q heads fitted vs group 0", "val_loss"),
    ("vha_fit_warm_kd", "vha_warm_kd",
     "after warm-up, distillation: physical Q heads fitted vs group 0", "val_loss"),
    ("vha_fit_warm_kd_long", "vha_warm_kd_long",
     "long warm-up, distillation: physical Q heads fitted vs group 0",
     "val_loss"),
    ("vha_fit_warm_kd", "gqa_uptrain_kd",
     "after warm-up, distillation: VHA (fitted heads) vs GQA uptraining",
     "val_loss"),
    ("vha_fit_warm_kd_long", "gqa_uptrain_kd_long", "long warm-up, distillation: VHA (fitted "
                                                    "heads) vs GQA uptraining",
     "val_loss"),
]
# -----------------------------------------------------------------------------


def parse_args(argv):
    """[command] [--smoke|--quick|--full] [--key=value ...] -> (command, config with the derived budgets).
    """
    command, cfg = parse_command(argv, ("run", "report"), globals(), LIMITS)
    # the teacher's eval on each seed's batches always runs: every gap to the teacher needs it
    cfg["variant_list"] = ["teacher_eval"] + [v for v in choose_variants(cfg["variants"], VARIANTS)
                                              if v != "teacher_eval"]
    cfg["primary_list"] = parse_primary(cfg["primary"], cfg["variant_list"])
    if not (0 < cfg["warmup_frac"] <= 1 and 0 <= cfg["freeze_frac"] <= 1):
        sys.exit(f"error: warmup_frac={cfg['warmup_frac']} must be in (0, 1] and "
                 f"freeze_frac={cfg['freeze_frac']} "
                 "in [0, 1]")
    if not 0 < cfg["long_warmup_frac"] <= 1:
        sys.exit(f"error: long_warmup_frac={cfg['long_warmup_frac']} must be in (0, 1]")
    cfg["warm_iters"] = max(1, round(cfg["warmup_frac"] * cfg["teacher_iters"]))
    cfg["long_warm_iters"] = max(1, round(cfg["long_warmup_frac"] * cfg["teacher_iters"]))
    # the same share of every warm-up frozen
    cfg["freeze_iters"] = round(cfg["freeze_frac"] * cfg["warm_iters"])
    cfg["long_freeze_iters"] = round(cfg["freeze_frac"] * cfg["long_warm_iters"])
    if cfg["uptrain_warmup_iters"] > (shortest := min(cfg["warm_iters"], cfg["long_warm_iters"])):
        sys.exit(f"error: uptrain_warmup_iters={cfg['uptrain_warmup_iters']} is past a warm-up's {shortest} "
                 "iterations; lower it")
    cfg["root"] = os.path.abspath(cfg["out_root"])
    cfg["teacher_ckpt"] = os.path.join(cfg["root"], "teacher", "ckpt.pt")
    return command, cfg


# ---- train.py argvs ----
def common_args(cfg, iters):
    """What every run shares: data, batch, context, evals (iteration 0, every iters / evals, the
    last), device."""
    data = [f"--dataset={cfg['dataset']}"] + ([f"--data_dir={os.path.abspath(cfg['data_dir'])}"]
                                              if cfg["data_dir"] else [])
    return [*data, f"--batch_size={cfg['batch_size']}", f"--block_size={cfg['block_size']}",
            f"--eval_iters={cfg['eval_iters']}", f"--eval_interval={max(1, iters // cfg['evals'])}",
            f"--log_interval={cfg['log_interval']}", f"--device={cfg['device']}",
            *([f"--dtype={cfg['dtype']}"] if cfg["dtype"] else [])]


def scratch_args(cfg, files, iters, seed, run_dir):
    """A run from scratch: the config files with the demo's schedule scaled to the budget (warmup
    100 of 1200)."""
    return [*files, f"--out_dir={run_dir}", f"--seed={seed}", f"--max_iters={iters}", f"--lr_decay_iters={iters}",
            f"--warmup_iters={max(1, round(iters / 12))}", *common_args(cfg, iters), *cfg["model_args"].split()]


def run_args(cfg, variant, seed, run_dir):
    """train.py's argv for one run of the comparison (the teacher's eval, a warm-up or a scratch
    baseline)."""
    if variant == "teacher_eval":  # the teacher on this seed's eval batches: one eval at iteration 0, nothing written
        return [f"--init_from={cfg['teacher_ckpt']}", f"--out_dir={run_dir}", f"--seed={seed}", "--eval_only=True",
                *common_args(cfg, 1)]
    if variant in SCRATCH:
        files, full = SCRATCH[variant]
        return scratch_args(cfg, files, cfg["teacher_iters"] if full else cfg["warm_iters"], seed, run_dir)
    start, distill, long = WARM[variant]
    W, lr = run_iters(cfg, variant), cfg["uptrain_lr"]
    frozen = cfg["long_freeze_iters"] if long else cfg["freeze_iters"]
    kd = [f"--teacher={cfg['teacher_ckpt']}", f"--distill_alpha={cfg['distill_alpha']}",
          f"--distill_temperature={cfg['distill_temperature']}"] if distill else []
    return [f"--init_from={os.path.join(cfg['root'], 'converted', start, 'ckpt.pt')}", f"--out_dir={run_dir}",
            f"--seed={seed}", f"--max_iters={W}", f"--lr_decay_iters={W}",
            f"--warmup_iters={cfg['uptrain_warmup_iters']}", f"--learning_rate={lr}", f"--min_lr={lr / 10}",
            f"--freeze_iters={frozen}", *kd, *common_args(cfg, W)]


def run_iters(cfg, variant):
    if variant == "teacher_eval":
        return 0
    if variant in WARM:
        return cfg["long_warm_iters"] if WARM[variant][2] else cfg["warm_iters"]
    return cfg["teacher_iters"] if SCRATCH[variant][1] else cfg["warm_iters"]


# ---- the pipeline ----
def train_teacher(cfg):
    run_dir = os.path.dirname(cfg["teacher_ckpt"])
    args = scratch_args(cfg, TEACHER_FILES, cfg["teacher_iters"], cfg["teacher_seed"], run_dir)
    rows, note = train(cfg, run_dir, args, cfg["teacher_iters"])
    evals = [r for r in rows if "val_loss" in r]
    write_json(os.path.join(run_dir, "result.json"), {"args": args, "iters": cfg["teacher_iters"],
                                                      "val_loss": evals[-1]["val_loss"],
                                                      "curve": [[r["tokens"], r["val_loss"]] for r in evals]})
    print(f"teacher (GQA 8Q/8KV, {cfg['teacher_iters']} iters): {note or 'trained, '}val loss "
          f"{evals[-1]['val_loss']:.4f}", flush=True)


def convert_teacher(cfg, name):
    """convert.py the teacher to CONVERSIONS[name] with 2 KV heads, once: skipped when done with
    the same argv."""
    out = os.path.join(cfg["root"], "converted", name)
    args = [f"--src={cfg['teacher_ckpt']}", f"--out_dir={out}", *CONVERSIONS[name], "--n_kv_head=2"]
    record = os.path.join(out, "convert.json")
    if os.path.exists(record) and os.path.exists(os.path.join(out, "ckpt.pt")) and same_run(read_json(record), args):
        print(f"convert to {name}: done before, skipped")
        return
    os.makedirs(out, exist_ok=True)
    run_script(cfg, out, "convert.py", args)
    write_json(record, args)  # written last: a conversion cut short is done again
    print(f"convert to {name}: done (per-layer errors in {out}/convert.out)", flush=True)


def run_path(cfg, variant, seed):
    return os.path.join(cfg["root"], "runs", variant, f"seed{seed}")


def fold_and_export(cfg):
    """fold.py on the first seed's distilled VHA warm-up: the GQA 8Q/2KV it deploys as, exported
    as a Hugging Face folder that fold.py then runs in transformers (logits, greedy text). Cheap,
    so redone every time."""
    out = os.path.join(cfg["root"], "deployed")
    os.makedirs(out, exist_ok=True)
    log = os.path.join(out, "fold.out")
    if os.path.exists(log):
        os.remove(log)
    run_script(cfg, out, "fold.py", [f"--out_dir={run_path(cfg, 'vha_warm_kd', cfg['seed'])}",
                                     f"--export_hf={os.path.join(out, 'hf')}", "--overwrite=True",
                                     f"--gen_tokens={min(200, cfg['block_size'] - 16)}", "--compile_decode=False"])
    print(f"fold and export of vha_warm_kd seed {cfg['seed']}: {out}/hf (fold.py's report: {log})", flush=True)


def run_one(cfg, job):
    """Trains (or resumes, or skips) one run and writes its result.json; returns a status word."""
    variant, seed = job
    run_dir = run_path(cfg, variant, seed)
    result_path = os.path.join(run_dir, "result.json")
    args = run_args(cfg, variant, seed, run_dir)
    if os.path.exists(result_path) and same_run(read_json(result_path)["args"], args):
        return "done before, skipped"
    t0 = time.time()
    rows, note = train(cfg, run_dir, args, run_iters(cfg, variant))
    evals = [r for r in rows if "val_loss" in r]
    iters = run_iters(cfg, variant)
    res = {"variant": variant, "seed": seed, "args": args, "iters": iters,
           "tokens": iters * cfg["batch_size"] * cfg["block_size"], "val_before": evals[0]["val_loss"],
           "val_loss": evals[-1]["val_loss"], "curve": [[r["tokens"], r["val_loss"]] for r in evals],
           "wall_s": time.time() - t0}
    write_json(result_path, res)
    return note + f"val loss {res['val_loss']:.4f}, {res['wall_s']:.0f} s"


def cmd_run(cfg):
    seeds = [cfg["seed"] + i for i in range(cfg["n_seeds"])]
    chosen = cfg["variant_list"]
    jobs = [(v, s) for s in seeds for v in chosen]
    print(f"conversion comparison ({cfg['size']}): teacher {cfg['teacher_iters']} iters, warm-ups "
          f"{cfg['warm_iters']} "
          f"iters ({cfg['freeze_iters']} frozen; *_long: {cfg['long_warm_iters']}, "
          f"{cfg['long_freeze_iters']} frozen), "
          f"{len(chosen)} run kinds x {len(seeds)} seeds; results in {cfg['root']}", flush=True)
    if cfg["size"] != "full":
        print(f"note: --{cfg['size']} is a reduced comparison, a check of the pipeline, not the result")
    train_teacher(cfg)
    for name in CONVERSIONS:
        if any(WARM[v][0] == name for v in chosen if v in WARM):
            convert_teacher(cfg, name)
    run_all(cfg, jobs, lambda job: run_one(cfg, job), lambda job: f"{job[0]} seed {job[1]}")
    if "vha_warm_kd" in chosen:
        fold_and_export(cfg)
    cmd_report(cfg)


# ---- the report ----
def comparisons(R):
    """R: {variant: {seed: result}} -> one dict per comparison with its paired numbers."""
    out = []
    for a, b, what, metric in COMPARISONS:
        if a in R and b in R:
            n, mean, se, t, resolved = paired({s: r[metric] for s, r in R[a].items()},
                                              {s: r[metric] for s, r in R[b].items()})
            out.append(dict(first=a, second=b, what=what, metric=metric, n=n, mean=mean, se=se, t=t,
                            resolved=bool(resolved)))
    return out


def verdict(c):
    if c["n"] < 2:
        return "fewer than 2 shared seeds: not judged"
    sure = "resolved" if c["resolved"] else "not resolved"
    if c["what"].startswith("TARGET"):  # does the warmed VHA reach the full-budget scratch VHA?
        return ((f"misses it by {c['mean']:.4f}" if c["mean"] > 0 else f"reaches it ({-c['mean']:.4f} lower)")
                + f", {sure}")
    return ("first lower" if c["mean"] < 0 else "first higher" if c["mean"] > 0 else "no difference") + f", {sure}"


def variant_lines(R, cfg):
    teacher = {s: r["val_loss"] for s, r in R.get("teacher_eval", {}).items()}
    lines = ["| variant | iters | val loss before warm-up | val loss after "
             "| gap to the teacher (after - teacher) | seeds |",
             "|---|---|---|---|---|---|",
             f"| teacher (GQA 8Q/8KV), on each seed's eval batches | {cfg['teacher_iters']} | - | "
             f"{fmt(list(teacher.values()))} | 0 | {len(teacher)} |"]
    for v in (*WARM, *SCRATCH):
        if v not in R:
            continue
        rs = list(R[v].values())
        gaps = [r["val_loss"] - teacher[s] for s, r in R[v].items() if s in teacher]
        before = fmt([r["val_before"] for r in rs]) if v in WARM else "- (from scratch)"
        lines.append(f"| {v} | {rs[0]['iters']} | {before} | {fmt([r['val_loss'] for r in rs])} | "
                     f"{fmt(gaps)} | {len(rs)} |")
    return lines


def cmd_report(cfg):
    """report.md and results.json in the results root, from the finished runs."""
    rows = load_results(cfg["root"], ("*", "seed*"), lambda r: r["variant"] in VARIANTS)
    if not rows:
        sys.exit(f"error: no finished runs in {cfg['root']}/runs; run python uptrain.py first")
    R = {v: {r["seed"]: r for r in rows if r["variant"] == v} for v in VARIANTS if any(r["variant"] == v for r in rows)}
    comps = comparisons(R)
    teacher_path = os.path.join(cfg["root"], "teacher", "result.json")
    teacher = read_json(teacher_path) if os.path.exists(teacher_path) else None
    write_json(os.path.join(cfg["root"], "results.json"), {"teacher": teacher, "runs": rows, "comparisons": comps,
                                                            "settings": {k: cfg[k] for k in sorted(cfg)}})
    lines = ["# The conversion comparison: VHA warm-up vs GQA uptraining from a GQA 8Q/8KV teacher", "",
             f"Teacher: config/vha_small.py + config/ablations/gqa8.py, {cfg['teacher_iters']} iterations, "
             f"seed {cfg['teacher_seed']}" + (f", val loss {teacher['val_loss']:.4f}" if teacher else "") + ". "
             f"Converted to VHA 4 physical -> 8 virtual / 2 KV heads and to GQA 8Q/2KV "
             f"(mean-pooled), then warmed up "
             f"for {cfg['warm_iters']} iterations ({cfg['freeze_iters']} frozen: attention only; the `_long` ones "
             f"{cfg['long_warm_iters']}, {cfg['long_freeze_iters']} frozen), lr "
             f"{cfg['uptrain_lr']:.3g} "
             f"(chosen for GQA uptraining, not tuned on VHA), with (`_kd`: alpha "
             f"{cfg['distill_alpha']}, T "
             f"{cfg['distill_temperature']}) and without distillation. Scratch baselines: the "
             f"demo's schedule scaled "
             f"to the budget. A seed fixes the batches and the eval batches, so every variant of a seed saw "
             "the same ones."]
    if cfg["size"] != "full":
        lines += ["", f"**Reduced comparison (--{cfg['size']}): a check of the pipeline, too small to conclude "
                      "anything.**"]
    lines += ["", "## Val loss per variant (mean ± SD over seeds)", ""] + variant_lines(R, cfg)
    if cfg["primary_list"]:
        lines += [""] + primary_lines({pair: tuple({s: r["val_loss"] for s, r in R.get(v, {}).items()} for v in pair)
                                       for pair in cfg["primary_list"]}, "val loss")
    lines += ["", "## Paired differences (Δ = first - second, per seed; mean ± SE)"
              + (", exploratory: each test on its own, the primary ones above" if cfg["primary_list"] else ""), "",
              "| comparison | first | second | metric | Δ (mean ± SE, |t|, n) | verdict |",
              "|---|---|---|---|---|---|"]
    lines += [f"| {c['what']} | {c['first']} | {c['second']} | {c['metric']} | "
              f"{fmt_paired(c['n'], c['mean'], c['se'], c['t'], c['resolved'])} | {verdict(c)} |" for c in comps]
    n = cfg["n_seeds"]
    lines += ["", "Resolved: the paired t-test over the shared seeds rejects 'no difference' at 5% (two-sided"
              + (f"; with {n} seeds that needs |Δ| > {t_crit(n - 1)} SE" if n > 1 else "")
              + "). Lower loss is better: a negative Δ means the first is better."]
    fold_log = os.path.join(cfg["root"], "deployed", "fold.out")
    if os.path.exists(fold_log):
        with open(fold_log) as f:
            proof = [line.rstrip() for line in f
                     if line.startswith(("folded", "    ->", "proof on", "  float", "exported", "transformers check"))]
        lines += ["", f"## The deployed model: vha_warm_kd seed {cfg['seed']}, folded and exported (deployed/fold.out)",
                  "", "```", *proof, "```"]
    path = os.path.join(cfg["root"], "report.md")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines[lines.index("## Val loss per variant (mean ± SD over seeds)"):]))
    print(f"wrote {path}, results.json")


def main():
    command, cfg = parse_args(sys.argv[1:])
    lock = hold_root(cfg["root"], "--out_root")  # one command per root: two would race on its runs and reports
    if cfg["threads"]:
        torch.set_num_threads(cfg["threads"])
    {"run": cmd_run, "report": cmd_report}[command](cfg)


if __name__ == "__main__":
    main()
