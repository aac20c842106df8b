"""
What a command may write, checked before it writes anything, the one guard every command uses.
Every path is resolved (symlinks, `..`) first; then no output is one of its inputs (or inside an
input folder), nor another output, nor lands in another run's folder; every output folder is a
writable folder. One rule for what is already there: **a write replaces only a file (or folder)
of ours of the same kind** (a checkpoint by a checkpoint, a figure by a figure, an export by an
export), never anything else, whatever the flags; an export of ours is replaced only with
--overwrite=True. One process at a time writes a folder (an exclusive lock the kernel releases
when the process dies, so a killed run never leaves a stale one); a training run holds its data
folder shared, so no prepare replaces it.

    stop_if(output_problem({"--export_gguf": path}, {"--ckpt_name": src}, own=[out_dir],
                           kinds={"--export_gguf": "gguf"}, exports=["--export_gguf"]))
    lock = hold(out_dir)   # until lock.close() or the process ends; a second process: one line with our pid
    with staged(export_hf) as tmp: write_files(tmp)   # a multi-file export appears whole, or not at all
    with written_whole(path) as tmp: torch.save(obj, tmp)   # one file: the same
    save_figure(fig, path)   # a PNG marked as ours, so a later run may replace it
"""
import atexit
import contextlib
import fcntl
import json
import os
import shutil
import tempfile
import zipfile

RUN_FILES = ("ckpt.pt", "log.jsonl")  # what makes a folder a run: train.py's checkpoint and log
# what makes a folder a prepared dataset
DATA_FILES = ("train.bin", "val.bin", "meta.pkl", "val.npz")
# what makes a file or folder ours, by kind: the only things a write of that kind may replace
MARK = "nanoVHA"  # the Software text of every PNG we save, and GGUF_KEY's value in every GGUF we export
GGUF_KEY = "nanovha.written_by"
EXPORT_RECORD = "nanovha_export.json"  # in an export folder: the names of the files we wrote there
KINDS = {"checkpoint": "a nanoVHA checkpoint", "figure": "a PNG figure nanoVHA saved",
         "gguf": "a GGUF file nanoVHA exported", "hf": "a Hugging Face export folder nanoVHA wrote",
         "items": "a file of multiple-choice items nanoVHA wrote", "figures": "a JSON-lines file of figures"}
FOLDER_KINDS = ("hf",)


def resolved(path):
    return os.path.realpath(os.path.abspath(os.path.expanduser(path)))


def inside(path, folder):
    """Whether path is folder or lies under it (both resolved)."""
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def clobber_problem(outputs, inputs):
    """outputs, inputs: {what (the flag that names it): path}. The first output that would write
    over an input (the same file through any link, a path inside an input folder, or a folder
    holding an input), as one line, or None."""
    for out_name, out_path in outputs.items():
        if not out_path:
            continue
        out = resolved(out_path)
        for in_name, in_path in inputs.items():
            if not in_path:
                continue
            src = resolved(in_path)
            if inside(out, src) or (os.path.isdir(out_path) and inside(src, out)) or same_file(out, src):
                return (f"{out_name}={out_path} would write over {in_name}={in_path}, an input of this command; "
                        f"write elsewhere")
    return None


def same_file(a, b):
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def output_problem(outputs, inputs, own=(), kinds=None, exports=(), overwrite=False):
    """The one check of a command's outputs ({flag: path}, files or folders; a false path is
    skipped) before any work, as one line, or None: no output is an input (clobber_problem) or
    overlaps another output; none lands in a folder holding another run than `own` (this
    command's run folders); what is at an output's path is replaced only if it is ours of the
    kind `kinds` names for its flag (replace_problem), an export (`exports`) only with overwrite;
    every output's folder is a writable folder."""
    named = {flag: path for flag, path in outputs.items() if path}
    mine = {resolved(folder) for folder in own if folder}
    pairs = [(a, b) for a in named for b in named if a != b]
    kinds = {flag: kind for flag, kind in (kinds or {}).items() if flag in named}
    return (clobber_problem(named, inputs)
            or next((f"{a}={named[a]} and {b}={named[b]} are the same path, or one holds the "
                     f"other; write them apart"
                     for a, b in pairs if inside(resolved(named[a]), resolved(named[b]))), None)
            or next((p for flag, path in named.items() if (p := foreign_run_problem(path, flag, mine))), None)
            or next((p for flag, kind in kinds.items()
                     if (p := replace_problem(named[flag], flag, kind, overwrite if flag in exports else None))),
                    None)
            or next((p for flag, path in named.items() if (p := folder_problem(parent(path), flag))), None))


