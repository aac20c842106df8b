"""
One measured plan per model and machine: which dtype and runtime run a job fastest here, timed on
the job itself, kept beside the compiled packages (as FFTW keeps its "wisdom") and read by every
command.

    plan = decode_plan(model, folder, (16, 512))  # fold.py, sample.py, bench_decode.py: decode from 16 to 512
    plan.dtype, plan.runtime, plan.line           # "float32", "compiled", one line with the figures
    kernel, line, settled = attention_kernel(model, folder, (1024, 16384))  # compiled attention: SDPA or ours
    dtype, line = train_plan(step, key, folder)   # train.py: float32 against bf16 autocast on the run's own step

How a choice is made (choose): every candidate runs in interleaved rounds, the order rotated each
round, each for at least min_s seconds per round (a 2-ms step is repeated, not timed once), after
one untimed warm-up call. The fastest by median wins outright only where it beats the others by
more than `margin` in the median and in at least 4 rounds of 5; otherwise the safest candidate
that it cannot be told apart from is kept (the order of the candidates is their safety: float32
before bf16). A bf16 whose warm-up already takes 3x float32's is emulated: out after that one
call.

A busy machine: the other processes' CPU time during the timing is read from /proc/stat
(others_busy). Where they used over a quarter of a core, leaving the safe choice takes a 25%
margin (noise then is large, and only a large gap survives it), and the plan is kept for the run
that made it, marked provisional, and measured again by the next command that finds it so.
`replan=True` measures again in any case.

A plan file (plan-<key>.json) is keyed by what the timings depend on: the model's shape (not its
weights), the candidates, the CPU, torch and the thread count. It holds one job per range of
contexts, each with its timings, when and how they were measured and what was chosen; a compiled
candidate is timed on the package of the weights at hand, and a model of the same shape without a
package picks among the rest of the timings.
"""
import copy
import datetime
import hashlib
import json
import os
import statistics
import tempfile
import time

import torch

from nanovha import decode_kernel
from nanovha.hardware import cpu_bf16_support, cpu_kind
from nanovha.kernels import DECODE_KERNELS, decode_kernel_for, static_attention, use_decode_layout

MARGIN = 0.05  # a candidate is beaten when the fastest is more than 5% faster
# the margin when other processes were busy: only a large gap leaves the safe choice then
BUSY_MARGIN = 0.25
ROUNDS = 5
MIN_S = 0.1  # seconds per candidate per round: fifty 2-ms steps, one 0.3-s training step
BUSY_CORES = 0.25  # other processes' use of the CPU above which a plan is provisional
EMULATED = 3.0  # a bf16 warm-up this many times float32's: emulated, out


# ---- timing and deciding
def measure(fns, clock=time.perf_counter, rounds=ROUNDS, min_s=MIN_S, warmup=True):
    """{name: fn} -> ({name: [seconds per call, one per round]}, {name: seconds of the warm-up
    call}). Each round calls every fn, in an order rotated by one each round, until min_s has
    passed (at least once)."""
    names, warm, times = list(fns), {}, {name: [] for name in fns}
    for name in names if warmup else []:
        t0 = clock()
        fns[name]()
        warm[name] = clock() - t0
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            calls, t0 = 0, clock()
            while True:
                fns[name]()
                calls += 1
                if clock() - t0 >= min_s:
                    break
            times[name].append((clock() - t0) / calls)
    return times, warm


def beaten(times, name, by, margin=MARGIN):
    """Whether `by` is faster than `name` by more than margin in the median of the per-round
    ratios and in at least 80% of the rounds (rounds are paired: both ran in the same round, so
    noise hits them alike)."""
    ratios = [t / u for t, u in zip(times[name], times[by])]
    return statistics.median(ratios) > 1 + margin and sum(x > 1 for x in ratios) >= 0.8 * len(ratios)


