"""
nanoVHA checkpoints: written atomically, loaded with clear errors, in one place (model.py stays the model).

A checkpoint is a dict with "model" (state_dict) and "model_args" (GPTConfig fields); train.py adds the
optimizer, iteration and dataset meta. Checkpoints from before the fused projections or the padded vocab load too.
A Hugging Face Qwen3ForCausalLM folder loads as well (model_from_hf): the inverse of fold.py's export.
"""
import json
import os
import shutil
import tempfile
from dataclasses import asdict, fields

import torch

from data.common import hf_tokenizer_files, hf_tokenizer_sha256
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
        raise FileNotFoundError(f"checkpoint {path} not found: train one first (python train.py ...) or pass the right --out_dir")
    try:
        ckpt = torch.load(path, map_location=device, weights_only=True)  # never runs code from the file
    except Exception as e:
        reason = str(e).strip().split("\n")[0].split(". ")[0][:160]
        raise ValueError(f"checkpoint {path} is corrupt or truncated ({type(e).__name__}: {reason}); "
                         f"use an intact checkpoint or retrain") from None
    if not isinstance(ckpt, dict) or "model" not in ckpt or "model_args" not in ckpt:
        raise ValueError(f"{path} is not a nanoVHA checkpoint (no 'model'/'model_args' entries)")
    return ckpt


# checkpoints written before the fused projections name each projection; their rows stack into the fused ones
UNFUSED_PROJECTIONS = {"attn.qkv_proj.weight": ("attn.q_proj.weight", "attn.k_proj.weight", "attn.v_proj.weight"),
                       "mlp.gate_up_proj.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight")}
UNFUSED_Q = UNFUSED_PROJECTIONS["attn.qkv_proj.weight"][0]


def is_unfused(key):
    """Whether a state_dict key comes from a checkpoint written before the fusion (a separate q projection)."""
    return key.endswith(UNFUSED_Q)


def fuse_projections(state):
    """A state dict with separate q/k/v and gate/up projections -> the same weights under the fused names
    (rows concatenated in the fused order), so old checkpoints load exactly. Other entries pass through."""
    state = dict(state)
    for key in [k for k in state if is_unfused(k)]:
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


def is_unpadded(ckpt):
    """Whether a checkpoint was written before the vocab padding: its embedding has exactly vocab_size rows,
    fewer than GPTConfig.padded_vocab (a vocab that is a multiple of 64 has nothing to pad)."""
    v = ckpt["model_args"].get("vocab_size")
    return any(k.endswith(VOCAB_ROWS[0]) and t.size(0) == v != GPTConfig(vocab_size=v).padded_vocab for k, t in ckpt["model"].items())


def pad_vocab(state, cfg):
    """embed/lm_head with cfg.vocab_size rows (written before the padding) -> cfg.padded_vocab rows, the new ones
    zero: exact, since a padded row is never looked up and its logit is sliced off. Other entries pass through."""
    state = dict(state)
    for key in VOCAB_ROWS:
        if key in state and state[key].size(0) == cfg.vocab_size < cfg.padded_vocab:
            state[key] = torch.cat([state[key], state[key].new_zeros(cfg.padded_vocab - cfg.vocab_size, state[key].size(1))])
    return state


def model_from_checkpoint(ckpt, device="cpu"):
    """Builds the GPT of a checkpoint dict; strips torch.compile's '_orig_mod.' prefix, fuses the projections
    of checkpoints written before q/k/v and gate/up were fused and pads the vocab rows of those written before
    the padding."""
    known = {f.name for f in fields(GPTConfig)}
    prefix = "_orig_mod."
    try:
        model = GPT(cfg := GPTConfig(**{k: v for k, v in ckpt["model_args"].items() if k in known}))
        state = fuse_projections({k[len(prefix):] if k.startswith(prefix) else k: v for k, v in ckpt["model"].items()})
        model.load_state_dict(pad_vocab(state, cfg))
    except (TypeError, ValueError, KeyError, AttributeError, RuntimeError) as e:
        reason = str(e).strip().split("\n")[0][:200]
        raise ValueError(f"the checkpoint holds no loadable model ({type(e).__name__}: {reason}); "
                         f"use a checkpoint written by train.py or fold.py") from None
    return model.to(device)