def figure_problem(path, flag, inputs=None):
    """output_problem for a PNG figure a command saves at its end, checked before the work: a
    .png path whose folder exists."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path) or not path.lower().endswith(".png"):
        return f"{flag}={path}: a figure is a .png file path (e.g. {flag}=decode.png)"
    if not os.path.isdir(folder):
        return f"{flag}={path}: the folder {folder} does not exist; create it or choose another path"
    return output_problem({flag: path}, inputs or {}, kinds={flag: "figure"})


def parent(path):
    """The folder an output path writes in: itself if it is a folder, else the one holding it."""
    return path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))


def foreign_run_problem(path, flag, mine):
    """Why writing path would touch another run (a file in, or a folder that is, a folder holding
    ckpt.pt or log.jsonl that is not one of `mine`), or None."""
    folder = resolved(parent(path))
    theirs = [n for n in RUN_FILES if os.path.exists(os.path.join(folder, n))]
    if theirs and folder not in mine:
        return (f"{flag}={path} would write into {folder}, another run's folder "
                f"({', '.join(theirs)}); "
                f"write elsewhere")
    return None


def is_ours(path, kind):
    """Whether path is a `kind` we wrote (KINDS): a checkpoint is a torch.save zip whose pickle
    names model_args; a figure a PNG whose Software text is MARK; a GGUF carries GGUF_KEY in its
    header; an items file is JSON lines of context, choices and label; an export folder holds
    EXPORT_RECORD and only the files it names."""
    try:
        if kind == "checkpoint":
            with zipfile.ZipFile(path) as z:
                pickles = [n for n in z.namelist() if n.endswith("/data.pkl")]
                return len(pickles) == 1 and b"model_args" in z.read(pickles[0])
        if kind == "figure":
            return png_text(path).get("Software") == MARK
        if kind == "gguf":
            with open(path, "rb") as f:
                head = f.read(1 << 16)  # the key is written right after the architecture
            return head[:4] == b"GGUF" and GGUF_KEY.encode() in head
        if kind in ("items", "figures"):  # JSON lines; items: {"context", "choices", "label", ...}
            with open(path, encoding="utf-8") as f:
                item = json.loads(f.readline())
            return isinstance(item, dict) and (kind == "figures" or {"context", "choices", "label"} <= set(item))
        return not foreign_entries(path)
    except (OSError, ValueError, zipfile.BadZipFile):
        return False


def foreign_entries(folder):
    """The entries of an output folder that EXPORT_RECORD does not name (all, without one)."""
    try:
        with open(os.path.join(folder, EXPORT_RECORD)) as f:
            ours = set(json.load(f)["files"]) | {EXPORT_RECORD}
    except (OSError, ValueError, KeyError, TypeError):
        ours = set()
    return sorted(set(os.listdir(folder)) - ours)


def png_text(path):
    """The tEXt entries of a PNG file ({} for anything else); they come before the pixels."""
    text = {}
    with open(path, "rb") as f:
        if f.read(8) != b"\x89PNG\r\n\x1a\n":
            return text
        while len(head := f.read(8)) == 8 and head[4:] != b"IDAT":
            data = f.read(int.from_bytes(head[:4], "big"))
            f.read(4)  # the chunk's CRC
            if head[4:] == b"tEXt":
                key, _, value = data.partition(b"\0")
                text[key.decode("latin-1")] = value.decode("latin-1")
    return text


def replace_problem(path, flag, kind, overwrite=None):
    """Why writing a `kind` at path would replace what is there, or None (nothing there, an empty
    folder, or one of ours it may replace). Anything not ours is refused whatever the flags; one
    of ours needs overwrite=True where overwrite is not None (an export), and is replaced freely
    where it is None (a command's own checkpoint or figure, written again)."""
    folder = kind in FOLDER_KINDS
    if folder and inside(resolved(os.getcwd()), resolved(path)):
        return f"{flag}={path} is the current folder or holds it; run from elsewhere or choose another {flag}"
    if not os.path.lexists(path) or (folder and os.path.isdir(path) and not os.listdir(path)):
        return None
    if os.path.isdir(path) != folder:
        return f"{flag}={path} is a {'file' if folder else 'folder'}; give {'a folder' if folder else 'a file'}"
    if not is_ours(path, kind):
        held = f" (it holds {', '.join(foreign_entries(path)[:3])})" if folder else ""
        return (f"{flag}={path} is not {KINDS[kind]}{held}: nothing replaces it, whatever the flags; "
                f"choose another {flag}")
    if overwrite is False:
        return f"{flag}={path} is {KINDS[kind]}; pass --overwrite=True to replace it, or choose another {flag}"
    return None


def record_export(folder, names):
    """Writes EXPORT_RECORD into an export folder: what makes it ours (replace_problem)."""
    with open(os.path.join(folder, EXPORT_RECORD), "w") as f:
        json.dump({"files": sorted(names)}, f)


def append_line(path, row):
    """One JSON line appended to path and flushed: a process killed a moment later keeps it."""
    with open(path, "a") as f:
        f.write(json.dumps(row, default=str) + "\n")


def save_figure(fig, path, dpi=100):
    """A matplotlib figure saved as a PNG marked as ours (figure_problem lets a later run replace it)."""
    fig.savefig(path, dpi=dpi, format="png", metadata={"Software": MARK})


def file_name_problem(name, flag="--out_name"):
    """Why name is not a plain file name (it is written inside out_dir: no folder, no '..'), or
    None."""
    if not name or name in (".", "..") or os.path.basename(name) != name or os.sep in name:
        return f"{flag}={name!r} must be a plain file name (it is written inside --out_dir): no folder, no '..'"
    return None


def folder_problem(folder, flag):
    """Why folder cannot be an output folder (a file, a dangling symlink, not writable), or None.
    Nothing is created."""
    return not_a_folder_problem(folder, flag) or writable_problem(folder, flag)


def not_a_folder_problem(folder, flag):
    """Why folder is no folder and cannot become one (a file, a dangling symlink), or None."""
    if os.path.islink(folder) and not os.path.exists(folder):
        return (f"{flag}={folder} is a symlink to {os.readlink(folder)}, which does not exist; remove the link or "
                f"choose another {flag}")
    if os.path.exists(folder) and not os.path.isdir(folder):
        return f"{flag}={folder} is a file, not a folder; choose another {flag}"
    return None


def dataset_problem(out_dir, inputs, overwrite):
    """For data/*/prepare.py, under the folder's lock: why it may not write a dataset into
    out_dir (an input inside it, a dataset there already without overwrite, another run's
    folder), or None. inputs: (flag, path) pairs."""
    folder = resolved(out_dir)
    there = [n for n in DATA_FILES if os.path.exists(os.path.join(folder, n))]
    for flag, path in inputs:
        if path and inside(resolved(path), folder):
            return f"{flag}={path} lies inside --out_dir={out_dir}, which prepare writes; move it out or choose another"
    if there and not overwrite:
        return (f"--out_dir={out_dir} already holds a dataset ({', '.join(there)}); pass "
                f"--overwrite=True to replace "
                f"it, or choose another --out_dir")
    return foreign_run_problem(out_dir, "--out_dir", set())


@contextlib.contextmanager
def preparing(out_dir, inputs=(), overwrite=False):
    """A prepare script's with-block: the folder's lock (no second prepare, no training run
    reading it), then dataset_problem; a refusal raises SystemExit with one line, and a folder
    this created is removed again."""
    if problem := folder_problem(out_dir, "--out_dir"):
        raise SystemExit(f"error: {problem}")
    try:
        lock = hold(out_dir)
    except Busy as e:
        raise SystemExit(f"error: {e}") from None
    try:
        if problem := dataset_problem(out_dir, inputs, overwrite):
            raise SystemExit(f"error: {problem}")
        yield
    finally:
        lock.close()


def umask():
    """This process's umask, which the files we write follow, as other tools' do."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def written_whole(path):
    """A temp file's path beside path (its folder made), fsynced and renamed onto path when the
    block ends without error, removed otherwise: a crash mid-write leaves the old file whole."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    name = os.path.basename(path)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp_" + name, suffix=os.path.splitext(name)[1])
    os.close(fd)
    os.chmod(tmp, 0o666 & ~umask())  # mkstemp's 0600 would keep a shared cache from its other users
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


