"""
nanoGPT's "poor man's configurator", made strict: the one way every command and script takes its
settings. A script keeps them as flat module-level defaults (lowercase names it assigns itself)
and reads them in one call:

    config = settings(flat_defaults(globals()), sys.argv[1:], optional={"head_dim": int}, limits={"top_k": at_least(1)})
    globals().update(config)

where argv holds config files (`config/vha_small.py`, plain Python assignments) and `--key=value`
overrides, applied left to right (a command that tests import and call, like fold.py, makes the
same call in its main(argv)). An unknown key (an imported constant such as DATA_ROOT is not a
key), a missing or broken file or a value of the wrong type is an error, never a silent no-op.
One rule for None: it is a value only for keys whose default is None (a value derived later) and
for the keys in `optional` (key -> the type of its other values). The settings come back as a
dict whose `.given` names the keys a config file or a flag set (to any value, the default's
included), so a resumed run can tell "left alone" from "asked for".

Limits are data, checked in the same call: a tuple of the allowed values, a `Limit` (at_least(1),
at_most(2**20) or one of your own: its text for the message and the test it runs) or a list of
limits that must all hold. Some numbers are checked for every script, so no script can forget
them (COMMON_LIMITS): a float must be finite (1e999 parses to inf), a seed must fit 0..2^63-1, a
thread count must lie in 0..the cores this process may use, a generation must stay under
MAX_GENERATION positions.
sweep.py, ablate.py and uptrain.py make the same call through experiments.parse_command, whose
--smoke / --quick sizes are config files too (config/<script>/<size>.py).
"""
import ast
import math
import os
import sys
from typing import Callable, NamedTuple


class ConfigError(ValueError):
    pass


class Settings(dict):
    """A script's settings; .given: the keys set by a config file or a --key=value."""
    given = frozenset()


class Assignments(dict):
    """A config file's namespace that remembers which names the file assigned."""
    def __init__(self, *args):
        super().__init__(*args)
        self.assigned = []

    def __setitem__(self, key, value):
        self.assigned.append(key)
        super().__setitem__(key, value)


class Limit(NamedTuple):
    """A range a number must lie in: `text` as the message says it (">= 1"), `ok` the test (value
    -> bool)."""
    text: str
    ok: Callable


def at_least(low):
    return Limit(f">= {low}", lambda v: v >= low)


def at_most(high, why=""):
    """value <= high; why (optional) says where the bound comes from."""
    return Limit(f"<= {high}{why}", lambda v: v <= high)


# what --dtype may name, in every command that takes one (auto: the machine's choice; float64:
# training and tests)
DTYPES = ("auto", "float32", "bfloat16", "float16", "float64")
SEED_MAX = 2**63 - 1  # torch's generators take any 64-bit seed; a run derives others from it, so keep one bit free
# the longest generation fold.py and the scripts take: its token ids and KV cache are allocated up
# front (a million positions of a small model is a few GB; sample.py checks its model's exact cache
# against this machine's memory)
MAX_GENERATION = 2**20
# checked for every script that has the key (a script's own limit for the key replaces it)
CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
COMMON_LIMITS = {"seed": Limit("in 0..2^63-1", lambda v: 0 <= v <= SEED_MAX),
                 "threads": [at_least(0), at_most(CORES, " (the cores this machine gives this process)")],
                 "jobs": at_least(1),
                 **{k: [at_least(1), at_most(MAX_GENERATION, " (its tokens and KV cache are allocated up front)")]
                    for k in ("gen_tokens", "plan_tokens")}}


def limit_problem(key, value, limit):
    """Why value breaks its limit (a Limit, a tuple of the allowed values or a list of limits
    that must all hold), or None. None passes a Limit."""
    if isinstance(limit, list):
        return next(filter(None, (limit_problem(key, value, one) for one in limit)), None)
    if isinstance(limit, tuple) and not isinstance(limit, Limit):
        return None if value in limit else f"{key} must be one of {', '.join(map(str, limit))}, got {value!r}"
    if value is None or limit.ok(value):
        return None
    return f"{key} must be {limit.text}, got {value!r}"


def _check_type(key, value, default, optional):
    """The value must have the default's type (an int is fine where a float is expected)."""
    if value is None:
        if default is None or key in optional:
            return None
        raise ConfigError(f"config key {key!r} cannot be None: it wants a {type(default).__name__} (like {default!r})")
    if default is None:
        if key not in optional:
            return value  # an untyped knob whose default is None takes anything
        default = optional[key]()  # 0, 0.0 or False: a value of the wanted type
    if isinstance(default, bool) or isinstance(value, bool):
        ok = isinstance(value, bool) and isinstance(default, bool)
    elif isinstance(default, float):
        ok = isinstance(value, (int, float))
        value = float(value) if ok else value
        if ok and not math.isfinite(value):  # 1e999 parses to inf and would pass every range
            raise ConfigError(f"config key {key!r} must be a finite number, got {value!r}")
    else:
        ok = isinstance(value, type(default))
    if not ok:
        like = "or None" if key in optional else f"(like {default!r})"
        raise ConfigError(f"config key {key!r} wants a {type(default).__name__} {like}, "
                          f"got {value!r} ({type(value).__name__})")
    return value


