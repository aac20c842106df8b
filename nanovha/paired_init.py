"""
The initialisation GPT uses, drawn so that variants can be compared in pairs: GPT-2's N(0, 0.02)
(o_proj and down_proj: 0.02 / sqrt(2 n_layer)), each parameter, and each head's rows of qkv_proj
and columns of o_proj, from a generator seeded by (seed, its name). Variants built from one seed
share every block whose name and shape agree (embeddings, MLPs, the KV heads they have in common,
W_o of the same heads), so a paired comparison does not also compare initialisations. Premix,
postmix and norms keep their own init (model.py). Torch only.
"""
import math
import zlib

import torch


@torch.no_grad()
def init_weights(model, seed):
    """Draws every 2-D weight of a GPT (postmix aside) in place from (seed, name, head block)."""
    cfg = model.cfg
    d = cfg.head_dim
    for name, p in model.named_parameters():
        if p.dim() != 2 or "postmix" in name or p.is_meta:
            continue
        residual = name.endswith(("o_proj.weight", "down_proj.weight"))
        std = 0.02 / math.sqrt(2 * cfg.n_layer) if residual else 0.02
        parts = {"": p}  # block label -> the rows (or columns) it initialises
        # rows [W_q; W_k; W_v]: head h of each is q.h, k.h, v.h
        if name.endswith("attn.qkv_proj.weight"):
            parts = {f"{'qkv'[j]}.{h}": rows for j, part in enumerate(p.split(cfg.qkv_split))
                     for h, rows in enumerate(part.split(d) if part.size(0) % d == 0 else [part])}
        elif name.endswith("attn.o_proj.weight"):  # columns: head h is block "o.h"
            parts = {f"o.{h}": cols for h, cols in enumerate(p.split(d, dim=1))}
        for label, part in parts.items():
            gen = torch.Generator().manual_seed((seed + zlib.crc32(f"{name}/{label}".encode())) % 2**63)
            part.copy_(torch.randn(part.shape, generator=gen) * std)
