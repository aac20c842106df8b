"""
Folds a trained VHA checkpoint into the plain GQA model it already is, then proves it on real text:

    python fold.py --out_dir=out-vha-small                        # writes out-vha-small/ckpt_folded.pt
    python fold.py --out_dir=out-vha-small --plot=True            # + fold_analysis.png, a per-layer table
    python fold.py --out_dir=out-vha-small --export_hf=hf-vha     # + a Qwen3ForCausalLM folder, run in transformers
    python fold.py --out_dir=out-vha-small --export_gguf=vha.gguf # + one GGUF file, run in llama.cpp

The fold (fold_to_gqa in model.py, computed in float64), for virtual head j = g*H_p + h:
    premix   q_j = q_h P[g] = x W_q[h]^T P[g] = x (P[g]^T W_q[h])^T  =>  W_q'[j]    = P[g]^T W_q[h]
    postmix  y = sum_j W_o[:, j] a'_j,  a' = M a,  M = I + V U^T     =>  W_o'[:, h] = sum_j M[j, h] W_o[:, j]
QK-norm and RoPE act on each head after premix, and K/V are untouched, so the result is GQA with
n_head = H_v heads that attend (H_p for postmix only) and the same n_kv_head: the same KV cache.
"""
import copy
import math
import os
import sys
import time
from dataclasses import asdict

import numpy as np
import torch

from data.common import read_bin
from model import fold_to_gqa
from nanovha.bridges import llamacpp
from nanovha.checkpoint import save_checkpoint
from nanovha.config import at_least, flat_defaults, settings
from nanovha.costs import kv_bytes_per_token
from nanovha.generate import generate
from nanovha.bridges.gguf import GGUF_DTYPES, gguf_export_problem, write_gguf
from nanovha.engine.plan import context_range, decode_plan
from nanovha.health import layer_health
from nanovha.loading import load_model
from nanovha.timing import cache_problem
from nanovha.outputs import (Busy, clobber_problem, file_name_problem, holding, output_problem, save_figure,
                             staged)
from nanovha.bridges.qwen3 import hf_compare, hf_export_problem, write_hf

# -----------------------------------------------------------------------------
out_dir = "out"
ckpt_name = "ckpt.pt"  # the VHA checkpoint to fold (a GQA/MHA one is accepted only with an export)
out_name = "ckpt_folded.pt"
# folder: also write the (folded) model as a Hugging Face Qwen3ForCausalLM checkpoint
export_hf = ""
export_gguf = ""  # file: also write the (folded) model as GGUF (architecture qwen3) for llama.cpp
gguf_dtype = "float32"  # the GGUF's matrices: float32, float16 or bfloat16 (norm weights stay float32)
plot = False  # save out_dir/fold_analysis.png and print what premix/postmix learned, layer by layer
eval_batches = 4  # validation batches for the logit comparison
batch_size = 4
gen_tokens = 200  # greedy tokens that must come out identical
seed = 1337
device = "cpu"
compile_decode = True  # CPU: also build the folded model's compiled decode steps and time the plan sample.py reads
compile_cache = ""  # where compiled packages and plans are kept ("": $NANOVHA_CACHE/compiled)
plan_tokens = 500  # the generation the decode plan is timed for (sample.py's default max_new_tokens)
replan = False  # measure the decode plan again even if one is kept for this shape and machine
verbose = False  # print every timing behind the decode plan
# True: replace an existing --export_hf folder or --export_gguf file (never an input)
overwrite = False
defaults = flat_defaults(globals())
LIMITS = {"eval_batches": at_least(1), "batch_size": at_least(1), "gguf_dtype": GGUF_DTYPES}
# -----------------------------------------------------------------------------


def main(argv):
    globals().update(settings(defaults, argv, limits=LIMITS))
    src, dst = os.path.join(out_dir, ckpt_name), os.path.join(out_dir, out_name)
    if problem := check_args(src, dst):
        sys.exit(f"error: {problem}")
    try:
        with holding(out_dir):  # not while train.py (or another fold.py) writes this folder
            fold_run(src, dst)
    except Busy as e:
        sys.exit(f"error: {e}")


