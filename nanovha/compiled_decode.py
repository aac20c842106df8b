"""
The one-token decode step compiled ahead of time with AOTInductor, for the CPU: built once per
model and machine, cached as a package, loaded in a fraction of a second by every later run.

    step = compiled_decode(model, folder)   # builds once, or loads folder/decode-<key>.pt2
    model.setup_cache(1, max_len)           # any length: one package serves every context
    logits = step(token, pos)               # == model.decode_one_token(token, pos); pos a (1,) long tensor

What is compiled: model(token, start_pos=pos), the static-shape decode path of model.py, with the
KV caches as inputs of any length (written in place) and the weights baked in as constants.
Inductor fuses each norm, RoPE and softmax into one C++ loop and, with max_autotune, generates
the matrix-vector products from its C++ GEMM template for these exact shapes and thread count;
the C++ wrapper calls them with no Python between kernels. The key names everything the package
depends on: the weights, config and code (model.py, this file), the batch size, torch, the CPU
and the thread count; a cached package is checked against eager decode before it is used.
"""
import hashlib
import inspect
import json
import os
import sys
import tempfile
import time
import warnings

import torch

from model import CACHE_BLOCK
from nanovha import decode_kernel, kernels
from nanovha.hardware import cpu_kind


class DecodeStep(torch.nn.Module):
    """model(token, start_pos=pos) with every layer's cache (k, v) taken from the inputs instead
    of the model."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.names = [f"model.blocks.{i}.attn.kv_cache.{kv}" for i in range(len(model.blocks)) for kv in "kv"]

    def forward(self, token, pos, caches):
        buffers = {name[len("model."):]: cache for name, cache in zip(self.names, caches)}
        return torch.func.functional_call(self.model, buffers, (token,), {"start_pos": pos}, strict=False)[0][:, -1]


def caches_of(model):
    """[k0, v0, k1, v1, ...]: the tensors setup_cache allocated, in DecodeStep's order."""
    return [t for block in model.blocks for t in (block.attn.kv_cache.k, block.attn.kv_cache.v)]


