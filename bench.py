"""
Training throughput and paper-scale costs (nanoGPT's bench.py role; decode speed is
bench_decode.py).

    python bench.py                   # training tokens/s: VHA vs GQA-8 vs the same-deploy GQA, interleaved
    python bench.py --dtype=bfloat16  # the same under bf16 autocast
    python bench.py --costs=True      # the paper's 1.7B shapes: params, KV bytes, training FLOPs (meta device)

Speed does not depend on training, so the models have random weights; the variants take one
optimizer step each in turn (machine noise hits them alike), and figures are medians with warm-up
steps excluded. The last stdout line is one JSON object with every figure; --figures=PATH also
appends one JSON line per model the moment it is measured (its first step, the compile when
compiled, then its timed row), so a run cut at a time limit keeps them (lab/gpu_check.py).
"""
import json
import os
import sys
import time
from contextlib import nullcontext

import torch

import nanovha.mla_mfa  # noqa: F401 (registers attn="mla" and "mfa")
from nanovha.config import ConfigError, at_least, config_file_values, flat_defaults, need, settings, stop_if
from nanovha.costs import flops_per_token, kv_bytes_per_token
from nanovha.figures import compile_counters, gpu_spec, print_table, verdict
from nanovha.hardware import allow_tf32, torch_dtype
from nanovha.outputs import append_line, output_problem
from nanovha.timing import interleaved, synchronize
from nanovha.variants import overrides
from model import GPT, GPTConfig

# -----------------------------------------------------------------------------
costs = False  # True: the paper-scale cost table instead of the timing
n_layer = 4
n_embd = 256
n_head = 16  # query heads that attend (VHA: the virtual heads)
head_dim = 16
vocab_size = 128  # small, so the LM head does not hide the attention
vha_kv_head = 2  # VHA: n_head virtual heads from n_head / vha_kv_head physical projections
batch_size = 16
block_size = 256  # tokens per sequence
train_steps = 10  # timed steps per variant
# all, or a comma list of vha, gqa8 and gqaK (K = vha_kv_head: the model VHA folds into)
train_variants = "all"
warmup = 3  # untimed steps per variant
# every cost config is a diff applied after it (the base itself: none)
cost_base = "config/paper_1p7b_gqa8.py"
cost_configs = ("config/paper_1p7b_gqa8.py,config/paper_1p7b_gqa2.py,config/paper_1p7b_gqa_8q2kv.py,"
                "config/paper_1p7b_vha.py,config/paper_1p7b_mla.py,config/paper_1p7b_mfa.py")
device = "auto"
dtype = "float32"  # float32, or bfloat16 (autocast)
compile = False
threads = 0  # CPU threads (0: torch's default)
seed = 1337
figures = ""  # a JSON-lines file: one line per model appended as it is measured ("": none)
# -----------------------------------------------------------------------------
LIMITS = {**{k: at_least(1) for k in ("n_layer", "n_embd", "n_head", "head_dim", "vocab_size", "vha_kv_head",
                                     "batch_size", "block_size", "train_steps")},
          "warmup": at_least(0), "dtype": ("float32", "bfloat16")}  # bfloat16: autocast
globals().update(settings(flat_defaults(globals()), sys.argv[1:], limits=LIMITS))
stop_if(output_problem({"--figures": figures}, {}, kinds={"--figures": "figures"}))


device_type = device.split(":")[0]
ptdtype = torch_dtype(dtype)
if threads:
    torch.set_num_threads(threads)
if device_type == "cuda":
    allow_tf32()  # as train.py: TF32 for the float32 matmuls autocast leaves


def note(**figure):
    """One figure of this run, appended to --figures the moment it is measured."""
    if figures:
        append_line(figures, dict(n_layer=n_layer, n_embd=n_embd, batch_size=batch_size, block_size=block_size,
                                  dtype=dtype, compile=compile, **figure))


def first_noted(name, step):
    """step, whose first call (the compile, when compiled) is noted when it ends."""
    calls = []

    def noted():
        t0 = time.perf_counter()
        step()
        if not calls:
            synchronize(device_type)
            calls.append(time.perf_counter() - t0)
            note(variant=name, first_step_s=calls[0])
    return noted


def build(**kw):
    """A random-weight model of the benchmark's shape; kw picks the attention."""
    try:
        return GPT(GPTConfig(vocab_size=vocab_size, block_size=block_size, n_layer=n_layer, n_embd=n_embd,
                             n_head=n_head, head_dim=head_dim, **kw))
    except ValueError as e:
        need(False, e)


