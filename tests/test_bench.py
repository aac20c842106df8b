"""bench_decode.py and bench.py, and the decode code they exercise: exactness of the new decode paths (float64),
decode and training throughput end to end at tiny sizes, the paper's 1.7B cost figures, and one-line errors.
Speed is measured, never asserted."""
import ast
import json
import math
import os

import pytest
import torch

from conftest import ROOT, load_script, run
from nanovha.config import configure
from nanovha.checkpoint import save_checkpoint
from model import GPT, GPTConfig, fold_postmix, rope_cos_sin
from nanovha.engine.attention import use_engine
from test_model import VARIANTS, make

TINY = ["--n_layer=2", "--n_embd=32", "--n_head=4", "--head_dim=8", "--vha_kv_head=2", "--threads=1", "--warmup=1",
        "--device=cpu", "--seed=0"]
# llama.cpp rows: tests/test_gguf.py; compiled: test_compiled_decode.py
TINY_DECODE = TINY + ["--contexts=48,96", "--decode_steps=3", "--prefill_max=16", "--prefill_repeats=1", "--copy_mib=8",
                      "--llama_cpp=False", "--compile=off", "--dtype=float32"]  # fp32: bytes counted by hand below
PAPER = ["config/paper_1p7b_gqa8.py", "config/paper_1p7b_gqa2.py", "config/paper_1p7b_gqa_8q2kv.py",
         "config/paper_1p7b_vha.py"]


def last_json(proc):
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---- exactness of the decode code (float64) ----
@pytest.mark.parametrize("name", ["mha", "mqa", "vha", "postmix_only"])
@pytest.mark.parametrize("engine", [False, True], ids=["model's own", "the engine's"])
def test_static_shape_decode_equals_uncached_forward_float64(name, engine):
    """A tensor position (the torch.compile / CUDA-graph path) attends over the whole cache with a mask:
    garbage in the unwritten tail must not leak in."""
    model = make(**VARIANTS[name])
    if engine:
        use_engine(model)
    x = torch.randint(0, 37, (2, 30))
    with torch.no_grad():
        full = model(x)[0]
    for cache in model.setup_cache(batch_size=2, max_len=45):  # garbage everywhere: prefill and decode overwrite it
        cache.k.normal_(0, 10)
        cache.v.normal_(0, 10)
    steps = [model.prefill(x[:, :12])]
    for pos in range(12, 29):
        steps.append(model.decode_one_token(x[:, pos:pos + 1], torch.tensor([pos])))
    assert (torch.stack(steps, 1) - full[:, 11:29]).abs().max() < 1e-12


