"""
One way to load a model, for every command and script:

    model, ckpt = load_model("out-vha-small")                  # a run folder: its ckpt.pt
    model, ckpt = load_model("out-vha-small/ckpt_folded.pt")   # any checkpoint file train/fold/convert wrote
    model, ckpt = load_model("Qwen3-0.6B", "cuda")             # a Hugging Face Qwen3 folder (bridges/qwen3.py)

ckpt is the checkpoint dict ("model", "model_args", "meta", and what train.py keeps: "config",
"iter_num", ...); a Hugging Face folder gives one built from the folder (kind "hf", its tokenizer
files in "meta"). A path is resolved one way (resolve): a folder holding config.json is a Hugging
Face folder, a folder holding ckpt.pt is that run's checkpoint, anything else is a checkpoint
file. Every error is one line naming the path and the fix. The layers below: checkpoint.py reads
one file and builds one dict, qwen3.py reads one Hugging Face folder.
"""
import glob
import os
from dataclasses import asdict

from nanovha.checkpoint import load_checkpoint, model_from_checkpoint
from nanovha.bridges.qwen3 import model_from_hf

# what train.py writes into its out_dir, and what a run folder stands for
RUN_CHECKPOINT = "ckpt.pt"
HF_CONFIG = "config.json"  # what makes a folder a Hugging Face one


def start_path(path):
    """A checkpoint as given -> the file to read: a run folder holding ckpt.pt (and no
    config.json) is its ckpt.pt; anything else stays as it is."""
    inner = os.path.join(path, RUN_CHECKPOINT)
    return (inner if os.path.isdir(path) and not os.path.exists(os.path.join(path, HF_CONFIG))
            and os.path.exists(inner) else path)


def resolve(path):
    """A path as given -> ("hf", folder) or ("checkpoint", file). A folder that is neither a run
    folder nor a Hugging Face folder raises FileNotFoundError naming the checkpoint files it
    holds, if any."""
    path = start_path(path)
    if os.path.isdir(path) and os.path.isfile(os.path.join(path, HF_CONFIG)):
        return "hf", path
    if os.path.isdir(path):
        held = sorted(os.path.basename(p) for p in glob.glob(os.path.join(path, "*.pt")))
        hint = f" (it holds {', '.join(held)}: pass {os.path.join(path, held[0])})" if held else ""
        raise FileNotFoundError(f"{path} is a folder with neither {RUN_CHECKPOINT} nor "
                                f"{HF_CONFIG}{hint}: give a "
                                f"checkpoint file, an out_dir holding {RUN_CHECKPOINT}, or a "
                                f"Hugging Face Qwen3 folder")
    return "checkpoint", path


def hf_checkpoint(model, meta):
    """The checkpoint dict of a model read from a Hugging Face folder: what a checkpoint file
    would hold."""
    return {"model": model.state_dict(), "model_args": asdict(model.cfg), "meta": meta, "kind": "hf"}


def load_start(path, device="cpu"):
    """The checkpoint dict of a file, a run folder or a Hugging Face folder, before any model is
    built from it (train.py may change its block_size first). Raises FileNotFoundError,
    ImportError or ValueError, one line each."""
    kind, path = resolve(path)
    if kind == "hf":
        return hf_checkpoint(*model_from_hf(path, device))
    return load_checkpoint(path, device)


def load_model(source, device="cpu", hf=False):
    """(GPT on device, its checkpoint dict) from a checkpoint file, a run folder, a Hugging Face
    Qwen3 folder, or a checkpoint dict already in memory (fold.py builds what it is about to
    write the way it will be read back). hf=True: source must be a Hugging Face folder (sample.py
    --hf_dir). The dict of a file stays on the CPU. Raises FileNotFoundError, ImportError or
    ValueError, one line each, naming the path."""
    if isinstance(source, dict):
        return model_from_checkpoint(source, device), source
    kind, path = ("hf", source) if hf else resolve(source)
    if kind == "hf":
        model, meta = model_from_hf(path, device)
        return model, hf_checkpoint(model, meta)
    ckpt = load_checkpoint(path)
    try:
        return model_from_checkpoint(ckpt, device), ckpt
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
