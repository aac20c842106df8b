"""
Decode speed vs context: what the small KV cache buys at deployment, against the memory roofline
and against llama.cpp on the same weights (training throughput and the paper-scale costs are
bench.py).

    python bench_decode.py --plot=decode.png       # decode: MHA, GQA-8/4/2, MQA, a folded VHA, MLA and MFA vs context
    python bench_decode.py --variants=mha,gqa2,vha_folded --contexts=1024,4096,16384
    python bench_decode.py --ckpt=out-vha-small/ckpt.pt   # add a trained checkpoint (a VHA one is folded first)

Speed does not depend on training, so the models have random weights. Variants are timed
interleaved (one step of each in turn), so machine noise hits them alike; figures are medians
with warm-up steps excluded. Each variant runs compiled (on a CPU an AOTInductor package per
model, built once and cached: nanovha/engine/compiled.py; on CUDA, CUDA graphs) and eagerly, in
the same rounds; the compile time, the time to first token and the break-even length are printed
beside tokens/s. With llama-cpp-python installed, the folded VHA model (and --ckpt) also runs in
llama.cpp in the same rounds. The last stdout line is one JSON object with every figure.
"""
import copy
import itertools
import json
import math
import statistics
import sys
import time

import torch

from lab.decode_targets import HANDICAP, check_targets, llama_ratios
from model import GPT, GPTConfig, fold_to_gqa
from nanovha.bridges import llamacpp
from nanovha.config import DTYPES, at_least, flat_defaults, need, settings, stop_if
from nanovha.costs import kv_bytes_per_token
from nanovha.engine import kernel as our_op
from nanovha.engine.attention import DECODE_KERNELS, cache_zeros, decode_attention, use_decode_layout, use_engine
from nanovha.engine.compiled import compiled_decode
from nanovha.engine.plan import choose_attention, decode_plan
from nanovha.figures import compile_counters, copy_bandwidth, matmul_peak, plot_decode, print_table
from nanovha.hardware import choose_decode_dtype, cpu_kind, dtype_name, memory_problem, torch_dtype
from nanovha.loading import load_model, start_path
from nanovha.outputs import append_line, figure_problem, output_problem
from nanovha.timing import cache_folder, cache_problem, random_context
from nanovha.timing import interleaved as interleaved_on, timed as timed_on
from nanovha.variants import GQA_N, overrides

# -----------------------------------------------------------------------------
n_layer = 6
n_embd = 512
n_head = 16  # query heads that attend (VHA: the virtual heads)
head_dim = 32
vocab_size = 128  # small, so the LM head does not hide the KV cache
vha_kv_head = 2  # VHA: n_head virtual heads from n_head / vha_kv_head physical projections
batch_size = 1
block_size = 256  # the models' training context (decode runs past it with a larger cache)
variants = "mha,gqa8,gqa4,gqa2,mqa,vha_folded,mla,mfa"  # DECODE_VARIANTS, or any gqaN (N KV heads)
contexts = "auto"  # comma-separated; auto: 1K..16K on CPU, 1K..128K on CUDA
decode_steps = 30  # timed steps per variant and context
# prefill (TTFT) is timed at min(context, prefill_max); None: 2048 on CPU, 32768 on CUDA
prefill_max = None
prefill_repeats = 3
ckpt = ""  # a nanoVHA checkpoint to benchmark as variant "ckpt"; the other variants take its shape
copy_mib = 1024  # size of the tensor copy that measures the peak bandwidth
# the n^3 matmul that measures the compute peak (a GPU needs about 8192 to approach its own)
matmul_n = 1024
weight_layout = "in_out"  # Linear weights in memory: in_out (GPT.use_decode_layout) or out_in (PyTorch's default)
plot = ""  # PNG path: tokens/s and KV memory vs context
figures = ""  # a JSON-lines file: one line per variant, runtime and context, appended as it is timed
# also time vha_folded (and ckpt) in llama.cpp, when llama-cpp-python is importable (CPU only)
llama_cpp = True
# system
warmup = 3  # untimed steps per variant
device = "auto"
dtype = "auto"  # weights and cache. auto: CUDA bf16; a CPU plans on vha_folded (nanovha/engine/plan.py)
# auto: aot on a CPU, graphs on CUDA; aot (AOTInductor package), graphs (torch.compile), off
compile = "auto"
eager = True  # with a compiled step: also time every variant eagerly, in the same rounds
compile_autotune = True  # aot: inductor's C++ GEMM templates tuned per shape (faster steps, a longer build)
attention_kernel = "auto"  # the one-token attention: auto (timed per variant), sdpa, nanovha, nanovha_dot
compile_cache = ""  # where compiled packages and plans are kept ("": $NANOVHA_CACHE/compiled)
threads = 0  # CPU threads (0: torch's default)
seed = 1337
# -----------------------------------------------------------------------------
LIMITS = {**{k: at_least(1) for k in ("decode_steps", "prefill_repeats", "block_size", "copy_mib", "matmul_n",
                                     "n_layer", "n_embd", "head_dim", "n_head", "vocab_size", "vha_kv_head",
                                     "batch_size", "prefill_max")},
          "warmup": at_least(0), "dtype": DTYPES,
          "compile": ("auto", "aot", "graphs", "off"), "weight_layout": ("out_in", "in_out"),
          "attention_kernel": ("auto", *DECODE_KERNELS)}
