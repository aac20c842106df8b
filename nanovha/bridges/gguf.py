"""
A plain GQA model (a folded VHA one is exactly that) as one GGUF file, architecture qwen3, for
llama.cpp:

    write_gguf(model, path, meta, dtype)   # the weights in Qwen3's layout (qwen3.qwen3_state) and the tokenizer

The tokenizer travels inside the file, built offline from the dataset's meta: GPT-2 BPE as
llama.cpp's 'gpt2' tokenizer, a char vocabulary as its 'rwkv' trie, stand-in tokens for a model
without text.
"""
import os

import numpy as np

from data.common import gpt2_encoding
from nanovha.outputs import GGUF_KEY, MARK, written_whole
from nanovha.bridges.qwen3 import qwen3_problem, qwen3_state, renamed, tokenizer_kind

# our names -> llama.cpp's qwen3 tensors
GGUF_TOP = {"embed.weight": "token_embd.weight", "norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}
GGUF_LAYER = {"attn_norm": "attn_norm", "mlp_norm": "ffn_norm", "attn.q_proj": "attn_q", "attn.k_proj": "attn_k",
              "attn.v_proj": "attn_v", "attn.o_proj": "attn_output", "attn.q_norm": "attn_q_norm",
              "attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
              "mlp.down_proj": "ffn_down"}
GGUF_DTYPES = ("float32", "float16", "bfloat16")


def gguf_name(name):
    """'blocks.3.attn.q_proj.weight' -> 'blk.3.attn_q.weight'."""
    return renamed(name, GGUF_TOP, GGUF_LAYER, "blk")


def bytes_to_unicode():
    """GPT-2's byte -> printable character map: byte-level BPE vocabularies spell every token
    with these."""
    keep = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
            + list(range(ord("®"), ord("ÿ") + 1)))
    extra = [b for b in range(256) if b not in keep]
    return dict(zip(keep + extra, map(chr, keep + [256 + i for i in range(len(extra))])))


def gpt2_vocab():
    """GPT-2 BPE as llama.cpp's 'gpt2' tokenizer: tokens spelled in byte-level characters
    ('Ġthe'), the merges recovered from tiktoken's ranks (every split of a token into two tokens,
    lower ranks first: the same rule
    transformers' TikTokenConverter uses), and <|endoftext|> as the one control token."""
    enc, byte_char = gpt2_encoding(), bytes_to_unicode()
    ranks = enc._mergeable_ranks  # bytes -> id, ids 0..50255
    spell = lambda b: "".join(byte_char[x] for x in b)
    tokens = [spell(b) for b, _ in sorted(ranks.items(), key=lambda kv: kv[1])] + ["<|endoftext|>"]
    merges = []
    for token, rank in ranks.items():
        pairs = [(token[:i], token[i:]) for i in range(1, len(token)) if token[:i] in ranks and token[i:] in ranks]
        merges += [(rank, ranks[a], ranks[b], f"{spell(a)} {spell(b)}") for a, b in pairs]
    types = [1] * len(ranks) + [3]  # gguf.TokenType: NORMAL, CONTROL
    assert len(tokens) == enc.n_vocab and enc.eot_token == len(ranks)
    return dict(model="gpt2", pre="gpt-2", tokens=tokens, types=types, merges=[m[3] for m in sorted(merges)],
                bos=enc.eot_token, eos=enc.eot_token)


def rwkv_spelling(ch):
    """A character as llama.cpp's RWKV tokenizer reads a token: its text goes through an
    unescaper that knows backslash-t, -n, -r, -xNN (lowercase hex) and a backslash before any
    other character (itself)."""
    named = {"\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r"}
    return named.get(ch) or (f"\\x{ord(ch):02x}" if ord(ch) < 0x20 or ord(ch) == 0x7F else ch)


def utf8(text):
    try:
        return bool(text.encode("utf-8"))
    except UnicodeEncodeError:  # a lone surrogate: no UTF-8 spelling, and GGUF strings are UTF-8
        return False


def char_vocab(meta):
    """A char vocabulary as llama.cpp's 'rwkv' tokenizer: a trie of the tokens' bytes, longest
    match first, so a vocabulary of single characters tokenizes character by character, and it
    has no default BOS/EOS. (As a 'gpt2' BPE with no merges it would tokenize the same, but
    llama.cpp then makes id 11 BOS and EOS when the file names none, a real character here, and
    generation would stop at it.) Raises ValueError for a token that is not exactly one character
    or not valid UTF-8."""
    itos = {int(i): ch for i, ch in meta["itos"].items()}
    if sorted(itos) != list(range(len(itos))):
        raise ValueError("--export_gguf: the char vocab's ids are not 0..n-1; re-prepare the dataset")
    bad = [ch for ch in itos.values() if len(ch) != 1 or not utf8(ch)]
    if bad:
        raise ValueError(
            f"--export_gguf: the char vocab holds {', '.join(map(repr, bad[:5]))}, which llama.cpp cannot "
            f"read as one character each (UTF-8 text, one character per token); re-prepare the "
            f"dataset without them")
    return dict(model="rwkv", pre=None, tokens=[rwkv_spelling(itos[i]) for i in range(len(itos))],
                types=[1] * len(itos), merges=None, bos=None, eos=None)


