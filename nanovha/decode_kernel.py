"""
Our one-token CPU attention kernel (nanovha/csrc/: decode_attention.cpp, the op; decode_common.h,
the softmax the paths share; amx_tiles.h, the AMX path), built for this machine on first use and
loaded as the op torch.ops.nanovha.decode_attention.

    problem = load()      # None once the op is registered; else one line saying why it is not
    out = torch.ops.nanovha.decode_attention(q, k, v, pos, scale)   # (B, H_kv, G, d_v)

Why a kernel of our own: PyTorch's CPU flash-attention kernel multiplies a block of 512 cached
positions by the query rows with a small matrix product per block, sized for many query rows; a
decoded token has one to sixteen rows per KV head, and there the per-block work, not the memory,
sets its speed. Ours puts a KV head's G query heads in one SIMD register per cached position, so
each position costs a few vector multiply-adds and the whole head streams once; on a CPU with AMX,
in bf16, both products run as tile multiplies instead. It is one candidate among two:
nanovha/plan.py times it against SDPA on the model's own attention (attention_kernel) and a
compiled step is built with the faster.

The build: torch.utils.cpp_extension with -O3 -march=native (the code is for this CPU) and
OpenMP (at::parallel_for), 11-12 s on 2 cores, into a folder keyed by the source, torch and the
CPU, beside the compiled packages; later runs load the library in a tenth of a second. A machine
without a C++ compiler or ninja keeps SDPA and says so once.
"""
import hashlib
import os
import sys

import torch

from nanovha.hardware import cpu_kind

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc", "decode_attention.cpp")
FLAGS = ["-O3", "-march=native", "-fopenmp"]
_state = {"problem": None, "loaded": False}


def source_digest():
    """sha256 (16 hex) of the kernel's source (every file in csrc/): part of every key that depends
    on the op."""
    h = hashlib.sha256()
    folder = os.path.dirname(SOURCE)
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name), "rb") as f:
            h.update(name.encode() + f.read())
    return h.hexdigest()[:16]


def build_folder():
    """Where the library is built: $NANOVHA_CACHE/kernels/<key>, else ~/.cache/nanovha/kernels/<key>."""
    root = os.environ.get("NANOVHA_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "nanovha")
    key = hashlib.sha256(f"{source_digest()} {torch.__version__} {cpu_kind()} {FLAGS}".encode()).hexdigest()[:16]
    return os.path.join(root, "kernels", key)


def load():
    """Builds (once per source, torch and CPU) and loads the op -> None, or one line saying why it
    cannot be (remembered: a failed build is not retried in this process)."""
    if _state["loaded"]:
        return None
    if _state["problem"]:
        return _state["problem"]
    from torch.utils import cpp_extension
    try:
        import ninja  # the pip wheel's ninja, where the system has none on PATH
        os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
    except ImportError:
        pass
    folder = build_folder()
    os.makedirs(folder, exist_ok=True)
    try:
        cpp_extension.load(name="nanovha_decode_attention", sources=[SOURCE], extra_cflags=FLAGS,
                           extra_ldflags=["-fopenmp"], build_directory=folder, is_python_module=False,
                           verbose=False)
    except (RuntimeError, OSError, ImportError, SystemExit) as e:
        lines = [line.strip() for line in str(e).splitlines() if line.strip()] or [type(e).__name__]
        first = next((line for line in lines[1:] if "error" in line.lower()), lines[0])[:160]  # the compiler's
        _state["problem"] = f"our decode kernel could not be built here ({first}); SDPA decodes"
        print(f"note: {_state['problem']}", file=sys.stderr)
        return _state["problem"]
    torch.library.register_fake("nanovha::decode_attention", output_like)
    _state["loaded"] = True
    return None


def output_like(q, k, v, pos, scale):
    """The op's output for torch.export, shapes only: (B, H_kv, G, d) queries -> (B, H_kv, G, d_v)."""
    return q.new_empty(*q.shape[:-1], v.size(-1))
