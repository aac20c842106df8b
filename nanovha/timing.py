"""
How the commands time their work and choose by it: the one timing harness (medians of interleaved
calls, the device synchronised around each), the rule that picks a candidate only when it is
faster beyond the noise, and the plan file that keeps what was measured (as FFTW keeps its
wisdom), checked by type and value when it is read back. A choice is a Plan.

    times, first = measure({"a": fn_a, "b": fn_b}, rounds=5, min_s=0.1)
    job = timed_job(path, "train", timer, candidates)    # read back, or timer() now and kept
    plan = train_plan(step, key)   # train.py: float32 against bf16 autocast on the run's own step

nanovha/engine/plan.py makes the decode plan with the same pieces; docs/benchmarks.md (the plan)
says how a choice is made.
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
from nanovha.hardware import autocast_for, cpu_bf16_support, cpu_kind, dtype_name
from nanovha.outputs import folder_problem, not_a_folder_problem, written_whole

MARGIN = 0.05  # a candidate is beaten when the fastest is more than 5% faster
BUSY_MARGIN = 0.25  # on a busy machine only a large gap leaves the safe choice
ROUNDS = 5
MIN_S = 0.1  # seconds per candidate per round: fifty 2-ms steps, one 0.3-s training step
BUSY_CORES = 0.25  # other processes' use of the CPU above which a plan is provisional
EMULATED = 3.0  # a bf16 warm-up this many times float32's: emulated, out


# ---- the harness
def synchronize(device_type):
    """Waits for the device's queued work (CPU work is synchronous: nothing to wait for)."""
    if device_type == "cuda":
        torch.cuda.synchronize()
    elif device_type == "mps":
        torch.mps.synchronize()


def timed(fn, device_type="cpu", clock=time.perf_counter):
    """Seconds one call of fn takes, with the device's queued work finished before and after."""
    synchronize(device_type)
    t0 = clock()
    fn()
    synchronize(device_type)
    return clock() - t0


def measure(fns, rounds, min_s=0.0, warmup=1, device_type="cpu", clock=time.perf_counter):
    """{name: fn} -> ({name: [seconds per call, one per round]}, {name: seconds of its first
    call}). `warmup` untimed rounds, then `rounds` rounds in which every fn runs in an order
    rotated by one each round, so machine noise hits them alike; within a round a fn is called
    again until min_s has passed (a 2-ms step is repeated, not timed once)."""
    names, first, times = list(fns), {}, {name: [] for name in fns}
    for _ in range(warmup):
        for name in names:
            first.setdefault(name, timed(fns[name], device_type, clock))
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            spent, calls = 0.0, 0
            while calls == 0 or spent < min_s:
                spent += timed(fns[name], device_type, clock)
                calls += 1
            times[name].append(spent / calls)
    return times, first


def interleaved(fns, n_timed, warmup, device_type="cpu", clock=time.perf_counter):
    """The median seconds per call of each fn over n_timed interleaved rounds (measure), after
    `warmup` untimed ones."""
    times = measure(fns, n_timed, warmup=warmup, device_type=device_type, clock=clock)[0]
    return {name: statistics.median(ts) for name, ts in times.items()}


def others_busy(read=None):
    """-> stop(): call it when a timing ends; it returns the cores other processes (and the
    hypervisor: steal) kept busy meanwhile, from /proc/stat and /proc/self/stat, or None where
    those cannot be read."""
    def snapshot():
        try:
            with open("/proc/stat") as f:
                cpu = [int(v) for v in f.readline().split()[1:]]
            with open("/proc/self/stat") as f:
                mine = f.read().rsplit(")", 1)[1].split()
            # all, busy, this process
            return sum(cpu), sum(cpu) - cpu[3] - cpu[4], int(mine[11]) + int(mine[12])
        except (OSError, IndexError, ValueError):
            return None
    read = read or snapshot
    start = read()

    def stop():
        end = read()
        if start is None or end is None or end[0] <= start[0]:
            return None
        total, busy, mine = (e - s for e, s in zip(end, start))
        return max(0.0, (busy - mine) / (total / (os.cpu_count() or 1)))
    return stop


def measure_at(contexts, calls_at):
    """Times the calls calls_at(ctx) makes ({name: fn}) at both contexts -> ({name: [s per round,
    the mean of the two contexts]}, the cores other processes kept busy meanwhile): a generation
    from the short context to the long one spends about that per token."""
    stop = others_busy()
    short, long = (measure(calls_at(ctx), ROUNDS, MIN_S)[0] for ctx in contexts)
    return {n: [(a + b) / 2 for a, b in zip(short[n], long[n])] for n in short}, stop()


def random_context(model, ctx, max_len, batch_size=1):
    """A fresh cache of max_len positions, the first ctx random: decode timed without a prefill."""
    caches = model.setup_cache(batch_size, max_len)
    with torch.no_grad():
        for cache in caches:
            cache.k[:, :, :ctx].normal_()
            cache.v[:, :, :ctx].normal_()
    return caches


# ---- the choice
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
    attention: Optional[str]  # decode: the one-token attention (DECODE_KERNELS); None: model.py's
    why: str  # the reason, in a few words
    seconds: dict = field(default_factory=dict)  # {candidate: seconds per token (or step)}
    unit: str = "token"
    details: list = field(default_factory=list, repr=False)  # every figure: --verbose, JSON
    model: object = field(default=None, repr=False)  # decode: the model in this dtype and layout
    step: object = field(default=None, repr=False)  # decode: the compiled step, or None (eager)

    @property
    def summary(self):
        """'compiled bfloat16, attention nanovha, 1.759 ms/token (fastest of 4, ...)'"""
        name = label(self.runtime, self.dtype)
        attention = f", attention {self.attention}" if self.attention else ""
        figure = f", {fmt(self.seconds[name], self.unit)}" if name in self.seconds else ""
        return f"{name}{attention}{figure} ({self.why})"

    def __str__(self):
        return f"plan: {self.summary}"


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
    """Where plans (and the engine's compiled packages) are kept: folder, else <cache>/compiled."""
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


# ---- the training plan
def training_step(model, x, y):
    """-> step(dtype name): one forward + backward of a copy of `model` on (x, y) in that dtype
    (bf16/fp16: autocast), for train_plan. The run's model, its gradients and every random stream
    are left as they were; the copy is made at the first step, so a run that times nothing copies
    nothing."""
    probe = []

    def step(dtype):
        probe[:] = probe or [copy.deepcopy(model)]
        with torch.random.fork_rng(devices=[]), autocast_for(x.device.type, dtype):
            probe[0](x, y)[1].backward()
        probe[0].zero_grad(set_to_none=True)
    return step


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
    job = timed_job(plan_path(folder, "train", *key_parts, native), "train", timer, dtypes, replan, by)
    seconds = {n: statistics.median(ts) for n, ts in job["rounds"].items()}
    details = describe(f"training step on {cpu_kind()}", job, "step")
    return Plan(None, dtypes[job["chosen"]], None, reason(job, dtypes, job["chosen"], "step"), seconds,
                "step", details)
