"""
Converts a trained GQA model into a smaller-KV-cache model to warm up, and says per layer how
close the start is:

    python convert.py --src=Qwen3-0.6B --out_dir=out-qwen-vha --n_kv_head=2
        # VHA: 16 virtual / 8 physical / 2 KV heads
    python convert.py --src=Qwen3-0.6B --out_dir=out-qwen-gqa2 --n_kv_head=2 --to=gqa
        # baseline: GQA 16 Q / 2 KV, mean-pooled
    python convert.py --src=out-gqa/ckpt.pt --out_dir=out-vha-conv --calib=data/shakespeare_char/val.bin

--src is a Hugging Face Qwen3ForCausalLM folder (qwen3.model_from_hf) or a checkpoint this repo wrote. The source
has H_q query heads over H_src KV heads (head j reads KV head j // (H_q / H_src)); the target
keeps H_q attending heads over H_kv KV heads, so target KV head g replaces the r = H_src / H_kv
adjacent source heads g*r .. g*r + r - 1, exactly the ones its query heads j = g*H_p + h (H_p =
H_q / H_kv) read before. Everything else (embeddings, norms, MLPs, W_o, lm_head) is copied. In
float64, cast back:

    K/V (both targets):  W_k'[g] = (1/r) sum_{i<r} W_k[g*r + i],  W_v'[g] likewise
                         (GQA uptraining, Ainslie et al. 2023)
    VHA queries:         W_q'[h] = W_q[h] for h < H_p (the group-0 source heads; P[0] = I)
                         P[g] = argmin_P sum_h ||A_h - P^T B_h||_F^2 + lam ||P||_F^2, B_h = W_q[h], A_h = W_q[g*H_p + h]
                              = (B B^T + lam I)^{-1} B A^T   with B = [B_0 .. B_{H_p-1}], A likewise (d x H_p*D)
                         --premix_fit=activations: the queries on calibration inputs X instead, C = X^T X:
                         P[g] = (sum_h B_h C B_h^T + lam I)^{-1} sum_h B_h C A_h^T
                         --physical=best: B from the source group that reconstructs the others best;
                         --physical=fit: B and P fitted together (fit_premix)
                         postmix M = I + V U^T at the identity (V = 0, U ~ N(0, 0.01)); W_o inherited
    GQA target:          W_q unchanged (every source query head kept)

It writes out_dir/ckpt.pt (model_args, model, meta with the tokenizer, config; kind "converted",
converted_from) and prints, per layer, the premix fit's relative error on the weights and the
relative error of q, k, v (after QK-norm) of the converted layer vs the source layer on the same
calibration activations.
"""
import os
import sys
from dataclasses import asdict

import numpy as np
import torch

from nanovha.config import at_least, flat_defaults, settings, stop_if
from data.common import load_tokenizer, read_bin
from nanovha.checkpoint import model_from_state, save_checkpoint
from nanovha.loading import load_model
from nanovha.outputs import Busy, clobber_problem, file_name_problem, holding, output_problem
from model import GPTConfig, rope_cos_sin

# -----------------------------------------------------------------------------
src = ""  # a Hugging Face Qwen3 folder, a checkpoint file, or an out_dir holding ckpt.pt
out_dir = "out-converted"
out_name = "ckpt.pt"
to = "vha"  # "vha" (premix + postmix over H_kv KV heads) or "gqa" (the mean-pooled baseline)
n_kv_head = 2  # KV heads of the target; must divide the source's
premix_fit = "weights"  # "weights": P from W_q alone; "activations": P fits the queries on the calibration tokens
# the physical query heads: "first" (group 0's source heads), "best" (the source group that
# reconstructs the others best), "fit" (fitted together with premix: the least total error, no
# source head kept as it was)
physical = "first"
# premix ridge, relative: lam = ridge * tr(B B^T) / d (scale-free); 0 = plain least squares
ridge = 1e-6
postmix_rank = 0  # rank r of V U^T; 0: GPTConfig's default max(1, n_head // 4)
# calibration tokens: a .bin of token ids (uint16, or as its folder's meta.pkl says), or a UTF-8
# text file (source tokenizer); "": the source's val.bin, else random
calib = ""
calib_batches = 2
batch_size = 2
calib_len = 256  # tokens per calibration sequence (at most the model's block_size)
seed = 1337
device = "cpu"
# True: replace an existing out_dir/out_name checkpoint (never another file, the source or the calibration file)
overwrite = False
defaults = flat_defaults(globals())
LIMITS = {"n_kv_head": at_least(1), "premix_fit": ("weights", "activations"), "physical": ("first", "best", "fit"),
          "ridge": at_least(0), "postmix_rank": at_least(0), "calib_batches": at_least(1), "batch_size": at_least(1),
          "calib_len": at_least(2)}