def fold_run(src, dst):
    # Every check comes before the first write: a refused input leaves nothing behind.
    try:
        model, ckpt = load_model(src, device)
    except (FileNotFoundError, ImportError, ValueError) as e:
        sys.exit(f"error: {e}")
    c, model = model.cfg, model.eval()
    proof_data = [os.path.join(folder, name) for folder in filter(None, proof_folders(ckpt))
                  for name in ("val.bin", "meta.pkl")]
    over_data = (clobber_problem(outputs(dst), {"the data the proof reads": path}) for path in proof_data)
    if problem := check_model(src, c, ckpt.get("meta")) or next(filter(None, over_data), None):
        sys.exit(f"error: {problem}")
    if c.attn == "gqa":
        print(f"{src} is already plain GQA (n_head={c.n_head}, n_kv_head={c.n_kv_head}): nothing to fold, "
              "exporting it as is")
        deployed, tokens = model, proof_tokens(ckpt, c.vocab_size, c.block_size, 1)[0]
    else:
        deployed, tokens = fold_and_prove(model, ckpt, src, dst)
    if plot:
        rows = analysis(model)
        print_analysis(model, rows)
        path = os.path.join(out_dir, "fold_analysis.png")
        save_plot(model, rows, path)
        print(f"saved {path}")
    export(model, deployed, ckpt, src, tokens)
    if compile_decode and device == "cpu" and c.attn != "gqa":
        build_decode(deployed)  # the speed layer, for sample.py: one call, skip it on a first read


def fold_and_prove(model, ckpt, src, dst):
    """Folds, proves the fold on held-out text (float32 and float64), writes dst and reports.
    -> (the folded model, the held-out tokens (N, T))."""
    c, t0 = model.cfg, time.time()
    # 1. Fold: W_q'[g*H_p + h] = P[g]^T W_q[h] and W_o'[:, h] = sum_j M[j, h] W_o[:, j], in float64,
    #    cast to the checkpoint's dtype. Loaded back through load_model, the one loading path.
    gqa = fold_to_gqa(model)
    keep = {k: v for k, v in ckpt.items() if k not in ("model", "model_args", "optimizer", "scaler")}
    folded_ckpt = dict(keep, model=gqa.state_dict(), model_args=asdict(gqa.cfg), folded_from=ckpt_name)
    deployed = load_model(folded_ckpt, device)[0].eval()
    t_fold = time.time() - t0

    # 2. Proof: the same logits on held-out text and the same greedy text, in float64 (the fold's
    #    algebra, folded without any cast) and float32 (the weights actually written).
    tokens, source = proof_tokens(ckpt, c.vocab_size, c.block_size, eval_batches * batch_size)
    tokens = tokens.to(device)
    prompt = tokens[:1, :min(16, tokens.size(1))]  # (1, <=16)
    results = {}
    for dtype in (torch.float32, torch.float64):
        vha = copy.deepcopy(model).to(dtype)
        folded = deployed if dtype == torch.float32 else fold_to_gqa(vha).eval()
        results[dtype] = (*logit_diff(vha, folded, tokens), first_difference(vha, folded, prompt))
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
    print(f"    -> {dst}: gqa, n_head={gqa.cfg.n_head}, n_kv_head={gqa.cfg.n_kv_head}, "
          f"head_dim={gqa.cfg.head_dim}")
    print(f"proof on {source}:")
    for dtype, (worst, mean, diverged) in results.items():
        name = str(dtype).replace("torch.", "")
        same = "identical" if diverged is None else f"DIFFERENT from token {diverged} ({name} rounding at a near-tie)"
        print(f"  {name:<8} |logit diff| max {worst:.2e}, mean {mean:.2e}; greedy {gen_tokens} tokens: {same}")
    print(f"params: {model.num_params():,} -> {deployed.num_params():,}   KV cache: "
          f"{kv_bytes_per_token(model.cfg, torch.bfloat16):,} -> "
          f"{kv_bytes_per_token(deployed.cfg, torch.bfloat16):,} "
          f"bytes/token (bf16)")
    print(f"time: fold {t_fold:.2f} s, proof {t_proof:.2f} s")
    return deployed, tokens


def proof_folders(ckpt):
    """The data folders whose val.bin the proof may read: the training run's data_dir, then
    data/<dataset>."""
    config = ckpt.get("config") or {}
    repo = os.path.dirname(os.path.abspath(__file__))
    return [config.get("data_dir") or "",
            os.path.join(repo, "data", config["dataset"]) if config.get("dataset") else ""]


def proof_tokens(ckpt, vocab_size, block_size, n_seqs):
    """(n_seqs, T) windows of the training run's val.bin, or random tokens if it is missing.
    Returns (tokens, where they came from)."""
    folders = proof_folders(ckpt)
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
        worst = diff.max().item()
        biggest = worst if math.isnan(worst) or math.isnan(biggest) else max(biggest, worst)  # NaN stays NaN
        total, count = total + diff.sum().item(), count + diff.numel()
    return biggest, total / count


