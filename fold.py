"""
Folds a trained VHA checkpoint into the plain GQA model it already is, then proves it on real text:

    python fold.py --out_dir=out-vha-small                          # writes out-vha-small/ckpt_folded.pt
    python fold.py --out_dir=out-vha-small --plot=True              # + fold_analysis.png and a per-layer table
    python fold.py --out_dir=out-vha-small --export_hf=hf-vha-small # + a Hugging Face Qwen3ForCausalLM folder

The fold (GPT.fold_to_gqa in model.py, computed in float64), for virtual head j = g*H_p + h:
    premix   q_j = q_h P[g] = x W_q[h]^T P[g] = x (P[g]^T W_q[h])^T  =>  W_q'[j]    = P[g]^T W_q[h]
    postmix  y = sum_j W_o[:, j] a'_j,  a' = M a,  M = I + V U^T     =>  W_o'[:, h] = sum_j M[j, h] W_o[:, j]
QK-norm and RoPE act on each head after premix, and K/V are untouched, so the result is GQA with
n_head = H_v heads that attend (H_p for postmix only) and the same n_kv_head: the same KV cache.
"""
import copy
import json
import os
import sys
import time
from dataclasses import asdict

import numpy as np
import torch

from configurator import ConfigError, configure
from data.common import gpt2_encoding, read_bin
from checkpoint import VOCAB_ROWS, load_checkpoint, model_from_checkpoint, save_checkpoint, split_projections
from health import layer_health
from model import GPT

# -----------------------------------------------------------------------------
out_dir = "out"
ckpt_name = "ckpt.pt"  # the VHA checkpoint to fold (a GQA/MHA one is accepted only with --export_hf)
out_name = "ckpt_folded.pt"
export_hf = ""  # folder: also write the (folded) model as a Hugging Face Qwen3ForCausalLM checkpoint
plot = False  # save out_dir/fold_analysis.png and print what premix/postmix learned, layer by layer
eval_batches = 4  # validation batches for the logit comparison
batch_size = 4
gen_tokens = 200  # greedy tokens that must come out identical
seed = 1337
device = "cpu"
defaults = {k: v for k, v in globals().items() if not k.startswith("_") and isinstance(v, (int, float, bool, str))}
# -----------------------------------------------------------------------------


def fold(vha):
    """The GQA model with vha's outputs, in vha's dtype (fold_to_gqa folds in float64, casts back)."""
    cfg, state = vha.fold_to_gqa()
    gqa = GPT(cfg).to(device=vha.embed.weight.device, dtype=vha.embed.weight.dtype)
    gqa.load_state_dict(state)
    return gqa.eval()


def proof_tokens(ckpt, vocab_size, block_size, n_seqs):
    """(n_seqs, T) windows of the training run's val.bin, or random tokens if it is missing.
    Returns (tokens, where they came from)."""
    config = ckpt.get("config") or {}
    repo = os.path.dirname(os.path.abspath(__file__))
    folders = [config.get("data_dir") or "", os.path.join(repo, "data", config["dataset"]) if config.get("dataset") else ""]
    gen = torch.Generator().manual_seed(seed)
    for folder in filter(None, folders):
        path = os.path.join(folder, "val.bin")
        if not os.path.isfile(path):
            continue
        data = read_bin(path)  # uint16 or uint32, as the folder's meta.pkl says
        T = min(block_size, len(data) - 1)
        if T < 2:
            continue
        starts = torch.randint(len(data) - T, (n_seqs,), generator=gen).tolist()
        tokens = torch.stack([torch.from_numpy(data[i:i + T].astype(np.int64)) for i in starts])  # (n_seqs, T)
        if int(tokens.max()) < vocab_size:
            return tokens, f"{n_seqs} x {T} tokens of {path}"
    tried = " or ".join(filter(None, folders)) or "(the checkpoint names no dataset)"
    tokens = torch.randint(vocab_size, (n_seqs, block_size), generator=gen)
    return tokens, f"RANDOM tokens, {n_seqs} x {block_size} (no usable val.bin in {tried})"


