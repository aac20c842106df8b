"""
Trains a GQA or VHA model. One process:

    python train.py config/vha_small.py --max_iters=2000

Several processes (DDP, nccl on GPUs, gloo on CPU), one node or many:

    torchrun --standalone --nproc_per_node=8 train.py config/vha_small.py

Resuming is exact: the batches and dropout masks of iteration `it` are drawn from generators
seeded with (seed, it, micro-step), so a resumed run sees what the uninterrupted run would have.
"""
import dataclasses
import json
import math
import os
import signal
import sys
import time
import zlib

import torch
from torch.distributed import destroy_process_group
from torch.nn.parallel import DistributedDataParallel as DDP

from data.dataset import DATA_ROOT, Dataset, data_changed, data_fingerprint, prepare_if_missing
from model import GPT, GPTConfig
from nanovha.checkpoint import save_checkpoint
from nanovha.config import flat_defaults, settings, stop_if
from nanovha.costs import flops_per_token, kv_bytes_per_token
from nanovha.distill import drop_grads, frozen_params, kd_loss, load_teacher, set_frozen, teacher_forward
from nanovha.figures import compile_counters, gpu_spec
from nanovha.hardware import allow_tf32, autocast_for, choose_compile, choose_dtype, dtype_name, torch_dtype
from nanovha.health import vha_health
from nanovha.outputs import hold, resolved
from nanovha.peers import PeerWatch, start_ddp
from nanovha.timing import Plan, train_plan, training_step
from nanovha.preflight import (cut_log, disk_problem, knob_problem, lr_schedule,
                               outputs_problem, prepare_out_dir, start_checkpoint, start_log, teacher_problem,
                               tokenizer_fix, vocab_mismatch, warmup_problem)

# -----------------------------------------------------------------------------
# defaults (overridden by config/*.py files and --key=value); nanoGPT's names where it has the knob
out_dir = "out"
eval_interval = 250
log_interval = 10
eval_iters = 20
eval_only = False
always_save_checkpoint = True  # False: only save when val loss improves
write_checkpoint = True  # False: never write out_dir/ckpt.pt (smoke runs, benchmarks); not "save_checkpoint":
# that is checkpoint.py's function
init_from = "scratch"  # "scratch", "resume" (from out_dir/ckpt.pt),
# or a checkpoint / Qwen3 folder to start a new run from
seed = 1337
wandb_log = False
wandb_project = "nanovha"
wandb_run_name = "run"
# data
dataset = "shakespeare_char"
data_dir = ""  # default: data/<dataset>; prepared there on first use
curriculum_iters = 0  # row datasets (data/recall): difficulty ramps to full over these iterations;
# 0: full from the start
curriculum_mode = "ramp"  # ramp: all rows at the ramp's (rounded) level; floor: rounded down;
# mix: rows uniform from the easiest up to it (mix_floor: up to the rounded-down level)
data_stream = 0  # another integer: other training batches for the same seed (and the same init)
stop_at_acc = 0.0  # row datasets: stop after the first eval whose held-out accuracy reaches this (0: never)
paired_init = True  # False: the init seed also depends on the model's shape, so variants of one seed share no weights
gradient_accumulation_steps = 1  # global: divided among DDP processes
batch_size = 16  # micro-batch per process
block_size = 256
# model (see GPTConfig); None means "derive the default"
n_layer = 4
n_embd = 128
n_head = 8
n_kv_head = 2
head_dim = None
mlp_hidden = None
rope_theta = 10000.0
qk_norm = True
tie_embeddings = True
dropout = 0.0
attn = "vha"
vha_premix = True
vha_postmix = True
vha_postmix_rank = None
vha_postmix_act = "linear"
q_rank = None  # MLA/MFA: low-rank query
mla_kv_rank = None  # MLA: cached latent width (None: 4 * head_dim)
mla_rope_dim = None  # MLA: shared RoPE key width (None: head_dim // 2)
# warm-up from a checkpoint (docs/convert.md#warm-up)
freeze_iters = 0  # the first N iterations train only the attention projections, premix and postmix (distill.py)
teacher = ""  # a checkpoint or Qwen3 folder whose logits on the same batches the student learns (distillation)
distill_alpha = 0.0  # loss = (1 - alpha) CE + alpha T^2 KL(p_teacher || p_student), p = softmax(logits / T)
distill_temperature = 1.0  # T
# AdamW + warmup/cosine schedule
learning_rate = 1e-3
max_iters = 2000
weight_decay = 0.1
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0  # 0 disables
decay_lr = True
warmup_iters = 100
lr_decay_iters = None  # default max_iters
min_lr = None  # default learning_rate / 10
# system
device = "auto"  # auto picks cuda, then mps, then cpu; or "cpu", "cuda", "cuda:1", "mps"
dtype = "auto"  # auto: CUDA bf16 autocast (fp16 on old GPUs); a CPU follows the plan for this model and machine
# (nanovha/timing.py: fp32 against bf16 autocast timed on the run's own step, kept for the next run)
replan = False  # CPU, dtype auto: time fp32 against bf16 again rather than use the plan kept for this model
compile = None  # None: on for CUDA, off elsewhere (hardware.choose_compile)
ddp_timeout = 600  # DDP: seconds a process waits for the others in a collective (a hung peer) before it stops
# -----------------------------------------------------------------------------
# the configuration, settled once: defaults <- config files <- --key=value (each checked in one line) <- the
# checkpoint of a run that starts from one (its model; a resume also keeps its seed, data and warm-up settings)
defaults = flat_defaults(globals())
optional = {"head_dim": int, "mlp_hidden": int, "vha_postmix_rank": int, "lr_decay_iters": int, "min_lr": float,
            "compile": bool}
