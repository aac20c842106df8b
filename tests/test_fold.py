"""fold.py: a VHA model folds EXACTLY into plain GQA; the CLI refuses what cannot fold and writes nothing;
the folded (or plain GQA) model exports to Hugging Face Qwen3 with the same logits."""
import copy
import json
import os
import re
from dataclasses import asdict

import pytest
import torch

from nanovha.bridges import qwen3
import fold
from conftest import TINY_MODEL, optional, run
from data.common import gpt2_encoding, gpt2_meta, load_tokenizer
from nanovha.checkpoint import load_checkpoint, model_from_checkpoint, save_checkpoint
from nanovha.costs import kv_bytes_per_token
from nanovha.generate import generate
from nanovha.bridges.qwen3 import split_projections
from nanovha.health import vha_health
from model import GPT, GPTConfig, fold_to_gqa
from test_model import make

ONE_THREAD = {"OMP_NUM_THREADS": "1"}  # tiny models: extra threads only fight over a shared CPU


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def logits_gap(model_a, model_b, seed=0):
    x = torch.randint(0, model_a.cfg.vocab_size, (3, 40), generator=torch.Generator().manual_seed(seed))
    return fold.logit_diff(model_a, model_b, x)[0]


# ---- the fold itself, float64, on scrambled weights (init-scale weights would hide a wrong index) ----
@pytest.mark.parametrize("n_kv_head", [1, 2, 4])
@pytest.mark.parametrize("qk_norm", [True, False])
def test_fold_is_exact_for_every_rank(n_kv_head, qk_norm):
    for rank in range(1, 9):  # H_v = 8 virtual heads: every postmix rank
        vha = make(attn="vha", n_head=8, n_kv_head=n_kv_head, vha_postmix_rank=rank, qk_norm=qk_norm, seed=rank)
        gqa = fold_to_gqa(vha)
        assert (gqa.cfg.attn, gqa.cfg.n_head, gqa.cfg.n_kv_head) == ("gqa", 8, n_kv_head)
        assert not any("mix" in name for name in gqa.state_dict())
        assert kv_bytes_per_token(gqa.cfg) == kv_bytes_per_token(vha.cfg)
        # the fold keeps the padded vocab (37 -> 64)
        assert gqa.lm_head.weight.shape == vha.lm_head.weight.shape == (64, 64)
        assert logits_gap(vha, gqa) <= 1e-10, (n_kv_head, qk_norm, rank)


@pytest.mark.parametrize("kw, attending", [
    (dict(n_kv_head=1, vha_postmix=False), 8), (dict(n_kv_head=2, vha_postmix=False), 8),
    (dict(n_kv_head=4, vha_postmix=False, qk_norm=False), 8),
    (dict(n_kv_head=1, vha_premix=False), 8), (dict(n_kv_head=2, vha_premix=False, vha_postmix_rank=4), 4),
    (dict(n_kv_head=2, vha_premix=False, qk_norm=False, tie_embeddings=False), 4),
])
def test_premix_only_and_postmix_only_fold_exactly(kw, attending):
    vha = make(attn="vha", n_head=8, **kw)
    gqa = fold_to_gqa(vha)
    assert (gqa.cfg.n_head, gqa.cfg.n_kv_head) == (attending, kw["n_kv_head"])  # postmix only: H_p heads attend
    assert logits_gap(vha, gqa) <= 1e-10
    prompt = torch.randint(0, 37, (1, 5))
    assert torch.equal(generate(vha, prompt, 30, temperature=0), generate(gqa, prompt, 30, temperature=0))


