"""
The paper's ablations in miniature. Every variant gets the same steps, data, LR schedule and seeds; a
seed fixes the init and every batch, so variants are compared seed by seed (paired differences).

    python ablate.py sweep            # recall KV-budget sweep: 8 GQA/VHA variants x 2 points x 10 seeds of token-level MQAR
                                      #   (160 runs of 60-120 s, 2 at a time: 1 h 49 min on the 2-core CPU;
                                      #   --sweep_variants=all adds mla and mfa, 40 runs of the same size)
    python ablate.py sweep --quick    # 4 variants x 2 points x 2 seeds, 600 steps: a pipeline check (6 min)
    python ablate.py                  # LM grid: 11 variants x 3 seeds on shakespeare_char, val loss (~50 min for the first 9)
    python ablate.py --quick          # LM grid, 3 variants x 2 seeds, 200 steps: a pipeline check
    python ablate.py --size=gpu       # one GPU: GQA-8, same-deploy GQA and VHA at 120M on FineWeb-Edu, 2 seeds (~9 h, H100)
    python ablate.py report           # rebuild the LM grid's tables and plot from its finished runs
    python ablate.py sweep-report     # the same for the sweep

Any knob below can be overridden with --key=value after the size preset (--smoke, --quick, --full).
Runs resume: a run whose result.json exists is skipped, a half-trained one continues from its ckpt.pt.
"""
import csv
import glob
import hashlib
import json
import math
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from configurator import ConfigError, configure, resolve_device
from data.recall import tasks
from checkpoint import load_checkpoint, model_from_checkpoint
from model import GPT

ROOT = os.path.dirname(os.path.abspath(__file__))
# -----------------------------------------------------------------------------
DEFAULTS = dict(
    device="auto", seed=1337, jobs=1, threads=0,  # jobs: runs at once; threads: CPU threads per run (0: torch's default)
    # LM grid: runs/<variant>/seed<N>/ + results.json, results.csv, report.md, ablate.png
    out_root="out-ablate", variants="all", n_seeds=3,  # seeds seed, seed+1, ...: each gives every variant the same batches
    lm_iters=500, batch_size=16, block_size=256, gradient_accumulation_steps=1, warmup_iters=50, eval_interval=125,
    eval_iters=20, log_interval=10,
    config_dir="",  # "": config/vha_small.py + config/ablations/<variant>.py; else <config_dir>/<variant>.py alone
    model_args="",  # extra train.py overrides for every variant, e.g. "--n_layer=2 --n_embd=32"
    lm_dataset="shakespeare_char", lm_data_dir="",  # lm_data_dir: any folder with train.bin/val.bin/meta.pkl
    dtype="",  # "": keep config/vha_small.py's (auto: bf16 where native, else fp32)
    # recall sweep: runs/<point>/<variant>/seed<N>/ + sweep.json, sweep.csv, sweep.md, sweep.png
    sweep_root="out-sweep", sweep_seeds=10, task="mqar",
    sweep_variants="mha,gqa4,gqa2,gqa2_half_q,mqa,vha,premix_only,postmix_only",  # "all" adds mla and mfa
    task_args="",  # task knobs for every point, e.g. "n_pairs=16,gap=0" (data/recall/tasks.py DEFAULTS)
    points="n_keys=64,n_values=64;n_keys=128,n_values=128",  # ';' between points; a point may also set n_head, head_dim
    sweep_iters=1000, curriculum_iters=500, sweep_batch_size=32, sweep_eval_interval=50, n_val=256,
    sweep_model_args="",  # extra train.py overrides for every sweep run
    success=0.9,  # a run "succeeds" when its final held-out accuracy reaches this
)
SIZES = {  # presets; the same budget for every variant
    "smoke": dict(out_root="out-ablate-smoke", variants="vha", n_seeds=1, lm_iters=4, batch_size=4, block_size=64,
                  warmup_iters=1, eval_interval=2, eval_iters=1, log_interval=1, model_args="--n_layer=1 --n_embd=32",
                  device="cpu", dtype="float32", threads=1,
                  sweep_root="out-sweep-smoke", sweep_variants="gqa2,vha", sweep_seeds=2, points="n_keys=16,n_values=16",
                  task_args="n_pairs=4", sweep_iters=6, curriculum_iters=3, sweep_batch_size=8, sweep_eval_interval=3,
                  n_val=16, sweep_model_args="--n_layer=1 --n_embd=16 --warmup_iters=1"),
    "quick": dict(out_root="out-ablate-quick", variants="gqa_4x_cache,gqa_same_deploy,vha", n_seeds=2, lm_iters=200,
                  block_size=128, warmup_iters=20, eval_interval=50, eval_iters=10,
                  sweep_root="out-sweep-quick", sweep_variants="mha,gqa2,mqa,vha", sweep_seeds=2,
                  points="n_keys=64,n_values=64;n_keys=128,n_values=128", sweep_iters=600, curriculum_iters=300,
                  jobs=2, threads=1),
    "full": {},
    # one GPU: config/fineweb's 120M twins, 2.52B tokens each; at an assumed 40% MFU on one H100 about 1.4-1.5 h
    # per run (the arithmetic is in config/fineweb/vha.py), so 3 variants x 2 seeds is about 9 h
    "gpu": dict(out_root="out-ablate-gpu", variants="gqa_4x_cache,gqa_same_deploy,vha", config_dir="config/fineweb",
                lm_dataset="fineweb_edu", n_seeds=2, lm_iters=4800, batch_size=32, block_size=1024, gradient_accumulation_steps=16,
                warmup_iters=200, eval_interval=250, eval_iters=50, log_interval=10),
}
VARIANTS = ("gqa_4x_cache", "gqa_same_deploy", "gqa_half_q", "vha", "premix_only", "postmix_only",
            "silu_postmix", "rank4", "rank8", "mla", "mfa")  # "vha" is config/vha_small.py alone; the rest add config/ablations/<name>.py