config = settings(defaults, sys.argv[1:], optional)  # device "auto" -> what this machine has
model_fields = [f.name for f in dataclasses.fields(GPTConfig) if f.name in config]  # the knobs GPTConfig takes
ckpt_path, log_path = os.path.join(config["out_dir"], "ckpt.pt"), os.path.join(config["out_dir"], "log.jsonl")
stop_if(knob_problem(config, model_fields))  # one line each
stop_if(warmup_problem(config, ckpt_path))
ckpt, model = None, None
if config["init_from"] != "scratch":  # read the checkpoint first: a bad one fails before any data is prepared
    try:
        ckpt, model = start_checkpoint(config, defaults, model_fields, ckpt_path)  # config: + the settings it keeps
    except (FileNotFoundError, ImportError, ValueError) as e:
        sys.exit(f"error: {e}")
globals().update(config)
# -----------------------------------------------------------------------------
# derived values, computed once from the settled configuration
lr_decay_iters, min_lr = lr_schedule(config)  # None: max_iters and learning_rate / 10
resuming = init_from == "resume"
model_args = ckpt["model_args"] if ckpt else None  # a scratch run's: once the data gives the vocab size
block_size = model.cfg.block_size if ckpt else block_size  # a new run from a checkpoint may shorten it
stop_if(int(os.environ.get("RANK", 0)) == 0 and outputs_problem(config, ckpt_path, log_path))  # before out_dir is made
iter_num, best_val_loss, elapsed_before, saved_iter = 0, float("inf"), 0.0, None
if resuming:  # where the run stopped
    iter_num, best_val_loss, elapsed_before = ckpt["iter_num"], ckpt["best_val_loss"], ckpt.get("elapsed", 0.0)
    saved_iter = iter_num
data_dir = data_dir or os.path.join(DATA_ROOT, dataset)


def kept(saved):
    """What a run that stops now leaves behind, for its last line."""
    return f"{ckpt_path} (iteration {saved}) is kept" if saved is not None else "no checkpoint was written yet"


def peer_died(what, ckpt_iter, store_ok):
    """The one line a survivor prints when another process of the DDP job died (peers.py found which). Rank 0 writes
    the checkpoints, and may be the one that died: ckpt_iter is its last, if it said."""
    saved = ckpt_iter if ckpt_iter is not None else saved_iter
    if store_ok or master:
        left = kept(saved)
    else:
        left = f"the last checkpoint rank 0 wrote, if any, is kept in {ckpt_path} on its machine"
    resumable = saved is not None or not (store_ok or master)
    relaunch = ": relaunch with --init_from=resume" if resumable else ""
    return f"error: rank {rank}: {what} at iteration {iter_num}; {left}{relaunch}"


# processes: DDP when launched by torchrun
ddp = int(os.environ.get("RANK", -1)) != -1
device_type = device.split(":")[0]
if ddp:
    try:
        rank, local_rank, world_size, device = start_ddp(device, gradient_accumulation_steps, ddp_timeout)
    except ValueError as e:
        sys.exit(f"error: {e}")
    watch = PeerWatch(rank, world_size, peer_died)
