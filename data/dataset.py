"""
What train.py reads from a prepared data folder, in one place:

- text (data/shakespeare_char, data/shakespeare, data/text, data/fineweb_edu): train.bin / val.bin, one token
  stream per split (uint16, or uint32 as meta["dtype"] says: a Hugging Face tokenizer's vocab past 65,536); a batch
  is batch_size random windows of block_size tokens, y = x shifted by one.
- rows (data/recall): meta.pkl holds a task spec; training rows are generated from it at a curriculum level,
  val.npz holds the held-out rows. y is -1 except at the answers, so the loss ignores the rest.
"""
import hashlib
import os
import pickle
import subprocess
import sys

import numpy as np
import torch

from data.common import read_bin
from data.recall import tasks as recall_tasks

DATA_ROOT = os.path.dirname(os.path.abspath(__file__))


# the tokenizer each data/<dataset>/prepare.py writes when train.py runs it with no flags (data/text
# needs --input)
AUTO_TOKENIZER = {"shakespeare_char": "char", "shakespeare": "gpt2", "fineweb_edu": "gpt2", "recall": "rows"}


def hf_folder(meta):
    """The Hugging Face folder a model was imported from (its meta's source), for a command line;
    else FOLDER."""
    source = meta.get("source") or ""
    return source.removeprefix("Hugging Face folder ") if source.startswith("Hugging Face folder ") else "FOLDER"


def unprepared_problem(data_dir, dataset, models):
    """models: (meta or None, name) of the start checkpoint and the teacher. Why preparing
    data_dir now would be wasted (data/<dataset>/prepare.py writes another tokenizer's ids than a
    model reads, so train.py would refuse the data after the download), with the command that
    prepares it right; or None."""
    writes = AUTO_TOKENIZER.get(dataset)
    for meta, name in models:
        kind = (meta or {}).get("tokenizer")
        if not kind or not writes or kind == writes:
            continue
        script = "fineweb_edu/prepare.py" if dataset == "fineweb_edu" else "text/prepare.py --input FILE.txt"
        how = (f"python data/{script} --tokenizer=hf --hf_tokenizer={hf_folder(meta)} "
               f"--out_dir={data_dir}"
               if kind == "hf"
               else f"python data/text/prepare.py --input FILE.txt --tokenizer={kind} "
                    f"--out_dir={data_dir}")
        return (f"{data_dir} is not prepared yet and data/{dataset}/prepare.py would write "
                f"{writes} ids, but {name} "
                f"reads the {kind} tokenizer; prepare it first: {how}")
    return None


def prepare_if_missing(data_dir, dataset, models=()):
    """Runs data/<dataset>/prepare.py into data_dir when the folder has neither meta.pkl nor
    train.bin. A folder with only one of them is damaged: Dataset reports it, nothing is prepared
    over it. models: (meta, name) pairs whose tokenizer the data must have (unprepared_problem).
    Raises ValueError."""
    if any(os.path.exists(os.path.join(data_dir, n)) for n in ("meta.pkl", "train.bin")):
        return
    if problem := unprepared_problem(data_dir, dataset, models):
        raise ValueError(problem)
    prepare = os.path.join(DATA_ROOT, dataset, "prepare.py")
    if not os.path.exists(prepare):
        raise ValueError(f"no data in {data_dir} and no data/{dataset}/prepare.py to make it; "
                         f"prepare it yourself "
                         f"(e.g. python data/text/prepare.py --input FILE --out_dir {data_dir})")
    print(f"preparing {dataset} into {data_dir} (first use) ...", flush=True)
    if subprocess.run([sys.executable, prepare, "--out_dir", data_dir]).returncode != 0:
        sys.exit(1)  # prepare.py printed the one-line error; nothing was trained


WHOLE_HASH_BYTES = 256 << 20  # a data file up to this size is fingerprinted by its full sha256


def data_fingerprint(data_dir):
    """{file: fingerprint} of what a run reads from data_dir (train.bin, val.bin, meta.pkl,
    val.npz, those there): a checkpoint records it and a resume compares (data_changed). A file
    up to WHOLE_HASH_BYTES (every dataset the tests and the demo use) gets the sha256 of all its
    bytes, so any change is seen; a larger one (FineWeb) its size and the sha256 of its first and
    last MiB: cheap at any size, blind to a same-size edit in the middle."""
    out = {}
    for name in ("train.bin", "val.bin", "meta.pkl", "val.npz"):
        path = os.path.join(data_dir, name)
        if not os.path.isfile(path):
            continue
        size, h = os.path.getsize(path), hashlib.sha256()
        with open(path, "rb") as f:
            if size <= WHOLE_HASH_BYTES:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
                out[name] = f"sha256 {h.hexdigest()}"
            else:
                h.update(f.read(1 << 20))
                f.seek(size - (1 << 20))
                h.update(f.read())
                out[name] = f"{size} bytes, first and last MiB sha256 {h.hexdigest()}"
    return out


def data_changed(recorded, now, data_dir, ckpt_path):
    """Why a resume may not go on with this data (a file whose fingerprint is not the one the
    checkpoint recorded: the batches would come from other data, not an exact resume), or None. A
    checkpoint without one (older) passes."""
    changed = sorted(n for n in (recorded or {}).keys() | now.keys() if recorded and recorded.get(n) != now.get(n))
    if not changed:
        return None
    return (f"cannot resume: {', '.join(changed)} in {data_dir} changed since {ckpt_path} was "
            f"written (fingerprint "
            f"{now.get(changed[0], 'missing')[:20]}..., recorded "
            f"{recorded.get(changed[0], 'none')[:20]}...); resume "
            f"with the data it trained on, or start a new run from it: --init_from={ckpt_path} "
            f"--out_dir=NEW_FOLDER")


