"""
The paper's ablations in miniature: the LM grid. Every variant gets the same steps, data, LR
schedule and seeds; a seed fixes the init and every batch, so variants are compared seed by seed
(paired differences).

    python ablate.py                  # 11 variants x 3 seeds on shakespeare_char, val loss
    python ablate.py --quick          # 3 variants x 2 seeds, 200 steps: a pipeline check
    python ablate.py --size=gpu       # one GPU: GQA-8, same-deploy GQA and VHA at 120M on FineWeb-Edu, 2 seeds
    python ablate.py report           # rebuild the tables and plot from the finished runs

The recall KV-budget sweep is sweep.py. Any knob below can be overridden with --key=value after
the size preset (--smoke, --quick, --full). Runs resume (lab/experiments.py). Times, with
their CPU: docs/lm_grid.md.
"""
import csv
import os
import sys
import time

import numpy as np
import torch

from nanovha.costs import flops_per_token, kv_bytes_per_token
from lab.experiments import hold_root
from lab.experiments import (choose_variants, fmt, fmt_paired, load_results, paired, parse_command,
                                 parse_primary, primary_lines, pyplot, read_json, run_all, same_run, t_crit,
                                 train, write_json)
from nanovha.loading import load_model
from nanovha.outputs import save_figure
from nanovha.config import at_least

# -----------------------------------------------------------------------------
# defaults (overridden by --smoke / --quick / --size=gpu, i.e. config/ablate/<size>.py, then by --key=value)
device = "auto"
seed = 1337
jobs = 1  # runs at once
threads = 0  # CPU threads per run (0: torch's default)
# LM grid: runs/<variant>/seed<N>/ + results.json, results.csv, report.md, ablate.png
out_root = "out-ablate"
variants = "all"
n_seeds = 3  # seeds seed, seed+1, ...: each gives every variant the same batches
# the same budget for every variant
lm_iters = 500
batch_size = 16
block_size = 256
gradient_accumulation_steps = 1
warmup_iters = 50
eval_interval = 125
eval_iters = 20
log_interval = 10
# "": config/vha_small.py + config/ablations/<variant>.py; else <config_dir>/vha.py + <variant>.py
config_dir = ""
model_args = ""  # extra train.py overrides for every variant, e.g. "--n_layer=2 --n_embd=32"
lm_dataset = "shakespeare_char"
lm_data_dir = ""  # any folder with train.bin/val.bin/meta.pkl
dtype = ""  # "": keep config/vha_small.py's (auto: bf16 where native, else fp32)
primary = ""  # a plan's comparisons, e.g. "vha-gqa2": val loss, Holm-corrected over these
# nanovha/variants.py's names: "vha" is config/vha_small.py alone; the rest add
# config/ablations/<name>.py
VARIANTS = ("gqa8", "gqa2", "gqa2_half_q", "vha", "premix_only", "postmix_only",
            "silu_postmix", "rank4", "rank8", "mla", "mfa")
# The paper's table (VHA.md: 1.7B, 50B tokens, 8-task zero-shot average). Our rank 4/8 stand in for
# its 32/128.
PAPER = {"gqa8": ("GQA 16Q/8KV (4x cache)", 54.09), "gqa2": ("GQA 16Q/2KV (same deploy)", 53.09),
         "gqa2_half_q": ("GQA 8Q/2KV (same projections)", 52.38), "vha": ("VHA (premix + postmix)", 54.50),
         "premix_only": ("premix only", 53.31), "postmix_only": ("postmix only", 53.95),
         "silu_postmix": ("SiLU postmix (lower, no number)", None), "rank4": ("postmix rank 32", 54.24),
         "rank8": ("postmix rank 128", 54.15), "mfa": ("MFA (1 KB cache)", 54.06),
         "mla": ("MLA (1 KB cache; lower than VHA on the paper's 30B MoE, no 1.7B number)", None)}