globals().update(settings(flat_defaults(globals()), sys.argv[1:], optional={"prefill_max": int}, limits=LIMITS))
DECODE_VARIANTS = ("mha", "gqa8", "gqa4", "gqa2", "mqa", "vha_folded", "mla", "mfa")  # nanovha/variants.py's names
kernel_of = {}  # variant -> its one-token attention, eager and compiled (attention_kernels)
device_type = device.split(":")[0]
shape = dict(vocab_size=vocab_size, block_size=block_size, n_layer=n_layer, n_embd=n_embd, n_head=n_head,
             head_dim=head_dim)


def resolve_auto(device_type, prefill_max, compile):
    """The device's defaults for prefill_max None and compile "auto". CUDA: prefill up to 32K,
    CUDA graphs. Elsewhere prefill up to 2K, and an AOTInductor package (CPU; MPS: off)."""
    prefill_max = (32768 if device_type == "cuda" else 2048) if prefill_max is None else prefill_max
    if compile == "auto":
        compile = {"cuda": "graphs", "cpu": "aot"}.get(device_type, "off")
    return prefill_max, compile


if compile == "auto" and device_type == "cpu" and our_op.compiler() is None:
    print("note: no C++ compiler here ($CXX or c++), so no compiled step: eager only", file=sys.stderr)
    compile = "off"
prefill_max, compile = resolve_auto(device_type, prefill_max, compile)
need(compile != "aot" or device_type == "cpu", f"compile=aot builds a CPU package; on "
                                               f"{device_type} use graphs or off")
need(attention_kernel in ("auto", "sdpa") or device_type == "cpu", f"--attention_kernel={attention_kernel} is our "
     "CPU op; off the CPU use auto or sdpa")
need(compile != "aot" or our_op.compiler() is not None,
     "--compile=aot builds with a C++ compiler, and there is none here ($CXX or c++); install one or use --compile=off")
stop_if(compile == "aot" and cache_problem(compile_cache, build=True))
need(attention_kernel in ("auto", "sdpa") or our_op.load(), f"--attention_kernel={attention_kernel}: our op cannot be "
     "loaded here (the note above says why); use auto or sdpa")
stop_if(plot and figure_problem(plot, "--plot", {"--ckpt": ckpt and start_path(ckpt)}))  # now, not after the bench
stop_if(output_problem({"--figures": figures}, {"--ckpt": ckpt and start_path(ckpt)}, kinds={"--figures": "figures"}))
if threads:
    torch.set_num_threads(threads)
if compile == "graphs":
    import torch._dynamo
    torch._dynamo.config.recompile_limit = 64  # one graph per model and cache size
runtimes = ([compile] if compile != "off" else []) + (["eager"] if eager or compile == "off" else [])


timed = lambda fn: timed_on(fn, device_type)  # on this device
interleaved = lambda fns, n_timed: interleaved_on(fns, n_timed, warmup, device_type)


def build(**kw):
    """A random-weight model of the benchmark's shape; kw picks the attention."""
    try:
        return GPT(GPTConfig(**dict(shape, **kw)))
    except ValueError as e:
        need(False, e)


