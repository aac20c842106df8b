"""experiments.py: a moved results folder keeps its runs while other settings are refused, and the paired
statistics (t-test, exact sign test, McNemar) give the textbook numbers, and so do the learning-speed measures."""
import math

import pytest

from lab import experiments


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


def test_power_planning_numbers():
    """mde = (t_crit + t_80) x SE, resolvable = t_crit x SE, and the seeds a planned comparison needs: at n = 10 the
    80%-power MDE is 3.145 SE (2.262 + 0.883), not the 2 SE once printed; an effect of half the per-seed spread
    needs 34 seeds (the normal approximation, (1.96 + 0.84)^2 / 0.25 = 31.4, plus t's heavier tails)."""
    assert experiments.resolvable(1.0, 10) == pytest.approx(2.262)
    assert experiments.mde(1.0, 10) == pytest.approx(3.145)
    assert experiments.seeds_for_power(1.0, 0.5) == 34
    n = experiments.seeds_for_power(2.0, 0.5)
    assert experiments.mde(2.0 / n ** 0.5, n) <= 0.5 < experiments.mde(2.0 / (n - 1) ** 0.5, n - 1)


@pytest.mark.parametrize("t, df, p", [(2.262, 9, 0.05), (12.706, 1, 0.05), (2.042, 30, 0.05), (0.0, 5, 1.0),
                                      (3.25, 9, 0.01)])
def test_t_p_value_matches_the_tables(t, df, p):
    assert experiments.t_p_value(t, df) == pytest.approx(p, abs=2e-4)


def test_holm_steps_down():
    assert experiments.holm({"a": 0.01, "b": 0.04, "c": 0.03}) == {"a": True, "c": False, "b": False}
    assert experiments.holm({"a": 0.01, "b": 0.02}) == {"a": True, "b": True}  # 0.01 <= 0.025, then 0.02 <= 0.05
    assert experiments.holm({"a": 0.03, "b": 0.001}) == {"b": True, "a": True}


@pytest.mark.parametrize("k, n, lower, upper", [(5, 5, 0.4782, 1.0), (0, 10, 0.0, 0.3085), (17, 20, 0.6211, 0.9679),
                                                (1, 2, 0.0126, 0.9874)])
def test_clopper_pearson_intervals(k, n, lower, upper):
    lo, hi = experiments.clopper_pearson(k, n)
    assert (lo, hi) == (pytest.approx(lower, abs=1e-4), pytest.approx(upper, abs=1e-4))


def test_zero_spread_tolerates_rounding():
    """Differences 0.2 and 0.19999999999999998: no spread, not |t| ~ 1e16; the exact sign test decides (n=2: not
    resolved)."""
    n, mean, se, t, resolved = experiments.paired({0: 0.3, 1: 0.5}, {0: 0.1, 1: 0.3})
    assert t == math.inf and not resolved
    # differences of differences that are zero up to rounding (0.41 - 0.4 vs 0.51 - 0.5): no difference, t = 0
    d = [0.41 - 0.4 - (0.51 - 0.5)] * 6
    assert d[0] != 0 and experiments.paired(dict(enumerate(d)), dict.fromkeys(range(6), 0.0)) == (6, 0.0, 0.0, 0.0,
                                                                                                  False)


def test_steps_to_a_level_are_interpolated_and_failures_count_as_the_budget():
    curve = [[0, 0.0], [25, 0.2], [50, 0.6], [75, 0.95], [100, 1.0]]
    assert experiments.steps_to(curve, 0.5, 1000) == pytest.approx(25 + 0.3 / 0.4 * 25)
    assert experiments.steps_to(curve, 0.9, 1000) == pytest.approx(50 + 0.3 / 0.35 * 25)
    assert experiments.steps_to(curve, 0.0, 1000) == 0 and experiments.steps_to(curve, 1.0, 1000) == 100
    assert experiments.steps_to([[0, 0.1], [25, 0.3]], 0.9, 1000) == 1000  # never reached: the whole budget


def test_area_under_the_curve_stays_at_the_last_value_after_an_early_stop():
    assert experiments.area([[0, 0.0], [100, 1.0]], 100) == pytest.approx(0.5)
    assert experiments.area([[0, 0.0], [100, 1.0]], 200) == pytest.approx(0.75)  # 1.0 after the stop at 100
    assert experiments.area([[0, 0.2], [50, 0.2]], 100) == pytest.approx(0.2)
