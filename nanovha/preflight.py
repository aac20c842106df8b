"""
What train.py checks before it starts: its knobs, the out_dir, the checkpoint it resumes or
starts from, the teacher, the tokenizers, the disk. Each problem is one line naming the knob and
the fix. `c` is train.py's config dict (its defaults updated by config files and --key=value).
"""
import json
import os
import shutil
import tempfile

from data.common import hf_tokenizer_sha256
from data.dataset import DATA_ROOT
from data.recall import tasks as recall_tasks
from model import GPTConfig
from nanovha.checkpoint import load_checkpoint, model_from_checkpoint
from nanovha.config import DTYPES
from nanovha.loading import load_start, start_path
from nanovha.outputs import DATA_FILES, folder_problem, output_problem

TOKENIZER_FIX = ("prepare the data with the model's tokenizer (a Hugging Face model: "
                 "data/fineweb_edu/prepare.py --tokenizer=hf --hf_tokenizer=FOLDER; "
                 "docs/convert.md#warm-up)")
WARMUP_KEYS = ("freeze_iters", "teacher", "distill_alpha", "distill_temperature")
# what an exact resume keeps from its checkpoint: the warm-up and everything the batches depend on
RESUME_KEYS = (*WARMUP_KEYS, "seed", "data_stream", "paired_init", "dataset", "data_dir", "batch_size",
               "gradient_accumulation_steps", "curriculum_iters", "curriculum_mode")


def lr_schedule(c):
    """train.py's (lr_decay_iters, min_lr), a None replaced by its default (max_iters,
    learning_rate / 10)."""
    decay, low = c["lr_decay_iters"], c["min_lr"]
    return (c["max_iters"] if decay is None else decay), (c["learning_rate"] / 10 if low is None else low)


def knob_problem(c, model_fields):
    """The first bad setting among train.py's knobs, or None. model_fields: the knobs GPTConfig
    takes; a scratch run's bad head/rank/width combination fails here, before any data is
    prepared."""
    c = dict(c, **dict(zip(("lr_decay_iters", "min_lr"), lr_schedule(c))))
    positive = ("batch_size", "block_size", "gradient_accumulation_steps", "eval_interval", "eval_iters",
                "log_interval", "ddp_timeout")
    checks = [(f"{k} must be >= 1, got {c[k]}", c[k] >= 1) for k in positive] + [
        (f"max_iters and warmup_iters must be >= 0, got {c['max_iters']} and {c['warmup_iters']}",
         c["max_iters"] >= 0 and c["warmup_iters"] >= 0),
        ("need learning_rate > 0, weight_decay >= 0, grad_clip >= 0 (0 = off) and 0 <= beta1, beta2 < 1",
         c["learning_rate"] > 0 and c["weight_decay"] >= 0 and c["grad_clip"] >= 0 and 0 <= c["beta1"] < 1
         and 0 <= c["beta2"] < 1),
        (f"min_lr={c['min_lr']} must be in [0, learning_rate={c['learning_rate']}]",
         0 <= c["min_lr"] <= c["learning_rate"]),
        (f"warmup_iters={c['warmup_iters']} is past lr_decay_iters={c['lr_decay_iters']} (default: max_iters), "
         f"so the learning rate would jump from its peak to min_lr; lower --warmup_iters or raise --lr_decay_iters",
         not c["decay_lr"] or c["eval_only"] or c["warmup_iters"] <= c["lr_decay_iters"]),
        (f"curriculum_mode must be one of {', '.join(recall_tasks.CURRICULUM_MODES)}, got "
         f"{c['curriculum_mode']!r}",
         c["curriculum_mode"] in recall_tasks.CURRICULUM_MODES),
        (f"need 0 <= stop_at_acc <= 1 and data_stream >= 0, got {c['stop_at_acc']}, {c['data_stream']}",
         0 <= c["stop_at_acc"] <= 1 and c["data_stream"] >= 0),
        (f"dtype must be {', '.join(DTYPES[:-1])} or {DTYPES[-1]}, got {c['dtype']!r}", c["dtype"] in DTYPES),
    ]
    problem = next((msg for msg, ok in checks if not ok), None)
    if problem is None and c["init_from"] == "scratch":
        try:
            GPTConfig(**{k: c[k] for k in model_fields}, vocab_size=1)
        except ValueError as e:
            problem = str(e)
    return problem