COMPARISONS = [("vha", "gqa2"), ("vha", "gqa8"), ("vha", "gqa2_half_q"),
               ("gqa8", "gqa2"), ("gqa2", "gqa2_half_q"),
               ("premix_only", "gqa2"), ("postmix_only", "gqa2"), ("vha", "premix_only"),
               ("vha", "postmix_only"), ("vha", "rank4"), ("vha", "rank8"), ("vha", "silu_postmix"), ("vha", "mfa"),
               ("vha", "mla")]
# directions without a 1.7B number
PAPER_SAYS_BETTER = {("vha", "silu_postmix"): 1, ("vha", "mla"): 1}
# -----------------------------------------------------------------------------


def parse_args(argv):
    """[command] [--smoke|--quick|--full|--size=NAME] [--key=value ...] -> (command, config)."""
    command, cfg = parse_command(argv, ("run", "report"), globals(), {"n_seeds": at_least(1)})
    cfg["variant_list"] = choose_variants(cfg["variants"], VARIANTS)
    cfg["primary_list"] = parse_primary(cfg["primary"], cfg["variant_list"])
    return command, cfg



# ---- the LM grid ----
def lm_args(cfg, variant, seed, run_dir):
    """train.py's argv for one LM run: config files, then the same budget overrides for every
    variant."""
    own = cfg["config_dir"]
    base, twins = (own, own) if own else ("config", "config/ablations")
    base = os.path.join(base, "vha.py" if cfg["config_dir"] else "vha_small.py")
    files = [base] + ([] if variant == "vha" else [os.path.join(twins, f"{variant}.py")])
    data = [f"--dataset={cfg['lm_dataset']}"] + ([f"--data_dir={os.path.abspath(cfg['lm_data_dir'])}"]
                                                 if cfg["lm_data_dir"] else [])
    return [*files, f"--out_dir={run_dir}", f"--seed={seed}", f"--max_iters={cfg['lm_iters']}",
            f"--lr_decay_iters={cfg['lm_iters']}", f"--warmup_iters={cfg['warmup_iters']}",
            f"--eval_interval={cfg['eval_interval']}", f"--eval_iters={cfg['eval_iters']}",
            f"--log_interval={cfg['log_interval']}", f"--batch_size={cfg['batch_size']}",
            f"--block_size={cfg['block_size']}", f"--gradient_accumulation_steps={cfg['gradient_accumulation_steps']}",
            f"--device={cfg['device']}", *([f"--dtype={cfg['dtype']}"] if cfg["dtype"] else []), *data,
            *cfg["model_args"].split()]


def tokens_per_run(cfg):
    steps = cfg["lm_iters"] * cfg["gradient_accumulation_steps"]
    return steps * cfg["batch_size"] * cfg["block_size"]


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
    speed = [r["tok_per_s"] for r in rows if "tok_per_s" in r]
    speed = speed[1:] or speed
    model = load_model(run_dir)[0]
    res = {"variant": variant, "seed": seed, "args": args, "iters": cfg["lm_iters"], "block_size": cfg["block_size"],
           "tokens": tokens_per_run(cfg), "val_loss": evals[-1]["val_loss"],
           "train_loss": evals[-1]["train_loss"], "curve": [[r["tokens"], r["val_loss"]] for r in evals],
           "params": model.num_params(),
           "flops_per_token": flops_per_token(model.cfg, cfg["block_size"], training=True),
           "kv_bytes_per_token": kv_bytes_per_token(model.cfg, torch.bfloat16),
           "tok_per_s": float(np.mean(speed)) if speed else None, "train_s": rows[-1]["time"],
           "wall_s": time.time() - t0}
    write_json(result_path, res)
    return note + f"val loss {res['val_loss']:.4f}, {res['wall_s']:.0f} s"


