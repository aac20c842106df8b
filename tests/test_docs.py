"""The README and docs/ as a reader meets them: every relative link resolves (file and #anchor), and the README
stays a guide (at most 300 lines and 20,000 characters)."""
import ast
import glob
import os
import re

import pytest

from conftest import ROOT

DOCS = ["README.md", "CONTRIBUTING.md", "data/README.md",
        *sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")  # [text](target)


def slug(heading):
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path):
    with open(path) as f:
        text = re.sub(r"```.*?```", "", f.read(), flags=re.S)  # no headings inside code blocks
    return {slug(m) for m in re.findall(r"^#+ (.+)$", text, flags=re.M)}


def links(path):
    with open(path) as f:
        text = re.sub(r"```.*?```", "", f.read(), flags=re.S)
    return [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]  # relative only (no http:, mailto:)


@pytest.mark.parametrize("doc", DOCS)
def test_relative_links_resolve(doc):
    path = os.path.join(ROOT, doc)
    assert os.path.exists(path), f"{doc} is missing"
    broken = []
    for target in links(path):
        file, _, anchor = target.partition("#")
        dest = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
        if not os.path.exists(dest):
            broken.append(f"{target} (no file {os.path.relpath(dest, ROOT)})")
        elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
            broken.append(f"{target} (no heading #{anchor})")
    assert not broken, f"{doc}: broken links: " + ", ".join(broken)


def test_slug_matches_github():
    assert slug("The demo: beating nanoGPT's CPU recipe with a 2-KV-head model") == \
        "the-demo-beating-nanogpts-cpu-recipe-with-a-2-kv-head-model"
    assert slug("Tests and CI") == "tests-and-ci"


def test_readme_is_a_guide():
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    assert len(text.splitlines()) <= 300 and len(text) <= 20_000, (len(text.splitlines()), len(text))


COMMANDS = ["train.py", "sample.py", "fold.py", "convert.py", "bench_decode.py", "bench.py", "ablate.py", "sweep.py",
            "uptrain.py"]  # with model.py, all the root holds
SCRIPTS = [*COMMANDS, "lab/gpu_check.py", "lab/gpu_steps.py", "lab/decode_levers.py", "lab/recall_probe.py",
           *sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "data", "*", "prepare.py")))]


def python_files():
    skip = {".git", ".ci-venv", "venv", ".venv", "node_modules"}
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in skip and not d.startswith(("out", "."))]
        yield from (os.path.relpath(os.path.join(folder, f), ROOT) for f in files if f.endswith(".py"))


def test_functions_read_in_one_sitting():
    """CONTRIBUTING.md: no function over 60 lines in the commands and scripts (files are split by job, not by a
    line count, which only invites packing)."""
    long_functions = []
    for path in SCRIPTS:
        for node in ast.walk(ast.parse(open(os.path.join(ROOT, path)).read())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > 60:
                long_functions.append(f"{path}:{node.name} ({node.end_lineno - node.lineno + 1} lines)")
    assert not long_functions, f"functions over 60 lines: {long_functions}"


def test_scripts_never_import_each_other():
    names = {os.path.splitext(os.path.basename(p))[0] for p in SCRIPTS if "/" not in p}
    for path in SCRIPTS:
        for node in ast.walk(ast.parse(open(os.path.join(ROOT, path)).read())):
            imported = ([a.name for a in node.names] if isinstance(node, ast.Import)
                        else [node.module] if isinstance(node, ast.ImportFrom) else [])
            assert not set(imported) & names, (f"{path} imports the script(s) {set(imported) & names}: "
                                               "move the shared code into a library module")


def test_lines_fit_in_120_characters():
    """One statement per line, at most 120 characters, in every Python file (tests included)."""
    wide = [f"{p}:{i + 1}" for p in python_files()
            for i, line in enumerate(open(os.path.join(ROOT, p)).read().splitlines()) if len(line) > 120]
    assert not wide, f"lines over 120 characters: {wide}"


LIMIT_TEXT = re.compile(r"^\s*(>=|<=|>|<|==|!=)\s*-?\d")  # ">= 1": a limit written as text (eval'd)


def settings_problems(path):
    """Why a command or script does not take its settings the one way (nanovha/config.py: flat lowercase defaults,
    one settings() call, or experiments.parse_command's, limits as data), as a list."""
    tree = ast.parse(open(os.path.join(ROOT, path)).read())
    if "argparse" in imports_of(path):  # allowed where it cannot import nanovha/, if the docstring says why
        return [] if "argparse" in (ast.get_docstring(tree) or "") else [f"{path}: argparse, and no line saying why"]
    called = [getattr(n.func, "id", getattr(n.func, "attr", "")) for n in ast.walk(tree) if isinstance(n, ast.Call)]
    problems = [] if called.count("settings") + called.count("parse_command") == 1 else [
        f"{path}: {called.count('settings') + called.count('parse_command')} settings() calls, not one"]
    problems += [f"{path}: calls configure(), not settings()"] * ("configure" in called)
    tables = {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    tables &= {"DEFAULTS", "SIZES", "KNOBS"}
    problems += [f"{path}: settings kept in {name}, not as flat defaults" for name in tables]
    problems += [f"{path}:{v.lineno}: the limit {v.value!r} is text; write at_least(1), at_most(9), ... (config.py)"
                 for n in ast.walk(tree) if isinstance(n, ast.Dict) for v in n.values
                 if isinstance(v, ast.Constant) and isinstance(v.value, str) and LIMIT_TEXT.match(v.value)]
    return problems


def test_every_command_and_script_takes_its_settings_one_way():
    """CONTRIBUTING.md: every command and script has flat overridable defaults and one settings() call with its limits
    as data (the size presets of sweep, ablate and uptrain are config files); config.py evals no limit."""
    scripts = [*SCRIPTS, "lab/cpu_report.py", "lab/op_threads.py", "lab/lmeval_check.py", "lab/vector_rates.py"]
    problems = [p for path in dict.fromkeys(scripts) for p in settings_problems(path)]
    assert not problems, problems
    config = ast.parse(open(os.path.join(ROOT, "nanovha", "config.py")).read())
    assert "eval" not in {getattr(n.func, "id", "") for n in ast.walk(config) if isinstance(n, ast.Call)}


def imports_of(path):
    tree = ast.parse(open(os.path.join(ROOT, path)).read())
    return {(a.name if isinstance(node, ast.Import) else node.module or "").split(".")[0]
            for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom)) for a in node.names}


