"""
Exporters for a plain GQA model (a folded VHA one is exactly that), called by fold.py after the fold is proved:

    write_hf(model, folder, meta, source)     a Hugging Face Qwen3ForCausalLM folder (transformers, lm-eval, ...)
    write_gguf(model, path, meta, dtype)      one GGUF file, architecture qwen3, for llama.cpp

Both write Qwen3's layout: q/k/v and gate/up as separate matrices, RMSNorm, QK-norm, rotate-half RoPE, SwiGLU;
our padded vocab rows stay behind. The tokenizer travels with the weights, built offline from the dataset's meta.
"""
import json
import os

import numpy as np
import torch

from checkpoint import VOCAB_ROWS, hf_name, renamed, split_projections
from data.common import gpt2_encoding, load_tokenizer


def qwen3_problem(cfg, flag):
    """Why cfg cannot be written as an exact Qwen3 model (for the option named flag), or None."""
    if cfg.attn in ("mla", "mfa"):
        return (f"{flag}: attn={cfg.attn!r} is not a Qwen3 attention: only plain GQA/MHA and VHA (folded first) "
                f"export as Qwen3")
    if cfg.attn == "vha":
        return f"{flag}: this model is unfolded VHA (premix/postmix are not Qwen3 weights): fold it first (fold.py does)"
    if not cfg.qk_norm:
        return (f"{flag}: Qwen3 always applies QK-norm (q_norm/k_norm), but this model was trained with qk_norm=False: "
                f"its Qwen3 export would compute something else; export only works for qk_norm=True models")
    return None


def qwen3_state(model):
    """Our state dict in Qwen3's layout: q/k/v and gate/up split apart, embed/lm_head cut to the vocab's rows,
    float32 on the CPU. A tied lm_head is dropped (both formats re-tie it to the embedding)."""
    c = model.cfg
    state = split_projections(model.state_dict(), c)
    for name in VOCAB_ROWS:  # padded rows are never looked up and their logits are sliced off
        state[name] = state[name][:c.vocab_size]
    return {n: p.detach().float().cpu().contiguous() for n, p in state.items()
            if not (c.tie_embeddings and n == "lm_head.weight")}


def tokenizer_kind(meta):
    return (meta or {}).get("tokenizer", "char" if "stoi" in (meta or {}) else None)


# ---- Hugging Face: our names -> Qwen3ForCausalLM's (checkpoint.hf_name, whose map model_from_hf inverts) ----


def hf_export_problem(cfg):
    """Why cfg (a plain GQA config) cannot be written as a Hugging Face Qwen3 folder, or None."""
    if problem := qwen3_problem(cfg, "--export_hf"):
        return problem
    try:
        import safetensors.torch  # noqa: F401  (optional: training never needs them)
        import tokenizers  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        return "--export_hf needs safetensors, tokenizers and transformers: pip install transformers safetensors"
    return None


