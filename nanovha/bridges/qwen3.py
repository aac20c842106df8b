"""
Our model as a Hugging Face Qwen3ForCausalLM, both ways, and the outputs any Qwen3 runtime must
reproduce:

    model, meta = model_from_hf(folder)       # a Qwen3 folder (config.json + safetensors) -> GPT, tokenizer meta
    write_hf(model, folder, meta, source)     # a plain GQA model (folded VHA) -> a folder transformers and lm-eval load
    hf_compare(folder, model, meta, ...)      # transformers running that folder against our logits and greedy text

Qwen3's layout: q/k/v and gate/up as separate matrices (fuse_projections / split_projections
convert ours), RMSNorm, QK-norm, rotate-half RoPE, SwiGLU; our padded vocab rows stay behind
(pad_vocab adds them on import). The tokenizer travels with the weights, built offline from the
meta.
"""
import json
import os

import torch

from data.common import gpt2_encoding, hf_tokenizer_files, hf_tokenizer_sha256, load_tokenizer
from model import GPTConfig
from nanovha.checkpoint import model_from_state
from nanovha.costs import kv_bytes_per_token
from nanovha.generate import generate
from nanovha.outputs import record_export

# Qwen3 (and other formats) name each projection; their rows stack into our fused ones
UNFUSED_PROJECTIONS = {"attn.qkv_proj.weight": ("attn.q_proj.weight", "attn.k_proj.weight", "attn.v_proj.weight"),
                       "mlp.gate_up_proj.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight")}
UNFUSED_Q = UNFUSED_PROJECTIONS["attn.qkv_proj.weight"][0]


def fuse_projections(state):
    """A state dict with separate q/k/v and gate/up projections -> the same weights under the
    fused names (rows concatenated in the fused order). Other entries pass through."""
    state = dict(state)
    for key in [k for k in state if k.endswith(UNFUSED_Q)]:
        layer = key[: -len(UNFUSED_Q)]  # 'blocks.3.'
        for fused, parts in UNFUSED_PROJECTIONS.items():
            if all(layer + p in state for p in parts):
                state[layer + fused] = torch.cat([state.pop(layer + p) for p in parts])
    return state


def split_projections(state, cfg):
    """The inverse of fuse_projections: fused q/k/v and gate/up rows back under the separate
    names (the layout Hugging Face's Qwen3 uses)."""
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
    """embed/lm_head with cfg.vocab_size rows (Qwen3's) -> cfg.padded_vocab rows, the new ones
    zero: exact, since a padded row is never looked up and its logit is sliced off. Other entries
    pass through."""
    state = dict(state)
    for key in VOCAB_ROWS:
        if key in state and state[key].size(0) == cfg.vocab_size < cfg.padded_vocab:
            state[key] = torch.cat([state[key],
                                    state[key].new_zeros(cfg.padded_vocab - cfg.vocab_size, state[key].size(1))])
    return state


# our parameter names <-> Qwen3ForCausalLM's
HF_TOP = {"embed.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
          "lm_head.weight": "lm_head.weight"}
HF_LAYER = {"attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm",
            "attn.q_proj": "self_attn.q_proj", "attn.k_proj": "self_attn.k_proj", "attn.v_proj": "self_attn.v_proj",
            "attn.o_proj": "self_attn.o_proj", "attn.q_norm": "self_attn.q_norm", "attn.k_norm": "self_attn.k_norm",
            "mlp.gate_proj": "mlp.gate_proj", "mlp.up_proj": "mlp.up_proj", "mlp.down_proj": "mlp.down_proj"}
OUR_TOP, OUR_LAYER = ({v: k for k, v in names.items()} for names in (HF_TOP, HF_LAYER))


def renamed(name, top, layer_modules, layer_prefix):
    """One of our parameter names in another format's scheme: 'blocks.3.attn.q_proj.weight' ->
    f'{layer_prefix}.3.{layer_modules["attn.q_proj"]}.weight'; names outside the blocks through
    `top`."""
    if not name.startswith("blocks."):
        return top[name]
    _, layer, rest = name.split(".", 2)
    module, param = rest.rsplit(".", 1)
    return f"{layer_prefix}.{layer}.{layer_modules[module]}.{param}"


def hf_name(name):
    """'blocks.3.attn.q_proj.weight' -> 'model.layers.3.self_attn.q_proj.weight'."""
    return renamed(name, HF_TOP, HF_LAYER, "model.layers")


