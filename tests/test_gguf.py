"""fold.py --export_gguf: the folded model as one GGUF file (architecture qwen3) that the real llama.cpp
(llama-cpp-python) runs with our tokens, our logits and our greedy text, for a char-level and a GPT-2 BPE model.
Without llama-cpp-python the llama.cpp tests skip and say why, except in CI (CI=true), where they fail."""
import os
from dataclasses import asdict

import numpy as np
import pytest
import torch

from nanovha.bridges import gguf as gguf_export
import fold
from conftest import TINY_MODEL, VERSE, optional, run, verse
from nanovha.checkpoint import load_checkpoint, model_from_checkpoint, save_checkpoint
from data.common import load_tokenizer, prepare_string
from test_model import make

gguf = optional("gguf")
ONE_THREAD = {"OMP_NUM_THREADS": "1"}
# mixed texts: upper and lower case, space, newline, punctuation (the char one only of characters VERSE has)
CHAR_TEXT = "ROMEO:\nBut soft, what light? To be, or not:\n\nJULIET:\nO Romeo."
BPE_TEXT = "ROMEO:\nWhat light through yonder window breaks?  It is the east, 1599 -- héllo\n\n\tand Juliet's sun!"


def llama_cpp():
    """The llama_cpp module (conftest.optional: a skip outside CI, a failure in it)."""
    return optional("llama_cpp", "pip install -r requirements-llamacpp.txt")


def trained_run(folder, tokenizer, iters, *args):
    """A tiny VHA model trained on the verse long enough to say its lines, folded and exported as f32 GGUF."""
    data, out = os.path.join(folder, "data"), os.path.join(folder, "out")
    prepare_string(verse(), data, tokenizer, "test verse")
    run("train.py", f"--data_dir={data}", f"--out_dir={out}", f"--max_iters={iters}", f"--eval_interval={iters}",
        *TINY_MODEL, "--block_size=64", "--log_interval=50", *args, env=ONE_THREAD)
    report = run("fold.py", "--compile_decode=False", f"--out_dir={out}", f"--export_gguf={out}/model.gguf",
                 "--gen_tokens=20", env=ONE_THREAD).stdout
    assert "exported GGUF (qwen3, float32)" in report and "greedy 20 tokens: identical" in report
    return out


@pytest.fixture(scope="module")
def char_run(tmp_path_factory):
    return trained_run(str(tmp_path_factory.mktemp("gguf_char")), "char", 300)


@pytest.fixture(scope="module")
def bpe_run(tmp_path_factory):
    # a 50257-token LM head makes each step slow: fewer, larger steps
    return trained_run(str(tmp_path_factory.mktemp("gguf_bpe")), "gpt2", 100, "--learning_rate=1e-2")


def load(llama, path):
    """The file in llama.cpp with an f32 KV cache (its default, f16, alone moves the logits by ~5e-4 of the largest)."""
    f32 = llama.GGML_TYPE_F32
    return llama.Llama(model_path=path, n_ctx=256, n_threads=1, logits_all=True, type_k=f32, type_v=f32, verbose=False)


def llama_logits(llm, tokens):
    """llama.cpp's logits (T, vocab) for tokens evaluated from position 0."""
    llm.reset()
    llm.eval(tokens)
    return np.array(llm.scores[:len(tokens)], dtype=np.float64)


def our_logits(out, tokens):
    """Our float32 logits (T, vocab) from the unfolded checkpoint, padded vocab rows dropped."""
    model = model_from_checkpoint(load_checkpoint(os.path.join(out, "ckpt.pt"))).eval()
    with torch.no_grad():
        return model(torch.tensor([tokens]))[0][0, :, :model.cfg.vocab_size].double().numpy()