def hf_tokenizer(meta):
    """The dataset's tokenizer as a Hugging Face fast tokenizer, built offline from what meta.pkl pins, or
    (None, why not). Char-level: one WordLevel token per character (a split on every character, decoded by
    joining). GPT-2 BPE: the tiktoken ranks this repo tokenized with, converted to byte-level BPE merges."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    kind = tokenizer_kind(meta)
    if kind == "char":
        tok = Tokenizer(models.WordLevel(vocab=dict(meta["stoi"]), unk_token=None))
        tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # every character alone
        tok.decoder = decoders.Fuse()  # ids -> characters, joined with nothing between them
        return PreTrainedTokenizerFast(tokenizer_object=tok), None
    if kind == "gpt2":
        import base64
        import tempfile
        from transformers.convert_slow_tokenizer import TikTokenConverter
        enc = gpt2_encoding()
        with tempfile.TemporaryDirectory() as tmp:  # the ranks in tiktoken's file format, read back by the converter
            path = os.path.join(tmp, "gpt2.tiktoken")
            with open(path, "w") as f:
                f.writelines(f"{base64.b64encode(b).decode()} {r}\n" for b, r in sorted(enc._mergeable_ranks.items(), key=lambda kv: kv[1]))
            tok = TikTokenConverter(vocab_file=path, pattern=enc._pat_str, extra_special_tokens=enc._special_tokens).converted()
        eot = "<|endoftext|>"
        return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=eot, eos_token=eot), None
    if kind == "rows":
        return None, "its dataset is synthetic recall rows (data/recall), not text: there is no text tokenizer to write"
    return None, "the checkpoint carries no dataset meta (tokenizer), so no tokenizer files were written"


def hf_config(c):
    """config.json of a Qwen3ForCausalLM with c's shape."""
    return {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
        "vocab_size": c.vocab_size, "hidden_size": c.n_embd, "intermediate_size": c.mlp_hidden,
        "num_hidden_layers": c.n_layer, "num_attention_heads": c.n_head, "num_key_value_heads": c.n_kv_head,
        "head_dim": c.head_dim, "hidden_act": "silu", "max_position_embeddings": c.block_size,
        "rms_norm_eps": c.norm_eps, "tie_word_embeddings": c.tie_embeddings, "attention_bias": False,
        "attention_dropout": 0.0, "use_sliding_window": False, "use_cache": True,
        "rope_theta": c.rope_theta,  # transformers 4.x reads this; 5.x reads rope_parameters
        "rope_parameters": {"rope_type": "default", "rope_theta": c.rope_theta},
        "torch_dtype": "float32", "dtype": "float32",
    }


def model_card(model, folder, meta, source, n_params, note):
    """README.md of the folder: what the model is, how it was folded, its KV bytes, how to load it."""
    c, kv = model.cfg, model.kv_bytes_per_token(torch.bfloat16)
    return (f"# {os.path.basename(os.path.abspath(folder))}\n\nA {c.n_layer}-layer Qwen3-style model "
            f"({n_params:,} parameters) written by nanoVHA's fold.py from `{source['ckpt']}`"
            f"{' (dataset: ' + meta['source'] + ')' if meta and meta.get('source') else ''}.\n\n"
            + (f"It was trained as **Virtual Head Attention**: {source['n_q_proj']} physical query projections, a Q premix "
               f"into {c.n_head} virtual heads and a linear postmix `I + V U^T` over heads. Both maps are linear and were "
               f"folded exactly into `q_proj` and `o_proj` (in float64), so this is a plain GQA model.\n\n"
               if source["vha"] else "It was trained as a plain GQA model (nothing to fold).\n\n")
            + f"- attention: {c.n_head} query heads of dim {c.head_dim}, {c.n_kv_head} KV heads (GQA), QK-norm, RoPE theta {c.rope_theta:g}\n"
            f"- KV cache: {kv:,} bytes per token in bf16 ({kv // c.n_layer:,} per layer)\n"
            f"- context: trained at {c.block_size} tokens; vocab {c.vocab_size}"
            f"{'; tokenizer: ' + meta['tokenizer'] if note is None else '; no tokenizer (' + note + ')'}\n\n"
            "```python\nfrom transformers import AutoModelForCausalLM, AutoTokenizer\n"
            f"model = AutoModelForCausalLM.from_pretrained({folder!r})\n"
            + (f"tok = AutoTokenizer.from_pretrained({folder!r})\n"
               "ids = tok(\"ROMEO:\", return_tensors=\"pt\").input_ids\n"
               "print(tok.decode(model.generate(ids, max_new_tokens=100, do_sample=False)[0]))\n" if note is None else "")
            + "```\n")


