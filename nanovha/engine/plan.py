"""
The plan: which runtime, dtype and attention kernel run a job fastest on this machine, timed on
the job itself and kept in a plan file beside the compiled packages (as FFTW keeps its wisdom).

    plan = decode_plan(model, (16, 512))  # sample.py, fold.py, bench_decode.py: from 16 to 512
    print(plan)          # plan: compiled bfloat16, attention nanovha, N ms/token (fastest of 4, ..)
    generate(plan.model, idx, 100, decode=plan.step)
    plan = train_plan(step, key)  # train.py: float32 against bf16 autocast on the run's own step

How a choice is made, and what a plan file holds: docs/benchmarks.md (the plan).
"""
import copy
import datetime
import hashlib
import json
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Optional

import torch

from data.common import cache_dir
from nanovha.engine import kernel as our_op
from nanovha.engine.compiled import compiled_decode, package_path
from nanovha.hardware import (choose_decode_dtype, cpu_bf16_support, cpu_kind, dtype_name, measure,
                              others_busy, timed, torch_dtype)
from nanovha.kernels import DECODE_KERNELS, static_attention, use_decode_layout
from nanovha.outputs import folder_problem, not_a_folder_problem, written_whole

MARGIN = 0.05  # a candidate is beaten when the fastest is more than 5% faster
BUSY_MARGIN = 0.25  # on a busy machine only a large gap leaves the safe choice
ROUNDS = 5
MIN_S = 0.1  # seconds per candidate per round: fifty 2-ms steps, one 0.3-s training step
BUSY_CORES = 0.25  # other processes' use of the CPU above which a plan is provisional
EMULATED = 3.0  # a bf16 warm-up this many times float32's: emulated, out
RUNTIMES = ("compiled", "eager")


def label(runtime, dtype):
    """A candidate's name: "compiled bfloat16"; a training dtype alone."""
    return f"{runtime} {dtype_name(dtype)}" if runtime else dtype_name(dtype)


def fmt(seconds, unit):
    return f"{seconds * 1e3:.3f} ms/{unit}" if seconds < 0.1 else f"{seconds:.3f} s/{unit}"


@dataclass
class Plan:
    """What a command runs, and why."""
    runtime: Optional[str]  # "compiled" (AOTInductor; CUDA graphs on a GPU), "eager"; None: training
    dtype: torch.dtype  # of the weights and cache (decode), of autocast (training)
    attention: Optional[str]  # a compiled step's one-token attention: "sdpa" or "nanovha"
    why: str  # the reason, in a few words
    seconds: dict = field(default_factory=dict)  # {candidate: seconds per token (or step)}
    unit: str = "token"
    details: list = field(default_factory=list, repr=False)  # every figure: --verbose, JSON
    model: object = field(default=None, repr=False)  # decode: the model in this dtype and layout
    step: object = field(default=None, repr=False)  # decode: the compiled step, or None (eager)

    def __str__(self):
        name = label(self.runtime, self.dtype)
        attention = f", attention {self.attention}" if self.attention else ""
        figure = f", {fmt(self.seconds[name], self.unit)}" if name in self.seconds else ""
        return f"plan: {name}{attention}{figure} ({self.why})"


# ---- deciding
def beaten(times, name, by, margin=MARGIN):
    """Whether `by` beats `name` by more than margin in the median of the per-round ratios and in
    80% of the rounds (both ran in each round, so noise hits them alike)."""
    ratios = [t / u for t, u in zip(times[name], times[by])]
    return statistics.median(ratios) > 1 + margin and sum(x > 1 for x in ratios) >= 0.8 * len(ratios)


def choose(times, margin=MARGIN):
    """times: {candidate: [s per round]} in safety order -> (chosen, the candidates not told apart
    from it). The fastest by median where it beats every safer one; else the safest it does not."""
    medians = {name: statistics.median(ts) for name, ts in times.items()}
    fastest = min(medians, key=medians.get)
    chosen = next(n for n in times if n == fastest or not beaten(times, n, fastest, margin))
    tied = [n for n in times if n != chosen and not beaten(times, n, chosen, margin)
            and not beaten(times, chosen, n, margin)]
    return chosen, tied


def margin_for(busy_cores):
    return BUSY_MARGIN if busy_cores is not None and busy_cores > BUSY_CORES else MARGIN


