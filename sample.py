"""
Samples from a trained model (VHA, GQA or folded) with the KV cache:

    python sample.py --out_dir=out-vha-small --start="ROMEO:" --num_samples=2 --max_new_tokens=300
    python sample.py --out_dir=out-vha-small --ckpt_name=ckpt_folded.pt --temperature=0   # greedy
    python sample.py --start=FILE:prompt.txt
    python sample.py --hf_dir=Qwen3-0.6B --start="The capital of France is" --temperature=0   # a Qwen3 folder
"""
import os
import sys
import time

import torch

from data.common import load_tokenizer
from model import fold_to_gqa
from nanovha.compiled_decode import default_folder
from nanovha.config import DTYPES, at_least, flat_defaults, settings, stop_if
from nanovha.costs import kv_bytes_per_token
from nanovha.generate import generate
from nanovha.hardware import choose_decode_dtype, memory_problem
from nanovha.loading import load_model
from nanovha.plan import context_range, decode_plan

out_dir = "out"
ckpt_name = "ckpt.pt"
# a Hugging Face Qwen3ForCausalLM folder to sample from instead (its tokenizer files, if any, are
# used)
hf_dir = ""
start = "\n"  # or "FILE:prompt.txt"
num_samples = 3
max_new_tokens = 500
temperature = 0.8  # 0 = greedy
top_k = 200
seed = 1337
device = "auto"
# weights and cache: auto (CUDA bf16; a CPU follows the plan, nanovha/plan.py), float32, bfloat16
dtype = "auto"
compile = "auto"  # the decode step. auto: the plan's pick of eager or a compiled step cached for this model (fold.py
# builds them); True: build one if needed (CPU: an AOTInductor package, a minute, then cached; CUDA:
# CUDA graphs)
compile_cache = ""  # where compiled packages and plans are kept ("": $NANOVHA_CACHE/compiled)
# CPU: measure the plan again rather than use the one kept for this model shape and machine
replan = False
# a VHA checkpoint decodes as the GQA model it folds into (exact, as fold.py proves; the same
# weights as
fold = True
# its ckpt_folded.pt, so the same plan, package and text); False: premix and postmix run as trained
RUNTIMES = {"auto": ("compiled", "eager"), "True": ("compiled",), "False": ("eager",)}
LIMITS = {"num_samples": at_least(1), "max_new_tokens": at_least(1), "temperature": at_least(0), "top_k": at_least(1),
          "dtype": DTYPES[:-1], "compile": ("auto", "True", "False")}  # no float64 decode
# top_k None: all
config = settings(flat_defaults(globals()), sys.argv[1:], optional={"top_k": int}, limits=LIMITS)
globals().update(config)
torch.manual_seed(seed)

path = hf_dir or os.path.join(out_dir, ckpt_name)
try:  # a Hugging Face folder brings its tokenizer files (meta) with it
    model, ckpt = load_model(path, device, hf=bool(hf_dir))
    if "meta" not in ckpt:
        sys.exit(f"error: {path} carries no tokenizer (meta); it was not written by train.py, "
                 f"fold.py or convert.py")
    meta = ckpt["meta"]
    encode, decode = load_tokenizer(meta)
except (FileNotFoundError, ImportError, ValueError) as e:
    sys.exit(f"error: {e}" if path in str(e) else f"error: {path}: {e}")

if start.startswith("FILE:"):
    try:
        with open(start[5:], encoding="utf-8") as f:
            start = f.read()
    except (OSError, UnicodeDecodeError) as e:
        sys.exit(f"error: cannot read the prompt file {start[5:]!r} "
                 f"({getattr(e, 'strerror', None) or e}); "
                 f"give a UTF-8 text file, or the prompt itself with --start=TEXT")
try:
    prompt = encode(start)
except ValueError as e:
    sys.exit(f"error: {e}")
if not prompt:
    sys.exit("error: the prompt is empty; pass --start=TEXT")
block = model.cfg.block_size
if len(prompt) > block:
    sys.exit(f"error: the prompt is {len(prompt)} tokens but the model's context (block_size) is {block}; shorten it")
# float32 at most
cache_bytes = kv_bytes_per_token(model.cfg, torch.float32) * (len(prompt) + max_new_tokens)
stop_if(memory_problem(cache_bytes, device, f"the KV cache for {len(prompt) + max_new_tokens:,} positions",
                       "lower --max_new_tokens"))
if len(prompt) + max_new_tokens > block:
    print(f"note: generating up to position {len(prompt) + max_new_tokens}, past the trained context of {block}",
          file=sys.stderr)

if fold and model.cfg.attn == "vha":
    model = fold_to_gqa(model.eval())
    print(f"decoding {path} folded into plain GQA (exact; --fold=False runs premix and postmix as trained)",
          file=sys.stderr)

# the decode step: on a CPU the plan for this model's shape and this machine (nanovha/plan.py) picks
# the dtype and the runtime (a compiled package fold.py built, or eager) by timings made on this
# work; CUDA keeps its rule
step, device_type, model = None, device.split(":")[0], model.eval()
if device_type == "cpu":
    reach = context_range(len(prompt), len(prompt) + max_new_tokens)
    plan = decode_plan(model, compile_cache or default_folder(), reach, dtypes=None if dtype == "auto" else [dtype],
                       runtimes=RUNTIMES[compile], build=compile == "True", replan=replan)
    model, step, dtype = plan.model, plan.step, plan.dtype
    how = "eager" if step is None else f"compiled: {os.path.basename(step.path)}"
    hint = "; --compile=True builds a compiled step for this model once" if step is None and compile == "auto" else ""
    print(f"plan: {plan.line}\ndecode {how}{hint}", file=sys.stderr)
else:
    dtype, dtype_reason = choose_decode_dtype(device_type, dtype)
    model = model.to(getattr(torch, dtype)).eval()
    if device_type == "cuda" and compile == "True":
        step = torch.compile(model.decode_one_token, fullgraph=True, mode="reduce-overhead")
    print(f"dtype {dtype_reason}; decode {'compiled (CUDA graphs)' if step else 'eager'}", file=sys.stderr)

x = torch.tensor(prompt, dtype=torch.long, device=device)[None]
gen = torch.Generator(device=device).manual_seed(seed)
for _ in range(num_samples):
    t0 = time.time()
    # no autograd bookkeeping at all (version counters, views): fewer us per op
    with torch.inference_mode():
        y = generate(model, x, max_new_tokens, temperature=temperature, top_k=top_k, generator=gen, decode=step)
    dt = time.time() - t0
    print(decode(y[0].tolist()))
    print(f"---------------  ({max_new_tokens} tokens in {dt:.2f} s, {max_new_tokens / dt:.0f} tok/s)")
