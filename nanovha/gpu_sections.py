"""
The GPU check's two in-process sections that need the model (scripts/gpu_check.py runs each in
its own process): correctness, bf16 logits against a float64 reference on every path the
benchmarks time, and the SDPA kernels each training, prefill and decode step really runs (the
profiler's op names). Each says a line and records a figure (the script's say and figure) the
moment one is measured, so a section cut at its limit keeps what came before. On a CPU (the dry
run) the same code runs at toy size.
"""
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from model import GPT, GPTConfig, fold_to_gqa
from nanovha.gpu_plan import describe
from nanovha.hardware import sdpa_backends
from nanovha.variants import overrides


def max_rel(a, ref):
    return ((a.double() - ref).abs().max() / ref.abs().max()).item()


def decoded(model, idx, impl, compiled=None):
    """Logits of positions 31..62: a prefill of 32 tokens, then one token at a time (compiled: the
    benchmark's graph step, torch.compile's mode, over a tensor position and the static cache)."""
    model.cfg.decode_impl = impl
    model.setup_cache(1, 64)
    out = [model.prefill(idx[:, :32])]
    if compiled:
        step = torch.compile(model.decode_one_token, fullgraph=True, mode=compiled["mode"])
        pos = torch.tensor([32], device=idx.device)
        for t in range(32, 63):
            out.append(step(idx[:, t:t + 1], pos).clone())
            pos.add_(1)
    else:
        out += [model.decode_one_token(idx[:, t:t + 1], t) for t in range(32, 63)]
    return torch.stack(out, 1)  # (1, 32, vocab)


def correctness(device, dry_run, compiled, say, figure):
    """The fold in float64, then each bf16 path against the float64 reference, the compiled step
    last (its compile is the slow part; not run when compiled is False) -> {path: max relative
    error}."""
    tol = 5e-2  # bf16: a few rounding steps of ~0.4% each through the layers
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=128, block_size=256, n_layer=2, n_embd=64 if dry_run else 512, n_head=16,
                    head_dim=16 if dry_run else 32, n_kv_head=2, attn="vha", vha_postmix_rank=2)
    vha = GPT(cfg).double()
    with torch.no_grad():  # premix and postmix off the identity, so the fold has something to fold
        for block in vha.blocks:
            block.attn.premix.add_(0.1 * torch.randn_like(block.attn.premix))
            block.attn.postmix_V.normal_(0, 0.3)
    folded = fold_to_gqa(vha)
    idx = torch.randint(cfg.vocab_size, (1, 64), generator=torch.Generator().manual_seed(0)).to(device)
    vha, folded = vha.to(device).eval(), folded.to(device).eval()
    with torch.inference_mode():
        ref = vha(idx)[0]  # (1, 64, vocab) float64, unfolded, uncached: the reference
        d64 = max_rel(folded(idx)[0], ref)
    say(f"float64: folded vs unfolded {d64:.1e}  {'PASS' if d64 < 1e-10 else 'FAIL'} (an exact fold: < 1e-10)")
    figure(path="float64 fold", max_rel=d64, ok=d64 < 1e-10)
    a16, f16 = vha.to(torch.bfloat16), folded.to(torch.bfloat16)
    paths = [("forward, unfolded", lambda: a16(idx)[0], ref), ("forward, folded", lambda: f16(idx)[0], ref),
             ("eager decode, grouped", lambda: decoded(f16, idx, "grouped"), ref[:, 31:63]),
             ("eager decode, sdpa", lambda: decoded(f16, idx, "sdpa"), ref[:, 31:63])]
    compiled_name = "compiled step" + (" (dry run: no CUDA graphs)" if dry_run else ", CUDA graphs")
    mode = dict(mode=None if dry_run else "reduce-overhead")
    if compiled:
        paths.append((compiled_name, lambda: decoded(f16, idx, "grouped", mode), ref[:, 31:63]))
    measured = {"float64 fold": d64}
    with torch.inference_mode():
        for name, logits, want in paths:
            d = measured[f"bf16 {name}"] = max_rel(logits(), want)
            say(f"bf16 {name:40s} {d:.1e} of the largest logit  {'PASS' if d <= tol else 'FAIL'} "
                f"(tolerance {tol:.0e})")
            figure(path=f"bf16 {name}", max_rel=d, tolerance=tol, ok=d <= tol)
    if not compiled:
        say(f"bf16 {compiled_name:40s} not run (eager only)")
    return measured


