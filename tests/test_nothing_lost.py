"""
Nothing lost, round 4: no user's file replaced, no hang, no traceback from a file we wrote ourselves. Each case is a
row: the command as a user types it, what was there before (set up in a world of runs and a user's files), the one
line expected, and the sha256 of every file of the world before and after (the same, but for what the command was
asked to write). The rules behind the rows live in nanovha/outputs.py (what a write may replace) and
nanovha/engine/ (a kernel build under a time limit, checked plan files, a compiled step that cannot be built).
"""
import json
import os
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass, field

import pytest

from conftest import ROOT
from test_outputs import hashes
from test_reliability import ONE_THREAD, ok, run, train_args

HANG_AT_BUILD = "#!/bin/sh\n[ \"$1\" = --version ] && { echo 'slow-c++ 1.0'; exit 0; }\nexec sleep 1000\n"
HANG_ALWAYS = "#!/bin/sh\nexec sleep 1000\n"
FOLD = ["--compile_decode=False", "--gen_tokens=4", "--eval_batches=1"]
SAMPLE = ["--out_dir={w}/a", "--max_new_tokens=4", "--num_samples=1"]


@pytest.fixture(scope="module")
def world(char_data, tmp_path_factory):
    """data/ and a/ (a VHA run on it); project/ (someone's code: .git/, main.c); repo/ (a README.md beside a
    checkpoint); user/ (notes.txt, a PNG matplotlib saved); ours/ (an export of ours), mixed/ (the same plus
    a user's file)."""
    root = tmp_path_factory.mktemp("world")
    shutil.copytree(char_data, root / "data")
    ok(run("train.py", *train_args(root / "data", root / "a", "--max_iters=6", "--eval_interval=3")))
    (root / "project" / ".git").mkdir(parents=True)
    (root / "project" / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (root / "project" / "main.c").write_text("int main(void) { return 0; }\n")
    (root / "repo").mkdir()
    (root / "repo" / "README.md").write_text("# my project\n")
    shutil.copy(root / "a" / "ckpt.pt", root / "repo" / "ckpt.pt")
    (root / "a" / "notes.txt").write_text("a user's notes beside the run\n")
    (root / "user").mkdir()
    (root / "user" / "notes.txt").write_text("a user's notes\n")
    (root / "user" / "photo.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0\0\0\0IDAT")  # no nanoVHA mark
    for name, extra in (("ours", []), ("mixed", ["notes.txt"])):
        (root / name).mkdir()
        for file in ("config.json", "model.safetensors", *extra):
            (root / name / file).write_text("{}")
        (root / name / "nanovha_export.json").write_text(json.dumps({"files": ["config.json", "model.safetensors"]}))
    return root


@pytest.fixture(scope="module")
def plans(world, tmp_path_factory):
    """A compile cache holding the plan files sample.py writes for a/ (eager: nothing compiled)."""
    folder = tmp_path_factory.mktemp("plans")
    ok(run("sample.py", *[a.format(w=world) for a in SAMPLE], "--compile=False", f"--compile_cache={folder}"))
    return folder


def decode_plan_file(folder):
    """The plan file in folder that holds the decode job (the others hold the attention kernel's)."""
    jobs = {p: json.loads(p.read_text())["jobs"] for p in folder.glob("plan-*.json")}
    [path] = [p for p, names in jobs.items() if any(n.startswith("decode") for n in names)]
    return path


def damage_plans(change):
    """A setup: change(job) for the decode job of a copy of the plans fixture in {t}/plans."""
    def setup(t, plans, shared):
        path = decode_plan_file(shutil.copytree(plans, t / "plans"))
        content = json.loads(path.read_text())
        for job in content["jobs"].values():
            change(job)
        path.write_text(json.dumps(content))
    return setup


def set_rounds(value):
    return lambda job: job["rounds"].update({name: value for name in job["rounds"]})


def plan_folder_is_a_folder(t, plans, shared):
    path = decode_plan_file(shutil.copytree(plans, t / "plans"))
    path.unlink()
    path.mkdir()


def compiler(script):
    def setup(t, plans, shared):
        (t / "cxx").write_text(script)
        (t / "cxx").chmod(0o755)
    return setup


def kernel_record(record):
    """A setup: the kernel library built for this CPU (by the plans fixture's sample.py), copied into {t}/cache with
    its record replaced."""
    def setup(t, plans, shared):
        from nanovha.engine import kernel
        [built] = [f for f in shared.glob("kernels/*") if kernel.record_of(str(f))]
        copy = shutil.copytree(built, t / "cache" / "kernels" / built.name)
        (copy / "built.json").write_text(json.dumps(record) if not callable(record) else json.dumps(
            record(kernel.record_of(str(built)))))
    return setup


def garbage_library(t, plans, shared):
    """The kernel library built for this CPU, copied into {t}/cache with its .so replaced by garbage."""
    from nanovha.engine import kernel
    kernel_record(lambda r: r)(t, plans, shared)
    [folder] = (t / "cache" / "kernels").iterdir()
    (folder / (kernel.NAME + ".so")).write_bytes(b"not a library")


@dataclass
class Case:
    command: str
    args: list  # {w}: the world, {t}: this case's own folder
    line: str  # the one line expected: an error (refused), else a note on stderr (the command goes on)
    refused: bool = True  # refused: exit != 0, nothing changed; else exit 0, the note, only `writes` changed
    setup: object = None  # (t, plans, the test run's shared cache) -> None, before the hashes
    env: dict = field(default_factory=dict)
    cwd: str = ROOT
    writes: tuple = ()  # what the command was asked to write, under the world
    read_only: str = ""  # a path (under {t}) mounted read-only and empty for the command
    stdout: bool = False  # the line is on stdout (a command that goes on and says what it runs)
    slow: bool = False  # builds our op (about 15 s on 2 cores)


GOES_ON = dict(refused=False)
CASES = {
    # 1-3: a write replaces only a file (or folder) of ours of the same kind
    "export_hf over someone's project (.git, main.c), --overwrite": Case(
        "fold.py", ["--out_dir={w}/a", "--export_hf={w}/project", "--overwrite=True", *FOLD],
        "is not a Hugging Face export folder nanoVHA wrote (it holds .git, main.c): nothing replaces it"),
    "export_hf over an export of ours holding a user's file, --overwrite": Case(
        "fold.py", ["--out_dir={w}/a", "--export_hf={w}/mixed", "--overwrite=True", *FOLD], "(it holds notes.txt)"),
    "export_hf over an export of ours, no --overwrite": Case(
        "fold.py", ["--out_dir={w}/a", "--export_hf={w}/ours", *FOLD], "pass --overwrite=True to replace it"),
    "export_hf=. from inside the export": Case(
        "fold.py", ["--out_dir={w}/a", "--export_hf=.", "--overwrite=True", *FOLD], "is the current folder",
        cwd="{w}/ours"),
    "out_name naming a user's file": Case(
        "fold.py", ["--out_dir={w}/a", "--out_name=notes.txt", *FOLD],
        "notes.txt is not a nanoVHA checkpoint: nothing replaces it, whatever the flags"),
    "out_name=README.md in a repo root": Case(
        "fold.py", ["--out_dir=.", "--out_name=README.md", *FOLD], "README.md is not a nanoVHA checkpoint",
        cwd="{w}/repo"),
    # 4, 16: a figure is a .png path, checked before the benchmark
    "plot naming a folder": Case("bench_decode.py", ["--plot={w}/user", "--variants=mqa"],
                                 "a figure is a .png file path"),
    "plot naming a README": Case("bench_decode.py", ["--plot={w}/repo/README.md", "--variants=mqa"],
                                 "a figure is a .png file path"),
    "plot naming a user's PNG": Case("bench_decode.py", ["--plot={w}/user/photo.png", "--variants=mqa"],
                                     "is not a PNG figure nanoVHA saved: nothing replaces it"),
    # 5: a compiler that hangs: the build stopped at its limit, its folder gone, SDPA decodes
    "a compiler that hangs when compiling": Case(
        "sample.py", [*SAMPLE, "--compile=False", "--compile_cache={t}/plans"],
        "the build was stopped at its limit of 3 s", setup=compiler(HANG_AT_BUILD), **GOES_ON,
        env={"CXX": "{t}/cxx", "NANOVHA_CACHE": "{t}/cache", "NANOVHA_KERNEL_BUILD_SECONDS": "3"}),
    "a compiler that hangs on every call": Case(
        "sample.py", [*SAMPLE, "--compile=False", "--compile_cache={t}/plans"], "no working C++ compiler here",
        setup=compiler(HANG_ALWAYS), env={"CXX": "{t}/cxx", "NANOVHA_CACHE": "{t}/cache"}, **GOES_ON),
    # 6: a kernel record we wrote that is not one: the library built again, or the fix named
    "a kernel record [1], no compiler": Case(
        "sample.py", [*SAMPLE, "--compile=False", "--compile_cache={t}/plans"], "no working C++ compiler here",
        setup=kernel_record([1]), env={"CXX": "/nonexistent", "NANOVHA_CACHE": "{t}/cache"}, **GOES_ON),
    "a kernel record [1], a compiler: built again": Case(
        "sample.py", [*SAMPLE, "--compile=False", "--compile_cache={t}/plans"], "built in",
        setup=kernel_record([1]), env={"NANOVHA_CACHE": "{t}/cache"}, slow=True, **GOES_ON),
    "a kernel library that does not load, a compiler: built again": Case(
        "sample.py", [*SAMPLE, "--compile=False", "--compile_cache={t}/plans"], "does not load", setup=garbage_library,
        env={"NANOVHA_CACHE": "{t}/cache"}, slow=True, **GOES_ON),
    "a kernel record for instruction sets this CPU lacks, no compiler": Case(
        "sample.py", [*SAMPLE, "--compile=False", "--compile_cache={t}/plans"],
        "which this CPU lacks (install a C++ compiler to build it again, or remove the folder)",
        setup=kernel_record(lambda r: dict(r, features=r["features"] + ["avx1024"])),
        env={"CXX": "/nonexistent", "NANOVHA_CACHE": "{t}/cache"}, **GOES_ON),
    # 7-10 and the timings: a plan file is checked by type and value; one that fails is measured again
    "plan rounds of strings": Case(
        "sample.py", [*SAMPLE, "--compile=False", "--compile_cache={t}/plans"],
        "has timings that are not positive seconds; measured again", setup=damage_plans(set_rounds(["1"])),
        **GOES_ON),
    "plan rounds empty": Case(
        "sample.py", [*SAMPLE, "--compile=False", "--compile_cache={t}/plans"],
        "has timings that are not positive seconds; measured again", setup=damage_plans(set_rounds([])), **GOES_ON),
    "plan timings NaN": Case(
        "sample.py", [*SAMPLE, "--compile=False", "--compile_cache={t}/plans"],
        "has timings that are not positive seconds", setup=damage_plans(set_rounds([float("nan")] * 5)), **GOES_ON),
    "plan timings negative": Case(
        "sample.py", [*SAMPLE, "--compile=False", "--compile_cache={t}/plans"],
        "has timings that are not positive seconds", setup=damage_plans(set_rounds([-1.0] * 5)), **GOES_ON),
    "plan busy_cores not a number": Case(
        "sample.py", [*SAMPLE, "--compile=False", "--compile_cache={t}/plans"],
        "has busy_cores that is not a number of cores", setup=damage_plans(lambda j: j.update(busy_cores="x")),
        **GOES_ON),
    "plan when not text": Case(
        "sample.py", [*SAMPLE, "--compile=False", "--compile_cache={t}/plans"], "has when that is not text",
        setup=damage_plans(lambda j: j.update(when=5)), **GOES_ON),
    "a plan file that is a folder": Case(
        "sample.py", [*SAMPLE, "--compile=False", "--compile_cache={t}/plans"], "cannot be read (Is a directory)",
        setup=plan_folder_is_a_folder, **GOES_ON),
    # 11-12: a compiled step that cannot be built is one line, and the command goes on eagerly
    "sample --compile=True with no C++ compiler": Case(
        "sample.py", [*SAMPLE, "--compile=True", "--dtype=float32", "--compile_cache={t}/plans"],
        "the compiled decode step cannot be built here", env={"CXX": "/nonexistent"}, **GOES_ON),
    "fold's defaults with no C++ compiler": Case(
        "fold.py", ["--out_dir={w}/a", "--gen_tokens=4", "--eval_batches=1", "--plan_tokens=16",
                    "--compile_cache={t}/plans"],
        "the compiled decode step cannot be built here", env={"CXX": "/nonexistent"}, **GOES_ON,
        writes=("a/ckpt_folded.pt",)),
    # 13-15: the compile cache is checked before any work
    "sample --compile=True, a read-only cache": Case(
        "sample.py", [*SAMPLE, "--compile=True", "--compile_cache={t}/ro"], "is not writable", read_only="ro"),
    "bench_decode --compile=aot, a read-only cache": Case(
        "bench_decode.py", ["--variants=mqa", "--compile=aot", "--compile_cache={t}/ro"], "is not writable",
        read_only="ro"),
    "sample --compile=True, the cache a file": Case(
        "sample.py", [*SAMPLE, "--compile=True", "--compile_cache={w}/repo/README.md"], "is a file, not a folder"),
    "sample, the cache a file": Case(
        "sample.py", [*SAMPLE, "--compile_cache={w}/repo/README.md"], "is a file, not a folder"),
    # 17: the GPU check's report folder
    "gpu_check --out naming a README": Case("lab/gpu_check.py", ["--out={w}/repo/README.md", "--dry_run"],
                                            "exists and is not an empty folder"),
    # the weak ones: hints that fit the command, settings that would be silently ignored
    "train from a missing checkpoint": Case(
        "train.py", ["--data_dir={w}/data", "--out_dir={t}/new", "--init_from={w}/missing.pt"],
        "missing.pt not found: check the path"),
    "bench_decode from a missing checkpoint": Case(
        "bench_decode.py", ["--ckpt={w}/missing.pt", "--variants=mqa", "--compile=off"],
        "missing.pt not found: check the path"),
    "attention_kernel=nanovha with compile off: eager runs our op": Case(
        "bench_decode.py", ["--variants=mqa", "--compile=off", "--attention_kernel=nanovha", "--contexts=64",
                            "--decode_steps=2", "--warmup=1", "--copy_mib=8", "--llama_cpp=False", "--n_layer=1",
                            "--dtype=float32"], "decode attention nanovha, runtimes eager", stdout=True, **GOES_ON),
    "more threads than cores": Case("bench_decode.py", ["--threads=1000"], "threads must be <= "),
    "ablate's results root a file": Case("ablate.py", ["--out_root={w}/user/notes.txt"],
                                         "is a file, not a folder; choose another --out_root"),
}


def hang_processes(t):
    return subprocess.run(["pgrep", "-f", str(t / "cxx")], capture_output=True, text=True).stdout.split()


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if c.slow else n for n, c in CASES.items()],
                         ids=list(CASES))
