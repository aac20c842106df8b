"""
nanoVHA checkpoints: written atomically, loaded with clear errors, built into a GPT (model.py stays the model).

A checkpoint is a dict with "model" (state_dict) and "model_args" (GPTConfig fields); train.py adds the optimizer,
iteration, dtype and dataset meta. load_start also takes an out_dir or a Hugging Face Qwen3 folder (qwen3.py).
fuse/split/pad convert between our fused, padded weights and Qwen3's separate, unpadded ones.
"""
import os
import tempfile
from dataclasses import asdict, fields

import torch

from model import GPT, GPTConfig


def save_checkpoint(obj, path):
    """torch.save to a temp file in the same folder, fsync, then rename: a crash mid-write
    leaves the previous file intact."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp_" + os.path.basename(path))
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def load_checkpoint(path, device="cpu"):
    """Returns the checkpoint dict; raises a clear error for a missing, corrupt or foreign file."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"checkpoint {path} not found: train one first (python train.py ...) "
                                "or pass the right --out_dir")
    if os.path.isdir(path):
        inner = os.path.join(path, "ckpt.pt")
        raise ValueError(f"{path} is a folder, not a checkpoint file; give the file"
                         + (f" ({inner})" if os.path.isfile(inner) else " inside it"))
    try:
        ckpt = torch.load(path, map_location=device, weights_only=True)  # never runs code from the file
    except Exception as e:
        reason = str(e).strip().split("\n")[0].split(". ")[0][:160]
        raise ValueError(f"checkpoint {path} is corrupt or truncated ({type(e).__name__}: {reason}); "
                         f"use an intact checkpoint or retrain") from None
    if not isinstance(ckpt, dict) or "model" not in ckpt or "model_args" not in ckpt:
        raise ValueError(f"{path} is not a nanoVHA checkpoint (no 'model'/'model_args' entries)")
    return ckpt


# Qwen3 (and other formats) name each projection; their rows stack into our fused ones
UNFUSED_PROJECTIONS = {"attn.qkv_proj.weight": ("attn.q_proj.weight", "attn.k_proj.weight", "attn.v_proj.weight"),
                       "mlp.gate_up_proj.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight")}
UNFUSED_Q = UNFUSED_PROJECTIONS["attn.qkv_proj.weight"][0]


def fuse_projections(state):
    """A state dict with separate q/k/v and gate/up projections -> the same weights under the fused names
    (rows concatenated in the fused order). Other entries pass through."""
    state = dict(state)
    for key in [k for k in state if k.endswith(UNFUSED_Q)]:
        layer = key[: -len(UNFUSED_Q)]  # 'blocks.3.'
        for fused, parts in UNFUSED_PROJECTIONS.items():
            if all(layer + p in state for p in parts):
                state[layer + fused] = torch.cat([state.pop(layer + p) for p in parts])
    return state


def split_projections(state, cfg):
    """The inverse of fuse_projections: fused q/k/v and gate/up rows back under the separate names (the
    layout Hugging Face's Qwen3 uses)."""
    state = dict(state)
    rows = {"attn.qkv_proj.weight": cfg.qkv_split, "mlp.gate_up_proj.weight": [cfg.mlp_hidden, cfg.mlp_hidden]}
    for key in [k for k in state if k.endswith(tuple(rows))]:
        fused = next(f for f in rows if key.endswith(f))
        layer = key[: -len(fused)]
        for name, part in zip(UNFUSED_PROJECTIONS[fused], state.pop(key).split(rows[fused])):
            state[layer + name] = part
    return state


VOCAB_ROWS = ("embed.weight", "lm_head.weight")  # the weights with one row per token id


def pad_vocab(state, cfg):
    """embed/lm_head with cfg.vocab_size rows (Qwen3's) -> cfg.padded_vocab rows, the new ones zero: exact, since a
    padded row is never looked up and its logit is sliced off. Other entries pass through."""
    state = dict(state)
    for key in VOCAB_ROWS:
        if key in state and state[key].size(0) == cfg.vocab_size < cfg.padded_vocab:
            state[key] = torch.cat([state[key],
                                    state[key].new_zeros(cfg.padded_vocab - cfg.vocab_size, state[key].size(1))])
    return state


