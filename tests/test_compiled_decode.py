"""The compiled decode step (nanovha/engine/compiled.py): the same logits and cache writes as model.decode_one_token,
at any cache length from one package, found again by its key and only by its key; the benchmark's compiled rows and
their break-even; fold.py building the package that sample.py then loads, with the same greedy text."""
import copy
import os
import subprocess
import sys

import pytest
import torch

from conftest import ROOT, run
from model import fold_to_gqa
from nanovha.engine.compiled import compiled_decode, package_path
from nanovha.engine.attention import use_decode_layout, use_engine
from test_bench import TINY_DECODE, last_json
from test_model import make


def folded_model():
    torch.manual_seed(0)
    vha = make(dtype=torch.float32, attn="vha", vocab_size=40, n_head=4, n_kv_head=2)
    with torch.no_grad():  # premix and postmix off the identity: the folded weights are not the plain ones
        for block in vha.blocks:
            block.attn.postmix_V.normal_(0, 0.3)
    return use_decode_layout(fold_to_gqa(vha).eval())


def package_key(model, batch_size, **kw):
    return os.path.basename(package_path(model, "", batch_size, **kw))


def test_the_key_names_what_the_package_depends_on():
    model = folded_model()
    key = package_key(model, 1)
    assert package_key(copy.deepcopy(model), 1) == key  # the same weights, layout and machine: the same package
    other = copy.deepcopy(model)
    with torch.no_grad():
        other.blocks[1].mlp.down_proj.weight[0, 0] += 1e-6
    plain_layout = copy.deepcopy(model)
    for m in plain_layout.modules():  # the same values, another memory order: another package
        if isinstance(m, torch.nn.Linear):
            m.weight.data = m.weight.data.contiguous()
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)
    try:
        more_threads = package_key(model, 1)
    finally:
        torch.set_num_threads(threads)
    keys = {key, package_key(other, 1), package_key(plain_layout, 1), package_key(model, 2), more_threads,
            package_key(model, 1, autotune=False), package_key(copy.deepcopy(model).double(), 1),
            package_key(model, 1, kernel="nanovha")}
    assert len(keys) == 8


@pytest.mark.slow  # one AOTInductor build of a tiny model: ~20 s
def test_compiled_step_equals_eager_decode_at_any_cache_length(tmp_path):
    model = folded_model()
    x = torch.randint(40, (1, 30), generator=torch.Generator().manual_seed(1))
    assert compiled_decode(model, str(tmp_path), autotune=False, build_it=False) is None  # nothing cached yet
    step = compiled_decode(model, str(tmp_path), autotune=False)
    assert step.built and os.listdir(tmp_path) == [os.path.basename(step.path)]
    for max_len in (30, 77):  # one package, two cache lengths (the length is a dynamic dimension)
        eager = copy.deepcopy(model)
        with torch.inference_mode():
            caches = [m.setup_cache(1, max_len) for m in (model, eager)]
            for m in (model, eager):
                m.prefill(x[:, :12])
            for pos in range(12, 30):
                want = eager.decode_one_token(x[:, pos:pos + 1], pos)
                got = step(x[:, pos:pos + 1], torch.tensor([pos]))
                assert (got - want).abs().max() <= 1e-5 * want.abs().max()
        for a, b in zip(*caches):  # the same keys and values written, nothing past them
            assert (a.k - b.k).abs().max() <= 1e-5
            assert torch.count_nonzero(a.v[:, :, 30:]) == 0
    again = compiled_decode(copy.deepcopy(model), str(tmp_path), autotune=False)
    assert not again.built and again.path == step.path  # found by its key, loaded, not built
    # a package proves it belongs: another model's weights under this key, or a file that is no package, is a
    # one-line note and then absent (build_it=False) or rebuilt, never a traceback or another model's text
    other = copy.deepcopy(model)
    with torch.no_grad():
        other.lm_head.weight.mul_(-1)
    other_path = package_path(other, str(tmp_path), 1, autotune=False)
    for bad in (open(step.path, "rb").read(), b"", b"not a package"):
        with open(other_path, "wb") as f:
            f.write(bad)
        assert compiled_decode(other, str(tmp_path), autotune=False, build_it=False) is None
    assert compiled_decode(model, str(tmp_path), autotune=False, build_it=False) is not None  # the right one stays