def choose(times, margin=MARGIN):
    """times: {candidate: [s per round]} in safety order -> (chosen, clear). The fastest by
    median where it beats every safer candidate; else the safest one it does not beat. clear: the
    chosen one and every other candidate were told apart (one beat the other), so noise cannot
    have made the choice."""
    medians = {name: statistics.median(ts) for name, ts in times.items()}
    fastest = min(medians, key=medians.get)
    chosen = next(name for name in times if name == fastest or not beaten(times, name, fastest, margin))
    clear = all(name == chosen or beaten(times, name, chosen, margin) or beaten(times, chosen, name, margin)
                for name in times)
    return chosen, clear


def margin_for(busy_cores):
    """The margin a choice needs: MARGIN on a quiet machine, BUSY_MARGIN where other processes
    were busy."""
    return BUSY_MARGIN if busy_cores is not None and busy_cores > BUSY_CORES else MARGIN


def others_busy(read=None):
    """-> stop(): call it when the timing ends; it returns the cores other processes (and the hypervisor: steal)
    kept busy meanwhile, from /proc/stat and /proc/self/stat, or None where those cannot be read."""
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


# ---- the plan file
def plan_key(*parts):
    """sha256 (16 hex) of what the timings depend on, the machine and torch included."""
    env = [cpu_kind(), torch.__version__, torch.get_num_threads()]
    return hashlib.sha256(json.dumps([*parts, *env], default=str).encode()).hexdigest()[:16]


JOB_KEYS = ("seconds", "rounds", "chosen", "clear", "busy_cores", "provisional", "when", "by", "how")


def read_plan(path):
    """The plan file's jobs that hold every field, {} where it is missing or unreadable (a plan
    is a cache: what cannot be read is measured again, never fatal)."""
    try:
        with open(path) as f:
            plan = json.load(f)
    except (OSError, ValueError):
        return {}
    jobs = plan.get("jobs") if isinstance(plan, dict) else None
    return {name: job for name, job in jobs.items() if isinstance(job, dict) and all(k in job for k in JOB_KEYS)
            and job["chosen"] in job["seconds"]} if isinstance(jobs, dict) else {}


def write_plan(path, about, jobs):
    """Writes the plan whole, then renames it into place; a folder that cannot be written is a
    note, not an error."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp_plan_")
        with os.fdopen(fd, "w") as f:
            json.dump(dict(about, jobs=jobs), f, indent=1)
        os.replace(tmp, path)
        return None
    except OSError as e:
        return f"note: the plan was not saved to {path} ({e.strerror or e}); the next run measures again"


def job_record(times, warm, chosen, clear, busy, by, how):
    return dict(seconds={k: statistics.median(v) for k, v in times.items()}, rounds=times, warmup=warm,
                chosen=chosen, clear=clear, busy_cores=busy, provisional=busy is not None and busy > BUSY_CORES,
                when=datetime.datetime.now().isoformat(timespec="seconds"), by=by, how=how)


def describe(job, chosen, unit, available=None):
    """One line: the choice, every candidate's time per unit, and when and how it was measured."""
    def fmt(seconds):
        return f"{seconds * 1e3:.3f} ms/{unit}" if seconds < 0.1 else f"{seconds:.3f} s/{unit}"
    others = sorted((s, name) for name, s in job["seconds"].items() if name != chosen)
    figures = " vs ".join([fmt(job["seconds"][chosen])] + [f"{name} {fmt(s)}" for s, name in others])
    fastest, margin = min(job["seconds"], key=job["seconds"].get), margin_for(job["busy_cores"])
    tie = ("" if job["clear"] else f" (not told apart from {fastest} by the {margin:.0%} margin: the safer kept)"
           if fastest != chosen else f" (the fastest, not told apart from every other by the "
                                     f"{margin:.0%} margin)")
    absent = available and job["chosen"] not in available
    missing = f"; {job['chosen']} has no package for these weights" if absent else ""
    busy = "" if job["busy_cores"] is None else f", other processes {job['busy_cores']:.2f} cores"
    busy += f", {margin:.0%} margin"
    when = "measured now" if job.get("fresh") else f"plan of {job['when']} by {job['by']}"
    provisional = ", PROVISIONAL: measured again next time" if job["provisional"] else ""
    return (f"{chosen}{tie}: {figures}{missing} on this CPU ({cpu_kind()}), timed on this model; "
            f"{when} ({job['how']}{busy}{provisional})")


