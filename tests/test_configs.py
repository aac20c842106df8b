"""Every config file builds a valid model, and the KV cache size it states is the model's own figure."""
import glob
import os
import re
from dataclasses import fields

import pytest
import torch

from conftest import ROOT
from model import GPT, GPTConfig, fold_to_gqa
from nanovha.costs import flops_per_token, kv_bytes_per_token

MODEL_KEYS = {f.name for f in fields(GPTConfig)}


def load(*paths):
    namespace = {}
    for path in paths:
        with open(path) as f:
            exec(f.read(), {}, namespace)
    return namespace


def model_of(settings):
    """The config's model on the meta device: shapes and costs without allocating (or initialising) 120M weights."""
    args = {k: v for k, v in settings.items() if k in MODEL_KEYS}
    with torch.device("meta"):
        return GPT(GPTConfig(**{"vocab_size": 84, **args}))


ABLATIONS = sorted(glob.glob(os.path.join(ROOT, "config", "ablations", "*.py")))


@pytest.mark.parametrize("ablation", [None, *ABLATIONS], ids=lambda p: os.path.basename(p) if p else "vha_small")
def test_demo_and_ablations_state_their_kv_bytes(ablation):
    paths = [os.path.join(ROOT, "config", "vha_small.py")] + ([ablation] if ablation else [])
    settings = load(*paths)
    stated = re.findall(r"([\d,]+) B/token in bf16", open(paths[-1]).read())
    assert stated, f"{paths[-1]} must state its KV cache in bytes per token (bf16)"
    model = model_of(settings)
    assert int(stated[0].replace(",", "")) == kv_bytes_per_token(model.cfg, torch.bfloat16)
    name = os.path.basename(ablation or "vha_small.py")[:-3]
    # MLA: 8 up-projected; MFA: one wide head
    assert model.cfg.n_kv_head == {"gqa8": 8, "mla": 8, "mfa": 1}.get(name, 2)
    assert model.cfg.attn == {"mla": "mla", "mfa": "mfa"}.get(name, model.cfg.attn)
    assert settings["out_dir"].startswith("out-")


def test_ablations_cover_the_papers_set():
    names = {os.path.basename(p)[:-3] for p in ABLATIONS}
    assert {"gqa8", "gqa2", "gqa2_half_q", "premix_only", "postmix_only", "silu_postmix"} <= names
    assert sum(n.startswith("rank") for n in names) >= 2


@pytest.mark.parametrize("ablation", [None, *ABLATIONS], ids=lambda p: os.path.basename(p) if p else "vha_small")
def test_each_ablation_is_its_variant_of_the_table(ablation):
    """config/ablations/<name>.py is nanovha/variants.py's <name> at the demo's shape, written out with its arithmetic
    (the demo itself is vha). MLA: the table's cache, its own split between the latent and the RoPE key."""
    from nanovha.variants import VARIANTS, overrides
    demo_path = os.path.join(ROOT, "config", "vha_small.py")
    name = os.path.basename(ablation)[:-3] if ablation else "vha"
    assert name in VARIANTS, f"{ablation}: {name} is not a variant of nanovha/variants.py"
    demo, got = model_of(load(demo_path)).cfg, model_of(load(demo_path, *([ablation] if ablation else []))).cfg
    want = overrides(name, demo.n_head, demo.head_dim, demo.n_embd, demo.n_kv_head)
    split = ("mla_kv_rank", "mla_rope_dim")
    assert {k: getattr(got, k) for k in want if k not in split} == {k: v for k, v in want.items() if k not in split}
    assert sum(getattr(got, k) for k in split if k in want) == sum(want[k] for k in split if k in want)


FINEWEB = {n: os.path.join(ROOT, "config", "fineweb", f"{n}.py") for n in ("vha", "gqa2", "gqa8")}


