"""
The one-token decode step compiled ahead of time with AOTInductor, for the CPU: built once per
model and machine, kept as a package, loaded in a fraction of a second by later runs.

    step = compiled_decode(model, folder)   # builds once, or loads folder/decode-<key>.pt2
    model.setup_cache(1, max_len)           # any length: one package serves every context
    logits = step(token, pos)               # == model.decode_one_token(token, pos), pos a (1,) tensor

What is compiled: model(token, start_pos=pos), the engine in place (use_engine), the KV caches
as inputs of any length (the engine's PagedKV holds them) and the weights baked in; inductor
generates the matrix-vector products for these shapes and runs them with no Python between.
"""
import hashlib
import inspect
import json
import os
import sys
import time
import warnings

import torch

from nanovha.engine import attention
from nanovha.engine import kernel as our_op
from nanovha.engine.attention import CACHE_BLOCK, use_engine
from nanovha.hardware import cpu_kind
from nanovha.outputs import written_whole


class DecodeStep(torch.nn.Module):
    """model(token, start_pos=pos) with every layer's cache (k, v) taken from the inputs: the
    buffers that are the tensors of the model's PagedKV, in its order."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        where = {id(t): name for name, t in model.named_buffers()}
        self.names = [where[id(t)] for t in model.kv_memory.tensors]

    def forward(self, token, pos, caches):
        buffers = dict(zip(self.names, caches))
        return torch.func.functional_call(self.model, buffers, token, {"start_pos": pos}, strict=False)[0][:, -1]


def source_digest(obj):
    with open(inspect.getsourcefile(obj), "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()[:16]


def package_path(model, folder, batch_size=1, autotune=True, kernel="sdpa"):
    """folder/decode-<sha256 of what the package depends on>.pt2: the weights and their memory
    order, the config, the batch size, how it was compiled, the attention kernel it calls (and our
    op's source), the code it was traced from, torch, the CPU and the thread count."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(f"{name} {t.dtype} {tuple(t.shape)} {t.stride()}".encode())
        h.update(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    code = [type(model), type(model.blocks[0].attn), DecodeStep, attention.static_attention]
    env = [repr(model.cfg), batch_size, autotune, torch.__version__, cpu_kind(), torch.get_num_threads(),
           *map(source_digest, code), kernel, our_op.source_digest() if kernel in attention.OP_PATHS else None]
    h.update(json.dumps(env, default=str).encode())
    return os.path.join(folder, f"decode-{h.hexdigest()[:16]}.pt2")


def build(model, path, batch_size=1, autotune=True, kernel="sdpa"):
    """Exports the decode step, its one-token attention by `kernel`, and compiles it into the
    package at path (written whole, then renamed)."""
    use_engine(model, kernel).setup_cache(batch_size, 2 * CACHE_BLOCK)  # the slots to fill
    example = [t.clone() for t in model.kv_memory.tensors]  # inputs distinct from the model's own buffers
    blocks = torch.export.Dim("cache_blocks", min=1, max=(1 << 24) // CACHE_BLOCK)  # a cache length
    with torch.no_grad(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning)  # torch's own pytree notes
        program = torch.export.export(DecodeStep(model).eval(), (torch.zeros(batch_size, 1, dtype=torch.long),
                                      torch.tensor([3]), example),
                                      dynamic_shapes=(None, None, [{2: CACHE_BLOCK * blocks}] * len(example)))
    configs = {"max_autotune": autotune, "autotune_num_choices_displayed": 0,  # no tables printed
               "max_autotune_report_choices_stats": False}
    with written_whole(path) as tmp, warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning)
        warnings.filterwarnings("ignore", message="TypedStorage is deprecated")  # inductor's own
        torch._inductor.aoti_compile_and_package(program, package_path=tmp, inductor_configs=configs)


_unbuildable = []  # why a step could not be built in this process: not tried again


class CompiledDecode:
    """A loaded package, called like model.decode_one_token with a tensor position. seconds: how
    long it took to get (build or load); built: whether this call compiled it."""

    def __init__(self, model, path, built, kernel):
        self.model, self.path, self.built, self.kernel, self.seconds = model, path, built, kernel, 0.0
        self.runner = torch._inductor.aoti_load_package(path)

    def __call__(self, token, pos):
        return self.runner(token, pos, self.model.kv_memory.tensors)


def compiled_decode(model, folder, batch_size=1, autotune=True, build_it=True, kernel="sdpa"):
    """The model's compiled decode step from folder, built first where it is not cached, its
    attention by `kernel`; None where it is not cached and not build_it, or cannot be built here
    (no C++ compiler, say: one line, and the caller decodes eagerly). A cached package is used
    only once it loads and its first step matches eager decode; else a one-line note, then
    rebuilt or left out."""
    if kernel in attention.OP_PATHS and not our_op.load():  # the package calls our op: registered first
        raise RuntimeError(our_op.why_not())
    path, t0, step = package_path(model, folder, batch_size, autotune, kernel), time.perf_counter(), None
    if os.path.exists(path):
        try:
            step = CompiledDecode(use_engine(model, kernel), path, False, kernel)
            problem = package_problem(model, step, batch_size)
        except Exception as e:  # truncated, empty, not a package, other inputs: torch raises many kinds
            problem = f"cannot be used ({type(e).__name__})"
        if problem:
            print(f"note: {path}: {problem}; " + ("rebuilding it" if build_it else "decoding without it"),
                  file=sys.stderr)
            step = None
    if step is None and (not build_it or _unbuildable):
        return None
    if step is None:
        try:
            build(model, path, batch_size, autotune, kernel)
        except Exception as e:  # inductor raises many kinds; the first line says why, once
            why = next((line for line in str(e).splitlines() if line.strip()), type(e).__name__)[:160]
            _unbuildable.append(f"{type(e).__name__}: {why}")
            print(f"note: the compiled decode step cannot be built here ({_unbuildable[0]}); decoding eagerly",
                  file=sys.stderr)
            return None
        step = CompiledDecode(model, path, True, kernel)
    step.seconds = time.perf_counter() - t0
    return step


def package_problem(model, step, batch_size):
    """Why a loaded package is not this model's step (its first logits differ from eager decode's
    by more than rounding: another model's weights under this key), or None."""
    token = torch.zeros(batch_size, 1, dtype=torch.long)
    with torch.inference_mode():
        model.setup_cache(batch_size, 4)
        eager = model.decode_one_token(token, 0).float()
        model.setup_cache(batch_size, 4)
        compiled = step(token, torch.tensor([0])).float()
    tolerance = (5e-2 if model.embed.weight.dtype in (torch.bfloat16, torch.float16) else 1e-3)
    diff = (compiled - eager).abs().max().item() if compiled.shape == eager.shape else float("inf")
    if diff <= tolerance * max(1.0, eager.abs().max().item()):
        return None
    return f"its first step differs from eager decode by {diff:.2g}"