# Qwen3Config's defaults (transformers 5.x), for fields a config.json leaves out
QWEN3_DEFAULTS = dict(model_type="qwen3", vocab_size=151936, hidden_size=4096, intermediate_size=22016,
                      num_hidden_layers=32, num_attention_heads=32, head_dim=128, hidden_act="silu",
                      max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=False,
                      attention_bias=False, use_sliding_window=False, sliding_window=4096,
                      max_window_layers=28, attention_dropout=0.0)


def our_name(hf_name):
    """'model.layers.3.self_attn.q_proj.weight' -> 'blocks.3.attn.q_proj.weight' (None: not a
    Qwen3 weight)."""
    if not hf_name.startswith("model.layers."):
        return OUR_TOP.get(hf_name)
    layer, rest = hf_name[len("model.layers."):].split(".", 1)
    module, param = rest.rsplit(".", 1)
    return f"blocks.{layer}.{OUR_LAYER[module]}.{param}" if module in OUR_LAYER and param == "weight" else None


def qwen3_model_args(hf):
    """A Qwen3ForCausalLM config.json (dict) -> GPTConfig kwargs. Every field that changes the
    math maps to one of ours or raises ValueError naming it; the rest (dtype, use_cache, token
    ids, initializer_range) do not."""
    c = {**QWEN3_DEFAULTS, **{k: v for k, v in hf.items() if v is not None}}
    # 5.x name, 4.x name
    rope, scaling = c.get("rope_parameters") or {}, c.get("rope_scaling") or {}
    if not (isinstance(rope, dict) and isinstance(scaling, dict)):
        raise ValueError("config.json rope_parameters and rope_scaling must be objects (or null)")
    rope_types = {f"{name}.{key}": d[key] for name, d in (("rope_parameters", rope), ("rope_scaling", scaling))
                  # every field, not the first
                  for key in ("rope_type", "type") if d.get(key) not in (None, "default")}
    rope_type = next(iter(rope_types.values()), "default")
    n_layer = c["num_hidden_layers"]
    windowed = c["use_sliding_window"] and c["sliding_window"] is not None  # Qwen3Config.__post_init__'s rule
    layer_types = c.get("layer_types") or ["sliding_attention" if windowed and i >= c["max_window_layers"]
                                           else "full_attention" for i in range(n_layer)]
    refused = [  # (field, ok, why): each a one-line error naming the field and what to do
        ("model_type", c["model_type"] == "qwen3",
         f"is {c['model_type']!r}: only Qwen3ForCausalLM folders import (model_type 'qwen3')"),
        ("attention_bias", not c["attention_bias"], "=True: q/k/v/o have biases, this repo's "
                                                    "projections have none"),
        ("hidden_act", c["hidden_act"] == "silu", f"={c['hidden_act']!r}: the MLP here is SwiGLU with silu only"),
        (next(iter(rope_types), "rope_scaling"), rope_type == "default",
         f"is {rope_type!r}: only plain RoPE is implemented here; drop the scaling "
         "(the model then runs at its pretraining context)"),
        ("partial_rotary_factor", {**scaling, **rope}.get("partial_rotary_factor", 1.0) == 1.0,
         "!= 1: RoPE here rotates the whole head_dim"),
        ("layer_types", all(t == "full_attention" for t in layer_types),
         "has sliding-window layers (use_sliding_window / "
         "max_window_layers): every layer here attends to the whole context"),
        ("attention_dropout", c["attention_dropout"] == 0,
         "!= 0: dropout here is one rate for attention and residuals; set it to 0.0"),
    ]
    for field, ok, why in refused:
        if not ok:
            raise ValueError(f"config.json {field} {why}")
    heads = c["num_attention_heads"]
    return dict(vocab_size=c["vocab_size"], block_size=c["max_position_embeddings"], n_layer=n_layer,
                n_embd=c["hidden_size"], n_head=heads, n_kv_head=c.get("num_key_value_heads") or heads,
                head_dim=c["head_dim"], mlp_hidden=c["intermediate_size"],
                rope_theta=float(rope.get("rope_theta", c.get("rope_theta", 10000.0))),
                qk_norm=True, tie_embeddings=bool(c["tie_word_embeddings"]), norm_eps=float(c["rms_norm_eps"]),
                attn="gqa")