def warmup_problem(c, ckpt_path):
    """The first bad warm-up setting (init_from, freeze_iters, teacher, distill_*), or None."""
    init, alpha = c["init_from"], c["distill_alpha"]
    if init not in ("scratch", "resume") and os.path.realpath(start_path(init)) == os.path.realpath(ckpt_path):
        return f"init_from={init} is this out_dir's own checkpoint: continuing it is --init_from=resume"
    if not 0 <= c["freeze_iters"] <= c["max_iters"]:
        return (f"freeze_iters={c['freeze_iters']} must be in [0, max_iters={c['max_iters']}]; "
                "lower it or raise --max_iters")
    if not 0 <= alpha <= 1:
        return f"distill_alpha={alpha} must be in [0, 1] (the weight of the teacher's KL against the hard-label loss)"
    if not c["distill_temperature"] > 0:
        return f"distill_temperature={c['distill_temperature']} must be > 0 (1: the teacher's own distribution)"
    # the teacher and alpha come from the checkpoint (kept_on_resume refuses others)
    if init == "resume":
        return None
    if c["teacher"] and alpha == 0:
        return (f"teacher={c['teacher']} is given but distill_alpha=0 would never use it; "
                "drop --teacher or set --distill_alpha > 0")
    if alpha > 0 and not c["teacher"]:
        return f"distill_alpha={alpha} needs a teacher to distill from; set --teacher=PATH or drop --distill_alpha"
    return None



def given(c):
    """The keys a config file or flag set (config.Settings.given); every key of a plain dict."""
    return getattr(c, "given", c.keys())


def contradictions(c, kept, keys):
    """The knobs a config file or flag set (a None asks for the derived default) to something
    else than a checkpoint keeps: 'k=v (checkpoint: w), ...'."""
    return ", ".join(f"{k}={c[k]!r} (checkpoint: {kept[k]!r})" for k in keys
                     if k in given(c) and c[k] is not None and c[k] != kept[k])


def tokenizer_fix(meta, data_meta):
    """The fix that goes with a vocab mismatch of a checkpoint against char data: a small Hugging
    Face vocabulary is a char-level nanoVHA model exported to Hugging Face, whose own run is the
    place to start from; otherwise the Hugging Face recipe (TOKENIZER_FIX)."""
    exported_char = (meta or {}).get("tokenizer") == "hf" and (meta or {}).get("vocab_size", 1 << 20) <= 1024
    if exported_char and (data_meta or {}).get("tokenizer") == "char":
        return ("it looks exported from a char-level nanoVHA run: start from that run's checkpoint "
                "(--init_from=RUN/ckpt.pt), or prepare text with its tokenizer "
                "(data/text/prepare.py "
                "--tokenizer=hf --hf_tokenizer=FOLDER)")
    return TOKENIZER_FIX


def vocab_mismatch(meta, name, data_meta, data_dir, fix):
    """Why a model (checkpoint or teacher) with this meta cannot read data_dir's token ids,
    ending in `fix`, or None."""
    if not meta:
        return (f"{name} carries no tokenizer description (meta), so its token ids cannot be checked against "
                f"{data_dir}'s; {fix}")
    problem = vocab_problem(meta, name, data_meta, data_dir)
    return problem and f"{problem}; {fix}"


def kept_on_resume(saved, c, defaults):
    """On resume: the settings an exact resume keeps (RESUME_KEYS) as the checkpoint's config
    saved them (a key it lacks: the default), and the line refusing any set to something else, or
    None."""
    kept = {k: saved.get(k, defaults[k]) for k in RESUME_KEYS}
    typed = contradictions(c, kept, RESUME_KEYS)
    return kept, typed and (f"a resumed run keeps its checkpoint's warm-up, seed and data settings (its batches "
                            f"depend on them), but you set {typed}; drop them or start a new --out_dir")


def start_args(model_args, c):
    """A new run from a checkpoint: its model_args with block_size and dropout as set (training
    knobs; block_size up to the checkpoint's), and the line refusing a longer block_size, or
    None."""
    own = {k: c[k] for k in ("block_size", "dropout") if k in given(c)}
    longest = model_args["block_size"]
    return {**model_args, **own}, own.get("block_size", 0) > longest and (
        f"block_size={c['block_size']} is past the checkpoint's {longest}, the longest sequence its model takes; "
        "lower --block_size")


