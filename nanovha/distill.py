"""
Which parameters train and how, for train.py: the warm-up freeze (docs/convert.md#warm-up) and
the logit-distillation loss.

Warm-up from a converted checkpoint (the authors' phase 0): for the first freeze_iters iterations
only the attention projections (qkv_proj, o_proj, q_up; MLA's kv_up), premix and postmix train;
the MLP, embeddings, lm_head and every norm (QK-norm too) hold still. Then everything trains.
"""
import time

import torch
import torch.nn.functional as F

from nanovha.loading import load_model
from nanovha.timing import synchronize

ATTENTION_PARAMS = ("attn.qkv_proj.", "attn.o_proj.", "attn.q_up.", "attn.kv_up.", "attn.premix", "attn.postmix_")


def is_attention(name):
    """Whether a parameter name is one that trains while the rest is frozen
    ('blocks.3.attn.premix' is)."""
    return any(part in name for part in ATTENTION_PARAMS)


def frozen_params(model):
    """The parameters a warm-up freeze holds still: every one but the attention projections,
    premix and postmix."""
    return [p for n, p in model.named_parameters() if not is_attention(n)]


def set_frozen(params, frozen):
    """requires_grad off (frozen) or on: a frozen weight gets no gradient, so its weight-gradient
    matmuls are skipped."""
    for p in params:
        p.requires_grad_(not frozen)


def drop_grads(params):
    """grad = None: AdamW skips a parameter without a gradient entirely (no moment update, no
    weight decay, no step count), so a frozen weight stays bit-identical. Under DDP requires_grad
    stays on (its reducer expects every gradient), the gradients are all-reduced and dropped
    here, before clipping measures the norm."""
    for p in params:
        p.grad = None


def kd_loss(student_logits, teacher_logits, targets, T=1.0, alpha=0.5):
    """Hard labels and the teacher's soft ones (Hinton et al. 2015), logits (B, T, V), targets
    (B, T):

        loss = (1 - alpha) CE(z_s, y) + alpha T^2 KL(p_t || p_s),   p_t = softmax(z_t / T),  p_s = softmax(z_s / T)
        KL(p_t || p_s) = sum_v p_t[v] (log p_t[v] - log p_s[v])

    Both terms average over the same positions, those with y >= 0 (row datasets score only their
    answers). T^2 keeps the soft term's gradient on the hard term's scale whatever T is. alpha =
    0 is plain CE, alpha = 1 pure KL. In float32 (float64 logits stay float64); the teacher's
    logits carry no gradient."""
    V = student_logits.size(-1)
    dtype = torch.promote_types(student_logits.dtype, torch.float32)
    z_s = student_logits.to(dtype).reshape(-1, V)  # (B*T, V)
    y = targets.reshape(-1)  # (B*T,)
    ce = F.cross_entropy(z_s, y, ignore_index=-1)
    if alpha == 0:
        return ce
    log_p_s = F.log_softmax(z_s / T, dim=-1)  # (B*T, V)
    # (B*T, V)
    log_p_t = F.log_softmax(teacher_logits.detach().to(dtype).reshape(-1, V) / T, dim=-1)
    # (B*T,): KL(p_t || p_s) per position
    kl = F.kl_div(log_p_s, log_p_t, reduction="none", log_target=True).sum(-1)
    keep = (y >= 0).to(dtype)
    kl = (kl * keep).sum() / keep.sum()  # mean over the CE's positions (0/0 = nan when none, as the CE)
    return (1 - alpha) * ce + alpha * T * T * kl


def load_teacher(path, device, dtype):
    """(teacher GPT in eval mode without gradients, its meta) from a checkpoint file, an out_dir
    or a Qwen3 folder. Raises FileNotFoundError, ImportError or ValueError, one line each."""
    model, ckpt = load_model(path)
    return model.to(device, dtype=dtype).eval().requires_grad_(False), ckpt.get("meta")


@torch.no_grad()
def teacher_forward(teacher, x, autocast, device_type):
    """(the teacher's logits (B, T, V) on x, the seconds they took): the device's queued work is
    finished before and after, so the time is the teacher's alone (it costs the step that much
    overlap on a GPU)."""
    synchronize(device_type)
    t0 = time.perf_counter()
    with autocast:
        logits = teacher(x)[0]
    synchronize(device_type)
    return logits, time.perf_counter() - t0
