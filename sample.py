"""
Samples from a trained model (VHA, GQA or folded) with the KV cache:

    python sample.py --out_dir=out-vha-small --start="ROMEO:" --num_samples=2 --max_new_tokens=300
    python sample.py --out_dir=out-vha-small --ckpt_name=ckpt_folded.pt --temperature=0   # greedy
    python sample.py --start=FILE:prompt.txt --verbose=True   # + every timing behind the plan
    python sample.py --hf_dir=Qwen3-0.6B --start="The capital of France is"   # a Qwen3 folder
"""
import gc
import os
import statistics
import sys

import torch

from data.common import load_tokenizer
from model import fold_to_gqa
from nanovha.config import DTYPES, at_least, flat_defaults, settings, stop_if
from nanovha.costs import kv_bytes_per_token
from nanovha.engine.plan import context_range, decode_plan
from nanovha.generate import generate
from nanovha.hardware import memory_problem, torch_dtype
from nanovha.loading import load_model
from nanovha.timing import cache_problem

out_dir = "out"
ckpt_name = "ckpt.pt"
hf_dir = ""  # a Hugging Face Qwen3ForCausalLM folder to sample from instead
start = "\n"  # or "FILE:prompt.txt"
num_samples = 3
max_new_tokens = 500
temperature = 0.8  # 0 = greedy
top_k = 200  # None: all
seed = 1337
device = "auto"
fold = True  # a VHA checkpoint decodes as the GQA model it folds into (exact: ckpt_folded.pt)
# the speed layer (nanovha/engine/): what decodes fastest, timed on this model and machine
dtype = "auto"  # auto: the plan's pick (CPU), bf16 where the GPU has it; float32, bfloat16, float16
compile = "auto"  # auto: the plan's pick of eager or a cached compiled step; True: build one; False
compile_cache = ""  # where compiled steps and plans are kept ("": $NANOVHA_CACHE/compiled)
replan = False  # time the plan again rather than use the one kept for this model shape and machine
verbose = False  # print every timing behind the plan
LIMITS = {"num_samples": at_least(1), "max_new_tokens": at_least(1), "temperature": at_least(0),
          "top_k": at_least(1), "dtype": DTYPES[:-1], "compile": ("auto", "True", "False")}  # no float64
RUNTIMES = {"auto": ("compiled", "eager"), "True": ("compiled",), "False": ("eager",)}  # by --compile
globals().update(settings(flat_defaults(globals()), sys.argv[1:], optional={"top_k": int}, limits=LIMITS))


def main():
    if device == "cpu" and compile != "False":  # the plan's folder, before any work
        stop_if(cache_problem(compile_cache, build=compile == "True"))
    torch.manual_seed(seed)
    model, encode, decode = load()
    prompt = prompt_tokens(encode, model)  # the token ids of --start
    if fold and model.cfg.attn == "vha" and model.cfg.vha_postmix_act == "linear":
        model = fold_to_gqa(model)  # exact: a trained VHA model is this GQA model (fold.py)
        print("decoding folded into plain GQA (exact; --fold=False runs premix and postmix)",
              file=sys.stderr)
    # the speed layer, one call (skip it on a first read): what decodes fastest here
    reach = context_range(len(prompt), len(prompt) + max_new_tokens)
    plan = decode_plan(model, reach, compile_cache, dtypes=None if dtype == "auto" else [torch_dtype(dtype)],
                       runtimes=RUNTIMES[compile], replan=replan)
    print(plan, *(plan.details if verbose else []), sep="\n", file=sys.stderr)
    x = torch.tensor(prompt, dtype=torch.long, device=device)[None]  # (1, T)
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.inference_mode():  # untimed: a fresh process's first steps run slower (allocations, caches)
        generate(plan.model, x, min(max_new_tokens, 64), temperature=0, decode=plan.step)
    for _ in range(num_samples):
        seconds = {}
        gc.disable()  # no collection pauses inside the timed loop
        try:
            with torch.inference_mode():  # no autograd bookkeeping at all: fewer us per op
                y = generate(plan.model, x, max_new_tokens, temperature=temperature, top_k=top_k,
                             generator=gen, decode=plan.step, seconds=seconds)
        finally:
            gc.enable()
        print(decode(y[0].tolist()))
        print(f"---------------  ({max_new_tokens} tokens: prefill of {len(prompt)} in "
              f"{seconds['prefill'] * 1e3:.1f} ms, then {speed(seconds)})")


def speed(seconds):
    """The decode loop's speed: the median step's on a CPU (a VM's stalls, a step in a hundred, move
    the mean by 10% from run to run, not the median), the whole loop's beside it (alone on a GPU)."""
    loop = seconds["tokens"] / seconds["decode"] if seconds["decode"] > 0 else float("nan")
    if not seconds["steps"]:
        return f"{loop:.0f} tok/s"
    return f"{1 / statistics.median(seconds['steps']):.0f} tok/s (median step; the whole loop {loop:.0f})"


def load():
    """(the model, encode, decode) from --hf_dir or out_dir/ckpt_name, or one line why not."""
    path = hf_dir or os.path.join(out_dir, ckpt_name)
    try:  # a Hugging Face folder brings its tokenizer files (meta) with it
        model, ckpt = load_model(path, device, hf=bool(hf_dir))
        if "meta" not in ckpt:
            sys.exit(f"error: {path} carries no tokenizer (meta); it was not written by train.py, "
                     f"fold.py or convert.py")
        return (model.eval(), *load_tokenizer(ckpt["meta"]))
    except (FileNotFoundError, ImportError, ValueError) as e:
        sys.exit(f"error: {e}" if path in str(e) else f"error: {path}: {e}")


def prompt_tokens(encode, model):
    """--start (or the file it names) as token ids, checked against the model's context and this
    machine's memory before any work."""
    text = start
    if start.startswith("FILE:"):
        try:
            with open(start[5:], encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as e:
            sys.exit(f"error: cannot read the prompt file {start[5:]!r} "
                     f"({getattr(e, 'strerror', None) or e}); "
                     f"give a UTF-8 text file, or the prompt itself with --start=TEXT")
    try:
        prompt = encode(text)
    except ValueError as e:
        sys.exit(f"error: {e}")
    if not prompt:
        sys.exit("error: the prompt is empty; pass --start=TEXT")
    block, end = model.cfg.block_size, len(prompt) + max_new_tokens
    if len(prompt) > block:
        sys.exit(f"error: the prompt is {len(prompt)} tokens but the model's context (block_size) "
                 f"is {block}; shorten it")
    cache_bytes = kv_bytes_per_token(model.cfg, torch.float32) * end  # float32 at most
    stop_if(memory_problem(cache_bytes, device, f"the KV cache for {end:,} positions",
                           "lower --max_new_tokens"))
    if end > block:
        print(f"note: generating up to position {end}, past the trained context of {block}",
              file=sys.stderr)
    return prompt


if __name__ == "__main__":
    main()