def start_checkpoint(c, defaults, model_fields, ckpt_path):
    """init_from "resume" or a path -> (the checkpoint, its model), after every check such a run
    needs: a resumable checkpoint within max_iters, the settings it keeps (written into c), no
    model knob set against it, and for a new run its model_args at this run's block_size and
    dropout. Raises FileNotFoundError, ImportError or ValueError, one line each, before any data
    is prepared."""
    resuming = c["init_from"] == "resume"
    what = "cannot resume" if resuming else f"cannot start from init_from={c['init_from']}"
    try:
        ckpt = load_checkpoint(ckpt_path) if resuming else load_start(c["init_from"])
    except (FileNotFoundError, ImportError, ValueError) as e:
        raise type(e)(f"{what}: {e}") from None
    if resuming:
        if problem := resume_problem(ckpt, ckpt_path):
            raise ValueError(f"cannot resume {problem}")
        if not c["eval_only"] and ckpt["iter_num"] > c["max_iters"]:
            raise ValueError(f"the checkpoint is at iteration {ckpt['iter_num']}, past "
                             f"max_iters={c['max_iters']}; "
                             f"raise --max_iters to train further")
        # batches and warm-up go on as they were
        kept, problem = kept_on_resume(ckpt.get("config", {}), c, defaults)
        if problem:
            raise ValueError(problem)
        c.update(kept)
    else:  # a new run (iteration 0, a new optimizer) from the checkpoint's model
        ckpt["model_args"], problem = start_args(ckpt["model_args"], c)
        if problem:
            raise ValueError(problem)
    try:
        model = model_from_checkpoint(ckpt)
    except ValueError as e:
        raise ValueError(f"{what}: {ckpt_path if resuming else c['init_from']}: {e}") from None
    if typed := contradictions(c, {k: getattr(model.cfg, k) for k in model_fields}, model_fields):
        raise ValueError(f"a {'resumed' if resuming else 'new'} run keeps its checkpoint's model, "
                         f"but you set {typed}; "
                         f"drop them" + (" or start a new --out_dir" if resuming else ""))
    return ckpt, model


def teacher_problem(teacher, meta, name, data_meta, data_dir, seq_len, fix=TOKENIZER_FIX):
    """Why this teacher cannot score this run's batches (another tokenizer, too short a context),
    or None."""
    if problem := vocab_mismatch(meta, f"the teacher {name}", data_meta, data_dir, fix):
        return problem
    if teacher.cfg.block_size < seq_len:
        return (f"the teacher {name} takes sequences of at most {teacher.cfg.block_size} tokens, "
                f"this run's are {seq_len}; lower --block_size")
    return None


def resume_problem(ckpt, path):
    """Why train.py cannot continue this checkpoint (its optimizer state must match the model's
    parameters), or None. The message starts with the path: "cannot resume " + it reads as one
    line."""
    missing = [k for k in ("optimizer", "iter_num", "best_val_loss", "meta") if k not in ckpt]
    if missing:
        return (f"{path}: it has no {', '.join(missing)}: it is a model-only checkpoint (e.g. folded), "
                f"not one train.py wrote; start a new run from it with --init_from={path} "
                f"--out_dir=NEW_FOLDER")
    return None


def vocab_problem(meta_a, name_a, meta_b, name_b):
    """Why a model trained on meta_a's tokens cannot read meta_b's data (or be compared with a
    model of it), or None. The same tokenizer kind and vocab_size, and the same characters (char)
    or task spec (rows); for Hugging Face tokenizers (hf) the same tokenizer files
    (data.common.hf_tokenizer_sha256: two tokenizers of one size differ) and meta_b's ids inside
    meta_a's vocab (a Qwen3 model has 151,936 rows, its tokenizer ~151,669 ids)."""
    if meta_a.get("tokenizer") == meta_b.get("tokenizer") == "hf":
        return hf_vocab_problem(meta_a, name_a, meta_b, name_b)
    a, b = [(m.get("tokenizer"), m["vocab_size"], m.get("stoi") or m.get("rows")) for m in (meta_a, meta_b)]
    if a == b:
        return None
    other = (("other characters" if a[0] == "char" else "another recall task spec") if a[:2] == b[:2]
             else f"the {b[0]} tokenizer ({b[1]} tokens)")
    return f"vocab mismatch: {name_a} was trained with the {a[0]} tokenizer ({a[1]} tokens) but {name_b} has {other}"


def hf_vocab_problem(meta_a, name_a, meta_b, name_b):
    """vocab_problem for two Hugging Face tokenizer metas."""
    (sha_a, va), (sha_b, vb) = [(hf_tokenizer_sha256(m.get("hf_tokenizer_files")), m["vocab_size"])
                                for m in (meta_a, meta_b)]
    if sha_a is None or sha_b is None:
        return (f"vocab mismatch: {name_a if sha_a is None else name_b} carries no Hugging Face tokenizer files "
                f"(its folder had no tokenizer.json), so its ids cannot be checked; copy the "
                f"tokenizer files into the "
                "folder and import it again")
    if sha_a != sha_b:
        return (f"vocab mismatch: {name_a} was trained with another Hugging Face tokenizer than "
                f"{name_b}'s (tokenizer "
                f"sha256 {sha_a[:12]} vs {sha_b[:12]}, {va} vs {vb} tokens)")
    if vb > va:
        return f"vocab mismatch: {name_b} has ids up to {vb - 1}, past the {va} rows of {name_a}"
    return None