# ---- training: float32 against bf16 autocast on the run's own step
def train_plan(step, key_parts, folder, replan=False, clock=time.perf_counter, by="train.py"):
    """-> (dtype, one line). step(dtype) runs one training step of the run's model in that dtype."""
    native, isa = cpu_bf16_support()
    path = os.path.join(folder, f"plan-{plan_key('train', *key_parts, native)}.json")
    jobs = {} if replan else read_plan(path)
    job = jobs.get("train")
    if job and not job.get("provisional") and job.get("chosen") in ("float32", "bfloat16"):
        return job["chosen"], describe(job, job["chosen"], "step")
    fns = {d: (lambda d=d: step(d)) for d in ("float32", "bfloat16")}
    stop, first = others_busy(), {}
    for d in fns:  # a warm-up step each, float32 first: timed only to spot an emulated bf16
        t0 = clock()
        fns[d]()
        first[d] = clock() - t0
    if first["bfloat16"] > EMULATED * first["float32"]:  # emulated bf16: one step was enough
        times, _ = measure({"float32": fns["float32"]}, clock, rounds=3, min_s=0, warmup=False)
        times["bfloat16"] = [first["bfloat16"]] * 3
        how = f"one bf16 step: out at {EMULATED:.0f}x ({isa}); float32 3 steps"
    else:
        rounds = ROUNDS if max(first.values()) < 2 else 3
        times, _ = measure(fns, clock, rounds=rounds, min_s=0, warmup=False)
        how = f"{rounds} interleaved steps each after a warm-up"
    busy = stop()
    chosen, clear = choose(times, margin_for(busy))
    job = job_record(times, first, chosen, clear, busy, by, how)
    note = write_plan(path, dict(kind="train", machine=cpu_kind(), torch=torch.__version__), dict(jobs, train=job))
    return chosen, describe(dict(job, fresh=True), chosen, "step") + (f"; {note}" if note else "")


def measure_at(contexts, calls_at, models, clock):
    """Times the calls calls_at(ctx) makes ({name: fn}) at both contexts -> ({name: [seconds per
    round, the two contexts summed]}, the cores other processes kept busy meanwhile); the models'
    caches are dropped after (a generation from the short context to the long one spends about
    the sum, halved, per token)."""
    stop, per_ctx = others_busy(), []
    for ctx in contexts:
        per_ctx.append(measure(calls_at(ctx), clock)[0])
    for model in models:
        for block in model.blocks:
            block.attn.kv_cache = None
    times = {n: [a + b for a, b in zip(per_ctx[0][n], per_ctx[1][n])] for n in per_ctx[0]}
    return times, stop()


# ---- the compiled step's attention: SDPA or our kernel, timed on the model's own attention
def attention_calls(model, ctx):
    """{kernel: a call of the one-token attention of every layer over ctx cached positions}, at
    the model's shape and dtype, over the model's own cache (random K/V; drop it after)."""
    heads, k_dim, v_dim = model.blocks[0].attn.cache_dims
    group, dtype = model.cfg.n_head // heads, model.embed.weight.dtype
    random_context(model, ctx, ctx + 16)
    layers = []
    for block in model.blocks:
        k, v = block.attn.kv_cache.k, block.attn.kv_cache.v
        layers.append((torch.randn(1, heads, group, k_dim, dtype=dtype), k, v if v_dim else k))  # MLA: k holds both
    pos = torch.tensor([ctx - 1])

    def call(kernel):
        with torch.inference_mode(), decode_kernel_for(kernel):
            return [static_attention(q, k, v, pos) for q, k, v in layers]
    return {kernel: (lambda kernel=kernel: call(kernel)) for kernel in DECODE_KERNELS}