@pytest.mark.slow
@pytest.mark.parametrize("kind, text", [("char", CHAR_TEXT), ("bpe", BPE_TEXT)])
def test_llama_cpp_runs_the_export_like_we_do(kind, text, request):
    llama = llama_cpp()
    out = request.getfixturevalue(f"{kind}_run")
    meta = load_checkpoint(os.path.join(out, "ckpt.pt"))["meta"]
    encode, decode = load_tokenizer(meta)
    assert set(text) <= set(meta.get("stoi", text))
    llm = load(llama, os.path.join(out, "model.gguf"))
    assert llm.n_vocab() == meta["vocab_size"]
    # 1. the same tokens for a mixed text, and back to the same text
    tokens = llm.tokenize(text.encode(), add_bos=False, special=False)
    assert tokens == encode(text) and llm.detokenize(tokens).decode() == text
    # 2. the same logits, to 2e-5 of the largest (measured: about 1e-6)
    want, got = our_logits(out, tokens), llama_logits(llm, tokens)
    scale = np.abs(want).max()
    assert want.shape == got.shape and scale > 1.0
    assert np.abs(want - got).max() <= 2e-5 * scale, (np.abs(want - got).max(), scale)
    # 3. the same greedy text as sample.py --temperature=0, and the model says something
    prompt, n = "ROMEO:", 80 if kind == "char" else 30
    ours = run("sample.py", f"--out_dir={out}", f"--start={prompt}", "--temperature=0", f"--max_new_tokens={n}",
               "--num_samples=1", "--device=cpu", env=ONE_THREAD).stdout.split("\n---------------")[0]
    llm.reset()
    theirs = prompt + llm.create_completion(prompt, max_tokens=n, temperature=0.0)["choices"][0]["text"]
    said = ours[len(prompt):]
    assert len(set(said.split()) & set(" ".join(VERSE).split())) >= 3, f"the test model says nothing yet: {said!r}"
    assert theirs == ours


@pytest.mark.slow
@pytest.mark.parametrize("dtype, tolerance", [("float16", 1e-2), ("bfloat16", 5e-2)])
def test_half_precision_exports_stay_close(dtype, tolerance, char_run, tmp_path):
    """f16 / bf16 matrices (norms stay f32): llama.cpp's logits within the rounding those formats allow."""
    llama = llama_cpp()
    path = str(tmp_path / f"{dtype}.gguf")
    report = run("fold.py", "--compile_decode=False", f"--out_dir={char_run}", f"--export_gguf={path}",
                 f"--gguf_dtype={dtype}", "--out_name=refolded.pt", "--gen_tokens=5", env=ONE_THREAD).stdout
    assert f"exported GGUF (qwen3, {dtype})" in report
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(path).tensors}
    assert (types["blk.0.attn_q.weight"] == {"float16": "F16", "bfloat16": "BF16"}[dtype]
            and types["output_norm.weight"] == "F32")
    encode, _ = load_tokenizer(load_checkpoint(os.path.join(char_run, "ckpt.pt"))["meta"])
    tokens = encode(CHAR_TEXT)
    llm = load(llama, path)
    want, got = our_logits(char_run, tokens), llama_logits(llm, tokens)
    assert np.abs(want - got).max() <= tolerance * np.abs(want).max()


# ---- the file itself (gguf's reader, no llama.cpp needed) and what is refused ----
def save(folder, meta=None, **kw):
    model = make(dtype=torch.float32, **kw)
    os.makedirs(folder, exist_ok=True)
    ckpt = {"model": model.state_dict(), "model_args": asdict(model.cfg), "iter_num": 1, "kind": "nanovha"}
    save_checkpoint(dict(ckpt, meta=meta) if meta else ckpt, os.path.join(folder, "ckpt.pt"))
    return model


def char_meta(chars):
    return {"tokenizer": "char", "vocab_size": len(chars), "stoi": {c: i for i, c in enumerate(chars)},
            "itos": {i: c for i, c in enumerate(chars)}}


def field(reader, key):
    f = reader.fields[key]
    values = [f.contents(i) for i in range(len(f.data))] if len(f.data) > 1 else f.contents()
    return values


