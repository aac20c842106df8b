"""
What ablate.py (the LM grid), sweep.py (the recall sweep) and uptrain.py (the conversion
comparison) share: resumable train.py runs in results folders (another script's run: run_script),
run many of them a few at a time, the learning-speed measures of an accuracy curve, and the
paired statistics their reports are judged by.

A run lives in its own folder (args.json, ckpt.pt, log.jsonl, train.out, and result.json once
scored). A result is reused only when its argv is the same run (same_run), so a report never
mixes settings.
"""
import glob
import json
import math
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from nanovha.config import flat_defaults, settings
from nanovha.loading import load_start
from nanovha.outputs import Busy, foreign_run_problem, hold
from nanovha.variants import RENAMED

# the repo: the scripts run from there
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# two-sided 5% critical values of Student's t for df = 1..30 (beyond 30 the df=30 value: slightly
# conservative)
T_CRIT = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
          2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
# the 80% quantile of Student's t for df = 1..30: t_crit + t_80 standard errors is the difference a
# two-sided 5% test detects with 80% power
T_80 = (1.376, 1.061, 0.978, 0.941, 0.920, 0.906, 0.896, 0.889, 0.883, 0.879, 0.876, 0.873, 0.870, 0.868, 0.866,
        0.865, 0.863, 0.862, 0.861, 0.860, 0.859, 0.858, 0.858, 0.857, 0.856, 0.856, 0.855, 0.855, 0.854, 0.854)


def parse_command(argv, commands, namespace, limits=None):
    """[command] [--smoke|--quick|--full|--size=NAME] [--key=value ...] -> (command, config with 'size'). namespace:
    the script's globals, whose flat defaults are its settings; a size other than full is the
    config file config/<script>/<size>.py, applied before the --key=value overrides."""
    argv = list(argv)
    command = argv.pop(0) if argv and not argv[0].startswith("--") else commands[0]
    if command not in commands:
        sys.exit(f"error: unknown command {command!r}: use {', '.join(commands[:-1])} or {commands[-1]} "
                 f"({commands[0]} is the default)")
    size, rest = "full", []
    for a in argv:
        if a in ("--smoke", "--quick", "--full") or a.startswith("--size="):
            size = a.split("=", 1)[1] if "=" in a else a[2:]
        else:
            rest.append(a)
    presets = os.path.join(ROOT, "config", os.path.splitext(os.path.basename(namespace["__file__"]))[0])
    sizes = ["full", *sorted(os.path.splitext(f)[0] for f in os.listdir(presets) if f.endswith(".py"))]
    if size not in sizes:
        sys.exit(f"error: unknown size {size!r}: use {', '.join(sizes)}")
    files = [] if size == "full" else [os.path.join(presets, f"{size}.py")]
    cfg = settings(flat_defaults(namespace), files + rest, limits=limits)
    cfg["size"] = size
    return command, cfg


def choose_variants(chosen, known):
    """'a,b' or 'all' -> the known variants named, in their canonical order."""
    names = list(known) if chosen == "all" else [v.strip() for v in chosen.split(",")]
    unknown = [v for v in names if v not in known]
    renamed = [f"{v} is now {RENAMED[v]}" for v in unknown if v in RENAMED]  # ablate.py's old names
    if unknown:
        sys.exit(f"error: unknown variant(s) {', '.join(unknown)}"
                 f"{' (' + '; '.join(renamed) + ')' if renamed else ''}; known: {', '.join(known)}")
    return [v for v in known if v in names]


# ---- resumable runs ----
def read_json(path):
    with open(path) as f:
        return json.load(f)


def write_json(path, obj):
    tmp = f"{path}.tmp{os.getpid()}"  # this process's own temp name: two writers never share one
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)  # a crash never leaves half a result (which would count as done)