def reason(job, names, chosen, unit, asked=""):
    """Why `chosen` of `names`, in a few words: what the command asked, how it won, when."""
    if job is None:
        return "; ".join(filter(None, [asked, "the only candidate, not timed"]))
    times = {name: job["rounds"][name] for name in names}
    margin = margin_for(job["busy_cores"])
    others = sorted((statistics.median(ts), n) for n, ts in times.items() if n != chosen)
    if not others:
        how = "the only candidate"
    elif statistics.median(times[chosen]) > others[0][0]:  # not beaten by the fastest: say which test failed
        ratios = [t / u for t, u in zip(times[chosen], times[others[0][1]])]
        faster = f"{others[0][1]} ({fmt(others[0][0], unit)})"
        how = (f"{faster} faster in only {sum(x > 1 for x in ratios)} of {len(ratios)} rounds: the safer kept"
               if statistics.median(ratios) > 1 + margin else f"within {margin:.0%} of {faster}: the safer kept")
    else:
        tie = f", within {margin:.0%}" if choose(times, margin)[1] else ""
        how = f"fastest of {len(names)}{tie}, next {others[0][1]} {fmt(others[0][0], unit)}"
    when = "measured now" if job.get("fresh") else f"cached {job['when'][:10]} by {job['by']}"
    busy = f", busy machine ({job['busy_cores']:.1f} cores): provisional" if job["provisional"] else ""
    return "; ".join(filter(None, [asked, how, when + busy]))


def describe(title, job, unit):
    """A job's lines for --verbose: each candidate's time, the chosen marked, when and how."""
    busy = "" if job["busy_cores"] is None else f"other processes {job['busy_cores']:.2f} cores, "
    lines = [f"{title}, measured {job['when']} by {job['by']} ({job['how']}; {busy}"
             f"{margin_for(job['busy_cores']):.0%} margin{', PROVISIONAL' * job['provisional']}):"]
    for s, name in sorted((statistics.median(ts), n) for n, ts in job["rounds"].items()):
        lines.append(f"  {name:<18} {fmt(s, unit)}" + "  <- chosen" * (name == job["chosen"]))
    return lines


# ---- the plan file
def cache_folder(folder=""):
    """Where compiled packages and plans are kept: folder, else <cache>/compiled."""
    return folder or os.path.join(cache_dir(), "compiled")


def cache_problem(folder, build, flag="--compile_cache"):
    """Why the cache folder cannot serve a command, checked before any work, or None: it must be
    a folder (or be made one), and writable where the command builds compiled steps; a read-only
    one still serves the steps and plans it holds."""
    folder = cache_folder(folder)
    return folder_problem(folder, flag) if build else not_a_folder_problem(folder, flag)


def plan_path(folder, *parts):
    """folder/plan-<sha256 of what the timings depend on, machine and torch included>.json"""
    env = [cpu_kind(), torch.__version__, torch.get_num_threads()]
    key = hashlib.sha256(json.dumps([*parts, *env], default=str).encode()).hexdigest()[:16]
    return os.path.join(cache_folder(folder), f"plan-{key}.json")


def seconds_ok(value):
    return type(value) in (int, float) and math.isfinite(value) and value > 0


def job_problem(job):
    """Why a plan file's job is not one this code writes, checked by type and value, or None."""
    if not isinstance(job, dict) or not isinstance(job.get("rounds"), dict) or not job["rounds"]:
        return "no timings"
    rounds = job["rounds"].values()
    if not all(isinstance(ts, list) and ts and all(map(seconds_ok, ts)) for ts in rounds):
        return "timings that are not positive seconds"
    if len({len(ts) for ts in rounds}) > 1 or job.get("chosen") not in job["rounds"]:
        return "rounds of different lengths, or a choice that is not a candidate"
    busy = job.get("busy_cores")
    if busy is not None and not (type(busy) in (int, float) and math.isfinite(busy) and busy >= 0):
        return "busy_cores that is not a number of cores"
    if not isinstance(job.get("provisional"), bool):
        return "provisional that is not true or false"
    return next((f"{key} that is not text" for key in ("when", "by", "how") if not isinstance(job.get(key), str)),
                None)