def modules_of(path):
    """The full dotted names a file imports (nanovha.engine.attention, not nanovha)."""
    tree = ast.parse(open(os.path.join(ROOT, path)).read())
    return {a.name if isinstance(node, ast.Import) else node.module or ""
            for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom)) for a in node.names}


MODEL_HELPERS = {"nanovha.paired_init", "nanovha.gpt_rules"}  # the torch-only modules model.py calls
LAYERS = {  # folder -> the layers it may not import. The rule: model.py and nanovha/ are the tutorial; the engine
    # makes decode fast, the bridges reach other tools, the lab is the workbench: a learner may skip all three
    "nanovha.engine": ("nanovha.bridges", "lab"), "nanovha.bridges": ("nanovha.engine", "lab"),
    "nanovha": ("nanovha.engine", "nanovha.bridges", "lab"), "data": ("nanovha.engine", "nanovha.bridges", "lab")}
BRIDGE_DOOR = ("nanovha/loading.py", "nanovha.bridges.qwen3")  # a Hugging Face folder is one of the things it loads


def layer_of(path):
    module = path[:-3].replace("/", ".")
    return next((layer for layer in LAYERS if module == layer or module.startswith(layer + ".")), None)


def test_the_folders_are_the_layers():
    """The house rule (docs/architecture.md): the root holds the commands and model.py; model.py imports torch,
    paired_init and gpt_rules only; nanovha/ never imports the engine, the bridges or the lab (but loading.py's one
    door to bridges/qwen3.py); the engine and the bridges never import each other or the lab; nothing imports a
    command."""
    assert sorted(os.path.basename(p) for p in glob.glob(os.path.join(ROOT, "*.py"))) == sorted([*COMMANDS, "model.py"])
    assert imports_of("model.py") <= {"math", "dataclasses", "typing", "torch", "nanovha"}, imports_of("model.py")
    assert {m for m in modules_of("model.py") if m.startswith("nanovha")} == MODEL_HELPERS, modules_of("model.py")
    commands, broken = {c[:-3] for c in COMMANDS}, []
    for path in python_files():
        layer = layer_of(path) if path != "model.py" else "nanovha"
        forbidden = LAYERS.get(layer, ())
        for module in modules_of(path):
            if module.split(".")[0] in commands and not path.startswith("tests"):
                broken.append(f"{path} imports the command {module}")
            if any(module == f or module.startswith(f + ".") for f in forbidden) and (path, module) != BRIDGE_DOOR:
                broken.append(f"{path} ({layer}) imports {module}")
    assert not broken, broken
    assert BRIDGE_DOOR[1] in modules_of(BRIDGE_DOOR[0])  # the rule is read, not vacuous


ENGINE = sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "nanovha", "engine", "*.py")))