@torch.no_grad()
def first_difference(model_a, model_b, prompt):
    """Greedy-generates gen_tokens with both models -> None if identical, else the first index that differs."""
    out_a, out_b = (generate(m, prompt, gen_tokens, temperature=0)[0, prompt.size(1):] for m in (model_a, model_b))
    differ = (out_a != out_b).nonzero()
    return None if len(differ) == 0 else int(differ[0])


def outputs(dst):
    """{flag: path} of what this fold writes."""
    return {"--out_name": dst, "--export_hf": export_hf, "--export_gguf": export_gguf,
            "--plot (fold_analysis.png)": plot and os.path.join(out_dir, "fold_analysis.png")}


KINDS = {"--out_name": "checkpoint", "--export_hf": "hf", "--export_gguf": "gguf",
         "--plot (fold_analysis.png)": "figure"}  # what each output may replace: only its own kind


def check_args(src, dst):
    """One-line refusals of the arguments themselves, before anything is read
    (nanovha/outputs.py): no output over an input (the checkpoint, the run's log) or another
    output, none in another run's folder, nothing replaced but an output of ours of its kind (an
    export only with --overwrite=True), --out_name a file name in out_dir, every output folder
    writable."""
    inputs = {"--ckpt_name": src, "the run's log": os.path.join(out_dir, "log.jsonl"),
              "the run's checkpoint": os.path.join(out_dir, "ckpt.pt")}
    return (output_problem(outputs(dst), inputs, own=[out_dir], kinds=KINDS,
                           exports=["--export_hf", "--export_gguf"], overwrite=overwrite)
            or file_name_problem(out_name)
            or (compile_decode and device == "cpu" and cache_problem(compile_cache, build=True)) or None)


def check_model(src, c, meta):
    """Why this checkpoint cannot be folded (or exported as asked), in one line, or None."""
    if c.attn in ("mla", "mfa"):
        return (f"nothing to fold: {src} is {c.attn.upper()} (attn={c.attn!r}), which has no premix or postmix; "
                f"only VHA checkpoints fold, and the exports write Qwen3, which has no "
                f"{c.attn.upper()} attention")
    if c.attn == "gqa" and not (export_hf or export_gguf):
        return (f"nothing to fold: {src} is already a plain "
                f"{'MHA' if c.n_head == c.n_kv_head else 'GQA'} model "
                f"(attn='gqa'); only VHA checkpoints fold "
                "(it can still be exported with --export_hf=DIR or --export_gguf=FILE)")
    if c.attn == "gqa" and plot:
        return f"--plot shows premix/postmix, and {src} is plain GQA (attn='gqa'): there is nothing to plot"
    if c.has_postmix and c.vha_postmix_act != "linear":
        return (f"{src} has a SiLU postmix: a' = a + V silu(U^T a) is not linear in the head "
                f"outputs a, so no matrix M "
                f"can be absorbed into W_o and the model is not a GQA model; only "
                f"vha_postmix_act='linear' folds")
    plain = copy.copy(c)
    plain.attn = "gqa"  # the exports see the folded model: the same checks, on the GQA it becomes
    return ((export_hf and hf_export_problem(plain)) or (export_gguf and gguf_export_problem(plain, meta, gguf_dtype))
            or None)


def export(model, deployed, ckpt, src, tokens):
    """The exports asked for, each written atomically after the fold is proved; the GGUF is then
    run in llama.cpp against model (the checkpoint as trained) where llama-cpp-python is
    installed."""
    meta, vha, n_q_proj = ckpt.get("meta"), model.cfg.attn == "vha", model.cfg.n_q_proj
    if export_hf:
        try:  # written whole into a staging folder beside it, then renamed into place
            with staged(export_hf) as staging:
                names, note = write_hf(deployed, staging, meta, dict(ckpt=src, vha=vha, n_q_proj=n_q_proj), export_hf)
        except OSError as e:
            sys.exit(f"error: cannot write the Hugging Face export to {export_hf} ({e.strerror or e})")
        print(f"exported Qwen3ForCausalLM to {export_hf}/ ({', '.join(names)}): "
              f"transformers.AutoModelForCausalLM.from_pretrained({export_hf!r})" + (f"\nnote: {note}" if note else ""))
        hf_check(model, export_hf, meta, tokens)
    if export_gguf:
        try:
            note = write_gguf(deployed, export_gguf, meta, gguf_dtype)
        except OSError as e:
            sys.exit(f"error: cannot write the GGUF export to {export_gguf} ({e.strerror or e})")
        size = os.path.getsize(export_gguf) / 1e6
        print(f"exported GGUF (qwen3, {gguf_dtype}) to {export_gguf} ({size:.1f} MB): "
              f"llama_cpp.Llama(model_path={export_gguf!r})" + (f"\nnote: {note}" if note else ""))
        if llamacpp.version() is None:
            print("llama.cpp check: skipped "
                  "(pip install -r requirements-llamacpp.txt to run the file in llama.cpp here)")
            return
        worst, scale, diverged = llamacpp.compare(export_gguf, model, tokens[0].tolist(), gen_tokens)
        same = "identical" if diverged is None else f"DIFFERENT from token {diverged}"
        say_check(f"llama.cpp check (llama-cpp-python {llamacpp.version()})", worst, scale, tokens, same)