def read_safetensors(folder):
    """Every tensor of a folder's model.safetensors, or of the shards its
    model.safetensors.index.json lists."""
    try:
        from safetensors.torch import load_file
    except ImportError:
        raise ImportError("importing a Hugging Face folder needs safetensors: pip install safetensors") from None
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    missing = [n for n in files if not os.path.isfile(os.path.join(folder, n))]
    if missing:
        raise FileNotFoundError(
            f"{folder} has no {missing[0]}: copy the whole Hugging Face folder (safetensors weights; "
            f".bin weights: re-save them with save_pretrained(safe_serialization=True))")
    state = {}
    for n in files:
        try:
            state.update(load_file(os.path.join(folder, n)))
        except Exception as e:  # safetensors' own error type (a truncated or foreign file) has no stable import path
            raise ValueError(f"{os.path.join(folder, n)} cannot be read as safetensors "
                             f"({type(e).__name__}: "
                             f"{(str(e).splitlines() or [''])[0][:120]}); copy the file again (truncated?)") from None
    return state


def model_from_hf(folder, device="cpu"):
    """A Hugging Face Qwen3ForCausalLM folder (config.json + safetensors) -> (GPT in float32,
    meta). meta carries the folder's tokenizer files (bytes) so that a checkpoint built from it
    can still encode and decode text."""
    path = os.path.join(folder, "config.json")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} not found: give a Hugging Face model folder (config.json "
                                f"+ model.safetensors)")
    try:
        with open(path) as f:
            hf = json.load(f)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON ({e}); copy config.json from the model's folder again") from None
    if not isinstance(hf, dict):
        raise ValueError(f"{path} holds a {type(hf).__name__}, not a JSON object; it is not a model's config.json")
    try:
        cfg = GPTConfig(**qwen3_model_args(hf))
    except (TypeError, KeyError) as e:
        raise ValueError(f"{path}: a field has the wrong type or is missing ({type(e).__name__}: {e}); "
                         f"fix config.json") from None
    state = {}
    for hf_key, t in read_safetensors(folder).items():
        if (key := our_name(hf_key)) is None:
            raise ValueError(f"{folder}: weight {hf_key!r} is not part of a Qwen3ForCausalLM this repo can build "
                             f"(a bias, an adapter, a vision tower?); merge or drop it first")
        state[key] = t.float()  # bf16 checkpoints become float32: exact
    # tied: the export may omit lm_head, or hold a copy; the embedding is the one weight
    if cfg.tie_embeddings:
        state.pop("lm_head.weight", None)
    # q/k/v and gate/up rows stacked; vocab rows padded to a multiple of 64
    try:
        state = pad_vocab(fuse_projections(state), cfg)
        if cfg.tie_embeddings and "embed.weight" in state:
            state["lm_head.weight"] = state["embed.weight"]
        model = model_from_state(cfg, state, device)
    except (RuntimeError, ValueError) as e:
        raise ValueError(f"{folder}: the weights do not fit config.json "
                         f"({str(e).strip().splitlines()[0][:200]})") from None
    # the same files data/*/prepare.py --tokenizer=hf reads: the same fingerprint
    files = hf_tokenizer_files(folder)
    # vocab_size: the model's rows (config.json; Qwen3: 151,936), which may exceed the tokenizer's
    # ids (~151,669): data prepared with this tokenizer has the smaller vocab_size, and
    # vocab_problem takes it as long as the files match
    meta = {"tokenizer": "hf", "vocab_size": cfg.vocab_size, "hf_tokenizer_files": files or None,
            "hf_tokenizer_sha256": hf_tokenizer_sha256(files),
            "source": f"Hugging Face folder {os.path.abspath(folder)}"}
    return model, meta



def qwen3_problem(cfg, flag):
    """Why cfg cannot be written as an exact Qwen3 model (for the option named flag), or None."""
    if cfg.attn in ("mla", "mfa"):
        return (f"{flag}: attn={cfg.attn!r} is not a Qwen3 attention: only plain GQA/MHA and VHA (folded first) "
                f"export as Qwen3")
    if cfg.attn == "vha":
        return (f"{flag}: this model is unfolded VHA (premix/postmix are not Qwen3 weights): fold it first "
                "(fold.py does)")
    if not cfg.qk_norm:
        return (f"{flag}: Qwen3 always applies QK-norm (q_norm/k_norm), but this model was trained "
                f"with qk_norm=False: "
                f"its Qwen3 export would compute something else; export only works for qk_norm=True models")
    return None