@torch.no_grad()
def logit_diff(model_a, model_b, tokens):
    """(max, mean) of |logits_a - logits_b| over tokens (N, T), batch_size sequences at a time."""
    biggest, total, count = 0.0, 0.0, 0
    for x in tokens.split(batch_size):
        diff = (model_a(x)[0] - model_b(x)[0]).abs()  # (B, T, vocab)
        biggest, total, count = max(biggest, diff.max().item()), total + diff.sum().item(), count + diff.numel()
    return biggest, total / count


@torch.no_grad()
def first_difference(model_a, model_b, prompt):
    """Greedy-generates gen_tokens with both models; None if identical, else the first differing index."""
    out_a, out_b = (m.generate(prompt, gen_tokens, temperature=0)[0, prompt.size(1):] for m in (model_a, model_b))
    differ = (out_a != out_b).nonzero()
    return None if len(differ) == 0 else int(differ[0])


# ---- what premix and postmix learned (--plot) ----
@torch.no_grad()
def analysis(model):
    """Per layer, in float64: ||P_g - I||_F per group, the group divergence (0 = identical groups,
    about 2 = independent), sigma_max(V U^T), the off-diagonal share of ||M||_F^2 and the share of that
    off-diagonal mass that stays inside a KV group (heads j, h with j // group == h // group)."""
    c = model.cfg
    group = c.n_attn_head // c.n_kv_head  # attending heads per KV head
    heads = torch.arange(c.n_attn_head, device=model.embed.weight.device)
    same_group = heads[:, None] // group == heads[None, :] // group  # (H, H)
    rows = []
    for block in model.blocks:
        h, row = layer_health(block.attn), {}  # the same per-layer numbers train.py logs (averaged) via vha_health
        if "premix_dev" in h:
            row["premix_dev"] = h["premix_dev"].tolist()
        if "premix_group_div" in h:
            row["divergence"] = h["premix_group_div"].item()
        if "postmix_M" in h:
            M = h["postmix_M"]
            off = M - torch.diag(torch.diag(M))
            off_mass = off.pow(2).sum()
            row["M"] = M.cpu()
            row["sigma_max"] = h["postmix_sigma_max"].item()
            row["offdiag_share"] = h["postmix_offdiag_share"].item()
            row["intra_group_share"] = (off[same_group].pow(2).sum() / off_mass).item() if off_mass > 0 else float("nan")
        rows.append(row)
    return rows


def print_analysis(model, rows):
    c = model.cfg
    group = c.n_attn_head // c.n_kv_head
    chance = (group - 1) / max(1, c.n_attn_head - 1)  # intra-group share if off-diagonal mass were spread evenly
    print(f"per layer (premix: ||P_g - I||_F for the {c.n_kv_head} groups; postmix: M = I + V U^T over "
          f"{c.n_attn_head} heads, {group} per KV group; intra-group share by chance: {chance:.2f})")
    print(f"{'layer':>5}  {'premix ||P_g - I||_F':<28}{'diverg.':>8}{'sig_max(VU^T)':>14}{'offdiag M':>10}{'intra-group':>12}")
    for i, row in enumerate(rows):
        dev = " ".join(f"{v:.3g}" for v in row["premix_dev"]) if "premix_dev" in row else "-"
        fmt = lambda key: f"{row[key]:.3g}" if key in row else "-"
        print(f"{i:>5}  {dev:<28}{fmt('divergence'):>8}{fmt('sigma_max'):>14}{fmt('offdiag_share'):>10}{fmt('intra_group_share'):>12}")


