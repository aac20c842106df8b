"""
One row of the table of CPU kinds (docs/benchmarks.md, README), measured on the machine at hand
with the commands a user runs. Run it with nothing else on the machine; it prints what it runs,
every figure, the row, and a JSON line.

    python lab/cpu_report.py                         # minutes, most of them package builds (docs: how long)
    python lab/cpu_report.py --busy_fold=True        # fold.py beside a CPU-bound process: the plan must hold

1. Training: train.py on the demo config for train_iters iterations in a fresh cache: the dtype its plan
   picks, with both step times, and the run's ms/iteration. (Speed does not depend on how long a model trained.)
2. fold -> sample: fold.py on that checkpoint (it builds the packages and times the plan), then sample.py
   under default flags on ckpt_folded.pt and on ckpt.pt (greedy, gen_tokens): tok/s and whether the texts are
   equal; then every candidate forced (--dtype x --compile), and the default over the fastest of them (the
   default and the candidates run `rounds` times in turn, each keeping its best: one slow run is the VM).
3. Decode against llama.cpp: bench_decode.py on the folded VHA model at 1K, 4K and 16K in the planned
   dtype: ours / llama.cpp per context, the fixed cost per token of each, and the copy bandwidth's share at 16K.
"""
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from nanovha.config import at_least, flat_defaults, settings  # noqa: E402 (the repo root first)
from nanovha.hardware import cpu_bf16_support, cpu_kind  # noqa: E402

train_iters = 100
gen_tokens = 500
samples = 5  # sample.py --num_samples: tok/s is the median of these
# the default and every forced candidate run this many times, alternating; each keeps its best
rounds = 2
contexts = "1024,4096,16384"
busy_fold = False  # run fold.py beside a CPU-bound process (a busy loop on one core)
bench = True  # part 3 (bench_decode.py against llama.cpp); False: parts 1 and 2 only
work_dir = ""  # "": a fresh temporary folder (runs and cache), removed by the system later
config = settings(flat_defaults(globals()), sys.argv[1:], limits={"train_iters": at_least(1), "samples": at_least(1),
                                                                   "rounds": at_least(1)})
globals().update(config)


