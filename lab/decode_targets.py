"""
bench_decode.py's verdicts: the folded VHA model's decode targets and our decode against
llama.cpp's, printed PASS/FAIL beside the figures they rest on, returned as numbers for the JSON
line.
"""
from nanovha.figures import verdict

HANDICAP = 1.5  # a variant's attention slower than this times its roof: a ratio against it would flatter the other


def check_targets(models, at, breakdown, top, op_floor_ms, dtype_name, runtimes, same_deploy):
    """The folded VHA model's decode targets at context `top` in the first of `runtimes`, printed
    PASS/FAIL
    -> {name: measured ratio}. same_deploy: the GQA variant of the folded model's shape, built directly.
    """
    targets, runtime = {}, runtimes[0]
    if "vha_folded" not in models:
        return targets
    vha, b = at[("vha_folded", runtime, top)], breakdown["vha_folded"]
    note = "" if (top, dtype_name) == (16384, "float32") else f"  (set at 16K float32; this is {top}, {dtype_name})"
    print(f"\ntargets at context {top} ({runtime}):{note}")
    if "mha" in models:  # each at its faster runtime: a compiled step can lose to eager (MHA's long caches)
        fastest = {n: max(at[(n, r, top)]["decode_tok_s"] for r in runtimes) for n in ("vha_folded", "mha")}
        targets["vha_over_mha"] = x = fastest["vha_folded"] / fastest["mha"]
        kv_only = f"{breakdown['mha']['kv_ms'] / b['kv_ms']:.1f}x" if b["kv_ms"] > 0 else "n/a"
        targets["vha_over_mha_roofline"] = best = breakdown["mha"]["roofline_ms"] / b["roofline_ms"]
        print(f"  folded VHA decode tok/s >= 3x MHA (each at its faster runtime): {x:.2f}x (the KV parts alone, "
              f"{runtime}: {kv_only}; at the roofline, "
              f"weights + KV at peak bandwidth, no implementation can beat {best:.2f}x)  {verdict(x >= 3)}")
        print(f"  VHA / MHA at most 1.1x the rooflines' ratio (no baseline handicapped): {x:.2f}x vs {best:.2f}x  "
              f"{verdict(x <= 1.1 * best)}")
        if breakdown["mha"].get("handicapped"):
            print(f"  the MHA baseline's attention is HANDICAPPED (> {HANDICAP}x its roof): a VHA / MHA ratio "
                  "flatters VHA")
    if same_deploy in models:
        targets["vha_over_gqa_same"] = x = vha["decode_tok_s"] / at[(same_deploy, runtime, top)]["decode_tok_s"]
        print(f"  folded VHA within 5% of {same_deploy} (same deployed shape, built directly): {x:.3f}x  "
              f"{verdict(abs(x - 1) <= 0.05)}")
    targets["vha_bw_frac"] = x = vha["bw_frac"]
    print(f"  folded VHA >= 50% of copy bandwidth (weights + KV per step / time): {x:.0%}  {verdict(x >= 0.5)}")
    attention = [(r["attn_ms"] / r["attn_roof_ms"], n) for n, r in breakdown.items() if "attn_ms" in r]
    worst = max(attention)
    targets["worst_attention_over_roof"] = worst[0]
    print(f"  every variant's one-token attention within {HANDICAP}x of its roof: worst {worst[0]:.2f}x ({worst[1]})  "
          f"{verdict(worst[0] <= HANDICAP)}")
    print(f"  where the time goes: {b['ms_top']:.2f} ms/token = {b['ms_ctx1']:.2f} ms fixed (weights at peak: "
          f"{b['weights_ms']:.2f}, per-op overhead alone: {op_floor_ms:.2f}) + {b['kv_ms']:.2f} ms for the KV cache; "
          f"roofline {b['roofline_ms']:.2f} ms")
    return targets


def llama_ratios(at, runners, ctxs, breakdown, runtimes):
    """Our decode tok/s over llama.cpp's, same model, per context and runtime -> {runner:
    {runtime: {ctx: ratio}}}, printed, with the targets for the first runtime: >= 1.0x from 1K
    on, a fixed cost per token (context 1) at most llama.cpp's."""
    ratios = {}
    for name, (_, base) in runners.items():
        ours, theirs_fixed = breakdown[base]["ms_ctx1"], breakdown[name]["ms_ctx1"]
        print(f"\nfixed cost per token (context 1), {base}: ours ({runtimes[0]}) {ours:.2f} ms, llama.cpp "
              f"{theirs_fixed:.2f} ms: {ours / theirs_fixed:.2f}x theirs  <= 1x: "
              f"{verdict(ours <= theirs_fixed)}")
        theirs = {ctx: at[(name, "llama.cpp", ctx)]["decode_tok_s"] for ctx in ctxs}
        ratios[name] = {r: {ctx: at[(base, r, ctx)]["decode_tok_s"] / theirs[ctx] for ctx in ctxs} for r in runtimes}
        for runtime, by_ctx in ratios[name].items():
            line = ", ".join(f"{x:.2f}x at {c}" for c, x in by_ctx.items())
            judged = [x for c, x in by_ctx.items() if c >= 1024]
            goal = f"  >= 1.0x from 1K: {verdict(min(judged) >= 1.0)}" if runtime == runtimes[0] and judged else ""
            print(f"\nours ({runtime}) / llama.cpp decode tok/s, {base}: {line}{goal}")
    return ratios