def resume_problem(ckpt, path):
    """Why train.py cannot continue this checkpoint (its optimizer state must match the model's parameters),
    or None. The message starts with the path: "cannot resume " + it reads as one line."""
    missing = [k for k in ("optimizer", "iter_num", "best_val_loss", "meta") if k not in ckpt]
    if missing:
        return (f"{path}: it has no {', '.join(missing)}: it is a model-only checkpoint (e.g. folded), not one train.py "
                f"wrote; start a new run with --init_from=scratch in another --out_dir")
    old = ("q/k/v and gate/up were fused into one projection each, so its optimizer state does not match this model's "
           "parameters" if any(map(is_unfused, ckpt["model"])) else
           "the vocab was padded to a multiple of 64, so its optimizer state does not match this model's embedding"
           if is_unpadded(ckpt) else None)
    if old:
        return (f"{path}: it was written before {old}; sample.py, fold.py and bench_decode.py still load it (converted "
                f"on load), but to train on, start a new run (or an older checkout of the repo)")
    return None


def vocab_problem(meta_a, name_a, meta_b, name_b):
    """Why a model trained on meta_a's tokens cannot read meta_b's data (or be compared with a model of it), or None.
    The same tokenizer kind and vocab_size, and the same characters (char) or task spec (rows); for Hugging Face
    tokenizers (hf) the same tokenizer files (data.common.hf_tokenizer_sha256: two tokenizers of one size differ) and
    meta_b's ids inside meta_a's vocab (a Qwen3 model has 151,936 rows, its tokenizer ~151,669 ids)."""
    if meta_a.get("tokenizer") == meta_b.get("tokenizer") == "hf":
        return hf_vocab_problem(meta_a, name_a, meta_b, name_b)
    a, b = [(m.get("tokenizer"), m["vocab_size"], m.get("stoi") or m.get("rows")) for m in (meta_a, meta_b)]
    if a == b:
        return None
    other = ("other characters" if a[0] == "char" else "another recall task spec") if a[:2] == b[:2] else f"the {b[0]} tokenizer ({b[1]} tokens)"
    return f"vocab mismatch: {name_a} was trained with the {a[0]} tokenizer ({a[1]} tokens) but {name_b} has {other}"


def hf_vocab_problem(meta_a, name_a, meta_b, name_b):
    """vocab_problem for two Hugging Face tokenizer metas."""
    (sha_a, va), (sha_b, vb) = [(hf_tokenizer_sha256(m.get("hf_tokenizer_files")), m["vocab_size"]) for m in (meta_a, meta_b)]
    if sha_a is None or sha_b is None:
        return (f"vocab mismatch: {name_a if sha_a is None else name_b} carries no Hugging Face tokenizer files (its folder had "
                f"no tokenizer.json), so its ids cannot be checked; copy the tokenizer files into the folder and import it again")
    if sha_a != sha_b:
        return (f"vocab mismatch: {name_a} was trained with another Hugging Face tokenizer than {name_b}'s (tokenizer "
                f"sha256 {sha_a[:12]} vs {sha_b[:12]}, {va} vs {vb} tokens)")
    if vb > va:
        return f"vocab mismatch: {name_b} has ids up to {vb - 1}, past the {va} rows of {name_a}"
    return None