def hf_check(model, folder, meta, tokens):
    """Runs the exported folder in transformers against the checkpoint as trained: logits and
    greedy text."""
    try:
        import transformers
    except ImportError:
        print("transformers check: skipped "
              "(pip install -r requirements-dev.txt to run the export in transformers here)")
        return
    worst, scale, diverged, same_text = hf_compare(folder, model, meta, tokens[0].tolist(), gen_tokens)
    same = "identical" if diverged is None else f"DIFFERENT from token {diverged}"
    text = "" if same_text is None else f"; greedy text {'equal to' if same_text else 'DIFFERENT from'} sample.py's"
    say_check(f"transformers check (transformers {transformers.__version__})", worst, scale, tokens, same + text)


def say_check(what, worst, scale, tokens, same):
    """One line: how far another runtime's logits are from the checkpoint's, and whether the text is the same."""
    print(f"{what}: |logit diff| max {worst:.2e} at logit scale {scale:.1f} ({worst / scale:.1e} of it) on "
          f"{tokens.size(1)} tokens; greedy {gen_tokens} tokens: {same}")


def build_decode(deployed):
    """The speed layer, for sample.py (nanovha/engine/plan.py): the folded model's compiled steps
    built (float32, and bf16 where native), then timed against eager; sample.py, on this
    checkpoint or on the VHA one (which it folds into the same weights), reads the plan."""
    print("planning decode for sample.py: building the compiled steps, then timing them against eager "
          "(--compile_decode=False skips this) ...")
    t0 = time.time()
    plan = decode_plan(deployed, context_range(1, 1 + plan_tokens), compile_cache, build=True, replan=replan,
                       by="fold.py")
    print(plan, *(plan.details if verbose else []), sep="\n")
    print(f"decode plan ready in {time.time() - t0:.0f} s: sample.py --out_dir={out_dir} --ckpt_name={out_name} "
          f"follows it")


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
        # the same per-layer numbers train.py logs (averaged) via vha_health
        h, row = layer_health(block.attn), {}
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
            row["intra_group_share"] = ((off[same_group].pow(2).sum() / off_mass).item() if off_mass > 0
                                        else float("nan"))
        rows.append(row)
    return rows


def print_analysis(model, rows):
    c = model.cfg
    group = c.n_attn_head // c.n_kv_head
    # intra-group share if off-diagonal mass were spread evenly
    chance = (group - 1) / max(1, c.n_attn_head - 1)
    print(f"per layer (premix: ||P_g - I||_F for the {c.n_kv_head} groups; postmix: M = I + V U^T over "
          f"{c.n_attn_head} heads, {group} per KV group; intra-group share by chance: {chance:.2f})")
    print(f"{'layer':>5}  "
          f"{'premix ||P_g - I||_F':<28}{'diverg.':>8}{'sig_max(VU^T)':>14}{'offdiag M':>10}{'intra-group':>12}")
    for i, row in enumerate(rows):
        dev = " ".join(f"{v:.3g}" for v in row["premix_dev"]) if "premix_dev" in row else "-"
        fmt = lambda key: f"{row[key]:.3g}" if key in row else "-"
        print(f"{i:>5}  {dev:<28}{fmt('divergence'):>8}{fmt('sigma_max'):>14}"
              f"{fmt('offdiag_share'):>10}{fmt('intra_group_share'):>12}")


def save_plot(model, rows, path):
    """Top row: M per layer, KV groups boxed; the colour scale spans the off-diagonal entries, so
    the diagonal (about 1) saturates and what postmix mixes stays visible. Bottom row: premix
    deviation per group."""
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
            ax.set_title(f"layer {i}: M = I + V U^T\noffdiag {row['offdiag_share']:.3f}, "
                         f"intra {row['intra_group_share']:.2f}", fontsize=9)
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
    save_figure(fig, path)
    plt.close(fig)


if __name__ == "__main__":
    main(sys.argv[1:])
