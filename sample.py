"""
Samples from a trained model (VHA, GQA or folded) with the KV cache:

    python sample.py --out_dir=out-vha-small --start="ROMEO:" --num_samples=2 --max_new_tokens=300
    python sample.py --out_dir=out-vha-small --ckpt_name=ckpt_folded.pt --temperature=0   # greedy
    python sample.py --start=FILE:prompt.txt
    python sample.py --hf_dir=Qwen3-0.6B --start="The capital of France is" --temperature=0   # a Qwen3 folder
"""
import copy
import os
import sys
import time

import torch

from data.common import load_tokenizer
from nanovha.checkpoint import load_checkpoint, model_from_checkpoint
from nanovha.compiled_decode import compiled_decode, default_folder
from nanovha.config import flat_defaults, settings, stop_if
from nanovha.hardware import choose_decode_dtype, memory_problem
from nanovha.qwen3 import model_from_hf

out_dir = "out"
ckpt_name = "ckpt.pt"
hf_dir = ""  # a Hugging Face Qwen3ForCausalLM folder to sample from instead (its tokenizer files, if any, are used)
start = "\n"  # or "FILE:prompt.txt"
num_samples = 3
max_new_tokens = 500
temperature = 0.8  # 0 = greedy
top_k = 200
seed = 1337
device = "auto"
dtype = "auto"  # weights: auto (CUDA: bf16; a CPU times float32 against bf16 where native), float32, bfloat16, float16
compile = "auto"  # the decode step. auto: a compiled one if cached for this model and machine, else eager; True:
# build one if needed (CPU: an AOTInductor package, about a minute on 2 cores, then cached; CUDA: CUDA graphs); False
compile_cache = ""  # where compiled packages are kept ("": $NANOVHA_CACHE/compiled, ~/.cache/nanovha/compiled)
LIMITS = {"num_samples": ">= 1", "max_new_tokens": ">= 1", "temperature": ">= 0", "top_k": ">= 1",
          "dtype": ("auto", "float32", "bfloat16", "float16"), "compile": ("auto", "True", "False")}
config = settings(flat_defaults(globals()), sys.argv[1:], optional={"top_k": int}, limits=LIMITS)  # top_k None: all
globals().update(config)
torch.manual_seed(seed)

path = hf_dir or os.path.join(out_dir, ckpt_name)
try:
    if hf_dir:  # the model and its tokenizer files (meta) from the folder
        model, meta = model_from_hf(hf_dir, device)
    else:
        ckpt = load_checkpoint(path, device)
        if "meta" not in ckpt:
            sys.exit(f"error: {path} carries no tokenizer (meta); it was not written by train.py, fold.py or "
                     f"convert.py")
        model, meta = model_from_checkpoint(ckpt, device), ckpt["meta"]
    encode, decode = load_tokenizer(meta)
except (FileNotFoundError, ImportError, ValueError) as e:
    sys.exit(f"error: {e}" if path in str(e) else f"error: {path}: {e}")

if start.startswith("FILE:"):
    try:
        with open(start[5:], encoding="utf-8") as f:
            start = f.read()
    except (OSError, UnicodeDecodeError) as e:
        sys.exit(f"error: cannot read the prompt file {start[5:]!r} ({getattr(e, 'strerror', None) or e}); "
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
cache_bytes = model.cfg.kv_bytes_per_token(torch.float32) * (len(prompt) + max_new_tokens)  # float32 at most
stop_if(memory_problem(cache_bytes, device, f"the KV cache for {len(prompt) + max_new_tokens:,} positions",
                       "lower --max_new_tokens"))
if len(prompt) + max_new_tokens > block:
    print(f"note: generating up to position {len(prompt) + max_new_tokens}, past the trained context of {block}",
          file=sys.stderr)

# the decode step: compiled where a package for this model and machine is cached (fold.py builds one for the folded
# checkpoint) or where asked for; eager otherwise, which wins for short generations (docs/benchmarks.md)
step, device_type, model = None, device.split(":")[0], model.eval()
if device_type == "cpu" and compile == "auto" and dtype == "auto":  # a step fold.py built, in the dtype it chose
    for cached_dtype in ("float32", "bfloat16"):
        candidate = copy.deepcopy(model).to(getattr(torch, cached_dtype)).use_decode_layout()
        step = compiled_decode(candidate, compile_cache or default_folder(), build_it=False)
        if step is not None:
            dtype_reason = f"{cached_dtype}: the compiled step cached for this model"
            model, dtype = candidate, cached_dtype
            break
if step is None:
    dtype, dtype_reason = choose_decode_dtype(device_type, dtype, model)
    model = model.to(getattr(torch, dtype)).eval()
    if device_type == "cpu":  # faster one-token matrix-vector products on CPU (measured in bench_decode.py)
        model.use_decode_layout()
if device_type == "cpu" and compile != "False" and step is None:
    step = compiled_decode(model, compile_cache or default_folder(), build_it=compile == "True")
elif device_type == "cuda" and compile == "True":
    step = torch.compile(model.decode_one_token, fullgraph=True, mode="reduce-overhead")
if step is not None and device_type == "cpu":
    how = f"compiled ({os.path.basename(step.path)}, {'built' if step.built else 'loaded'} in {step.seconds:.1f} s)"
elif step is not None:
    how = "compiled (CUDA graphs, at the first token)"
elif device_type == "cpu" and compile == "auto":
    how = "eager; --compile=True builds a compiled step for this model once (a minute or so), later runs load it"
else:
    how = "eager"
print(f"dtype {dtype_reason}; decode {how}", file=sys.stderr)

x = torch.tensor(prompt, dtype=torch.long, device=device)[None]
gen = torch.Generator(device=device).manual_seed(seed)
for _ in range(num_samples):
    t0 = time.time()
    with torch.inference_mode():  # no autograd bookkeeping at all (version counters, views): fewer us per op
        y = model.generate(x, max_new_tokens, temperature=temperature, top_k=top_k, generator=gen, decode=step)
    dt = time.time() - t0
    print(decode(y[0].tolist()))
    print(f"---------------  ({max_new_tokens} tokens in {dt:.2f} s, {max_new_tokens / dt:.0f} tok/s)")
