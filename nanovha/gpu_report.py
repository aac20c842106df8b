"""
The GPU check's record (scripts/gpu_check.py): every figure printed and appended to
report_dir/figures/<section>.jsonl the moment it is measured (one JSON line per model and
context), bench_decode.py's printed table read back into such lines, and report.md and
report.json written again after every section with each section's figures, so a section cut at
its limit keeps what it measured. No torch at import: the check's parent process writes the
report.
"""
import json
import os
import re


def append_figure(path, figure):
    """One figure: printed as `FIGURE {...}` and appended to the JSON-lines file path (flushed, so
    a process killed a moment later keeps it)."""
    line = json.dumps(figure, default=str)
    print(f"FIGURE {line}", flush=True)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "a") as f:
        f.write(line + "\n")


def read_figures(report_dir, section):
    """The figures a section appended so far (a line cut mid-write is dropped)."""
    path = os.path.join(report_dir, "figures", f"{section}.jsonl")
    if not os.path.exists(path):
        return []
    figures = []
    for line in open(path):
        try:
            figures.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return figures


# bench_decode.py's decode table (hardware.print_table): the columns a figure keeps, and their types
DECODE_COLUMNS = {"variant": str, "runtime": str, "context": int, "decode ms/tok": float, "decode tok/s": float,
                  "GB/s": float}


def decode_rows(text):
    """The rows of every decode table bench_decode.py printed in text (one per variant, runtime and
    context) -> [{variant, runtime, ctx, decode_ms, decode_tok_s, gb_s}], as printed (rounded)."""
    rows, header = [], None
    for line in (text or "").splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        if cells[:3] == ["variant", "runtime", "context"] and "decode tok/s" in cells:
            header = cells
            continue
        values = line.split()
        if header is None or len(values) != len(header):
            header = None
            continue
        row = dict(zip(header, values))
        try:
            row = {name: kind(row[name]) for name, kind in DECODE_COLUMNS.items() if row[name] != "-"}
        except ValueError:
            header = None
            continue
        rows.append(dict(variant=row["variant"], runtime=row["runtime"], ctx=row["context"],
                         decode_ms=row.get("decode ms/tok"), decode_tok_s=row.get("decode tok/s"),
                         gb_s=row.get("GB/s")))
    return rows


def section_result(report_dir, name):
    """What a section wrote to sections/<name>.json at its end ({lines, figures}), or None."""
    path = os.path.join(report_dir, "sections", f"{name}.json")
    return json.load(open(path)) if os.path.exists(path) else None


def with_device(report_dir, header):
    """The header with the preflight's device, torch and CUDA when it said them (the parent never
    touches the GPU)."""
    said = [f for f in read_figures(report_dir, "preflight") if "torch" in f]
    if not said:
        return header
    pre = said[-1]
    spec = (f"spec {pre['peak'] / 1e12:.0f} TFLOP/s dense bf16, HBM {pre['hbm'] / 1e12:.2f} TB/s" if pre.get("hbm")
            else "no spec-sheet figures")
    return f"{header}\n\nDevice {pre['device']}: torch {pre['torch']}, CUDA {pre['cuda']}, {spec}"


def write_report(report_dir, titles, header, done):
    """report.md (each section's status and lines) and report.json (the same, with each section's
    figures as measured), both written whole again: called after every section."""
    body = [with_device(report_dir, header), ""]
    for s in done:
        s["figures"] = read_figures(report_dir, s["name"])
        body += [f"## {titles[s['name']]}", "", f"{s['status']}, {s['wall_s']:.0f} s wall, "
                 f"{len(s['figures'])} figures", "", "```", *s["lines"], "```", ""]
    with open(os.path.join(report_dir, "report.md"), "w") as f:
        f.write("\n".join(body))
    with open(os.path.join(report_dir, "report.json"), "w") as f:
        json.dump(dict(header=with_device(report_dir, header), sections=done), f, indent=1, default=str)
