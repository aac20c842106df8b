"""convert.py: GQA -> VHA and GQA -> mean-pooled GQA are what their equations say: exact (logits equal the source's)
when the source's KV heads are identical within each target group and its query heads repeat across groups; the
premix solve is the least-squares solution; the written checkpoint loads and samples; bad inputs are refused."""
import hashlib
import os
from dataclasses import asdict

import pytest
import torch

import convert
from conftest import run
from data.common import load_tokenizer
from nanovha.checkpoint import load_checkpoint, model_from_checkpoint, save_checkpoint
from nanovha.generate import generate
from test_model import make

CHARS = "abcdefghijklmnopqrstuvwxyz ABCDEJMORT:.\n"  # 40 characters: the tiny models' vocab
META = {"tokenizer": "char", "vocab_size": len(CHARS), "stoi": {c: i for i, c in enumerate(CHARS)},
        "itos": dict(enumerate(CHARS))}


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def source_gqa(dtype=torch.float64, exact=False, seed=0, **kw):
    """A scrambled GQA model, 8 query heads over 4 KV heads of dim 16. exact=True: KV heads identical within each pair
    (the heads one target KV head of 2 replaces) and query heads of group g equal to group 0's (j = g*4 + h -> h)."""
    model = make(dtype=dtype, seed=seed, vocab_size=len(CHARS), attn="gqa", n_head=8, n_kv_head=4, head_dim=16, **kw)
    if exact:
        with torch.no_grad():
            for block in model.blocks:
                W_q, W_k, W_v = block.attn.qkv_proj.weight.split(block.attn.qkv_split)  # views
                q = W_q.view(8, 16, -1)  # (H_q, d, D)
                q[4:] = q[:4]  # group 1's query heads = group 0's
                for W in (W_k, W_v):
                    heads = W.view(4, 16, -1)  # (H_src, d, D)
                    heads[1::2] = heads[0::2]  # each pair identical
    return model


