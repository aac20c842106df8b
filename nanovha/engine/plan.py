"""
The decode plan: which runtime, dtype and one-token attention decode a model fastest on this
machine, timed on the model itself and kept in a plan file (nanovha/timing.py).

    plan = decode_plan(model, (16, 512))  # sample.py, fold.py, bench_decode.py: from 16 to 512
    print(plan)          # plan: compiled bfloat16, attention nanovha, N ms/token (fastest of 4, ..)
    generate(plan.model, idx, 100, decode=plan.step)

It reads top to bottom: 1. the attention each dtype runs (SDPA or ours, timed alone), 2. the
candidates, 3. their timing, 4. the Plan. Off the CPU a rule decides (rule_plan).
"""
import copy
import os
import statistics
import sys
from dataclasses import dataclass, field
from typing import Optional

import torch

from nanovha.engine import kernel as our_op
from nanovha.engine.attention import DECODE_KERNELS, OP_PATHS, static_attention, use_decode_layout, use_engine
from nanovha.engine.compiled import compiled_decode, package_path
from nanovha.hardware import choose_decode_dtype, cpu_bf16_support, cpu_kind, dtype_name, torch_dtype
from nanovha.timing import (MIN_S, ROUNDS, Plan, cache_folder, choose, describe, label, measure_at, plan_path,
                            random_context, read_jobs, reason, timed_job)

RUNTIMES = ("compiled", "eager")


@dataclass
class Candidate:
    """One way to decode: a runtime and a dtype, the one-token attention it calls, its model."""
    runtime: str  # "compiled" (an AOTInductor package) or "eager"
    dtype: torch.dtype
    attention: str  # "sdpa", "nanovha" or "nanovha_dot" (attention.py)
    model: object = field(repr=False)  # the copy in this dtype and layout, the engine in place
    step: object = field(default=None, repr=False)  # compiled: the package, once built or loaded

    @property
    def name(self):
        return label(self.runtime, self.dtype)


@dataclass
class AttentionChoice:
    """The one-token attention planned for a model copy, and the timing it was chosen by."""
    kernel: str
    job: Optional[dict]  # None: ours cannot be loaded, SDPA with nothing timed

    @property
    def settled(self):
        """Chosen on a quiet machine (or not chosen at all): a package for it may be built."""
        return self.job is None or not self.job["provisional"]


def context_range(first, last):
    """The (short, long) contexts a plan is measured at for a generation from position `first` to
    `last`: powers of two around them (at least 16), so nearby lengths share one job."""
    lo = max(16, 1 << max(0, first.bit_length() - 1))
    return lo, max(lo, 1 << max(0, (last - 1).bit_length()))


# ---- 1. the attention each dtype runs: SDPA or ours, timed on the attention alone
def choose_attention(model, contexts, folder="", replan=False, by="sample.py"):
    """-> AttentionChoice: the one-token attention of the model here, SDPA or ours (kernel.py),
    timed on that attention alone at both contexts; SDPA where ours cannot be loaded."""
    if not our_op.load():
        return AttentionChoice("sdpa", None)
    shape = (*model.blocks[0].attn.cache_dims, model.cfg.n_head, len(model.blocks), str(model.embed.weight.dtype))
    path = plan_path(folder, "attention", shape, DECODE_KERNELS, our_op.source_digest())
    how = f"the attention alone at contexts {contexts[0]} and {contexts[1]}, {ROUNDS} rounds"
    timer = lambda: (*measure_at(contexts, lambda ctx: attention_calls(model, ctx)), how)
    job = timed_job(path, f"attention {contexts[0]}-{contexts[1]}", timer, DECODE_KERNELS[:2], replan, by)
    return AttentionChoice(job["chosen"], job)