# The paper's table (VHA.md: 1.7B, 50B tokens, 8-task zero-shot average). Our rank 4/8 stand in for its 32/128.
PAPER = {"gqa_4x_cache": ("GQA 16Q/8KV (4x cache)", 54.09), "gqa_same_deploy": ("GQA 16Q/2KV (same deploy)", 53.09),
         "gqa_half_q": ("GQA 8Q/2KV (same projections)", 52.38), "vha": ("VHA (premix + postmix)", 54.50),
         "premix_only": ("premix only", 53.31), "postmix_only": ("postmix only", 53.95),
         "silu_postmix": ("SiLU postmix (lower, no number)", None), "rank4": ("postmix rank 32", 54.24),
         "rank8": ("postmix rank 128", 54.15), "mfa": ("MFA (1 KB cache)", 54.06),
         "mla": ("MLA (1 KB cache; lower than VHA on the paper's 30B MoE, no 1.7B number)", None)}
COMPARISONS = [("vha", "gqa_same_deploy"), ("vha", "gqa_4x_cache"), ("vha", "gqa_half_q"), ("gqa_4x_cache", "gqa_same_deploy"),
               ("gqa_same_deploy", "gqa_half_q"), ("premix_only", "gqa_same_deploy"), ("postmix_only", "gqa_same_deploy"),
               ("vha", "premix_only"), ("vha", "postmix_only"), ("vha", "rank4"), ("vha", "rank8"), ("vha", "silu_postmix"),
               ("vha", "mfa"), ("vha", "mla")]