def decode_model(variant, **shape):
    """A decode variant as bench_decode.py builds it (nanovha/variants.py): gqaN / mha / mqa
    directly, vha_folded through fold_to_gqa."""
    model = GPT(GPTConfig(**shape, **overrides(variant, shape["n_head"], shape["head_dim"], shape["n_embd"])))
    return fold_to_gqa(model) if variant == "vha_folded" else model


def train_steps_kernels(device, dry_run, say, figure, failed):
    """The SDPA backend of the GQA and VHA training steps (float32 and bf16 autocast), then of a
    step forced onto the math path, which must read as math."""
    shape = dict(vocab_size=512, block_size=1024, n_layer=1, n_embd=256 if dry_run else 768, n_head=16,
                 head_dim=64)
    x = torch.randint(512, (2, 128 if dry_run else 1024), device=device)

    def train_step(model, dtype):
        with torch.autocast(device, dtype=dtype, enabled=dtype != torch.float32):
            loss = model(x, x)[1]
        loss.backward()
    for name, kw in (("gqa", dict(n_kv_head=2)), ("vha", dict(n_kv_head=2, attn="vha", vha_postmix_rank=4))):
        model = GPT(GPTConfig(**shape, **kw)).to(device).train()
        for dtype in (torch.float32, torch.bfloat16):
            backends, ops = sdpa_backends(lambda: train_step(model, dtype))
            label = f"train {name} 16Q/2KV {'bf16 autocast' if dtype == torch.bfloat16 else 'float32'}"
            say(f"{label:32s} {describe(backends, ops)}")
            figure(step=label, backends=backends)
            if "math" in backends or not backends:
                failed.append(label)
    model = GPT(GPTConfig(**shape, n_kv_head=2)).to(device).train()
    with sdpa_kernel([SDPBackend.MATH]):
        backends, ops = sdpa_backends(lambda: train_step(model, torch.float32))
    say(f"{'self-check: forced SDPBackend.MATH':32s} {describe(backends, ops)}  "
        f"{'PASS' if backends == ['math'] else 'FAIL'} (the detector sees the math path)")


def sdpa_kernels(device, dry_run, variants, say, figure):
    """The training steps' kernels, then each decode variant's prefill, eager step and static
    (graph-path) step, as deployed (SDPA in bf16 on CUDA, grouped fp32 on CPU) -> the steps that
    took the math path (a FAIL)."""
    failed = []
    train_steps_kernels(device, dry_run, say, figure, failed)
    decode_impl = "sdpa" if device == "cuda" else "grouped"
    bench_dtype = torch.bfloat16 if device == "cuda" else torch.float32
    shape = dict(vocab_size=128, block_size=1024, n_layer=1, n_embd=64 if dry_run else 512, n_head=16,
                 head_dim=16 if dry_run else 32, decode_impl=decode_impl)
    length = 64 if dry_run else 32768  # bench_decode's prefill_max on CUDA
    prompt = torch.randint(128, (1, length), device=device)
    for variant in variants:
        torch.manual_seed(0)
        model = decode_model(variant, **shape).to(device, bench_dtype).eval()
        model.setup_cache(1, length + 2)
        token = prompt[:, :1]
        for label, step in ((f"prefill {length}", lambda: model.prefill(prompt)),
                            (f"decode step ({decode_impl})", lambda: model.decode_one_token(token, length)),
                            ("static step (graph path)",
                             lambda: model.decode_one_token(token, torch.tensor([length + 1], device=device)))):
            try:
                with torch.inference_mode():
                    backends, ops = sdpa_backends(step)
                line = describe(backends, ops)
            except torch.OutOfMemoryError:  # a math fallback at 32K builds 16 x 32K^2 scores
                backends, line = ["math"], "out of memory (a math fallback?)"
            say(f"{variant:10s} {label:24s} {line}")
            figure(variant=variant, step=label, backends=backends)
            if label.startswith("prefill") and ("math" in backends or not backends):
                failed.append(f"{variant} {label}")
    say("FAIL: the math path (or no SDPA) in " + ", ".join(failed) if failed else
        "no training or prefill step takes the math path  PASS")
    return failed