def write_hf(model, folder, meta, source):
    """A folder that loads wherever a Qwen3 checkpoint does: config.json, model.safetensors (float32),
    generation_config.json, the tokenizer files and a model card. Each file goes to a temp file, then is renamed.
    Returns the names written and a note (why no tokenizer), or None."""
    from safetensors.torch import save_file
    c = model.cfg
    tensors = {hf_name(n): p for n, p in qwen3_state(model).items()}
    tokenizer, note = hf_tokenizer(meta)
    eot = (meta or {}).get("eot_token")
    generation = {"max_length": c.block_size, **({"bos_token_id": eot, "eos_token_id": eot} if eot is not None else {})}
    card = model_card(model, folder, meta, source, sum(t.numel() for t in tensors.values()), note)
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, f".tmp{os.getpid()}")

    def put(name, write):
        write(tmp)
        os.replace(tmp, os.path.join(folder, name))

    def text(obj):
        def write(path):
            with open(path, "w") as f:
                f.write(obj if isinstance(obj, str) else json.dumps(obj, indent=2))
        return write

    put("model.safetensors", lambda path: save_file(tensors, path, metadata={"format": "pt"}))
    put("config.json", text(hf_config(c)))
    put("generation_config.json", text(generation))
    put("README.md", text(card))
    names = ["config.json", "model.safetensors", "generation_config.json", "README.md"]
    if tokenizer is not None:
        staging = tmp + "_tok"
        tokenizer.save_pretrained(staging)
        for name in sorted(os.listdir(staging)):
            os.replace(os.path.join(staging, name), os.path.join(folder, name))
            names.append(name)
        os.rmdir(staging)
    return names, note


@torch.no_grad()
def reference(model, tokens, gen_tokens):
    """What another runtime running our export must reproduce, from tokens (a list, from position 0): our logits on
    them (T, vocab: padded rows dropped, float64, on the CPU) and our gen_tokens greedy ids after their first 16 (the
    KV-cache path sample.py runs). -> (logits, prompt, greedy ids)."""
    dev, prompt = model.embed.weight.device, tokens[:16]
    logits = model(torch.tensor([tokens], device=dev))[0][0, :, :model.cfg.vocab_size].double().cpu()  # (T, vocab)
    greedy = model.generate(torch.tensor([prompt], device=dev), gen_tokens, temperature=0)[0, len(prompt):].tolist()
    return logits, prompt, greedy


def first_mismatch(ours, theirs):
    """The index of the first position where two id lists differ, or None."""
    return next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), None)


@torch.no_grad()
def hf_compare(folder, model, meta, tokens, gen_tokens):
    """transformers (on the CPU) running the exported folder against model (ours: the checkpoint as trained) on
    `reference`'s logits and greedy ids. -> (max |logit difference|, largest |logit|, None if the gen_tokens greedy tokens
    are identical else the index of the first that differs, whether the two greedy texts are equal: transformers'
    tokenizer decoding its ids vs ours decoding ours, as sample.py does; None where the folder has no tokenizer)."""
    import transformers
    transformers.logging.set_verbosity_error()  # no progress bar, no note that max_new_tokens overrides max_length
    transformers.logging.disable_progress_bar()
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ours, prompt, our_ids = reference(model, tokens, gen_tokens)
    theirs = hf(torch.tensor([tokens])).logits[0].double()  # (T, vocab): the export has no padded rows
    hf_ids = hf.generate(torch.tensor([prompt]), max_new_tokens=gen_tokens, min_new_tokens=gen_tokens,
                         do_sample=False)[0, len(prompt):].tolist()
    diverged = first_mismatch(our_ids, hf_ids)
    same_text = None
    if os.path.exists(os.path.join(folder, "tokenizer.json")):
        tok = transformers.AutoTokenizer.from_pretrained(folder)  # ids that differ may be padding rows: not decoded
        same_text = diverged is None and tok.decode(prompt + hf_ids) == load_tokenizer(meta)[1](prompt + our_ids)
    return (ours - theirs).abs().max().item(), ours.abs().max().item(), diverged, same_text