def cmd_run(cfg):
    seeds = [cfg["seed"] + i for i in range(cfg["n_seeds"])]
    jobs = [(v, s) for s in seeds for v in cfg["variant_list"]]
    print(f"LM grid ({cfg['size']}): {len(cfg['variant_list'])} variants x {len(seeds)} seeds = "
          f"{len(jobs)} runs of "
          f"{tokens_per_run(cfg):,} tokens; results in {cfg['out_root']}")
    if cfg["size"] != "full":
        print(f"note: --{cfg['size']} is a reduced grid, a check of the pipeline, not the reproduction")
    run_all(cfg, jobs, lambda job: run_lm(cfg, job), lambda job: f"{job[0]} seed {job[1]}")
    cmd_report(cfg)


def comparison_lines(M):
    """The paper's comparisons as table rows plus a tally, judged by paired differences over
    shared seeds."""
    lines = ["| comparison | paper Δ (points) | Δ val loss, paired (mean ± SE) | verdict |", "|---|---|---|---|"]
    tally, n = [], 0  # n: the last comparison's shared seeds (every variant runs the same seeds)
    for a, b in COMPARISONS:
        if a not in M or b not in M:
            continue
        pa, pb = PAPER[a][1], PAPER[b][1]
        paper_dir = PAPER_SAYS_BETTER.get((a, b)) or int(np.sign(pa - pb))
        paper_txt = (f"{pa - pb:+.2f}" if pa is not None and pb is not None
                     else ("first better" if paper_dir > 0 else "second better"))
        n, mean, se, t, resolved = stat = paired(M[a], M[b])
        if n < 2:
            verdict = "fewer than 2 shared seeds: not judged"
        elif mean == 0:
            verdict = "no difference"
        else:  # lower loss is better: a negative Δ means the first is better
            verdict = (("agrees" if -np.sign(mean) == paper_dir else "opposite")
                       + (", resolved" if resolved else ", not resolved"))
        tally.append(verdict)
        lines.append(f"| {a} vs {b} | {paper_txt} | {fmt_paired(*stat)} | {verdict} |")
    count = lambda s: sum(v.endswith(s) for v in tally)
    lines += ["", f"- Of {len(tally)} comparisons, {sum(v == 'agrees, resolved' for v in tally)} "
                  f"agree with the paper "
              f"and are resolved, {sum(v == 'opposite, resolved' for v in tally)} go the opposite way and are "
              f"resolved, {count('not resolved')} are not resolved"
              + (f", {len(tally) - count('resolved')} not judged" if len(tally) > count("resolved") else "") + ".",
              f"- Resolved: the paired t-test over the shared seeds rejects 'no difference' at 5% (two-sided; with "
              f"{n} seeds that needs |Δ| > {t_crit(n - 1)} SE)" if n > 1 else "- Resolved: needs 2 seeds or more",
              f"- Exploratory: {len(tally)} uncorrected tests, so about {len(tally) / 20:.1f} pass by chance alone."]
    return lines