@contextlib.contextmanager
def staged(target):
    """A fresh folder beside target for a multi-file output: renamed into place when the block
    ends without error (an old target, which output_problem let through with --overwrite, is
    replaced only then), removed otherwise."""
    where = os.path.dirname(os.path.abspath(target))
    os.makedirs(where, exist_ok=True)
    staging = tempfile.mkdtemp(dir=where, prefix=f".staging_{os.path.basename(os.path.abspath(target))}_")
    os.chmod(staging, 0o777 & ~umask())  # as a folder made by mkdir
    try:
        yield staging
        old = staging + ".old" if os.path.lexists(target) else None
        if old:
            # a rename: the old export stays whole until the new one is in place
            os.replace(target, old)
        os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if old:
        shutil.rmtree(old) if os.path.isdir(old) and not os.path.islink(old) else os.remove(old)


def run_folder_problem(folder):
    """Why writing into folder would touch another run's files (its checkpoint or log), or None."""
    theirs = [n for n in RUN_FILES if os.path.exists(os.path.join(folder, n))] if os.path.isdir(folder) else []
    return f"{folder} holds another run ({', '.join(theirs)}); choose a new folder" if theirs else None


def writable_problem(folder, flag):
    """Why folder (or, if it does not exist yet, the nearest folder above it that does) cannot be
    written, or None. Nothing is created."""
    probe = resolved(folder)
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        return f"{flag}={folder}: {probe} is a file, not a folder; choose another {flag}"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"{flag}={folder}: {probe} is not writable; choose another {flag}"
    return None


