"""
Our one-token CPU attention op (csrc/), built for this machine on first use and loaded as
torch.ops.nanovha.decode_attention; plan.py times it against SDPA (docs/architecture.md: why).

    if load():            # True once the op is registered; else why_not() says why, in one line
        out = torch.ops.nanovha.decode_attention(q, k, v, pos, scale)   # (B, H_kv, G, d_v)

It never hangs or crashes a command: a problem is one line, and SDPA decodes (docs/architecture.md).
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
from nanovha.processes import run_limited

CSRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NAME = "nanovha_decode_attention"
FLAGS = ["-O3", "-march=native", "-fopenmp"]
# a build's time limit: about 5x the slowest build measured (16 s on 2 cores); the variable sets another
BUILD_SECONDS = float(os.environ.get("NANOVHA_KERNEL_BUILD_SECONDS", 90))
PROBE_SECONDS = 10  # for the compiler's --version
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
        code, out = run_limited([os.environ.get("CXX", "c++"), "--version"], PROBE_SECONDS)
        return out.splitlines()[0].strip() if code == 0 and out.strip() else None
    except (OSError, subprocess.SubprocessError):
        return None


def machine_key():
    """What a library must match here: the source, torch, the CPU and its instruction sets."""
    text = f"{source_digest()} {torch.__version__} {cpu_kind()} {cpu_features()} {FLAGS}"
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def library_folder(cxx):
    """<cache>/kernels/<machine_key>-<the compiler that builds it>."""
    return os.path.join(cache_dir(), "kernels", f"{machine_key()}-{hashlib.sha256(cxx.encode()).hexdigest()[:12]}")


def record_of(folder):
    """The folder's built.json where its library is whole and the record well formed, else None."""
    try:
        with open(os.path.join(folder, "built.json")) as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    well_formed = (isinstance(record, dict) and isinstance(record.get("features"), list)
                   and all(isinstance(f, str) for f in record["features"])
                   and isinstance(record.get("when"), str) and isinstance(record.get("seconds"), (int, float)))
    return record if well_formed and os.path.isfile(os.path.join(folder, NAME + ".so")) else None


def open_library(folder):
    """Loads a whole library, read-only -> None, or why it cannot be used."""
    lacks = sorted(set(record_of(folder)["features"]) - set(cpu_features()))
    if lacks:
        return f"{folder} was built for {', '.join(lacks)}, which this CPU lacks"
    try:
        torch.ops.load_library(os.path.join(folder, NAME + ".so"))
    except (OSError, RuntimeError) as e:
        return f"{folder}/{NAME}.so does not load ({str(e).splitlines()[0][:120]})"
    return None


def load():
    """Loads the op, built first where it is not (once per source, torch, CPU and compiler), or
    built again where its library is broken -> whether it is registered. Where it is not,
    why_not() says why, in one line printed once (and it is not retried in this process)."""
    if not (_state["loaded"] or _state["problem"]):
        cxx = compiler()
        problem = find_and_open(cxx)
        if problem:
            _state["problem"] = f"our attention kernel is not used: {problem}; SDPA decodes"
            print(f"note: {_state['problem']}", file=sys.stderr)
        else:
            torch.library.register_fake("nanovha::decode_attention", output_like)
            _state["loaded"] = True
    return _state["loaded"]


def why_not():
    """Why the op is not loaded (load() said False), in one line, or None."""
    return _state["problem"]


def find_and_open(cxx):
    """Opens this compiler's library (or, without one, the newest any compiler built for this
    CPU), building it where there is none or it is broken -> None, or why it cannot be used."""
    if cxx is None:
        pattern = os.path.join(cache_dir(), "kernels", f"{machine_key()}-*")
        built = sorted(filter(record_of, glob.glob(pattern)), key=lambda f: record_of(f)["when"])
        if not built:
            return "no working C++ compiler here ($CXX or c++), and no library built for this CPU"
        problem = open_library(built[-1])
        return problem and f"{problem} (install a C++ compiler to build it again, or remove the folder)"
    folder = library_folder(cxx)
    problem = open_library(folder) if record_of(folder) else "none built"
    if problem and record_of(folder):
        print(f"note: {problem}; building it again", file=sys.stderr)
    return problem and (build(folder, cxx, replace=bool(record_of(folder))) or open_library(folder))


def build(folder, cxx, replace=False):
    """Builds the library in a new folder beside `folder`, renamed into place once whole (over a
    folder that holds no whole library, or with replace, a broken one) -> None, or why not.
    Builds killed over an hour ago left their folders: removed."""
    root = os.path.dirname(folder)
    try:
        os.makedirs(root, exist_ok=True)
        tmp = tempfile.mkdtemp(dir=root, prefix=".build-")
    except OSError as e:
        return f"no library for this CPU, and the cache {root} cannot be written ({e.strerror or e})"
    for old in glob.glob(os.path.join(root, ".build-*")):
        if time.time() - os.path.getmtime(old) > 3600:
            shutil.rmtree(old, ignore_errors=True)
    print(f"building our attention kernel for this CPU, once ({cxx}; stopped after {BUILD_SECONDS:.0f} s) ...",
          file=sys.stderr, flush=True)
    t0 = time.time()
    try:
        build_library(tmp)
    except RuntimeError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        return f"it could not be built here ({e})"
    record = dict(features=cpu_features(), compiler=cxx, torch=torch.__version__,
                  seconds=round(time.time() - t0, 1), when=time.strftime("%Y-%m-%dT%H:%M:%S"))
    with open(os.path.join(tmp, "built.json"), "w") as f:
        json.dump(record, f)
    if os.path.isdir(folder) and (replace or not record_of(folder)):  # another build's whole one stays
        shutil.rmtree(folder, ignore_errors=True)
    try:
        os.rename(tmp, folder)
    except OSError:  # another process renamed its build there first: the same library
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"built in {record['seconds']:.0f} s: {folder}", file=sys.stderr)
    return None if record_of(folder) else f"{folder} holds no whole library"


def build_library(folder):
    """compile_library(folder) in a child process under BUILD_SECONDS; RuntimeError with the
    compiler's first error line, or the limit, where it fails."""
    code = "import sys, nanovha.engine.kernel as k; k.compile_library(sys.argv[1])"
    try:
        status, out = run_limited([sys.executable, "-c", code, folder], BUILD_SECONDS, cwd=ROOT)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"the build was stopped at its limit of {BUILD_SECONDS:.0f} s; "
                           f"NANOVHA_KERNEL_BUILD_SECONDS sets another") from None
    if status != 0 or not os.path.isfile(os.path.join(folder, NAME + ".so")):
        lines = [line.strip() for line in out.splitlines() if line.strip()] or [f"exit status {status}"]
        raise RuntimeError(next((line for line in lines if "error" in line.lower()), lines[-1])[:160])


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


def output_like(q, k, v, pos, scale, path=0):
    """The op's output for torch.export, shapes only: (B, H_kv, G, d) -> (B, H_kv, G, d_v)."""
    return q.new_empty(*q.shape[:-1], v.size(-1))