def hold_root(root, flag):
    """One command at a time per results root (two would race on its runs and reports): the
    root's lock for this process's life. A root that is itself a run's folder is refused. Exits
    in one line naming the flag that set the root."""
    if problem := foreign_run_problem(root, flag, set()):
        sys.exit(f"error: {problem}")
    try:
        return hold(root, flag=flag)
    except Busy as e:
        sys.exit(f"error: {e}")


def same_run(a, b):
    """Two train.py argvs that train the same run, wherever its results folder lives: --out_dir
    and --data_dir are compared by their last names, so a results root that was moved or copied
    keeps its finished runs."""
    where = lambda args: [x.split("=", 1)[0] + "=" + os.path.basename(x)
                          if x.startswith(("--out_dir=", "--data_dir=")) else x for x in args]
    return where(a) == where(b)


def read_log(run_dir):
    with open(os.path.join(run_dir, "log.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def train(cfg, run_dir, args, iters):
    """Trains, resumes or reuses the train.py run in run_dir; returns (its log rows, a status
    note). A run that stopped early (train.py --stop_at_acc) is finished at its last checkpoint."""
    args_path, ckpt_path = os.path.join(run_dir, "args.json"), os.path.join(run_dir, "ckpt.pt")
    recorded = read_json(args_path) if os.path.exists(args_path) else args
    if not same_run(recorded, args):  # results of other settings must never be mixed into one table
        sys.exit(f"error: {run_dir} was started with other settings ({' '.join(recorded)}); use "
                 f"another results root")
    os.makedirs(run_dir, exist_ok=True)
    write_json(args_path, args)
    trained, resume, note = False, [], ""
    if os.path.exists(ckpt_path):
        try:
            step = load_start(ckpt_path)["iter_num"]
            trained = step >= iters or any(r.get("stopped") and r["iter"] == step for r in read_log(run_dir))
            resume = [] if trained else ["--init_from=resume"]  # train.py continues exactly
            note = "trained before, " if trained else f"resumed at step {step}, "
        except ValueError:  # a corrupt checkpoint: start this run again from scratch
            os.remove(ckpt_path)
    if not trained:
        run_script(cfg, run_dir, "train.py", [*args, *resume])
    return read_log(run_dir), note


def run_script(cfg, run_dir, script, args):
    """python SCRIPT ARGS from the repo root, its output appended to run_dir/<script>.out (train.py: train.out);
    a failure exits in one line with the output's last line."""
    out = os.path.join(run_dir, os.path.splitext(script)[0] + ".out")
    with open(out, "a") as f:
        env = dict(os.environ, **({"OMP_NUM_THREADS": str(cfg["threads"])} if cfg["threads"] else {}))
        rc = subprocess.run([sys.executable, os.path.join(ROOT, script), *args], cwd=ROOT, env=env,
                            stdout=f, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        with open(out) as f:
            tail = f.read().strip().splitlines()[-1:] or [""]
        sys.exit(f"error: {script} in {run_dir} failed (exit {rc}): {tail[0]} (full output: {out})")


def run_all(cfg, jobs, one, label):
    """Runs one(job) for every job, cfg['jobs'] at a time, printing label(job), its status and
    the time left."""
    t0, done = time.time(), [0, 0]  # finished, of which trained now (for the time estimate)

    def go(job):
        status = one(job)
        done[0] += 1
        done[1] += "done before" not in status
        # runs finish at the parallel rate
        left = (time.time() - t0) / max(done[1], 1) * (len(jobs) - done[0])
        print(f"[{done[0]}/{len(jobs)}] {label(job)}: {status}"
              + (f" (about {left / 60:.0f} min left)" if done[1] and done[0] < len(jobs) else ""), flush=True)

    with ThreadPoolExecutor(cfg["jobs"]) as pool:
        for f in [pool.submit(go, job) for job in jobs]:
            f.result()  # re-raises a failed run's SystemExit here


def load_results(root, pattern, keep):
    return [r for r in map(read_json, sorted(glob.glob(os.path.join(root, "runs", *pattern, "result.json"))))
            if keep(r)]


# ---- learning-speed measures, from a run's accuracy curve [[step, acc], ...] ----
def steps_to(curve, level, iters):
    """The step where the curve first reaches `level`, linear between the two evals around the
    crossing; a run that never gets there counts as the whole budget (so a mean over runs that
    fail is a lower bound)."""
    for (s0, a0), (s1, a1) in zip([curve[0]] + curve, curve):
        if a1 >= level:
            return s1 if a1 == a0 or s1 == s0 else s0 + (level - a0) / (a1 - a0) * (s1 - s0)
    return iters


def area(curve, iters):
    """Mean held-out accuracy over the run's steps (trapezoids between evals); after an early
    stop the curve stays at its last value to the end of the budget."""
    s, a = (np.array(v, dtype=float) for v in zip(*curve, (iters, curve[-1][1])))
    # any numpy
    return float(((a[1:] + a[:-1]) / 2 * np.diff(s)).sum() / iters) if iters else float(a[0])


# ---- statistics: paired over shared seeds ----
def paired(a, b):
    """a, b: {seed: value}. Differences a - b over the seeds both have -> (n, mean, SE, |t|, resolved):
    resolved = the paired t-test rejects 'no difference' at 5% (two-sided), which needs n >= 2;
    with zero spread (every seed the same difference), the exact sign test at 5% instead."""
    d = np.array([a[s] - b[s] for s in sorted(set(a) & set(b))], dtype=float)
    n = len(d)
    if n < 2:
        return n, float(d.mean()) if n else math.nan, math.nan, math.nan, False
    mean, se = float(d.mean()), float(d.std(ddof=1) / math.sqrt(n))
    # what float rounding leaves
    rounding = 1e-12 * max(1.0, *(abs(v) for v in (*a.values(), *b.values())))
    if se <= rounding:  # every seed the same difference (up to rounding): an exact sign test
        if abs(mean) <= rounding:  # no difference at all, up to rounding
            return n, 0.0, se, 0.0, False
        return n, mean, se, math.inf, 2 * 0.5 ** n < 0.05  # all n the same sign: needs n >= 6
    t = abs(mean) / se
    return n, mean, se, t, t > t_crit(n - 1)


def t_crit(df):
    """The two-sided 5% critical value of Student's t (df >= 1; past 30 the df=30 value, slightly
    conservative)."""
    return T_CRIT[min(df, len(T_CRIT)) - 1]


def resolvable(se, n):
    """The smallest difference the paired t-test on n seeds rejects at 5%, two-sided: t_crit(n -
    1) x SE."""
    return t_crit(n - 1) * se


def mde(se, n):
    """The minimum detectable effect for planning: the difference found with 80% power by a
    two-sided 5% paired test on n seeds with this SE, (t_crit(n - 1) + t_80(n - 1)) x SE (about
    2.8 SE for many seeds)."""
    return (t_crit(n - 1) + T_80[min(n - 1, len(T_80)) - 1]) * se


def seeds_for_power(sd, effect, most=1000):
    """The fewest seeds n >= 2 at which a per-seed spread sd (the std of the paired differences)
    gives an MDE at or below effect: mde(sd / sqrt(n), n) <= effect; None if even `most` seeds do
    not."""
    return next((n for n in range(2, most + 1) if mde(sd / math.sqrt(n), n) <= effect), None)


def t_p_value(t, df, steps=20_000):
    """Two-sided p-value of |t| under Student's t with df degrees of freedom: 1 - the density's integral over
    [-|t|, |t|] (Simpson's rule on the exact density)."""
    t = abs(t)
    if math.isinf(t):
        return 0.0
    c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    x = np.linspace(0.0, t, steps + 1)
    f = np.exp(c - (df + 1) / 2 * np.log1p(x * x / df))
    inside = 2 * (t / steps / 3) * (f[0] + f[-1] + 4 * f[1:-1:2].sum() + 2 * f[2:-1:2].sum())
    return float(min(1.0, max(0.0, 1.0 - inside)))


def holm(p_values, alpha=0.05):
    """Holm's step-down correction over a family of tests: {name: p} -> {name: rejected at
    family-wise alpha}."""
    rejected, still = {}, True
    for i, (name, p) in enumerate(sorted(p_values.items(), key=lambda kv: kv[1])):
        still = still and p <= alpha / (len(p_values) - i)
        rejected[name] = still
    return rejected


def clopper_pearson(k, n, alpha=0.05):
    """The exact (Clopper-Pearson) two-sided 1 - alpha interval of a success rate, k successes in
    n runs: the p at which P(X >= k) = alpha / 2 and the p at which P(X <= k) = alpha / 2, found
    by bisection on the binomial tails."""
    def at_least(j, p):  # P(X >= j), increasing in p
        return sum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(j, n + 1))

    def solve(j, target):
        lo, hi = 0.0, 1.0
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if at_least(j, mid) < target else (lo, mid)
        return (lo + hi) / 2
    return (0.0 if k == 0 else solve(k, alpha / 2)), (1.0 if k == n else solve(k + 1, 1 - alpha / 2))


def mcnemar(a, b):
    """Exact McNemar test of success rates, a, b: {seed: bool}. -> (seeds only a succeeded, only
    b, two-sided p): a sign test on the discordant seeds, since concordant seeds say nothing
    about which is better."""
    seeds = sorted(set(a) & set(b))
    only_a, only_b = sum(a[s] and not b[s] for s in seeds), sum(b[s] and not a[s] for s in seeds)
    n = only_a + only_b
    p = min(1.0, 2 * sum(math.comb(n, k) for k in range(min(only_a, only_b) + 1)) / 2 ** n) if n else 1.0
    return only_a, only_b, p


def parse_primary(text, variants):
    """A plan's comparisons, "a-b,c-d" -> [(a, b), (c, d)], each two of `variants`; SystemExit
    (one line) if not."""
    pairs = [tuple(item.strip().split("-")) for item in text.split(",") if item.strip()]
    for pair in pairs:
        if len(pair) != 2 or not set(pair) <= set(variants):
            sys.exit(f"error: primary: {'-'.join(pair)!r} is not two of this run's variants "
                     f"({', '.join(variants)}) "
                     "as first-second, e.g. vha-gqa2")
    return pairs


def primary_lines(values, what, scale=1.0, digits=4):
    """A plan's comparisons, {(a, b): ({seed: a's value}, {seed: b's value})} -> report lines:
    the paired difference over shared seeds, its 95% interval (t_crit x SE), the two-sided p
    (t_p_value) and Holm's verdict over them."""
    stats = {pair: paired(*ab) for pair, ab in values.items()}
    p = {pair: t_p_value(t, n - 1) if n > 1 else 1.0 for pair, (n, _, _, t, _) in stats.items()}
    rejected = holm(p)
    lines = ["## Primary comparisons (Holm-corrected)", "",
             f"Δ {what}, first minus second over every seed both ran; two-sided paired t-test, Holm's step-down "
             f"correction over these {len(values)} at a family-wise 5%.", "",
             f"| comparison | Δ {what} | 95% interval | p | Holm at 5% |", "|---|---|---|---|---|"]
    for pair, (n, mean, se, t, _) in stats.items():
        half = t_crit(n - 1) * se if n > 1 else math.nan
        lines.append(f"| {pair[0]} - {pair[1]} | "
                     f"{fmt_paired(n, mean, se, t, False, scale, digits)} | "
                     f"{(mean - half) * scale:+.{digits}f} to {(mean + half) * scale:+.{digits}f} | {p[pair]:.2g} | "
                     f"{'rejected' if rejected[pair] else 'not rejected'} |")
    return lines + [""]


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


def pyplot():
    """matplotlib.pyplot without a display, or None (and a note) where it is not installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        return plt
    except ImportError:
        print("matplotlib is not installed: no plot (pip install matplotlib)")
        return None
