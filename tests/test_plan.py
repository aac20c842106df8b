"""nanovha/plan.py: the measured plan every command reads. The choice is tested with a fake clock (a clear winner, a
noisy tie, an emulated bf16, a busy machine), the plan file with a real tiny model (kept, reused, measured again)."""
import json
import os
import random
import time

import pytest
import torch

from nanovha import plan

REAL_OTHERS_BUSY = plan.others_busy  # the tests below see a quiet machine (the fixture); this one is tested itself


@pytest.fixture(autouse=True)
def quiet(monkeypatch):
    """A quiet machine, whatever else runs beside the tests: other processes' cores read as busy_cores[0]."""
    busy_cores = [0.0]
    monkeypatch.setattr(plan, "others_busy", lambda read=None: (lambda: busy_cores[0]))
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
    times, _ = plan.measure({n: clock.fn(n) for n in names}, clock)
    return plan.choose(times), clock


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
    assert all(per_round[n] * costs[n] >= plan.ROUNDS * plan.MIN_S for n in NAMES)  # each at least MIN_S a round


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
    ({"float32": 0.34, "bfloat16": 0.51}, "float32", 1 + plan.ROUNDS),  # Intel AMX at width 128
    ({"float32": 0.24, "bfloat16": 0.19}, "bfloat16", 1 + plan.ROUNDS),  # Zen 5
    ({"float32": 0.30, "bfloat16": 3.50}, "float32", 1),  # emulated bf16: out after one step
])
def test_train_plan_times_the_step_keeps_it_and_replans(costs, picked, bf16_calls, tmp_path):
    clock, calls = FakeClock(None), []
    step = fake_step(costs, clock, calls)
    dtype, line = plan.train_plan(step, ["tiny", 1], str(tmp_path), clock=clock)
    assert dtype == picked and calls.count("bfloat16") == bf16_calls and "measured now" in line
    assert line.startswith(f"{picked}: {costs[picked]:.3f} s/step vs ")
    calls.clear()
    again, line = plan.train_plan(step, ["tiny", 1], str(tmp_path), clock=clock)
    assert again == picked and calls == [] and "plan of " in line and "by train.py" in line  # kept: nothing timed
    plan.train_plan(step, ["tiny", 1], str(tmp_path), replan=True, clock=clock)
    assert calls  # --replan measures again
    plan.train_plan(step, ["other shape", 1], str(tmp_path), clock=clock)
    assert len(os.listdir(tmp_path)) == 2  # one plan per shape


def test_a_plan_made_on_a_busy_machine_is_provisional_and_measured_again(tmp_path, quiet):
    clock, calls = FakeClock(None), []
    step = fake_step({"float32": 0.3, "bfloat16": 0.2}, clock, calls)
    quiet[0] = 1.0  # another process kept a core busy while the plan was timed
    dtype, line = plan.train_plan(step, ["m"], str(tmp_path), clock=clock)
    assert dtype == "bfloat16" and "other processes 1.00 cores" in line and "PROVISIONAL" in line
    [path] = [os.path.join(tmp_path, f) for f in os.listdir(tmp_path)]
    with open(path) as f:
        assert json.load(f)["jobs"]["train"]["provisional"]
    quiet[0], calls[:] = 0.0, []
    dtype, line = plan.train_plan(step, ["m"], str(tmp_path), clock=clock)
    assert dtype == "bfloat16" and calls and "PROVISIONAL" not in line  # measured again, now quiet
    calls.clear()
    assert plan.train_plan(step, ["m"], str(tmp_path), clock=clock)[0] == "bfloat16" and not calls  # then kept
    for broken in ("{not json", '{"jobs": {"train": {"chosen": "bfloat16"}}}', '{"jobs": []}', "[1, 2]"):
        with open(path, "w") as f:
            f.write(broken)  # a plan file cut short or edited by hand: measured again, never a traceback
        calls.clear()
        assert plan.train_plan(step, ["m"], str(tmp_path), clock=clock)[0] == "bfloat16" and calls


def tiny_gqa():
    from model import GPT, GPTConfig
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=40, block_size=32, n_layer=1, n_embd=32, n_head=4, n_kv_head=2)).eval()


def test_decode_plan_is_kept_per_shape_and_its_model_decodes_the_same(tmp_path, monkeypatch):
    """A real plan of eager candidates (no package cached): it is written, read back without timing, and the model it
    hands over is the input in the chosen dtype, giving the same logits in float32."""
    monkeypatch.setattr(plan, "MIN_S", 0.002)
    model = tiny_gqa()
    first = plan.decode_plan(model, str(tmp_path), (16, 32), runtimes=("eager",), dtypes=["float32"])
    assert first.runtime == "eager" and first.dtype == "float32" and first.step is None
    assert "measured now" in first.line and "eager float32" in first.line
    timed = []
    monkeypatch.setattr(plan, "measure_decode", lambda *a, **k: timed.append(1))
    second = plan.decode_plan(model, str(tmp_path), (16, 32), runtimes=("eager",), dtypes=["float32"])
    assert not timed and "plan of " in second.line and "by sample.py" in second.line
    x = torch.randint(40, (1, 8))
    assert torch.equal(second.model(x)[0], model(x)[0])
    assert model.blocks[0].attn.kv_cache is None  # the plan times copies, never the caller's model


@pytest.mark.parametrize("busy, picked", [(0.0, "bfloat16"), (1.0, "float32")])
def test_a_busy_machine_needs_a_large_gap_to_leave_the_safe_choice(tmp_path, quiet, busy, picked):
    """bf16 15% faster: taken on a quiet machine; beside another process (noise of that size is common then) the
    25% margin keeps float32, and the line says it was not told apart."""
    clock, calls = FakeClock(None), []
    quiet[0] = busy
    dtype, line = plan.train_plan(fake_step({"float32": 0.30, "bfloat16": 0.26}, clock, calls), ["m"], str(tmp_path),
                                  clock=clock)
    assert dtype == picked and ("not told apart from bfloat16 by the 25% margin" in line) == (busy > 0)