def logit_gap(a, b):
    x = torch.randint(0, len(CHARS), (3, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return float((a(x)[0] - b(x)[0]).abs().max())


@pytest.mark.parametrize("to, physical", [("vha", "first"), ("vha", "best"), ("vha", "fit"), ("gqa", "first")])
@pytest.mark.parametrize("dtype, ridge, tol", [
    (torch.float64, 0.0, 1e-10),
    (torch.float32, 1e-6, 2e-5),
], ids=["float64", "float32"])
def test_repeated_heads_convert_exactly(to, physical, dtype, ridge, tol):
    source = source_gqa(dtype, exact=True)
    converted, fits, _ = convert.convert(source, to, 2, ridge, physical=physical)
    c = converted.cfg
    assert (c.attn, c.n_head, c.n_kv_head, c.n_q_proj) == ((to, 8, 2, 4) if to == "vha" else (to, 8, 2, 8))
    assert converted.embed.weight.dtype == dtype and logit_gap(source, converted.eval()) <= tol
    if to == "vha":
        assert all(float(f.max()) <= (1e-12 if dtype == torch.float64 else 1e-5) for f in fits)
        assert all(torch.equal(b.attn.postmix_V, torch.zeros_like(b.attn.postmix_V)) for b in converted.blocks)  # M = I


def test_premix_is_the_least_squares_solution_and_kv_the_mean():
    source = source_gqa(seed=3)
    converted, fits, sources = convert.convert(source, "vha", 2, lam_rel=0.0)
    assert sources == [0, 0]
    for src_block, conv_block, err in zip(source.blocks, converted.blocks, fits):
        W_q, W_k, W_v = src_block.attn.qkv_proj.weight.split(src_block.attn.qkv_split)
        Wc_q, Wc_k, Wc_v = conv_block.attn.qkv_proj.weight.split(conv_block.attn.qkv_split)
        P = conv_block.attn.premix
        B = W_q.view(8, 16, -1)[:4].transpose(0, 1).reshape(16, -1)  # (d, H_p*D)
        A = W_q.view(8, 16, -1)[4:].transpose(0, 1).reshape(16, -1)
        want = torch.linalg.lstsq(B.T, A.T).solution  # an independent solver of min ||B^T P - A^T||: the same problem
        assert torch.allclose(P[1], want, atol=1e-10) and torch.equal(P[0], torch.eye(16, dtype=P.dtype))
        # random heads: a poor fit
        assert torch.equal(Wc_q, W_q[:4 * 16]) and float(err[0]) == 0 and 0.5 < float(err[1]) < 1.0
        for W, Wc in ((W_k, Wc_k), (W_v, Wc_v)):
            # target head g = mean of 2g, 2g + 1
            assert torch.allclose(Wc.view(2, 16, -1), W.view(2, 2, 16, -1).mean(1))
        assert torch.equal(conv_block.attn.o_proj.weight, src_block.attn.o_proj.weight)
    lam = convert.convert(source, "vha", 2, lam_rel=10.0)[0].blocks[0].attn.premix[1]  # ridge shrinks P towards 0
    assert lam.norm() < converted.blocks[0].attn.premix[1].norm()


def stacked_query_heads(d=8, D=24, H_p=3, H_kv=2, seed=0, rank=None):
    """W_q (H_kv*H_p*d, D) in float64. rank: group 0's heads are P^T (group 1's) for a P of that rank, so group 1
    reconstructs group 0 exactly and not the other way round."""
    gen = torch.Generator().manual_seed(seed)
    W = torch.randn(H_kv, H_p, d, D, generator=gen, dtype=torch.float64)  # (H_kv, H_p, d, D)
    if rank is not None:
        P = torch.randn(d, rank, generator=gen, dtype=torch.float64) @ torch.randn(rank, d, generator=gen,
                                                                                  dtype=torch.float64)  # (d, d)
        W[0] = P.T @ W[1]
    return W.reshape(-1, D)


def test_best_takes_the_group_that_reconstructs_the_others():
    W_q = stacked_query_heads(rank=4)
    _, _, err_first, first = convert.fit_premix(W_q, 2, 8, 0.0, physical="first")
    B, P, err, group = convert.fit_premix(W_q, 2, 8, 0.0, physical="best")
    assert first == 0 and float(err_first[1]) > 0.3  # group 0 has rank 4 of 8: it cannot make group 1
    assert group == 1 and torch.equal(B, W_q[24:]) and torch.equal(P[1], torch.eye(8, dtype=P.dtype))
    assert float(err.max()) < 1e-10  # group 0 = P^T group 1 exactly


def test_fit_is_the_least_squares_optimum_over_heads_and_premix():
    """C = I: min over B and P of sum ||A_gh - P[g]^T B_h||^2 is a rank-d approximation of the stacked heads
    S = [A_gh] ((H_kv*d) x (H_p*D)), so its residual is the sum of S's squared singular values past the d-th."""
    d, D, H_p, H_kv = 8, 24, 3, 3
    W_q = stacked_query_heads(d, D, H_p, H_kv, seed=1)
    A = W_q.view(H_kv, H_p, d, D)
    S = A.permute(0, 2, 1, 3).reshape(H_kv * d, H_p * D)  # block (g, h) = A_gh
    optimum = float(torch.linalg.svdvals(S)[d:].pow(2).sum())
    residual = {}
    for physical in ("first", "best", "fit"):
        B, P, err, group = convert.fit_premix(W_q, H_kv, d, 0.0, physical=physical)
        residual[physical] = convert.premix_residual(A, B.view(H_p, d, D), P, None)
        want = (err.pow(2) * A.flatten(1).pow(2).sum(1)).sum()  # the per-group errors say the same
        assert abs(float(want) - residual[physical]) <= 1e-9 * residual[physical]
    assert group == -1 and torch.allclose(P.mean(0), torch.eye(d, dtype=P.dtype), atol=1e-12)  # mean_g P[g] = I
    assert abs(residual["fit"] - optimum) <= 1e-6 * optimum
    assert residual["fit"] < 0.99 * residual["best"] <= residual["first"]


def save_source(folder, **kw):
    model = source_gqa(torch.float32, **kw)
    os.makedirs(folder, exist_ok=True)
    save_checkpoint({"model": model.state_dict(), "model_args": asdict(model.cfg), "meta": META, "iter_num": 5,
                     "kind": "nanovha", "config": {"dataset": "none"}}, os.path.join(folder, "ckpt.pt"))
    return model


def table(out):
    """The per-layer rows convert.py printed: layer -> the numbers after the layer index."""
    rows = [line.split() for line in out.splitlines() if line[:5].strip().isdigit()]
    return {int(r[0]): r[1:] for r in rows}


@pytest.mark.parametrize("exact", [True, False], ids=["repeated_heads", "random"])
def test_cli_prints_per_layer_errors_and_writes_a_checkpoint_that_samples(exact, tmp_path, capsys):
    source = save_source(str(tmp_path / "src"), exact=exact)
    out = tmp_path / "vha"
    convert.main([f"--src={tmp_path / 'src'}", f"--out_dir={out}", "--n_kv_head=2", "--calib_len=32"])
    printed = capsys.readouterr().out
    rows = table(printed)
    assert sorted(rows) == [0, 1] and "RANDOM tokens, 4 x 32" in printed and "KV cache 2x smaller" in printed
    fit, (q, k, v) = float(rows[0][1]), map(float, rows[0][-3:])
    assert rows[0][0] == "0"  # physical="first": group 0's source heads
    if exact:  # float32, ridge 1e-6: ~0
        assert fit < 1e-5 and max(q, k, v) < 1e-4
    else:
        assert fit > 0.1 and min(q, k, v) > 0.05
    ckpt = load_checkpoint(str(out / "ckpt.pt"))
    assert (ckpt["kind"] == "converted" and ckpt["iter_num"] == 0 and ckpt["meta"] == META
            and ckpt["config"] == {"dataset": "none"})
    assert ckpt["converted_from"]["model_args"]["n_kv_head"] == 4 and len(ckpt["converted_from"]["layers"]) == 2
    model = model_from_checkpoint(ckpt).eval()
    assert model.cfg.attn == "vha" and (logit_gap(source, model) < 1e-4) == exact
    text = run("sample.py", f"--out_dir={out}", "--start=ROMEO:", "--max_new_tokens=6", "--num_samples=1",
               "--temperature=0").stdout.split("\n---------------")[0]
    encode, decode = load_tokenizer(META)
    with torch.no_grad():  # what sample.py prints is model.generate on the converted checkpoint
        want = generate(model, torch.tensor([encode("ROMEO:")]), 6, temperature=0)
    assert text == decode(want[0].tolist())


def test_cli_physical_fit_lowers_the_fit_error_and_says_so(tmp_path, capsys):
    save_source(str(tmp_path / "src"))
    printed = {}
    for physical in ("first", "fit"):
        convert.main([f"--src={tmp_path / 'src'}", f"--out_dir={tmp_path / physical}", "--n_kv_head=2",
                      "--calib_len=32", f"--physical={physical}"])
        printed[physical] = table(capsys.readouterr().out)
    for layer in (0, 1):
        assert printed["first"][layer][0] == "0" and printed["fit"][layer][0] == "fitted"
        assert float(printed["fit"][layer][1]) < float(printed["first"][layer][1])  # rms over the groups
    ckpt = load_checkpoint(str(tmp_path / "fit" / "ckpt.pt"))
    assert "physical Q 'fit'" in ckpt["converted_from"]["method"]
    assert [row["physical"] for row in ckpt["converted_from"]["layers"]] == [-1, -1]


def test_cli_calibrates_on_given_tokens_and_converts_to_pooled_gqa(tmp_path, capsys):
    save_source(str(tmp_path / "src"))
    prompt = tmp_path / "calib.txt"
    prompt.write_text("ROMEO: what light through yonder window breaks\n" * 20)
    convert.main([f"--src={tmp_path / 'src' / 'ckpt.pt'}", f"--out_dir={tmp_path / 'gqa'}", "--to=gqa", "--n_kv_head=1",
                  f"--calib={prompt}", "--calib_len=40", "--calib_batches=1"])
    printed = capsys.readouterr().out
    assert f"2 x 40 tokens of {prompt}" in printed and "target: GQA 8 Q / 1 KV heads: KV cache 4x smaller" in printed
    assert all(r[0] == "-" for r in table(printed).values())  # no premix to fit
    assert model_from_checkpoint(load_checkpoint(str(tmp_path / "gqa" / "ckpt.pt"))).cfg.n_kv_head == 1


@pytest.mark.parametrize("argv, message", [
    (["--n_kv_head=3"], "--n_kv_head=3 does not divide the source's 4 KV heads"),
    (["--to=mla"], "--to='mla': choose 'vha'"),
    (["--src_kind=vha"], "the source is VHA: fold it into plain GQA first"),
    (["--src_kind=mla"], "the source is attn='mla'"),
    (["--calib=/no/such.bin"], "--calib=/no/such.bin: no such file"),
    (["--physical=group1"], "physical must be one of first, best, fit, got 'group1'"),
    (["--src=/no/such/dir/ckpt.pt"], "checkpoint /no/such/dir/ckpt.pt not found"),
], ids=["not_a_divisor", "bad_target", "vha_source", "mla_source", "missing_calib", "bad_physical", "missing_src"])
def test_refusals_write_nothing(argv, message, tmp_path):
    kind = next((a.split("=")[1] for a in argv if a.startswith("--src_kind")), "gqa")
    model = make(dtype=torch.float32, vocab_size=40, attn=kind, n_head=8, n_kv_head=8 if kind == "mla" else 4,
                 head_dim=16, qk_norm=kind != "mla")
    os.makedirs(tmp_path / "src")
    save_checkpoint({"model": model.state_dict(), "model_args": asdict(model.cfg), "meta": META},
                    str(tmp_path / "src" / "ckpt.pt"))
    argv = ([f"--src={tmp_path / 'src'}", f"--out_dir={tmp_path / 'out'}"]
            + [a for a in argv if not a.startswith("--src_kind")])
    with pytest.raises(SystemExit) as e:
        convert.main(argv)
    error = str(e.value.code)
    assert error.startswith("error: ") and message in error and "\n" not in error, error
    assert not os.path.exists(tmp_path / "out")


def sha256s(folder):
    return {p: hashlib.sha256(open(os.path.join(folder, p), "rb").read()).hexdigest()
            for p in sorted(os.listdir(folder))}


OUT_DIRS = {  # an output that would destroy something -> the needle; the folder's files are hashed before and after
    "an existing run's checkpoint": (["--out_dir={run}"], "another run's folder (ckpt.pt, log.jsonl)"),
    "an existing conversion": (["--out_dir={src}", "--out_name=old.pt"], "a nanoVHA checkpoint; pass --overwrite=True"),
    "a file that is not a checkpoint": (["--out_dir={src}", "--out_name=notes.txt", "--overwrite=True"],
                                        "is not a nanoVHA checkpoint: nothing replaces it, whatever the flags"),
    "the source's own file": (["--out_dir={src}"], "would write over --src"),
    "the calibration file": (["--out_dir={src}", "--out_name=calib.bin", "--calib={src}/calib.bin"],
                             "would write over --calib"),
    "an empty calibration file": (["--out_dir={run}/new", "--calib={src}/empty.bin"], "is empty: no token ids"),
    "an odd-sized calibration file": (["--out_dir={run}/new", "--calib={src}/odd.bin"], "not a whole number"),
}


@pytest.mark.parametrize("case", OUT_DIRS)
def test_outputs_never_destroy_an_input_or_a_run(case, tmp_path):
    src, run_dir = tmp_path / "src", tmp_path / "run"
    save_source(str(src))
    (src / "calib.bin").write_bytes(bytes(200))  # 100 uint16 ids
    (src / "empty.bin").write_bytes(b"")
    (src / "odd.bin").write_bytes(bytes(7))
    save_source(str(src / "earlier"))
    os.replace(src / "earlier" / "ckpt.pt", src / "old.pt")  # an earlier conversion
    os.rmdir(src / "earlier")
    (src / "notes.txt").write_text("a user's notes")
    save_source(str(run_dir))
    (run_dir / "log.jsonl").write_text('{"iter": 0}\n')
    before = {d: sha256s(d) for d in (src, run_dir)}
    flags, needle = OUT_DIRS[case]
    with pytest.raises(SystemExit) as e:
        convert.main([f"--src={src}/ckpt.pt", *(f.format(src=src, run=run_dir) for f in flags)])
    assert needle in str(e.value.code) and "\n" not in str(e.value.code), e.value.code
    assert {d: sha256s(d) for d in (src, run_dir)} == before


def test_overwrite_replaces_only_the_output(tmp_path):
    save_source(str(tmp_path / "src"))
    save_source(str(tmp_path / "run"))
    convert.main([f"--src={tmp_path}/src/ckpt.pt", f"--out_dir={tmp_path}/run", "--overwrite=True"])
    assert load_checkpoint(str(tmp_path / "run" / "ckpt.pt"))["kind"] == "converted"


def test_activation_fit_is_the_identity_metric_fit_and_wins_on_its_own_queries():
    source = source_gqa(seed=5)
    tokens = torch.randint(0, len(CHARS), (4, 40), generator=torch.Generator().manual_seed(2))
    grams = convert.input_grams(source, tokens)
    eye = [torch.eye(64, dtype=torch.float64)] * 2
    P_w = convert.convert(source, "vha", 2, 0.0)[0]
    P_eye = convert.convert(source, "vha", 2, 0.0, grams=eye)[0]
    P_act = convert.convert(source, "vha", 2, 0.0, grams=grams)[0]
    # C = I: the weight fit
    assert all(torch.allclose(a.attn.premix, b.attn.premix, atol=1e-10) for a, b in zip(P_w.blocks, P_eye.blocks))

    def prenorm_q_error(converted):  # sum over layers of ||q_conv - q_src||^2 before QK-norm, on the calibration inputs
        total, x = 0.0, source.embed(tokens)
        cos, sin = convert.rope_cos_sin(torch.arange(40), 16, source.cfg.rope_theta, x.dtype)
        for a, b in zip(source.blocks, converted.blocks):
            h = a.attn_norm(x)
            total += float((b.attn.apply_premix(b.attn.project(h)[0]) - a.attn.project(h)[0]).pow(2).sum())
            x = a(x, cos, sin)
        return total
    with torch.no_grad():
        assert prenorm_q_error(P_act) < 0.95 * prenorm_q_error(P_w)  # least squares on exactly these queries
    exact = source_gqa(exact=True)
    converted, fits, _ = convert.convert(exact, "vha", 2, 0.0, grams=convert.input_grams(exact, tokens))
    assert logit_gap(exact, converted.eval()) <= 1e-10
