"""
The one prepared GPU check: about 8 minutes on one H100/H200, a compact report at the end.

    python scripts/gpu_check.py                      # on a CUDA machine
    python scripts/gpu_check.py --data_dir=data/fineweb_edu   # smoke on real text instead of random tokens
    python scripts/gpu_check.py --dry_run            # every step at toy size on the CPU (what the tests run)

1. correctness on CUDA, float32 and bfloat16: cached decode == the uncached forward, folded VHA == unfolded
2. which SDPA kernel the training step really runs (from the profiler), float32 and bf16 autocast
3. the smoke budget of config/fineweb/vha.py (compile + bf16): tokens/s, MFU, compile time, final loss
4. bench_decode.py at 8K-128K, eager and with CUDA graphs: tokens/s and GB/s against the device's HBM bandwidth

Paste the report into the README and the closing note, naming the device. Nothing here is a test dependency.
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from configurator import ConfigError, configure  # noqa: E402
from data.common import write_split  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402

# -----------------------------------------------------------------------------
dry_run = False  # CPU, toy sizes: checks that every step of this script runs
data_dir = ""  # smoke data; "": random GPT-2 tokens (speed does not depend on the text; the loss then stays near ln 50257)
contexts = "8192,32768,131072"  # decode contexts; CUDA graphs only at the largest two (each compile takes a while)
decode_variants = "mha,gqa8,gqa2,vha_folded"
# -----------------------------------------------------------------------------
try:
    globals().update(configure({k: v for k, v in globals().items() if k in ("dry_run", "data_dir", "contexts", "decode_variants")}, sys.argv[1:]))
except ConfigError as e:
    sys.exit(f"error: {e}")
device = "cpu" if dry_run else "cuda"
if not dry_run and not torch.cuda.is_available():
    sys.exit("error: no CUDA device: this is the GPU check (use --dry_run to check the script on a CPU)")
HBM = {"H200": 4.8e12, "H100 80GB HBM3": 3.35e12, "H100 PCIe": 2.0e12, "H100": 3.35e12, "A100-SXM4-80GB": 2.04e12,
       "A100": 1.56e12, "L40S": 0.864e12, "L4": 0.3e12, "4090": 1.01e12}  # spec sheet bytes/s, first substring match
name = torch.cuda.get_device_name() if device == "cuda" else "CPU (dry run)"
hbm = next((v for k, v in HBM.items() if k in name), None)
report = [f"GPU check on {name}: torch {torch.__version__}, CUDA {torch.version.cuda}, "
          f"HBM spec {hbm / 1e12:.2f} TB/s" if hbm else f"GPU check on {name}: torch {torch.__version__} (HBM bandwidth unknown)"]


def section(title):
    print(f"\n=== {title}", flush=True)
    report.append(f"-- {title}")


def say(line):
    print(line, flush=True)
    report.append("   " + line)


# ---- 1. correctness ----
section("1. correctness: cached decode vs forward, folded vs unfolded (max |logit diff| / max |logit|)")
TOL = {torch.float32: 1e-4, torch.bfloat16: 5e-2}  # bf16: a few rounding steps of ~0.4% each through the layers
torch.manual_seed(0)
cfg = GPTConfig(vocab_size=512, block_size=256, n_layer=2, n_embd=128 if dry_run else 256, n_head=8, n_kv_head=2,
                attn="vha", vha_postmix_rank=2)
vha = GPT(cfg)
with torch.no_grad():  # move premix and postmix off the identity, so the fold has something to fold
    for block in vha.blocks:
        block.attn.premix.add_(0.1 * torch.randn_like(block.attn.premix))
        block.attn.postmix_V.normal_(0, 0.3)
gqa_cfg, state = vha.double().fold_to_gqa()
folded = GPT(gqa_cfg)
folded.load_state_dict(state)
idx = torch.randint(cfg.vocab_size, (2, 64), generator=torch.Generator().manual_seed(0)).to(device)
for dtype in (torch.float32, torch.bfloat16):
    a, b = vha.to(device, dtype).eval(), folded.to(device, dtype).eval()
    with torch.no_grad():
        full = a(idx)[0]  # (B, T, vocab)
        a.setup_cache(idx.size(0), idx.size(1))
        steps = [a.prefill(idx[:, :32])] + [a.decode_one_token(idx[:, t:t + 1], t) for t in range(32, 63)]
        cached = torch.stack(steps, 1)  # (B, 32, vocab): the logits for positions 31..62
        scale = full.abs().max().item()
        d_cache = (cached - full[:, 31:63]).abs().max().item() / scale
        d_fold = (b(idx)[0] - full).abs().max().item() / scale
    ok = d_cache <= TOL[dtype] and d_fold <= TOL[dtype]
    say(f"{str(dtype)[6:]:8s} cached {d_cache:.1e}, folded {d_fold:.1e} (tolerance {TOL[dtype]:.0e})  {'PASS' if ok else 'FAIL'}")


# ---- 2. SDPA backend of the training step ----
section("2. SDPA kernel in the training step (16 query heads of dim 64, 2 KV heads, enable_gqa, causal)")
shape = dict(vocab_size=512, block_size=1024, n_layer=1, n_embd=256 if dry_run else 768, n_head=16, n_kv_head=2, head_dim=64)
for dtype in (torch.float32, torch.bfloat16):
    model = GPT(GPTConfig(**shape)).to(device).train()
    x = torch.randint(512, (2, 128 if dry_run else 1024), device=device)
    auto = torch.autocast(device, dtype=dtype, enabled=dtype == torch.bfloat16)
    with torch.profiler.profile() as prof, auto:
        model(x, x)[1].backward()
    kernels = sorted({e.name for e in prof.events() if "attention" in e.name and e.name.startswith("aten::_")})
    say(f"{'bf16 autocast' if dtype == torch.bfloat16 else 'float32':13s} {', '.join(kernels) or 'no fused kernel: the math path'}")


# ---- 3. smoke training ----
section("3. smoke: config/fineweb/vha.py + config/fineweb/smoke.py, compile + bf16" + (" (toy size, eager, CPU)" if dry_run else ""))
work = tempfile.mkdtemp(prefix="gpu_check_")
if not data_dir:  # random GPT-2 tokens: the same work per step as text
    data_dir = os.path.join(work, "random_tokens")
    rng = np.random.default_rng(0)
    write_split(rng.integers(50257, size=2_000_000 if not dry_run else 20_000), rng.integers(50257, size=200_000 if not dry_run else 5_000),
                data_dir, {"tokenizer": "gpt2", "vocab_size": 50257, "eot_token": 50256, "source": "random tokens (gpu_check)"})
toy = ["--n_layer=1", "--n_embd=64", "--n_head=4", "--n_kv_head=2", "--head_dim=16", "--vha_postmix_rank=1", "--block_size=64",
       "--batch_size=2", "--gradient_accumulation_steps=1", "--max_iters=4", "--lr_decay_iters=4", "--warmup_iters=1",
       "--eval_interval=2", "--eval_iters=1", "--log_interval=1", "--compile=False", "--dtype=float32", "--device=cpu"] if dry_run else []
out = os.path.join(work, "smoke")
t0 = time.time()
proc = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), "config/fineweb/vha.py", "config/fineweb/smoke.py",
                       f"--data_dir={data_dir}", f"--out_dir={out}", *toy], cwd=ROOT, capture_output=True, text=True)
if proc.returncode != 0:
    say(f"FAIL: train.py exited {proc.returncode}: {(proc.stderr.strip().splitlines() or [''])[-1]}")
else:
    rows = [json.loads(line) for line in open(os.path.join(out, "log.jsonl"))]
    steps, evals = [r for r in rows if "tok_per_s" in r], [r for r in rows if "val_loss" in r]
    tok_s = statistics.median(r["tok_per_s"] for r in steps[1:] or steps)
    mfu = statistics.median(r["mfu"] for r in steps[1:] or steps) if "mfu" in steps[0] else None
    say(f"{steps[-1]['iter'] + 1} steps in {time.time() - t0:.0f} s wall; first step done at {steps[0]['time']:.0f} s "
        f"(compiling the eval and training graphs)")
    say(f"tokens/s {tok_s:,.0f} (median over logged steps after the first), MFU {f'{mfu:.1%}' if mfu else 'n/a (no known peak)'}"
        + ("  target >= 40%: " + ("PASS" if mfu >= 0.4 else "FAIL") if mfu else ""))
    say(f"val loss {evals[0]['val_loss']:.3f} -> {evals[-1]['val_loss']:.3f} (data: {os.path.relpath(data_dir, ROOT) if not data_dir.startswith(work) else 'random tokens'})")


# ---- 4. decode ----
section("4. bench_decode.py: folded VHA and GQA/MHA decode, GB/s = (weights + KV bytes per step) / time")
ctxs = contexts.split(",") if not dry_run else ["256", "512"]
for compiled in (False, True):
    use = ctxs if not compiled else ctxs[-2:]
    variants = decode_variants if not compiled else "mha,gqa2,vha_folded"
    args = [f"--contexts={','.join(use)}", f"--variants={variants}", f"--compile={compiled}", f"--device={device}"]
    if dry_run:
        args += ["--n_layer=1", "--n_embd=64", "--head_dim=16", "--decode_steps=3", "--warmup=1", "--copy_mib=16", "--compile=False"]
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bench_decode.py"), *args], cwd=ROOT, capture_output=True, text=True)
    mode = ("CUDA graphs (compile, reduce-overhead)" if compiled else "eager") + (" [dry run: eager, toy size]" if dry_run else "")
    if proc.returncode != 0:
        say(f"{mode}: FAIL, bench_decode.py exited {proc.returncode}: {(proc.stderr.strip().splitlines() or [''])[-1]}")
        continue
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    say(f"{mode}: copy bandwidth measured {result['copy_gb_s']:.0f} GB/s")
    for r in result["results"]:
        spec = f", {r['gb_s'] * 1e9 / hbm:.0%} of HBM spec" if hbm else ""
        ctx = f"{r['ctx'] // 1024}K" if r["ctx"] % 1024 == 0 else str(r["ctx"])
        say(f"  {r['variant']:10s} {ctx:>5s}  {r['decode_tok_s']:8.1f} tok/s  {r['gb_s']:7.1f} GB/s{spec}  TTFT {r['ttft_ms']:.1f} ms")
    top = [r for r in result["results"] if r["variant"] == "vha_folded" and int(r["ctx"]) >= 32768]
    if compiled and hbm and top:
        worst = min(r["gb_s"] * 1e9 / hbm for r in top)
        say(f"target: folded VHA at 32K+ moves >= 70% of HBM bandwidth with CUDA graphs: {worst:.0%}  {'PASS' if worst >= 0.7 else 'FAIL'}")

print("\n" + "=" * 100 + "\nREPORT (paste into the README and the closing note)\n" + "\n".join(report))
