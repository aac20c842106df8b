"""Our C++ op never hangs or crashes a command (nanovha/engine/kernel.py, csrc/decode_attention.cpp): every bad
input is refused with a message naming the shapes; a library loads read-only (a read-only or shared cache, a stale
torch lock beside it, no compiler); a killed build leaves nothing in the way of the next, and two builds at once never
wait; a library built for instruction sets this CPU lacks is refused; the plan falls back to SDPA when the op cannot
load, even with a package that calls it cached; our op and SDPA decode the same tokens; OpenMP binds to torch's one
runtime."""
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

from conftest import ROOT
from nanovha.engine import kernel as our_op, plan
from nanovha.engine.attention import use_engine
from nanovha.hardware import cpu_features
from test_model import make


@pytest.fixture(scope="module")
def built():
    """The op, loaded in this process, and the folder of its library."""
    assert our_op.load(), our_op.why_not()  # CI has a C++ compiler and ninja: the op must build
    return our_op.library_folder(our_op.compiler())


def q_k_v(B=1, H=2, G=4, D=32, T=64, DV=32, dtype=torch.float32):
    return torch.randn(B, H, G, D, dtype=dtype), torch.randn(B, H, T, D, dtype=dtype), torch.randn(B, H, T, DV,
                                                                                                    dtype=dtype)


q, k, v = q_k_v()
REFUSED = {  # (q, k, v, pos[, scale]) -> what the message names
    "ungrouped_q": ((torch.randn(1, 4, 4, 32), k, v, 5), "share B and the KV heads H"),
    "another_batch": ((torch.randn(2, 2, 4, 32), k, v, 5), "share B and the KV heads H"),
    "v_of_other_heads": ((q, k, torch.randn(1, 1, 64, 32), 5), "share B and the KV heads H"),
    "head_size": ((torch.randn(1, 2, 4, 16), k, v, 5), "share the head size D"),
    "v_shorter": ((q, k, v[:, :, :10], 5), "as many positions T as k"),
    "empty_cache": ((q, k[:, :, :0], v[:, :, :0], 0), "an empty tensor"),
    "empty_group": ((q[:, :, :0], k, v, 0), "an empty tensor"),
    "pos_past_the_cache": ((q, k, v, 64), "pos must be in [0, T) = [0, 64), got 64"),
    "negative_pos": ((q, k, v, -1), "pos must be in [0, T) = [0, 64), got -1"),
    "two_positions": ((q, k, v, torch.tensor([1, 2])), "one int64 position"),
    "int32_pos": ((q, k, v, torch.tensor([1], dtype=torch.int32)), "one int64 position"),
    "mixed_dtypes": ((q, k.double(), v, 5), "share a dtype"),
    "integer_dtype": ((q.int(), k.int(), v.int(), 5), "takes float32, float64, bfloat16 or float16"),
    "three_dims": ((q[0], k, v, 5), "are 4-D"),
    "rows_not_contiguous": ((q, k.transpose(2, 3).contiguous().transpose(2, 3)[:, :, :32], v[:, :, :32], 5),
                            "rows (last dimension) must be contiguous"),
    "zero_scale": ((q, k, v, 5, 0.0), "scale must be positive and finite, got 0"),
    "negative_scale": ((q, k, v, 5, -0.1), "scale must be positive and finite, got -0.1"),
    "nan_scale": ((q, k, v, 5, float("nan")), "scale must be positive and finite, got nan"),
}


@pytest.mark.parametrize("case", REFUSED.values(), ids=REFUSED.keys())
def test_every_bad_input_is_refused_naming_the_shapes(built, case):
    (q, k, v, pos, *scale), message = case
    pos = pos if isinstance(pos, torch.Tensor) else torch.tensor([pos])
    with pytest.raises(RuntimeError) as e:
        torch.ops.nanovha.decode_attention(q, k, v, pos, *(scale or [0.1]))
    first = str(e.value).splitlines()[0]
    assert message in first and ("got q [" in first or "must be" in first), first


