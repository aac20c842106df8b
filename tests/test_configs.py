"""Every config file builds a valid model, and the KV cache size it states is the model's own figure."""
import glob
import os
import re
from dataclasses import fields

import pytest
import torch

from conftest import ROOT
from model import GPT, GPTConfig

MODEL_KEYS = {f.name for f in fields(GPTConfig)}


def load(*paths):
    namespace = {}
    for path in paths:
        with open(path) as f:
            exec(f.read(), {}, namespace)
    return namespace


def model_of(settings):
    args = {k: v for k, v in settings.items() if k in MODEL_KEYS}
    return GPT(GPTConfig(**{"vocab_size": 84, **args}))


ABLATIONS = sorted(glob.glob(os.path.join(ROOT, "config", "ablations", "*.py")))


@pytest.mark.parametrize("ablation", [None, *ABLATIONS], ids=lambda p: os.path.basename(p) if p else "vha_small")
def test_demo_and_ablations_state_their_kv_bytes(ablation):
    paths = [os.path.join(ROOT, "config", "vha_small.py")] + ([ablation] if ablation else [])
    settings = load(*paths)
    stated = re.findall(r"([\d,]+) B/token in bf16", open(paths[-1]).read())
    assert stated, f"{paths[-1]} must state its KV cache in bytes per token (bf16)"
    model = model_of(settings)
    assert int(stated[0].replace(",", "")) == model.kv_bytes_per_token(torch.bfloat16)
    assert model.cfg.n_kv_head == (8 if ablation and "4x_cache" in ablation else 2)
    assert settings["out_dir"].startswith("out-")


def test_ablations_cover_the_papers_set():
    names = {os.path.basename(p)[:-3] for p in ABLATIONS}
    assert {"gqa_4x_cache", "gqa_same_deploy", "gqa_half_q", "premix_only", "postmix_only", "silu_postmix"} <= names
    assert sum(n.startswith("rank") for n in names) >= 2