def test_a_wrong_fold_fails_the_same_check():
    """The check has teeth: P instead of P^T, or M^T instead of M, is caught by many orders of magnitude."""
    vha = make(attn="vha", n_head=8, n_kv_head=2)
    assert logits_gap(vha, fold_to_gqa(vha)) <= 1e-10
    wrong_premix = copy.deepcopy(vha)
    for block in wrong_premix.blocks:  # fold_to_gqa then writes P[g] W_q[h] instead of P[g]^T W_q[h]
        block.attn.premix.data = block.attn.premix.data.transpose(1, 2).contiguous()
    wrong_postmix = copy.deepcopy(vha)
    for block in wrong_postmix.blocks:  # swapping U and V turns M = I + V U^T into M^T
        a = block.attn
        a.postmix_U.data, a.postmix_V.data = a.postmix_V.data.clone(), a.postmix_U.data.clone()
    for wrong in (wrong_premix, wrong_postmix):
        assert logits_gap(vha, fold_to_gqa(wrong)) > 1e-3


# ---- the CLI on a real (short) training run ----
@pytest.fixture(scope="module")
def folded_run(char_data, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("fold_run"))
    run("train.py", f"--data_dir={char_data}", f"--out_dir={out}", "--max_iters=30", "--eval_interval=30", *TINY_MODEL,
        env=ONE_THREAD)
    with open(os.path.join(out, "ckpt.pt"), "rb") as f:
        source_bytes = f.read()
    mpl = str(tmp_path_factory.mktemp("mplconfig"))
    report = run("fold.py", "--compile_decode=False", f"--out_dir={out}", "--plot=True",
                 env=dict(ONE_THREAD, MPLCONFIGDIR=mpl)).stdout
    return out, report, source_bytes


def test_fold_report_proves_the_fold_on_val_data(folded_run, char_data):
    out, report, source_bytes = folded_run
    assert f"tokens of {os.path.join(char_data, 'val.bin')}" in report and "RANDOM" not in report
    assert report.count("greedy 200 tokens: identical") == 2  # float32 and float64
    f64 = next(line for line in report.splitlines() if line.strip().startswith("float64"))
    assert float(f64.split("max ")[1].split(",")[0]) <= 1e-10
    for text in ("params:", "KV cache:", "bytes/token (bf16)", "time: fold"):
        assert text in report
    with open(os.path.join(out, "ckpt.pt"), "rb") as f:
        assert f.read() == source_bytes  # the input is never touched


def test_folded_checkpoint_is_plain_gqa_and_samples_the_same_text(folded_run):
    out = folded_run[0]
    source, folded = load_checkpoint(os.path.join(out, "ckpt.pt")), load_checkpoint(os.path.join(out, "ckpt_folded.pt"))
    args = folded["model_args"]
    assert ((args["attn"], args["n_head"], args["n_kv_head"])
            == ("gqa", source["model_args"]["n_head"], source["model_args"]["n_kv_head"]))
    assert folded["folded_from"] == "ckpt.pt" and "optimizer" not in folded and "scaler" not in folded
    assert (folded["meta"] == source["meta"] and folded["config"] == source["config"]
            and folded["iter_num"] == source["iter_num"])
    model = model_from_checkpoint(folded)
    assert model.cfg.attn == "gqa" and not any("mix" in name for name in model.state_dict())
    runs = [(name, *flags) for name in ("ckpt.pt", "ckpt_folded.pt") for flags in [(), ("--dtype=float32",)]]
    runs.append(("ckpt.pt", "--fold=False", "--dtype=float32"))  # premix and postmix as trained, eager
    args = ["--start=ROMEO:", "--num_samples=1", "--max_new_tokens=100", "--temperature=0", "--device=cpu"]
    texts = [run("sample.py", f"--out_dir={out}", f"--ckpt_name={name}", *args, *flags, env=ONE_THREAD).stdout
             .split("\n---")[0] for name, *flags in runs]
    assert texts[0].startswith("ROMEO:") and len(texts[0]) > 100 and len(set(texts)) == 1