def source_digest(obj):
    """sha256 of the file that defines obj: a package bakes in the code it was traced from
    (model.py, this file), so an edit to either makes a new key instead of loading a step of the
    old code."""
    with open(inspect.getsourcefile(obj), "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()[:16]


def package_key(model, batch_size, autotune=True, kernel="sdpa"):
    """sha256 (hex, 16 characters) of what a package depends on: the weights, the config, the
    batch size, how it was compiled, the attention kernel it calls, the code it was traced from
    (and our kernel's source), torch, the CPU as torch sees it, and the thread count (the GEMM
    template splits the work by it). The weights' memory order (GPT.use_decode_layout) is part of
    it: the package bakes them in as they are laid out."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(str((t.dtype, tuple(t.shape), t.stride())).encode())
        h.update(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    env = [repr(model.cfg), batch_size, autotune, torch.__version__, cpu_kind(), torch.get_num_threads(),
           source_digest(type(model)), source_digest(type(model.blocks[0].attn)), source_digest(DecodeStep),
           source_digest(kernels.static_attention), kernel,
           decode_kernel.source_digest() if kernel == "nanovha" else None]
    h.update(json.dumps(env, default=str).encode())
    return h.hexdigest()[:16]


def build(model, path, batch_size=1, autotune=True, kernel="sdpa"):
    """Exports the decode step, its one-token attention by `kernel` (kernels.DECODE_KERNELS),
    and compiles it into the AOTInductor package at path (written whole, then renamed)."""
    caches_before = [block.attn.kv_cache for block in model.blocks]
    # the slots functional_call fills; their length is dynamic
    model.setup_cache(batch_size, 2 * CACHE_BLOCK)
    example = [c.clone() for c in caches_of(model)]  # inputs distinct from the model's own buffers (no aliasing)
    # whole blocks
    length = CACHE_BLOCK * torch.export.Dim("cache_blocks", min=1, max=(1 << 24) // CACHE_BLOCK)
    token = torch.zeros(batch_size, 1, dtype=torch.long, device=example[0].device)
    pos = torch.tensor([3], device=token.device)
    try:
        with torch.no_grad(), warnings.catch_warnings(), kernels.decode_kernel_for(kernel):
            warnings.filterwarnings("ignore", category=FutureWarning)  # torch's own pytree deprecation notes
            program = torch.export.export(DecodeStep(model).eval(), (token, pos, example),
                                          dynamic_shapes=(None, None, [{2: length}] * len(example)))
    finally:
        for block, cache in zip(model.blocks, caches_before):
            block.attn.kv_cache = cache
    folder = os.path.dirname(path) or "."
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp_", suffix=".pt2")
    os.close(fd)
    try:
        # no tables printed
        quiet = {"autotune_num_choices_displayed": 0, "max_autotune_report_choices_stats": False}
        configs = {"max_autotune": autotune, **quiet}
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=FutureWarning)
            warnings.filterwarnings("ignore", message="TypedStorage is deprecated")  # inductor's own use of it
            torch._inductor.aoti_compile_and_package(program, package_path=tmp, inductor_configs=configs)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


class CompiledDecode:
    """A loaded package, called like model.decode_one_token with a tensor position. seconds: how
    long it took to get (the build, or only the load when the package was cached); built: whether
    this call compiled it."""

    def __init__(self, model, path, seconds, built, kernel="sdpa"):
        self.model, self.path, self.seconds, self.built, self.kernel = model, path, seconds, built, kernel
        self.runner = torch._inductor.aoti_load_package(path)

    @classmethod
    def checked(cls, model, path, batch_size, kernel="sdpa"):
        """The cached package at path, loaded and checked against eager -> the step, or why it
        cannot be used."""
        try:
            step = cls(model, path, 0.0, False, kernel)
        except Exception as e:  # truncated, empty or not a package: torch raises many kinds here
            return f"cannot be loaded ({type(e).__name__})"
        try:
            problem = package_problem(model, step, batch_size)
        except Exception as e:  # a package whose inputs do not fit this model
            problem = f"does not run on this model ({type(e).__name__})"
        return problem or step

    def __call__(self, token, pos):
        return self.runner(token, pos, caches_of(self.model))


def package_path(model, folder, batch_size=1, autotune=True, kernel="sdpa"):
    """Where the model's package is (or would be) kept: folder/decode-<key>.pt2."""
    return os.path.join(folder, f"decode-{package_key(model, batch_size, autotune, kernel)}.pt2")


def compiled_decode(model, folder, batch_size=1, autotune=True, build_it=True, kernel="sdpa"):
    """The model's compiled decode step from folder/decode-<key>.pt2, built there first if it is
    not cached (None when it is not and build_it is False), its attention by `kernel` (the plan's
    choice: nanovha/plan.py attention_kernel). A cached package is trusted only once it loads and
    one step of it matches the model's eager step (package_problem); one that does not is
    rebuilt, or treated as absent, with a one-line note naming the file."""
    problem = kernel == "nanovha" and decode_kernel.load()  # the package calls our op: it must be registered
    if problem:
        raise RuntimeError(problem)
    path = package_path(model, folder, batch_size, autotune, kernel)
    t0 = time.perf_counter()
    built = not os.path.exists(path)
    if not built:
        step = CompiledDecode.checked(model, path, batch_size, kernel)
        if isinstance(step, str):
            print(f"note: {path}: {step}; " + ("rebuilding it" if build_it else "decoding without it"), file=sys.stderr)
            built = True
    if built and not build_it:
        return None
    if built:
        build(model, path, batch_size, autotune, kernel)
        step = CompiledDecode(model, path, 0.0, True, kernel)
    step.seconds = time.perf_counter() - t0
    return step


def package_problem(model, step, batch_size):
    """Why a loaded package is not this model's decode step (its first logits differ from eager
    decode's by more than rounding: another model's weights under this key, a package from
    elsewhere), or None."""
    caches = [block.attn.kv_cache for block in model.blocks]
    try:
        model.setup_cache(batch_size, 4)
        token = torch.zeros(batch_size, 1, dtype=torch.long, device=model.embed.weight.device)
        with torch.inference_mode():
            eager = model.decode_one_token(token, 0).float()
            model.setup_cache(batch_size, 4)
            compiled = step(token, torch.tensor([0], device=token.device)).float()
    finally:
        for block, cache in zip(model.blocks, caches):
            block.attn.kv_cache = cache
    scale = max(1.0, eager.abs().max().item())
    tolerance = (1e-3 if model.embed.weight.dtype in (torch.float32, torch.float64) else 5e-2) * scale
    diff = (compiled - eager).abs().max().item() if compiled.shape == eager.shape else float("inf")
    if diff <= tolerance:
        return None
    return f"its first step differs from eager decode by {diff:.2g} (a package of another model?)"


def default_folder():
    """Where packages are kept: $NANOVHA_CACHE/compiled (the cache the dataset downloads share),
    else ~/.cache/nanovha/compiled."""
    root = os.environ.get("NANOVHA_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "nanovha")
    return os.path.join(root, "compiled")