def outputs_problem(c, ckpt_path, log_path):
    """Before out_dir is made or locked (nanovha/outputs.py): out_dir a writable folder (not a
    file, not a dangling link), and ckpt.pt and log.jsonl over nothing this run reads (the start
    checkpoint, the teacher, the data) and in no other run's folder. One line, or None."""
    data_dir = c["data_dir"] or os.path.join(DATA_ROOT, c["dataset"])
    reads = {"--init_from": c["init_from"] not in ("scratch", "resume") and start_path(c["init_from"]),
             "--teacher": c["teacher"] and start_path(c["teacher"]),
             **{f"--data_dir's {name}": os.path.join(data_dir, name) for name in DATA_FILES}}
    return folder_problem(c["out_dir"], "--out_dir") or output_problem(
        {"--out_dir's ckpt.pt": ckpt_path, "--out_dir's log.jsonl": log_path}, reads, own=[c["out_dir"]])


def prepare_out_dir(out_dir, ckpt_path, log_path, resuming):
    """Before any data or training: out_dir exists and is writable, the temp file of a checkpoint
    write that a crash cut short is gone, and a new run will not overwrite another run's
    checkpoint (a log with no checkpoint beside it, from a run that never saved, is kept aside by
    start_log). Raises ValueError."""
    try:
        os.makedirs(out_dir, exist_ok=True)
        with tempfile.TemporaryFile(dir=out_dir):
            pass
    except OSError as e:
        raise ValueError(f"out_dir {out_dir!r} is not writable ({e.strerror}); choose another --out_dir") from None
    if os.path.isdir(log_path):
        raise ValueError(f"{log_path} is a folder, where train.py writes its log; move it away or choose another "
                         f"--out_dir")
    for name in os.listdir(out_dir):
        if name.startswith(".tmp_" + os.path.basename(ckpt_path)):
            os.remove(os.path.join(out_dir, name))
    theirs = [p for p in (ckpt_path, log_path) if os.path.exists(p)]
    if not resuming and os.path.exists(ckpt_path):
        raise ValueError(f"{' and '.join(theirs)} exist(s): another run's, which "
                         f"init_from={'scratch'!r} would "
                         f"overwrite; continue it with --init_from=resume, or choose a new "
                         f"--out_dir (or delete it)")


def cut_log(log_path, iter_num):
    """On resume: drop the log rows of iterations from iter_num on (they will be redone). A row
    it cannot read (bad bytes, not JSON, no numeric "iter": an edit, or a last line a crash cut
    short) is moved to log_path + ".unreadable" and named in the note it returns (else None). The
    log is replaced in one step, so a crash now cannot lose it."""
    if not os.path.exists(log_path):
        return None
    rows, bad = [], []
    with open(log_path, "rb") as f:
        for number, line in enumerate(f, 1):
            try:
                if json.loads(line)["iter"] < iter_num:
                    rows.append(line.rstrip(b"\n") + b"\n")
            # UnicodeDecodeError is a ValueError
            except (ValueError, KeyError, TypeError, IndexError):
                if line.strip():
                    bad.append((number, line.rstrip(b"\n") + b"\n"))
    if bad:
        with open(log_path + ".unreadable", "ab") as f:
            f.writelines(line for _, line in bad)
    with open(log_path + ".tmp", "wb") as f:
        f.writelines(rows)
    os.replace(log_path + ".tmp", log_path)
    return bad and (f"note: {log_path}: line(s) {', '.join(str(n) for n, _ in bad)} are not log "
                    f"rows (bad bytes, not "
                    f"JSON, or no iteration); moved to {log_path}.unreadable")


def start_log(log_path):
    """A new run's empty log. A log already there is from a run that saved no checkpoint
    (prepare_out_dir refused any other): it is kept as log_path.old (.old1, ...), and the note
    saying so returned (else None)."""
    kept = None
    if os.path.exists(log_path):
        kept = next(p for i in range(10**6) if not os.path.exists(p := log_path + ".old" + (str(i) if i else "")))
        os.replace(log_path, kept)
    open(log_path, "w").close()
    return kept and f"note: {log_path} was left by a run that saved no checkpoint; kept as {kept}"


def disk_problem(out_dir, n_params):
    """Why out_dir cannot hold this model's checkpoints (weights + two AdamW moments in fp32,
    twice while a new checkpoint replaces the old one), or None."""
    need_bytes, free = n_params * 4 * 3 * 2, shutil.disk_usage(out_dir).free
    if free < need_bytes:
        return (f"{out_dir} has {free / 1e6:,.0f} MB free but checkpoints of this "
                f"{n_params / 1e6:,.1f}M-parameter "
                f"model need about {need_bytes / 1e6:,.0f} MB; free some space or choose another --out_dir")
    return None