def qwen3_state(model):
    """Our state dict in Qwen3's layout: q/k/v and gate/up split apart, embed/lm_head cut to the
    vocab's rows, float32 on the CPU. A tied lm_head is dropped (both formats re-tie it to the
    embedding)."""
    c = model.cfg
    state = split_projections(model.state_dict(), c)
    for name in VOCAB_ROWS:  # padded rows are never looked up and their logits are sliced off
        state[name] = state[name][:c.vocab_size]
    return {n: p.detach().float().cpu().contiguous() for n, p in state.items()
            if not (c.tie_embeddings and n == "lm_head.weight")}


def tokenizer_kind(meta):
    return (meta or {}).get("tokenizer", "char" if "stoi" in (meta or {}) else None)


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


def text_marks(meta):
    """(bos, eos): the token ids that begin and end a text in the dataset's tokenizer (None: it
    has none), both from its own vocabulary. Char-level: a newline begins a text (prepare joins
    the files with a blank line) and nothing
    ends one. Otherwise the dataset's end-of-text token (GPT-2's <|endoftext|>), if it has one, for both: FineWeb's
    prepare puts it after every document, and GPT-2 and lm-eval use it as the prefix. lm-eval
    scores an empty context after the bos (its prefix token) and cannot run without one."""
    if tokenizer_kind(meta) == "char":
        return meta["stoi"].get("\n"), None
    eot = (meta or {}).get("eot_token")
    return eot, eot