# ----------------------------------------------------------------------------- training throughput
def run_train():
    need(vha_kv_head != 8, "train mode compares VHA with GQA-8 and same-deploy GQA: vha_kv_head must not be 8")
    kinds = {name: overrides(name, n_head, head_dim, n_embd, vha_kv_head)  # nanovha/variants.py
             for name in ("vha", "gqa8", f"gqa{vha_kv_head}")}
    chosen = list(kinds) if train_variants == "all" else train_variants.split(",")
    need(chosen and set(chosen) <= set(kinds), f"train_variants: all, or a comma list of "
                                               f"{', '.join(kinds)}; "
                                               f"got {train_variants!r}")
    kinds = {name: kw for name, kw in kinds.items() if name in chosen}
    autocast = torch.autocast(device_type, dtype=ptdtype) if dtype == "bfloat16" else nullcontext()
    gen = torch.Generator().manual_seed(seed)
    x, y = (torch.randint(vocab_size, (batch_size, block_size), generator=gen).to(device) for _ in range(2))
    models, steps = {}, {}
    for name, kw in kinds.items():
        torch.manual_seed(seed)
        model = models[name] = build(**kw).to(device).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1,
                                **({"fused": True} if device_type == "cuda" else {}))  # as train.py
        fwd = torch.compile(model) if compile else model

        def step(fwd=fwd, opt=opt):
            with autocast:
                loss = fwd(x, y)[1]
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        steps[name] = first_noted(name, step)
    print(f"device {device}, dtype {dtype}, threads {torch.get_num_threads()}, compile {compile}; {n_layer} layers, "
          f"width {n_embd}, {n_head} query heads of dim {head_dim}, batch {batch_size} x "
          f"{block_size} tokens; "
          f"{train_steps} timed steps (+{warmup} warm-up) per model, interleaved")
    seconds = interleaved(steps, train_steps, warmup, device_type)
    # dense bf16 FLOP/s; None: unknown
    peak = gpu_spec(torch.cuda.get_device_name())[0] if device_type == "cuda" else None
    rows = []
    for name, model in models.items():
        c, tok_s = model.cfg, batch_size * block_size / seconds[name]
        flops = flops_per_token(model.cfg, block_size, training=True)
        rows.append(dict(variant=name, heads=f"{c.n_q_proj}->{c.n_attn_head}Q/{c.n_kv_head}KV",
                         params_m=model.num_params() / 1e6, flops_per_token=flops, ms_per_step=seconds[name] * 1e3,
                         tok_s=tok_s, mfu=flops * tok_s / peak if peak else None))
        note(**rows[-1])
    named = {r["variant"]: r for r in rows}
    for r in rows:
        if "gqa8" in named:
            r["speed_vs_gqa8"], r["flops_vs_gqa8"] = (r["tok_s"] / named["gqa8"]["tok_s"],
                                                      r["flops_per_token"] / named["gqa8"]["flops_per_token"])
    print_table(rows, [("variant", "variant", "{}"), ("q proj->attn heads/KV", "heads", "{}"),
                       ("params M", "params_m", "{:.2f}"), ("train FLOPs/token", "flops_per_token", "{:.3e}"),
                       ("FLOPs vs gqa8", "flops_vs_gqa8", "{:.3f}"), ("ms/step", "ms_per_step", "{:.1f}"),
                       ("tokens/s", "tok_s", "{:.0f}"), ("speed vs gqa8", "speed_vs_gqa8", "{:.3f}"),
                       ("MFU", "mfu", "{:.1%}")])
    note(compile_counters=compile_counters() if compile else None)
    targets = train_targets(named)
    return dict(mode="train", device=device, dtype=dtype, threads=torch.get_num_threads(), compile=compile,
                block_size=block_size, batch_size=batch_size, results=rows, targets=targets,
                # graphs, breaks: one graph per model
                compile_counters=compile_counters() if compile else None)


def train_targets(named):
    """{variant: row} -> the speed targets of the models present, printed: VHA >= 1.05x GQA-8,
    VHA >= same-deploy."""
    vha, same, targets, said = named.get("vha"), named.get(f"gqa{vha_kv_head}"), {}, []
    if vha and "gqa8" in named:
        targets["vha_over_gqa8"] = ratio = vha["speed_vs_gqa8"]
        said.append(f"VHA >= 1.05x GQA-8 tokens/s: {ratio:.3f}x  {verdict(ratio >= 1.05)}")
    if vha and same:
        targets["vha_over_gqa_same"] = ratio = vha["tok_s"] / same["tok_s"]
        said.append(f"VHA >= same-deploy {same['variant']}: {ratio:.3f}x  {verdict(ratio >= 1)}")
    if said:
        print("targets: " + "; ".join(said))
    return targets