class WeightsError(ValueError):
    """Weights that do not fit the model they are loaded into, or hold NaN/inf."""


def state_problem(model, state):
    """Why `state` cannot be the weights of `model`, naming the first missing, extra, wrong-shaped or non-finite
    tensor, or None."""
    want = model.state_dict()
    missing, extra = sorted(set(want) - set(state)), sorted(set(state) - set(want))
    if missing or extra:
        return f"missing weights {missing[:3]}, unexpected weights {extra[:3]}"
    for name, t in state.items():
        if not isinstance(t, torch.Tensor):
            return f"{name} is a {type(t).__name__}, not a tensor"
        if tuple(t.shape) != tuple(want[name].shape):
            return f"{name} has shape {tuple(t.shape)}, the model's config wants {tuple(want[name].shape)}"
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            return f"{name} holds NaN or inf values (a diverged run?)"
    return None


def model_from_checkpoint(ckpt, device="cpu"):
    """Builds the GPT of a checkpoint dict (torch.compile's '_orig_mod.' prefix stripped)."""
    known = {f.name for f in fields(GPTConfig)}
    prefix = "_orig_mod."
    try:
        cfg = GPTConfig(**{k: v for k, v in ckpt["model_args"].items() if k in known})
        state = {k[len(prefix):] if k.startswith(prefix) else k: v for k, v in ckpt["model"].items()}
        return model_from_state(cfg, state, device)
    except WeightsError as e:
        raise ValueError(f"the checkpoint's weights do not load: {e}; use another checkpoint (an earlier one, or "
                         f"retrain)") from None
    except (TypeError, ValueError, KeyError, AttributeError, RuntimeError) as e:
        reason = str(e).strip().split("\n")[0][:200]
        raise ValueError(f"the checkpoint holds no loadable model ({type(e).__name__}: {reason}); "
                         f"use a checkpoint written by train.py or fold.py") from None


def model_from_state(cfg, state, device="cpu"):
    """GPT(cfg) holding exactly `state` (our names, fused, padded), built on the meta device: no random init
    of weights that are overwritten at once (seconds and a second copy of the model at 0.6B). Raises ValueError
    naming a missing, extra, wrong-shaped or non-finite weight."""
    with torch.device("meta"):
        model = GPT(cfg)
    if problem := state_problem(model, state):
        raise WeightsError(problem)
    model.load_state_dict(state, assign=True)
    if cfg.tie_embeddings:  # assign gives each name its own Parameter: tie them again
        model.lm_head.weight = model.embed.weight
    return model.to(device)


def start_path(path):
    """A checkpoint to start from, as given -> what to load: an out_dir holding ckpt.pt (and no config.json) is
    its ckpt.pt."""
    inner = os.path.join(path, "ckpt.pt")
    return (inner if os.path.isdir(path) and not os.path.exists(os.path.join(path, "config.json"))
            and os.path.exists(inner) else path)


def load_start(path, device="cpu"):
    """A checkpoint dict (model, model_args, meta) from a checkpoint file train.py, convert.py or fold.py wrote, an
    out_dir holding one, or a Hugging Face Qwen3 folder (model_from_hf). Raises FileNotFoundError, ImportError or
    ValueError, one line each."""
    path = start_path(path)
    if os.path.isdir(path) and os.path.isfile(os.path.join(path, "config.json")):
        from nanovha.qwen3 import model_from_hf  # qwen3.py builds on this module
        model, meta = model_from_hf(path, device)
        return {"model": model.state_dict(), "model_args": asdict(model.cfg), "meta": meta, "kind": "hf"}
    if os.path.isdir(path):
        raise FileNotFoundError(f"{path} is a folder with neither ckpt.pt nor config.json: give a checkpoint file, "
                                f"an out_dir holding ckpt.pt, or a Hugging Face Qwen3 folder")
    return load_checkpoint(path, device)