def test_our_op_and_sdpa_decode_the_same_tokens(built):
    """The forced-path switch: greedy decoding through the static step with our op or with SDPA, the same tokens."""
    from nanovha.generate import generate
    model = make(dtype=torch.float32, n_head=8, n_kv_head=2, vocab_size=41).eval()
    prompt = torch.randint(0, 41, (1, 6), generator=torch.Generator().manual_seed(3))
    out = {}
    for kernel in ("sdpa", "nanovha"):
        use_engine(model, kernel)
        step = lambda token, pos: model.decode_one_token(token, pos)  # a tensor pos: the static path
        out[kernel] = generate(model, prompt, 40, temperature=0, decode=step)
    assert torch.equal(out["sdpa"], out["nanovha"])


def test_openmp_binds_to_torchs_one_runtime(built):
    """Our library links libgomp, and the process maps only the one torch loaded: the op's parallel_for runs on
    torch's threads (torch.get_num_threads()), never a second pool beside them."""
    maps = open("/proc/self/maps").read()
    assert len(set(re.findall(r"\S*/libgomp[^/\s]*\.so[.\d]*", maps))) == 1
    assert os.path.join(built, our_op.NAME + ".so") in maps


def test_the_bf16_pair_paths_prefetch_rows_ahead(built):
    """The AMX and VDPBF16PS paths ask for rows ahead of the ones they read (prefetch_rows): the built library has
    prefetch instructions in every instantiation of each that this CPU has. GCC counts a function that only
    prefetches as free of side effects and may drop its call unless it is always inlined."""
    listing = subprocess.run(["objdump", "-d", "--no-show-raw-insn", "-C", os.path.join(built, our_op.NAME + ".so")],
                             capture_output=True, text=True, check=True).stdout
    bodies = re.split(r"\n(?=[0-9a-f]+ <)", listing)  # one function each, its name in the first line
    paths = re.compile(r"<void nanovha::attend_chunk_(amx|dot)<[^>]*>\(")
    found = {m.group(0): body for body in bodies if (m := paths.match(body.split(" ", 1)[-1]))}
    expected = {"amx": {"amx_tile", "amx_bf16", "avx512_bf16"}, "dot": {"avx512_bf16", "avx512bw"}}
    for path, needs in expected.items():
        assert any(f"attend_chunk_{path}<" in name for name in found) == needs.issubset(cpu_features()), path
    missing = [name for name, body in found.items() if "prefetch" not in body]
    assert not missing, missing


def load_in_a_fresh_process(cache, env=None, timeout=120, before=""):
    """python -c: load the op (in a new process, the way a command does) and run it once -> the CompletedProcess."""
    code = textwrap.dedent(before) + textwrap.dedent("""
        import torch
        from nanovha.engine import kernel
        problem = not kernel.load()
        if not problem:
            q, k = torch.randn(1, 2, 4, 32), torch.randn(1, 2, 64, 32)
            torch.ops.nanovha.decode_attention(q, k, k, torch.tensor([5]), 0.1)
        print("PROBLEM" if problem else "LOADED")
        """)
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, NANOVHA_CACHE=str(cache), **(env or {})))


READ_ONLY = """
    import builtins, os
    real_open, real_makedirs = builtins.open, os.makedirs
    def refuse(path):
        if str(path).startswith(os.environ["NANOVHA_CACHE"]):
            raise PermissionError(30, "Read-only file system", str(path))
    def open_(path, mode="r", *a, **k):
        if any(c in mode for c in "wax+"):
            refuse(path)
        return real_open(path, mode, *a, **k)
    def makedirs(path, *a, **k):
        refuse(path)
        return real_makedirs(path, *a, **k)
    builtins.open, os.makedirs = open_, makedirs
"""  # a read-only cache (tests run as root, where permission bits do not stop a write)