def attention_calls(model, ctx):
    """{kernel: the one-token attention of every layer over the model's own ctx cached positions}:
    SDPA, ours, and ours asked for its VDPBF16PS path where this CPU has it for the shape."""
    heads, k_dim, v_dim = model.blocks[0].attn.cache_dims
    caches = random_context(model, ctx, ctx + 16)
    group, dtype = model.cfg.n_head // heads, model.embed.weight.dtype
    qs = [torch.randn(1, heads, group, k_dim, dtype=dtype) for _ in caches]
    pos = torch.tensor([ctx - 1])
    kvs = [(c.k, c.v if v_dim else c.k) for c in caches]  # MLA keeps its [latent ; RoPE key] rows in k: its values too
    dot = torch.ops.nanovha.decode_attention_path(qs[0], *kvs[0], pos, OP_PATHS["nanovha_dot"]) == "dot"
    kernels = DECODE_KERNELS if dot else DECODE_KERNELS[:2]  # the dot path where it is another path here

    def call(kernel):
        with torch.inference_mode():
            return [static_attention(q, k, v, pos, kernel) for q, (k, v) in zip(qs, kvs)]
    return {kernel: (lambda kernel=kernel: call(kernel)) for kernel in kernels}


# ---- 2. the candidates
def candidates(model, dtypes, runtimes, contexts, folder, build, replan, by):
    """-> (the candidates, safest first, each dtype's AttentionChoice): eager calls the planned
    attention; compiled is one where its package is built now or cached (package_kernel)."""
    out, choices = [], {}
    for dtype in dtypes:
        copied = use_decode_layout(copy.deepcopy(model).to(dtype).eval())
        choices[dtype] = choice = choose_attention(copied, contexts, folder, replan, by)
        kernel = package_kernel(copied, folder, choice, build) if "compiled" in runtimes else None
        if kernel is not None:
            out.append(Candidate("compiled", dtype, kernel, copied))
        if "eager" in runtimes:
            out.append(Candidate("eager", dtype, choice.kernel, copied))
    return out, choices


def package_kernel(model, folder, choice, build):
    """The attention of the compiled step a command uses, or None (none cached, none built).
    Building: the planned one, but the safe one (SDPA) while the choice is provisional (a busy
    machine's, which a quiet run may overturn). Not building: the planned one where cached; else
    the one at hand, except after a quiet choice, when the planned one is built (one line)."""
    if build:
        return choice.kernel if choice.settled else DECODE_KERNELS[0]
    usable = [k for k in DECODE_KERNELS if k == DECODE_KERNELS[0] or our_op.load()]
    cached = [k for k in usable if os.path.exists(package_path(model, folder, kernel=k))]
    if choice.kernel in cached or not cached:
        return choice.kernel if cached else None
    if choice.settled:
        print(f"note: the compiled step at hand calls {cached[0]}, and a quiet plan picks {choice.kernel}: "
              f"building that one, once", file=sys.stderr)
        return choice.kernel
    return cached[0]


# ---- 3. timing them
def decode_step_at(model, ctx, step=None, span=16):
    """A call decoding one token at positions ctx .. ctx+span-1 in turn, eager or by a step."""
    random_context(model, ctx, ctx + span)
    token, calls = torch.zeros(1, 1, dtype=torch.long), [0]

    def call():
        pos, calls[0] = ctx + calls[0] % span, calls[0] + 1
        with torch.inference_mode():
            return model.decode_one_token(token, pos) if step is None else step(token, torch.tensor([pos]))
    return call


def ready(cands, folder):
    """Builds or loads every compiled candidate's step; one that cannot be built here leaves (and
    if none is left, eager takes their place). Eager candidates then get their attention (a step
    keeps the one it was built with)."""
    for c in [c for c in cands if c.runtime == "compiled" and c.step is None]:
        c.step = compiled_decode(c.model, folder, kernel=c.attention)
    unbuilt = [c for c in cands if c.runtime == "compiled" and c.step is None]
    cands[:] = [c for c in cands if c not in unbuilt] or [Candidate("eager", c.dtype, c.attention, c.model)
                                                          for c in unbuilt]
    for c in cands:
        if c.runtime == "eager":
            use_engine(c.model, c.attention)


def timer(cands, contexts, folder):
    """The decode job's timer: every candidate ready, then timed in interleaved rounds."""
    def run():
        ready(cands, folder)
        calls_at = lambda ctx: {c.name: decode_step_at(c.model, ctx, c.step) for c in cands}
        how = f"contexts {contexts[0]} and {contexts[1]}, {ROUNDS} interleaved rounds of >= {MIN_S} s each"
        return (*measure_at(contexts, calls_at), how)
    return run


