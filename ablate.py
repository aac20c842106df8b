"""
The paper's ablation table in miniature: every variant of config/ablations/ trained with the same
steps, tokens, LR schedule and seeds, twice per seed: on shakespeare_char (val loss) and on the
synthetic recall tasks of data/recall (exact-match recall by task and context length).

    python ablate.py --quick          # 3 variants x 2 seeds, short runs: a pipeline check (~6-12 min, 2-core CPU)
    python ablate.py                  # all 9 variants x 3 seeds (1 h 42 min on a 2-core CPU; minutes on a GPU)
    python ablate.py --kinds=lm       # only the LM runs (or --kinds=recall: only the recall runs)
    python ablate.py report           # rebuild results.json/csv, report.md, ablate.png from finished runs
    python ablate.py eval --out_dir=DIR [--ckpt_name=ckpt_folded.pt]   # recall accuracy of one checkpoint

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

import numpy as np
import torch

from configurator import ConfigError, configure, resolve_device
from data.recall import tasks
from model import load_checkpoint, model_from_checkpoint

ROOT = os.path.dirname(os.path.abspath(__file__))
# -----------------------------------------------------------------------------
DEFAULTS = dict(
    out_root="out-ablate",  # runs/<variant>/seed<N>/{lm,recall}/ + results.json, results.csv, report.md, ablate.png
    variants="all",  # or a comma list of VARIANTS names
    kinds="lm,recall",  # which runs of each (variant, seed): "lm" only, "recall" only, or both
    n_seeds=3, seed=1337,  # seeds seed, seed+1, ...: each seed gives every variant the same batches
    lm_iters=500, recall_iters=1000, batch_size=16, block_size=256,  # LM runs: 500 x 16 x 256 = 2M tokens
    recall_batch_size=8, recall_block_size=256,  # recall runs: 1000 x 8 x 256, the same 2M tokens in twice the steps
    warmup_iters=50, eval_interval=125, eval_iters=20, log_interval=10,
    model_args="",  # extra train.py overrides for every variant, e.g. "--n_layer=2 --n_embd=32"
    lm_dataset="shakespeare_char", lm_data_dir="",  # lm_data_dir: any folder with train.bin/val.bin/meta.pkl
    recall_chars=3_000_000,  # training characters of recall text (a run reads iters*batch*block of them)
    eval_lengths="128,256,512,1024", eval_examples=50,
    device="auto", dtype="",  # dtype "": keep config/vha_small.py's (bfloat16)
    threads=0,  # CPU threads per run (0: torch's default); 1 is much faster for tiny models or on a busy machine
    out_dir="", ckpt_name="ckpt.pt", greedy=False,  # eval command; greedy: decode instead of teacher forcing
)
SIZES = {  # presets; the same budget for every variant
    "smoke": dict(out_root="out-ablate-smoke", variants="vha", n_seeds=1, lm_iters=4, recall_iters=4, batch_size=4,
                  block_size=64, recall_batch_size=4, recall_block_size=96, warmup_iters=1, eval_interval=2, eval_iters=1, log_interval=1,
                  model_args="--n_layer=1 --n_embd=32", recall_chars=20_000, eval_lengths="96,128",
                  eval_examples=3, device="cpu", dtype="float32", threads=1),
    "quick": dict(out_root="out-ablate-quick", variants="gqa_4x_cache,gqa_same_deploy,vha", n_seeds=2, lm_iters=200,
                  recall_iters=200, block_size=128, recall_batch_size=8, recall_block_size=256, warmup_iters=20,
                  eval_interval=50, eval_iters=10, recall_chars=1_000_000, eval_lengths="128,256,512", eval_examples=20),
    "full": {},
}
VARIANTS = ("gqa_4x_cache", "gqa_same_deploy", "gqa_half_q", "vha", "premix_only", "postmix_only",
            "silu_postmix", "rank4", "rank8")  # "vha" is config/vha_small.py alone; the rest add config/ablations/<name>.py
# The paper's table (VHA.md: 1.7B, 50B tokens, 8-task zero-shot average). Our rank 4/8 stand in for its 32/128.
PAPER = {"gqa_4x_cache": ("GQA 16Q/8KV (4x cache)", 54.09), "gqa_same_deploy": ("GQA 16Q/2KV (same deploy)", 53.09),
         "gqa_half_q": ("GQA 8Q/2KV (same projections)", 52.38), "vha": ("VHA (premix + postmix)", 54.50),
         "premix_only": ("premix only", 53.31), "postmix_only": ("postmix only", 53.95),
         "silu_postmix": ("SiLU postmix (lower, no number)", None), "rank4": ("postmix rank 32", 54.24),
         "rank8": ("postmix rank 128", 54.15)}
COMPARISONS = [("vha", "gqa_same_deploy"), ("vha", "gqa_4x_cache"), ("vha", "gqa_half_q"), ("gqa_4x_cache", "gqa_same_deploy"),
               ("gqa_same_deploy", "gqa_half_q"), ("premix_only", "gqa_same_deploy"), ("postmix_only", "gqa_same_deploy"),
               ("vha", "premix_only"), ("vha", "postmix_only"), ("vha", "rank4"), ("vha", "rank8"), ("vha", "silu_postmix")]
PAPER_SAYS_BETTER = {("vha", "silu_postmix"): 1}  # "lower scores" for SiLU: a direction without a number
# -----------------------------------------------------------------------------


def parse_args(argv):
    """[command] [--smoke|--quick|--full|--size=NAME] [--key=value ...] -> (command, config)."""
    argv = list(argv)
    command = argv.pop(0) if argv and not argv[0].startswith("--") else "run"
    if command not in ("run", "eval", "report"):
        sys.exit(f"error: unknown command {command!r}: use run (default), eval or report")
    size, rest = "full", []
    for a in argv:
        if a in ("--smoke", "--quick", "--full") or a.startswith("--size="):
            size = a.split("=", 1)[1] if "=" in a else a[2:]
        else:
            rest.append(a)
    if size not in SIZES:
        sys.exit(f"error: unknown size {size!r}: use smoke, quick or full")
    try:
        cfg = configure(dict(DEFAULTS, **SIZES[size]), rest)
        cfg["device"] = resolve_device(cfg["device"])
    except ConfigError as e:
        sys.exit(f"error: {e}")
    cfg["size"] = size
    names = VARIANTS if cfg["variants"] == "all" else [v.strip() for v in cfg["variants"].split(",")]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown:
        sys.exit(f"error: unknown variant(s) {', '.join(unknown)}; known: {', '.join(VARIANTS)}")
    try:
        cfg["lengths"] = sorted(int(L) for L in cfg["eval_lengths"].split(","))
    except ValueError:
        sys.exit(f"error: eval_lengths must be comma-separated integers, got {cfg['eval_lengths']!r}")
    if cfg["lengths"][0] < min(tasks.MIN_LENGTH[t] for t in tasks.TASKS) or cfg["n_seeds"] < 1 or cfg["eval_examples"] < 1:
        sys.exit(f"error: need eval lengths >= {min(tasks.MIN_LENGTH[t] for t in tasks.TASKS)}, n_seeds >= 1 and eval_examples >= 1")
    if not cfg["kinds"] or set(cfg["kinds"].split(",")) - {"lm", "recall"}:
        sys.exit(f"error: kinds must be lm, recall or lm,recall, got {cfg['kinds']!r}")
    cfg["variant_list"] = list(names)
    return command, cfg


# ---- recall evaluation of one model ----
def load(path, device, max_len=0):
    """(model, ckpt) via model.py's loaders; max_len widens block_size, which only guards the training
    forward (RoPE is computed per position, no table to outgrow), so longer contexts can be scored."""
    try:
        ckpt = load_checkpoint(path, device)
    except (FileNotFoundError, ValueError) as e:
        sys.exit(f"error: {e}")
    args = dict(ckpt["model_args"], block_size=max(ckpt["model_args"]["block_size"], max_len))
    try:
        return model_from_checkpoint(dict(ckpt, model_args=args), device).float().eval(), ckpt
    except ValueError as e:
        sys.exit(f"error: {path}: {e}")


def recall_eval(model, lengths, n, device, greedy=False):
    """{task: {length: {"acc", "n", "chance"}}}: exact match on n held-out examples per cell."""
    out = {}
    for task in tasks.TASKS:
        for L in lengths:
            if L < tasks.MIN_LENGTH[task]:
                continue
            right = [r for ex in tasks.score(model, tasks.eval_set(task, L, n), greedy=greedy, device=device) for r in ex]
            out.setdefault(task, {})[str(L)] = {"acc": sum(right) / len(right), "n": len(right), "chance": tasks.chance(task)}
    return out


def cmd_eval(cfg):
    if not cfg["out_dir"]:
        sys.exit("error: eval needs --out_dir=DIR (a folder with a checkpoint trained on --dataset=recall)")
    path = os.path.join(cfg["out_dir"], cfg["ckpt_name"])
    model, ckpt = load(path, cfg["device"], max(cfg["lengths"]))
    if (ckpt.get("meta") or {}).get("stoi") != tasks.STOI:
        sys.exit(f"error: {path} was not trained on the recall tasks (its vocab differs); train one with "
                 f"python train.py config/vha_small.py --dataset=recall")
    res = recall_eval(model, cfg["lengths"], cfg["eval_examples"], cfg["device"], cfg["greedy"])
    trained = ckpt["model_args"]["block_size"]
    print(f"recall exact match, {path} ({'greedy decoding' if cfg['greedy'] else 'teacher-forced argmax'}, "
          f"{cfg['eval_examples']} examples per cell; * = longer than the training block_size {trained}):")
    print(f"{'task':8s}" + "".join(f"{str(L) + ('*' if L > trained else ''):>9s}" for L in cfg["lengths"]))
    for task, cells in res.items():
        print(f"{task:8s}" + "".join(f"{cells[str(L)]['acc']:9.1%}" if str(L) in cells else f"{'-':>9s}" for L in cfg["lengths"]))
    dst = os.path.join(cfg["out_dir"], f"recall_{os.path.splitext(cfg['ckpt_name'])[0]}.json")
    write_json(dst, {"ckpt": path, "greedy": cfg["greedy"], "examples": cfg["eval_examples"], "recall": res})
    print(f"wrote {dst}")


# ---- the grid ----
def read_json(path):
    with open(path) as f:
        return json.load(f)


def write_json(path, obj):
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(path + ".tmp", path)  # a crash never leaves half a result (which would count as done)


def budget(cfg, kind):
    """(steps, batch_size, block_size) of an "lm" or "recall" run: the same for every variant."""
    if kind == "lm":
        return cfg["lm_iters"], cfg["batch_size"], cfg["block_size"]
    return cfg["recall_iters"], cfg["recall_batch_size"], cfg["recall_block_size"]


def train_args(cfg, variant, seed, kind, run_dir, recall_dir):
    """train.py's argv for one run: config files, then the same budget overrides for every variant."""
    files = ["config/vha_small.py"] + ([] if variant == "vha" else [f"config/ablations/{variant}.py"])
    iters, batch, block = budget(cfg, kind)
    data = ([f"--dataset={cfg['lm_dataset']}"] + ([f"--data_dir={os.path.abspath(cfg['lm_data_dir'])}"] if cfg["lm_data_dir"] else [])
            if kind == "lm" else ["--dataset=recall", f"--data_dir={recall_dir}"])
    return [*files, f"--out_dir={run_dir}", f"--seed={seed}", f"--max_iters={iters}", f"--lr_decay_iters={iters}",
            f"--warmup_iters={cfg['warmup_iters']}", f"--eval_interval={cfg['eval_interval']}", f"--eval_iters={cfg['eval_iters']}",
            f"--log_interval={cfg['log_interval']}", f"--batch_size={batch}", f"--block_size={block}",
            f"--device={cfg['device']}", *([f"--dtype={cfg['dtype']}"] if cfg["dtype"] else []), *data, *cfg["model_args"].split()]


