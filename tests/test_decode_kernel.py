"""Our one-token CPU attention kernel (nanovha/engine/csrc/decode_attention.cpp): the same numbers as one softmax
over the written positions, in float64 to rounding, in float32 and bf16 to their precision, whichever compiled-in
shape or scalar path runs and however the cache is cut among threads; never a read past the position; the static
decode step through it equal to the uncached forward; the plan that picks it; the KV memory it streams."""
import os
import re

import pytest
import torch

from nanovha import timing
from nanovha.engine import kernel as our_op, plan
from nanovha.engine.attention import DECODE_KERNELS, PagedKV, static_attention, use_engine
from nanovha.hardware import cpu_features
from test_mla_mfa import MFA, MLA, decode_all
from test_model import make


@pytest.fixture(scope="module", autouse=True)
def built():
    assert our_op.load(), our_op.why_not()  # CI has a C++ compiler and ninja: the kernel must build
    return True


def reference(q, k, v, pos, scale):
    """softmax(q k^T * scale) v over positions 0..pos, in float64."""
    n = pos + 1
    scores = q.double() @ k[:, :, :n].double().transpose(-2, -1) * scale
    return scores.softmax(dim=-1) @ v[:, :, :n].double()


# (B, H_kv, G, D, D_v, T, pos, dtype, tolerance relative to the largest output): the compiled-in shapes (groups of
# 1/2/4/8/16, rows of 16-128 and MLA's 144), the scalar path (any other shape, float16 and float64), chunks merged
# (T past 512), a last block cut short of 16 rows, and a position far short of the cache. Tolerances about 5x the
# worst seen over 5 seeds and 1 and 4 threads (float32 3.7e-6, float16 3.4e-4, bf16 4.3e-3 with the AMX path's
# weights in bf16): a seed's rounding cannot fail them, a wrong index or a lost chunk does.
F32, F16, BF16 = 2e-5, 2e-3, 2e-2
CASES = {
    "gqa2_float64": (1, 2, 8, 32, 32, 700, 699, torch.float64, 1e-13),
    "odd_shape_float64": (2, 3, 5, 24, 20, 600, 333, torch.float64, 1e-13),
    "gqa2_float32": (1, 2, 8, 32, 32, 1500, 1499, torch.float32, F32),
    "mqa_float32": (1, 1, 16, 64, 64, 3000, 2950, torch.float32, F32),
    "demo_float32": (1, 2, 4, 16, 16, 300, 299, torch.float32, F32),
    "odd_shape_float32": (1, 2, 5, 24, 24, 900, 700, torch.float32, F32),
    "one_position_float32": (1, 2, 8, 128, 128, 640, 0, torch.float32, F32),
    "gqa2_float16": (1, 2, 8, 32, 32, 1500, 1499, torch.float16, F16),
    "group4_float16": (1, 2, 4, 32, 32, 700, 699, torch.float16, F16),
    "amx_group4_bf16": (1, 2, 4, 32, 32, 700, 699, torch.bfloat16, BF16),  # 4 heads padded to AMX's 16 rows
    "gqa2_bf16": (1, 2, 8, 32, 32, 1500, 1499, torch.bfloat16, BF16),
    "mfa_bf16": (1, 1, 16, 64, 64, 2000, 1200, torch.bfloat16, BF16),
    "mqa_bf16": (1, 1, 16, 32, 32, 3000, 2950, torch.bfloat16, BF16),
    "mla_rows_bf16": (1, 1, 16, 128, 128, 1100, 1000, torch.bfloat16, BF16),
    "short_bf16": (2, 1, 16, 32, 32, 64, 20, torch.bfloat16, BF16),
    "gqa8_bf16_rows": (1, 8, 2, 32, 32, 700, 699, torch.bfloat16, BF16),  # the rows path: groups of 1 and 2
    "mha_bf16_rows": (1, 16, 1, 32, 32, 1500, 1499, torch.bfloat16, BF16),
    "mha_float32_rows": (1, 4, 1, 64, 64, 777, 770, torch.float32, F32),  # a last block of 3 rows
    "gqa8_float32_rows": (2, 2, 2, 128, 128, 650, 640, torch.float32, F32),
    "group4_d16_bf16": (1, 2, 4, 16, 16, 300, 299, torch.bfloat16, BF16),
    "group8_d128_odd_bf16": (1, 2, 8, 128, 128, 900, 870, torch.bfloat16, BF16),  # a last block of 39 rows
    "group4_d64_bf16": (2, 2, 4, 64, 64, 1030, 1028, torch.bfloat16, BF16),
    "mla_latent_bf16": (1, 1, 16, 144, 144, 1000, 998, torch.bfloat16, BF16),  # [c_kv ; k_R]: 128 + 16
    "latent_values_apart_bf16": (1, 1, 16, 144, 144, 700, 690, torch.bfloat16, BF16),  # 9 slices of d_v, v not k
    "group16_d16_bf16": (1, 2, 16, 16, 16, 500, 498, torch.bfloat16, BF16),  # one slice of d_v; a last block of 19
    "group8_d64_last5_bf16": (1, 1, 8, 64, 64, 300, 292, torch.bfloat16, BF16),  # keys in place, a last block of 5
}