def test_plot_and_table(folded_run):
    out, report, _ = folded_run
    with open(os.path.join(out, "fold_analysis.png"), "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    table = report.split("intra-group\n")[1].splitlines()
    n_layer = int(TINY_MODEL[0].split("=")[1])
    assert [line.split()[0] for line in table[:n_layer]] == [str(i) for i in range(n_layer)]
    # layer, 2 groups, 3 postmix numbers + divergence
    assert all(len(line.split()) == 2 + 2 + 3 for line in table[:n_layer])


@pytest.mark.parametrize("kw", [dict(vha_postmix=False), dict(vha_premix=False), dict(n_kv_head=1)])
def test_plot_handles_every_variant(kw, tmp_path, monkeypatch):
    monkeypatch.setenv("MPLCONFIGDIR", str(tmp_path / "mpl"))
    model = make(**dict(dict(attn="vha", n_head=8, n_kv_head=2), **kw))
    rows = fold.analysis(model)
    assert [("premix_dev" in r, "M" in r, "divergence" in r) for r in rows] == \
        [(model.cfg.has_premix, model.cfg.has_postmix, model.cfg.has_premix and model.cfg.n_kv_head > 1)] * 2
    for r in rows:
        if "M" in r:
            assert 0 < r["offdiag_share"] < 1 and 0 <= r["intra_group_share"] <= 1 and r["sigma_max"] > 0
    health = vha_health(model)  # the same definitions as train.py's log, averaged over layers
    if model.cfg.has_premix:
        assert sum(sum(r["premix_dev"]) / len(r["premix_dev"]) for r in rows) / 2 == pytest.approx(health["premix_dev"])
    if "premix_group_div" in health:
        assert sum(r["divergence"] for r in rows) / 2 == pytest.approx(health["premix_group_div"])
    if model.cfg.has_postmix:
        assert sum(r["sigma_max"] for r in rows) / 2 == pytest.approx(health["postmix_sigma_max"])
        assert sum(r["offdiag_share"] for r in rows) / 2 == pytest.approx(health["postmix_offdiag_share"])
    fold.save_plot(model, rows, str(tmp_path / "plot.png"))
    assert (tmp_path / "plot.png").stat().st_size > 1000


def test_intra_group_share_by_hand():
    model = make(attn="vha", n_head=8, n_kv_head=2, vha_postmix_rank=1)  # groups: heads 0-3 and 4-7
    U, V = model.blocks[0].attn.postmix_U, model.blocks[0].attn.postmix_V
    for h, share in ((1, 1.0), (7, 0.0)):  # V U^T = 0.5 e_0 e_h^T: one entry, inside or across groups
        with torch.no_grad():
            U.zero_()[h, 0] = 0.5
            V.zero_()[0, 0] = 1.0
        row = fold.analysis(model)[0]
        assert row["intra_group_share"] == share and row["sigma_max"] == pytest.approx(0.5)
        assert row["offdiag_share"] == pytest.approx(0.25 / 8.25)


# ---- refusals: a clear one-line error, a non-zero exit, and nothing written ----
def save_tiny(folder, name="ckpt.pt", **kw):
    model = make(dtype=torch.float32, **kw)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, name)
    save_checkpoint({"model": model.state_dict(), "model_args": asdict(model.cfg), "iter_num": 7, "kind": "nanovha"},
                    path)
    return model, path


def refuse(argv, message):
    """fold.main must exit with 'error: ...message...' and leave every file as it was."""
    folder = [a.split("=", 1)[1] for a in argv if a.startswith("--out_dir=")][0]
    before = {n: open(os.path.join(folder, n), "rb").read() for n in os.listdir(folder)}
    with pytest.raises(SystemExit) as exit_info:
        fold.main(argv)
    error = str(exit_info.value.code)
    assert error.startswith("error: ") and message in error and "\n" not in error, error
    assert {n: open(os.path.join(folder, n), "rb").read() for n in os.listdir(folder)} == before
    return error