def attention_kernel(model, folder, contexts, replan=False, clock=time.perf_counter, by="sample.py"):
    """-> (kernel, one line, settled): which attention the model's compiled decode step calls on
    this CPU, SDPA or ours (nanovha/decode_kernel.py), timed on its attention alone at both
    contexts (as decode_plan times steps), kept in the plan file. settled: the two were told apart
    on a quiet machine (a tie or a provisional plan is not worth a new package). SDPA where ours
    cannot be built or the model is not on the CPU."""
    if model.embed.weight.device.type != "cpu":
        return "sdpa", "sdpa (not a CPU)", True
    problem = decode_kernel.load()
    if problem:
        return "sdpa", f"sdpa ({problem})", True
    heads, k_dim, v_dim = model.blocks[0].attn.cache_dims
    shape = (heads, k_dim, v_dim, model.cfg.n_head // heads, len(model.blocks), str(model.embed.weight.dtype))
    key = plan_key("attention", shape, DECODE_KERNELS, decode_kernel.source_digest())
    path = os.path.join(folder, f"plan-{key}.json")
    job_name = f"{contexts[0]}-{contexts[1]}"
    jobs = {} if replan else read_plan(path)
    job, note = jobs.get(job_name), None
    if not job or job.get("provisional"):
        times, busy = measure_at(contexts, lambda ctx: attention_calls(model, ctx), [model], clock)
        chosen, clear = choose(times, margin_for(busy))
        how = f"the attention alone, contexts {contexts[0]} and {contexts[1]}, {ROUNDS} interleaved rounds"
        job = job_record(times, {}, chosen, clear, busy, by, how)
        note = write_plan(path, dict(kind="attention", shape=repr(shape), machine=cpu_kind(),
                                     torch=torch.__version__), dict(jobs, **{job_name: job}))
        job = dict(job, fresh=True)
    line = describe(job, job["chosen"], "token") + (f"; {note}" if note else "")
    return job["chosen"], line, job["clear"] and not job["provisional"]


# ---- decode: {compiled, eager} x {float32, bf16 where native} at both ends of the contexts a command reaches
def candidates(dtypes):
    """Decode candidates in safety order: the dtypes' order (float32 first), the compiled step
    before eager."""
    return [f"{runtime} {d}" for d in dtypes for runtime in ("compiled", "eager")]


def context_range(first, last):
    """The (short, long) contexts a plan is measured at for a generation from position `first` to
    `last`: powers of two around them (at least 16), so nearby lengths share one job."""
    lo = max(16, 1 << max(0, first.bit_length() - 1))
    hi = max(lo, 1 << max(0, (last - 1).bit_length()))
    return lo, hi


def random_context(model, ctx, max_len, batch_size=1):
    """A fresh cache of max_len positions whose first ctx hold random K/V: a context to time
    decode at without a prefill (speed does not depend on the values)."""
    model.setup_cache(batch_size, max_len)
    with torch.no_grad():
        for block in model.blocks:
            block.attn.kv_cache.k[:, :, :ctx].normal_()
            block.attn.kv_cache.v[:, :, :ctx].normal_()


def decode_step_at(model, ctx, step=None, span=16):
    """A call that decodes one token at positions ctx .. ctx+span-1 in turn (random_context up to
    ctx), eager or through a compiled step."""
    random_context(model, ctx, ctx + span)
    token = torch.zeros(1, 1, dtype=torch.long, device=model.embed.weight.device)
    state = {"k": 0}

    def call():
        pos = ctx + state["k"] % span
        state["k"] += 1
        with torch.inference_mode():
            return model.decode_one_token(token, pos) if step is None else step(token, torch.tensor([pos]))
    return call


class DecodePlan:
    """What a command runs: dtype, runtime ("compiled" or "eager"), the model in that dtype and
    layout, the compiled step (or None), and the line that says why."""

    def __init__(self, dtype, runtime, model, step, line):
        self.dtype, self.runtime, self.model, self.step, self.line = dtype, runtime, model, step, line


def decode_plan(model, folder, contexts, dtypes=None, runtimes=("compiled", "eager"), build=False, replan=False,
                clock=time.perf_counter, by="sample.py"):
    """The fastest of {compiled, eager} x {float32, bf16 where native} for decoding `model`
    (batch 1, CPU) over contexts (short, long), from the plan file in folder or measured now.
    dtypes, runtimes: the ones allowed (--dtype, --compile). build: compile the packages that are
    missing (fold.py, bench_decode.py); else only cached packages are candidates."""
    from nanovha.compiled_decode import compiled_decode, package_path
    native = ["float32", "bfloat16"] if cpu_bf16_support()[0] else ["float32"]
    everything = candidates(dtypes or native)
    names = [n for n in everything if n.split()[0] in runtimes]
    key = plan_key("decode", repr(model.cfg), everything, decode_kernel.source_digest())
    path = os.path.join(folder, f"plan-{key}.json")
    job_name = f"{contexts[0]}-{contexts[1]}"
    jobs = {} if replan else read_plan(path)
    models = {}

    # the model in dtype d, in the decode layout (the layout the packages are built on)
    def prepared(d):
        if d not in models:
            models[d] = use_decode_layout(copy.deepcopy(model).to(getattr(torch, d)).eval())
        return models[d]
    kernels = {}  # dtype -> (the compiled step's attention kernel, its line, whether its package exists)

    def kernel(d):
        if d not in kernels:
            chosen, line, settled = attention_kernel(prepared(d), folder, contexts, replan, clock, by)
            # each kernel's package path once: a path hashes every weight
            have = [k for k in DECODE_KERNELS if os.path.exists(package_path(prepared(d), folder, kernel=k))]
            # a package an earlier plan built beats none, and beats a new one where the kernels tie
            if have and chosen not in have and (not build or not settled):
                chosen, line = have[0], f"{have[0]}, the package at hand (a new plan picks {line})"
            kernels[d] = chosen, line, chosen in have
        return kernels[d]
    available = [n for n in names if n.startswith("eager") or build or kernel(n.split()[1])[2]]
    job = jobs.get(job_name)
    if job and not job.get("provisional") and set(available) <= set(job.get("rounds", {})):
        note, steps = None, {}
    else:
        steps = {n.split()[1]: compiled_decode(prepared(n.split()[1]), folder, kernel=kernel(n.split()[1])[0])
                 for n in available if n.startswith("compiled")}
        job = measure_decode({n.split()[1]: prepared(n.split()[1]) for n in available}, steps, available, contexts,
                             clock, by)
        note = write_plan(path, dict(kind="decode", shape=repr(model.cfg), machine=cpu_kind(),
                                     torch=torch.__version__), dict(jobs, **{job_name: job}))
        job = dict(job, fresh=True)
    times = {n: job["rounds"][n] for n in available}
    chosen = job["chosen"] if job["chosen"] in available else choose(times)[0]
    runtime, dtype = chosen.split()
    step, attention = None, ""
    if runtime == "compiled":
        step = steps.get(dtype) or compiled_decode(prepared(dtype), folder, kernel=kernel(dtype)[0])
        attention = f"; its attention: {kernel(dtype)[1]}"
    line = describe(job, chosen, "token", available) + (f"; {note}" if note else "") + attention
    return DecodePlan(dtype, runtime, prepared(dtype), step, line)


def measure_decode(models, steps, names, contexts, clock, by):
    """Times every candidate at both contexts; a candidate's time is the sum of its two (a
    generation that grows from the short context to the long one spends about that, halved, per
    token)."""
    def calls_at(ctx):
        return {n: decode_step_at(models[n.split()[1]], ctx, steps.get(n.split()[1]) if n[0] == "c" else None)
                for n in names}
    times, busy = measure_at(contexts, calls_at, models.values(), clock)
    chosen, clear = choose(times, margin_for(busy))
    how = f"contexts {contexts[0]} and {contexts[1]}, {ROUNDS} interleaved rounds of >= {MIN_S} s per candidate"
    job = job_record(times, {}, chosen, clear, busy, by, how)
    return dict(job, seconds={n: t / 2 for n, t in job["seconds"].items()})