def save_plot(model, rows, path):
    """Top row: M per layer, KV groups boxed; the colour scale spans the off-diagonal entries, so the
    diagonal (about 1) saturates and what postmix mixes stays visible. Bottom row: premix deviation per group."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    c = model.cfg
    group = c.n_attn_head // c.n_kv_head
    fig, axes = plt.subplots(2, c.n_layer, figsize=(3.2 * c.n_layer, 6.4), squeeze=False)
    for i, row in enumerate(rows):
        ax = axes[0, i]
        if "M" in row:
            M = row["M"]
            lim = max((M - torch.diag(torch.diag(M))).abs().max().item(), 1e-12)
            im = ax.imshow(M.numpy(), cmap="RdBu_r", vmin=-lim, vmax=lim)
            for edge in range(group, c.n_attn_head, group):  # KV group boundaries
                ax.axhline(edge - 0.5, color="k", lw=1)
                ax.axvline(edge - 0.5, color="k", lw=1)
            ax.set_title(f"layer {i}: M = I + V U^T\noffdiag {row['offdiag_share']:.3f}, intra {row['intra_group_share']:.2f}", fontsize=9)
            ax.set_xlabel("input head h")
            ax.set_ylabel("output head j")
            fig.colorbar(im, ax=ax, fraction=0.046)
        else:
            ax.text(0.5, 0.5, "no postmix", ha="center", va="center")
            ax.axis("off")
        ax = axes[1, i]
        if "premix_dev" in row:
            ax.bar(range(c.n_kv_head), row["premix_dev"], color="tab:blue")
            ax.set_xticks(range(c.n_kv_head))
            ax.set_xlabel("KV group g")
            ax.set_ylabel("||P_g - I||_F")
            ax.set_title(f"premix, divergence {row['divergence']:.2f}" if "divergence" in row else "premix", fontsize=9)
        else:
            ax.text(0.5, 0.5, "no premix", ha="center", va="center")
            ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ---- Hugging Face export: our names -> Qwen3ForCausalLM's ----
HF_TOP = {"embed.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight", "lm_head.weight": "lm_head.weight"}
HF_LAYER = {"attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm",
            "attn.q_proj": "self_attn.q_proj", "attn.k_proj": "self_attn.k_proj", "attn.v_proj": "self_attn.v_proj",
            "attn.o_proj": "self_attn.o_proj", "attn.q_norm": "self_attn.q_norm", "attn.k_norm": "self_attn.k_norm",
            "mlp.gate_proj": "mlp.gate_proj", "mlp.up_proj": "mlp.up_proj", "mlp.down_proj": "mlp.down_proj"}


def hf_name(name):
    """'blocks.3.attn.q_proj.weight' -> 'model.layers.3.self_attn.q_proj.weight'."""
    if not name.startswith("blocks."):
        return HF_TOP[name]
    _, layer, rest = name.split(".", 2)
    module, param = rest.rsplit(".", 1)
    return f"model.layers.{layer}.{HF_LAYER[module]}.{param}"


def hf_export_problem(cfg):
    """Why cfg (a plain GQA config) cannot be written as an exact Qwen3 model, or None."""
    if cfg.attn in ("mla", "mfa"):
        return f"attn={cfg.attn!r} is not a Qwen3 attention: only plain GQA/MHA and VHA (folded first) export as Qwen3ForCausalLM"
    if not cfg.qk_norm:
        return ("Qwen3 always applies QK-norm (q_norm/k_norm), but this model was trained with qk_norm=False: "
                "its Qwen3 export would compute something else; export only works for qk_norm=True models")
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
    kind = (meta or {}).get("tokenizer", "char" if "stoi" in (meta or {}) else None)
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


def write_hf(model, folder, meta, source):
    """A folder that loads wherever a Qwen3 checkpoint does: config.json, model.safetensors (float32),
    generation_config.json, the tokenizer files and a model card. Each file goes to a temp file, then is renamed.
    Returns the names written and a note (why no tokenizer), or None."""
    from safetensors.torch import save_file
    c = model.cfg
    state = split_projections(model.state_dict(), c)  # Qwen3 names q/k/v and gate/up separately
    for name in VOCAB_ROWS:  # our padded rows stay behind: the export has the tokenizer's vocab_size rows
        state[name] = state[name][:c.vocab_size]
    tensors = {hf_name(n): p.detach().float().cpu().contiguous() for n, p in state.items()
               if not (c.tie_embeddings and n == "lm_head.weight")}  # tied: HF re-ties lm_head to embed_tokens
    config = {
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
    tokenizer, note = hf_tokenizer(meta)
    eot = (meta or {}).get("eot_token")
    generation = {"max_length": c.block_size, **({"bos_token_id": eot, "eos_token_id": eot} if eot is not None else {})}
    kv = model.kv_bytes_per_token(torch.bfloat16)
    card = (f"# {os.path.basename(os.path.abspath(folder))}\n\nA {c.n_layer}-layer Qwen3-style model "
            f"({sum(t.numel() for t in tensors.values()):,} parameters) written by nanoVHA's fold.py from `{source['ckpt']}`"
            f"{' (dataset: ' + meta['source'] + ')' if meta and meta.get('source') else ''}.\n\n"
            + (f"It was trained as **Virtual Head Attention**: {source['n_q_proj']} physical query projections, a Q premix "
               f"into {c.n_head} virtual heads and a linear postmix `I + V U^T` over heads. Both maps are linear and were "
               f"folded exactly into `q_proj` and `o_proj` (in float64), so this is a plain GQA model.\n\n"
               if source["vha"] else "It was trained as a plain GQA model (nothing to fold).\n\n")
            + f"- attention: {c.n_head} query heads of dim {c.head_dim}, {c.n_kv_head} KV heads (GQA), QK-norm, RoPE theta {c.rope_theta:g}\n"
            f"- KV cache: {kv:,} bytes per token in bf16 ({kv // c.n_layer:,} per layer)\n"
            f"- context: trained at {c.block_size} tokens; vocab {c.vocab_size}"
            f"{'; tokenizer: ' + meta['tokenizer'] if tokenizer is not None else '; no tokenizer (' + note + ')'}\n\n"
            "```python\nfrom transformers import AutoModelForCausalLM, AutoTokenizer\n"
            f"model = AutoModelForCausalLM.from_pretrained({folder!r})\n"
            + (f"tok = AutoTokenizer.from_pretrained({folder!r})\n"
               "ids = tok(\"ROMEO:\", return_tensors=\"pt\").input_ids\n"
               "print(tok.decode(model.generate(ids, max_new_tokens=100, do_sample=False)[0]))\n" if tokenizer is not None else "")
            + "```\n")
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
    put("config.json", text(config))
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


def main(argv):
    try:
        globals().update(configure(defaults, argv))
    except ConfigError as e:
        sys.exit(f"error: {e}")
    src, dst = os.path.join(out_dir, ckpt_name), os.path.join(out_dir, out_name)
    if os.path.realpath(src) == os.path.realpath(dst):
        sys.exit(f"error: --out_name={out_name} would overwrite the input {src}; choose another name")
    if export_hf and os.path.exists(export_hf) and not os.path.isdir(export_hf):
        sys.exit(f"error: --export_hf={export_hf} is a file, not a folder")
    if min(eval_batches, batch_size, gen_tokens) < 1:
        sys.exit("error: eval_batches, batch_size and gen_tokens must be >= 1")

    # Every check comes before the first write: a refused input leaves nothing behind.
    try:
        ckpt = load_checkpoint(src)
    except (FileNotFoundError, ValueError) as e:
        sys.exit(f"error: {e}")
    try:
        model = model_from_checkpoint(ckpt, device).eval()
    except ValueError as e:
        sys.exit(f"error: {src}: {e}")
    c = model.cfg
    if c.attn in ("mla", "mfa"):
        sys.exit(f"error: nothing to fold: {src} is {c.attn.upper()} (attn={c.attn!r}), which has no premix or postmix; "
                 f"only VHA checkpoints fold, and the Hugging Face export writes Qwen3, which has no {c.attn.upper()} attention")
    if c.attn == "gqa":
        if not export_hf:
            sys.exit(f"error: nothing to fold: {src} is already a plain {'MHA' if c.n_head == c.n_kv_head else 'GQA'} "
                     f"model (attn='gqa'); only VHA checkpoints fold (it can still be exported with --export_hf=DIR)")
        if plot:
            sys.exit(f"error: --plot shows premix/postmix, and {src} is plain GQA (attn='gqa'): there is nothing to plot")
    if c.has_postmix and c.vha_postmix_act != "linear":
        sys.exit(f"error: {src} has a SiLU postmix: a' = a + V silu(U^T a) is not linear in the head outputs a, "
                 f"so no matrix M can be absorbed into W_o and the model is not a GQA model; only "
                 f"vha_postmix_act='linear' folds")
    if export_hf and (problem := hf_export_problem(c)):
        sys.exit(f"error: {problem}")

    if c.attn == "gqa":
        print(f"{src} is already plain GQA (n_head={c.n_head}, n_kv_head={c.n_kv_head}): nothing to fold, exporting it as is")
        deployed = model
    else:
        t0 = time.time()
        # 1. Fold: W_q'[g*H_p + h] = P[g]^T W_q[h] and W_o'[:, h] = sum_j M[j, h] W_o[:, j], in float64,
        #    cast to the checkpoint's dtype. Loaded back through model_from_checkpoint, the one loading path.
        gqa_cfg, state = model.fold_to_gqa()
        keep = {k: v for k, v in ckpt.items() if k not in ("model", "model_args", "optimizer", "scaler")}
        folded_ckpt = dict(keep, model=state, model_args=asdict(gqa_cfg), folded_from=ckpt_name)
        deployed = model_from_checkpoint(folded_ckpt, device).eval()
        t_fold = time.time() - t0

        # 2. Proof: the same logits on held-out text and the same greedy text, in float64 (the fold's
        #    algebra, folded without any cast) and float32 (the weights actually written).
        tokens, source = proof_tokens(ckpt, c.vocab_size, c.block_size, eval_batches * batch_size)
        tokens = tokens.to(device)
        prompt = tokens[:1, :min(16, tokens.size(1))]  # (1, <=16)
        results = {}
        for dtype in (torch.float32, torch.float64):
            vha = copy.deepcopy(model).to(dtype)
            gqa = deployed if dtype == torch.float32 else fold(vha)
            results[dtype] = (*logit_diff(vha, gqa, tokens), first_difference(vha, gqa, prompt))
        worst64 = results[torch.float64][0]
        with torch.no_grad():
            scale = max(1.0, model(tokens[:1])[0].abs().max().item())
        if not worst64 <= 1e-9 * scale:  # float64 exact fold: ~1e-14 * scale; any wrong index: >> 1e-3
            sys.exit(f"error: the fold is not exact (max |logit diff| {worst64:.2e} in float64); {dst} was not written")
        t_proof = time.time() - t0 - t_fold

        # 3. Write (atomically), then report.
        try:
            save_checkpoint(folded_ckpt, dst)
        except OSError as e:
            sys.exit(f"error: cannot write {dst} ({e.strerror or e}); nothing was written")
        pieces = [f"premix ({c.n_kv_head} groups of {c.head_dim}x{c.head_dim})" if c.has_premix else "",
                  f"linear postmix (rank {c.vha_postmix_rank})" if c.has_postmix else ""]
        print(f"folded {src}: vha, {c.n_layer} layers, {c.n_q_proj} physical q heads, "
              f"{' + '.join(filter(None, pieces))}, {c.n_attn_head} heads attend {c.n_kv_head} KV heads")
        print(f"    -> {dst}: gqa, n_head={gqa_cfg.n_head}, n_kv_head={gqa_cfg.n_kv_head}, head_dim={gqa_cfg.head_dim}")
        print(f"proof on {source}:")
        for dtype, (worst, mean, diverged) in results.items():
            name = str(dtype).replace("torch.", "")
            same = "identical" if diverged is None else f"DIFFERENT from token {diverged} ({name} rounding at a near-tie)"
            print(f"  {name:<8} |logit diff| max {worst:.2e}, mean {mean:.2e}; greedy {gen_tokens} tokens: {same}")
        print(f"params: {model.num_params():,} -> {deployed.num_params():,}   KV cache: "
              f"{model.kv_bytes_per_token(torch.bfloat16):,} -> {deployed.kv_bytes_per_token(torch.bfloat16):,} "
              f"bytes/token (bf16)")
        print(f"time: fold {t_fold:.2f} s, proof {t_proof:.2f} s")

    if plot:
        rows = analysis(model)
        print_analysis(model, rows)
        path = os.path.join(out_dir, "fold_analysis.png")
        save_plot(model, rows, path)
        print(f"saved {path}")
    if export_hf:
        try:
            names, note = write_hf(deployed, export_hf, ckpt.get("meta"), dict(ckpt=src, vha=c.attn == "vha", n_q_proj=c.n_q_proj))
        except OSError as e:
            sys.exit(f"error: cannot write the Hugging Face export to {export_hf} ({e.strerror or e})")
        print(f"exported Qwen3ForCausalLM to {export_hf}/ ({', '.join(names)}): "
              f"transformers.AutoModelForCausalLM.from_pretrained({export_hf!r})" + (f"\nnote: {note}" if note else ""))


if __name__ == "__main__":
    main(sys.argv[1:])