def test_a_prebuilt_library_loads_read_only_beside_a_stale_torch_lock(built, tmp_path):
    """A shared prebuilt cache, read-only, with the lock file a killed build of torch's leaves: loaded at once, no
    wait, no write (torch's own loader would wait on that lock forever)."""
    copy = tmp_path / "kernels" / os.path.basename(built)
    shutil.copytree(built, copy)
    open(copy / "lock", "w").close()
    proc = load_in_a_fresh_process(tmp_path, before=READ_ONLY, timeout=60)
    assert "LOADED" in proc.stdout and not proc.stderr.strip(), proc.stderr


@pytest.mark.parametrize("cxx", ["c++", "/nonexistent/c++"], ids=["with_a_compiler", "without_a_compiler"])
def test_an_empty_read_only_cache_is_one_line_and_sdpa(built, tmp_path, cxx):
    proc = load_in_a_fresh_process(tmp_path, env={"CXX": cxx}, before=READ_ONLY, timeout=60)
    note = [line for line in proc.stderr.splitlines() if line.strip()]
    assert "PROBLEM" in proc.stdout and len(note) == 1 and note[0].endswith("SDPA decodes"), proc.stderr
    assert ("cannot be written" if cxx == "c++" else "no working C++ compiler here") in note[0]


def test_without_a_compiler_a_library_any_compiler_built_for_this_cpu_loads(built, tmp_path):
    shutil.copytree(built, tmp_path / "kernels" / os.path.basename(built))
    proc = load_in_a_fresh_process(tmp_path, env={"CXX": "/nonexistent/c++"})
    assert "LOADED" in proc.stdout, proc.stderr


def test_a_library_built_for_instruction_sets_this_cpu_lacks_is_refused(built, tmp_path):
    copy = tmp_path / os.path.basename(built)
    shutil.copytree(built, copy)
    record = our_op.record_of(str(copy))
    with open(copy / "built.json", "w") as f:
        f.write(__import__("json").dumps(dict(record, features=[*record["features"], "amx_fp16_not_here"])))
    problem = our_op.open_library(str(copy))
    assert problem == f"{copy} was built for amx_fp16_not_here, which this CPU lacks"


def test_the_key_names_the_instruction_sets_and_the_compiler(monkeypatch):
    folder = our_op.library_folder("c++ 12")
    assert our_op.library_folder("c++ 13") != folder and our_op.library_folder("c++ 12") == folder
    monkeypatch.setattr(our_op, "cpu_features", lambda: ["avx2", "fma"])  # the same CPU name, fewer features
    assert our_op.library_folder("c++ 12") != folder


def fake_builder(calls, folders=None):
    """build_library as torch's build: it would wait forever on a lock file left in its folder; it writes the
    library."""
    def build_library(folder):
        calls.append(folder)
        assert not os.listdir(folder), "built in a folder another build used"
        for other in folders or []:  # another process finishes its build meanwhile
            os.makedirs(other)
            open(os.path.join(other, our_op.NAME + ".so"), "w").close()
            record = '{"features": [], "when": "2026-01-01T00:00:00", "seconds": 1, "from": "the other build"}'
            open(os.path.join(other, "built.json"), "w").write(record)
        open(os.path.join(folder, our_op.NAME + ".so"), "w").close()
    return build_library


def test_a_killed_build_is_not_in_the_way_and_the_build_says_so(tmp_path, monkeypatch, capsys):
    """A build killed midway left its folder and torch's lock in it; the next builds in a folder of its own, renames it
    into place whole, and says what it does; a killed build's folder over an hour old is removed."""
    kernels = tmp_path / "kernels"
    for name, age in ((".build-killed", 7200), (".build-running", 0)):
        (kernels / name).mkdir(parents=True)
        open(kernels / name / "lock", "w").close()
        os.utime(kernels / name, (os.path.getmtime(kernels / name) - age,) * 2)
    (kernels / "x-y").mkdir()  # a folder that holds no whole library: not in the way either
    calls = []
    monkeypatch.setattr(our_op, "build_library", fake_builder(calls))
    assert our_op.build(str(kernels / "x-y"), "c++ 12") is None and len(calls) == 1
    assert our_op.record_of(str(kernels / "x-y"))["compiler"] == "c++ 12"
    assert sorted(os.listdir(kernels)) == [".build-running", "x-y"]
    err = capsys.readouterr().err
    assert "building our attention kernel for this CPU, once (c++ 12; stopped after" in err and "built in" in err


