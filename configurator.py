"""
nanoGPT's "poor man's configurator", made strict. Every script keeps its settings as flat
defaults and calls

    config = configure(defaults, sys.argv[1:])

where argv holds config files (`config/vha_small.py`, plain Python assignments) and `--key=value`
overrides, applied left to right. An unknown key, a missing file or a value of the wrong type is
an error, never a silent no-op.
"""
import ast
import os


class ConfigError(ValueError):
    pass


def _check_type(key, value, default):
    """The value must have the default's type (an int is fine where a float is expected);
    a default of None accepts anything."""
    if default is None or value is None:
        return value
    if isinstance(default, bool) or isinstance(value, bool):
        ok = isinstance(value, bool) and isinstance(default, bool)
    elif isinstance(default, float):
        ok = isinstance(value, (int, float))
        value = float(value) if ok else value
    else:
        ok = isinstance(value, type(default))
    if not ok:
        raise ConfigError(f"config key {key!r} wants a {type(default).__name__} (like {default!r}), "
                          f"got {value!r} ({type(value).__name__})")
    return value


def _parse_value(text):
    """'3' -> 3, '1e-3' -> 0.001, 'True' -> True, 'None' -> None, anything else stays a string."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def configure(defaults, argv):
    config = dict(defaults)
    for arg in argv:
        if not arg.startswith("--"):
            if not os.path.isfile(arg):
                raise ConfigError(f"config file {arg!r} does not exist (expected e.g. config/vha_small.py)")
            namespace = dict(config)
            with open(arg) as f:
                exec(compile(f.read(), arg, "exec"), {}, namespace)
            for key, value in namespace.items():
                if key.startswith("_") or type(value).__name__ == "module":
                    continue
                if key not in defaults:
                    raise ConfigError(f"{arg}: unknown config key {key!r}; known keys: {', '.join(sorted(defaults))}")
                config[key] = _check_type(key, value, defaults[key])
        else:
            key, sep, text = arg[2:].partition("=")
            if not sep:
                raise ConfigError(f"bad argument {arg!r}: write --key=value")
            if key not in defaults:
                raise ConfigError(f"unknown config key {key!r} in {arg!r}; known keys: {', '.join(sorted(defaults))}")
            value = _parse_value(text)
            if isinstance(defaults[key], str) and not isinstance(value, str):
                value = text  # a string knob keeps what was typed, e.g. --out_dir=123
            config[key] = _check_type(key, value, defaults[key])
    return config