else:
    rank, local_rank, world_size = 0, 0, 1
master = rank == 0


def interrupted(signum, frame):
    """Ctrl-C: one line saying what is kept and how to go on, not a traceback."""
    go_on = ": continue with --init_from=resume" if saved_iter is not None else ""
    sys.exit(f"stopped by Ctrl-C at iteration {iter_num}; {kept(saved_iter)}{go_on}" if master else 130)


signal.signal(signal.SIGINT, interrupted)
accum_per_rank = gradient_accumulation_steps // world_size
compile, compile_reason = choose_compile(device_type, compile)
if device_type == "cuda":
    allow_tf32()  # one API: torch >= 2.9 raises when the legacy flags and fp32_precision are mixed

# output folder: fail now, not after an hour of training (or a long download)
if master:
    try:
        lock = hold(out_dir)  # one writer per out_dir; the kernel drops the lock when this process ends
        prepare_out_dir(out_dir, ckpt_path, log_path, resuming=resuming)
    except ValueError as e:
        sys.exit(f"error: {e}")
if master and wandb_log:  # no login or no package: one line now, not after the data is prepared
    try:
        import wandb
        wandb.init(project=wandb_project, name=wandb_run_name, config=dict(config))
    except Exception as e:  # wandb's own errors (UsageError, CommError, ...) share no base class but Exception
        first = (str(e).splitlines() or [""])[0]
        lock.close()  # a folder this run created is removed again (it is still empty)
        sys.exit(f"error: --wandb_log=True, but wandb cannot start ({type(e).__name__}: {first}); "
                 f"run `wandb login`, set WANDB_MODE=offline, or drop --wandb_log")
teacher_model = None
if teacher:  # the teacher's logits on the same batches, in eval mode without gradients
    try:
        teacher_model, teacher_meta = load_teacher(teacher, device,
                                                   torch.float64 if dtype == "float64" else torch.float32)
    except (FileNotFoundError, ImportError, ValueError) as e:
        sys.exit(f"error: cannot load teacher={teacher}: {e}")

# data: uint16/uint32 token bins (text) or a row spec + held-out rows (data/recall), and meta.pkl; prepared on first use
try:
    if master:
        models = [(ckpt and ckpt.get("meta"), f"the checkpoint {init_from}"),
                  (teacher and teacher_meta, f"the teacher {teacher}")]
        prepare_if_missing(data_dir, dataset, models)
    if ddp:
        torch.distributed.barrier()
    data = Dataset(data_dir, block_size, curriculum_iters, curriculum_mode)
    # read-locked while this run lives (no prepare replaces it), and fingerprinted: a resume refuses other data
    data_lock = master and resolved(data_dir) != resolved(out_dir) and hold(data_dir, shared=True, flag="--data_dir")
    fingerprint = data_fingerprint(data_dir)
except ValueError as e:
    sys.exit(f"error: {e}")
meta, vocab_size, row_spec = data.meta, data.vocab_size, data.rows
tokens_per_iter = gradient_accumulation_steps * batch_size * data.seq_len


def difficulty(it):
    """Curriculum progress at iteration it, in [0, 1]: rows get harder linearly, then stay at full."""
    return min(1.0, it / curriculum_iters) if curriculum_iters else 1.0


def get_batch(split, generator, frac=1.0):
    """(x, y) of (batch_size, T) on the device; the loss ignores y = -1 (rows: all but the answers)."""
    x, y = data.batch(split, batch_size, generator, frac)
    if device_type == "cuda":  # pinned host memory: the copy is asynchronous, the next micro-step need not wait for it
        x, y = x.pin_memory(), y.pin_memory()
    return x.to(device, non_blocking=True), y.to(device, non_blocking=True)


def rng(it, micro):
    """The generator of global micro-step `micro` of iteration `it`: the same on 1 or N processes."""
    # (torch's CPU generator keeps the low 32 bits of a seed, so the stream offset must live there too)
    # (mod 2^64: the generator takes 64 bits, and seeds up to 2^63-1 would overflow it; smaller ones are unchanged)
    return torch.Generator().manual_seed((seed * 1_000_003 + it * 4099 + micro + data_stream * 2_654_435_761) % 2**64)