def test_the_engine_is_at_most_one_and_a_half_model_pys():
    """docs/architecture.md: model.py at most 450 lines, and the engine's Python (nanovha/engine/*.py, the C++ in
    csrc/ aside) at most 1.5x its lines."""
    lines = {p: len(open(os.path.join(ROOT, p)).readlines()) for p in [*ENGINE, "model.py"]}
    engine = sum(n for p, n in lines.items() if p != "model.py")
    assert lines["model.py"] <= 450 and engine <= 1.5 * lines["model.py"], lines


WORKSHOP = re.compile(r"\blent\b|device time|(?-i:\$OUT)\b|timeout_s\b|one try|(?<!scope=\")\bsessions?\b|issue \d|"
                      r"issues? [A-Z]{1,2}\b|no GPU has been", re.I)  # scope="session": pytest's word


def test_nothing_speaks_of_where_the_project_is_developed():
    """README, docs, code and tests speak to a user: no sessions, lent machines, device time, issue numbers."""
    files = [*DOCS, *python_files(), "lab/torch211_check.sh", ".ci/run"]
    found = [f"{p}:{i + 1}: {m.group(0)}" for p in files if p != "tests/test_docs.py"
             for i, line in enumerate(open(os.path.join(ROOT, p)).read().splitlines()) if (m := WORKSHOP.search(line))]
    assert not found, found


def test_other_attention_kinds_register_in_the_one_switch():
    """MLA and MFA live in nanovha/mla_mfa.py, outside model.py, and take part in the same attn= switch."""
    text = open(os.path.join(ROOT, "model.py")).read()
    assert "class MLAttention" not in text and "q_latent_norm" not in text, "MLA/MFA code in model.py"
    import model
    import nanovha.mla_mfa
    assert model.ATTENTION["mla"] is nanovha.mla_mfa.MLAttention
    assert model.ATTENTION["mfa"] is nanovha.mla_mfa.MFAttention


def test_every_command_the_docs_name_exists():
    """`python X.py` in README, CONTRIBUTING.md and docs/: X.py is a file of the repo."""
    missing = []
    for doc in DOCS:
        for script in re.findall(r"python3? (\S+\.py)\b", open(os.path.join(ROOT, doc)).read()):
            if not os.path.isfile(os.path.join(ROOT, script)):
                missing.append(f"{doc}: {script}")
    assert not missing, f"commands that do not exist: {missing}"


def test_a_missing_optional_package_fails_under_ci_and_skips_elsewhere(monkeypatch):
    """conftest.optional: CI (CI=true, as .ci/run exports) cannot pass on skips."""
    from conftest import optional
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true but no_such_package_here is not installed"):
        optional("no_such_package_here")
    monkeypatch.setenv("CI", "")
    with pytest.raises(pytest.skip.Exception):
        optional("no_such_package_here")
    assert "export CI=true" in open(os.path.join(ROOT, ".ci", "run")).read()


def import_cycle(graph):
    """A cycle of graph (module -> the modules it imports) as a list [a, b, ..., a], or None."""
    state = {}  # module -> "open" while on the current path, "done" after

    def visit(node, path):
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt, path + [nxt])):
                return cycle
        state[node] = "done"
        return None
    return next((c for m in sorted(graph) if m not in state and (c := visit(m, [m]))), None)


@pytest.mark.parametrize("graph, cycle", [
    ({"a": {"b"}, "b": {"c"}, "c": set()}, None),
    ({"a": {"b"}, "b": {"a"}}, ["a", "b", "a"]),
    ({"a": {"b"}, "b": {"c"}, "c": {"b"}}, ["b", "c", "b"]),
], ids=["chain", "pair", "behind-a-chain"])
def test_import_cycle_finds_cycles(graph, cycle):
    assert import_cycle(graph) == cycle


def test_nanovha_has_no_import_cycle():
    """CONTRIBUTING.md: the modules of nanovha/ import each other without cycles, function-level imports included
    (an import inside a function is a cycle postponed, not one avoided)."""
    files = glob.glob(os.path.join(ROOT, "nanovha", "**", "*.py"), recursive=True)
    graph = {os.path.relpath(p, ROOT)[:-3].replace("/", ".").removesuffix(".__init__"): modules_of(
        os.path.relpath(p, ROOT)) for p in files}
    graph = {m: {i for i in imports if i in graph} for m, imports in graph.items()}
    assert graph["nanovha.loading"] >= {"nanovha.checkpoint", "nanovha.bridges.qwen3"}  # the graph is read
    assert import_cycle(graph) is None, f"import cycle in nanovha/: {' -> '.join(import_cycle(graph))}"