def test_fineweb_twins_differ_only_in_attention_and_state_their_budget():
    """The twins are diffs applied after vha.py (python train.py config/fineweb/vha.py config/fineweb/<twin>.py) that
    change only the attention; each states its own cache and compute, vha.py the budget."""
    settings = {n: load(FINEWEB["vha"], *([p] if n != "vha" else [])) for n, p in FINEWEB.items()}
    attention = {"attn", "n_kv_head", "vha_postmix_rank", "out_dir"}
    assert all(set(load(p)) <= attention for n, p in FINEWEB.items() if n != "vha")
    models = {n: model_of(s) for n, s in settings.items()}
    assert {n: (m.cfg.n_attn_head, m.cfg.n_q_proj, m.cfg.n_kv_head) for n, m in models.items()} == {
        "vha": (16, 8, 2), "gqa2": (16, 16, 2), "gqa8": (16, 16, 8)}
    assert fold_to_gqa(models["vha"]).cfg.n_head == models["gqa2"].cfg.n_head  # folds into its twin's shape
    for n, path in FINEWEB.items():
        text, s = open(path).read(), settings[n]
        kv = kv_bytes_per_token(models[n].cfg, torch.bfloat16)
        assert int(re.findall(r"([\d,]+) B/token in bf16", text)[0].replace(",", "")) == kv
        assert f"python train.py config/fineweb/vha.py{'' if n == 'vha' else ' config/fineweb/' + n + '.py'}" in text
        tokens_per_iter = s["batch_size"] * s["block_size"] * s["gradient_accumulation_steps"]
        budget = open(FINEWEB["vha"]).read()
        assert f"= {tokens_per_iter:,} " in budget and f"{s['max_iters']:,} iterations x {tokens_per_iter:,}" in budget
        with torch.device("meta"):
            m = GPT(GPTConfig(**{k: v for k, v in s.items() if k in MODEL_KEYS}, vocab_size=50257))
        assert f"{flops_per_token(m.cfg, 1024, training=True) / 1e9:.3f} GFLOPs/token" in text
        assert (100e6 < m.num_params() < 135e6 and s["dataset"] == "fineweb_edu" and s["compile"]
                and s["dtype"] == "bfloat16")
    smoke = load(FINEWEB["vha"], os.path.join(ROOT, "config", "fineweb", "smoke.py"))
    assert ({k: smoke[k] for k in MODEL_KEYS if k in smoke}
            == {k: settings["vha"][k] for k in MODEL_KEYS if k in settings["vha"]})
    assert smoke["max_iters"] < settings["vha"]["max_iters"] / 10 and smoke["out_dir"] != settings["vha"]["out_dir"]


PAPER_BASE = os.path.join(ROOT, "config", "paper_1p7b_gqa8.py")  # the others are diffs applied after it
PAPER = sorted(glob.glob(os.path.join(ROOT, "config", "paper_1p7b_*.py")))


def test_paper_shapes_cache_1kb_per_layer_except_gqa8():
    for path in PAPER:
        with torch.device("meta"):
            m = GPT(GPTConfig(**{k: v for k, v in load(PAPER_BASE, path).items() if k in MODEL_KEYS},
                              vocab_size=151936))
        per_layer = kv_bytes_per_token(m.cfg, torch.bfloat16) // m.cfg.n_layer
        assert per_layer == (4096 if path.endswith("gqa8.py") else 1024), (path, per_layer)
        assert (m.cfg.n_layer, m.cfg.n_embd, m.cfg.mlp_hidden) == (28, 2048, 6144)
    assert {"mla", "mfa"} <= {load(PAPER_BASE, p)["attn"] for p in PAPER}
    assert all(f"python train.py config/paper_1p7b_gqa8.py config/{os.path.basename(p)}" in open(p).read()
               for p in PAPER if p != PAPER_BASE)


def test_paper_shapes_train_one_row_per_micro_step_with_the_same_global_batch():
    """One 4,096-token row (~16 GiB of saved activations, arithmetic in paper_1p7b_gqa8.py) per micro-step fits an
    80 GB GPU; 16 accumulation steps keep the global batch at 16 rows."""
    for path in PAPER:
        s = load(PAPER_BASE, path)
        assert (s["batch_size"], s["gradient_accumulation_steps"], s["block_size"]) == (1, 16, 4096), path