def test_gguf_file_has_qwen3_keys_tensors_and_the_char_vocab(tmp_path):
    chars = sorted(set("ab \n\\\t\x01é日") | set("ROMEO:JULIET"))  # escapes, a control character, 2- and 3-byte UTF-8
    save(str(tmp_path), char_meta(chars), attn="vha", n_head=4, n_kv_head=2, vocab_size=len(chars),
         tie_embeddings=False)
    fold.main(["--compile_decode=False", f"--out_dir={tmp_path}", f"--export_gguf={tmp_path}/m.gguf", "--gen_tokens=5"])
    assert sorted(os.listdir(tmp_path)) == ["ckpt.pt", "ckpt_folded.pt", "m.gguf"]  # no temp file left
    r = gguf.GGUFReader(str(tmp_path / "m.gguf"))
    folded = model_from_checkpoint(load_checkpoint(str(tmp_path / "ckpt_folded.pt")))
    c = folded.cfg
    assert field(r, "general.architecture") == "qwen3" and field(r, "tokenizer.ggml.model") == "rwkv"
    assert ((field(r, "qwen3.attention.head_count"), field(r, "qwen3.attention.head_count_kv"))
            == (c.n_head, c.n_kv_head))
    assert field(r, "qwen3.attention.key_length") == c.head_dim and field(r, "qwen3.block_count") == c.n_layer
    assert "tokenizer.ggml.bos_token_id" not in r.fields and "tokenizer.ggml.eos_token_id" not in r.fields
    spelled = field(r, "tokenizer.ggml.tokens")
    assert (spelled[chars.index("\n")] == "\\n" and spelled[chars.index("\\")] == "\\\\"
            and spelled[chars.index("\x01")] == "\\x01")
    assert spelled[chars.index("日")] == "日" and len(spelled) == len(chars)
    tensors = {t.name: t for t in r.tensors}
    assert len(tensors) == 3 + 11 * c.n_layer and "output.weight" in tensors  # untied: an output matrix
    q = tensors["blk.1.attn_q.weight"]
    want = folded.blocks[1].attn.qkv_proj.weight[:c.n_head * c.head_dim].detach().numpy()
    assert np.array_equal(np.asarray(q.data).reshape(want.shape), want)  # the folded W_q, row for row
    assert tensors["token_embd.weight"].data.shape == (len(chars), c.n_embd)  # the padded rows stay behind


def test_gpt2_vocab_is_tiktoken_spelled_byte_level():
    v = gguf_export.gpt2_vocab()
    assert len(v["tokens"]) == 50257 and v["tokens"][50256] == "<|endoftext|>" and v["types"][50256] == 3
    assert v["tokens"][262] == "Ġthe" and v["merges"][0] == "Ġ t" and v["bos"] == v["eos"] == 50256


def refuse(argv, message, folder):
    before = sorted(os.listdir(folder))
    with pytest.raises(SystemExit) as e:
        fold.main(argv)
    error = str(e.value.code)
    assert error.startswith("error: ") and message in error and "\n" not in error, error
    assert sorted(os.listdir(folder)) == before
    return error