def id_vocab(vocab_size):
    """Stand-in tokens '[0]' .. '[n-1]' (rwkv trie) for a model without a text tokenizer:
    llama.cpp needs a vocab of the model's size to load it ('no_vocab' has none); feed it token
    ids."""
    return dict(model="rwkv", pre=None, tokens=[f"[{i}]" for i in range(vocab_size)], types=[1] * vocab_size,
                merges=None, bos=None, eos=None)


def gguf_vocab(meta, vocab_size):
    """(tokenizer fields for write_gguf; a note when they are stand-ins, or None)."""
    kind = tokenizer_kind(meta)
    if kind == "gpt2":
        return gpt2_vocab(), None
    if kind == "char":
        return char_vocab(meta), None
    why = "its dataset is synthetic recall rows" if kind == "rows" else "the checkpoint carries no dataset meta"
    return id_vocab(vocab_size), f"{why}: written with stand-in tokens '[0]'..'[{vocab_size - 1}]' (feed token ids)"


def gguf_export_problem(cfg, meta, dtype):
    """Why the model cannot be written as GGUF, or None (checked before anything is written)."""
    if problem := qwen3_problem(cfg, "--export_gguf"):
        return problem
    if dtype not in GGUF_DTYPES:
        return f"--gguf_dtype must be one of {', '.join(GGUF_DTYPES)}, got {dtype!r}"
    try:
        import gguf  # noqa: F401  (optional: the GGUF writer of the llama.cpp project)
    except ImportError:
        return "--export_gguf needs the gguf package: pip install -r requirements-dev.txt (or pip install gguf)"
    try:
        vocab, _ = gguf_vocab(meta, cfg.vocab_size)
    except ValueError as e:
        return str(e)
    if len(vocab["tokens"]) != cfg.vocab_size:
        return (f"--export_gguf: the tokenizer has {len(vocab['tokens'])} tokens but the model {cfg.vocab_size}: "
                f"the checkpoint's meta is not its dataset's; export a checkpoint trained on this data")
    return None


def add_tokenizer(writer, vocab):
    """The tokenizer's GGUF keys."""
    writer.add_tokenizer_model(vocab["model"])
    if vocab["pre"]:
        writer.add_tokenizer_pre(vocab["pre"])
    writer.add_token_list(vocab["tokens"])
    writer.add_token_types(vocab["types"])
    if vocab["merges"] is not None:
        writer.add_token_merges(vocab["merges"])
    if vocab["bos"] is not None:
        writer.add_bos_token_id(vocab["bos"])
        writer.add_eos_token_id(vocab["eos"])
    writer.add_add_bos_token(False)  # we never trained with a BOS token in front


def write_gguf(model, path, meta, dtype="float32"):
    """One GGUF file, architecture qwen3, that llama.cpp loads as it loads Qwen3: the weights in
    dtype (norm weights stay float32, as llama.cpp's converter keeps 1-D tensors) and the
    dataset's tokenizer. Written whole (outputs.written_whole). Returns a note (why the tokens are
    stand-ins), or None."""
    import gguf
    c = model.cfg
    if problem := qwen3_problem(c, "--export_gguf"):
        raise ValueError(problem)
    vocab, note = gguf_vocab(meta, c.vocab_size)
    w = gguf.GGUFWriter(None, "qwen3")
    w.add_name(os.path.splitext(os.path.basename(path))[0])
    w.add_string(GGUF_KEY, MARK)  # ours: a later export may replace this file (outputs.replace_problem)
    w.add_file_type({"float32": 0, "float16": 1, "bfloat16": 32}[dtype])  # gguf.LlamaFileType
    w.add_context_length(c.block_size)
    w.add_embedding_length(c.n_embd)
    w.add_block_count(c.n_layer)
    w.add_feed_forward_length(c.mlp_hidden)
    w.add_head_count(c.n_head)
    w.add_head_count_kv(c.n_kv_head)
    w.add_key_length(c.head_dim)
    w.add_value_length(c.head_dim)
    w.add_rope_freq_base(c.rope_theta)
    w.add_layer_norm_rms_eps(c.norm_eps)
    add_tokenizer(w, vocab)
    for name, p in qwen3_state(model).items():
        x = p.numpy()
        if p.dim() == 1 or dtype == "float32":
            w.add_tensor(gguf_name(name), x)
        elif dtype == "float16":
            w.add_tensor(gguf_name(name), x.astype(np.float16))
        else:  # bf16 bits, rounded to nearest even like torch and ggml
            w.add_tensor(gguf_name(name), gguf.quants.quantize(x, gguf.GGMLQuantizationType.BF16),
                         raw_dtype=gguf.GGMLQuantizationType.BF16)
    with written_whole(path) as tmp:
        w.write_header_to_file(tmp)
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    return note