QWEN3_0P6B = dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                  num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                  rope_theta=1e6, tie_word_embeddings=True)
WARMUP = {n: os.path.join(ROOT, "config", f"qwen3_0p6b_{n}.py") for n in ("vha_warmup", "gqa2_uptrain")}


def test_qwen3_warmup_recipe_and_its_baseline_state_their_budget():
    """The baseline is a diff applied after the VHA recipe that changes only the converted start, and their comments'
    arithmetic is the numbers' and model.py's."""
    from nanovha.bridges.qwen3 import qwen3_model_args
    from convert import target_config
    base = WARMUP["vha_warmup"]
    settings = {n: load(base, *([p] if p != base else [])) for n, p in WARMUP.items()}
    assert set(load(WARMUP["gqa2_uptrain"])) == {"out_dir", "init_from"}
    base_text = open(base).read()
    one_line = base_text.replace("\n#     ", " ")  # a command wrapped in the comment, joined again
    source = GPTConfig(**qwen3_model_args(QWEN3_0P6B))
    with torch.device("meta"):
        teacher = GPT(source)
    for n, s in settings.items():
        text = open(WARMUP[n]).read()
        assert ("python train.py "
                f"{os.path.relpath(base, ROOT)}{'' if n == 'vha_warmup' else ' config/qwen3_0p6b_gqa2_uptrain.py'}"
                in text)
        assert not MODEL_KEYS & set(s) - {"block_size", "dropout"}  # the model's shape comes from the checkpoint
        assert s["init_from"].endswith("/ckpt.pt") and s["teacher"] == "Qwen3-0.6B" and s["dataset"] == "fineweb_edu"
        assert (s["data_dir"] == "data/fineweb_edu_qwen3"
                and (f"python data/fineweb_edu/prepare.py --tokenizer=hf --hf_tokenizer="
                     f"{s['teacher']} --num_tokens=600000000 --out_dir={s['data_dir']}") in one_line)
        assert (s["distill_alpha"], s["distill_temperature"]) == (0.7, 1.0) and 0 < s["freeze_iters"] < s["max_iters"]
        per_iter = s["batch_size"] * s["block_size"] * s["gradient_accumulation_steps"]
        assert (f"{s['batch_size']} rows x {s['block_size']} tokens x "
                f"{s['gradient_accumulation_steps']} accumulation steps"
                f" = {per_iter:,}") in base_text
        assert f"{s['max_iters']:,} iterations x {per_iter:,} = {s['max_iters'] * per_iter:,} tokens" in base_text
        assert (f"freeze: {s['freeze_iters']:,} iterations x {per_iter:,} = "
                f"{s['freeze_iters'] * per_iter:,} tokens") in base_text
        assert f"python convert.py --src=Qwen3-0.6B --out_dir={os.path.dirname(s['init_from'])} --n_kv_head=2" in text
        with torch.device("meta"):
            student = GPT(target_config(source, "vha" if n == "vha_warmup" else "gqa", 2, 0))
        assert ((student.cfg.n_attn_head, student.cfg.n_q_proj, student.cfg.n_kv_head)
                == ((16, 8, 2) if n == "vha_warmup" else (16, 16, 2)))
        flops = [flops_per_token(student.cfg, s["block_size"], training=True) / 1e9,
                 flops_per_token(teacher.cfg, s["block_size"]) / 1e9]
        assert (f"{flops[0]:.3f} GFLOPs/token (student, training) + "
                f"{flops[1]:.3f} GFLOPs/token (teacher, forward)") in text
        seconds = s["max_iters"] * per_iter * float(f"{sum(flops):.3f}e9") / (0.4 * 989e12)
        assert f"{s['max_iters'] * per_iter:,} x {sum(flops):.3f}e9 / (0.4 x 989e12) = {seconds:,.0f} s" in text