def on_threads(threads, q, k, v, pos, scale, path=0):
    """Our op on `threads` threads (4 on one or two KV heads: the cache cut into chunks, then merged)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return torch.ops.nanovha.decode_attention(q, k, v, torch.tensor([pos]), scale, path)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("threads", [1, 4])
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_the_kernel_is_one_softmax_over_the_written_positions(case, threads):
    B, H, G, D, DV, T, pos, dtype, tol = case
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, *shape, generator=g).to(dtype) for shape in ((G, D), (T, D), (T, DV)))
    k[:, :, pos + 1:], v[:, :, pos + 1:] = float("nan"), float("inf")  # never read: they would poison the output
    got = on_threads(threads, q, k, v, pos, D ** -0.5)
    want = reference(q, k, v, pos, D ** -0.5)
    assert got.dtype == dtype and got.shape == (B, H, G, DV)
    assert (got.double() - want).abs().max() <= tol * want.abs().max()


DOT_CASES = {name: case for name, case in CASES.items() if case[7] == torch.bfloat16 and 4 <= case[2] <= 16}
COMPILED_WIDTHS = (16, 32, 64, 128, 144)  # decode_attention.cpp's cases (144 for groups of 16 only)
DOT_HERE = "avx512_bf16" in cpu_features() and "avx512bw" in cpu_features()  # the op has its dot path here


@pytest.mark.parametrize("threads", [1, 4])
@pytest.mark.parametrize("case", DOT_CASES.values(), ids=DOT_CASES.keys())
def test_the_dot_path_is_the_same_softmax_where_the_cpu_has_it(case, threads):
    """Asked for (path 1), bf16 groups of 4 to 16 take VDPBF16PS on a CPU with AVX512_BF16, and the default path
    elsewhere: the same softmax to bf16 precision either way, and the op names the path it takes."""
    B, H, G, D, DV, T, pos, dtype, tol = case
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, *shape, generator=g).to(dtype) for shape in ((G, D), (T, D), (T, DV)))
    k[:, :, pos + 1:], v[:, :, pos + 1:] = float("nan"), float("inf")
    compiled = D == DV and D in COMPILED_WIDTHS and (D != 144 or G == 16)
    dot = DOT_HERE and compiled
    assert (torch.ops.nanovha.decode_attention_path(q, k, v, torch.tensor([pos]), 1) == "dot") == dot
    assert torch.ops.nanovha.decode_attention_path(q, k, v, torch.tensor([pos]), 0) != "dot"
    got = on_threads(threads, q, k, v, pos, D ** -0.5, path=1)
    want = reference(q, k, v, pos, D ** -0.5)
    assert (got.double() - want).abs().max() <= tol * want.abs().max()


@pytest.mark.parametrize("path", [2, -1], ids=["two", "negative"])
def test_a_path_the_op_lacks_is_refused(path):
    bad = re.escape(f"nanovha::decode_attention: path is 0 (the default) or 1 (dot), got {path}")
    q, k = torch.randn(1, 1, 4, 16).bfloat16(), torch.randn(1, 1, 8, 16).bfloat16()
    with pytest.raises(RuntimeError, match=bad):
        torch.ops.nanovha.decode_attention(q, k, k, torch.tensor([3]), 0.25, path)
    with pytest.raises(RuntimeError, match=bad):
        torch.ops.nanovha.decode_attention_path(q, k, k, torch.tensor([3]), path)


def test_mla_rows_serve_as_keys_and_values_through_a_strided_view():
    """MLA's latent rows are the keys, and their first r columns the values: a view with the row stride of k."""
    g = torch.Generator().manual_seed(1)
    q, rows = torch.randn(1, 1, 16, 128, generator=g), torch.randn(1, 1, 900, 128, generator=g)
    got = torch.ops.nanovha.decode_attention(q, rows, rows[..., :112], torch.tensor([899]), 0.1)
    want = reference(q, rows, rows[..., :112], 899, 0.1)
    assert got.shape == (1, 1, 16, 112) and (got.double() - want).abs().max() <= 2e-6 * want.abs().max()