# ----------------------------------------------------------------------------- the models
def attention_of(name):
    """Variant name -> GPTConfig overrides (nanovha/variants.py at this shape). vha_folded, mla
    and mfa get the cache of vha_kv_head KV heads (GQA-2's bytes)."""
    need(name in DECODE_VARIANTS or GQA_N.fullmatch(name),
         f"unknown variant {name!r}: choose from mha, mqa, gqaN (N KV heads, e.g. gqa2), "
         f"vha_folded, mla, mfa, "
         f"ckpt (with --ckpt)")
    arch = overrides(name, shape["n_head"], shape["head_dim"], shape["n_embd"], vha_kv_head)
    kv = arch["n_kv_head"]
    need(arch["attn"] not in ("gqa", "vha") or shape["n_head"] % kv == 0,
         f"variant {name!r}: {shape['n_head']} query heads cannot share {kv} KV heads evenly")
    return arch


def fold(vha, tag):
    """VHA -> the plain GQA model fold_to_gqa builds; checks the logits agree (float64)."""
    vha64 = copy.deepcopy(vha).double().eval()
    try:
        folded = fold_to_gqa(vha64).eval()
    except ValueError as e:
        need(False, f"{tag}: {e}")
    cfg = folded.cfg
    x = torch.randint(cfg.vocab_size, (2, min(16, cfg.block_size)), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        diff = (vha64(x)[0] - folded(x)[0]).abs().max().item()
    print(f"{tag}: folded {vha.cfg.n_q_proj} physical -> {cfg.n_head} query heads, {cfg.n_kv_head} KV heads; "
          f"max |logit difference| vs the VHA model {diff:.1e} (float64)")
    return folded, diff


def decode_models():
    """name -> model (float32, eval; a VHA one, random or --ckpt, folded first), the fold checks,
    --ckpt's meta."""
    names, models, fold_diffs, meta = [v for v in variants.split(",") if v and v != "ckpt"], {}, {}, None
    need(ckpt or "ckpt" not in variants.split(","), "variant 'ckpt' needs --ckpt=PATH")
    if ckpt:
        try:
            real, loaded = load_model(ckpt)
        except (FileNotFoundError, ImportError, ValueError) as e:
            need(False, str(e))
        meta = loaded.get("meta")
        c = real.cfg
        shape.update({k: getattr(c, k) for k in ("vocab_size", "block_size", "n_layer", "n_embd", "n_head", "head_dim",
                                                  "mlp_hidden", "rope_theta", "qk_norm", "tie_embeddings")})
        print(f"ckpt: {ckpt} ({c.attn}, {c.n_layer} layers, width {c.n_embd}); the other variants take its shape")
        models["ckpt"] = real
        if c.attn == "vha":
            models["ckpt"], fold_diffs["ckpt"] = fold(real, "ckpt")
    need(models or names, "no variants: give --variants=... (e.g. mha,gqa2,vha_folded)")
    for name in names:
        torch.manual_seed(seed)
        model = build(**attention_of(name))
        # move premix and postmix away from the identity, so the fold has work to do
        if name == "vha_folded":
            with torch.no_grad():
                for block in model.blocks:
                    block.attn.premix.add_(0.1 * torch.randn_like(block.attn.premix))
                    block.attn.postmix_V.normal_(0, 0.3)
            model, fold_diffs[name] = fold(model, name)
        models[name] = model.float().eval()
    return models, fold_diffs, meta


def time_attention(models, ctx, ptdtype, runtime):
    """Median s/token of the one-token attention alone (every layer, no projections, run eagerly
    as `runtime` calls it), over ctx random K/V per layer: the part of a decode step that grows
    with the cache, without the weights it evicts."""
    def rand(*shape):  # in the memory a KV cache gets (2 MB pages on a CPU)
        return cache_zeros(math.prod(shape), ptdtype, torch.device(device)).view(shape).normal_()
    fns = {}
    for name, model in models.items():
        c = model.cfg
        if c.attn == "mla":  # over the latent rows [c_kv (r) ; the shared RoPE key (d_R)], one "head",
            # with q already absorbed into them, as absorbed_attention calls it (its projections left out)
            H, r, dR, call = c.n_head, c.mla_kv_rank, c.mla_rope_dim, model.blocks[0].attn.decode_attention
            kv = rand(c.n_layer, batch_size, 1, ctx, r + dR)  # every layer's cache in one allocation
            q, scale = rand(batch_size, H, 1, r + dR), 1 / math.sqrt(c.head_dim + dR)
            pos = ctx if runtime == "eager" else torch.tensor([ctx - 1], device=device)
            fns[name] = lambda kv=kv, q=q, call=call, pos=pos, scale=scale: [call(q, x, x, pos, scale) for x in kv]
            continue
        kv = rand(c.n_layer, 2, batch_size, c.n_kv_head, ctx, c.head_dim)
        q = rand(batch_size, c.n_head, 1, c.head_dim)
        pos = ctx if runtime == "eager" else torch.tensor([ctx - 1], device=device)  # static: compiled's path
        kernel = kernel_of[name]  # as the model calls it (use_engine)
        fns[name] = lambda kv=kv, q=q, pos=pos, kernel=kernel: [decode_attention(q, k, v, pos, kernel=kernel)
                                                                for k, v in kv]
    with torch.inference_mode():
        return interleaved(fns, decode_steps)


def weight_bytes(model):
    """Bytes of weights one decode step reads (an untied embedding only reads B rows: not
    counted)."""
    n = sum(p.numel() * p.element_size() for p in model.parameters())
    return n if model.cfg.tie_embeddings else n - model.embed.weight.numel() * model.embed.weight.element_size()


def attention_kernels(models, ctxs, kernel=None):
    """Puts the engine in place on every model (use_engine) with its one-token attention: `kernel`,
    else --attention_kernel, timed per variant where auto (on a CPU; SDPA elsewhere). Fills
    kernel_of."""
    for name, model in models.items():
        kernel_of[name] = kernel or attention_kernel
        if kernel_of[name] == "auto" and device_type == "cpu":
            choice = choose_attention(model, (min(ctxs), max(ctxs)), cache_folder(compile_cache), by="bench_decode.py")
            kernel_of[name], rounds = choice.kernel, choice.job["rounds"] if choice.job else {}
            times = {k: f"{statistics.median(ts) * 1e3:.3f}" for k, ts in rounds.items()}
            print(f"{name}: attention {kernel_of[name]} (ms/token: {times or 'ours cannot be loaded'})")
        kernel_of[name] = "sdpa" if kernel_of[name] == "auto" else kernel_of[name]
        use_engine(model, kernel_of[name])


def compiled_steps(models):
    """name -> (the compiled one-token step, seconds it took to build or load, whether it was
    built), for the compiled runtime: an AOTInductor package (CPU) or torch.compile with CUDA
    graphs, each calling its variant's attention (kernel_of)."""
    steps, folder = {}, cache_folder(compile_cache)
    for name, model in models.items():
        t0 = time.perf_counter()
        if compile == "aot":
            step = compiled_decode(model, folder, batch_size, autotune=compile_autotune, kernel=kernel_of[name])
            need(step is not None, "the compiled step cannot be built here (the note above says why); "
                                   "use --compile=off")
            steps[name] = (step, step.seconds, step.built)
        elif compile == "graphs":  # compiled at its first call, timed there
            steps[name] = (torch.compile(model.decode_one_token, fullgraph=True, mode="reduce-overhead"), 0.0, True)
        print(f"{name}: compiled step {'built' if steps[name][2] else 'loaded'} in "
              f"{time.perf_counter() - t0:.1f} s"
              + (f" ({step.path})" if compile == "aot" else ""))
    return steps


def decode_step(model, ctx, runtime, compiled):
    """A closure that decodes one token at positions ctx, ctx+1, ... (the cache holds positions <
    ctx)."""
    token = torch.zeros(batch_size, 1, dtype=torch.long, device=device)
    if runtime == "eager":  # an int position: attention reads the filled prefix
        positions = itertools.count(ctx)
        return lambda: model.decode_one_token(token, next(positions))
    # a tensor position: static shapes, the cache masked past it
    pos = torch.tensor([ctx], device=device)
    return lambda: (compiled[0](token, pos), pos.add_(1))


def time_decode(models, ctx, compiled, runners={}):
    """Median s/token at context ctx of every (model, runtime) -> ({(name, runtime): s}, {name:
    KV bytes allocated}, {name: seconds of the first compiled call}). The context is random K/V
    written straight into the cache (a real prefill of a long context per variant would cost more than
    the decode it sets up; speed ignores the values). llama.cpp runners are filled by a real prefill (its time to first
    token kept in runner.ttft) and join the rounds."""
    steps, kv_alloc, first = {}, {}, {}
    # no autograd bookkeeping (and one CUDA graph, not a no_grad one and then another)
    with torch.inference_mode():
        for name, model in models.items():
            caches = random_context(model, ctx, ctx + 1 + warmup + decode_steps, batch_size)
            kv_alloc[name] = sum(c.k.nbytes + c.v.nbytes for c in caches)
            for runtime in runtimes:
                steps[(name, runtime)] = decode_step(model, ctx, runtime, compiled.get(name))
                if runtime != "eager":
                    # CUDA graphs: the compile and the recording
                    first[name] = timed(steps[(name, runtime)])
        for name, (runner, base) in runners.items():
            runner.load(ctx + 1 + warmup + decode_steps)
            runner.ttft[min(ctx, prefill_max)] = runner.fill(ctx, prefill_max)
            # the same cache dtype and shape
            steps[(name, "llama.cpp")], kv_alloc[name] = runner.step, kv_alloc[base]
        seconds = interleaved(steps, decode_steps)  # (a runner's context is freed by its next load)
    if compile == "graphs":
        torch._dynamo.reset()
    return seconds, kv_alloc, first


def time_prefill(models, length):
    """Median seconds of a prefill of `length` tokens (eager: the time to first token after the
    model is loaded)."""
    prompt = torch.randint(shape["vocab_size"], (batch_size, length), device=device)
    for model in models.values():
        model.setup_cache(batch_size, length)
        model.prefill(prompt[:, :length if device_type == "cuda" else min(length, 256)])  # warm-up
    seconds = {name: [] for name in models}
    for _ in range(prefill_repeats):
        for name, model in models.items():
            seconds[name].append(timed(lambda: model.prefill(prompt)))
    return {name: statistics.median(ts) for name, ts in seconds.items()}


def op_floor_model(ptdtype):
    """The same layers and ops at head dim 2 (width 2 x n_head): what is left is per-op overhead."""
    torch.manual_seed(seed)
    model = build(n_embd=2 * shape["n_head"], head_dim=2, mlp_hidden=2 * shape["n_head"], n_kv_head=vha_kv_head)
    return model.to(device, ptdtype).eval()


# ----------------------------------------------------------------------------- the report
def decode_table(models, ctxs, bw, runners, compiled, ptdtype):
    """Prefill and decode at every context -> a row per (variant, runtime, context), printed as measured."""
    prefill = {length: time_prefill(models, length) for length in sorted({min(c, prefill_max) for c in ctxs})}
    rows, first_calls = [], {}
    for ctx in ctxs:
        if rows:
            print_table([r for r in rows if r["ctx"] == rows[-1]["ctx"]], COLUMNS, flush=True)
        seconds, kv_alloc, first = time_decode(models, ctx, compiled, runners)
        first_calls.setdefault(ctx, first)
        for (name, runtime), s in seconds.items():
            model, p_len = models[runners[name][1] if name in runners else name], min(ctx, prefill_max)
            ttft = runners[name][0].ttft[p_len] if name in runners else prefill[p_len][name]
            kv_tok = kv_bytes_per_token(model.cfg, ptdtype)
            # read once per decoded token
            step_bytes = weight_bytes(model) + kv_tok * ctx * batch_size
            rows.append(dict(variant=name, runtime=runtime, ctx=ctx, kv_bytes_per_token=kv_tok,
                             kv_cache_mb=kv_alloc[name] / 1e6, prefill_len=p_len, ttft_ms=ttft * 1e3,
                             prefill_tok_s=batch_size * p_len / ttft, decode_ms=s * 1e3, decode_tok_s=batch_size / s,
                             mb_per_step=step_bytes / 1e6, gb_s=step_bytes / s / 1e9, bw_frac=step_bytes / s / bw))
            if figures:  # the moment it is timed: a run cut later keeps it
                append_line(figures, dict(rows[-1], device=device, dtype=dtype_name(ptdtype)))
    print_table([r for r in rows if r["ctx"] == ctxs[-1]], COLUMNS, flush=True)
    return rows, first_calls


COLUMNS = [("variant", "variant", "{}"), ("runtime", "runtime", "{}"), ("context", "ctx", "{}"),
           ("KV B/token", "kv_bytes_per_token", "{}"), ("KV MB alloc", "kv_cache_mb", "{:.1f}"),
           ("prefill", "prefill_len", "{}"), ("TTFT ms", "ttft_ms", "{:.1f}"),
           ("prefill tok/s", "prefill_tok_s", "{:.0f}"), ("decode ms/tok", "decode_ms", "{:.2f}"),
           ("decode tok/s", "decode_tok_s", "{:.1f}"), ("MB/step", "mb_per_step", "{:.1f}"),
           ("GB/s", "gb_s", "{:.1f}"), ("of peak", "bw_frac", "{:.0%}")]  # the decode table's


def compile_costs(models, at, ctx, compiled, first_calls):
    """What the compiled step costs and when it pays, per variant at context ctx: the seconds to
    build it (or to load a cached package), eager and compiled ms/token, and the break-even: the
    tokens after which build + compiled decode beats eager decode. -> {variant: figures},
    printed."""
    costs = {}
    for name in models:
        # aot: build or load; graphs: the first call
        build_s = compiled[name][1] + first_calls.get(name, 0.0)
        c_ms, e_ms = at[(name, compile, ctx)]["decode_ms"], at[(name, "eager", ctx)]["decode_ms"]
        saved = (e_ms - c_ms) / 1e3
        costs[name] = dict(variant=name, built=compiled[name][2], build_s=build_s, eager_ms=e_ms, compiled_ms=c_ms,
                           speedup=e_ms / c_ms, break_even_tokens=build_s / saved if saved > 0 else None)
    print(f"\nthe compiled step ({compile}) at context {ctx}: its cost and when it pays "
          f"(break-even: the tokens after "
          f"which building it and decoding compiled beat decoding eagerly; a cached package only costs its load)")
    print_table(costs.values(), [("variant", "variant", "{}"), ("built (else loaded)", "built", "{}"),
                                 ("build/load s", "build_s", "{:.1f}"), ("eager ms/tok", "eager_ms", "{:.2f}"),
                                 ("compiled ms/tok", "compiled_ms", "{:.2f}"), ("speed-up", "speedup", "{:.2f}x"),
                                 ("break-even tokens", "break_even_tokens", "{:.0f}")])
    return costs


def breakdown_at(models, at, top, bw, runners, compiled, ptdtype):
    """Where a token's time goes at context `top`, in the first runtime (compiled if on): the
    fixed part (a step at context 1: weights + per-op overhead), the part that grows with the
    cache, and the attention alone against its roof (llama.cpp rows: the same split, no attention
    alone). -> ({variant: figures}, the per-op floor in ms, the matmul peak in FLOP/s), printed."""
    runtime = runtimes[0]
    # the same ops at head dim 2, no bandwidth to speak of
    floor = {"op_floor": op_floor_model(ptdtype)}
    # the folded model's attention kernel
    attention_kernels(floor, [1], kernel_of.get("vha_folded") or next(iter(kernel_of.values())))
    floor_compiled = dict(compiled, **(compiled_steps(floor) if runtime != "eager" else {}))
    floor_s = time_decode(dict(models, **floor), 1, floor_compiled, runners)[0]
    floor_ms = {n: s * 1e3 for (n, r), s in floor_s.items() if r in (runtime, "llama.cpp")}
    attn_s, breakdown = time_attention(models, top, ptdtype, runtime), {}
    flops_peak = matmul_peak(device, ptdtype, matmul_n)
    for name in [*models, *runners]:
        model = models[runners[name][1] if name in runners else name]
        r = at[(name, "llama.cpp" if name in runners else runtime, top)]
        weights_ms, c = weight_bytes(model) / bw * 1e3, model.cfg
        kv_ms, kv_bytes = r["decode_ms"] - floor_ms[name], r["mb_per_step"] * 1e6 - weight_bytes(model)
        # QK^T + PV widths
        width = (2 * c.mla_kv_rank + c.mla_rope_dim) if c.attn == "mla" else 2 * c.head_dim
        # 2 FLOPs per multiply-accumulate
        attn_flops = 2 * c.n_layer * c.n_head * width * top * batch_size
        # the roofline: bytes or FLOPs, the slower
        attn_roof_ms = max(kv_bytes / bw, attn_flops / flops_peak) * 1e3
        breakdown[name] = dict(variant=name, ms_ctx1=floor_ms[name], weights_ms=weights_ms,
                               overhead_ms=floor_ms[name] - weights_ms, ms_top=r["decode_ms"], kv_ms=kv_ms,
                               kv_gb_s=kv_bytes / kv_ms / 1e6 if kv_ms > 0 else None,
                               kv_over_bytes=kv_ms / (kv_bytes / bw * 1e3) if kv_bytes > 0 else None,
                               kv_over_roof=kv_ms / attn_roof_ms if kv_bytes > 0 else None,
                               roofline_ms=r["mb_per_step"] / bw * 1e9, attn_roof_ms=attn_roof_ms)
        if name in attn_s:
            s = attn_s[name]
            breakdown[name].update(attn_ms=s * 1e3, attn_gb_s=kv_bytes / s / 1e9, attn_gflop_s=attn_flops / s / 1e9,
                                   attn_of_roof=attn_roof_ms / (s * 1e3),
                                   handicapped="HANDICAPPED" if s * 1e3 > HANDICAP * attn_roof_ms else "")
    print(f"\nbreakdown at context {top} ({runtime}): ms/token at context 1 = weights + per-op overhead; the rest "
          f"grows with the cache")
    print_table(breakdown.values(), [
        ("variant", "variant", "{}"), ("ms @ctx 1", "ms_ctx1", "{:.2f}"),
        ("weights at peak BW", "weights_ms", "{:.2f}"), ("ctx 1 - weights", "overhead_ms", "{:.2f}"),
        (f"ms @ctx {top}", "ms_top", "{:.2f}"), ("KV part ms", "kv_ms", "{:.2f}"),
        ("KV part GB/s", "kv_gb_s", "{:.1f}"), ("KV part / bytes at BW", "kv_over_bytes", "{:.1f}x"),
        ("KV part / its roof", "kv_over_roof", "{:.1f}x"),
        ("roofline ms", "roofline_ms", "{:.2f}")])
    print(f"pure per-op overhead (same layers and ops at head dim 2, no bandwidth to speak of): "
          f"{floor_ms['op_floor']:.2f} ms/token")
    print(f"\nthe attention alone at context {top} (every layer, random K/V, no projections, as {runtime} calls "
          f"it, run eagerly); matmul peak "
          f"{flops_peak / 1e9:.1f} GFLOP/s ({matmul_n}^3, {str(ptdtype)[6:]}); its roof = max(K/V bytes at peak "
          f"bandwidth, FLOPs at the matmul peak)")
    print_table([b for n, b in breakdown.items() if n in models], [
        ("variant", "variant", "{}"), ("attention ms", "attn_ms", "{:.2f}"), ("K/V GB/s", "attn_gb_s", "{:.1f}"),
        ("GFLOP/s", "attn_gflop_s", "{:.1f}"), ("roof ms", "attn_roof_ms", "{:.2f}"),
        ("of its roof", "attn_of_roof", "{:.0%}"), (f"> {HANDICAP}x its roof", "handicapped", "{}")])
    return breakdown, floor_ms["op_floor"], flops_peak


def decode_dtype(models, ctxs):
    """-> (the plan or None, the weights' and cache's dtype, why). A CPU's "auto" is the plan timed on the
    folded VHA at both ends of the contexts; elsewhere a rule, or what was asked."""
    if device_type == "cpu" and dtype == "auto":
        probe = models.get("vha_folded") or next(iter(models.values()))
        plan = decode_plan(probe, (min(ctxs), max(ctxs)), compile_cache, build=compile == "aot",
                           runtimes=("compiled", "eager") if compile == "aot" else ("eager",), by="bench_decode.py")
        return plan, plan.dtype, str(plan)
    name, why = choose_decode_dtype(device_type, dtype)
    return None, torch_dtype(name), f"{name} ({why})"


def run_decode():
    parts = contexts.split(",")
    need(contexts == "auto" or all(p.isdigit() and int(p) >= 1 for p in parts),
         f"--contexts wants comma-separated positive integers (e.g. 1024,4096) or auto, got {contexts!r}")
    ctxs = [2**i for i in range(10, 18 if device_type == "cuda" else 15)] if contexts == "auto" else [*map(int, parts)]
    models, fold_diffs, meta = decode_models()
    caches = sum(kv_bytes_per_token(m.cfg, torch.float32) for m in models.values()) * max(ctxs) * batch_size
    stop_if(memory_problem(caches + sum(weight_bytes(m) for m in models.values()), device,
                           f"the KV caches at context {max(ctxs):,} (batch {batch_size}) and every variant's weights",
                           "lower --contexts or --batch_size, or bench fewer --variants"))
    plan, ptdtype, why = decode_dtype(models, ctxs)
    precision = dtype_name(ptdtype)
    for model in models.values():
        model.to(device, ptdtype)
        if weight_layout == "in_out":
            use_decode_layout(model)  # same values and shape, transposed storage
    attention_kernels(models, ctxs)
    names = [n for n in ("vha_folded", "ckpt") if n in models] if llama_cpp else []
    runners = llamacpp.runners({n: models[n] for n in names}, {"ckpt": meta}, device_type)
    bw = copy_bandwidth(device, copy_mib)
    c = next(iter(models.values())).cfg
    print(f"cpu {cpu_kind()}" if device_type == "cpu" else f"device {torch.cuda.get_device_name()}")
    print(f"device {device}, dtype {why}; threads {torch.get_num_threads()}, batch {batch_size}, decode attention "
          f"{', '.join(sorted(set(kernel_of.values())))}, runtimes {', '.join(runtimes)}, weights {weight_layout}")
    print(f"{c.n_layer} layers, width {c.n_embd}, {c.n_head} query heads of dim {c.head_dim}, vocab {c.vocab_size}")
    print(f"peak bandwidth (copy of {copy_mib} MiB, read + write): {bw / 1e9:.1f} GB/s")
    print(f"decode: the context is random K/V written into the cache (no prefill), then "
          f"{decode_steps} timed steps "
          f"(+{warmup} warm-up) per variant and runtime, interleaved; prefill (TTFT) timed separately at "
          f"min(context, {prefill_max})")
    compiled = compiled_steps(models) if compile != "off" else {}
    rows, first_calls = decode_table(models, ctxs, bw, runners, compiled, ptdtype)
    top = 16384 if 16384 in ctxs else max(ctxs)
    at = {(r["variant"], r["runtime"], r["ctx"]): r for r in rows}
    costs = compile_costs(models, at, ctxs[0], compiled, first_calls[ctxs[0]]) if len(runtimes) == 2 else {}
    breakdown, op_floor_ms, flops_peak = breakdown_at(models, at, top, bw, runners, compiled, ptdtype)
    targets = check_targets(models, at, breakdown, top, op_floor_ms, precision, runtimes, f"gqa{vha_kv_head}")
    ratios = llama_ratios(at, runners, ctxs, breakdown, runtimes)
    for runner, _ in runners.values():
        runner.close()
    if plot:
        plot_decode(rows, ctxs, plot, runtimes, f"decode on {device} ({precision}, batch "
                                                f"{batch_size}, {runtimes[0]})")
    return dict(mode="decode", device=device, cpu=cpu_kind() if device_type == "cpu" else None, dtype=precision,
                dtype_reason=why, plan=plan and {k: v for k, v in vars(plan).items() if k not in ("model", "step")},
                threads=torch.get_num_threads(),
                batch_size=batch_size, attention=kernel_of,
                compile=compile, runtimes=runtimes, weight_layout=weight_layout,
                kv_fill="random K/V written into the cache", copy_gb_s=bw / 1e9,
                model={k: getattr(c, k) for k in ("n_layer", "n_embd", "n_head", "head_dim", "vocab_size")},
                fold_max_logit_diff=fold_diffs, op_floor_ms=op_floor_ms, matmul_gflop_s=flops_peak / 1e9,
                results=rows, compile_costs=list(costs.values()), breakdown=list(breakdown.values()), targets=targets,
                llama_cpp=dict(version=llamacpp.version(), ours_over_llama_cpp=ratios) if runners else None,
                compile_counters=compile_counters() if compile == "graphs" else None)


if __name__ == "__main__":  # a test may import this file to call resolve_auto
    started = time.perf_counter()
    result = run_decode()
    result["total_s"] = time.perf_counter() - started
    print(f"\nbench_decode: {result['total_s']:.0f} s in all (packages and our op built here included)")
    print(json.dumps(result, default=str))