def test_two_builds_at_once_never_wait_and_keep_the_first(tmp_path, monkeypatch):
    folder = tmp_path / "kernels" / "x-y"
    monkeypatch.setattr(our_op, "build_library", fake_builder([], folders=[str(folder)]))
    assert our_op.build(str(folder), "c++ 12") is None
    assert our_op.record_of(str(folder))["from"] == "the other build" and os.listdir(folder.parent) == ["x-y"]


def test_the_plan_falls_back_to_sdpa_when_the_op_cannot_load(tmp_path, monkeypatch):
    """A package that calls our op is cached, and the op cannot load (no compiler, a failed build): the plan takes the
    SDPA package where one is cached, else eager; it never loads the package that needs the op."""
    import copy
    from nanovha.engine.compiled import package_path
    from nanovha.engine.attention import use_decode_layout
    model = make(dtype=torch.float32, n_head=8, n_kv_head=2).eval()
    deployed = use_decode_layout(copy.deepcopy(model).eval())  # what decode_plan prepares for float32
    open(package_path(deployed, str(tmp_path), kernel="nanovha"), "wb").close()
    monkeypatch.setattr(our_op, "load", lambda: False)  # no C++ compiler, say
    monkeypatch.setattr(plan, "compiled_decode", lambda m, f, kernel="sdpa", **k: pytest.fail(f"loaded {kernel}"))
    monkeypatch.setattr(plan, "measure_at", lambda *a: pytest.fail("nothing to time: eager is the only candidate"))
    chosen = plan.decode_plan(model, (16, 32), str(tmp_path), dtypes=[torch.float32])
    assert chosen.runtime == "eager" and "no compiled step cached" in str(chosen)
    open(package_path(deployed, str(tmp_path), kernel="sdpa"), "wb").close()

    class Step:
        path = "decode-sdpa.pt2"
    monkeypatch.setattr(plan, "compiled_decode", lambda m, f, kernel="sdpa", **k: Step() if kernel == "sdpa"
                        else pytest.fail("loaded the package that calls our op"))
    monkeypatch.setattr(plan, "measure_at", lambda contexts, calls_at: (
        {n: [1.0 if n.startswith("compiled") else 2.0] * 5 for n in calls_at(16)}, 0.0))
    monkeypatch.setattr(plan, "decode_step_at", lambda *a, **k: None)
    chosen = plan.decode_plan(model, (16, 32), str(tmp_path), dtypes=[torch.float32])
    assert (chosen.runtime, chosen.attention) == ("compiled", "sdpa")


@pytest.mark.slow  # a real build killed midway, then a real build: about a minute on 2 cores
def test_a_build_killed_midway_leaves_nothing_that_blocks_the_next(tmp_path):
    import signal
    import time
    code = "from nanovha.engine import kernel; kernel.load()"
    env = dict(os.environ, NANOVHA_CACHE=str(tmp_path))
    first = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
    assert "building our attention kernel" in first.stderr.readline()
    time.sleep(3)  # inside torch's build: its lock file taken, the compiler running
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    [folder] = os.listdir(tmp_path / "kernels")
    assert folder.startswith(".build-") and os.path.exists(tmp_path / "kernels" / folder / "lock")  # torch's lock
    proc = load_in_a_fresh_process(tmp_path, timeout=240)
    assert "LOADED" in proc.stdout and "building our attention kernel" in proc.stderr, proc.stderr