@pytest.mark.parametrize("threads", [1, 4])
def test_mla_rows_as_keys_and_values_at_once_in_bf16(threads):
    """v is k (MLA's absorbed decode at its compiled-in width, 144): the AMX path pairs the values from the rows it
    just read for the keys, rather than reading them again."""
    g = torch.Generator().manual_seed(2)
    q, rows = torch.randn(1, 1, 16, 144, generator=g).bfloat16(), torch.randn(1, 1, 1000, 144, generator=g).bfloat16()
    rows[:, :, 999:] = float("nan")  # never read
    got = on_threads(threads, q, rows, rows, 998, 144 ** -0.5)
    want = reference(q, rows, rows, 998, 144 ** -0.5)
    assert (got.double() - want).abs().max() <= BF16 * want.abs().max()


WIDE = dict(n_embd=256, n_head=16)  # heads of 16: the compiled-in float paths (float64 takes the scalar one)


@pytest.mark.parametrize("kw", [dict(WIDE, n_kv_head=2), dict(WIDE, n_kv_head=1), dict(MLA, n_head=8), MFA],
                         ids=["gqa", "mqa", "mla", "mfa"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("static", [True, False], ids=["static", "eager"])
def test_decode_through_the_kernel_equals_the_uncached_forward(kw, dtype, static):
    """The compiled step's path (static) and eager decode with our kernel asked for: every position's logits as the
    full forward gives them."""
    model = make(dtype=dtype, **kw)
    x = torch.randint(0, 41, (2, 14), generator=torch.Generator().manual_seed(1))
    full = model(x)[0]
    got = decode_all(use_engine(model, "nanovha"), x, 5, static=static)
    assert (got - full[:, 4:]).abs().max() < (1e-12 if dtype == torch.float64 else 1e-4)


def test_static_attention_calls_the_kernel_asked_for(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.ops.nanovha, "decode_attention", lambda *a: calls.append(a) or a[0])
    q, k = torch.randn(1, 1, 4, 16), torch.randn(1, 1, 64, 16)
    static_attention(q, k, k, torch.tensor([3]))
    assert not calls  # SDPA unless our kernel is asked for
    static_attention(q, k, k, torch.tensor([3]), "nanovha")
    static_attention(q, k, k, torch.tensor([3]), "nanovha_dot")
    assert [a[-2:] for a in calls] == [(16 ** -0.5, 0), (16 ** -0.5, 1)]  # the scale, then the path


def test_paged_kv_is_one_zeroed_allocation_in_views():
    dims = [(2, 16, 16), (1, 40, 0), (2, 16, 16)]
    memory = PagedKV()
    parts = memory(1, 19_990, dims, torch.bfloat16, torch.device("cpu"))  # 2.6 MB: the 2 MB-page path
    assert [(k.shape, v.shape) for k, v in parts] == [((1, h, 20_032, kd), (1, h, 20_032, vd)) for h, kd, vd in dims]
    assert [t.data_ptr() for t in memory.tensors] == [t.data_ptr() for kv in parts for t in kv]  # what a step takes
    base = parts[0][0].untyped_storage().data_ptr()
    assert all(t.untyped_storage().data_ptr() == base for kv in parts for t in kv)  # one allocation
    assert all(t.count_nonzero() == 0 for kv in parts for t in kv)
    parts[0][1].fill_(1)  # the views do not overlap
    assert parts[0][0].count_nonzero() == 0 and parts[1][0].count_nonzero() == 0


@pytest.mark.parametrize("faster, picked, dtype", [
    ("nanovha", "nanovha", torch.float32), ("sdpa", "sdpa", torch.float32), (None, "sdpa", torch.float32),
    ("nanovha_dot", "nanovha_dot" if DOT_HERE else "sdpa", torch.bfloat16)],
    ids=["ours_faster", "sdpa_faster", "a_tie_keeps_sdpa", "dot_faster_where_the_cpu_has_it"])
def test_the_plan_times_the_kernels_and_keeps_the_choice(tmp_path, monkeypatch, faster, picked, dtype):
    """choose_attention times SDPA and ours (and ours asked for its dot path, in bf16 where the CPU has it) on the
    model's own attention: a clear winner is taken, a tie keeps SDPA (and is not settled: no new package is built
    for it), and the choice is read back without timing again."""
    import time
    real = plan.attention_calls
    # the real calls are ~0.1 ms apart: a tie within the margin, whatever a busy machine adds to a sleep
    pause = {k: 0.2 if faster and k != faster else 0.1 for k in DECODE_KERNELS}

    def calls(model, ctx):  # the real calls, each made slower by its kernel's pause
        fns = real(model, ctx)
        return {k: (lambda k=k: (fns[k](), time.sleep(pause[k]))) for k in fns}
    monkeypatch.setattr(plan, "attention_calls", calls)
    monkeypatch.setattr(timing, "MIN_S", 0.1)
    monkeypatch.setattr(timing, "others_busy", lambda read=None: (lambda: 0.0))  # quiet, whatever runs beside
    model = make(dtype=dtype, n_head=8, n_kv_head=2, n_embd=128)  # heads of 16: a compiled-in width
    choice = plan.choose_attention(model, (16, 64), str(tmp_path))
    timed = ("sdpa", "nanovha", "nanovha_dot") if dtype == torch.bfloat16 and DOT_HERE else ("sdpa", "nanovha")
    assert tuple(choice.job["rounds"]) == timed
    assert choice.kernel == picked and choice.job["fresh"] and choice.settled
    assert bool(plan.choose(choice.job["rounds"])[1]) == (picked == "sdpa" and faster != "sdpa")  # a tie: SDPA
    monkeypatch.setattr(plan, "attention_calls", lambda *a: pytest.fail("timed again"))
    assert plan.choose_attention(model, (16, 64), str(tmp_path)).kernel == picked


def test_without_a_compiler_the_plan_keeps_sdpa(tmp_path, monkeypatch):
    monkeypatch.setattr(our_op, "load", lambda: False)  # no g++, say
    assert plan.choose_attention(make(dtype=torch.float32, n_head=8), (16, 64), str(tmp_path)) == plan.AttentionChoice(
        "sdpa", None)
    assert not os.listdir(tmp_path)


@pytest.mark.parametrize("build, provisional, kernel, built", [
    (False, False, "nanovha", ["nanovha"]),  # sample.py after a quiet plan: the planned one built, once
    (False, True, "sdpa", ["sdpa"]),  # sample.py on a busy machine: the package at hand
    (True, True, "sdpa", ["sdpa"]),  # fold.py on a busy machine: only the safe one is built
    (True, False, "nanovha", ["nanovha"]),  # fold.py on a quiet machine: the planned one
], ids=["quiet_sample_builds_the_planned", "busy_sample_keeps_the_one_at_hand", "busy_fold_builds_the_safe",
        "quiet_fold_builds_the_planned"])
def test_a_busy_plan_leaves_no_package_a_quiet_one_would_not_choose(tmp_path, monkeypatch, capsys, build,
                                                                     provisional, kernel, built):
    """fold.py built the package with SDPA (a busy machine's choice); the attention's plan now picks ours. A quiet
    choice builds the planned package (one line says so), a provisional one keeps the package at hand; building
    on a busy machine, only the safe package is built."""
    import copy
    from nanovha.engine.compiled import package_path
    from nanovha.engine.attention import use_decode_layout
    model = make(dtype=torch.float32, n_head=8, n_kv_head=2).eval()
    deployed = use_decode_layout(copy.deepcopy(model).float().eval())  # what decode_plan prepares for float32
    open(package_path(deployed, str(tmp_path), kernel="sdpa"), "wb").close()  # built by an earlier, busy plan
    job = dict(rounds={"sdpa": [2e-3] * 5, "nanovha": [1e-3] * 5}, chosen="nanovha", busy_cores=0.0,
               provisional=provisional, when="2026-12-06T00:00:00", by="sample.py", how="test")
    monkeypatch.setattr(plan, "choose_attention", lambda *a, **k: plan.AttentionChoice("nanovha", job))
    monkeypatch.setattr(our_op, "load", lambda: True)
    made = []

    class Step:
        path = "decode-fake.pt2"
    monkeypatch.setattr(plan, "compiled_decode", lambda m, folder, kernel="sdpa", **k: made.append(kernel) or Step())
    monkeypatch.setattr(plan, "measure_at", lambda contexts, calls_at: (
        {n: [1.0 if n.startswith("compiled") else 2.0] * 5 for n in calls_at(16)}, 0.0))
    monkeypatch.setattr(plan, "decode_step_at", lambda *a, **k: None)
    chosen = plan.decode_plan(model, (16, 32), str(tmp_path), dtypes=[torch.float32], build=build)
    assert (chosen.runtime, chosen.attention) == ("compiled", kernel) and made == built
    assert ("building that one, once" in capsys.readouterr().err) == (not build and not provisional)
    assert any("kept while the choice of nanovha is provisional" in line for line in chosen.details) == provisional
