"""
nanoVHA checkpoints: written atomically, loaded with clear errors, built into a GPT (model.py
stays the model).

A checkpoint is a dict with "model" (state_dict) and "model_args" (GPTConfig fields); train.py
adds the optimizer, iteration, dtype and dataset meta. Commands load through nanovha/loading.py
(load_model), which also resolves run folders and Hugging Face folders; this module knows one
file and one dict.
"""
import os
from dataclasses import fields

import torch

import nanovha.mla_mfa  # noqa: F401 (registers attn="mla" and "mfa": every loader knows them)
from model import GPT, GPTConfig
from nanovha.outputs import written_whole


def save_checkpoint(obj, path):
    """torch.save to a temp file beside path, then a rename (outputs.written_whole): a crash
    mid-write leaves the previous file intact."""
    with written_whole(path) as tmp:
        torch.save(obj, tmp)


def load_checkpoint(path, device="cpu"):
    """Returns the checkpoint dict; raises a clear error for a missing, corrupt or foreign file."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"checkpoint {path} not found: check the path, or train one first "
                                f"(python train.py ...)")
    if os.path.isdir(path):
        inner = os.path.join(path, "ckpt.pt")
        raise ValueError(f"{path} is a folder, not a checkpoint file; give the file"
                         + (f" ({inner})" if os.path.isfile(inner) else " inside it"))
    try:
        # never runs code from the file
        ckpt = torch.load(path, map_location=device, weights_only=True)
    except Exception as e:
        reason = str(e).strip().split("\n")[0].split(". ")[0][:160]
        raise ValueError(f"checkpoint {path} is corrupt or truncated ({type(e).__name__}: {reason}); "
                         f"use an intact checkpoint or retrain") from None
    if not isinstance(ckpt, dict) or "model" not in ckpt or "model_args" not in ckpt:
        raise ValueError(f"{path} is not a nanoVHA checkpoint (no 'model'/'model_args' entries)")
    return ckpt


class WeightsError(ValueError):
    """Weights that do not fit the model they are loaded into, or hold NaN/inf."""


def state_problem(model, state):
    """Why `state` cannot be the weights of `model`, naming the first missing, extra,
    wrong-shaped or non-finite tensor, or None."""
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
    """GPT(cfg) holding exactly `state` (our names, fused, padded), built on the meta device: no
    random init of weights that are overwritten at once (seconds and a second copy of the model
    at 0.6B). Raises ValueError naming a missing, extra, wrong-shaped or non-finite weight."""
    with torch.device("meta"):
        model = GPT(cfg)
    if problem := state_problem(model, state):
        raise WeightsError(problem)
    model.load_state_dict(state, assign=True)
    if cfg.tie_embeddings:  # assign gives each name its own Parameter: tie them again
        model.lm_head.weight = model.embed.weight
    return model.to(device)