# -----------------------------------------------------------------------------


def load_source(path):
    """(GPT, meta, checkpoint config or {}) from a Hugging Face folder, a checkpoint file or an
    out_dir."""
    model, ckpt = load_model(path, device)
    return model, ckpt.get("meta"), ckpt.get("config") or {}


def source_problem(cfg, target, H_kv):
    """Why a source config cannot convert to `target` with H_kv KV heads, or None."""
    if cfg.attn in ("mla", "mfa"):
        return f"the source is attn={cfg.attn!r}: it has no per-head W_k/W_v to pool; only GQA/MHA sources convert"
    if cfg.attn == "vha":
        return "the source is VHA: fold it into plain GQA first (python fold.py), then convert the folded checkpoint"
    if target not in ("vha", "gqa"):
        return f"--to={target!r}: choose 'vha' (premix + postmix) or 'gqa' (mean-pooled KV heads)"
    if H_kv < 1 or cfg.n_kv_head % H_kv:
        return (f"--n_kv_head={H_kv} does not divide the source's {cfg.n_kv_head} KV heads: each "
                f"target KV head must "
                f"replace whole adjacent source heads; choose a divisor of {cfg.n_kv_head}")
    return None


def target_config(cfg, target, H_kv, rank):
    """The target GPTConfig: the source's shapes, H_kv KV heads, attn=target (VHA: premix and
    linear postmix)."""
    args = dict(asdict(cfg), n_kv_head=H_kv, attn=target, vha_premix=True, vha_postmix=True, vha_postmix_act="linear",
                vha_postmix_rank=(rank or None) if target == "vha" else None)
    return GPTConfig(**args)


