"""
The recall sweep's report sections (sweep.py report): paired comparisons of the variants seed by
seed, how they change between points, success rates; each a list of Markdown lines.
"""
import numpy as np

from lab.experiments import clopper_pearson, fmt_paired, mcnemar, mde, paired, primary_lines


def paired_line(A, B, key, scale, digits, tested=True):
    """Paired a - b of one measure over shared seeds, formatted, with its MDE: the difference
    these seeds detect with 80% power at 5% (experiments.mde, (t_crit + t_80) x SE).
    tested=False: the mean alone, no test."""
    stat = paired({s: r[key] for s, r in A.items()}, {s: r[key] for s, r in B.items()})
    if not tested:
        return f"{stat[1] * scale:+.{digits}f} (n={stat[0]}, not tested)", "-"
    text = fmt_paired(*stat, scale=scale, digits=digits)
    return (f"**{text}**" if stat[4] else text), (f"{mde(stat[2], stat[0]) * scale:.{digits}f}" if stat[0] > 1 else "-")


def primary_section(at, point, pairs):
    """A plan's comparisons of AUC at one point, every shared seed (a run that never learned
    included)."""
    values = {pair: tuple({s: r["auc"] for s, r in at(point, v).items()} for v in pair) for pair in pairs}
    return primary_lines(values, f"AUC (points) at {point}", 100, 2)


def paired_section(at, points, th, primary, comparisons):
    """sweep.md's paired comparisons of the (a, b) pairs in comparisons: at(point, variant) ->
    {seed: result}; th: the success threshold."""
    lines = ["## Paired comparisons" + (" (exploratory)" if primary else ""), "",
             "Δ = first minus second over the seeds both ran, mean ± SE (|t| in SE, n seeds). "
             "**Bold**: the paired "
             "t-test rejects 'no difference' at 5%, each test on its own (uncorrected for the many in this table"
             + ("; the primary ones are above" if primary else "") + "). MDE: the difference these seeds would "
             "detect with 80% power, (t_crit + t_80) x SE (the test itself rejects beyond t_crit x SE). Fewer steps "
             "and a larger AUC are better. Steps to 90% over all seeds is not tested where a run failed (it would "
             f"count as the whole budget): AUC carries those. 'Seeds both learned' is conditional on the outcome "
             "(how fast, given that both learn; how often they learn is the success column). "
             "Success: seeds where "
             f"only the first / only the second reached {th:.0%}, exact McNemar p.", "",
             "| comparison | point | Δ steps to 90% | MDE | Δ steps to 90%, seeds both learned "
             "(conditional) | MDE "
             "| Δ AUC (points) | MDE | Δ final accuracy (points) | success: only first / only second (p) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for a, b in comparisons:
        for p in points:
            A, B = at(p, a), at(p, b)
            if A and B:
                shared = set(A) & set(B)
                both = [x for x in shared if min(A[x]["acc"], B[x]["acc"]) >= th]
                steps, steps_mde = paired_line(A, B, "steps_to_90", 1, 0, tested=len(both) == len(shared))
                learned, learned_mde = paired_line({x: A[x] for x in both}, {x: B[x] for x in both},
                                                   "steps_to_90", 1, 0)
                auc, auc_mde = paired_line(A, B, "auc", 100, 1)
                acc, _ = paired_line(A, B, "acc", 100, 1)
                only_a, only_b, pv = mcnemar({s: r["acc"] >= th for s, r in A.items()},
                                             {s: r["acc"] >= th for s, r in B.items()})
                lines.append(f"| {a} vs {b} | {p} | {steps} | {steps_mde} | {learned} | "
                             f"{learned_mde} | {auc} | "
                             f"{auc_mde} | {acc} | {only_a} / {only_b} (p = {pv:.3g}) |")
    return lines


def change_section(at, points, comparisons):
    """How each comparison's AUC difference changes from the first point to each other one,
    paired over the seeds that ran all four cells: (a - b at point k) - (a - b at the first
    point). Exploratory (not planned here)."""
    lines = ["## How each comparison changes between points (exploratory)", "",
             f"Δ AUC (points) of first minus second at each point, and its change from {points[0]}: "
             "(Δ at the point) - (Δ at the first point) per seed, mean ± SE over the seeds that ran both variants "
             "at both points. **Bold**: a paired t-test rejects 'no change' at 5%, uncorrected.", "",
             "| comparison | point | Δ AUC there | Δ AUC at the first point | change |", "|---|---|---|---|---|"]
    for a, b in comparisons:
        for p in points[1:]:
            cells = [at(q, v) for q in (p, points[0]) for v in (a, b)]
            seeds = sorted(set.intersection(*(set(c) for c in cells)))
            if len(seeds) < 2:
                continue
            there, first = ({s: A[s]["auc"] - B[s]["auc"] for s in seeds} for A, B in (cells[:2], cells[2:]))
            change, _ = paired_line({s: {"d": there[s]} for s in seeds}, {s: {"d": first[s]} for s in seeds},
                                    "d", 100, 1)
            lines.append(f"| {a} vs {b} | {p} | {signed(there.values())} | "
                         f"{signed(first.values())} | {change} |")
    return lines + [""]


def signed(values):
    """'+mean ± SE' in points of a list of fractions."""
    values = list(values)
    return f"{np.mean(values) * 100:+.1f} ± {np.std(values, ddof=1) / np.sqrt(len(values)) * 100:.1f}"


def success_rate(runs, th):
    """'k/n (lo-hi%)': runs reaching th, with the exact (Clopper-Pearson) 95% interval of the
    rate."""
    k, n = sum(r["acc"] >= th for r in runs), len(runs)
    lo, hi = clopper_pearson(k, n)
    return f"{k}/{n} ({lo:.0%}-{hi:.0%})"