def run_one(cfg, variant, seed, kind, recall_dir):
    """Trains (or resumes) one run, measures it, writes its result.json; returns a status word."""
    run_dir = os.path.abspath(os.path.join(cfg["out_root"], "runs", variant, f"seed{seed}", kind))
    result_path, ckpt_path, args_path = (os.path.join(run_dir, n) for n in ("result.json", "ckpt.pt", "args.json"))
    args = train_args(cfg, variant, seed, kind, run_dir, recall_dir)
    recorded = read_json(args_path) if os.path.exists(args_path) else args
    if recorded != args:  # results of other settings must never be mixed into this table
        sys.exit(f"error: {run_dir} was started with other settings ({' '.join(recorded)}); use another --out_root")
    evaluation = {"lengths": cfg["lengths"], "examples": cfg["eval_examples"]} if kind == "recall" else None
    if os.path.exists(result_path) and read_json(result_path).get("eval") == evaluation:
        return "done before, skipped"  # (other eval settings: the trained checkpoint is evaluated again)
    os.makedirs(run_dir, exist_ok=True)
    write_json(args_path, args)
    iters, t0 = budget(cfg, kind)[0], time.time()
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
            sys.exit(f"error: {variant} seed {seed} {kind} run failed (exit {rc}): {tail[0]} (full output: {run_dir}/train.out)")
    with open(os.path.join(run_dir, "log.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    evals = [r for r in rows if "val_loss" in r]
    speed = [r["tok_per_s"] for r in rows if "tok_per_s" in r][1:] or [r["tok_per_s"] for r in rows if "tok_per_s" in r]
    model, ckpt = load(ckpt_path, cfg["device"], max(cfg["lengths"]))
    block = ckpt["config"]["block_size"]
    res = {"variant": variant, "seed": seed, "kind": kind, "args": args, "eval": evaluation, "iters": iters, "block_size": block,
           "tokens": iters * ckpt["config"]["batch_size"] * block, "val_loss": evals[-1]["val_loss"], "train_loss": evals[-1]["train_loss"],
           "curve": [[r["tokens"], r["val_loss"]] for r in evals], "params": model.num_params(),
           "flops_per_token": model.flops_per_token(block, training=True), "kv_bytes_per_token": model.kv_bytes_per_token(torch.bfloat16),
           "tok_per_s": float(np.mean(speed)) if speed else None, "train_s": rows[-1]["time"]}
    if kind == "recall":
        res["recall"] = recall_eval(model, cfg["lengths"], cfg["eval_examples"], cfg["device"])
    res["wall_s"] = time.time() - t0
    write_json(result_path, res)
    return note + f"val loss {res['val_loss']:.4f}" + (f", recall {mean_recall(res):.1%}" if kind == "recall" else "") + f", {res['wall_s']:.0f} s"


def cmd_run(cfg):
    seeds = [cfg["seed"] + i for i in range(cfg["n_seeds"])]
    kinds = cfg["kinds"].split(",")
    jobs = [(v, s, k) for s in seeds for v in cfg["variant_list"] for k in kinds]
    tokens = {k: math.prod(budget(cfg, k)) for k in kinds}
    print(f"ablation grid ({cfg['size']}): {len(cfg['variant_list'])} variants x {len(seeds)} seeds x ({' + '.join(kinds)}) = {len(jobs)} runs; "
          f"{' + '.join(f'{tokens[k]:,}' for k in kinds)} tokens per (variant, seed); results in {cfg['out_root']}")
    if cfg["size"] != "full":
        print(f"note: --{cfg['size']} is a reduced grid ({', '.join(cfg['variant_list'])}; {len(seeds)} seed(s); "
              f"{cfg['lm_iters']} steps), a check of the pipeline, not the reproduction: run without --{cfg['size']} for that")
    with open(tasks.__file__, "rb") as f:  # the generator's own hash in the name: an edited task never reuses old data
        version = hashlib.sha256(f.read()).hexdigest()[:8]
    recall_dir = os.path.abspath(os.path.join(cfg["out_root"], "data", f"recall_T{cfg['recall_block_size']}_{cfg['recall_chars']}_{version}"))
    if "recall" in kinds and not os.path.exists(os.path.join(recall_dir, "meta.pkl")):
        cmd = [sys.executable, os.path.join(ROOT, "data", "recall", "prepare.py"), "--out_dir", recall_dir,
               "--max_len", str(cfg["recall_block_size"]), "--train_chars", str(cfg["recall_chars"]),
               "--val_chars", str(max(cfg["recall_chars"] // 10, 10 * cfg["recall_block_size"]))]
        if subprocess.run(cmd).returncode != 0:
            sys.exit(1)  # prepare.py printed the error
    t0, fresh = time.time(), 0
    for i, (variant, seed, kind) in enumerate(jobs):
        print(f"[{i + 1}/{len(jobs)}] {variant} seed {seed} {kind}: ", end="", flush=True)
        status = run_one(cfg, variant, seed, kind, recall_dir)
        fresh += status != "done before, skipped"  # for the time estimate
        left = (time.time() - t0) / max(fresh, 1) * (len(jobs) - i - 1)
        print(status + (f" (about {left / 60:.0f} min left)" if fresh and i + 1 < len(jobs) else ""), flush=True)
    cmd_report(cfg)


# ---- results: tables, comparisons with the paper, plot ----
def inside_cells(res, only=tasks.TASKS):
    """The recall cells of the tasks `only` at lengths within the training context (all lengths if none
    is): recall beyond it mostly measures RoPE extrapolation, shown separately by length."""
    cells = [(int(L), c) for t in only for L, c in res["recall"].get(t, {}).items()]
    return [c for L, c in cells if L <= res["block_size"]] or [c for _, c in cells]


def mean_recall(res, only=tasks.TASKS):
    """Mean exact match over inside_cells(res, only)."""
    return float(np.mean([c["acc"] for c in inside_cells(res, only)]))


def chance_floor(res):
    """What guessing would reach on mean_recall(res), plus 3 standard errors of that guess: a mean recall
    at or below it is indistinguishable from chance (cells: acc ~ Binomial(n, chance) / n)."""
    inside = inside_cells(res)
    mean = np.mean([c["chance"] for c in inside])
    se = math.sqrt(sum(c["chance"] * (1 - c["chance"]) / c["n"] for c in inside)) / len(inside)
    return float(mean + 3 * se)


def load_results(cfg):
    """{variant: {"lm": [result per seed], "recall": [...]}} for the selected variants, in VARIANTS order."""
    groups = {}
    for path in sorted(glob.glob(os.path.join(cfg["out_root"], "runs", "*", "seed*", "*", "result.json"))):
        r = read_json(path)
        if r["variant"] in cfg["variant_list"]:
            groups.setdefault(r["variant"], {"lm": [], "recall": []})[r["kind"]].append(r)
    return {v: groups[v] for v in VARIANTS if v in groups}


def metrics(group):
    """Per-seed value lists of everything the tables show."""
    lm, rc = group["lm"], group["recall"]
    m = {"val_loss": [r["val_loss"] for r in lm], "recall": [mean_recall(r) for r in rc],
         "chance_floor": max([chance_floor(r) for r in rc], default=0.0)}
    for task in tasks.TASKS:
        m[task] = [mean_recall(r, [task]) for r in rc if task in r["recall"]]
        for L in (rc[0]["recall"].get(task, {}) if rc else {}):
            m[f"{task}@{L}"] = [r["recall"][task][L]["acc"] for r in rc if L in r["recall"].get(task, {})]
    m.update({k: (lm or rc)[0][k] for k in ("params", "flops_per_token", "kv_bytes_per_token")})  # of the LM run
    m["tok_per_s"] = [r["tok_per_s"] for r in lm if r["tok_per_s"]]
    m["wall_s"] = [sum(r["wall_s"] for r in lm + rc if r["seed"] == s) for s in sorted({r["seed"] for r in lm + rc})]
    return m


def fmt(values, scale=1.0, digits=4):
    """'mean ± std' over seeds (sample std), 'mean' for one seed, '-' for none."""
    if not values:
        return "-"
    return f"{np.mean(values) * scale:.{digits}f}" + (f" ± {np.std(values, ddof=1) * scale:.{digits}f}" if len(values) > 1 else "")


def compare(a, b, higher_is_better, paper_dir):
    """Difference of means a - b against its standard error sqrt(s_a^2/n_a + s_b^2/n_b), i.e. the pooled
    seed-to-seed std / sqrt(n) for equal n. Returns (delta, z, verdict); |z| > 2 counts as resolved."""
    if not a or not b:
        return None, None, "missing runs"
    delta = float(np.mean(a) - np.mean(b))
    if len(a) < 2 or len(b) < 2:
        return delta, None, "1 seed: no spread to judge"
    se = math.sqrt(np.var(a, ddof=1) / len(a) + np.var(b, ddof=1) / len(b))
    z = abs(delta) / se if se > 0 else (math.inf if delta else 0.0)
    ours = np.sign(delta) * (1 if higher_is_better else -1)  # +1: a is better than b
    if ours == 0:
        return delta, z, "no difference"
    side = "agrees" if ours == paper_dir else "opposite"
    return delta, z, f"{side}, {'resolved' if z > 2 else 'within seed spread'} ({z:.1f} SE)"


def write_tables(rows, lengths, root):
    """results.json (every run, as written) and results.csv (one row per run)."""
    write_json(os.path.join(root, "results.json"), rows)
    cells = [(t, str(L)) for t in tasks.TASKS for L in lengths]
    with open(os.path.join(root, "results.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["variant", "seed", "kind", "val_loss", "recall", "params", "flops_per_token", "kv_bytes_per_token",
                    "tok_per_s", "wall_s"] + [f"{t}@{L}" for t, L in cells])
        for r in rows:
            rec = r.get("recall") or {}
            w.writerow([r["variant"], r["seed"], r["kind"], r["val_loss"], mean_recall(r) if rec else "", r["params"],
                        r["flops_per_token"], r["kv_bytes_per_token"], r["tok_per_s"], round(r["wall_s"], 1)]
                       + [rec.get(t, {}).get(L, {}).get("acc", "") for t, L in cells])


def comparison_lines(M):
    """The paper's comparisons as table rows plus a tally, judged from the numbers in M."""
    lines = ["| comparison | paper Δ (points) | Δ val loss | val loss verdict | Δ recall (points) | recall verdict |", "|---|---|---|---|---|---|"]
    tally = {"val loss": [], "recall": []}
    for a, b in COMPARISONS:
        if a not in M or b not in M:
            continue
        pa, pb = PAPER[a][1], PAPER[b][1]
        paper_dir = PAPER_SAYS_BETTER.get((a, b)) or int(np.sign(pa - pb))
        paper_txt = f"{pa - pb:+.2f}" if pa is not None and pb is not None else ("first better" if paper_dir > 0 else "second better")
        dl, _, vl = compare(M[a]["val_loss"], M[b]["val_loss"], False, paper_dir)
        dr, _, vr = compare(M[a]["recall"], M[b]["recall"], True, paper_dir)
        if dr is not None and all(np.mean(M[v]["recall"]) <= M[v]["chance_floor"] for v in (a, b)):
            vr = "both at chance: not judged"  # differences between two guessers are noise, whatever their SE
        tally["val loss"].append(vl)
        tally["recall"].append(vr)
        lines.append(f"| {a} vs {b} | {paper_txt} | {'-' if dl is None else f'{dl:+.4f}'} | {vl} | "
                     f"{'-' if dr is None else f'{dr * 100:+.1f}'} | {vr} |")
    lines.append("")
    for metric, verdicts in tally.items():
        count = lambda s: sum(s in x for x in verdicts)
        judged = count("resolved") + count("within seed spread")
        lines.append(f"- {metric}: of {len(verdicts)} comparisons, {count('agrees, resolved')} agree with the paper beyond the "
                     f"seed spread, {count('opposite, resolved')} go the opposite way beyond it, {count('within seed spread')} "
                     f"are within the spread" + (f", {len(verdicts) - judged} could not be judged" if judged < len(verdicts) else "") + ".")
    lines.append(f"- 2 SE is a loose bar with few seeds (a t-test with about 2n-2 degrees of freedom is stricter), and among "
                 f"{len(tally['recall'])} comparisons one or two can pass it by chance: read single verdicts with care.")
    return lines


def cmd_report(cfg):
    """results.json/csv, report.md (our table beside the paper's, and its comparisons judged) and ablate.png."""
    groups = load_results(cfg)
    if not groups:
        sys.exit(f"error: no finished runs in {cfg['out_root']}/runs for {', '.join(cfg['variant_list'])}; run python ablate.py first")
    rows = [r for g in groups.values() for k in ("lm", "recall") for r in g[k]]
    recall_rows = [r for r in rows if r["kind"] == "recall"]
    lengths = sorted({int(L) for r in recall_rows for cells in r["recall"].values() for L in cells})
    train_len = recall_rows[0]["block_size"] if recall_rows else cfg["recall_block_size"]
    write_tables(rows, lengths, cfg["out_root"])
    M = {v: metrics(g) for v, g in groups.items()}
    runs = {r["kind"]: r for r in rows}  # one of each kind, for the budget line
    seeds = ", ".join(f"{v} {len(g['lm'])}/{len(g['recall'])}" for v, g in groups.items())
    lines = ["# VHA ablations in miniature", "",
             f"{len(M)} variants; finished seeds (lm/recall): {seeds}. "
             + "; ".join(f"{k} runs: {r['iters']} steps, {r['tokens']:,} tokens, context {r['block_size']}" for k, r in runs.items())
             + ". Every variant: config/vha_small.py + its config/ablations file, the same steps, tokens, LR schedule and seeds "
             f"(hence the same batches){'; model overrides: ' + cfg['model_args'] if cfg['model_args'] else ''}. Val loss: "
             f"{cfg['lm_dataset']}. Recall: exact match on held-out examples (mqar: per query); * marks lengths beyond the "
             f"training context ({train_len})."]
    if cfg["size"] != "full":
        lines += ["", f"**Reduced grid (--{cfg['size']}): a check of the pipeline, too small to reproduce anything.**"]
    lines += ["", "## Results (mean ± std over seeds)", "",
              "| variant | paper: 1.7B 8-task avg | val loss ↓ | recall % ↑ (lengths ≤ training context) | "
              + " | ".join(f"{t} %" for t in tasks.TASKS) + " | params | train FLOPs/token | KV B/token (bf16) | tok/s | wall s |",
              "|---" * (9 + len(tasks.TASKS)) + "|"]
    for v, m in M.items():
        label, score = PAPER[v]
        lines.append(f"| {v} | {label}: {'-' if score is None else f'{score:.2f}'} | {fmt(m['val_loss'])} | {fmt(m['recall'], 100, 1)} | "
                     + " | ".join(fmt(m[t], 100, 1) for t in tasks.TASKS) + f" | {m['params']:,} | {m['flops_per_token'] / 1e6:.2f}M | "
                     f"{m['kv_bytes_per_token']} | {fmt(m['tok_per_s'], 1, 0)} | {fmt(m['wall_s'], 1, 0)} |")
    cells = [f"{t}@{L}" for t in tasks.TASKS for L in lengths if any(f"{t}@{L}" in m for m in M.values())]
    judged = {v: m for v, m in M.items() if m["recall"]}
    if judged:
        above = [v for v, m in judged.items() if np.mean(m["recall"]) > m["chance_floor"]]
        lines += ["", f"Chance level of the recall column (uniform guessing + 3 SE): {max(m['chance_floor'] for m in judged.values()):.1%}. "
                  f"Above it: {', '.join(above) if above else 'no variant; recall comparisons are not judged'}."]
    lines += ["", "## Recall exact match % by task and context length", "",
              "| variant | " + " | ".join(c + ("*" if int(c.split("@")[1]) > train_len else "") for c in cells) + " |",
              "|---" * (1 + len(cells)) + "|"]
    lines += [f"| {v} | " + " | ".join(fmt(m.get(c, []), 100, 1) for c in cells) + " |" for v, m in M.items()]
    lines += ["", "## The paper's comparisons, checked on our numbers", "",
              "The paper's metric is a downstream average; ours are val loss and recall, so only the direction is compared. "
              "Δ = first minus second; 'resolved' means |Δ| > 2 standard errors (SE = sqrt(s1²/n1 + s2²/n2) over seeds).", ""]
    lines += comparison_lines(M)
    png = plot(groups, lengths, train_len, cfg)
    if png:
        lines += ["", f"![ablation plot]({os.path.basename(png)})"]
    path = os.path.join(cfg["out_root"], "report.md")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines[lines.index("## Results (mean ± std over seeds)"):]))
    print(f"wrote {path}, results.json, results.csv" + (f", {os.path.basename(png)}" if png else ""))


def plot(groups, lengths, train_len, cfg):
    """Val loss curves (mean over seeds) and recall accuracy vs context length per task; returns the PNG path."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (pip install matplotlib)")
        return None
    fig, axes = plt.subplots(1, 1 + len(tasks.TASKS), figsize=(4.5 * (1 + len(tasks.TASKS)), 4))
    for i, (v, g) in enumerate(groups.items()):
        curves = [r["curve"][1:] for r in g["lm"]]  # from the first eval after step 0 (step 0 dwarfs the rest)
        n = min(map(len, curves)) if curves else 0
        if n:
            axes[0].plot([c[0] for c in curves[0][:n]], np.mean([[c[1] for c in cv[:n]] for cv in curves], 0), color=f"C{i}", label=v)
        for ax, task in zip(axes[1:], tasks.TASKS):
            Ls = [L for L in lengths if g["recall"] and all(str(L) in r["recall"].get(task, {}) for r in g["recall"])]
            if Ls:
                acc = [np.mean([r["recall"][task][str(L)]["acc"] for r in g["recall"]]) for L in Ls]
                ax.plot(Ls, acc, marker="o", color=f"C{i}", label=v)
    axes[0].set(xlabel="training tokens", ylabel=f"val loss ({cfg['lm_dataset']})", title="LM val loss (mean over seeds)")
    for ax, task in zip(axes[1:], tasks.TASKS):
        ax.axvline(train_len, color="gray", ls="--", lw=0.8)
        ax.set(xscale="log", xlabel="context length (tokens; dashed: training context)", ylabel="exact match",
               ylim=(-0.03, 1.03), title=f"recall: {task}")
        if lengths:
            ax.set_xticks(lengths, [str(L) for L in lengths])
        ax.minorticks_off()
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    path = os.path.join(cfg["out_root"], "ablate.png")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def main():
    command, cfg = parse_args(sys.argv[1:])
    if cfg["threads"]:
        torch.set_num_threads(cfg["threads"])
    {"run": cmd_run, "eval": cmd_eval, "report": cmd_report}[command](cfg)


if __name__ == "__main__":
    main()