def pool_heads(W, H_kv, d):
    """W (H_src*d, D) -> (H_kv*d, D): W'[g] = (1/r) sum_{i<r} W[g*r + i], r = H_src / H_kv
    adjacent heads."""
    H_src = W.size(0) // d
    # (H_kv, r, d, D) -> (H_kv*d, D)
    return W.view(H_kv, H_src // H_kv, d, W.size(1)).mean(1).reshape(H_kv * d, W.size(1))


def fit_premix(W_q, H_kv, d, lam_rel, C=None, physical="first"):
    """Source W_q (H_q*d, D), float64 -> (physical W_q (H_p*d, D), P (H_kv, d, d), relative error
    per group (H_kv,), the source group whose heads are the physical heads, or -1 when they were
    fitted). Virtual head j = g*H_p + h computes q_j = q_h P[g] = x (P[g]^T B_h)^T
    (model.fold_premix), so P[g]^T must take the physical weights B_h onto the source's A_gh =
    W_q[g*H_p + h], jointly over h. Ridge least squares:
        min_P sum_h ||A_gh - P^T B_h||_F^2 + lam ||P||_F^2  =>  (sum_h B_h B_h^T + lam I) P = sum_h B_h A_gh^T
    With C = X^T X (D, D), the Gram of the layer's calibration inputs X, it fits the queries
    themselves instead:
        min_P sum_h ||X A_gh^T - X B_h^T P||_F^2 + lam ||P||^2  =>  (sum_h B_h C B_h^T + lam I) P = sum_h B_h C A_gh^T
    The physical heads B (`physical`):
        "first": the source heads of group 0 (P[0] = I)
        "best":  the source heads of the group c that reconstructs the other groups best (P[c] = I): every c tried
        "fit":   B and P fitted together, min_{B,P} sum_{g,h} ||A_gh - P[g]^T B_h||^2 (in C's metric when given),
                 by alternating least squares from "best": the P step above, then for each h
                 B_h = (sum_g P[g] P[g]^T)^{-1} sum_g P[g] A_gh; then rescaled so that mean_g P[g] = I
                 (B_h -> (mean P)^T B_h, P[g] -> (mean P)^{-1} P[g]: the same virtual heads)
    The fit is on pre-norm q: QK-norm follows premix (model.Attention), so an exact fit gives the
    source's normed queries exactly; an inexact one errs before the norm, which then rescales
    each token's error with its q.
    The error returned is on the weights, ||A_g - P[g]^T B||_F / ||A_g||_F per group g, whichever fit ran.
    """
    D = W_q.size(1)
    A = W_q.view(H_kv, -1, d, D)  # (H_kv, H_p, d, D): A[g, h] = source head g*H_p + h
    fits = {c: premix_from_group(A, c, C, lam_rel) for c in ([0] if physical == "first" else range(H_kv))}
    source = min(fits, key=lambda c: premix_residual(A, A[c], fits[c], C))
    B, P = A[source], fits[source]  # (H_p, d, D): the physical heads, one source group's
    if physical == "fit":
        source, before = -1, premix_residual(A, B, P, C)
        for _ in range(300):
            # (d, d), (H_p, d, D)
            PP, PA = torch.einsum("gce,gfe->cf", P, P), torch.einsum("gce,gheD->hcD", P, A)
            # (H_p, d, D): B_h = (sum_g P[g] P[g]^T)^{-1} sum_g P[g] A_gh
            B = torch.linalg.solve(PP, PA)
            P = solve_premix(A, B, C, lam_rel)
            after = premix_residual(A, B, P, C)
            if before - after <= 1e-10 * before:
                break
            before = after
        M = P.mean(0)  # (d, d): after the rescale mean_g P[g] = I
        B, P = M.T @ B, torch.linalg.solve(M, P)
    E = A - torch.einsum("gce,hcD->gheD", P, B)  # (H_kv, H_p, d, D): A_gh - P[g]^T B_h
    err = E.flatten(1).norm(dim=1) / A.flatten(1).norm(dim=1).clamp_min(1e-300)  # (H_kv,)
    return B.reshape(-1, D), P, err, source  # (H_p*d, D): the physical W_q


def premix_from_group(A, c, C, lam_rel):
    """P (H_kv, d, d) with source group c's heads as the physical heads: P[c] = I, the other
    groups fitted."""
    P = solve_premix(A, A[c], C, lam_rel)
    P[c] = torch.eye(P.size(-1), dtype=P.dtype)  # exact: the physical heads ARE this group's
    return P


def solve_premix(A, B, C, lam_rel):
    """P (H_kv, d, d) for fixed physical heads B (H_p, d, D): (sum_h B_h C B_h^T + lam I) P[g] =
    sum_h B_h C A_gh^T, lam = lam_rel * mean diag of the left side (relative: the same fit at any
    weight scale)."""
    BC = B if C is None else B @ C  # (H_p, d, D): B_h C
    G = torch.einsum("hcD,heD->ce", BC, B)  # (d, d): sum_h B_h C B_h^T
    G = G + lam_rel * G.diagonal().mean() * torch.eye(G.size(0), dtype=G.dtype)
    return torch.linalg.solve(G, torch.einsum("hcD,gheD->gce", BC, A))  # (H_kv, d, d)


def premix_residual(A, B, P, C):
    """sum_{g,h} ||(A_gh - P[g]^T B_h) C^(1/2)||_F^2 (C None: the identity): what the fit minimises, less the ridge.
    """
    E = A - torch.einsum("gce,hcD->gheD", P, B)  # (H_kv, H_p, d, D)
    return float(E.pow(2).sum() if C is None else torch.einsum("ghcD,DE,ghcE->", E, C, E))


@torch.no_grad()
def input_grams(source, tokens):
    """Per layer, C = X^T X (D, D) in float64 of the attention inputs X = attn_norm(x) (N*T, D)
    on the tokens."""
    grams = [0.0] * source.cfg.n_layer
    for idx in tokens.split(batch_size):
        x = source.embed(idx)  # (B, T, D)
        cos, sin = rope_cos_sin(torch.arange(idx.size(1)), source.cfg.rope_dim, source.cfg.rope_theta, x.dtype)
        for i, block in enumerate(source.blocks):
            X = block.attn_norm(x).double().flatten(0, 1)  # (B*T, D)
            grams[i] = grams[i] + X.T @ X
            x = block(x, cos, sin)
    return grams


@torch.no_grad()
def convert(source, target, H_kv, lam_rel=1e-6, rank=0, seed=0, grams=None, physical="first"):
    """The converted GPT (in the source's dtype), the premix fit errors, one (H_kv,) tensor per
    layer (VHA), and per layer the source group whose query heads became the physical ones (-1:
    fitted; fit_premix's `physical`). grams: per layer the Gram of the calibration inputs, to fit
    premix on activations (fit_premix's C), or None."""
    c = source.cfg
    cfg, d = target_config(c, target, H_kv, rank), c.head_dim
    state = dict(source.state_dict())  # every weight not rewritten below is copied
    gen = torch.Generator().manual_seed(seed)
    fit_errors, sources = [], []
    for i, block in enumerate(source.blocks):
        W = block.attn.qkv_proj.weight
        # (H_q*d, D), (H_src*d, D), (H_src*d, D)
        W_q, W_k, W_v = W.double().split(block.attn.qkv_split)
        if target == "vha":
            W_q, P, err, group = fit_premix(W_q, H_kv, d, lam_rel, None if grams is None else grams[i], physical)
            fit_errors.append(err)
            sources.append(group)
            state[f"blocks.{i}.attn.premix"] = P.to(W.dtype)
            state[f"blocks.{i}.attn.postmix_U"] = (0.01 * torch.randn(cfg.n_attn_head, cfg.vha_postmix_rank,
                                                                      generator=gen)).to(W)
            # M = I exactly
            state[f"blocks.{i}.attn.postmix_V"] = W.new_zeros(cfg.n_attn_head, cfg.vha_postmix_rank)
        state[f"blocks.{i}.attn.qkv_proj.weight"] = torch.cat([W_q, pool_heads(W_k, H_kv, d),
                                                               pool_heads(W_v, H_kv, d)]).to(W.dtype)
    return model_from_state(cfg, state, source.embed.weight.device), fit_errors, sources


def qkv_after_norm(attn, x):
    """What attention reads from x (B, T, D): q (B, T, H, d) after premix and QK-norm, k and v
    (B, T, H_kv, d)."""
    q, k, v = attn.project(x)
    if attn.cfg.has_premix:
        q = attn.apply_premix(q)
    if attn.cfg.qk_norm:
        q, k = attn.q_norm(q), attn.k_norm(k)
    return q, k, v  # RoPE is a rotation: it leaves these relative errors as they are


@torch.no_grad()
def layer_errors(source, converted, tokens):
    """Per layer, ||converted - source|| / ||source|| of q, k and v on the SOURCE's input to that layer (so each
    layer is measured alone); a pooled KV head is compared with every source head it replaces.
    Also (max |logit diff|, source loss, converted loss) of the whole models. tokens: (N, T)."""
    L, r = source.cfg.n_layer, source.cfg.n_kv_head // converted.cfg.n_kv_head
    sq = torch.zeros(L, 3, 2, dtype=torch.float64)  # [layer, q/k/v, (error^2, source^2)]
    worst, losses = 0.0, torch.zeros(2, dtype=torch.float64)
    for idx in tokens.split(batch_size):
        x = source.embed(idx)  # (B, T, D)
        cos, sin = rope_cos_sin(torch.arange(idx.size(1)), source.cfg.rope_dim, source.cfg.rope_theta, x.dtype)
        for i, (a, b) in enumerate(zip(source.blocks, converted.blocks)):
            h = a.attn_norm(x)
            for n, (s, t) in enumerate(zip(qkv_after_norm(a.attn, h), qkv_after_norm(b.attn, h))):
                # (B, T, H_src, d): pooled head g serves g*r .. g*r + r - 1
                t = t.repeat_interleave(r, dim=2) if n else t
                sq[i, n] += torch.stack([(t - s).double().pow(2).sum(), s.double().pow(2).sum()])
            x = a(x, cos, sin)
        inputs, targets = idx[:, :-1], idx[:, 1:].contiguous()  # next-token targets
        (ls, l_src), (lc, l_conv) = source(inputs, targets), converted(inputs, targets)
        worst = max(worst, float((ls - lc).abs().max()))
        losses += torch.tensor([float(l_src), float(l_conv)], dtype=torch.float64)
    n = len(tokens.split(batch_size))
    return (sq[..., 0] / sq[..., 1].clamp_min(1e-300)).sqrt(), (worst, *(losses / n).tolist())


def calibration_tokens(meta, config, vocab_size, block_size):
    """(N, T) calibration tokens and where they came from: --calib (.bin ids or a text file),
    else the source's own val.bin, else random tokens (labelled: the q/k/v errors on them say
    little about real text)."""
    n, T = calib_batches * batch_size, min(calib_len, block_size)
    gen = torch.Generator().manual_seed(seed)
    path = calibration_path(config)
    if not path or (not calib and not os.path.isfile(path)):
        return (torch.randint(vocab_size, (n, T), generator=gen),
                f"RANDOM tokens, {n} x {T} (no --calib, no source val.bin)")
    if not os.path.isfile(path):
        raise ValueError(f"--calib={path}: no such file; give a .bin of token ids or a UTF-8 text file")
    if path.endswith(".bin"):
        ids = torch.from_numpy(read_bin(path).astype(np.int64))  # uint16, or uint32 when its folder's meta.pkl says so
    elif not meta:
        raise ValueError(f"--calib={path}: the source carries no tokenizer to read text with; "
                         "give token ids (a .bin file)")
    else:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except UnicodeDecodeError as e:
            raise ValueError(f"--calib={path} is not UTF-8 text (bad byte at offset {e.start}); give a UTF-8 text "
                             f"file, or token ids as a .bin file") from None
        ids = torch.tensor(load_tokenizer(meta or {})[0](text), dtype=torch.long)
    T = min(T, len(ids) - 1)
    if len(ids) < 3:
        raise ValueError(f"--calib={path} holds {len(ids)} tokens; give at least 3 (a longer text or .bin)")
    if T < 2 or int(ids.max()) >= vocab_size:
        raise ValueError(f"{path}: {len(ids)} tokens, ids up to {int(ids.max())}: need at least 3 tokens with ids "
                         f"below the model's vocab ({vocab_size}); was it tokenized for another model?")
    starts = torch.randint(len(ids) - T, (n,), generator=gen).tolist()
    return torch.stack([ids[i:i + T] for i in starts]), f"{n} x {T} tokens of {path}"  # (n, T)


def calibration_path(config):
    """The file the calibration reads: --calib, else the source run's val.bin (its data_dir or
    data/<dataset>), else "" (random tokens)."""
    repo = os.path.dirname(os.path.abspath(__file__))
    dataset_bin = os.path.join(config.get("data_dir") or os.path.join(repo, "data", config.get("dataset", "")),
                               "val.bin")
    return calib or (dataset_bin if config.get("dataset") or config.get("data_dir") else "")


def report(source, converted, fits, sources, errors, summary, where):
    """Prints what the conversion did, one row per layer, and returns the rows (kept in the
    checkpoint)."""
    s, c = source.cfg, converted.cfg
    print(f"source: {s.n_layer} layers, GQA {s.n_head} Q / {s.n_kv_head} KV heads, head_dim {s.head_dim}")
    heads = f"{c.n_head} virtual / {c.n_q_proj} physical Q" if c.attn == "vha" else f"{c.n_head} Q"
    print(f"target: {c.attn.upper()} {heads} / {c.n_kv_head} KV heads: KV cache "
          f"{s.n_kv_head // c.n_kv_head}x smaller")
    print(f"calibration: {where}")
    print("layer  physical Q (from group)  premix fit rel err (rms / max over groups)  q rel err  "
          "k rel err  v rel err")
    rows = []
    for i in range(s.n_layer):
        fit = fits[i] if fits and len(fits[i]) > 1 else None  # one KV group: nothing to fit
        row = dict(layer=i, physical=None if fit is None else sources[i],
                   premix_fit_rms=None if fit is None else float(fit.pow(2).mean().sqrt()),
                   premix_fit_max=None if fit is None else float(fit.max()), **dict(zip("qkv", errors[i].tolist())))
        rows.append(row)
        fit_text = f"{row['premix_fit_rms']:.3g} / {row['premix_fit_max']:.3g}" if fit is not None else "-"
        heads = "-" if fit is None else "fitted" if sources[i] < 0 else str(sources[i])
        print(f"{i:5d}  {heads:>23}  {fit_text:>42}  {row['q']:9.3g}  {row['k']:9.3g}  {row['v']:9.3g}")
    worst, l_src, l_conv = summary
    print(f"whole model on the calibration tokens: max |logit diff| {worst:.3g}; "
          f"loss {l_src:.4f} (source) -> {l_conv:.4f} (converted)")
    return rows


def main(argv):
    globals().update(settings(defaults, argv, limits=LIMITS))
    if not src:
        sys.exit("error: give the model to convert: --src=HF_FOLDER (Qwen3) or "
                 "--src=out_dir/ckpt.pt")
    dst = os.path.join(out_dir, out_name)
    training_run = os.path.exists(os.path.join(out_dir, "log.jsonl"))  # a conversion's folder holds no log
    stop_if(output_problem({"--out_dir/--out_name": dst}, {"--src": src, "--calib": calib},
                           own=[] if training_run else [out_dir], kinds={"--out_dir/--out_name": "checkpoint"},
                           exports=["--out_dir/--out_name"], overwrite=overwrite)
            or file_name_problem(out_name))
    try:
        # one writer: not while train.py or another convert.py writes this folder
        with holding(out_dir):
            convert_and_save(dst)
    except Busy as e:
        sys.exit(f"error: {e}")


def convert_and_save(dst):
    """Loads, checks, converts, reports, then writes dst (every check before the write)."""
    try:  # every check before the first write: a refused input leaves nothing behind
        source, meta, config = load_source(src)
        if problem := source_problem(source.cfg, to, n_kv_head):
            raise ValueError(problem)
        # the default calibration file is known only now: the source's own val.bin
        if problem := clobber_problem({"--out_dir/--out_name": dst},
                                      {"the calibration file": calibration_path(config)}):
            raise ValueError(problem)
        tokens, where = calibration_tokens(meta, config, source.cfg.vocab_size, source.cfg.block_size)
    except (FileNotFoundError, ImportError, ValueError) as e:
        sys.exit(f"error: {e}")
    source.eval()
    grams = input_grams(source, tokens) if premix_fit == "activations" and to == "vha" else None
    converted, fits, sources = convert(source, to, n_kv_head, ridge, postmix_rank, seed, grams, physical)
    errors, summary = layer_errors(source, converted.eval(), tokens)
    rows = report(source, converted, fits, sources, errors, summary, where)
    method = "GQA: K/V mean-pooled"
    if to == "vha":
        method = f"VHA: physical Q '{physical}', premix by ridge least squares on the {premix_fit}, K/V mean-pooled"
    save_checkpoint({"model": converted.state_dict(), "model_args": asdict(converted.cfg), "meta": meta, "iter_num": 0,
                     # config: the source run's (dataset), {} for a Hugging Face folder
                     "config": config, "kind": "converted",
                     "converted_from": {"src": os.path.abspath(src), "model_args": asdict(source.cfg),
                                        "method": method, "settings": {k: globals()[k] for k in defaults},
                                        "layers": rows, "calibration": where}}, dst)
    print(f"wrote {dst} (kind 'converted', iteration 0): python sample.py --out_dir={out_dir} "
          f"--ckpt_name={out_name}")


if __name__ == "__main__":
    main(sys.argv[1:])