# ---- 4. the plan
def decode_plan(model, contexts, folder="", dtypes=None, runtimes=RUNTIMES, build=False, replan=False,
                by="sample.py"):
    """The fastest of {compiled, eager} x {float32, bf16 where native} for decoding `model`
    (batch 1, CPU) over contexts (short, long), from the plan file in folder or measured now ->
    Plan, its model a copy in the chosen dtype and layout, the engine in place. dtypes, runtimes:
    the ones allowed (--dtype, --compile). build: compile the missing packages (fold.py,
    bench_decode.py); else only cached ones are candidates. Off the CPU a rule picks."""
    if model.embed.weight.device.type != "cpu":
        return rule_plan(model, dtypes, runtimes)
    only = [runtimes[0]] if len(runtimes) == 1 else []
    only += [dtype_name(dtypes[0])] if dtypes and len(dtypes) == 1 else []
    asked = f"{' '.join(only)} only, as asked" if only else ""
    folder, build = cache_folder(folder), build or tuple(runtimes) == ("compiled",)
    dtypes = dtypes or [torch.float32] + [torch.bfloat16] * cpu_bf16_support()[0]
    cands, choices = candidates(model, dtypes, runtimes, contexts, folder, build, replan, by)
    path = plan_path(folder, "decode", repr(model.cfg), [label(r, d) for d in dtypes for r in RUNTIMES],
                     our_op.source_digest())
    name = f"decode {contexts[0]}-{contexts[1]}"
    if len(cands) > 1:
        job = timed_job(path, name, timer(cands, contexts, folder), [c.name for c in cands], replan, by)
    else:  # one candidate: nothing to time; a kept timing of it is shown
        job = read_jobs(path).get(name)
        job = job if job and cands[0].name in job["rounds"] else None
    names = {c.name: c for c in cands}
    return the_plan(names[pick(job, names)], job, names, choices, asked, runtimes, folder, contexts)


def pick(job, names):
    """The job's choice among the candidates still standing (where it left, the fastest of them),
    or the one candidate."""
    if job is None:
        return next(iter(names))
    if job["chosen"] in names:
        return job["chosen"]
    return choose({n: job["rounds"][n] for n in names})[0]


def the_plan(chosen, job, names, choices, asked, runtimes, folder, contexts):
    """The Plan of the chosen candidate: its step built or loaded (eager in its place where it
    cannot be), the engine in place, the reason and every figure behind it."""
    why, one = reason(job, names, chosen.name, "token", asked), [chosen]
    ready(one, folder)  # its step built or loaded, the engine in place; eager where it cannot be built
    if one[0].runtime != chosen.runtime:
        why, chosen = why + "; the compiled step cannot be built here", one[0]
    if "compiled" in runtimes and all(c.runtime == "eager" for c in names.values()):
        why += "; no compiled step cached (--compile=True builds one)"
    details = [] if job is None else describe(
        f"decode at contexts {contexts[0]}-{contexts[1]} on {cpu_kind()}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads", job, "token")
    if chosen.step is not None:
        details.append(f"package: {chosen.step.path}")
    for dtype, choice in choices.items():
        title = f"attention in {dtype_name(dtype)}"
        details += describe(title, choice.job, "token") if choice.job else [f"{title}: sdpa (ours cannot be loaded)"]
    if chosen.runtime == "compiled" and chosen.attention != choices[chosen.dtype].kernel:
        details.append(f"  {chosen.attention}: the package's, kept while the choice of "
                       f"{choices[chosen.dtype].kernel} is provisional (a busy machine's)")
    seconds = {n: statistics.median(ts) for n, ts in job["rounds"].items()} if job else {}
    return Plan(chosen.runtime, chosen.dtype, chosen.attention, why, seconds, "token", details, chosen.model,
                chosen.step)


def rule_plan(model, dtypes, runtimes):
    """Off the CPU a rule: bf16 where the GPU has it, unless asked; the engine's KV memory (one
    allocation, written in place), SDPA's attention; CUDA graphs if compiled."""
    name, why = choose_decode_dtype(model.embed.weight.device.type, dtype_name(dtypes[0]) if dtypes else "auto")
    model = use_engine(model.to(torch_dtype(name)).eval(), DECODE_KERNELS[0])
    compiled = model.embed.weight.is_cuda and tuple(runtimes) == ("compiled",)
    step = torch.compile(model.decode_one_token, fullgraph=True, mode="reduce-overhead") if compiled else None
    return Plan("compiled" if compiled else "eager", torch_dtype(name), DECODE_KERNELS[0], why, model=model,
                step=step)