def prepare_out_dir(out_dir, ckpt_path, resuming):
    """Before any data or training: out_dir exists and is writable, the temp file of a checkpoint write that a crash
    cut short is gone, and a new run will not overwrite a checkpoint. Raises ValueError."""
    try:
        os.makedirs(out_dir, exist_ok=True)
        with tempfile.TemporaryFile(dir=out_dir):
            pass
    except OSError as e:
        raise ValueError(f"out_dir {out_dir!r} is not writable ({e.strerror}); choose another --out_dir") from None
    for name in os.listdir(out_dir):
        if name.startswith(".tmp_" + os.path.basename(ckpt_path)):
            os.remove(os.path.join(out_dir, name))
    if not resuming and os.path.exists(ckpt_path):
        raise ValueError(f"{ckpt_path} exists and init_from='scratch' would overwrite it; continue it with "
                         f"--init_from=resume, or choose a new --out_dir (or delete it)")


def cut_log(log_path, iter_num):
    """On resume: drop the log rows of iterations from iter_num on (they will be redone) and a last line that a crash
    cut short. The file is replaced in one step, so a crash now cannot lose the log."""
    def before(line):
        try:
            return json.loads(line)["iter"] < iter_num
        except ValueError:
            return False
    if os.path.exists(log_path):
        with open(log_path) as f:
            rows = [line.rstrip("\n") + "\n" for line in f if before(line)]
        with open(log_path + ".tmp", "w") as f:
            f.writelines(rows)
        os.replace(log_path + ".tmp", log_path)

def model_from_state(cfg, state, device="cpu"):
    """GPT(cfg) holding exactly `state` (our names, fused, padded), built on the meta device: no random init
    of weights that are overwritten at once (seconds and a second copy of the model at 0.6B)."""
    with torch.device("meta"):
        model = GPT(cfg)
    model.load_state_dict(state, assign=True)  # strict: a missing or extra weight is an error
    if cfg.tie_embeddings:  # assign gives each name its own Parameter: tie them again
        model.lm_head.weight = model.embed.weight
    return model.to(device)


# ---- Hugging Face Qwen3: our parameter names <-> Qwen3ForCausalLM's (export.py writes them, model_from_hf reads) ----
HF_TOP = {"embed.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight", "lm_head.weight": "lm_head.weight"}
HF_LAYER = {"attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm",
            "attn.q_proj": "self_attn.q_proj", "attn.k_proj": "self_attn.k_proj", "attn.v_proj": "self_attn.v_proj",
            "attn.o_proj": "self_attn.o_proj", "attn.q_norm": "self_attn.q_norm", "attn.k_norm": "self_attn.k_norm",
            "mlp.gate_proj": "mlp.gate_proj", "mlp.up_proj": "mlp.up_proj", "mlp.down_proj": "mlp.down_proj"}
OUR_TOP, OUR_LAYER = ({v: k for k, v in names.items()} for names in (HF_TOP, HF_LAYER))


def renamed(name, top, layer_modules, layer_prefix):
    """One of our parameter names in another format's scheme: 'blocks.3.attn.q_proj.weight' ->
    f'{layer_prefix}.3.{layer_modules["attn.q_proj"]}.weight'; names outside the blocks through `top`."""
    if not name.startswith("blocks."):
        return top[name]
    _, layer, rest = name.split(".", 2)
    module, param = rest.rsplit(".", 1)
    return f"{layer_prefix}.{layer}.{layer_modules[module]}.{param}"


def hf_name(name):
    """'blocks.3.attn.q_proj.weight' -> 'model.layers.3.self_attn.q_proj.weight'."""
    return renamed(name, HF_TOP, HF_LAYER, "model.layers")


# Qwen3Config's defaults (transformers 5.x), for fields a config.json leaves out
QWEN3_DEFAULTS = dict(model_type="qwen3", vocab_size=151936, hidden_size=4096, intermediate_size=22016, num_hidden_layers=32,
                      num_attention_heads=32, head_dim=128, hidden_act="silu", max_position_embeddings=32768, rms_norm_eps=1e-6,
                      tie_word_embeddings=False, attention_bias=False, use_sliding_window=False, sliding_window=4096,
                      max_window_layers=28, attention_dropout=0.0)


