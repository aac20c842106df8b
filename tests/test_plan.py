"""nanovha/engine/plan.py and nanovha/timing.py: the measured plan every command reads. The choice is tested with
a fake clock (a clear
winner, a noisy tie, an emulated bf16, a busy machine), the plan file with a real tiny model (kept, reused, measured
again), the line a command prints (its true reason) with faked timings."""
import json
import os
import random
import time

import pytest
import torch

from nanovha import timing
from nanovha.engine import plan

REAL_OTHERS_BUSY = timing.others_busy  # the tests below see a quiet machine (the fixture); this one is tested itself


@pytest.fixture(autouse=True)
def quiet(monkeypatch):
    """A quiet machine, whatever else runs beside the tests: other processes' cores read as busy_cores[0]."""
    busy_cores = [0.0]
    monkeypatch.setattr(timing, "others_busy", lambda read=None: (lambda: busy_cores[0]))
    return busy_cores


class FakeClock:
    """A clock that moves only when a candidate runs: costs(name, call) -> seconds of that call."""

    def __init__(self, costs):
        self.now, self.costs, self.calls = 0.0, costs, {}

    def __call__(self):
        return self.now

    def fn(self, name):
        def call():
            self.calls[name] = self.calls.get(name, 0) + 1
            self.now += self.costs(name, self.calls[name])
        return call


def chosen_with(costs, names):
    clock = FakeClock(costs)
    times, _ = timing.measure({n: clock.fn(n) for n in names}, timing.ROUNDS, timing.MIN_S, clock=clock)
    chosen, tied = timing.choose(times)
    return (chosen, not tied), clock


NAMES = ["compiled float32", "eager float32", "compiled bfloat16", "eager bfloat16"]
ZEN5 = {"compiled float32": 0.14e-3, "eager float32": 0.66e-3, "compiled bfloat16": 0.45e-3, "eager bfloat16": 2.1e-3}


@pytest.mark.parametrize("costs, picked, clear", [
    (ZEN5, "compiled float32", True),  # the demo on Zen 5: a clear winner
    (dict(ZEN5, **{"compiled bfloat16": 0.10e-3}), "compiled bfloat16", True),  # bf16 clearly faster: taken
    (dict(ZEN5, **{"compiled bfloat16": 0.137e-3}), "compiled float32", False),  # 2% faster: a tie, the safer kept
])
def test_a_clear_winner_is_taken_and_a_tie_keeps_the_safer(costs, picked, clear):
    (chosen, was_clear), clock = chosen_with(lambda name, k: costs[name], NAMES)
    assert chosen == picked and was_clear == clear
    per_round = {n: clock.calls[n] - 1 for n in NAMES}  # minus the warm-up
    assert all(per_round[n] * costs[n] >= timing.ROUNDS * timing.MIN_S for n in NAMES)  # each at least MIN_S a round


def test_noise_that_flips_the_order_is_a_tie():
    """Two candidates 1% apart under +-30% noise per call: neither beats the other by the margin in 80% of rounds,
    so the safer (float32) is kept whichever happened to be faster."""
    rnd = random.Random(0)
    base = {"compiled float32": 1.0e-3, "compiled bfloat16": 0.99e-3}
    for _ in range(20):
        (chosen, clear), _ = chosen_with(lambda name, k: base[name] * rnd.uniform(0.7, 1.3), list(base))
        assert chosen == "compiled float32"


