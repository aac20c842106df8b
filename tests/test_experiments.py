"""experiments.py: a moved results folder keeps its runs while other settings are refused, and the paired
statistics (t-test, exact sign test, McNemar) give the textbook numbers."""
import pytest

from nanovha import experiments


def test_a_moved_run_is_the_same_run_but_other_settings_are_refused(tmp_path):
    args = ["config/recall_mqar.py", "--data_dir=/a/data/mqar_n_keys64_1f2e", "--out_dir=/a/runs/p/vha/seed1337",
            "--seed=1337"]
    assert experiments.same_run(args, [x.replace("/a/", "/b/c/") for x in args])
    assert not experiments.same_run(args, args[:-1] + ["--seed=1338"])
    assert not experiments.same_run(args, [args[0], "--data_dir=/a/data/mqar_n_keys128_1f2e", *args[2:]])
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    experiments.write_json(str(run_dir / "args.json"), args)
    with pytest.raises(SystemExit, match="was started with other settings"):
        experiments.train({"threads": 1}, str(run_dir), args[:-1] + ["--seed=1338"], 1)
    assert experiments.read_json(run_dir / "args.json") == args  # the record of the finished run is untouched


# ---- paired statistics ----
def test_paired_differences_and_their_test():
    a, b = {1: 1.0, 2: 2.0, 3: 3.5}, {1: 0.5, 2: 1.5, 3: 2.5, 4: 9.0}  # seed 4 is not shared: left out
    n, mean, se, t, resolved = experiments.paired(a, b)
    assert n == 3 and mean == pytest.approx(2 / 3) and se == pytest.approx((1 / 12) ** 0.5 / 3 ** 0.5)
    assert t == pytest.approx(4.0) and not resolved  # df = 2 needs t > 4.303
    assert experiments.paired({1: 1.1, 2: 2.12, 3: 3.1}, {1: 1.0, 2: 2.0, 3: 3.0})[4]  # 0.1, 0.12, 0.1: t = 16
    assert experiments.paired({1: 1.0}, {1: 0.0})[:2] == (1, 1.0) and not experiments.paired({1: 1.0}, {1: 0.0})[4]
    # every seed the same difference
    same = lambda n: experiments.paired({s: 1.0 for s in range(n)}, {s: 0.0 for s in range(n)})
    assert same(2)[3:] == (float("inf"), False) and not same(5)[4] and same(6)[4]  # exact sign test: 2 * 0.5**n < 0.05
    assert experiments.paired({1: 1.0, 2: 2.0}, {1: 1.0, 2: 2.0})[3:] == (0.0, False)


def test_mcnemar_counts_only_discordant_seeds():
    a = {s: True for s in range(10)}
    b = {s: s >= 6 for s in range(10)}  # 6 seeds only a, 0 only b: p = 2 / 2^6
    assert experiments.mcnemar(a, b) == (6, 0, pytest.approx(2 / 64))
    assert experiments.mcnemar(b, a)[2] == pytest.approx(2 / 64)
    assert experiments.mcnemar(a, a) == (0, 0, 1.0)
    assert experiments.mcnemar({1: True, 2: False}, {1: False, 2: True}) == (1, 1, 1.0)
