"""train.py with --compile=True (fullgraph) on the CPU: the same losses as eager to float32 rounding, no
recompiles after the first training step and eval, no graph breaks, and an exact resume. One cold compile
of a tiny model (about 30-90 s on 2 CPU cores) is the price, paid once for the module."""
import pytest

from conftest import TINY_MODEL, run
from test_train import read_log

pytestmark = pytest.mark.slow  # one cold compile: 30-120 s on 2 cores

ARGS = [*TINY_MODEL, "--attn=vha", "--max_iters=6", "--lr_decay_iters=6", "--eval_interval=2", "--dtype=float32"]


@pytest.fixture(scope="module")
def runs(char_data, tmp_path_factory):
    root = tmp_path_factory.mktemp("compile")
    for name, extra in (("eager", ["--compile=False"]), ("compiled", ["--compile=True"])):
        run("train.py", f"--data_dir={char_data}", f"--out_dir={root / name}", *ARGS, *extra, timeout=900)
    return root, char_data


def test_compiled_training_matches_eager(runs):
    root, _ = runs
    eager, compiled = read_log(root / "eager"), read_log(root / "compiled")
    assert [r["iter"] for r in eager] == [r["iter"] for r in compiled]
    for a, b in zip(eager, compiled):
        for key in ("loss", "train_loss", "val_loss"):
            if key in a:
                assert b[key] == pytest.approx(a[key], rel=2e-5, abs=0), (a["iter"], key)


def test_no_recompiles_and_no_graph_breaks(runs):
    root, _ = runs
    evals = [r for r in read_log(root / "compiled") if "val_loss" in r]
    assert len(evals) == 4 and all(r["graph_breaks"] == 0 for r in evals)
    graphs = [r["compiled_graphs"] for r in evals]
    assert graphs[0] == 1 and graphs[1:] == [2, 2, 2]  # the eval graph, then the training graph; never again


def test_compiled_resume_is_exact(runs):
    root, data = runs
    out = root / "resumed"
    run("train.py", f"--data_dir={data}", f"--out_dir={out}", *ARGS, "--compile=True", "--max_iters=4", timeout=900)
    run("train.py", f"--data_dir={data}", f"--out_dir={out}", *ARGS, "--compile=True", "--init_from=resume",
        timeout=900)
    strip = lambda rows: [{k: v for k, v in r.items() if k not in ("time", "tok_per_s", "compiled_graphs")}
                          for r in rows]
    assert strip(read_log(out)) == strip(read_log(root / "compiled"))