def _parse_value(text):
    """'3' -> 3, '1e-3' -> 0.001, 'True' -> True, 'None' -> None, anything else stays a string."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def own_names(namespace):
    """The names a script's file assigns at its top level (not what it imports), or None without
    a readable file."""
    try:
        with open(namespace["__file__"]) as f:
            tree = ast.parse(f.read())
    except (KeyError, OSError, SyntaxError):
        return None
    targets = [t for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))
               for t in (node.targets if isinstance(node, ast.Assign) else [node.target])]
    # a, b = ...: both names
    while any(isinstance(t, (ast.Tuple, ast.List, ast.Starred)) for t in targets):
        targets = [e for t in targets for e in (t.elts if isinstance(t, (ast.Tuple, ast.List))
                                                else [t.value] if isinstance(t, ast.Starred) else [t])]
    return {t.id for t in targets if isinstance(t, ast.Name)}  # not x[k] = ... nor x.y = ...


def flat_defaults(namespace):
    """A script's settings: the ints, floats, bools, strings and Nones it assigns at its top
    level under a lowercase name not starting with _ (an imported constant such as DATA_ROOT, or
    a TABLE, is not a setting)."""
    own = own_names(namespace)
    return {k: v for k, v in namespace.items()
            if k.islower() and not k.startswith("_") and (own is None or k in own)
            and isinstance(v, (int, float, bool, str, type(None)))}


def settings(defaults, argv, optional=None, limits=None):
    """The block every script runs: defaults overridden by argv, each value within its limit,
    "device" (if a knob) resolved to this machine's; a bad setting exits in one line (`error:
    ...`)."""
    try:
        config = configure(defaults, argv, optional)
        for key, limit in {**COMMON_LIMITS, **(limits or {})}.items():
            if key in config and (problem := limit_problem(key, config[key], limit)):
                raise ConfigError(problem)
        if "device" in config:
            config["device"] = resolve_device(config["device"])
    except ConfigError as e:
        sys.exit(f"error: {e}")
    return config


def config_file_values(path, namespace=None):
    """The assignments of a config file, run on top of namespace (the settings so far);
    ConfigError if it does not run. Names starting with _ and imported modules are left out."""
    if os.path.isdir(path):
        raise ConfigError(f"config file {path!r} is a folder; give a file such as config/vha_small.py")
    if not os.path.isfile(path):
        raise ConfigError(f"config file {path!r} does not exist (expected e.g. config/vha_small.py)")
    namespace = Assignments(namespace or {})
    try:
        with open(path) as f:
            exec(compile(f.read(), path, "exec"), {}, namespace)
    except Exception as e:  # a typo in the file: say where, not a traceback
        where = f" (line {e.lineno})" if isinstance(e, SyntaxError) else ""
        raise ConfigError(f"config file {path!r} does not run{where}: {type(e).__name__}: {e}; fix the file") from None
    return {k: namespace[k] for k in dict.fromkeys(namespace.assigned)
            if not k.startswith("_") and type(namespace[k]).__name__ != "module"}


def configure(defaults, argv, optional=None):
    config, optional, given = Settings(defaults), optional or {}, set()
    for arg in argv:
        if not arg.startswith("--"):
            for key, value in config_file_values(arg, config).items():
                if key not in defaults:
                    raise ConfigError(f"{arg}: unknown config key {key!r}; known keys: "
                                      f"{', '.join(sorted(defaults))}")
                config[key] = _check_type(key, value, defaults[key], optional)
                given.add(key)
        else:
            key, sep, text = arg[2:].partition("=")
            if not sep and isinstance(defaults.get(key), bool):
                text = "True"  # a bare --flag turns a bool on
            elif not sep:
                raise ConfigError(f"bad argument {arg!r}: write --key=value")
            if key not in defaults:
                raise ConfigError(f"unknown config key {key!r} in {arg!r}; known keys: "
                                  f"{', '.join(sorted(defaults))}")
            value = _parse_value(text)
            if isinstance(defaults[key], str) and not isinstance(value, str):
                value = text  # a string knob keeps what was typed, e.g. --out_dir=123
            config[key] = _check_type(key, value, defaults[key], optional)
            given.add(key)
    config.given = frozenset(given)
    return config


def resolve_device(device):
    """'auto' -> cuda, then mps, then cpu. A device this machine lacks is a ConfigError, not a
    CUDA traceback later."""
    import torch
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
    kind, _, index = device.partition(":")
    if kind not in ("cpu", "cuda", "mps") or (index and (kind != "cuda" or not index.isdigit())):
        raise ConfigError(f"device must be auto, cpu, cuda, cuda:N or mps, got {device!r}")
    if kind == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {device!r} asked for, but torch sees no CUDA GPU (torch "
                          f"{torch.__version__}, "
                          f"CUDA build {torch.version.cuda}); use --device=cpu or --device=auto")
    if kind == "cuda" and index and int(index) >= torch.cuda.device_count():
        raise ConfigError(f"device {device!r} asked for, but there are only "
                          f"{torch.cuda.device_count()} GPUs "
                          f"(cuda:0..cuda:{torch.cuda.device_count() - 1})")
    if kind == "mps" and not torch.backends.mps.is_available():
        raise ConfigError("device 'mps' asked for, but this machine has no usable Apple GPU; use --device=cpu")
    return device


def need(ok, msg):
    """A bad setting stops the script here, in one line (`error: msg`), not as a traceback an
    hour in."""
    if not ok:
        sys.exit(f"error: {msg}")


def stop_if(problem):
    """need() for the checks that return their problem (one line) or None."""
    if problem:
        sys.exit(f"error: {problem}")