# ---- GGUF (llama.cpp): our names -> llama.cpp's qwen3 tensors ----
GGUF_TOP = {"embed.weight": "token_embd.weight", "norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}
GGUF_LAYER = {"attn_norm": "attn_norm", "mlp_norm": "ffn_norm", "attn.q_proj": "attn_q", "attn.k_proj": "attn_k",
              "attn.v_proj": "attn_v", "attn.o_proj": "attn_output", "attn.q_norm": "attn_q_norm", "attn.k_norm": "attn_k_norm",
              "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
GGUF_DTYPES = ("float32", "float16", "bfloat16")


def gguf_name(name):
    """'blocks.3.attn.q_proj.weight' -> 'blk.3.attn_q.weight'."""
    return renamed(name, GGUF_TOP, GGUF_LAYER, "blk")


def bytes_to_unicode():
    """GPT-2's byte -> printable character map: byte-level BPE vocabularies spell every token with these."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    extra = [b for b in range(256) if b not in keep]
    return dict(zip(keep + extra, map(chr, keep + [256 + i for i in range(len(extra))])))


def gpt2_vocab():
    """GPT-2 BPE as llama.cpp's 'gpt2' tokenizer: tokens spelled in byte-level characters ('Ġthe'), the merges
    recovered from tiktoken's ranks (every split of a token into two tokens, lower ranks first: the same rule
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
    """A character as llama.cpp's RWKV tokenizer reads a token: its text goes through an unescaper that knows
    backslash-t, -n, -r, -xNN (lowercase hex) and a backslash before any other character (itself)."""
    named = {"\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r"}
    return named.get(ch) or (f"\\x{ord(ch):02x}" if ord(ch) < 0x20 or ord(ch) == 0x7F else ch)


def utf8(text):
    try:
        return bool(text.encode("utf-8"))
    except UnicodeEncodeError:  # a lone surrogate: no UTF-8 spelling, and GGUF strings are UTF-8
        return False


def char_vocab(meta):
    """A char vocabulary as llama.cpp's 'rwkv' tokenizer: a trie of the tokens' bytes, longest match first, so a
    vocabulary of single characters tokenizes character by character, and it has no default BOS/EOS. (As a
    'gpt2' BPE with no merges it would tokenize the same, but llama.cpp then makes id 11 BOS and EOS when the
    file names none, a real character here, and generation would stop at it.) Raises ValueError for a token
    that is not exactly one character or not valid UTF-8."""
    itos = {int(i): ch for i, ch in meta["itos"].items()}
    if sorted(itos) != list(range(len(itos))):
        raise ValueError("--export_gguf: the char vocab's ids are not 0..n-1; re-prepare the dataset")
    bad = [ch for ch in itos.values() if len(ch) != 1 or not utf8(ch)]
    if bad:
        raise ValueError(f"--export_gguf: the char vocab holds {', '.join(map(repr, bad[:5]))}, which llama.cpp cannot "
                         f"read as one character each (UTF-8 text, one character per token); re-prepare the dataset without them")
    return dict(model="rwkv", pre=None, tokens=[rwkv_spelling(itos[i]) for i in range(len(itos))], types=[1] * len(itos),
                merges=None, bos=None, eos=None)


def id_vocab(vocab_size):
    """Stand-in tokens '[0]' .. '[n-1]' (rwkv trie) for a model without a text tokenizer: llama.cpp needs a vocab
    of the model's size to load it ('no_vocab' has none); feed it token ids."""
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
    """One GGUF file, architecture qwen3, that llama.cpp loads as it loads Qwen3: the weights in dtype (norm
    weights stay float32, as llama.cpp's converter keeps 1-D tensors) and the dataset's tokenizer. Written to a
    temp file, then renamed. Returns a note (why the tokens are stand-ins), or None."""
    import gguf
    c = model.cfg
    if problem := qwen3_problem(c, "--export_gguf"):
        raise ValueError(problem)
    vocab, note = gguf_vocab(meta, c.vocab_size)
    w = gguf.GGUFWriter(None, "qwen3")
    w.add_name(os.path.splitext(os.path.basename(path))[0])
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
    folder = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(folder, f".tmp{os.getpid()}_{os.path.basename(path)}")
    try:
        w.write_header_to_file(tmp)
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return note