def our_name(hf_name):
    """'model.layers.3.self_attn.q_proj.weight' -> 'blocks.3.attn.q_proj.weight' (None: not a Qwen3 weight)."""
    if not hf_name.startswith("model.layers."):
        return OUR_TOP.get(hf_name)
    layer, rest = hf_name[len("model.layers."):].split(".", 1)
    module, param = rest.rsplit(".", 1)
    return f"blocks.{layer}.{OUR_LAYER[module]}.{param}" if module in OUR_LAYER and param == "weight" else None


def qwen3_model_args(hf):
    """A Qwen3ForCausalLM config.json (dict) -> GPTConfig kwargs. Every field that changes the math maps to one of
    ours or raises ValueError naming it; the rest (dtype, use_cache, token ids, initializer_range) do not."""
    c = {**QWEN3_DEFAULTS, **{k: v for k, v in hf.items() if v is not None}}
    rope, scaling = c.get("rope_parameters") or {}, c.get("rope_scaling") or {}  # 5.x name, 4.x name
    rope_type = rope.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    n_layer = c["num_hidden_layers"]
    windowed = c["use_sliding_window"] and c["sliding_window"] is not None  # Qwen3Config.__post_init__'s rule
    layer_types = c.get("layer_types") or ["sliding_attention" if windowed and i >= c["max_window_layers"] else "full_attention"
                                           for i in range(n_layer)]
    refused = [  # (field, ok, why): each a one-line error naming the field and what to do
        ("model_type", c["model_type"] == "qwen3", f"is {c['model_type']!r}: only Qwen3ForCausalLM folders import (model_type 'qwen3')"),
        ("attention_bias", not c["attention_bias"], "=True: q/k/v/o have biases, this repo's projections have none"),
        ("hidden_act", c["hidden_act"] == "silu", f"={c['hidden_act']!r}: the MLP here is SwiGLU with silu only"),
        ("rope_scaling", rope_type == "default", f"rope_type={rope_type!r}: only plain RoPE is implemented here; drop the scaling "
                                                 "(the model then runs at its pretraining context)"),
        ("partial_rotary_factor", {**scaling, **rope}.get("partial_rotary_factor", 1.0) == 1.0, "!= 1: RoPE here rotates the whole head_dim"),
        ("layer_types", all(t == "full_attention" for t in layer_types), "has sliding-window layers (use_sliding_window / "
                                                                          "max_window_layers): every layer here attends to the whole context"),
        ("attention_dropout", c["attention_dropout"] == 0, "!= 0: dropout here is one rate for attention and residuals; set it to 0.0"),
    ]
    for field, ok, why in refused:
        if not ok:
            raise ValueError(f"config.json {field} {why}")
    heads = c["num_attention_heads"]
    return dict(vocab_size=c["vocab_size"], block_size=c["max_position_embeddings"], n_layer=n_layer, n_embd=c["hidden_size"],
                n_head=heads, n_kv_head=c.get("num_key_value_heads") or heads, head_dim=c["head_dim"],
                mlp_hidden=c["intermediate_size"], rope_theta=float(rope.get("rope_theta", c.get("rope_theta", 10000.0))),
                qk_norm=True, tie_embeddings=bool(c["tie_word_embeddings"]), norm_eps=float(c["rms_norm_eps"]), attn="gqa")


def read_safetensors(folder):
    """Every tensor of a folder's model.safetensors, or of the shards its model.safetensors.index.json lists."""
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
        raise FileNotFoundError(f"{folder} has no {missing[0]}: copy the whole Hugging Face folder (safetensors weights; "
                                f".bin weights: re-save them with save_pretrained(safe_serialization=True))")
    return {k: v for n in files for k, v in load_file(os.path.join(folder, n)).items()}