@pytest.mark.slow  # one AOTInductor build of a tiny model: ~20 s
def test_a_package_calling_our_kernel_equals_eager_decode_in_a_fresh_process(tmp_path):
    """kernel="nanovha": the package calls torch.ops.nanovha.decode_attention; loading it registers the op first,
    in this process and in a new one (which has not built or loaded anything yet)."""
    model = folded_model()
    step = compiled_decode(model, str(tmp_path), autotune=False, kernel="nanovha")
    assert step.built and step.kernel == "nanovha"
    x = torch.randint(40, (1, 20), generator=torch.Generator().manual_seed(2))
    eager = copy.deepcopy(model)
    with torch.inference_mode():
        for m in (model, eager):
            m.setup_cache(1, 20)
            m.prefill(x[:, :8])
        for pos in range(8, 20):
            want = eager.decode_one_token(x[:, pos:pos + 1], pos)
            assert (step(x[:, pos:pos + 1], torch.tensor([pos])) - want).abs().max() <= 1e-5 * want.abs().max()
    torch.save(model, os.path.join(tmp_path, "model.pt"))
    code = (f"import torch; from nanovha.engine.compiled import compiled_decode; "
            f"m = torch.load({os.path.join(str(tmp_path), 'model.pt')!r}, weights_only=False); "
            f"s = compiled_decode(m, {str(tmp_path)!r}, autotune=False, build_it=False, kernel='nanovha'); "
            f"print('LOADED' if s is not None and not s.built else 'MISSING')")
    env = dict(os.environ, OMP_NUM_THREADS=str(torch.get_num_threads()))  # the thread count is in the key
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, env=env)
    assert "LOADED" in out.stdout, out.stderr


@pytest.mark.slow  # one AOTInductor build of a tiny model: ~20 s
def test_a_package_asking_for_the_dot_path_equals_eager_decode_through_it(tmp_path):
    """kernel="nanovha_dot" in bf16, groups of 4 at head dim 16: the package passes the path to our op (VDPBF16PS
    where the CPU has it, the default path elsewhere), and its steps equal eager decode through the same path."""
    model = use_decode_layout(make(dtype=torch.bfloat16, vocab_size=40, n_head=8, n_kv_head=2, n_embd=128))
    step = compiled_decode(model, str(tmp_path), autotune=False, kernel="nanovha_dot")
    assert step.built and step.kernel == "nanovha_dot"
    assert step.path != package_path(model, str(tmp_path), autotune=False, kernel="nanovha")
    x = torch.randint(40, (1, 20), generator=torch.Generator().manual_seed(2))
    eager = use_engine(copy.deepcopy(model), "nanovha_dot")
    with torch.inference_mode():
        for m in (model, eager):
            m.setup_cache(1, 20)
            m.prefill(x[:, :8])
        for pos in range(8, 20):
            want = eager.decode_one_token(x[:, pos:pos + 1], pos).float()
            got = step(x[:, pos:pos + 1], torch.tensor([pos])).float()
            assert (got - want).abs().max() <= 5e-2 * want.abs().max()  # bf16 rounding, as package_problem allows


@pytest.mark.slow  # two AOTInductor builds of tiny models: ~1 min
def test_decode_benchmark_times_the_compiled_step_beside_eager(tmp_path):
    args = [a for a in TINY_DECODE if a != "--compile=off"] + ["--compile=aot", "--compile_autotune=False"]
    out = last_json(run("bench_decode.py", *args, "--variants=mha,vha_folded", env={"NANOVHA_CACHE": str(tmp_path)}))
    assert out["runtimes"] == ["aot", "eager"] and out["cpu"]
    rows = {(r["variant"], r["runtime"], r["ctx"]) for r in out["results"]}
    assert rows == {(v, r, c) for v in ("mha", "vha_folded") for r in ("aot", "eager") for c in (48, 96)}
    costs = {c["variant"]: c for c in out["compile_costs"]}
    for c in costs.values():
        assert c["built"] and c["build_s"] > 0 and c["speedup"] == pytest.approx(c["eager_ms"] / c["compiled_ms"])
        if c["eager_ms"] > c["compiled_ms"]:
            saved = (c["eager_ms"] - c["compiled_ms"]) / 1e3
            assert c["break_even_tokens"] == pytest.approx(c["build_s"] / saved)
    again = last_json(run("bench_decode.py", *args, "--variants=vha_folded", env={"NANOVHA_CACHE": str(tmp_path)}))
    assert not again["compile_costs"][0]["built"]  # the second run loads the package the first one built