class Busy(ValueError):
    """A folder another process is writing, or that cannot be written at all."""


def hold(folder, shared=False, flag="--out_dir"):
    """A lock on folder (created if missing) for as long as the returned handle stays open (at
    most this process's life): flock on the folder itself, so no file is left behind. Exclusive
    (a writer), or shared (a reader: a training run's data folder, which no prepare may replace
    meanwhile). Raises Busy naming the process that holds it. When the process ends (sys.exit
    included) a folder it created and left empty is removed: a refused run leaves no trace."""
    # a reader may read a read-only folder
    if not shared and (problem := folder_problem(folder, flag)):
        raise Busy(problem)
    created = not os.path.isdir(folder)
    try:
        os.makedirs(folder, exist_ok=True)
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as e:
        raise Busy(f"{folder} is not writable ({e.strerror}); choose another folder") from None
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except BlockingIOError:
        holder, kind = lock_holder(fd)
        os.close(fd)
        doing = "read by a training run" if kind == "READ" else "written by another process"
        raise Busy(f"{folder} is being {doing} (pid {holder}); wait for it to finish, "
                   f"or choose another folder") from None
    held = Held(fd, folder if created else None)
    atexit.register(held.close)
    return held


@contextlib.contextmanager
def holding(folder):
    """hold(folder) for a with-block: released however the block ends (sys.exit included)."""
    lock = hold(folder)
    try:
        yield lock
    finally:
        lock.close()


class Held:
    """An open, locked folder; close() (or the process ending) releases it, and removes the
    folder if hold created it and nothing was written there (a refused run leaves no trace)."""
    def __init__(self, fd, created=None):
        self.fd, self.created = fd, created

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
            if self.created:
                try:
                    os.rmdir(self.created)  # only if empty
                except OSError:
                    pass


def lock_holder(fd):
    """(the pid, READ or WRITE) of a flock on the file or folder open as fd, from /proc/locks
    ("unknown" where there is none). A line reads `1: FLOCK ADVISORY WRITE <pid>
    <major>:<minor>:<inode> 0 EOF`."""
    inode = str(os.fstat(fd).st_ino)
    try:
        with open("/proc/locks") as f:
            for parts in map(str.split, f):
                if "FLOCK" in parts and "->" not in parts:
                    i = parts.index("FLOCK")
                    if parts[i + 4].split(":")[-1] == inode:
                        return parts[i + 3], parts[i + 2]
    except (OSError, IndexError):
        pass
    return "unknown", "WRITE"