LOW_LEVEL_LOADERS = {"model_from_checkpoint", "load_checkpoint"}  # nanovha/checkpoint.py's, under load_model


def test_commands_and_scripts_load_through_load_model():
    """One way to load: outside nanovha/ (and tests/), code loads a model with nanovha.loading.load_model, never by
    pairing checkpoint.load_checkpoint with model_from_checkpoint (each pair grew its own way of resolving a path)."""
    direct = []
    for path in python_files():
        if path.startswith(("nanovha", "tests")):
            continue
        for node in ast.walk(ast.parse(open(os.path.join(ROOT, path)).read())):
            names = ({a.name for a in node.names} if isinstance(node, ast.ImportFrom)
                     else {node.attr} if isinstance(node, ast.Attribute)
                     else {node.id} if isinstance(node, ast.Name) else set())
            direct += [f"{path}:{node.lineno} {n}" for n in names & LOW_LEVEL_LOADERS]
    assert not direct, f"load with nanovha.loading.load_model instead: {direct}"
    loaders = [p for p in python_files() if not p.startswith(("nanovha", "tests")) and "load_model" in imports_named(p)]
    assert {"sample.py", "fold.py", "convert.py", "bench_decode.py", "lab/recall_probe.py"} <= set(loaders)


def imports_named(path):
    """Every name a file imports with 'from X import name'."""
    return {a.name for node in ast.walk(ast.parse(open(os.path.join(ROOT, path)).read()))
            if isinstance(node, ast.ImportFrom) for a in node.names}


VARIANT_TABLES = {"VARIANTS", "SWEEP_VARIANTS", "DECODE_VARIANTS", "COMPARISONS", "PAPER"}  # name -> or (a, b) pairs
VARIANT_FLAG = re.compile(r"--(?:\w+_)?(variants|primary)=([\w,\-]+)")  # --variants=a,b; --primary=a-b,c-d


def variant_names(path):
    """Every variant name a command, script or doc uses: the values of --*variants= and --primary= flags, the comma
    lists assigned to a *variants knob, and the names in the VARIANT_TABLES a command keeps (keys, items, pairs)."""
    text = open(os.path.join(ROOT, path)).read()
    commands = [s for s in re.split(r"`|\n\s*\n", text) if "uptrain.py" not in s]  # uptrain.py: its own procedures
    names = {n for kind, value in VARIANT_FLAG.findall("\n".join(commands)) if value != "all"
             for n in re.split(r"[,\-]" if kind == "primary" else ",", value) if n}
    if not path.endswith(".py"):
        return names
    for node in ast.walk(ast.parse(text)):
        pairs = ([(t.id, node.value) for t in node.targets if isinstance(t, ast.Name)] if isinstance(node, ast.Assign)
                 else [(node.arg, node.value)] if isinstance(node, ast.keyword) else [])
        for target, value in pairs:
            if target and target.lower().endswith("variants") and isinstance(value, ast.Constant) \
                    and isinstance(value.value, str) and value.value != "all":
                names |= set(value.value.split(","))
            if target in VARIANT_TABLES:
                items = value.keys if isinstance(value, ast.Dict) else getattr(value, "elts", [])
                names |= {c.value for item in items for c in ast.walk(item)
                          if isinstance(c, ast.Constant) and isinstance(c.value, str)}
    return names


def test_variant_names_come_from_the_one_table():
    """One name per variant: every command, script and doc names its attention variants from nanovha/variants.py
    (uptrain.py's variants are procedures on two of them, not attention variants, and are its own)."""
    from nanovha.variants import RENAMED, is_variant
    files = [p for p in [*SCRIPTS, "lab/cpu_report.py", *DOCS] if p != "uptrain.py"]
    used = {p: variant_names(p) for p in files}
    assert {"gqa2", "gqa8", "vha", "mla", "mfa", "premix_only"} <= used["ablate.py"] and "vha_folded" in used[
        "bench_decode.py"] and "gqa2_half_q" in used["sweep.py"], used  # the tables are read, not missed
    stray = {p: bad for p, names in used.items() if (bad := sorted(n for n in names if not is_variant(n)
                                                                    and n != "ckpt"))}  # ckpt: bench_decode --ckpt
    assert not stray, f"variant names not in nanovha/variants.py: {stray}"
    retired = [f"{p}: {old}" for p in [*python_files(), *DOCS] if not p.startswith(("nanovha/variants", "tests"))
               for old in RENAMED if old in open(os.path.join(ROOT, p)).read()]
    assert not retired, f"renamed variants still named (nanovha/variants.py RENAMED): {retired}"