@pytest.mark.slow  # AOTInductor builds with max_autotune: ~40 s each, one per dtype the plan weighs
def test_fold_plans_and_sample_follows_the_plan_with_the_same_text(char_data, tmp_path):
    """fold.py builds a package per candidate dtype and times the plan; sample.py then follows it on the folded
    checkpoint and on the VHA one (folded at load into the same weights): same plan, same greedy text, nothing built.
    The compiled step and eager decode agree in float32."""
    from conftest import TINY_MODEL
    from nanovha.hardware import cpu_bf16_support
    env = {"NANOVHA_CACHE": str(tmp_path / "cache")}
    run("train.py", f"--data_dir={char_data}", f"--out_dir={tmp_path}", "--max_iters=150", "--eval_interval=150",
        "--attn=vha", "--dtype=float32", *TINY_MODEL)
    report = run("fold.py", f"--out_dir={tmp_path}", "--gen_tokens=10", env=env).stdout
    assert "plan: " in report and "measured now" in report and "decode plan ready in" in report
    packages = lambda: sorted(f for f in os.listdir(tmp_path / "cache" / "compiled") if f.startswith("decode-"))
    built = packages()
    assert len(built) == (2 if cpu_bf16_support()[0] else 1)  # float32, and bf16 where native
    # fold.py's plan is timed for 500 new tokens: the same job (contexts 16-512); --verbose shows a provisional one
    sample = ["sample.py", f"--out_dir={tmp_path}", "--temperature=0", "--start=ROMEO:", "--num_samples=1",
              "--max_new_tokens=500", "--verbose=True"]
    text = lambda proc: proc.stdout.split("\n---------------")[0]  # the prompt and 500 tokens, before the timing line
    plan_line = lambda proc: next(line for line in proc.stderr.splitlines() if line.startswith("plan: "))
    # "plan: compiled bfloat16, attention nanovha, 0.2 ms/token (...)" -> the choice, without its timing
    plan_of = lambda proc: [part for part in plan_line(proc).removeprefix("plan: ").split(" (")[0].split(", ")
                            if "/token" not in part]
    folded, trained = run(*sample, "--ckpt_name=ckpt_folded.pt", env=env), run(*sample, env=env)
    assert "folded into plain GQA" in trained.stderr
    assert "by fold.py" in folded.stderr or "provisional" in report  # fold.py's plan, unless made on a busy machine
    # a plan made on a busy machine is measured again by each later run, which may choose otherwise
    settled = not any("provisional" in s.lower() for s in (report, folded.stderr, trained.stderr))
    assert plan_of(folded) == plan_of(trained) or not settled  # the same model, the same plan
    if plan_of(folded)[0] == plan_of(trained)[0]:  # the same runtime and dtype: the same greedy text
        assert text(folded) == text(trained)
    # nothing built, unless fold.py planned on a busy machine (only the safe package) and a quiet sample picks ours
    assert len(text(folded).strip()) > len("ROMEO:") + 10 and (packages() == built or "provisional" in report)
    fp32 = [*sample, "--ckpt_name=ckpt_folded.pt", "--dtype=float32"]
    compiled, eager = run(*fp32, "--compile=True", env=env), run(*fp32, "--compile=False", env=env)
    assert "plan: compiled float32" in compiled.stderr and "plan: eager float32" in eager.stderr
    # nothing built, unless fold.py's kernel plan was made on a busy machine and a quiet one now tells them apart
    assert text(compiled) == text(eager) and (packages() == built or "provisional" in report)
