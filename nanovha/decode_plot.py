"""The figure of bench_decode.py --plot: decode speed and KV memory against context."""
from nanovha.outputs import save_figure



def plot_decode(rows, ctxs, path, runtimes, title):
    """Two panels against context: decode tokens/s of every (variant, runtime) row, and the KV
    cache allocated (the first runtime's rows). runtimes: the benchmark's, the first the one its
    targets judge."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for name, runtime in dict.fromkeys((r["variant"], r["runtime"]) for r in rows):
        mine = [r for r in rows if (r["variant"], r["runtime"]) == (name, runtime)]
        label = name if runtime in (runtimes[0], "llama.cpp") else f"{name} ({runtime})"
        style = ":" if runtime == "eager" and len(runtimes) == 2 else "--" if "vha" in name else "-"
        for ax, key in zip(axes, ("decode_tok_s", "kv_cache_mb")):
            if key == "decode_tok_s" or runtime == runtimes[0]:
                ax.plot([r["ctx"] for r in mine], [r[key] for r in mine], marker="o", label=label, ls=style)
    for ax, label in zip(axes, ("decode tokens/s", "KV cache allocated (MB)")):
        ax.set(xscale="log", xlabel="context (tokens)", ylabel=label)
        ax.set_xticks(ctxs, [f"{c // 1024}K" if c % 1024 == 0 else str(c) for c in ctxs])
        ax.minorticks_off()
        ax.grid(alpha=0.3)
    axes[1].set_yscale("log")
    axes[0].legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    print(f"wrote {path}")