def cmd_report(cfg):
    """results.json/csv, report.md (our table beside the paper's, its comparisons judged) and
    ablate.png."""
    rows = load_results(cfg["out_root"], ("*", "seed*"), lambda r: r["variant"] in cfg["variant_list"])
    if not rows:
        sys.exit(f"error: no finished runs in {cfg['out_root']}/runs for "
                 f"{', '.join(cfg['variant_list'])}; "
                 "run python ablate.py first")
    groups = {v: [r for r in rows if r["variant"] == v] for v in VARIANTS}
    groups = {v: g for v, g in groups.items() if g}
    write_json(os.path.join(cfg["out_root"], "results.json"), rows)
    cols = ["variant", "seed", "val_loss", "train_loss", "params", "flops_per_token", "kv_bytes_per_token", "tok_per_s",
            "wall_s"]
    with open(os.path.join(cfg["out_root"], "results.csv"), "w", newline="") as f:
        csv.writer(f).writerows([cols] + [[r[c] for c in cols] for r in rows])
    M = {v: {r["seed"]: r["val_loss"] for r in g} for v, g in groups.items()}
    r0 = rows[0]
    lines = ["# VHA ablations in miniature: the LM grid", "",
             f"{len(groups)} variants; seeds: " + ", ".join(f"{v} {len(g)}" for v, g in groups.items())
             + f". Each run: {r0['iters']} steps, {r0['tokens']:,} tokens of {cfg['lm_dataset']}, context "
             f"{r0['block_size']}. Every variant: config/vha_small.py + its config/ablations file, the same steps, "
             "tokens, LR schedule and seeds (hence the "
             f"same batches){'; model overrides: ' + cfg['model_args'] if cfg['model_args'] else ''}."]
    if cfg["size"] != "full":
        lines += ["", f"**Reduced grid (--{cfg['size']}): a check of the pipeline, too small to "
                      f"reproduce anything.**"]
    lines += ["", "## Results (mean ± std over seeds)", "",
              "| variant | paper: 1.7B 8-task avg | val loss ↓ | params | train FLOPs/token | KV B/token (bf16) "
              "| tok/s | wall s |",
              "|---|---|---|---|---|---|---|---|"]
    for v, g in groups.items():
        label, score = PAPER[v]
        lines.append(f"| {v} | {label}: {'-' if score is None else f'{score:.2f}'} | "
                     f"{fmt([r['val_loss'] for r in g])} | {g[0]['params']:,} | "
                     f"{g[0]['flops_per_token'] / 1e6:.2f}M | "
                     f"{g[0]['kv_bytes_per_token']} | "
                     f"{fmt([r['tok_per_s'] for r in g if r['tok_per_s']], 1, 0)} | "
                     f"{fmt([r['wall_s'] for r in g], 1, 0)} |")
    planned = bool(cfg["primary_list"])
    if planned:
        lines += [""] + primary_lines({pair: (M[pair[0]], M[pair[1]]) for pair in cfg["primary_list"]}, "val loss")
    lines += ["", "## The paper's comparisons, checked on our numbers" + " (exploratory)" * planned, "",
              "The paper's metric is a downstream average; ours is val loss, so only the direction is compared. "
              "Δ = first minus second, per seed (both saw the same batches), then mean ± SE over the seeds"
              + ("; each test on its own, uncorrected (the primary ones are above)." if planned else "."), ""]
    lines += comparison_lines(M)
    png = plot_lm(groups, cfg)
    if png:
        lines += ["", f"![LM grid]({os.path.basename(png)})"]
    path = os.path.join(cfg["out_root"], "report.md")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines[lines.index("## Results (mean ± std over seeds)"):]))
    print(f"wrote {path}, results.json, results.csv" + (f", {os.path.basename(png)}" if png else ""))


def plot_lm(groups, cfg):
    """Val loss curves, mean over seeds, from the first eval after step 0 (step 0 dwarfs the
    rest)."""
    plt = pyplot()
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, (v, g) in enumerate(groups.items()):
        curves = [r["curve"][1:] for r in g]
        n = min(map(len, curves))
        if n:
            ax.plot([c[0] for c in curves[0][:n]], np.mean([[c[1] for c in cv[:n]] for cv in curves], 0),
                    color=f"C{i}", label=v)
    ax.set(xlabel="training tokens", ylabel=f"val loss ({cfg['lm_dataset']})", title="LM val loss (mean over seeds)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = os.path.join(cfg["out_root"], "ablate.png")
    save_figure(fig, path)
    plt.close(fig)
    return path


def main():
    command, cfg = parse_args(sys.argv[1:])
    # one command per root: two would race on its runs and reports
    lock = hold_root(cfg["out_root"], "--out_root")
    if cfg["threads"]:
        torch.set_num_threads(cfg["threads"])
    {"run": cmd_run, "report": cmd_report}[command](cfg)


if __name__ == "__main__":
    main()