# ----------------------------------------------------------------------------- paper-scale costs
PAPER_VOCAB = 151936  # Qwen3's tokenizer; train.py takes the vocab from the dataset, so the config files cannot set it


# the paper's training/prefill GFLOPs per token at 1.7B, S=4096 (1 KB/layer/token except GQA-8); it
# gives no MLA figure there
PAPER_GFLOPS = {"paper_1p7b_gqa8.py": 10.61, "paper_1p7b_vha.py": 9.78, "paper_1p7b_mfa.py": 15.90}


def in_repo(path):
    """config/... of this repo, from any folder."""
    if not os.path.isabs(path) and not os.path.isfile(path):
        return os.path.join(os.path.dirname(os.path.abspath(__file__)), path)
    return path


def run_costs():
    rows = []
    for path in map(in_repo, cost_configs.split(",")):
        try:  # train.py's keys: the base, then the diff; keep the ones GPTConfig knows
            base = config_file_values(in_repo(cost_base))
            values = {**base, **config_file_values(path, base)}
        except ConfigError as e:
            need(False, e)
        known = {k: v for k, v in values.items() if k in GPTConfig.__dataclass_fields__}
        with torch.device("meta"):  # shapes only: nothing is allocated
            model = GPT(GPTConfig(**dict(known, vocab_size=PAPER_VOCAB)))
        c, T = model.cfg, model.cfg.block_size
        rows.append(dict(config=os.path.basename(path), attn=c.attn,
                         heads=f"{c.n_q_proj}->{c.n_attn_head}Q/{c.n_kv_head}KV", params_b=model.num_params() / 1e9,
                         kv_bytes_per_layer=kv_bytes_per_token(model.cfg, torch.bfloat16) // c.n_layer,
                         kv_kb_per_token=kv_bytes_per_token(model.cfg, torch.bfloat16) / 1024, T=T,
                         train_flops_per_token=flops_per_token(model.cfg, T, training=True),
                         paper_gflops=PAPER_GFLOPS.get(os.path.basename(path))))
    for r in rows:
        r["flops_vs_first"] = r["train_flops_per_token"] / rows[0]["train_flops_per_token"]
        if r["paper_gflops"] and rows[0]["paper_gflops"]:
            r["paper_vs_first"] = r["paper_gflops"] / rows[0]["paper_gflops"]
    print(f"paper-scale costs (vocab {PAPER_VOCAB}, bf16 KV cache, training FLOPs at each file's block_size; "
          "model.py's accounting)")
    print_table(rows, [("config", "config", "{}"), ("attn", "attn", "{}"), ("q proj->attn heads/KV", "heads", "{}"),
                       ("params B", "params_b", "{:.3f}"), ("KV B/layer/token", "kv_bytes_per_layer", "{}"),
                       ("KV KB/token", "kv_kb_per_token", "{:.0f}"), ("T", "T", "{}"),
                       ("train FLOPs/token", "train_flops_per_token", "{:.3e}"),
                       (f"FLOPs vs {rows[0]['config']}", "flops_vs_first", "{:.4f}"),
                       ("paper GFLOPs/token", "paper_gflops", "{:.2f}"),
                       ("paper vs first", "paper_vs_first", "{:.4f}")])
    out = dict(mode="costs", results=rows)
    vha = next((r for r in rows if r["attn"] == "vha"), None)
    if vha:
        ref = rows[0]
        out["flops_reduction"] = 1 - vha["flops_vs_first"]
        kv_ok = (ref["kv_bytes_per_layer"], vha["kv_bytes_per_layer"]) == (4096, 1024)
        print(f"KV per layer per token (bf16): {ref['config']} {ref['kv_bytes_per_layer']} B vs {vha['config']} "
              f"{vha['kv_bytes_per_layer']} B (paper: 4 KB vs 1 KB)  {verdict(kv_ok)}")
        print(f"training FLOPs/token reduction of {vha['config']} vs {ref['config']}: "
              f"{out['flops_reduction']:.2%} "
              f"(paper: 6.5%-8.1%)  {verdict(0.065 <= out['flops_reduction'] <= 0.081)}")
    return out


print(json.dumps(run_costs() if costs else run_train(), default=str))