def test_what_cannot_be_exported_is_refused_in_one_line(tmp_path):
    d = str(tmp_path)
    save(f"{d}/mla", attn="mla", n_head=8, n_kv_head=8, qk_norm=False)
    save(f"{d}/noqk", attn="vha", n_head=8, n_kv_head=2, qk_norm=False)
    save(f"{d}/bad", char_meta(["a", "\ud800"] + list("bcdefghijklmnopqrstuvwxyz0123456789")), attn="vha", n_head=4,
         n_kv_head=2)
    save(f"{d}/other", char_meta(list("abc")), attn="vha", n_head=4, n_kv_head=2)
    save(f"{d}/ok", char_meta(list("abcdefghijklmnopqrstuvwxyz0123456789A")), attn="vha", n_head=4, n_kv_head=2)
    refuse([f"--out_dir={d}/mla", f"--export_gguf={d}/x.gguf"], "no MLA attention", d)
    refuse([f"--out_dir={d}/noqk", f"--export_gguf={d}/x.gguf"], "QK-norm", d)
    assert "'\\ud800'" in refuse([f"--out_dir={d}/bad", f"--export_gguf={d}/x.gguf"], "llama.cpp cannot read", d)
    refuse([f"--out_dir={d}/ok", f"--export_gguf={d}/x.gguf", "--gguf_dtype=int8"], "gguf_dtype must be one of", d)
    refuse([f"--out_dir={d}/other", f"--export_gguf={d}/x.gguf"], "the tokenizer has 3 tokens but the model 37", d)
    os.makedirs(f"{d}/a_folder")
    refuse([f"--out_dir={d}/ok", f"--export_gguf={d}/a_folder"], "is a folder; give a file", d)
    with pytest.raises(ValueError, match="fold it first"):  # the library refuses unfolded VHA weights
        gguf_export.write_gguf(make(attn="vha", n_head=4, n_kv_head=2), f"{d}/x.gguf", None)
    assert not os.path.exists(f"{d}/x.gguf")


# ---- llama.cpp as a row in bench_decode.py ----
def test_bench_decode_times_the_folded_model_in_llama_cpp_too():
    llama_cpp()
    from test_bench import TINY_DECODE, last_json
    proc = run("bench_decode.py", *TINY_DECODE, "--variants=gqa2,vha_folded", "--llama_cpp=True", env=ONE_THREAD)
    out = last_json(proc)
    rows = {(r["variant"], r["runtime"], r["ctx"]): r for r in out["results"]}
    for ctx in (48, 96):  # the same model, the same contexts, side by side; tok/s measured, never asserted
        ours, theirs = rows[("vha_folded", "eager", ctx)], rows[("vha_folded@llama.cpp", "llama.cpp", ctx)]
        assert theirs["decode_tok_s"] > 0 and theirs["kv_bytes_per_token"] == ours["kv_bytes_per_token"]
        assert out["llama_cpp"]["ours_over_llama_cpp"]["vha_folded@llama.cpp"]["eager"][str(ctx)] == pytest.approx(
            ours["decode_tok_s"] / theirs["decode_tok_s"])
    split = {b["variant"]: b for b in out["breakdown"]}["vha_folded@llama.cpp"]
    assert split["ms_ctx1"] > 0 and split.get("attn_ms") is None  # theirs: the total and the ctx-1 / KV split
    assert "ours (eager) / llama.cpp decode tok/s, vha_folded:" in proc.stdout


def test_a_model_without_a_text_tokenizer_runs_on_token_ids(tmp_path):
    """Recall rows (or no meta): stand-in tokens '[0]'..'[n-1]', so llama.cpp loads the file and runs token ids."""
    llama = llama_cpp()
    model = save(str(tmp_path), {"tokenizer": "rows", "vocab_size": 37}, attn="vha", n_head=4, n_kv_head=2)
    report = run("fold.py", "--compile_decode=False", f"--out_dir={tmp_path}", f"--export_gguf={tmp_path}/rows.gguf",
                 "--gen_tokens=5", env=ONE_THREAD).stdout
    assert ("stand-in tokens '[0]'..'[36]'" in report
            and "greedy 5 tokens: identical" in report.split("llama.cpp check")[1])
    llm = load(llama, str(tmp_path / "rows.gguf"))
    tokens = [3, 1, 4, 1, 5, 9, 2, 6]
    assert llm.tokenize(b"[3][1][4]", add_bos=False, special=False) == [3, 1, 4]
    with torch.no_grad():
        want = model(torch.tensor([tokens]))[0][0, :, :37].double().numpy()
    assert np.abs(want - llama_logits(llm, tokens)).max() <= 2e-5 * np.abs(want).max()