# model
if teacher:
    stop_if(teacher_problem(teacher_model, teacher_meta, teacher, meta, data_dir, data.seq_len))
if ckpt is not None:
    fix = "resume with the dataset it was trained on" if resuming else tokenizer_fix(ckpt.get("meta"), meta)
    stop_if(vocab_mismatch(ckpt.get("meta"), "the checkpoint" if resuming else f"the checkpoint {init_from}", meta,
                           data_dir, fix))
    stop_if(resuming and data_changed(ckpt.get("data_fingerprint"), fingerprint, data_dir, ckpt_path))
    n_params = model.num_params()
else:
    model_args = dict({k: config[k] for k in model_fields}, vocab_size=vocab_size)
    with torch.device("meta"):  # count the parameters without allocating them
        n_params = GPT(GPTConfig(**model_args)).num_params()
if master and write_checkpoint:
    stop_if(disk_problem(out_dir, n_params))
# paired_init: GPT draws its init seed first, so every variant of one seed starts from the same blocks
if init_from == "scratch":
    torch.manual_seed(seed if paired_init else seed + zlib.crc32(repr(sorted(model_args.items())).encode()))
    model = GPT(GPTConfig(**model_args))
model.to(device, dtype=torch.float64 if dtype == "float64" else torch.float32)
# dtype "auto": on a CPU the faster of float32 and bf16 autocast on this model and batch (hardware.py); a resumed run
# keeps the dtype it trained in, so it stays exact; under DDP every process takes rank 0's choice
emulated = None  # the warning for an explicit bf16 on a CPU that emulates it
if dtype == "auto" and resuming and ckpt.get("dtype"):
    why = "the dtype this run trained in (resumed; --dtype=... changes it)"
    plan = Plan(None, torch_dtype(ckpt["dtype"]), None, why)
elif dtype == "auto" and device_type == "cpu":
    probe_batch = get_batch("train", torch.Generator().manual_seed(seed + 4))
    plan_key = [sorted(model_args.items()), tuple(probe_batch[0].shape), compile, device]
    plan = train_plan(training_step(model, *probe_batch), plan_key, replan=replan)
else:
    name, why = choose_dtype(device_type, dtype)
    plan, emulated = Plan(None, torch_dtype(name), None, why), why if why.startswith("warning") else None
if ddp:
    choice = [plan]
    torch.distributed.broadcast_object_list(choice, src=0)
    plan = choice[0]
dtype = dtype_name(plan.dtype)
autocast = autocast_for(device_type, dtype)  # params stay float32 (or float64); bf16/fp16 run under autocast

# AdamW: weight decay on matrices and postmix, none on norms and premix (GPT.optimizer_groups says why)
optimizer = torch.optim.AdamW(model.optimizer_groups(weight_decay), lr=learning_rate, betas=(beta1, beta2),
                              **({"fused": True} if device_type == "cuda" else {}))
scaler = torch.amp.GradScaler(device_type, enabled=(dtype == "float16"))
frozen = frozen_params(model) if freeze_iters else []  # held still for the first freeze_iters iterations
if resuming:
    optimizer.load_state_dict(ckpt["optimizer"])
    if "scaler" in ckpt:
        scaler.load_state_dict(ckpt["scaler"])
ckpt = None  # free memory
raw_model = model
if compile:
    if master:
        print("compiling the model ...")
    # fullgraph: a graph break in the model is an error, not a silent slowdown. Under DDP, its optimizer splits
    # the graph at gradient buckets on purpose, so fullgraph is off there.
    model = torch.compile(model, fullgraph=not ddp)
    teacher_model = teacher_model and torch.compile(teacher_model, fullgraph=True)
if ddp:
    model = DDP(model, device_ids=[local_rank] if device_type == "cuda" else None)