def read_jobs(path, say=False):
    """The plan file's jobs that pass job_problem; {} where there is no file. say: print a note
    for a file that cannot be read and for each job left out (it is measured again)."""
    try:
        with open(path) as f:
            jobs = json.load(f)["jobs"]
        if not isinstance(jobs, dict):
            raise ValueError("its jobs are not a table")
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, TypeError, KeyError) as e:
        if say:
            why = getattr(e, "strerror", None) or e
            print(f"note: the plan file {path} cannot be read ({why}); measured again", file=sys.stderr)
        return {}
    for name, problem in ((n, job_problem(job)) for n, job in jobs.items()):
        if problem and say:
            print(f"note: the plan file {path}: job {name!r} has {problem}; measured again", file=sys.stderr)
    return {name: job for name, job in jobs.items() if not job_problem(job)}


def timed_job(path, name, timer, needed, replan=False, by="sample.py"):
    """Job `name` of the plan file at path, read back where it is quiet and has timed every
    candidate in `needed`; else timer() -> ({candidate: [s per round]}, busy cores, how) now, the
    choice made and the file written whole (a note where it cannot be)."""
    job = None if replan else read_jobs(path, say=True).get(name)
    if job and not job["provisional"] and set(needed) <= set(job["rounds"]):
        return job
    times, busy, how = timer()
    job = dict(rounds=times, chosen=choose(times, margin_for(busy))[0], busy_cores=busy, how=how,
               provisional=busy is not None and busy > BUSY_CORES, by=by,
               when=datetime.datetime.now().isoformat(timespec="seconds"))
    try:
        with written_whole(path) as tmp, open(tmp, "w") as f:
            json.dump(dict(machine=cpu_kind(), jobs={**read_jobs(path), name: job}), f)
    except OSError as e:
        print(f"note: the plan was not saved to {path} ({e.strerror or e}); measured again next time",
              file=sys.stderr)
    return dict(job, fresh=True)


# ---- timing on the job itself
def context_range(first, last):
    """The (short, long) contexts a plan is measured at for a generation from position `first` to
    `last`: powers of two around them (at least 16), so nearby lengths share one job."""
    lo = max(16, 1 << max(0, first.bit_length() - 1))
    return lo, max(lo, 1 << max(0, (last - 1).bit_length()))


def random_context(model, ctx, max_len, batch_size=1):
    """A fresh cache of max_len positions, the first ctx random: decode timed without a prefill."""
    model.setup_cache(batch_size, max_len)
    with torch.no_grad():
        for cache in model.kv_caches():
            cache.k[:, :, :ctx].normal_()
            cache.v[:, :, :ctx].normal_()


def measure_at(contexts, calls_at):
    """Times the calls calls_at(ctx) makes ({name: fn}) at both contexts -> ({name: [s per round,
    the mean of the two contexts]}, the cores other processes kept busy meanwhile): a generation
    from the short context to the long one spends about that per token."""
    stop = others_busy()
    short, long = (measure(calls_at(ctx), ROUNDS, MIN_S)[0] for ctx in contexts)
    return {n: [(a + b) / 2 for a, b in zip(short[n], long[n])] for n in short}, stop()


def decode_step_at(model, ctx, step=None, span=16):
    """A call decoding one token at positions ctx .. ctx+span-1 in turn, eager or by a step."""
    random_context(model, ctx, ctx + span)
    token, calls = torch.zeros(1, 1, dtype=torch.long), [0]

    def call():
        pos, calls[0] = ctx + calls[0] % span, calls[0] + 1
        with torch.inference_mode():
            return model.decode_one_token(token, pos) if step is None else step(token, torch.tensor([pos]))
    return call


def attention_calls(model, ctx):
    """{kernel: the one-token attention of every layer over the model's own ctx cached positions}."""
    heads, k_dim, v_dim = model.blocks[0].attn.cache_dims
    random_context(model, ctx, ctx + 16)
    group, dtype = model.cfg.n_head // heads, model.embed.weight.dtype
    qs = [torch.randn(1, heads, group, k_dim, dtype=dtype) for _ in model.blocks]
    pos = torch.tensor([ctx - 1])

    def call(kernel):  # MLA keeps its [latent ; RoPE key] rows in k: its values too
        with torch.inference_mode():
            return [static_attention(q, c.k, c.v if v_dim else c.k, pos, kernel)
                    for q, c in zip(qs, model.kv_caches())]
    return {kernel: (lambda kernel=kernel: call(kernel)) for kernel in DECODE_KERNELS}