def bin_problem(data_dir, meta, splits, sample=1 << 16):
    """Why the token bins do not match their meta.pkl (a bin replaced or a meta swapped after
    prepare), or None: the token counts prepare recorded, a dtype that can hold the vocab, and
    the largest id of a sample (the first and last ids, and `sample` spread between) below
    vocab_size."""
    vocab = meta["vocab_size"]
    for split, data in splits.items():
        path = os.path.join(data_dir, f"{split}.bin")
        recorded = meta.get(f"{split}_tokens")
        if recorded is not None and recorded != len(data):
            return (f"{path} holds {len(data):,} {data.dtype} ids but meta.pkl records "
                    f"{recorded:,}: the bin or the "
                    f"meta was replaced after prepare; prepare the data again")
        if vocab > np.iinfo(data.dtype).max + 1:
            return f"{path} is {data.dtype}, too narrow for meta.pkl's vocab_size {vocab:,}; prepare the data again"
        picked = data[np.linspace(0, len(data) - 1, min(sample, len(data))).astype(np.int64)]
        if len(picked) and int(picked.max()) >= vocab:
            return (f"{path} holds token id {int(picked.max()):,}, past meta.pkl's vocab_size "
                    f"{vocab:,}: the bin and "
                    f"the meta are not from the same prepare; prepare the data again")
    return None


class Dataset:
    """A prepared folder: .meta (meta.pkl), .rows (the row spec, None for text), .seq_len (every
    batch's length)."""

    def __init__(self, data_dir, block_size, curriculum_iters=0, curriculum_mode="ramp"):
        self.data_dir, self.block_size, self.curriculum_mode = data_dir, block_size, curriculum_mode
        try:
            with open(os.path.join(data_dir, "meta.pkl"), "rb") as f:
                self.meta = pickle.load(f)
            if not isinstance(self.meta, dict):
                raise ValueError(f"meta.pkl holds a {type(self.meta).__name__}, not a dict")
            self.vocab_size, self.rows = self.meta["vocab_size"], self.meta.get("rows")
            if self.rows:
                with np.load(os.path.join(data_dir, "val.npz")) as f:
                    self.val_rows = (torch.from_numpy(f["x"].astype(np.int64)),
                                     torch.from_numpy(f["y"].astype(np.int64)))
            else:
                dtype = self.meta.get("dtype") or "uint16"  # a meta without "dtype": uint16 ids
                self.splits = {s: read_bin(os.path.join(data_dir, f"{s}.bin"), dtype) for s in ("train", "val")}
        except (OSError, ValueError, EOFError, KeyError, pickle.UnpicklingError) as e:
            raise ValueError(f"the dataset in {data_dir} is incomplete or corrupt "
                             f"({type(e).__name__}: {e}); run its "
                             f"prepare.py again (or delete the folder to have it prepared on first use)") from None
        if self.rows:
            if block_size < self.meta["row_length"]:
                raise ValueError(f"rows of {data_dir} are {self.meta['row_length']} tokens, longer than "
                                 f"block_size={block_size}; raise --block_size")
        elif curriculum_iters:
            raise ValueError(f"curriculum_iters={curriculum_iters} needs a row dataset (data/recall); "
                             f"{data_dir} is text")
        else:
            if problem := bin_problem(data_dir, self.meta, self.splits):
                raise ValueError(problem)
            for s, data in self.splits.items():
                if len(data) <= block_size:
                    raise ValueError(f"{data_dir}/{s}.bin has {len(data)} tokens, fewer than "
                                     f"block_size+1={block_size + 1}; lower block_size")
        self.seq_len = self.meta["row_length"] if self.rows else block_size

    def batch(self, split, batch_size, generator, frac=1.0):
        """(x, y), each (batch_size, seq_len) int64 on the CPU, drawn from `generator`. Rows:
        generated at curriculum progress frac (training; the stored held-out rows are val_rows)."""
        if self.rows:
            rng = np.random.default_rng(int(torch.randint(2**62, (1,), generator=generator)))
            x, y = recall_tasks.batch(self.rows, batch_size, rng, frac, self.curriculum_mode)
            return torch.from_numpy(x), torch.from_numpy(y)
        data, T = self.splits[split], self.block_size
        starts = torch.randint(len(data) - T, (batch_size,), generator=generator).tolist()
        # (B, T)
        x = torch.stack([torch.from_numpy(data[i:i + T].astype(np.int64)) for i in starts])
        # (B, T)
        y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + T].astype(np.int64)) for i in starts])
        return x, y

    def level(self, frac):
        """The curriculum level (a task knob, e.g. pairs per row) at progress frac, for the log."""
        return recall_tasks.level(self.rows, frac, self.curriculum_mode)

    @torch.no_grad()
    def score_val_rows(self, model, batch_size, device, autocast):
        """Row datasets: the stored held-out rows at full difficulty -> val (mean loss over all
        answer tokens), val_acc (answer tokens right) and val_exact (rows with every answer
        right), by argmax, which equals greedy decoding for exact match."""
        x_all, y_all = self.val_rows
        losses, preds = [], []
        for i in range(0, len(x_all), batch_size):
            x, y = x_all[i:i + batch_size].to(device), y_all[i:i + batch_size].to(device)
            with autocast:
                logits, loss = model(x, y)
            losses.append(loss.item() * (y >= 0).sum().item())
            preds.append(logits.argmax(-1).cpu())
        acc, exact = recall_tasks.score(torch.cat(preds).numpy(), y_all.numpy())
        return {"val": sum(losses) / (y_all >= 0).sum().item(), "val_acc": acc, "val_exact": exact}