def get_lr(it):
    if not decay_lr:
        return learning_rate
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    ratio = (it - warmup_iters) / max(1, lr_decay_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (learning_rate - min_lr)


@torch.no_grad()
def estimate_loss():
    """Mean loss (CE) over the same eval_iters batches at every eval (fixed generator per split). Row datasets:
    val is the held-out rows (data/dataset.py's score_val_rows)."""
    model.eval()
    out = {}
    for split in ("train", "val"):
        gen = torch.Generator().manual_seed(seed + (1 if split == "val" else 2))
        if row_spec and split == "val":  # the stored held-out rows at full difficulty, also scored: val_acc, val_exact
            out.update(data.score_val_rows(model, batch_size, device, autocast))
            continue
        losses = torch.zeros(eval_iters)
        for k in range(eval_iters):
            x, y = get_batch(split, gen)
            with autocast:
                losses[k] = model(x, y)[1].item()
        out[split] = losses.mean().item()
    model.train()
    return out


peak = gpu_spec(torch.cuda.get_device_name())[0] if device_type == "cuda" else None  # for MFU; None: CPU or unknown GPU
flops_per_iter = flops_per_token(raw_model.cfg, data.seq_len, training=True) * tokens_per_iter

if master:
    if note := cut_log(log_path, iter_num) if resuming else start_log(log_path):
        print(note)
    print(f"{raw_model.cfg.attn} model: {raw_model.num_params() / 1e6:.2f}M params, KV cache "
          f"{kv_bytes_per_token(raw_model.cfg, torch.float32)} B/token (fp32), {tokens_per_iter} tokens/iter, "
          f"device {device}, {compile_reason}, {world_size} process(es)")
    print(emulated if emulated else f"dtype {plan.summary}", file=sys.stderr if emulated else sys.stdout)


def log(row):
    try:
        with open(log_path, "a") as f:
            f.write(json.dumps(row) + "\n")
    except OSError as e:
        sys.exit(f"error: cannot write {log_path} at iteration {row['iter']} ({e.strerror}); free some space, "
                 f"then continue with --init_from=resume")
    if wandb_log:
        wandb.log(row, step=row["iter"])


def diverged(what, value):
    """Stops every process without saving: the checkpoint on disk is the last one whose losses were finite."""
    fix = "lower --learning_rate" + (", set --grad_clip=1.0" if not grad_clip else "") + " or raise --warmup_iters" + (
        "; or use bfloat16/float32 (float16 overflows)" if dtype == "float16" else "")
    sys.exit(f"error: {what} is {value} at iteration {iter_num}: the run diverged and stopped; "
             f"{kept(saved_iter)}. "
             f"To fix: {fix}" if master else 1)


def save(it, elapsed):
    state = [*raw_model.parameters(),
             *(t for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t))]
    if not all(t.isfinite().all() for t in state):  # finite losses, yet overflowed weights or Adam moments
        diverged("a weight or Adam moment", "inf or nan")
    try:  # temp file + fsync + rename: a crash here leaves the previous checkpoint intact
        save_checkpoint({"model": raw_model.state_dict(), "optimizer": optimizer.state_dict(),
                         "scaler": scaler.state_dict(), "model_args": model_args, "iter_num": it,
                         "best_val_loss": best_val_loss, "config": dict(config), "meta": meta, "elapsed": elapsed,
                         "dtype": dtype, "kind": "nanovha", "data_fingerprint": fingerprint}, ckpt_path)
    except (OSError, RuntimeError) as e:
        sys.exit(f"error: writing the checkpoint of iteration {it} failed, is the disk full? "
                 f"({str(e).splitlines()[0]}); "
                 f"{kept(saved_iter)}: free some space, then continue with --init_from=resume")
    if ddp:  # for the message of a survivor if this process dies
        watch.checkpoint_written(it)


use_bar = master and sys.stderr.isatty()
if use_bar:
    from tqdm import tqdm
    bar = tqdm(total=max_iters, initial=iter_num, dynamic_ncols=True)