# ---- the attention kernel of a compiled step: SDPA or ours
def choose_attention(model, contexts, folder="", replan=False, by="sample.py"):
    """-> (kernel, job or None): the one-token attention of the model's compiled step here, SDPA
    or ours (kernel.py), timed on that attention alone at both contexts; SDPA where ours cannot
    be loaded."""
    if not our_op.load():
        return "sdpa", None
    heads, k_dim, v_dim = model.blocks[0].attn.cache_dims
    shape = (heads, k_dim, v_dim, model.cfg.n_head // heads, len(model.blocks), str(model.embed.weight.dtype))
    path = plan_path(folder, "attention", shape, DECODE_KERNELS, our_op.source_digest())
    how = f"the attention alone at contexts {contexts[0]} and {contexts[1]}, {ROUNDS} rounds"
    timer = lambda: (*measure_at(contexts, lambda ctx: attention_calls(model, ctx)), how)
    job = timed_job(path, f"attention {contexts[0]}-{contexts[1]}", timer, DECODE_KERNELS, replan, by)
    return job["chosen"], job


def attention_for(model, folder, contexts, build, replan, by):
    """-> (the compiled step's kernel, whether its package is cached, detail lines, the planned
    kernel): the planned one; where no package will be built, the other where only its package is
    cached (and the op loads)."""
    planned, job = choose_attention(model, contexts, folder, replan, by)
    title = f"attention in {dtype_name(model.embed.weight.dtype)}"
    lines = describe(title, job, "token") if job else [f"{title}: sdpa (ours cannot be loaded)"]
    usable = [k for k in DECODE_KERNELS if k == "sdpa" or our_op.load()]
    have = [] if build else [k for k in usable if os.path.exists(package_path(model, folder, kernel=k))]
    kernel = have[0] if have and planned not in have else planned
    if kernel != planned:
        lines.append(f"  {kernel}: the package at hand (a new plan picks {planned})")
    return kernel, kernel in have, lines, planned


# ---- the two plans the commands make
def decode_plan(model, contexts, folder="", dtypes=None, runtimes=RUNTIMES, build=False, replan=False,
                by="sample.py"):
    """The fastest of {compiled, eager} x {float32, bf16 where native} for decoding `model`
    (batch 1, CPU) over contexts (short, long), from the plan file in folder or measured now ->
    Plan, its model a copy in the chosen dtype and layout. dtypes, runtimes: the ones allowed
    (--dtype, --compile). build: compile the missing packages (fold.py, bench_decode.py); else
    only cached ones are candidates. Off the CPU a rule picks (rule_plan)."""
    if model.embed.weight.device.type != "cpu":
        return rule_plan(model, dtypes, runtimes)
    only = [runtimes[0]] * (len(runtimes) == 1) + [dtype_name(d) for d in dtypes or [] if len(dtypes) == 1]
    asked = f"{' '.join(only)} only, as asked" if only else ""
    folder, build = cache_folder(folder), build or tuple(runtimes) == ("compiled",)
    dtypes = dtypes or [torch.float32] + [torch.bfloat16] * cpu_bf16_support()[0]
    models = {d: use_decode_layout(copy.deepcopy(model).to(d).eval()) for d in dtypes}
    packages = build or "compiled" not in runtimes  # no cached package needed
    kernels = {d: attention_for(models[d], folder, contexts, packages, replan, by) for d in dtypes}
    names = {label(r, d): (r, d) for d in dtypes for r in runtimes if r == "eager" or build or kernels[d][1]}
    steps = {}

    def timer():
        steps.update({d: compiled_decode(models[d], folder, kernel=kernels[d][0])
                      for r, d in names.values() if r == "compiled"})
        for name in [n for n, (r, d) in names.items() if r == "compiled" and steps[d] is None]:
            del names[name]  # it cannot be built here
        names.update({} if names else {label("eager", d): ("eager", d) for d in dtypes})
        for d in dtypes:  # eager calls the planned kernel (a step calls the one it was built with)
            models[d].set_decode_kernel(kernels[d][3])
        calls_at = lambda ctx: {n: decode_step_at(models[d], ctx, steps[d] if r == "compiled" else None)
                                for n, (r, d) in names.items()}
        return (*measure_at(contexts, calls_at), f"contexts {contexts[0]} and {contexts[1]}, "
                f"{ROUNDS} interleaved rounds of >= {MIN_S} s each")
    path = plan_path(folder, "decode", repr(model.cfg), [label(r, d) for d in dtypes for r in RUNTIMES],
                     our_op.source_digest())
    job_name = f"decode {contexts[0]}-{contexts[1]}"
    if len(names) > 1:
        job = timed_job(path, job_name, timer, names, replan, by)
    elif (job := read_jobs(path).get(job_name)) and not set(names) <= set(job["rounds"]):
        job = None  # one candidate: nothing to time, a kept timing shown
    chosen = next(iter(names)) if job is None else job["chosen"] if job["chosen"] in names else choose(
        {n: job["rounds"][n] for n in names})[0]
    runtime, dtype = names[chosen]
    why = reason(job, names, chosen, "token", asked)
    if "compiled" in runtimes and all(r == "eager" for r, _ in names.values()):
        why += "; no compiled step cached (--compile=True builds one)"
    details = [] if job is None else describe(
        f"decode at contexts {contexts[0]}-{contexts[1]} on {cpu_kind()}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads", job, "token")
    step, attention = None, kernels[dtype][3]
    if runtime == "compiled":
        attention = kernels[dtype][0]
        step = steps.get(dtype) or compiled_decode(models[dtype], folder, kernel=attention)
        if step is None:
            runtime, attention, why = "eager", kernels[dtype][3], f"{why}; the compiled step cannot be built here"
        else:
            details.append(f"package: {step.path}")
    details += kernels[dtype][2]
    models[dtype].set_decode_kernel(kernels[dtype][3] if runtime == "eager" else attention)
    seconds = {n: statistics.median(ts) for n, ts in job["rounds"].items()} if job else {}
    return Plan(runtime, dtype, attention, why, seconds, "token", details,
                models[dtype], step)


def rule_plan(model, dtypes, runtimes):
    """Off the CPU a rule: bf16 where the GPU has it, unless asked; CUDA graphs if compiled."""
    name, why = choose_decode_dtype(model.embed.weight.device.type, dtype_name(dtypes[0]) if dtypes else "auto")
    model = model.to(torch_dtype(name)).eval()
    compiled = model.embed.weight.is_cuda and tuple(runtimes) == ("compiled",)
    step = torch.compile(model.decode_one_token, fullgraph=True, mode="reduce-overhead") if compiled else None
    return Plan("compiled" if compiled else "eager", torch_dtype(name), None, why.split(": ", 1)[-1],
                model=model, step=step)


def train_plan(step, key_parts, folder="", replan=False, clock=time.perf_counter, by="train.py"):
    """float32 against bf16 autocast on the run's own training step -> Plan (runtime None).
    step(dtype name) runs one forward + backward of a copy of the run's model in it."""
    native, isa = cpu_bf16_support()
    dtypes = {label(None, d): d for d in (torch.float32, torch.bfloat16)}
    fns = {name: (lambda name=name: step(name)) for name in dtypes}

    def timer():
        stop = others_busy()
        first = {name: timed(fn, clock=clock) for name, fn in fns.items()}  # a warm-up step each
        if first["bfloat16"] > EMULATED * first["float32"]:  # emulated bf16: one step was enough
            times = measure({"float32": fns["float32"]}, 3, warmup=0, clock=clock)[0]
            times["bfloat16"] = [first["bfloat16"]] * 3
            return times, stop(), f"one bf16 step: out at {EMULATED:.0f}x ({isa}); float32 3 steps"
        rounds = ROUNDS if max(first.values()) < 2 else 3
        times = measure(fns, rounds, warmup=0, clock=clock)[0]
        return times, stop(), f"{rounds} interleaved steps each after a warm-up"
    path = plan_path(folder, "train", *key_parts, native)
    job = timed_job(path, "train", timer, dtypes, replan, by)
    seconds = {n: statistics.median(ts) for n, ts in job["rounds"].items()}
    details = describe(f"training step on {cpu_kind()}", job, "step")
    return Plan(None, dtypes[job["chosen"]], None, reason(job, dtypes, job["chosen"], "step"), seconds,
                "step", details)