def model_from_hf(folder, device="cpu"):
    """A Hugging Face Qwen3ForCausalLM folder (config.json + safetensors) -> (GPT in float32, meta). meta carries the
    folder's tokenizer files (bytes) so that a checkpoint built from it can still encode and decode text."""
    path = os.path.join(folder, "config.json")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} not found: give a Hugging Face model folder (config.json + model.safetensors)")
    with open(path) as f:
        cfg = GPTConfig(**qwen3_model_args(json.load(f)))
    state = {}
    for hf_key, t in read_safetensors(folder).items():
        if (key := our_name(hf_key)) is None:
            raise ValueError(f"{folder}: weight {hf_key!r} is not part of a Qwen3ForCausalLM this repo can build "
                             f"(a bias, an adapter, a vision tower?); merge or drop it first")
        state[key] = t.float()  # bf16 checkpoints become float32: exact
    if cfg.tie_embeddings:  # tied: the export may omit lm_head, or hold a copy; the embedding is the one weight
        state.pop("lm_head.weight", None)
    state = pad_vocab(fuse_projections(state), cfg)  # q/k/v and gate/up rows stacked; vocab rows padded to a multiple of 64
    if cfg.tie_embeddings and "embed.weight" in state:
        state["lm_head.weight"] = state["embed.weight"]
    try:
        model = model_from_state(cfg, state, device)
    except RuntimeError as e:
        raise ValueError(f"{folder}: the weights do not fit config.json ({str(e).strip().splitlines()[0][:200]})") from None
    files = hf_tokenizer_files(folder)  # the same files data/*/prepare.py --tokenizer=hf reads: the same fingerprint
    # vocab_size: the model's rows (config.json; Qwen3: 151,936), which may exceed the tokenizer's ids (~151,669): data
    # prepared with this tokenizer has the smaller vocab_size, and vocab_problem takes it as long as the files match
    meta = {"tokenizer": "hf", "vocab_size": cfg.vocab_size, "hf_tokenizer_files": files or None,
            "hf_tokenizer_sha256": hf_tokenizer_sha256(files), "source": f"Hugging Face folder {os.path.abspath(folder)}"}
    return model, meta


def start_path(path):
    """A checkpoint to start from, as given -> what to load: an out_dir holding ckpt.pt (and no config.json) is its ckpt.pt."""
    inner = os.path.join(path, "ckpt.pt")
    return inner if os.path.isdir(path) and not os.path.exists(os.path.join(path, "config.json")) and os.path.exists(inner) else path


def load_start(path, device="cpu"):
    """A checkpoint dict (model, model_args, meta) from a checkpoint file train.py, convert.py or fold.py wrote, an
    out_dir holding one, or a Hugging Face Qwen3 folder (model_from_hf). Raises FileNotFoundError, ImportError or
    ValueError, one line each."""
    path = start_path(path)
    if os.path.isdir(path) and os.path.isfile(os.path.join(path, "config.json")):
        model, meta = model_from_hf(path, device)
        return {"model": model.state_dict(), "model_args": asdict(model.cfg), "meta": meta, "kind": "hf"}
    if os.path.isdir(path):
        raise FileNotFoundError(f"{path} is a folder with neither ckpt.pt nor config.json: give a checkpoint file, "
                                f"an out_dir holding ckpt.pt, or a Hugging Face Qwen3 folder")
    return load_checkpoint(path, device)


def disk_problem(out_dir, n_params):
    """Why out_dir cannot hold this model's checkpoints (weights + two AdamW moments in fp32, twice while a new
    checkpoint replaces the old one), or None."""
    need_bytes, free = n_params * 4 * 3 * 2, shutil.disk_usage(out_dir).free
    if free < need_bytes:
        return (f"{out_dir} has {free / 1e6:,.0f} MB free but checkpoints of this {n_params / 1e6:,.1f}M-parameter "
                f"model need about {need_bytes / 1e6:,.0f} MB; free some space or choose another --out_dir")
    return None
