import importlib
import importlib.util
import json
import os
import random
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORDS = ("the king and queen shall speak of love and war , my lord ; what light through yonder "
         "window breaks ? it is the east and juliet is the sun . to be or not to be").split()


def tiny_text(n_chars=60_000, seed=0):
    """Deterministic pseudo-verse: learnable in a few dozen steps, no download needed."""
    rnd = random.Random(seed)
    lines = []
    while sum(map(len, lines)) < n_chars:
        lines.append(rnd.choice(["ROMEO", "JULIET", "KING"]) + ":\n"
                     + " ".join(rnd.choice(WORDS) for _ in range(12)) + "\n")
    return "\n".join(lines)


VERSE = ["ROMEO:\nBut soft, what light through yonder window breaks?\n",
         "JULIET:\nO Romeo, Romeo, wherefore art thou Romeo?\n",
         "HAMLET:\nTo be, or not to be: that is the question.\n", "KING:\nNow is the winter of our discontent.\n"]


def verse(n_chars=60_000, seed=0):
    """Four lines of verse in random order: a tiny model learns to continue a speaker's name with its line."""
    rnd, text = random.Random(seed), ""
    while len(text) < n_chars:
        text += rnd.choice(VERSE) + "\n"
    return text


def optional(module, install="pip install -r requirements-dev.txt"):
    """An optional dependency, imported: missing, it skips the test, except under CI=true, where it fails (CI must
    run every test, so a broken install cannot pass as skips)."""
    try:
        return importlib.import_module(module)
    except ImportError:
        why = f"{module} is not installed ({install})"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true but {why}: CI runs every test")
        pytest.skip(why)


@pytest.fixture(scope="session", autouse=True)
def compile_cache(tmp_path_factory):
    """Compiled decode packages (nanovha/engine/compiled.py) go to a folder of this test run, for the tests and
    every script they start: never the user's cache."""
    folder = str(tmp_path_factory.mktemp("compiled"))
    os.environ["NANOVHA_CACHE"] = folder
    return folder


@pytest.fixture(scope="session")
def char_data(tmp_path_factory):
    from data.common import prepare_string
    out = tmp_path_factory.mktemp("char_data")
    prepare_string(tiny_text(), str(out), "char", "tiny test text")
    return str(out)


def load_script(path):
    """A repo script as a module (path from the repo root): its definitions, without running what it runs under
    __main__ (its settings are parsed there, or from sys.argv at import where a test sets them)."""
    spec = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(path))[0], os.path.join(ROOT, path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(script, *args, check=True, env=None, timeout=300):
    """Runs a repo script in a subprocess, like a user would; returns the CompletedProcess."""
    env = {"OMP_NUM_THREADS": "1", **os.environ, **(env or {})}  # tiny models: one thread is fastest
    proc = subprocess.run([sys.executable, os.path.join(ROOT, script), *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, env=env)
    if check and proc.returncode != 0:
        raise AssertionError(f"{script} {' '.join(map(str, args))} failed "
                             f"({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def last_iter(out):
    """The last iteration in out/log.jsonl, -1 before there is one. The file is read while train.py appends to
    it, so a line that is not (yet) a whole JSON row is skipped here; the exactness check at the end reads the
    finished log strictly."""
    iters = [-1]
    try:
        with open(os.path.join(out, "log.jsonl")) as f:
            for line in f:
                try:
                    iters.append(json.loads(line)["iter"])
                except (ValueError, KeyError, TypeError):
                    pass
    except FileNotFoundError:
        pass
    return max(iters)


TINY_MODEL = ["--n_layer=2", "--n_embd=32", "--n_head=4", "--n_kv_head=2", "--block_size=32", "--batch_size=8",
              "--eval_iters=2", "--log_interval=1", "--warmup_iters=5", "--learning_rate=3e-3", "--device=cpu",
              "--dtype=float32"]  # fp32 on every CPU: the tests of other dtypes give theirs after it


def pytest_configure(config):
    """attn="mla" and "mfa" registered for every test, as every command has them (here, not at import: scripts'
    tests import conftest in subprocesses that must not load torch)."""
    import nanovha.mla_mfa  # noqa: F401
