"""
VHA health signals: is premix or postmix learning anything? Cheap (no grad, float64), logged by
train.py at every eval and shown per layer by fold.py's analysis. For one layer with premix P
(H_kv, d, d) and postmix M = I + V U^T:

    premix_dev            ||P_g - I||_F per group g (0 at the identity)
    premix_group_div      mean_{g != g'} ||P_g - P_g'||^2 / mean_g ||P_g - I||^2
                          (0 = groups identical, ~2 = independent)
    postmix_sigma_max     sigma_max(V U^T)   (largest stretch of the correction)
    postmix_offdiag_share ||offdiag(M)||_F^2 / ||M||_F^2   (how much the heads are mixed)
    postmix_rel_delta     ||a' - a|| / ||a|| per token on a batch (0 at init: V = 0)
"""
import torch


@torch.no_grad()
def layer_health(attn):
    """One Attention layer's signals: premix_dev per group (H_kv,), premix_group_div, postmix_M
    (H, H), postmix_sigma_max, postmix_offdiag_share; as float64 tensors, only those of the
    pieces the layer has."""
    c, out = attn.cfg, {}
    if c.has_premix:
        eye = torch.eye(c.head_dim, dtype=torch.float64, device=attn.premix.device)
        E = (attn.premix.double() - eye).flatten(1)  # (H_kv, d*d): P_g - I, flattened
        out["premix_dev"] = E.norm(dim=1)
        if c.n_kv_head > 1:
            pair = (E[:, None] - E[None]).pow(2).sum(-1)  # (H_kv, H_kv): ||P_g - P_g'||^2, zero diagonal
            out["premix_group_div"] = (pair.sum() / (c.n_kv_head * (c.n_kv_head - 1))
                                       / E.pow(2).sum(1).mean().clamp_min(1e-30))
    if c.has_postmix:
        M = attn.postmix_matrix().double()
        eye = torch.eye(M.size(0), dtype=M.dtype, device=M.device)
        out["postmix_M"] = M
        out["postmix_sigma_max"] = torch.linalg.matrix_norm(M - eye, ord=2)  # of V U^T
        out["postmix_offdiag_share"] = (M * (1 - eye)).pow(2).sum() / M.pow(2).sum()
    return out


@torch.no_grad()
def vha_health(model, idx=None):
    """The layer means of the signals above as floats ({} for a model without premix or postmix);
    with a batch idx (B, T), also postmix_rel_delta from one eval-mode forward that records it."""
    attns = [b.attn for b in model.blocks]
    if model.cfg.attn != "vha":
        return {}
    rows = [layer_health(a) for a in attns]
    out = {k: sum(float(r[k].mean()) for r in rows) / len(rows) for k in rows[0] if k != "postmix_M"}
    if model.cfg.has_postmix and idx is not None:
        was_training, ratios = model.training, []
        for a in attns:  # eval mode runs apply_postmix itself (training folds M into W_o): record ||a' - a|| / ||a||
            a.apply_postmix = recording(a.apply_postmix, ratios)
        try:
            model.eval()(idx)
        finally:
            for a in attns:
                del a.apply_postmix  # the method again
            model.train(was_training)
        out["postmix_rel_delta"] = sum(ratios) / len(ratios)
    return out


def recording(apply_postmix, ratios):
    """apply_postmix that also appends ||a' - a|| / ||a|| (mean over the batch's tokens) to ratios.
    """
    def recorded(a):  # a: (B, H, T, d)
        mixed = apply_postmix(a)
        # (B, T)
        ratio = (mixed - a).float().norm(dim=(1, 3)) / a.float().norm(dim=(1, 3)).clamp_min(1e-12)
        ratios.append(ratio.mean().item())
        return mixed
    return recorded
