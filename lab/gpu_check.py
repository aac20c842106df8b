"""
The GPU check: one command that runs the repo's GPU path on a rented GPU, step by step, and keeps
its report even when the hour runs out (docs/gpu.md: what it costs, what to paste where).

    python3 lab/gpu_check.py --out=gpu-report --minutes=20
    python lab/gpu_check.py --out=gpu-dry --dry_run=True      # the CPU at toy sizes: every step runs

Each step is a child process under its own limit (STEPS), its output in <out>/logs/<step>.log. It
appends JSON lines to <out>/<step>.jsonl as it measures (lab/gpu_steps.py, bench.py and
bench_decode.py with --figures; the smoke run's train.py log), and <out>/report.md is rendered
from them after every step, so a step that is cut loses only itself. Steps that do not fit in
--minutes are skipped, and the plan printed first says which. The exit status is 0 when every
step that ran passed. Nothing is downloaded: the smoke run trains on data/synthetic, made here.
"""
import glob
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from nanovha.config import at_least, flat_defaults, settings, stop_if  # noqa: E402
from nanovha.outputs import output_problem  # noqa: E402
from nanovha.processes import run_limited  # noqa: E402

out = "gpu-report"  # a new folder: report.md, <step>.jsonl, logs/
minutes = 25  # the time you have; steps whose limits do not fit are skipped
dry_run = False  # the CPU at toy sizes: checks that every step runs
config = settings(flat_defaults(globals()), sys.argv[1:], limits={"minutes": at_least(1)})
out, dry = os.path.abspath(config["out"]), config["dry_run"]
PY = sys.executable
TINY = ["--n_layer=1", "--n_embd=64", "--head_dim=16", "--vocab_size=128", "--device=cpu"]
TINY_TRAIN = [*TINY, "--compile=True", "--train_variants=vha,gqa2"]
TRAIN = ["--n_embd=768", "--n_head=16", "--head_dim=64", "--vocab_size=50304", "--batch_size=16",
         "--block_size=1024", "--train_steps=10", "--warmup=3", "--compile=True", "--dtype=bfloat16",
         "--train_variants=vha,gqa2", "--device=cuda"]
SMOKE = (["--n_layer=1", "--n_embd=64", "--n_head=4", "--head_dim=16", "--block_size=64", "--batch_size=4",
          "--gradient_accumulation_steps=1", "--max_iters=30", "--eval_interval=15", "--eval_iters=2",
          "--device=cpu", "--dtype=float32"] if dry else [])
DECODE = (["--contexts=128,256", "--decode_steps=3", "--warmup=1", "--copy_mib=16", "--dtype=float32", *TINY]
          if dry else ["--contexts=1024,16384,131072", "--dtype=bfloat16", "--matmul_n=8192", "--device=cuda"])
# name: (limit s, command), the small model before the 120M. A limit is the step's cold compile on a 2-core CPU
# (its dry run with a cold inductor cache; the 120M's 12 layers at toy width) times 4, plus the step's own work
# on an H100 by its FLOPs at 40% MFU (the smoke run's 300 iterations: 80 s); docs/gpu.md has the figures.
STEPS = {
    "preflight": (90, [PY, "lab/gpu_steps.py", "preflight"]),
    "correctness": (90, [PY, "lab/gpu_steps.py", "correctness"]),
    "kernels": (60, [PY, "lab/gpu_steps.py", "kernels"]),
    "smoke": (300, [PY, "train.py", "config/fineweb/vha.py", "config/fineweb/smoke.py", "--dataset=synthetic",
                    f"--data_dir={out}/data", f"--out_dir={out}/smoke", "--compile=True", *SMOKE]),
    "train-small": (180, [PY, "bench.py", *(TINY_TRAIN if dry else ["--n_layer=2", *TRAIN])]),
    "train-120M": (480, [PY, "bench.py", *(TINY_TRAIN[1:] + ["--n_layer=2"] if dry else ["--n_layer=12", *TRAIN])]),
    "decode": (240, [PY, "bench_decode.py", "--variants=mha,vha_folded", "--compile=graphs", "--llama_cpp=False",
                     *DECODE]),
}


def figures_of(step):
    """The JSON lines a step appended so far (a line cut mid-write is dropped)."""
    path = f"{out}/smoke/log.jsonl" if step == "smoke" else f"{out}/{step}.jsonl"
    rows = []
    for line in open(path) if os.path.exists(path) else []:
        try:
            rows.append(json.loads(line))
        except ValueError:
            pass
    return rows