def test_rope_keeps_float64_angles():
    """rope_at computes the angles in float64 and casts: a float32 model is accurate far out
    (float32 angles at position 1e5 would be off by ~1e-3), at int and at tensor positions alike."""
    model = make(dtype=torch.float32, **VARIANTS["gqa"])
    d, theta = model.cfg.head_dim, model.cfg.rope_theta
    for p in (0, 5, 99_999, 100_000):
        cos64, sin64 = rope_cos_sin(torch.arange(p, p + 1), d, theta, torch.float64)
        for start in (p, torch.tensor([p])):
            cos, sin = model.rope_at(start, 1, "cpu")
            assert (cos.dtype == torch.float32 and (cos.double() - cos64).abs().max() < 1e-7
                    and (sin.double() - sin64).abs().max() < 1e-7)
    inv_freq = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    naive = (torch.tensor(100_000.0) * inv_freq).cos()  # float32 angles: the error float64 avoids
    assert (naive.double() - cos64[0, :d // 2]).abs().max() > 1e-5


def test_postmix_folded_into_o_proj_matches_explicit_postmix_float64():
    """The training forward folds the postmix into W_o; outputs and gradients equal the explicit form."""
    attn = make(**VARIANTS["vha"]).blocks[0].attn
    H, d, D = attn.cfg.n_attn_head, attn.cfg.head_dim, attn.cfg.n_embd
    a = torch.randn(3, H, 7, d, dtype=torch.float64)  # (B, H, T, d) attention outputs

    def grads(y):
        params = (attn.postmix_U, attn.postmix_V, attn.o_proj.weight)
        return y, torch.autograd.grad((y * torch.linspace(-1, 1, D, dtype=y.dtype)).sum(), params)

    flat = a.transpose(1, 2).reshape(3, 7, H * d)  # (B, T, H*d)
    y_fold, g_fold = grads(torch.nn.functional.linear(flat, fold_postmix(attn.o_proj.weight, attn.postmix_matrix())))
    y_expl, g_expl = grads(attn.o_proj(attn.apply_postmix(a).transpose(1, 2).reshape(3, 7, H * d)))
    assert (y_fold - y_expl).abs().max() < 1e-12
    assert all((g1 - g2).abs().max() < 1e-12 for g1, g2 in zip(g_fold, g_expl))
    assert (y_fold - attn.o_proj(flat)).abs().max() > 1e-3  # the postmix is far from the identity here


# ---- the benchmark, end to end ----
def test_decode_benchmark_end_to_end(tmp_path):
    png = tmp_path / "decode.png"
    proc = run("bench_decode.py", *TINY_DECODE, "--variants=mha,vha_folded", f"--plot={png}",
               env={"MPLCONFIGDIR": str(tmp_path)})
    out = last_json(proc)
    assert out["mode"] == "decode" and out["copy_gb_s"] > 0 and out["op_floor_ms"] > 0
    assert out["fold_max_logit_diff"]["vha_folded"] < 1e-10  # a real fold of a non-identity premix/postmix
    rows = {(r["variant"], r["runtime"], r["ctx"]): r for r in out["results"]}
    assert set(rows) == {(v, "eager", c) for v in ("mha", "vha_folded") for c in (48, 96)}
    mha, vha = rows[("mha", "eager", 96)], rows[("vha_folded", "eager", 96)]
    for key in ("kv_bytes_per_token", "kv_cache_mb", "ttft_ms", "prefill_tok_s", "decode_ms", "decode_tok_s",
                "mb_per_step", "gb_s", "bw_frac"):
        assert vha[key] > 0 and math.isfinite(vha[key]), key
    assert (mha["kv_bytes_per_token"] == 2 * 2 * 4 * 8 * 4
            and vha["kv_bytes_per_token"] == mha["kv_bytes_per_token"] // 2)
    # bytes one step reads, counted by hand (fp32, tied embedding 128 x 32, MLP 3 x 32 = 96, QK-norm of dim 8):
    # per layer q, k, v rows x 32 inputs + W_o 32 x 32 + gate/up 192 x 32 + down 32 x 96 + norms 32 + 32 + 8 + 8
    layer = {"mha": (32 + 32 + 32) * 32, "vha_folded": (32 + 16 + 16) * 32}  # folded VHA: 4 query, 2 KV heads
    for name, qkv in layer.items():
        weights = 4 * (128 * 32 + 2 * (qkv + 32 * 32 + 192 * 32 + 32 * 96 + 80) + 32)
        row = rows[(name, "eager", 96)]
        assert row["mb_per_step"] * 1e6 == pytest.approx(weights + 96 * row["kv_bytes_per_token"], rel=1e-12), name
        assert row["gb_s"] == pytest.approx(row["mb_per_step"] / row["decode_ms"], rel=1e-9)  # MB / ms = GB / s
        assert row["bw_frac"] == pytest.approx(row["gb_s"] / out["copy_gb_s"], rel=1e-9)
    assert vha["kv_cache_mb"] * 2 == pytest.approx(mha["kv_cache_mb"]) and vha["prefill_len"] == 16
    assert set(out["targets"]) == {"vha_over_mha", "vha_over_mha_roofline", "vha_bw_frac", "worst_attention_over_roof"}
    assert out["targets"]["vha_over_mha_roofline"] > 1  # fewer KV bytes: a better best case
    attention = [b for b in out["breakdown"] if "attn_ms" in b]
    assert out["targets"]["worst_attention_over_roof"] == max(b["attn_ms"] / b["attn_roof_ms"] for b in attention)
    for b in attention:  # each variant's share of its roof, and the mark past 1.5x
        assert b["attn_of_roof"] == pytest.approx(b["attn_roof_ms"] / b["attn_ms"])
        assert (b["handicapped"] == "HANDICAPPED") == (b["attn_ms"] > 1.5 * b["attn_roof_ms"])
    for b in out["breakdown"]:  # the roof is the slower of bytes at bandwidth and FLOPs at the matmul peak
        if b["kv_over_roof"] is not None:
            assert abs(b["kv_over_roof"]) <= abs(b["kv_over_bytes"]) * (1 + 1e-9)  # tiny runs: the KV part may be < 0
    assert "random K/V" in proc.stdout and "targets at context 96" in proc.stdout
    # printed, not asserted
    assert sum(line.rstrip().endswith(("PASS", "FAIL")) for line in proc.stdout.splitlines()) == 4
    assert png.stat().st_size > 1000


def test_decode_benchmark_folds_a_vha_checkpoint(tmp_path):
    torch.manual_seed(0)
    args = dict(vocab_size=50, block_size=32, n_layer=2, n_embd=32, n_head=4, n_kv_head=2, head_dim=8, attn="vha")
    vha = GPT(GPTConfig(**args))
    save_checkpoint({"model": vha.state_dict(), "model_args": args}, str(tmp_path / "ckpt.pt"))
    out = last_json(run("bench_decode.py", *TINY_DECODE, "--variants=gqa2", f"--ckpt={tmp_path / 'ckpt.pt'}"))
    assert {r["variant"] for r in out["results"]} == {"ckpt", "gqa2"} and out["model"]["vocab_size"] == 50
    assert out["fold_max_logit_diff"]["ckpt"] < 1e-10


def test_train_benchmark_end_to_end():
    out = last_json(run("bench.py", *TINY, "--n_head=8", "--block_size=16", "--batch_size=2", "--train_steps=2"))
    rows = {r["variant"]: r for r in out["results"]}
    assert list(rows) == ["vha", "gqa8", "gqa2"] and rows["vha"]["heads"] == "4->8Q/2KV"
    assert rows["vha"]["flops_per_token"] < rows["gqa2"]["flops_per_token"] < rows["gqa8"]["flops_per_token"]
    assert all(r["tok_s"] > 0 for r in rows.values()) and set(out["targets"]) == {"vha_over_gqa8", "vha_over_gqa_same"}


def test_costs_reproduce_the_paper_at_1p7b():
    proc = run("bench.py", "--costs=True")
    out = last_json(proc)
    rows = {r["config"]: r for r in out["results"]}
    kv = {name: rows[f"paper_1p7b_{name}.py"]["kv_bytes_per_layer"] for name in ("gqa8", "gqa2", "gqa_8q2kv", "vha")}
    assert kv == {"gqa8": 4096, "gqa2": 1024, "gqa_8q2kv": 1024, "vha": 1024}  # 4 KB vs 1 KB per layer per token, bf16
    # training FLOPs/token by hand: 3 x (28 layers x (2 x MACs + causal attention 2 H d T) + 2 x LM head)
    D, F, d, H, T, V = 2048, 6144, 128, 16, 4096, 151936
    attention, head = 2 * H * d * T, 2 * D * V
    gqa8 = D * (16 * d + 2 * 8 * d) + H * d * D + 3 * D * F  # q, k, v; W_o; MLP
    vha = D * (8 * d + 2 * 2 * d) + H * d * D + 3 * D * F + H * d * d + 2 * H * 4 * d  # + premix, rank-4 postmix
    flops = {name: 3 * (28 * (2 * macs + attention) + head) for name, macs in (("gqa8", gqa8), ("vha", vha))}
    assert rows["paper_1p7b_vha.py"]["train_flops_per_token"] == flops["vha"]
    assert out["flops_reduction"] == pytest.approx(1 - flops["vha"] / flops["gqa8"], rel=1e-12)
    assert 0.065 <= out["flops_reduction"] <= 0.081  # the paper's band for VHA vs GQA-8 (7.1% here)
    assert 1.6e9 < rows["paper_1p7b_gqa8.py"]["params_b"] * 1e9 < 1.8e9
    assert proc.stdout.count("PASS") == 2


def test_paper_configs_use_train_py_keys():
    """The 1.7B files must run as `python train.py config/paper_1p7b_gqa8.py config/paper_1p7b_vha.py`: train.py's
    keys and types, the base's shape."""
    tree = ast.parse(open(os.path.join(ROOT, "train.py")).read())
    defaults = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            if node.targets[0].id == "defaults":  # the end of the settings block
                break
            try:
                defaults[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                pass
    optional = {"head_dim": int, "mlp_hidden": int, "vha_postmix_rank": int}
    for path in PAPER:
        cfg = configure(defaults, [os.path.join(ROOT, PAPER[0]), os.path.join(ROOT, path)], optional)
        assert ((cfg["n_layer"], cfg["n_embd"], cfg["head_dim"], cfg["mlp_hidden"], cfg["block_size"])
                == (28, 2048, 128, 6144, 4096))


# ---- bad input: one line on stderr, non-zero exit ----
def not_a_checkpoint(tmp_path):
    torch.save({"weights": torch.zeros(2)}, tmp_path / "foreign.pt")
    return f"--ckpt={tmp_path / 'foreign.pt'}"


@pytest.mark.parametrize("make_arg, message", [
    (lambda p: "--variants=mha,gqa9000x", "unknown variant 'gqa9000x'"),
    (lambda p: "--contexts=1024,lots", "--contexts wants comma-separated positive integers"),
    (lambda p: f"--ckpt={p / 'missing.pt'}", "not found"),
    (not_a_checkpoint, "is not a nanoVHA checkpoint"),
    (lambda p: "--context=1024", "unknown config key 'context'"),
    (lambda p: ["--contexts=100000000000", "--variants=mha"], "GiB available; lower --contexts or --batch_size"),
], ids=["unknown-variant", "bad-contexts", "missing-ckpt", "foreign-ckpt", "unknown-key", "cache-past-memory"])
def test_bad_input_is_a_one_line_error(tmp_path, make_arg, message):
    arg = make_arg(tmp_path)
    proc = run("bench_decode.py", *TINY_DECODE, *([arg] if isinstance(arg, str) else arg), check=False)
    err = proc.stderr.strip()
    assert proc.returncode != 0 and err.startswith("error: ") and "\n" not in err and message in err, proc.stderr
    assert not proc.stdout.strip()


def test_train_benchmark_runs_only_the_variants_asked_for():
    out = last_json(run("bench.py", *TINY, "--n_head=8", "--block_size=16", "--batch_size=2", "--train_steps=1",
                        "--train_variants=vha,gqa2"))
    assert [r["variant"] for r in out["results"]] == ["vha", "gqa2"] and set(out["targets"]) == {"vha_over_gqa_same"}
    proc = run("bench.py", *TINY, "--train_variants=vha,mla", check=False)
    assert proc.returncode != 0 and proc.stderr.strip() == (
        "error: train_variants: all, or a comma list of vha, gqa8, gqa2; got 'vha,mla'")


@pytest.mark.slow  # a compile
def test_decode_step_compiles_as_one_graph_and_matches_eager():
    """torch.compile(fullgraph=True) of the static-shape step: no graph break, same logits (float64)."""
    model = make(n_layer=1, **VARIANTS["gqa"])
    x = torch.randint(0, 37, (2, 12))
    model.setup_cache(batch_size=2, max_len=16)
    model.prefill(x[:, :8])
    want = [model.decode_one_token(x[:, p:p + 1], torch.tensor([p])) for p in range(8, 11)]
    model.prefill(x[:, :8])  # same cache state again
    step = torch.compile(model.decode_one_token, fullgraph=True)
    got = [step(x[:, p:p + 1], torch.tensor([p])) for p in range(8, 11)]
    assert all((g - w).abs().max() < 1e-12 for g, w in zip(got, want))


# ---- the CUDA argument path, without a GPU ----
def test_auto_settings_resolve_for_cuda_and_cpu(monkeypatch):
    """prefill_max and compile auto: on CUDA 32K prefill and CUDA graphs; a CPU prefills 2K and compiles an
    AOTInductor package; MPS runs eager. resolve_auto is called with device_type="cuda" here; no GPU is needed."""
    import sys
    monkeypatch.setattr(sys, "argv", ["bench_decode.py", "--device=cpu"])
    bench = load_script("bench_decode.py")  # parses the argv above; runs nothing (the benchmark runs under __main__)
    assert (bench.prefill_max, bench.compile, bench.runtimes) == (2048, "aot", ["aot", "eager"])
    assert bench.resolve_auto("cuda", None, "auto") == (32768, "graphs")
    assert bench.resolve_auto("cuda", 4096, "off") == (4096, "off")  # explicit settings stay
    assert bench.resolve_auto("cpu", None, "auto") == (2048, "aot")
    assert bench.resolve_auto("mps", None, "auto") == (2048, "off")