def test_a_busy_machine_cannot_flip_a_clear_winner():
    """Another process stalls whole rounds (every call in them 5x slower for a while): the paired per-round ratios
    still show the 3x winner."""
    costs = {"compiled float32": 1.0e-3, "compiled bfloat16": 3.0e-3}
    (chosen, clear), _ = chosen_with(
        lambda name, k: costs[name] * (5 if (k // 40) % 3 == 1 else 1), list(costs))
    assert chosen == "compiled float32" and clear


def test_others_busy_reads_other_processes_cores():
    snapshots = iter([(1000, 100, 10), (1000 + 2 * 100, 100 + 150, 10 + 50)])  # 2 CPUs, 100 ticks each
    stop = REAL_OTHERS_BUSY(read=lambda: next(snapshots))
    assert stop() == pytest.approx((150 - 50) / (200 / (os.cpu_count() or 1)))
    assert REAL_OTHERS_BUSY(read=lambda: None)() is None
    stop = REAL_OTHERS_BUSY()
    time.sleep(0.1)
    assert stop() >= 0  # /proc is readable here (Linux)


@pytest.mark.parametrize("first, last, expected", [
    (1, 501, (16, 512)), (6, 46, (16, 64)), (300, 800, (256, 1024)), (1024, 16384, (1024, 16384)), (1, 2, (16, 16)),
])
def test_context_range(first, last, expected):
    assert plan.context_range(first, last) == expected


def fake_step(costs, clock, calls):
    def step(dtype):
        calls.append(dtype)
        clock.now += costs[dtype]
    return step


@pytest.mark.parametrize("costs, picked, bf16_calls", [
    ({"float32": 0.34, "bfloat16": 0.51}, "float32", 1 + timing.ROUNDS),  # Intel AMX at width 128
    ({"float32": 0.24, "bfloat16": 0.19}, "bfloat16", 1 + timing.ROUNDS),  # Zen 5
    ({"float32": 0.30, "bfloat16": 3.50}, "float32", 1),  # emulated bf16: out after one step
])
def test_train_plan_times_the_step_keeps_it_and_replans(costs, picked, bf16_calls, tmp_path):
    clock, calls = FakeClock(None), []
    step = fake_step(costs, clock, calls)
    chosen = timing.train_plan(step, ["tiny", 1], str(tmp_path), clock=clock)
    other = "bfloat16" if picked == "float32" else "float32"
    assert chosen.dtype == getattr(torch, picked) and calls.count("bfloat16") == bf16_calls
    assert str(chosen) == (f"plan: {picked}, {costs[picked]:.3f} s/step (fastest of 2, next {other} "
                           f"{costs[other]:.3f} s/step; measured now)")
    assert len(str(chosen)) < 100 and any(picked in line and "<- chosen" in line for line in chosen.details)
    calls.clear()
    again = timing.train_plan(step, ["tiny", 1], str(tmp_path), clock=clock)
    assert again.dtype == chosen.dtype and calls == [] and "cached 20" in str(again) and "by train.py" in str(again)
    timing.train_plan(step, ["tiny", 1], str(tmp_path), replan=True, clock=clock)
    assert calls  # --replan measures again
    timing.train_plan(step, ["other shape", 1], str(tmp_path), clock=clock)
    assert len(os.listdir(tmp_path)) == 2  # one plan per shape


def test_a_plan_made_on_a_busy_machine_is_provisional_and_measured_again(tmp_path, quiet):
    clock, calls = FakeClock(None), []
    step = fake_step({"float32": 0.3, "bfloat16": 0.2}, clock, calls)
    quiet[0] = 1.0  # another process kept a core busy while the plan was timed
    chosen = timing.train_plan(step, ["m"], str(tmp_path), clock=clock)
    assert chosen.dtype == torch.bfloat16 and "busy machine (1.0 cores): provisional" in str(chosen)
    assert "other processes 1.00 cores" in chosen.details[0] and "PROVISIONAL" in chosen.details[0]
    [path] = [os.path.join(tmp_path, f) for f in os.listdir(tmp_path)]
    with open(path) as f:
        assert json.load(f)["jobs"]["train"]["provisional"]
    quiet[0], calls[:] = 0.0, []
    chosen = timing.train_plan(step, ["m"], str(tmp_path), clock=clock)
    assert chosen.dtype == torch.bfloat16 and calls and "provisional" not in str(chosen)  # measured again, quiet
    calls.clear()
    assert timing.train_plan(step, ["m"], str(tmp_path), clock=clock).dtype == torch.bfloat16 and not calls  # kept
    for broken in ("{not json", '{"jobs": {"train": {"chosen": "bfloat16"}}}', '{"jobs": []}', "[1, 2]"):
        with open(path, "w") as f:
            f.write(broken)  # a plan file cut short or edited by hand: measured again, never a traceback
        calls.clear()
        assert timing.train_plan(step, ["m"], str(tmp_path), clock=clock).dtype == torch.bfloat16 and calls


def tiny_gqa():
    from model import GPT, GPTConfig
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=40, block_size=32, n_layer=1, n_embd=32, n_head=4, n_kv_head=2)).eval()


def test_one_candidate_left_by_the_flags_is_not_timed_and_says_so(tmp_path, monkeypatch):
    """--compile=False --dtype=float32: one candidate, nothing to time; the line gives that as the reason, and the model
    it hands over is a copy of the input in float32 (the same logits), the caller's model untouched."""
    monkeypatch.setattr(plan, "measure_at", lambda *a: pytest.fail("timed"))
    monkeypatch.setattr(plan, "choose_attention", lambda *a: plan.AttentionChoice("sdpa", None))  # its own: below
    model = tiny_gqa()
    chosen = plan.decode_plan(model, (16, 32), str(tmp_path), dtypes=[torch.float32], runtimes=("eager",))
    assert (chosen.runtime, chosen.dtype, chosen.step, chosen.attention) == ("eager", torch.float32, None, "sdpa")
    assert str(chosen) == ("plan: eager float32, attention sdpa (eager float32 only, as asked; the only candidate, "
                           "not timed)")
    x = torch.randint(40, (1, 8))
    assert torch.equal(chosen.model(x)[0], model(x)[0]) and chosen.model is not model
    assert model.blocks[0].attn.kv_cache is None  # the plan works on copies, never the caller's model


def fake_decode_timings(monkeypatch, medians):
    """measure_at returns these medians (ms) for the candidates asked; compiled steps are stand-ins."""
    class Step:
        path = "decode-fake.pt2"
    monkeypatch.setattr(plan, "compiled_decode", lambda *a, **k: Step())
    monkeypatch.setattr(plan, "choose_attention", lambda *a, **k: plan.AttentionChoice("sdpa", None))
    monkeypatch.setattr(plan, "measure_at", lambda contexts, calls_at: (
        {name: [medians[name] / 1e3] * timing.ROUNDS for name in calls_at(contexts[0])}, 0.0))
    monkeypatch.setattr(plan, "decode_step_at", lambda *a, **k: None)


def test_the_plan_is_kept_and_a_narrowed_command_says_its_own_reason(tmp_path, monkeypatch):
    """fold.py plans every candidate (compiled bf16 fastest); sample.py --compile=False then reads that plan, picks the
    faster eager one and says why: eager only, as asked, the fastest of the two eager ones, and when it was measured.
    Nothing about a compiled candidate it was never allowed."""
    fake_decode_timings(monkeypatch, {"compiled float32": 0.30, "eager float32": 1.2, "compiled bfloat16": 0.2,
                                      "eager bfloat16": 2.0})
    monkeypatch.setattr(plan, "cpu_bf16_support", lambda: (True, "AVX512"))
    model = tiny_gqa()
    folded = plan.decode_plan(model, (16, 512), str(tmp_path), build=True, by="fold.py")
    assert (folded.runtime, folded.dtype, folded.attention) == ("compiled", torch.bfloat16, "sdpa")
    assert str(folded) == ("plan: compiled bfloat16, attention sdpa, 0.200 ms/token (fastest of 4, next compiled "
                           "float32 0.300 ms/token; measured now)")
    monkeypatch.setattr(plan, "measure_at", lambda *a: pytest.fail("timed again"))
    eager = plan.decode_plan(model, (16, 512), str(tmp_path), runtimes=("eager",))
    assert (eager.runtime, eager.dtype, eager.step) == ("eager", torch.float32, None)
    assert str(eager).startswith("plan: eager float32, attention sdpa, 1.200 ms/token (eager only, as asked; fastest "
                                 "of 2, next eager bfloat16 2.000 ms/token; cached 20")
    assert str(eager).endswith(" by fold.py)")


def test_a_tie_keeps_the_safer_and_says_so(tmp_path, monkeypatch):
    fake_decode_timings(monkeypatch, {"compiled float32": 0.30, "eager float32": 1.2})
    chosen = plan.decode_plan(tiny_gqa(), (16, 64), str(tmp_path), dtypes=[torch.float32], build=True)
    assert chosen.runtime == "compiled" and "fastest of 2" in str(chosen)
    fake_decode_timings(monkeypatch, {"compiled float32": 0.30, "eager float32": 0.29})  # eager 3% faster: a tie
    chosen = plan.decode_plan(tiny_gqa(), (16, 64), str(tmp_path), dtypes=[torch.float32], build=True, replan=True)
    assert chosen.runtime == "compiled" and "within 5% of eager float32 (0.290 ms/token): the safer kept" in str(chosen)


def test_a_real_decode_plan_times_the_model_itself(tmp_path, monkeypatch):
    """No fakes: eager float32 against eager bf16 on a tiny model, timed at both contexts, written, read back."""
    monkeypatch.setattr(timing, "MIN_S", 0.002)
    model = tiny_gqa()
    first = plan.decode_plan(model, (16, 32), str(tmp_path), dtypes=[torch.float32, torch.bfloat16],
                             runtimes=("eager",))
    assert first.runtime == "eager" and "measured now" in str(first) and set(first.seconds) == {
        "eager float32", "eager bfloat16"} and all(s > 0 for s in first.seconds.values())
    monkeypatch.setattr(plan, "measure_at", lambda *a: pytest.fail("timed again"))
    second = plan.decode_plan(model, (16, 32), str(tmp_path), dtypes=[torch.float32, torch.bfloat16],
                              runtimes=("eager",))
    assert second.dtype == first.dtype and "by sample.py" in str(second)
    assert model.blocks[0].attn.kv_cache is None


@pytest.mark.parametrize("busy, picked", [(0.0, "bfloat16"), (1.0, "float32")])
def test_a_busy_machine_needs_a_large_gap_to_leave_the_safe_choice(tmp_path, quiet, busy, picked):
    """bf16 15% faster: taken on a quiet machine; beside another process (noise of that size is common then) the
    25% margin keeps float32, and the line says it was not told apart."""
    clock, calls = FakeClock(None), []
    quiet[0] = busy
    chosen = timing.train_plan(fake_step({"float32": 0.30, "bfloat16": 0.26}, clock, calls), ["m"], str(tmp_path),
                             clock=clock)
    assert chosen.dtype == getattr(torch, picked)
    assert ("within 25% of bfloat16 (0.260 s/step): the safer kept" in str(chosen)) == (busy > 0)


@pytest.mark.parametrize("fp32, bf16, says", [
    ([0.30] * 5, [0.26] * 5, "within 25% of compiled bfloat16 (0.260 ms/token): the safer kept"),
    ([0.90, 0.90, 0.90, 0.30, 0.30], [0.26, 0.26, 0.26, 0.60, 0.60],
     "compiled bfloat16 (0.260 ms/token) faster in only 3 of 5 rounds: the safer kept"),
])
def test_the_reason_for_keeping_the_safer_names_the_test_it_failed(fp32, bf16, says):
    """On a busy machine a candidate 3x faster by its median can still lose the 80%-of-rounds test: the line says
    so rather than calling a 3x gap "within 25%"."""
    times = {"compiled float32": [t * 1e-3 for t in fp32], "compiled bfloat16": [t * 1e-3 for t in bf16]}
    job = dict(rounds=times, busy_cores=0.8, provisional=True, fresh=True)
    assert timing.choose(times, timing.BUSY_MARGIN)[0] == "compiled float32"
    assert timing.reason(job, times, "compiled float32", "token").startswith(says)
