"""Hugging Face Qwen3 import (qwen3.model_from_hf): a random Qwen3 that transformers creates and saves gives
transformers' logits here; what this repo cannot express is refused by name; sample.py uses the folder's tokenizer."""
import json

import pytest
import torch

from conftest import optional, run
from nanovha.checkpoint import load_checkpoint, model_from_checkpoint
from nanovha.generate import generate
from nanovha.bridges.qwen3 import model_from_hf

transformers = optional("transformers")
CHARS = "abcdefghijklmnopqrstuvwxyz .,:;!?\n'ROMEJULIT"


@pytest.fixture(autouse=True)
def offline_one_thread(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # nothing may reach a model hub
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def char_tokenizer():
    """A one-character-per-token Hugging Face fast tokenizer, built offline (no hub)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    vocab = {ch: i for i, ch in enumerate(dict.fromkeys(CHARS))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok)


def save_qwen3(folder, tokenizer=True, seed=0, **kw):
    """A tiny random Qwen3ForCausalLM saved by transformers: head_dim 32 != hidden / heads, every weight moved off
    its init (norms too) so a swapped name shows in the logits."""
    args = dict(vocab_size=100, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=32, max_position_embeddings=128, rms_norm_eps=1e-5,
                rope_parameters={"rope_type": "default", "rope_theta": 5000.0}, tie_word_embeddings=True)
    torch.manual_seed(seed)
    hf = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**{**args, **kw})).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            p.copy_(torch.rand_like(p) + 0.5 if "norm" in name else 0.15 * torch.randn_like(p))
    hf.save_pretrained(folder)
    if tokenizer:
        char_tokenizer().save_pretrained(folder)
    return hf


# ---- the import ----
@pytest.mark.parametrize("tied", [True, False])
def test_hf_import_gives_transformers_logits(tied, tmp_path):
    hf = save_qwen3(str(tmp_path), tie_word_embeddings=tied)
    ours, meta = model_from_hf(str(tmp_path))
    c = ours.cfg
    assert (c.n_head, c.n_kv_head, c.head_dim, c.mlp_hidden, c.rope_theta, c.norm_eps, c.tie_embeddings) == (
        4, 2, 32, 96, 5000.0, 1e-5, tied)
    assert (c.vocab_size == 100 and ours.embed.weight.size(0) == 128
            and (ours.lm_head.weight is ours.embed.weight) == tied)
    assert meta["tokenizer"] == "hf" and "tokenizer.json" in meta["hf_tokenizer_files"]
    x = torch.randint(0, 100, (2, 50), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want, got = hf(x).logits, ours.eval()(x)[0]
    assert want.shape == got.shape and want.abs().max() > 1.0  # big enough for a wrong weight to show
    assert (want - got).abs().max() <= 2e-5
    prompt = x[:1, :6]
    assert torch.equal(generate(ours, prompt, 12, temperature=0),
                       hf.generate(prompt, max_new_tokens=12, min_new_tokens=12, do_sample=False))


REFUSED = {  # config.json edit -> the field the error must name
    "attention_bias": {"attention_bias": True},
    "hidden_act": {"hidden_act": "gelu"},
    "rope_parameters.rope_type": {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}},
    "rope_scaling.type": {"rope_scaling": {"type": "linear", "factor": 2.0}},  # transformers 4.x spelling
    "rope_scaling.rope_type": {"rope_parameters": {"rope_type": "default", "rope_theta": 1e6},  # default masks no
                               "rope_scaling": {"rope_type": "yarn", "factor": 1.2}},  # scaling beside it
    "partial_rotary_factor": {"rope_parameters": {"rope_type": "default", "rope_theta": 1e6,
                                                  "partial_rotary_factor": 0.5}},
    "layer_types": {"use_sliding_window": True, "sliding_window": 16, "max_window_layers": 1, "layer_types": None},
    "model_type": {"model_type": "llama"},
}


@pytest.mark.parametrize("field", REFUSED)
def test_hf_import_refuses_what_it_cannot_express_by_name(field, tmp_path):
    config = {"model_type": "qwen3", "vocab_size": 100, "hidden_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 96,
              **REFUSED[field]}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError) as e:
        model_from_hf(str(tmp_path))
    assert str(e.value).startswith(f"config.json {field.strip()}") and "\n" not in str(e.value)


BROKEN = {  # config.json text -> the needle of the one-line error
    "not JSON": ('{"model_type": "qwen3",', "is not valid JSON"),
    "a list": ("[1, 2]", "holds a list, not a JSON object"),
    "a number as a string": (json.dumps({"model_type": "qwen3", "vocab_size": 100, "hidden_size": "64",
                                         "num_hidden_layers": 2, "num_attention_heads": 4, "head_dim": 16}),
                             "n_embd must be an int, got '64'"),
    "rope_scaling a list": (json.dumps({"model_type": "qwen3", "rope_scaling": [1]}), "must be objects (or null)"),
}


@pytest.mark.parametrize("case", BROKEN)
def test_hf_import_names_a_broken_config(case, tmp_path):
    text, needle = BROKEN[case]
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(ValueError) as e:
        model_from_hf(str(tmp_path))
    assert needle in str(e.value) and "\n" not in str(e.value)


WEIGHTS_BROKEN = {  # what happened to a saved folder's weights -> the needle
    "truncated safetensors": (lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]),
                              "cannot be read as safetensors"),
    "a weight of the wrong shape": (None, "the weights do not fit config.json"),
    "NaN weights": (None, "holds NaN or inf"),
}


@pytest.mark.parametrize("case", WEIGHTS_BROKEN)
def test_hf_import_names_broken_weights(case, tmp_path):
    from safetensors.torch import load_file, save_file
    save_qwen3(str(tmp_path))
    path = tmp_path / "model.safetensors"
    damage, needle = WEIGHTS_BROKEN[case]
    if damage:
        damage(path)
    else:
        tensors = load_file(str(path))
        name = "model.layers.0.self_attn.q_proj.weight"
        tensors[name] = torch.zeros(3, 3) if "shape" in case else torch.full_like(tensors[name], float("nan"))
        save_file(tensors, str(path))
    with pytest.raises(ValueError) as e:
        model_from_hf(str(tmp_path))
    assert needle in str(e.value) and "\n" not in str(e.value), e.value


def test_sample_py_on_a_qwen3_folder_uses_its_tokenizer(tmp_path):
    hf = save_qwen3(str(tmp_path / "hf"))
    proc = run("sample.py", f"--hf_dir={tmp_path / 'hf'}", "--start=ROMEO: hi", "--temperature=0", "--max_new_tokens=8",
               "--num_samples=1", "--device=cpu")
    prompt = char_tokenizer()("ROMEO: hi", return_tensors="pt").input_ids
    want = hf.generate(prompt, max_new_tokens=8, min_new_tokens=8, do_sample=False)[0]  # ids < 45: all characters
    assert proc.stdout.splitlines()[0] == char_tokenizer().decode(want) and "tok/s" in proc.stdout


def test_sample_py_names_what_is_missing(tmp_path):
    save_qwen3(str(tmp_path / "bare"), tokenizer=False)
    proc = run("sample.py", f"--hf_dir={tmp_path / 'bare'}", "--max_new_tokens=2", "--device=cpu", check=False)
    line = proc.stderr.strip().splitlines()[-1]
    assert (proc.returncode != 0 and line.startswith("error: no tokenizer: Hugging Face folder")
            and str(tmp_path / "bare") in line)
    proc = run("sample.py", f"--hf_dir={tmp_path / 'nothing'}", "--max_new_tokens=2", "--device=cpu", check=False)
    assert "config.json not found: give a Hugging Face model folder" in proc.stderr


def test_a_qwen3_folder_converts_and_the_result_samples_with_its_tokenizer(tmp_path, capsys):
    import convert
    save_qwen3(str(tmp_path / "hf"))
    calib = tmp_path / "calib.txt"
    calib.write_text("ROMEO: what light through yonder window breaks? it is the east.\n" * 8)
    convert.main([f"--src={tmp_path / 'hf'}", f"--out_dir={tmp_path / 'vha'}", "--n_kv_head=1", f"--calib={calib}",
                  "--calib_len=48"])
    printed = capsys.readouterr().out
    assert ("target: VHA 4 virtual / 4 physical Q / 1 KV heads: KV cache 2x smaller" in printed
            and f"x 48 tokens of {calib}" in printed)
    ckpt = load_checkpoint(str(tmp_path / "vha" / "ckpt.pt"))
    assert ckpt["kind"] == "converted" and ckpt["meta"]["tokenizer"] == "hf" and ckpt["config"] == {}
    assert model_from_checkpoint(ckpt).cfg.head_dim == 32
    proc = run("sample.py", f"--out_dir={tmp_path / 'vha'}", "--start=ROMEO:", "--temperature=0", "--max_new_tokens=5",
               "--num_samples=1")
    assert proc.stdout.startswith("ROMEO:") and len(proc.stdout.splitlines()[0]) >= len("ROMEO:") + 1