def hf_tokenizer(meta):
    """The dataset's tokenizer as a Hugging Face fast tokenizer, built offline from what meta.pkl
    pins, or (None, why not). Char-level: one WordLevel token per character (a split on every
    character, decoded by joining), a newline named as bos. GPT-2 BPE: the tiktoken ranks this
    repo tokenized with, converted to byte-level
    BPE merges, <|endoftext|> as bos and eos. Neither adds tokens, and encoding never inserts the bos.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    kind = tokenizer_kind(meta)
    if kind == "char":
        tok = Tokenizer(models.WordLevel(vocab=dict(meta["stoi"]), unk_token=None))
        # every character alone
        tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
        tok.decoder = decoders.Fuse()  # ids -> characters, joined with nothing between them
        has_bos = text_marks(meta)[0] is not None
        return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="\n" if has_bos else None), None
    if kind == "gpt2":
        import base64
        import tempfile
        from transformers.convert_slow_tokenizer import TikTokenConverter
        enc = gpt2_encoding()
        with tempfile.TemporaryDirectory() as tmp:  # the ranks in tiktoken's file format, read back by the converter
            path = os.path.join(tmp, "gpt2.tiktoken")
            with open(path, "w") as f:
                f.writelines(f"{base64.b64encode(b).decode()} {r}\n"
                             for b, r in sorted(enc._mergeable_ranks.items(), key=lambda kv: kv[1]))
            tok = TikTokenConverter(vocab_file=path, pattern=enc._pat_str,
                                    extra_special_tokens=enc._special_tokens).converted()
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
    """README.md of the folder: what the model is, how it was folded, its KV bytes, how to load
    it."""
    c, kv = model.cfg, kv_bytes_per_token(model.cfg, torch.bfloat16)
    return (f"# {os.path.basename(os.path.abspath(folder))}\n\nA {c.n_layer}-layer Qwen3-style model "
            f"({n_params:,} parameters) written by nanoVHA's fold.py from `{source['ckpt']}`"
            f"{' (dataset: ' + meta['source'] + ')' if meta and meta.get('source') else ''}.\n\n"
            + (f"It was trained as **Virtual Head Attention**: {source['n_q_proj']} physical query projections, "
               f"a Q premix into {c.n_head} virtual heads and a linear postmix `I + V U^T` over heads. "
               f"Both maps are linear and were folded exactly into `q_proj` and `o_proj` (in float64), "
               "so this is a plain GQA model.\n\n"
               if source["vha"] else "It was trained as a plain GQA model (nothing to fold).\n\n")
            + f"- attention: {c.n_head} query heads of dim {c.head_dim}, {c.n_kv_head} KV heads (GQA), QK-norm, "
            f"RoPE theta {c.rope_theta:g}\n"
            f"- KV cache: {kv:,} bytes per token in bf16 ({kv // c.n_layer:,} per layer)\n"
            f"- context: trained at {c.block_size} tokens; vocab {c.vocab_size}"
            f"{'; tokenizer: ' + meta['tokenizer'] if note is None else '; no tokenizer (' + note + ')'}\n\n"
            "```python\nfrom transformers import AutoModelForCausalLM, AutoTokenizer\n"
            f"model = AutoModelForCausalLM.from_pretrained({folder!r})\n"
            + (f"tok = AutoTokenizer.from_pretrained({folder!r})\n"
               "ids = tok(\"ROMEO:\", return_tensors=\"pt\").input_ids\n"
               "print(tok.decode(model.generate(ids, max_new_tokens=100, do_sample=False)[0]))\n"
               if note is None else "")
            + "```\n")


def write_hf(model, folder, meta, source, shown=None):
    """A folder that loads wherever a Qwen3 checkpoint does: config.json, model.safetensors
    (float32), generation_config.json, the tokenizer files and a model card (naming the folder as
    `shown`, default folder: where a staging folder will be renamed to). Each file goes to a temp
    file, then is renamed. Returns the names written and a note (why no tokenizer), or None."""
    from safetensors.torch import save_file
    c = model.cfg
    tensors = {hf_name(n): p for n, p in qwen3_state(model).items()}
    tokenizer, note = hf_tokenizer(meta)
    # what generate() needs from the folder: where a text begins (generate() with no prompt) and
    # ends (it stops there); no max_length: transformers' own default (or max_new_tokens) decides,
    # not the training context
    generation = {name: i for name, i in zip(("bos_token_id", "eos_token_id"), text_marks(meta)) if i is not None}
    card = model_card(model, shown or folder, meta, source, sum(t.numel() for t in tensors.values()), note)
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
    record_export(folder, names)  # ours: a later export may replace this folder (outputs.replace_problem)
    return names, note


@torch.no_grad()
def reference(model, tokens, gen_tokens):
    """What another runtime running our export must reproduce, from tokens (a list, from position
    0): our logits on them (T, vocab: padded rows dropped, float64, on the CPU) and our
    gen_tokens greedy ids after their first 16 (the KV-cache path sample.py runs). -> (logits,
    prompt, greedy ids)."""
    dev, prompt = model.embed.weight.device, tokens[:16]
    logits = model(torch.tensor([tokens], device=dev))[0][0, :, :model.cfg.vocab_size].double().cpu()  # (T, vocab)
    greedy = generate(model, torch.tensor([prompt], device=dev), gen_tokens, temperature=0)[0, len(prompt):].tolist()
    return logits, prompt, greedy


def first_mismatch(ours, theirs):
    """The index of the first position where two id lists differ, or None."""
    return next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), None)


@torch.no_grad()
def hf_compare(folder, model, meta, tokens, gen_tokens):
    """transformers (on the CPU) running the exported folder against model (ours: the checkpoint
    as trained) on
    `reference`'s logits and greedy ids. -> (max |logit difference|, largest |logit|, None if the gen_tokens greedy
    tokens are identical else the index of the first that differs, whether the two greedy texts
    are equal: transformers' tokenizer decoding its ids vs ours decoding ours, as sample.py does;
    None where the folder has no tokenizer)."""
    import transformers
    transformers.logging.set_verbosity_error()  # no progress bar, no notes
    transformers.logging.disable_progress_bar()
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ours, prompt, our_ids = reference(model, tokens, gen_tokens)
    # (T, vocab): the export has no padded rows
    theirs = hf(torch.tensor([tokens])).logits[0].double()
    hf_ids = hf.generate(torch.tensor([prompt]), max_new_tokens=gen_tokens, min_new_tokens=gen_tokens,
                         do_sample=False)[0, len(prompt):].tolist()
    diverged = first_mismatch(our_ids, hf_ids)
    same_text = None
    if os.path.exists(os.path.join(folder, "tokenizer.json")):
        # ids that differ may be padding rows: not decoded
        tok = transformers.AutoTokenizer.from_pretrained(folder)
        same_text = diverged is None and tok.decode(prompt + hf_ids) == load_tokenizer(meta)[1](prompt + our_ids)
    return (ours - theirs).abs().max().item(), ours.abs().max().item(), diverged, same_text


