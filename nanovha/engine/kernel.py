"""
Our one-token CPU attention op (csrc/), built for this machine on first use and loaded as
torch.ops.nanovha.decode_attention; plan.py times it against SDPA (docs/architecture.md: why).

    problem = load()      # None once the op is registered; else one line saying why it is not
    out = torch.ops.nanovha.decode_attention(q, k, v, pos, scale)   # (B, H_kv, G, d_v)

The build: torch.utils.cpp_extension with -O3 -march=native (the code is for this CPU) and OpenMP,
into a folder keyed by the source, torch and the CPU, in the cache; later runs only load it. A
machine without a C++ compiler or ninja keeps SDPA and says so once.
"""
import hashlib
import os
import sys

import torch

from data.common import cache_dir
from nanovha.hardware import cpu_kind

CSRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc")
FLAGS = ["-O3", "-march=native", "-fopenmp"]
_state = {"problem": None, "loaded": False}


def source_digest():
    """sha256 (16 hex) of every file in csrc/: part of every key that depends on the op."""
    h = hashlib.sha256()
    for name in sorted(os.listdir(CSRC)):
        with open(os.path.join(CSRC, name), "rb") as f:
            h.update(name.encode() + f.read())
    return h.hexdigest()[:16]


def build_folder():
    """<cache>/kernels/<key of the source, torch, the CPU and the flags>."""
    key = hashlib.sha256(f"{source_digest()} {torch.__version__} {cpu_kind()} {FLAGS}".encode()).hexdigest()[:16]
    return os.path.join(cache_dir(), "kernels", key)


def load():
    """Builds (once per source, torch and CPU) and loads the op -> None, or one line saying why it
    cannot be (remembered: a failed build is not retried in this process)."""
    if _state["loaded"] or _state["problem"]:
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
        cpp_extension.load(name="nanovha_decode_attention", sources=[os.path.join(CSRC, "decode_attention.cpp")],
                           extra_cflags=FLAGS, extra_ldflags=["-fopenmp"], build_directory=folder,
                           is_python_module=False, verbose=False)
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
    """The op's output for torch.export, shapes only: (B, H_kv, G, d) -> (B, H_kv, G, d_v)."""
    return q.new_empty(*q.shape[:-1], v.size(-1))