def test_refusals_write_nothing(tmp_path):
    d = str(tmp_path)
    save_tiny(os.path.join(d, "gqa"), attn="gqa", n_head=8, n_kv_head=2)
    save_tiny(os.path.join(d, "silu"), attn="vha", n_head=8, n_kv_head=2, vha_postmix_act="silu")
    save_tiny(os.path.join(d, "noqk"), attn="vha", n_head=8, n_kv_head=2, qk_norm=False)
    save_tiny(os.path.join(d, "mla"), attn="mla", n_head=8, n_kv_head=8, qk_norm=False)
    _, good = save_tiny(os.path.join(d, "vha"), attn="vha", n_head=8, n_kv_head=2)
    with open(good, "rb") as f:
        blob = f.read()
    with open(os.path.join(d, "vha", "truncated.pt"), "wb") as f:
        f.write(blob[: len(blob) // 2])
    torch.save({"weights": torch.zeros(3)}, os.path.join(d, "vha", "foreign.pt"))
    with open(os.path.join(d, "vha", "notes.pt"), "w") as f:
        f.write("not a checkpoint\n")

    refuse([f"--out_dir={d}/gqa"], "nothing to fold")
    refuse([f"--out_dir={d}/gqa", f"--export_hf={d}/hf", "--plot=True"], "nothing to plot")
    why = refuse([f"--out_dir={d}/silu"], "SiLU postmix")
    assert "not linear" in why
    refuse([f"--out_dir={d}/noqk", f"--export_hf={d}/hf"], "QK-norm")
    assert "no MLA attention" in refuse([f"--out_dir={d}/mla", f"--export_hf={d}/hf"], "nothing to fold: ")
    refuse([f"--out_dir={d}/vha", "--ckpt_name=missing.pt"], "not found")
    refuse([f"--out_dir={d}/vha", "--ckpt_name=truncated.pt"], "corrupt or truncated")
    refuse([f"--out_dir={d}/vha", "--ckpt_name=notes.pt"], "corrupt or truncated")
    refuse([f"--out_dir={d}/vha", "--ckpt_name=foreign.pt"], "not a nanoVHA checkpoint")
    refuse([f"--out_dir={d}/vha", "--out_name=ckpt.pt"], "would write over --ckpt_name")
    refuse([f"--out_dir={d}/vha", "--out_name=./ckpt.pt"], "would write over --ckpt_name")
    refuse([f"--out_dir={d}/vha", "--folds=2"], "unknown config key 'folds'")
    refuse([f"--out_dir={d}/vha", "--gen_tokens=0"], "must be >= 1")
    for args, message in BAD_OUTPUTS:
        refuse([f"--out_dir={d}/vha", *(a.format(d=d) for a in args)], message.format(d=d))
    assert not os.path.exists(f"{d}/hf")
    # the same through a real process: exit status 1, the message on stderr
    for args, message in (([f"--out_dir={d}/gqa"], "error: nothing to fold"),
                          ([f"--out_dir={d}/vha", "--plots=True"], "unknown config key")):
        proc = run("fold.py", "--compile_decode=False", *args, check=False, env=ONE_THREAD)
        assert proc.returncode == 1 and message in proc.stderr and proc.stdout == "", proc.stderr
    assert sorted(os.listdir(f"{d}/gqa")) == ["ckpt.pt"]


BAD_OUTPUTS = [  # fold.py flags that would destroy an input or write where it cannot -> the needle
    (["--export_gguf={d}/vha/ckpt.pt"], "--export_gguf={d}/vha/ckpt.pt would write over --ckpt_name"),
    (["--export_hf={d}/vha"], "would write over --ckpt_name"),
    (["--out_name=log.jsonl"], "would write over the run's log"),
    (["--export_hf={d}/vha/notes.pt/hf"], "is a file, not a folder"),
    (["--gguf_dtype=int8"], "gguf_dtype must be one of float32, float16, bfloat16, got 'int8'"),
    (["--export_gguf={d}/vha/notes.pt/model.gguf"], "--export_gguf={d}/vha/notes.pt is a file, not a folder"),
    (["--compile_cache={d}/vha/notes.pt"], "--compile_cache={d}/vha/notes.pt is a file"),  # packages, plans: a file
]


def test_an_inexact_fold_is_refused_not_written(tmp_path, monkeypatch):
    """fold.py checks before it writes: a fold that breaks the float64 logits (here P instead of P^T) is an error."""
    save_tiny(str(tmp_path), attn="vha", n_head=8, n_kv_head=2)
    right = fold.fold_to_gqa

    def wrong(vha):
        bad = copy.deepcopy(vha)
        for block in bad.blocks:
            block.attn.premix.data = block.attn.premix.data.transpose(1, 2).contiguous()
        return right(bad)

    monkeypatch.setattr(fold, "fold_to_gqa", wrong)
    refuse([f"--out_dir={tmp_path}", "--gen_tokens=5"], "the fold is not exact")


def test_random_tokens_are_labelled_when_the_data_is_missing(tmp_path, capsys):
    save_tiny(str(tmp_path), attn="vha", n_head=8, n_kv_head=2)
    fold.main(["--compile_decode=False", f"--out_dir={tmp_path}", "--gen_tokens=20"])
    report = capsys.readouterr().out
    assert "proof on RANDOM tokens" in report and report.count("greedy 20 tokens: identical") == 2
    assert os.path.exists(tmp_path / "ckpt_folded.pt")


# ---- Hugging Face export: load with transformers, compare logits ----
HF_MODELS = {
    "mha_tied": dict(attn="gqa", n_head=4, n_kv_head=4),
    "gqa_untied": dict(attn="gqa", n_head=4, n_kv_head=2, tie_embeddings=False),
    "vha_tied": dict(attn="vha", n_head=4, n_kv_head=2),
    "vha_untied_kv1": dict(attn="vha", n_head=4, n_kv_head=1, vha_postmix_rank=2, tie_embeddings=False),
    "postmix_only": dict(attn="vha", n_head=8, n_kv_head=2, vha_premix=False),
}


@pytest.mark.parametrize("name", HF_MODELS)
def test_hf_export_gives_the_same_logits(name, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    transformers = optional("transformers")
    safetensors_torch = optional("safetensors.torch")
    kw = dict(HF_MODELS[name], n_embd=64, head_dim=24, rope_theta=5000.0, norm_eps=1e-5)  # head_dim != n_embd / n_head
    ours, _ = save_tiny(str(tmp_path), **kw)
    fold.main(["--compile_decode=False", f"--out_dir={tmp_path}", f"--export_hf={tmp_path}/hf", "--gen_tokens=10"])
    assert sorted(os.listdir(tmp_path / "hf")) == ["README.md", "config.json", "generation_config.json",
                                                   "model.safetensors", "nanovha_export.json"]  # what makes it ours
    hf = transformers.Qwen3ForCausalLM.from_pretrained(str(tmp_path / "hf")).eval()
    assert (hf.config.num_attention_heads, hf.config.head_dim) == (ours.cfg.n_attn_head, 24)
    # our vocab 37 is padded to 64 rows; the export has exactly the tokenizer's 37
    tensors = safetensors_torch.load_file(str(tmp_path / "hf" / "model.safetensors"))
    assert (ours.lm_head.weight.size(0) == 64 and hf.config.vocab_size == 37
            and tensors["model.embed_tokens.weight"].shape == (37, 64))
    assert hf.get_input_embeddings().weight.shape == hf.get_output_embeddings().weight.shape == (37, 64)
    x = torch.randint(0, 37, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want, got = ours(x)[0], hf(x).logits  # ours: the unfolded model, when it is VHA
    assert want.shape == got.shape == (2, 40, 37) and want.abs().max() > 0.5  # big enough for a wrong layer to show
    assert (want - got).abs().max() <= 1e-5, (want - got).abs().max()  # float32 rounding of the fold: ~1e-6
    out = capsys.readouterr().out
    assert ("nothing to fold" in out) == (ours.cfg.attn == "gqa")
    check = out.split("transformers check (transformers ")[1]  # fold.py ran the folder in transformers itself
    assert (float(re.search(r"\|logit diff\| max (\S+) at", check).group(1)) <= 1e-5
            and "greedy 10 tokens: identical" in check)
    assert "greedy text" not in check  # no tokenizer files in this folder: ids are compared, not text


def test_the_transformers_check_sees_a_wrong_export(tmp_path, monkeypatch):
    """hf_compare against a model that is not the exported one: a large logit difference and a different greedy text."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    optional("transformers")
    chars = sorted(set(TEXT))
    meta = {"tokenizer": "char", "vocab_size": len(chars), "stoi": {c: i for i, c in enumerate(chars)},
            "itos": {i: c for i, c in enumerate(chars)}, "source": "test text"}
    torch.manual_seed(0)
    hf_dir = export_with_meta(str(tmp_path), meta, meta["vocab_size"])
    ours = model_from_checkpoint(load_checkpoint(os.path.join(str(tmp_path), "ckpt.pt"))).eval()
    tokens = load_tokenizer(meta)[0](TEXT)[:40]
    worst, scale, diverged, same_text = qwen3.hf_compare(hf_dir, ours, meta, tokens, 20)
    assert worst <= 1e-4 * scale and diverged is None and same_text is True
    with torch.no_grad():
        # no longer the export
        ours.norm.weight.mul_(torch.randn(ours.norm.weight.shape, generator=torch.Generator().manual_seed(0)))
    worst, scale, diverged, same_text = qwen3.hf_compare(hf_dir, ours, meta, tokens, 20)
    assert worst > 1e-2 * scale and diverged is not None and same_text is False


def test_hf_names_cover_every_weight():
    model = make(attn="gqa", n_head=4, n_kv_head=2, tie_embeddings=False)
    names = [qwen3.hf_name(n) for n in split_projections(model.state_dict(), model.cfg)]
    assert len(set(names)) == len(names) and "model.layers.1.self_attn.k_norm.weight" in names
    assert {"model.layers.1.self_attn.v_proj.weight", "model.layers.0.mlp.up_proj.weight"} <= set(names)
    assert all(n.startswith(("model.layers.", "model.embed_tokens", "model.norm", "lm_head")) for n in names)


# ---- the export works as a Hugging Face folder: tokenizer, generation, model card ----
TEXT = "ROMEO:\nWhat light through yonder window breaks? It is the east,\n\nand Juliet is the sun.  "


def export_with_meta(folder, meta, vocab_size, **kw):
    """A tiny VHA checkpoint trained on nothing but carrying a dataset's meta, folded and exported."""
    model = GPT(GPTConfig(vocab_size=vocab_size, block_size=64, n_layer=2, n_embd=32, n_head=4, n_kv_head=2, attn="vha",
                          **kw))
    with torch.no_grad():  # off the identity, so the fold has work to do, and logits far from ties
        for block in model.blocks:
            block.attn.premix.add_(0.2 * torch.randn_like(block.attn.premix))
            block.attn.postmix_V.normal_(0, 0.5)
        model.embed.weight.normal_(0, 1.0)
    os.makedirs(folder, exist_ok=True)
    save_checkpoint({"model": model.state_dict(), "model_args": asdict(model.cfg), "iter_num": 1, "kind": "nanovha",
                     "meta": meta}, os.path.join(folder, "ckpt.pt"))
    fold.main(["--compile_decode=False", f"--out_dir={folder}", f"--export_hf={folder}/hf", "--gen_tokens=5"])
    return os.path.join(folder, "hf")


@pytest.mark.parametrize("kind", ["char", "gpt2"])
def test_hf_folder_tokenizes_and_generates_like_sample_py(kind, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    transformers = optional("transformers")
    if kind == "char":
        chars = sorted(set(TEXT))
        meta = {"tokenizer": "char", "vocab_size": len(chars), "stoi": {c: i for i, c in enumerate(chars)},
                "itos": {i: c for i, c in enumerate(chars)}, "source": "test text"}
    else:
        meta = {**gpt2_meta(gpt2_encoding()), "source": "test text"}
    torch.manual_seed(0)
    hf_dir = export_with_meta(str(tmp_path), meta, meta["vocab_size"])
    files = set(os.listdir(hf_dir))
    assert {"tokenizer.json", "tokenizer_config.json", "generation_config.json", "README.md", "config.json"} <= files
    tok = transformers.AutoTokenizer.from_pretrained(hf_dir)
    encode, decode = load_tokenizer(meta)
    for text in (TEXT, TEXT[5:40], "  Juliet is\n\nthe sun?  "):
        ids = encode(text)
        assert tok.encode(text, add_special_tokens=False) == ids and tok.decode(ids) == text == decode(ids)
    card = open(os.path.join(hf_dir, "README.md")).read()
    assert "folded exactly" in card and f"{2 * 2 * 2 * 8 * 2:,} bytes per token in bf16" in card
    # greedy: transformers on the export == sample.py on the (unfolded VHA) checkpoint
    prompt, n = "ROMEO:", 24
    hf = transformers.AutoModelForCausalLM.from_pretrained(hf_dir).eval()
    padded = model_from_checkpoint(load_checkpoint(os.path.join(str(tmp_path), "ckpt.pt"))).lm_head.weight.size(0)
    # greedy text below: with the padding dropped
    assert hf.config.vocab_size == meta["vocab_size"] < padded and padded % 64 == 0
    ids = tok(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        out = hf.generate(ids, max_new_tokens=n, do_sample=False, min_new_tokens=n)[0].tolist()
    ours = run("sample.py", f"--out_dir={tmp_path}", f"--start={prompt}", "--temperature=0", f"--max_new_tokens={n}",
               "--num_samples=1").stdout.split("\n---------------")[0]
    assert len(out) == len(ids[0]) + n and tok.decode(out) == ours
    # skip_special_tokens=False: the pipeline drops the bos and eos from its text by default, and the char bos is
    # the newline (lm-eval needs one named; a new token would change the vocabulary)
    piped = transformers.pipeline("text-generation", model=hf_dir)(prompt, max_new_tokens=n, min_new_tokens=n,
                                                                   do_sample=False, skip_special_tokens=False)
    assert piped[0]["generated_text"] == ours  # the pipeline finds the model, the tokenizer and the generation config
    # where a text begins (a newline; GPT-2: <|endoftext|>, which also ends one), from the vocabulary as it was, and
    # nothing more: no max_length, so a plain generate() is not cut at the training context
    gen = json.load(open(os.path.join(hf_dir, "generation_config.json")))
    assert gen == ({"bos_token_id": meta["stoi"]["\n"]} if kind == "char"
                   else {"bos_token_id": meta["eot_token"], "eos_token_id": meta["eot_token"]})
    assert (tok.bos_token_id, tok.eos_token_id) == (gen["bos_token_id"], gen.get("eos_token_id"))
    assert len(tok) == meta["vocab_size"] and tok.encode(TEXT) == encode(TEXT)  # no new token, no bos inserted


def test_hf_export_of_a_recall_model_says_why_there_is_no_tokenizer(tmp_path, capsys):
    hf_dir = export_with_meta(str(tmp_path), {"tokenizer": "rows", "vocab_size": 40, "rows": {"task": "mqar"}}, 40)
    assert "tokenizer.json" not in os.listdir(hf_dir)
    assert ("no text tokenizer" in capsys.readouterr().out
            and "no tokenizer (" in open(os.path.join(hf_dir, "README.md")).read())