def judged(step, code):
    """PASS, FAIL or CUT: the exit status, every figure's ok, and for the smoke run a falling loss."""
    rows = figures_of(step)
    if code is None:
        return "CUT"
    evals = [r["val_loss"] for r in rows if "val_loss" in r]
    fell = step != "smoke" or (len(evals) >= 2 and evals[-1] < evals[0])
    return "PASS" if code == 0 and fell and all(r.get("ok", True) for r in rows) else "FAIL"


def table(rows, keys):
    """A markdown table of rows (dicts) over keys; floats to 4 significant digits."""
    cell = lambda v: f"{v:.4g}" if isinstance(v, float) else "-" if v is None else str(v)
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    return lines + ["| " + " | ".join(cell(r.get(k)) for k in keys) + " |" for r in rows]


def render(status):
    """report.md from the JSON lines and logs as they stand."""
    env = next(iter(figures_of("preflight")), {})
    hbm = (env.get("spec") or [None, None])[1]
    lines = [f"# GPU check: {env.get('gpu', '?')}", "",
             f"driver {env.get('driver')}, CUDA {env.get('cuda')}, torch {env.get('torch')}, python "
             f"{env.get('python')}; `{' '.join(['python3', 'lab/gpu_check.py', *sys.argv[1:]])}`, "
             f"{time.strftime('%Y-%m-%d %H:%M')}", ""]
    lines += table([dict(step=s, status=status[s][0], seconds=status[s][1], limit=STEPS[s][0])
                    for s in STEPS if s in status], ["step", "status", "seconds", "limit"])
    for step in STEPS:
        rows = figures_of(step)
        lines += ["", f"## {step}: {status.get(step, ('not run',))[0]}", ""]
        if step == "smoke":
            rows = [r for r in rows if "val_loss" in r or "tok_per_s" in r]
            lines += table(rows[-6:], ["iter", "loss", "val_loss", "tok_per_s", "mfu", "compiled_graphs",
                                       "graph_breaks", "cudagraph_skips"])
        elif step.startswith("train"):
            lines += table(rows, ["variant", "tok_s", "mfu", "ms_per_step", "first_step_s", "compile_counters"])
        elif step == "decode":
            for r in rows:
                r["of_hbm_spec"] = r["gb_s"] * 1e9 / hbm if hbm else None
            lines += table(rows, ["variant", "runtime", "ctx", "decode_ms", "gb_s", "of_hbm_spec", "kv_cache_mb"])
        else:
            lines += table(rows[1:] if step == "preflight" else rows, ["check", "value", "ok"])
        log = f"{out}/logs/{step}.log"
        skips = sorted({x.strip() for x in open(log) if "skipping cudagraphs" in x}) if os.path.exists(log) else []
        lines += [f"- CUDA graphs skipped: {x}" for x in skips]
    with open(f"{out}/report.md", "w") as f:
        f.write("\n".join(lines) + "\n")


def main():
    if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
        stop_if(f"--out={config['out']} exists and is not an empty folder; the check writes a new one: give another")
    stop_if(output_problem({"--out": out}, {}))
    os.makedirs(f"{out}/logs", exist_ok=True)
    budget, fits = config["minutes"] * 60, []
    for name, (limit, _) in STEPS.items():
        if sum(STEPS[n][0] for n in fits) + limit <= budget:
            fits.append(name)
    print(f"gpu check: {len(fits)} steps, at most {sum(STEPS[n][0] for n in fits) / 60:.0f} minutes "
          f"({', '.join(f'{n} {STEPS[n][0]} s' for n in fits)})"
          + "".join(f"; {n} skipped: it does not fit in --minutes={config['minutes']}" for n in STEPS if n not in fits),
          flush=True)
    env = dict(os.environ, TORCH_LOGS="perf_hints", PYTHONUNBUFFERED="1")  # CUDA-graph skips, with their cause
    status = {name: ("SKIPPED", 0) for name in STEPS if name not in fits}
    for name in fits:
        limit, command = STEPS[name]
        extra = [f"--out={out}/{name}.jsonl", f"--dry_run={dry}"] if "gpu_steps" in command[1] else (
            [f"--figures={out}/{name}.jsonl"] if command[1] != "train.py" else [])
        t0 = time.time()
        with open(f"{out}/logs/{name}.log", "w") as log:
            try:
                code = run_limited([*command, *extra], limit, output=log, cwd=ROOT, env=env)[0]
            except subprocess.TimeoutExpired:
                code = None
        status[name] = (judged(name, code), round(time.time() - t0))
        print(f"{name}: {status[name][0]} in {status[name][1]} s (log: {out}/logs/{name}.log)", flush=True)
        render(status)
    print(f"report: {out}/report.md")
    sys.exit(0 if all(status[name][0] == "PASS" for name in fits) else 1)


if __name__ == "__main__":
    main()