def command(*args, env=None):
    """Runs a repo command like a user would; -> its stdout + stderr (exits on failure, printing
    them)."""
    print("+ python " + " ".join(args), flush=True)
    proc = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        sys.exit(f"error: {args[0]} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout, proc.stderr


def lscpu_model():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        return re.search(r"Model name:\s*(.+)", out).group(1).strip()
    except (OSError, AttributeError):
        return "unknown (no lscpu)"


def tok_s(stdout):
    """The median tok/s of sample.py's timing lines."""
    return statistics.median(float(x) for x in re.findall(r"then (\d+) tok/s", stdout))


def sample(env, out_dir, *flags):
    """sample.py greedy from the default start: (the first text, median tok/s, its plan line)."""
    out, err = command("sample.py", f"--out_dir={out_dir}", "--temperature=0", f"--num_samples={samples}",
                       f"--max_new_tokens={gen_tokens}", *flags, env=env)
    plan = next((line for line in err.splitlines() if line.startswith("plan: ")), "")
    return out.split("\n---------------")[0], tok_s(out), plan


def train_and_fold(env, out_dir):
    out, _ = command("train.py", "config/vha_small.py", f"--out_dir={out_dir}", f"--max_iters={train_iters}",
                     f"--eval_interval={train_iters}", "--eval_iters=5", env=env)
    plan = next(line for line in out.splitlines() if line.startswith("dtype "))
    # the first includes warm-up
    ms = [float(x) for x in re.findall(r"iter \d+: .*, (\d+) ms/iter", out)][1:]
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy_fold else None
    try:
        fold_out, _ = command("fold.py", f"--out_dir={out_dir}", env=env)
    finally:
        if burner:
            burner.kill()
    return plan, statistics.median(ms) if ms else None, next(x for x in fold_out.splitlines() if x.startswith("plan: "))


def fold_to_sample(env, out_dir):
    """sample.py under default flags on both checkpoints, and every forced candidate on the
    folded one; the default and the candidates run `rounds` times in turn, each keeping its best
    tok/s (noise only slows a run)."""
    dtypes = ["float32", "bfloat16"] if cpu_bf16_support()[0] else ["float32"]
    flags = {f"{'compiled' if c == 'True' else 'eager'} {d}": (f"--dtype={d}", f"--compile={c}")
             for d in dtypes for c in ("True", "False")}
    folded, trained, forced = None, sample(env, out_dir), {}
    for _ in range(rounds):
        text, tps, plan = sample(env, out_dir, "--ckpt_name=ckpt_folded.pt")
        folded = (text, max(tps, folded[1]), plan) if folded else (text, tps, plan)
        for name, (dtype, compiled) in flags.items():
            tps = sample(env, out_dir, "--ckpt_name=ckpt_folded.pt", dtype, compiled)[1]
            forced[name] = max(tps, forced.get(name, 0.0))
    return folded, trained, forced


def decode_vs_llama(env):
    out, _ = command("bench_decode.py", "--variants=vha_folded", f"--contexts={contexts}", env=env)
    result = json.loads(out.strip().splitlines()[-1])
    print("\n".join(line for line in out.splitlines()[:-1] if "plan" in line or "ours (" in line))
    ratios = (result.get("llama_cpp") or {}).get("ours_over_llama_cpp", {}).get("vha_folded@llama.cpp", {})
    first = result["runtimes"][0]
    fixed = {b["variant"]: b["ms_ctx1"] for b in result["breakdown"]}
    top = max(r["ctx"] for r in result["results"])
    at = {(r["variant"], r["runtime"], r["ctx"]): r for r in result["results"]}
    bw = at[("vha_folded", first, top)]["bw_frac"]
    return dict(dtype=result["dtype"], runtime=first, ratios=ratios.get(first, {}), fixed_ms=fixed, bw_frac_top=bw,
                top=top)


def main():
    folder = work_dir or tempfile.mkdtemp(prefix="cpu_report_")
    # a fresh cache: every plan measured here
    env = dict(os.environ, NANOVHA_CACHE=os.path.join(folder, "cache"))
    out_dir = os.path.join(folder, "demo")
    kind = f"{lscpu_model()} [{cpu_kind()}]"
    print(f"cpu: {kind}; runs and cache in {folder}")
    train_plan, ms_iter, fold_plan = train_and_fold(env, out_dir)
    (text_f, tps_f, plan_f), (text_t, tps_t, plan_t), forced = fold_to_sample(env, out_dir)
    fastest = max(forced, key=forced.get)
    decode = decode_vs_llama(env) if bench else dict(dtype="-", runtime="-", ratios={}, fixed_ms={}, bw_frac_top=0,
                                                     top="- (not run)")
    report = dict(cpu=kind, train_plan=train_plan, ms_per_iter=ms_iter, fold_plan=fold_plan, busy_fold=busy_fold,
                  sample_plan=plan_f, sample_tok_s=tps_f, sample_ckpt_tok_s=tps_t, forced_tok_s=forced,
                  default_over_fastest=tps_f / forced[fastest], same_text=text_f == text_t, decode=decode)
    print(f"\ntraining ({train_iters} iterations of config/vha_small.py): {train_plan}; {ms_iter} ms/iter")
    print(f"fold.py{' beside a busy loop' if busy_fold else ''}: {fold_plan}")
    print(f"sample.py (defaults, greedy, {gen_tokens} tokens, median of {samples}, best of {rounds} runs): "
          f"ckpt_folded.pt {tps_f:,.0f} tok/s, "
          f"ckpt.pt {tps_t:,.0f}; texts {'equal' if text_f == text_t else 'DIFFERENT'}; {plan_f}")
    print("forced: " + ", ".join(f"{name} {x:,.0f} tok/s" for name, x in forced.items())
          + f"; default / fastest ({fastest}) {tps_f / forced[fastest]:.2f}x")
    ratios = ", ".join(f"{float(c) / 1024:.0f}K {x:.2f}x" for c, x in decode["ratios"].items())
    fixed = ", ".join(f"{k} {v:.2f} ms" for k, v in decode["fixed_ms"].items())
    print(f"bench_decode ({decode['dtype']}, {decode['runtime']}): ours / llama.cpp "
          f"{ratios or 'not timed'}; "
          f"fixed cost per token {fixed}; folded VHA {decode['bw_frac_top']:.0%} of copy bandwidth at {decode['top']}")
    print(f"\n| {kind} | {train_plan.split()[1].rstrip(':')} ({ms_iter:.0f} ms/iter) | "
          f"{tps_f:,.0f} tok/s, "
          f"{tps_f / forced[fastest]:.2f}x the fastest ({fastest}) | "
          f"{'equal' if text_f == text_t else 'DIFFERENT'} | "
          f"{ratios} |")
    print(json.dumps(report))


if __name__ == "__main__":
    main()