def test_nothing_lost(world, plans, tmp_path, compile_cache, name):
    case = CASES[name]
    t = tmp_path / "t"
    t.mkdir()
    if case.setup:
        case.setup(t, plans, __import__("pathlib").Path(compile_cache))
    fill = lambda text: text.format(w=world, t=t)
    before = hashes(world)
    command = [sys.executable, os.path.join(ROOT, case.command), *map(fill, case.args)]
    if case.read_only:  # a read-only mount in a namespace of its own (tests run as root: chmod stops nothing)
        (t / case.read_only).mkdir()
        mount = f"mount -t tmpfs -o ro none {t / case.read_only} && exec \"$@\""
        command = ["unshare", "--mount", "--map-root-user", "sh", "-c", mount, "sh", *command]
    env = {**os.environ, **ONE_THREAD, **{k: fill(v) for k, v in case.env.items()}}
    proc = subprocess.run(command, cwd=fill(case.cwd), capture_output=True, text=True, timeout=300, env=env)
    err = proc.stderr.strip()
    said = proc.stdout if case.stdout else err
    print(f"\n{err}")
    if case.refused:
        assert proc.returncode != 0 and len(err.splitlines()) == 1 and err.startswith("error: "), err
    else:
        assert proc.returncode == 0 and "Traceback" not in err, proc.stdout + err
        assert len([line for line in said.splitlines() if case.line in line]) == 1, said
    assert case.line in said, said
    after = hashes(world)
    for path in case.writes:
        assert after.pop(str(world / path), None) is not None, f"{path} was not written"
        folder = str(world / os.path.dirname(path))
        after[folder] = [n for n in after[folder] if n != os.path.basename(path)]
        os.remove(world / path)
    assert after == before
    assert not hang_processes(t) and not list(t.glob("cache/kernels/.build-*"))
    for path in filter(os.path.isfile, t.glob("plans/plan-*.json")):  # measured again and rewritten whole
        from nanovha.timing import job_problem
        assert not [job_problem(job) for job in json.loads(path.read_text())["jobs"].values() if job_problem(job)]


def test_a_written_file_follows_the_umask(tmp_path):
    """A checkpoint, plan file or package is readable by the group and others where the umask lets it (mkstemp
    alone makes 0600, which keeps a shared cache from its other users)."""
    from nanovha.outputs import written_whole
    old = os.umask(0o022)
    try:
        with written_whole(str(tmp_path / "ckpt.pt")) as tmp:
            open(tmp, "w").write("x")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "ckpt.pt").st_mode) == 0o644


def test_ctrl_c_in_training_is_one_line_saying_how_to_go_on(char_data, tmp_path):
    """SIGINT after the first checkpoint: no traceback; one line naming the checkpoint kept and the resume flag."""
    import signal
    import time
    from conftest import last_iter
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "train.py", *map(str, train_args(char_data, out, "--max_iters=100000",
                                                                              "--eval_interval=2"))],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **ONE_THREAD})
    while last_iter(out) < 4 and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    err = proc.communicate(timeout=60)[1].strip()
    assert proc.returncode != 0 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("stopped by Ctrl-C at iteration") and "is kept: continue with --init_from=resume" in err
