"""
Our one-token CPU attention op (csrc/), built for this machine on first use and loaded as
torch.ops.nanovha.decode_attention; plan.py times it against SDPA (docs/architecture.md: why).

    problem = load()      # None once the op is registered; else one line saying why it is not
    out = torch.ops.nanovha.decode_attention(q, k, v, pos, scale)   # (B, H_kv, G, d_v)

It never hangs or crashes a command: what goes wrong is one line, and SDPA decodes. A library
lives in <cache>/kernels/<source, torch, CPU, instruction sets>-<compiler>, with a record written
once it is whole; a whole one loads read-only (a shared or read-only cache, no compiler needed).
A build runs in a folder of its own, renamed into place when done: a build killed midway, or one
beside another, leaves nothing in the way of the next (no lock to wait on).
"""
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import torch

from data.common import cache_dir
from nanovha.hardware import cpu_features, cpu_kind

CSRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc")
NAME = "nanovha_decode_attention"
FLAGS = ["-O3", "-march=native", "-fopenmp"]
_state = {"problem": None, "loaded": False}


def source_digest():
    """sha256 (16 hex) of every file in csrc/: part of every key that depends on the op."""
    h = hashlib.sha256()
    for name in sorted(os.listdir(CSRC)):
        with open(os.path.join(CSRC, name), "rb") as f:
            h.update(name.encode() + f.read())
    return h.hexdigest()[:16]


def compiler():
    """The C++ compiler torch builds with ($CXX, else c++), as its --version names it, or None."""
    try:
        out = subprocess.run([os.environ.get("CXX", "c++"), "--version"], capture_output=True,
                             text=True, timeout=30)
        return out.stdout.splitlines()[0].strip() if out.returncode == 0 and out.stdout else None
    except (OSError, subprocess.SubprocessError):
        return None


def library_folder(cxx):
    """<cache>/kernels/<what the library must match here>-<the compiler that builds it>."""
    digest = lambda text: hashlib.sha256(text.encode()).hexdigest()[:12]
    key = digest(f"{source_digest()} {torch.__version__} {cpu_kind()} {cpu_features()} {FLAGS}")
    return os.path.join(cache_dir(), "kernels", f"{key}-{digest(cxx or '')}")


def record_of(folder):
    """The folder's built.json where its library is whole, else None."""
    try:
        with open(os.path.join(folder, "built.json")) as f:
            record = json.load(f)
        return record if os.path.isfile(os.path.join(folder, NAME + ".so")) else None
    except (OSError, ValueError):
        return None


def open_library(folder):
    """Loads a whole library, read-only -> None, or why it cannot be used."""
    lacks = sorted(set(record_of(folder).get("features", [])) - set(cpu_features()))
    if lacks:
        return f"{folder} was built for {', '.join(lacks)}, which this CPU lacks"
    try:
        torch.ops.load_library(os.path.join(folder, NAME + ".so"))
    except (OSError, RuntimeError) as e:
        return f"{folder}/{NAME}.so does not load ({str(e).splitlines()[0][:120]})"
    return None


def load():
    """Loads the op, built first where it is not (once per source, torch, CPU and compiler) ->
    None, or one line saying why it cannot be (remembered: not retried in this process)."""
    if not (_state["loaded"] or _state["problem"]):
        cxx = compiler()
        folder = library_folder(cxx)
        if cxx is None:  # no compiler: the newest library built for this CPU, by any compiler
            built = sorted(filter(record_of, glob.glob(folder[:-12] + "*")), key=lambda f: record_of(f)["when"])
            folder = built[-1] if built else None
        problem = ("no C++ compiler here ($CXX or c++), and no library built for this CPU" if folder is None
                   else open_library(folder) if record_of(folder) else build(folder, cxx))
        if problem:
            _state["problem"] = f"our attention kernel is not used: {problem}; SDPA decodes"
            print(f"note: {_state['problem']}", file=sys.stderr)
        else:
            torch.library.register_fake("nanovha::decode_attention", output_like)
            _state["loaded"] = True
    return _state["problem"]


def build(folder, cxx):
    """Builds the library in a new folder beside `folder`, renamed into place once whole, and
    loads it -> None, or why not. Builds killed over an hour ago left their folders: removed."""
    root = os.path.dirname(folder)
    try:
        os.makedirs(root, exist_ok=True)
        tmp = tempfile.mkdtemp(dir=root, prefix=".build-")
    except OSError as e:
        return f"no library for this CPU, and the cache {root} cannot be written ({e.strerror or e})"
    for old in glob.glob(os.path.join(root, ".build-*")):
        if time.time() - os.path.getmtime(old) > 3600:
            shutil.rmtree(old, ignore_errors=True)
    before = [r["seconds"] for r in map(record_of, glob.glob(os.path.join(root, "*"))) if r]
    about = f", about {max(before):.0f} s the last time here" if before else ""
    print(f"building our attention kernel for this CPU, once ({cxx}{about}) ...", file=sys.stderr, flush=True)
    t0 = time.time()
    try:
        compile_library(tmp)
    except (RuntimeError, OSError, ImportError, SystemExit) as e:
        shutil.rmtree(tmp, ignore_errors=True)
        lines = [line.strip() for line in str(e).splitlines() if line.strip()] or [type(e).__name__]
        first = next((line for line in lines[1:] if "error" in line.lower()), lines[0])  # the compiler's
        return f"it could not be built here ({first[:160]})"
    record = dict(features=cpu_features(), compiler=cxx, torch=torch.__version__,
                  seconds=round(time.time() - t0, 1), when=time.strftime("%Y-%m-%dT%H:%M:%S"))
    with open(os.path.join(tmp, "built.json"), "w") as f:
        json.dump(record, f)
    if os.path.isdir(folder) and not record_of(folder):  # not a whole library: none is renamed in unwhole
        shutil.rmtree(folder, ignore_errors=True)
    try:
        os.rename(tmp, folder)
    except OSError:  # another process renamed its build there first: the same library
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"built in {record['seconds']:.0f} s: {folder}", file=sys.stderr)
    return None


def compile_library(folder):
    """torch's C++ extension build (ninja) into folder; it loads the library it builds."""
    from torch.utils import cpp_extension
    try:
        import ninja  # the pip wheel's ninja, where the system has none on PATH
        os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
    except ImportError:
        pass
    cpp_extension.load(name=NAME, sources=[os.path.join(CSRC, "decode_attention.cpp")],
                       extra_cflags=FLAGS, extra_ldflags=["-fopenmp"], build_directory=folder,
                       is_python_module=False, verbose=False)


def output_like(q, k, v, pos, scale):
    """The op's output for torch.export, shapes only: (B, H_kv, G, d) -> (B, H_kv, G, d_v)."""
    return q.new_empty(*q.shape[:-1], v.size(-1))