say = bar.write if use_bar else print
t_start = time.time() - elapsed_before
t_last, iters_since, teacher_s = time.time(), 0, 0.0
health_batch = get_batch("val", torch.Generator().manual_seed(seed + 3))[0][:4]
stop_now = False  # set at each eval: --stop_at_acc reached
model.train()
while True:
    lr = get_lr(iter_num)
    freezing = iter_num < freeze_iters  # warm-up phase 0: only attention trains (distill.py)
    set_frozen(frozen, freezing and not ddp)  # under DDP (its reducer expects every gradient) drop_grads does it below
    for group in optimizer.param_groups:
        group["lr"] = lr

    if iter_num % eval_interval == 0 or iter_num == max_iters:
        losses = estimate_loss()  # the same on every process
        for split, v in losses.items():
            if not math.isfinite(v):
                diverged(f"the eval {split} loss", v)
        stop_now = 0 < stop_at_acc <= losses.get("val_acc", 0.0)  # learned: the rest of the run would add nothing
        if master:
            elapsed = time.time() - t_start
            row = {"iter": iter_num, "train_loss": losses["train"], "val_loss": losses["val"], "time": elapsed,
                   "tokens": iter_num * tokens_per_iter,
                   **{k: losses[k] for k in ("val_acc", "val_exact") if k in losses},
                   **({"difficulty": data.level(difficulty(iter_num))} if row_spec else {}),
                   **vha_health(raw_model, health_batch), **(compile_counters() if compile else {}),
                   **({"stopped": True} if stop_now else {})}
            log(row)
            say(f"step {iter_num}: train {losses['train']:.4f}, val {losses['val']:.4f}"
                + (f", val acc {losses['val_acc']:.1%}" if row_spec else "") + f", {elapsed:.0f}s"
                + "".join(f", {k} {v:.3g}" for k, v in row.items() if k.startswith(("premix", "postmix"))))
            if losses["val"] < best_val_loss or always_save_checkpoint or stop_now:
                best_val_loss = min(best_val_loss, losses["val"])
                # not again after a resume
                if iter_num > 0 and iter_num != saved_iter and not eval_only and write_checkpoint:
                    save(iter_num, elapsed)
                    saved_iter = iter_num
    if eval_only or iter_num >= max_iters or stop_now:
        if stop_now and master:
            say(f"stopped at step {iter_num}: held-out accuracy {losses['val_acc']:.1%} >= "
                f"stop_at_acc={stop_at_acc}")
        break

    # one optimizer step = gradient_accumulation_steps micro-batches across all processes
    loss_sum = torch.zeros((), device=device)
    for k in range(accum_per_rank):
        micro = rank * accum_per_rank + k
        gen = rng(iter_num, micro)
        torch.manual_seed(int(torch.randint(2**62, (1,), generator=gen)))  # dropout masks, reproducible
        x, y = get_batch("train", gen, difficulty(iter_num))
        if ddp:  # sync gradients only on the last micro-step
            model.require_backward_grad_sync = k == accum_per_rank - 1
        if teacher:  # the teacher's logits on the same batch, timed: its share of the step is logged
            teacher_logits, seconds = teacher_forward(teacher_model, x, autocast, device_type)
            teacher_s += seconds
        with autocast:
            logits, loss = model(x, None if teacher else y)
            loss = (kd_loss(logits, teacher_logits, y, distill_temperature, distill_alpha) if teacher
                    else loss) / accum_per_rank
        scaler.scale(loss).backward()
        loss_sum += loss.detach()
    if freezing:
        drop_grads(frozen)  # no AdamW update at all, not even weight decay
    grad_norm = None
    if grad_clip:  # ||g|| over every parameter, before clipping: logged
        scaler.unscale_(optimizer)
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    if ddp:
        torch.distributed.all_reduce(loss_sum, op=torch.distributed.ReduceOp.AVG)
    loss_value = loss_sum.item()
    if not math.isfinite(loss_value):
        diverged("the training loss", loss_value)
    iters_since += 1
    if master and (iter_num % log_interval == 0 or iter_num == max_iters - 1):
        dt = (time.time() - t_last) / iters_since
        row = {"iter": iter_num, "loss": loss_value, "lr": lr, "tok_per_s": tokens_per_iter / dt,
               **({"grad_norm": grad_norm.item()} if grad_norm is not None else {}),
               "time": time.time() - t_start, **({"teacher_share": teacher_s / (dt * iters_since)} if teacher else {})}
        t_last, iters_since, teacher_s = time.time(), 0, 0.0
        if peak:
            row["mfu"] = flops_per_iter / dt / (peak * world_size)
        log(row)
        stats = (f"loss {loss_value:.4f}, {row['tok_per_s']:.0f} tok/s"
                 + "".join(f", {k} {row[k]:.1%}" for k in ("mfu", "teacher_share") if k in row))
        if use_bar:
            bar.set_postfix_str(stats)
        else:
            print(f"iter {iter_num}: {stats}, {dt * 1000:.0f} ms/iter")
    iter_num += 1
    if use_bar:
        bar.update(1)

if use_bar:
    bar.close()
if ddp:
    destroy_process_group()