PAPER_SAYS_BETTER = {("vha", "silu_postmix"): 1, ("vha", "mla"): 1}  # directions without a 1.7B number
# The sweep's variants: train.py overrides on config/recall_mqar.py, for H query heads of dim d (8 and 8 unless a point
# sets n_head / head_dim). mla and mfa get GQA-2's cache: 2 x 2 x d values per layer per token.
SWEEP_VARIANTS = {
    "mha": lambda H, d: dict(attn="gqa", n_kv_head=H),
    "gqa4": lambda H, d: dict(attn="gqa", n_kv_head=4),
    "gqa2": lambda H, d: dict(attn="gqa", n_kv_head=2),  # the same deployed model as a folded VHA
    "gqa2_half_q": lambda H, d: dict(attn="gqa", n_head=H // 2, n_kv_head=2),  # VHA's physical q projections, attending directly
    "mqa": lambda H, d: dict(attn="gqa", n_kv_head=1),
    "vha": lambda H, d: dict(attn="vha", n_kv_head=2),  # H/2 physical -> H virtual query heads
    "premix_only": lambda H, d: dict(attn="vha", n_kv_head=2, vha_postmix=False),
    "postmix_only": lambda H, d: dict(attn="vha", n_kv_head=2, vha_premix=False),
    "mla": lambda H, d: dict(attn="mla", n_kv_head=H, qk_norm=False, mla_rope_dim=d // 2, mla_kv_rank=4 * d - d // 2),  # latent + RoPE key
    "mfa": lambda H, d: dict(attn="mfa", n_kv_head=1, head_dim=2 * d, q_rank=32),  # one KV head of dim 2d, query rank n_embd / 2
}
SWEEP_COMPARISONS = [("mha", "mqa"), ("mha", "gqa2"), ("gqa4", "gqa2"), ("mha", "gqa4"), ("gqa2", "mqa"), ("vha", "gqa2"),
                     ("vha", "gqa4"), ("vha", "mha"), ("vha", "gqa2_half_q"), ("premix_only", "gqa2"), ("postmix_only", "gqa2"),
                     ("vha", "premix_only"), ("vha", "postmix_only"), ("vha", "mla"), ("vha", "mfa"), ("mla", "gqa2"), ("mfa", "gqa2"), ("mla", "mha"), ("mfa", "mha"), ("mla", "mfa")]
MODEL_KNOBS = ("n_head", "head_dim", "n_embd", "n_layer")  # what a sweep point may set besides task knobs
# two-sided 5% critical values of Student's t for df = 1..30 (beyond 30 the df=30 value: slightly conservative)
T_CRIT = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
          2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
# -----------------------------------------------------------------------------


def parse_args(argv):
    """[command] [--smoke|--quick|--full|--size=NAME] [--key=value ...] -> (command, config)."""
    argv = list(argv)
    command = argv.pop(0) if argv and not argv[0].startswith("--") else "run"
    if command not in ("run", "report", "sweep", "sweep-report"):
        sys.exit(f"error: unknown command {command!r}: use run (default), report, sweep or sweep-report")
    size, rest = "full", []
    for a in argv:
        if a in ("--smoke", "--quick", "--full") or a.startswith("--size="):
            size = a.split("=", 1)[1] if "=" in a else a[2:]
        else:
            rest.append(a)
    if size not in SIZES:
        sys.exit(f"error: unknown size {size!r}: use smoke, quick, full or gpu")
    sweep = command.startswith("sweep")
    try:  # the sweep's runs are tiny: two at a time on one thread each use 2 cores best
        cfg = configure({**DEFAULTS, **({"jobs": 2, "threads": 1} if sweep else {}), **SIZES[size]}, rest)
        cfg["device"] = resolve_device(cfg["device"])
    except ConfigError as e:
        sys.exit(f"error: {e}")
    cfg["size"] = size
    known = SWEEP_VARIANTS if sweep else VARIANTS
    chosen = cfg["sweep_variants" if sweep else "variants"]
    names = list(known) if chosen == "all" else [v.strip() for v in chosen.split(",")]
    unknown = [v for v in names if v not in known]
    if unknown:
        sys.exit(f"error: unknown variant(s) {', '.join(unknown)}; known: {', '.join(known)}")
    if min(cfg["n_seeds"], cfg["sweep_seeds"], cfg["jobs"], cfg["n_val"]) < 1:
        sys.exit("error: n_seeds, sweep_seeds, jobs and n_val must be >= 1")
    cfg["variant_list"] = [v for v in known if v in names]
    if sweep:
        cfg["point_list"] = parse_points(cfg)
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
    """The sweep points: [(name, task spec, train.py model overrides)], each checked now, not an hour in."""
    base, points = knobs(cfg["task_args"], "task_args"), []
    for text in filter(None, (p.strip() for p in cfg["points"].split(";"))):
        point = knobs(text, "points")
        model = {k: v for k, v in point.items() if k in MODEL_KNOBS}
        try:
            spec = tasks.make_spec(cfg["task"], **base, **{k: v for k, v in point.items() if k not in MODEL_KNOBS})
        except ValueError as e:
            sys.exit(f"error: sweep point {text!r}: {e} (a point may also set {', '.join(MODEL_KNOBS)})")
        points.append((text.replace(" ", ""), spec, model))
    if not points:
        sys.exit("error: points is empty: give at least one, e.g. --points='n_keys=128,n_values=128'")
    return points


# ---- one training run (shared by the LM grid and the sweep) ----
def read_json(path):
    with open(path) as f:
        return json.load(f)


def write_json(path, obj):
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(path + ".tmp", path)  # a crash never leaves half a result (which would count as done)


def same_run(a, b):
    """Two train.py argvs that train the same run, wherever its results folder lives: --out_dir and --data_dir
    are compared by their last names, so a results root that was moved or copied keeps its finished runs."""
    where = lambda args: [x.split("=", 1)[0] + "=" + os.path.basename(x) if x.startswith(("--out_dir=", "--data_dir=")) else x
                          for x in args]
    return where(a) == where(b)


def train(cfg, run_dir, args, iters):
    """Trains, resumes or reuses the train.py run in run_dir; returns (its log rows, a status note)."""
    args_path, ckpt_path = os.path.join(run_dir, "args.json"), os.path.join(run_dir, "ckpt.pt")
    recorded = read_json(args_path) if os.path.exists(args_path) else args
    if not same_run(recorded, args):  # results of other settings must never be mixed into one table
        sys.exit(f"error: {run_dir} was started with other settings ({' '.join(recorded)}); use another out_root")
    os.makedirs(run_dir, exist_ok=True)
    write_json(args_path, args)
    trained, resume, note = False, [], ""
    if os.path.exists(ckpt_path):
        try:
            step = load_checkpoint(ckpt_path)["iter_num"]
            trained, resume = step >= iters, [] if step >= iters else ["--init_from=resume"]  # train.py continues exactly
            note = "trained before, " if trained else f"resumed at step {step}, "
        except ValueError:  # a corrupt checkpoint: start this run again from scratch
            os.remove(ckpt_path)
    if not trained:
        with open(os.path.join(run_dir, "train.out"), "a") as f:
            env = dict(os.environ, **({"OMP_NUM_THREADS": str(cfg["threads"])} if cfg["threads"] else {}))
            rc = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), *args, *resume], cwd=ROOT, env=env,
                                stdout=f, stderr=subprocess.STDOUT).returncode
        if rc != 0:
            with open(os.path.join(run_dir, "train.out")) as f:
                tail = f.read().strip().splitlines()[-1:] or [""]
            sys.exit(f"error: the run in {run_dir} failed (exit {rc}): {tail[0]} (full output: {run_dir}/train.out)")
    with open(os.path.join(run_dir, "log.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()], note


def run_all(cfg, jobs, one, label):
    """Runs one(job) for every job, cfg['jobs'] at a time, printing label(job), its status and the time left."""
    t0, done = time.time(), [0, 0]  # finished, of which trained now (for the time estimate)

    def go(job):
        status = one(job)
        done[0] += 1
        done[1] += "done before" not in status
        left = (time.time() - t0) / max(done[1], 1) * (len(jobs) - done[0])  # runs finish at the parallel rate
        print(f"[{done[0]}/{len(jobs)}] {label(job)}: {status}"
              + (f" (about {left / 60:.0f} min left)" if done[1] and done[0] < len(jobs) else ""), flush=True)

    with ThreadPoolExecutor(cfg["jobs"]) as pool:
        for f in [pool.submit(go, job) for job in jobs]:
            f.result()  # re-raises a failed run's SystemExit here


# ---- statistics: paired over shared seeds ----
def paired(a, b):
    """a, b: {seed: value}. Differences a - b over the seeds both have -> (n, mean, SE, |t|, resolved):
    resolved = the paired t-test rejects 'no difference' at 5% (two-sided), which needs n >= 2; with zero
    spread (every seed the same difference), the exact sign test at 5% instead."""
    d = np.array([a[s] - b[s] for s in sorted(set(a) & set(b))], dtype=float)
    n = len(d)
    if n < 2:
        return n, float(d.mean()) if n else math.nan, math.nan, math.nan, False
    mean, se = float(d.mean()), float(d.std(ddof=1) / math.sqrt(n))
    if se == 0:  # every seed gave the same difference: no spread to test against, so an exact sign test decides
        return n, mean, se, (math.inf if mean else 0.0), mean != 0 and 2 * 0.5 ** n < 0.05  # all n same sign: needs n >= 6
    t = abs(mean) / se
    return n, mean, se, t, t > T_CRIT[min(n - 1, len(T_CRIT)) - 1]


def mcnemar(a, b):
    """Exact McNemar test of success rates, a, b: {seed: bool}. -> (seeds only a succeeded, only b, two-sided p):
    a sign test on the discordant seeds, since concordant seeds say nothing about which is better."""
    seeds = sorted(set(a) & set(b))
    only_a, only_b = sum(a[s] and not b[s] for s in seeds), sum(b[s] and not a[s] for s in seeds)
    n = only_a + only_b
    p = min(1.0, 2 * sum(math.comb(n, k) for k in range(min(only_a, only_b) + 1)) / 2 ** n) if n else 1.0
    return only_a, only_b, p


def fmt(values, scale=1.0, digits=4, spread="std"):
    """'mean ± std' (or ± SE) over seeds, 'mean' for one seed, '-' for none."""
    if not values:
        return "-"
    s = np.std(values, ddof=1) / (math.sqrt(len(values)) if spread == "se" else 1) if len(values) > 1 else None
    return f"{np.mean(values) * scale:.{digits}f}" + (f" ± {s * scale:.{digits}f}" if s is not None else "")


def fmt_paired(n, mean, se, t, resolved, scale=1.0, digits=4):
    if n < 2:
        return f"{mean * scale:+.{digits}f} (n={n}: not judged)" if n else "no shared seeds"
    return f"{mean * scale:+.{digits}f} ± {se * scale:.{digits}f} ({t:.1f} SE, n={n})"


# ---- the LM grid ----
def lm_args(cfg, variant, seed, run_dir):
    """train.py's argv for one LM run: config files, then the same budget overrides for every variant."""
    if cfg["config_dir"]:
        files = [os.path.join(cfg["config_dir"], f"{variant}.py")]
    else:
        files = ["config/vha_small.py"] + ([] if variant == "vha" else [f"config/ablations/{variant}.py"])
    data = [f"--dataset={cfg['lm_dataset']}"] + ([f"--data_dir={os.path.abspath(cfg['lm_data_dir'])}"] if cfg["lm_data_dir"] else [])
    return [*files, f"--out_dir={run_dir}", f"--seed={seed}", f"--max_iters={cfg['lm_iters']}", f"--lr_decay_iters={cfg['lm_iters']}",
            f"--warmup_iters={cfg['warmup_iters']}", f"--eval_interval={cfg['eval_interval']}", f"--eval_iters={cfg['eval_iters']}",
            f"--log_interval={cfg['log_interval']}", f"--batch_size={cfg['batch_size']}", f"--block_size={cfg['block_size']}",
            f"--gradient_accumulation_steps={cfg['gradient_accumulation_steps']}", f"--device={cfg['device']}",
            *([f"--dtype={cfg['dtype']}"] if cfg["dtype"] else []), *data, *cfg["model_args"].split()]


def tokens_per_run(cfg):
    return cfg["lm_iters"] * cfg["gradient_accumulation_steps"] * cfg["batch_size"] * cfg["block_size"]


def run_lm(cfg, job):
    """Trains (or resumes) one LM run, writes its result.json; returns a status word."""
    variant, seed = job
    run_dir = os.path.abspath(os.path.join(cfg["out_root"], "runs", variant, f"seed{seed}"))
    result_path = os.path.join(run_dir, "result.json")
    args = lm_args(cfg, variant, seed, run_dir)
    if os.path.exists(result_path) and same_run(read_json(result_path)["args"], args):
        return "done before, skipped"
    t0 = time.time()
    rows, note = train(cfg, run_dir, args, cfg["lm_iters"])
    evals = [r for r in rows if "val_loss" in r]
    speed = [r["tok_per_s"] for r in rows if "tok_per_s" in r][1:] or [r["tok_per_s"] for r in rows if "tok_per_s" in r]
    model = model_from_checkpoint(load_checkpoint(os.path.join(run_dir, "ckpt.pt")))
    res = {"variant": variant, "seed": seed, "args": args, "iters": cfg["lm_iters"], "block_size": cfg["block_size"],
           "tokens": tokens_per_run(cfg), "val_loss": evals[-1]["val_loss"],
           "train_loss": evals[-1]["train_loss"], "curve": [[r["tokens"], r["val_loss"]] for r in evals],
           "params": model.num_params(), "flops_per_token": model.flops_per_token(cfg["block_size"], training=True),
           "kv_bytes_per_token": model.kv_bytes_per_token(torch.bfloat16),
           "tok_per_s": float(np.mean(speed)) if speed else None, "train_s": rows[-1]["time"], "wall_s": time.time() - t0}
    write_json(result_path, res)
    return note + f"val loss {res['val_loss']:.4f}, {res['wall_s']:.0f} s"


def cmd_run(cfg):
    seeds = [cfg["seed"] + i for i in range(cfg["n_seeds"])]
    jobs = [(v, s) for s in seeds for v in cfg["variant_list"]]
    print(f"LM grid ({cfg['size']}): {len(cfg['variant_list'])} variants x {len(seeds)} seeds = {len(jobs)} runs of "
          f"{tokens_per_run(cfg):,} tokens; results in {cfg['out_root']}")
    if cfg["size"] != "full":
        print(f"note: --{cfg['size']} is a reduced grid, a check of the pipeline, not the reproduction")
    run_all(cfg, jobs, lambda job: run_lm(cfg, job), lambda job: f"{job[0]} seed {job[1]}")
    cmd_report(cfg)


def load_results(root, pattern, keep):
    return [r for r in map(read_json, sorted(glob.glob(os.path.join(root, "runs", *pattern, "result.json")))) if keep(r)]


def comparison_lines(M):
    """The paper's comparisons as table rows plus a tally, judged by paired differences over shared seeds."""
    lines = ["| comparison | paper Δ (points) | Δ val loss, paired (mean ± SE) | verdict |", "|---|---|---|---|"]
    tally = []
    for a, b in COMPARISONS:
        if a not in M or b not in M:
            continue
        pa, pb = PAPER[a][1], PAPER[b][1]
        paper_dir = PAPER_SAYS_BETTER.get((a, b)) or int(np.sign(pa - pb))
        paper_txt = f"{pa - pb:+.2f}" if pa is not None and pb is not None else ("first better" if paper_dir > 0 else "second better")
        n, mean, se, t, resolved = stat = paired(M[a], M[b])
        if n < 2:
            verdict = "fewer than 2 shared seeds: not judged"
        elif mean == 0:
            verdict = "no difference"
        else:  # lower loss is better: a negative Δ means the first is better
            verdict = ("agrees" if -np.sign(mean) == paper_dir else "opposite") + (", resolved" if resolved else ", not resolved")
        tally.append(verdict)
        lines.append(f"| {a} vs {b} | {paper_txt} | {fmt_paired(*stat)} | {verdict} |")
    count = lambda s: sum(v.endswith(s) for v in tally)
    lines += ["", f"- Of {len(tally)} comparisons, {sum(v == 'agrees, resolved' for v in tally)} agree with the paper and are "
              f"resolved, {sum(v == 'opposite, resolved' for v in tally)} go the opposite way and are resolved, "
              f"{count('not resolved')} are not resolved" + (f", {len(tally) - count('resolved')} not judged" if len(tally) > count("resolved") else "") + ".",
              "- Resolved: the paired t-test over the shared seeds rejects 'no difference' at 5% (two-sided; with 3 seeds "
              "that needs |Δ| > 4.3 SE). Among 12 comparisons, about one in 20 passes by chance."]
    return lines


def cmd_report(cfg):
    """results.json/csv, report.md (our table beside the paper's, its comparisons judged) and ablate.png."""
    rows = load_results(cfg["out_root"], ("*", "seed*"), lambda r: r["variant"] in cfg["variant_list"])
    if not rows:
        sys.exit(f"error: no finished runs in {cfg['out_root']}/runs for {', '.join(cfg['variant_list'])}; run python ablate.py first")
    groups = {v: [r for r in rows if r["variant"] == v] for v in VARIANTS if any(r["variant"] == v for r in rows)}
    write_json(os.path.join(cfg["out_root"], "results.json"), rows)
    cols = ["variant", "seed", "val_loss", "train_loss", "params", "flops_per_token", "kv_bytes_per_token", "tok_per_s", "wall_s"]
    with open(os.path.join(cfg["out_root"], "results.csv"), "w", newline="") as f:
        csv.writer(f).writerows([cols] + [[r[c] for c in cols] for r in rows])
    M = {v: {r["seed"]: r["val_loss"] for r in g} for v, g in groups.items()}
    r0 = rows[0]
    lines = ["# VHA ablations in miniature: the LM grid", "",
             f"{len(groups)} variants; seeds: " + ", ".join(f"{v} {len(g)}" for v, g in groups.items())
             + f". Each run: {r0['iters']} steps, {r0['tokens']:,} tokens of {cfg['lm_dataset']}, context {r0['block_size']}. Every "
             "variant: config/vha_small.py + its config/ablations file, the same steps, tokens, LR schedule and seeds (hence the "
             f"same batches){'; model overrides: ' + cfg['model_args'] if cfg['model_args'] else ''}."]
    if cfg["size"] != "full":
        lines += ["", f"**Reduced grid (--{cfg['size']}): a check of the pipeline, too small to reproduce anything.**"]
    lines += ["", "## Results (mean ± std over seeds)", "",
              "| variant | paper: 1.7B 8-task avg | val loss ↓ | params | train FLOPs/token | KV B/token (bf16) | tok/s | wall s |",
              "|---|---|---|---|---|---|---|---|"]
    for v, g in groups.items():
        label, score = PAPER[v]
        lines.append(f"| {v} | {label}: {'-' if score is None else f'{score:.2f}'} | {fmt([r['val_loss'] for r in g])} | "
                     f"{g[0]['params']:,} | {g[0]['flops_per_token'] / 1e6:.2f}M | {g[0]['kv_bytes_per_token']} | "
                     f"{fmt([r['tok_per_s'] for r in g if r['tok_per_s']], 1, 0)} | {fmt([r['wall_s'] for r in g], 1, 0)} |")
    lines += ["", "## The paper's comparisons, checked on our numbers", "",
              "The paper's metric is a downstream average; ours is val loss, so only the direction is compared. "
              "Δ = first minus second, per seed (both saw the same batches), then mean ± SE over the seeds.", ""]
    lines += comparison_lines(M)
    png = plot_lm(groups, cfg)
    if png:
        lines += ["", f"![LM grid]({os.path.basename(png)})"]
    path = os.path.join(cfg["out_root"], "report.md")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines[lines.index("## Results (mean ± std over seeds)"):]))
    print(f"wrote {path}, results.json, results.csv" + (f", {os.path.basename(png)}" if png else ""))


def pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        return plt
    except ImportError:
        print("matplotlib is not installed: no plot (pip install matplotlib)")
        return None


def plot_lm(groups, cfg):
    """Val loss curves, mean over seeds, from the first eval after step 0 (step 0 dwarfs the rest)."""
    plt = pyplot()
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, (v, g) in enumerate(groups.items()):
        curves = [r["curve"][1:] for r in g]
        n = min(map(len, curves))
        if n:
            ax.plot([c[0] for c in curves[0][:n]], np.mean([[c[1] for c in cv[:n]] for cv in curves], 0), color=f"C{i}", label=v)
    ax.set(xlabel="training tokens", ylabel=f"val loss ({cfg['lm_dataset']})", title="LM val loss (mean over seeds)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = os.path.join(cfg["out_root"], "ablate.png")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# ---- the recall KV-budget sweep ----
def prepare_point(cfg, spec):
    """The point's dataset folder (meta.pkl + held-out val.npz), named by the spec and by the generator's own
    hash, so an edited task never reuses stale rows."""
    with open(tasks.__file__, "rb") as f:
        version = hashlib.sha256(f.read()).hexdigest()[:8]
    name = "_".join(f"{k}{v}" for k, v in spec.items() if k != "task")
    folder = os.path.abspath(os.path.join(cfg["sweep_root"], "data", f"{spec['task']}_{name}_val{cfg['n_val']}_{version}"))
    if not os.path.exists(os.path.join(folder, "meta.pkl")):
        cmd = [sys.executable, os.path.join(ROOT, "data", "recall", "prepare.py"), "--out_dir", folder, "--task", spec["task"],
               "--n_val", str(cfg["n_val"]), *[f"--{k}={v}" for k, v in spec.items() if k != "task"]]
        if subprocess.run(cmd, stdout=subprocess.DEVNULL).returncode != 0:
            sys.exit(1)  # prepare.py printed the error
    return folder


def sweep_args(cfg, point, variant, seed, run_dir, data_dir):
    """train.py's argv for one sweep run: the base config, the same budget for every variant, then the
    variant's attention and the point's model knobs."""
    _, spec, model = point
    arch = dict(SWEEP_VARIANTS[variant](model.get("n_head", 8), model.get("head_dim", 8)))
    overrides = {**model, **arch, "n_head": arch.get("n_head", model.get("n_head", 8))}
    iters = cfg["sweep_iters"]
    return ["config/recall_mqar.py", f"--data_dir={data_dir}", f"--out_dir={run_dir}", f"--seed={seed}", f"--max_iters={iters}",
            f"--lr_decay_iters={iters}", f"--curriculum_iters={cfg['curriculum_iters']}", f"--batch_size={cfg['sweep_batch_size']}",
            f"--block_size={tasks.row_length(spec)}", f"--eval_interval={cfg['sweep_eval_interval']}", f"--log_interval={iters}",
            f"--device={cfg['device']}", *[f"--{k}={v}" for k, v in overrides.items()], *cfg["sweep_model_args"].split()]


@torch.no_grad()
def row_accuracy(model, data_dir, device):
    """(answer-token accuracy, argmax predictions) of a model on a row dataset's held-out rows."""
    with np.load(os.path.join(data_dir, "val.npz")) as f:
        x, y = torch.from_numpy(f["x"].astype(np.int64)), f["y"]
    pred = torch.cat([model.to(device).eval()(x[i:i + 256].to(device))[0].argmax(-1).cpu() for i in range(0, len(x), 256)]).numpy()
    return tasks.score(pred, y)[0], pred


def run_sweep_one(cfg, job):
    """One (point, variant, seed) run: trains it, reads its accuracy curve, and for a foldable VHA scores the
    folded GQA model too. Writes result.json; returns a status word."""
    point, variant, seed, data_dir = job
    run_dir = os.path.abspath(os.path.join(cfg["sweep_root"], "runs", point[0], variant, f"seed{seed}"))
    result_path = os.path.join(run_dir, "result.json")
    args = sweep_args(cfg, point, variant, seed, run_dir, data_dir)
    if os.path.exists(result_path) and same_run(read_json(result_path)["args"], args):
        return "done before, skipped"
    t0 = time.time()
    rows, note = train(cfg, run_dir, args, cfg["sweep_iters"])
    curve = [[r["iter"], r["val_acc"]] for r in rows if "val_acc" in r]
    reached = lambda th: next((it for it, acc in curve if acc >= th), None)
    model = model_from_checkpoint(load_checkpoint(os.path.join(run_dir, "ckpt.pt")))
    res = {"point": point[0], "variant": variant, "seed": seed, "args": args, "spec": point[1], "iters": cfg["sweep_iters"],
           "acc": curve[-1][1], "exact": [r["val_exact"] for r in rows if "val_exact" in r][-1], "curve": curve,
           "steps_to_50": reached(0.5), "steps_to_90": reached(0.9), "params": model.num_params(),
           "kv_bytes_per_token": model.kv_bytes_per_token(torch.bfloat16), "train_s": rows[-1]["time"]}
    if model.cfg.attn == "vha" and model.cfg.vha_postmix_act == "linear":  # deployed form: plain GQA, scored the same way
        acc, pred = row_accuracy(model, data_dir, "cpu")
        gqa_cfg, state = model.fold_to_gqa()
        folded = GPT(gqa_cfg)
        folded.load_state_dict(state)
        res["acc_unfolded"], (res["acc_folded"], pred_folded) = acc, row_accuracy(folded, data_dir, "cpu")
        res["fold_same_predictions"] = bool((pred == pred_folded).all())
    res["wall_s"] = time.time() - t0
    write_json(result_path, res)
    return note + f"acc {res['acc']:.1%}, {res['wall_s']:.0f} s"


def cmd_sweep(cfg):
    seeds = [cfg["seed"] + i for i in range(cfg["sweep_seeds"])]
    points = cfg["point_list"]
    folders = {p[0]: prepare_point(cfg, p[1]) for p in points}
    jobs = [(p, v, s, folders[p[0]]) for s in seeds for p in points for v in cfg["variant_list"]]  # seed-major: every
    # point has the same seeds finished at any time
    print(f"recall sweep ({cfg['size']}): {len(points)} points x {len(cfg['variant_list'])} variants x {len(seeds)} seeds = "
          f"{len(jobs)} runs of {cfg['sweep_iters']} steps x {cfg['sweep_batch_size']} rows, {cfg['jobs']} at a time; results in {cfg['sweep_root']}")
    run_all(cfg, jobs, lambda job: run_sweep_one(cfg, job), lambda job: f"{job[0][0]} {job[1]} seed {job[2]}")
    cmd_sweep_report(cfg)


def cmd_sweep_report(cfg):
    """sweep.json/csv, sweep.md (per point: accuracy, success rate, steps; paired comparisons) and sweep.png."""
    names = [p[0] for p in cfg["point_list"]]
    rows = load_results(cfg["sweep_root"], ("*", "*", "seed*"), lambda r: r["variant"] in cfg["variant_list"] and r["point"] in names)
    if not rows:
        sys.exit(f"error: no finished sweep runs in {cfg['sweep_root']}/runs for these points and variants; run python ablate.py sweep first")
    write_json(os.path.join(cfg["sweep_root"], "sweep.json"), rows)
    cols = ["point", "variant", "seed", "acc", "exact", "steps_to_50", "steps_to_90", "params", "kv_bytes_per_token", "train_s"]
    with open(os.path.join(cfg["sweep_root"], "sweep.csv"), "w", newline="") as f:
        csv.writer(f).writerows([cols] + [[r[c] for c in cols] for r in rows])
    at = lambda p, v: [r for r in rows if r["point"] == p and r["variant"] == v]
    variants = [v for v in cfg["variant_list"] if any(r["variant"] == v for r in rows)]
    points = [p for p in names if any(r["point"] == p for r in rows)]
    iters, th = rows[0]["iters"], cfg["success"]
    steps = lambda r, k: r[k] if r[k] is not None else iters  # never reached: counted as the whole budget (a lower bound)
    lines = ["# Recall KV-budget sweep", "",
             f"Task {rows[0]['spec']['task']}; every run: {iters} steps x {cfg['sweep_batch_size']} rows, curriculum over the first "
             f"{cfg['curriculum_iters']}, config/recall_mqar.py plus the variant's heads; the same seeds (init and batches) for every variant. "
             f"Accuracy: answer tokens right on {cfg['n_val']} held-out rows at full difficulty. Success: final accuracy >= {th:.0%}. "
             f"Steps to X%: the first eval (every {cfg['sweep_eval_interval']} steps) at X% or more; a run that never got there counts "
             f"as {iters} (so means of steps are lower bounds where some runs fail).", ""]
    for p in points:
        lines += [f"## Point {p}", "", "| variant | KV B/token (bf16) | params | accuracy % (mean ± SE) | success | steps to 50% | steps to 90% |",
                  "|---|---|---|---|---|---|---|"]
        for v in variants:
            g = at(p, v)
            if g:
                lines.append(f"| {v} | {g[0]['kv_bytes_per_token']} | {g[0]['params']:,} | {fmt([r['acc'] for r in g], 100, 1, 'se')} | "
                             f"{sum(r['acc'] >= th for r in g)}/{len(g)} | {fmt([steps(r, 'steps_to_50') for r in g], 1, 0, 'se')} | "
                             f"{fmt([steps(r, 'steps_to_90') for r in g], 1, 0, 'se')} |")
        lines.append("")
    lines += ["## Paired comparisons", "",
              "Δ = first minus second over the seeds both ran (the same init seed and batches), mean ± SE. Resolved (**bold**): the "
              "paired t-test rejects 'no difference' at 5%. Success: seeds where only the first / only the second reached "
              f"{th:.0%}, and the exact McNemar p-value (a sign test on those discordant seeds).", "",
              "| comparison | point | Δ accuracy (points) | success: only first / only second (p) | Δ steps to 90% |", "|---|---|---|---|---|"]
    for a, b in SWEEP_COMPARISONS:
        for p in points:
            A, B = ({r["seed"]: r for r in at(p, v)} for v in (a, b))
            if not A or not B:
                continue
            acc = paired({s: r["acc"] for s, r in A.items()}, {s: r["acc"] for s, r in B.items()})
            only_a, only_b, pv = mcnemar({s: r["acc"] >= th for s, r in A.items()}, {s: r["acc"] >= th for s, r in B.items()})
            st = paired({s: steps(r, "steps_to_90") for s, r in A.items()}, {s: steps(r, "steps_to_90") for s, r in B.items()})
            bold = lambda text, on: f"**{text}**" if on else text
            lines.append(f"| {a} vs {b} | {p} | {bold(fmt_paired(*acc, scale=100, digits=1), acc[4])} | "
                         f"{only_a} / {only_b} (p = {pv:.3g}) | {bold(fmt_paired(*st, digits=0), st[4])} |")
    folds = [r for r in rows if "acc_folded" in r]
    if folds:
        gap = max(abs(r["acc_folded"] - r["acc_unfolded"]) for r in folds)
        lines += ["", f"Folded == unfolded: {len(folds)} VHA-family runs (linear postmix) were folded into plain GQA "
                  f"(GPT.fold_to_gqa) and scored again: the largest accuracy difference is {gap * 100:.2f} points, and "
                  f"{sum(r['fold_same_predictions'] for r in folds)} of {len(folds)} give the same argmax at every position."]
    png = plot_sweep(rows, points, variants, th, cfg)
    if png:
        lines += ["", f"![recall sweep]({os.path.basename(png)})"]
    path = os.path.join(cfg["sweep_root"], "sweep.md")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wrote {path}, sweep.json, sweep.csv" + (f", {os.path.basename(png)}" if png else ""))


def plot_sweep(rows, points, variants, th, cfg):
    """Accuracy (mean ± SE over seeds) and success rate vs sweep point, one line per variant."""
    plt = pyplot()
    if plt is None:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    x = np.arange(len(points))
    for i, v in enumerate(variants):
        accs = [[r["acc"] for r in rows if r["point"] == p and r["variant"] == v] for p in points]
        mean = [np.mean(a) if a else np.nan for a in accs]
        se = [np.std(a, ddof=1) / math.sqrt(len(a)) if len(a) > 1 else 0 for a in accs]
        style = dict(color=f"C{i}", marker="o", label=v, ls="-" if v.startswith(("vha", "premix", "postmix")) else "--")
        axes[0].errorbar(x + 0.03 * (i - len(variants) / 2), mean, yerr=se, capsize=3, **style)
        axes[1].plot(x + 0.03 * (i - len(variants) / 2), [np.mean(np.array(a) >= th) if a else np.nan for a in accs], **style)
    for ax, label in zip(axes, ("held-out accuracy (mean ± SE over seeds)", f"success rate (share of seeds reaching {th:.0%})")):
        ax.set_xticks(x, points, fontsize=8)
        ax.set(xlabel="sweep point (harder to the right)", ylabel=label, ylim=(-0.03, 1.03))
        ax.grid(alpha=0.3)
    n = sorted({len(g) for p in points for v in variants if (g := [r for r in rows if r["point"] == p and r["variant"] == v])})
    axes[0].set_title(f"{rows[0]['spec']['task']}: accuracy by KV budget ({n[0]}{f'-{n[-1]}' if len(n) > 1 else ''} seeds)")
    axes[1].set_title("success rate")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    path = os.path.join(cfg["sweep_root"], "sweep.png")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def main():
    command, cfg = parse_args(sys.argv[1:])
    if cfg["threads"]:
        torch.set_num_threads(cfg["threads"])
    {"run": cmd_run, "report": cmd_report, "sweep": cmd_sweep, "sweep-report": cmd_sweep_report}[command](cfg)


if __name__ == "__main__":
    main()
