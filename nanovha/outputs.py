"""
What a command may write, checked before it writes anything: no output is one of its inputs (or inside an input
folder), an output folder holding another run is refused unless this is that run resuming or --overwrite=True was
given, every output folder is writable, and one process at a time writes an out_dir (an exclusive lock the kernel
releases when the process dies, so a killed run never leaves a stale one).

    stop_if(clobber_problem({"--export_gguf": path}, {"--out_dir/ckpt.pt": src}))
    stop_if(run_folder_problem(out_dir, overwrite))
    lock = hold(out_dir)   # kept until the process exits; a second process gets one line naming the first's pid
"""
import fcntl
import os

RUN_FILES = ("ckpt.pt", "log.jsonl")  # what makes a folder a run: train.py's checkpoint and log
LOCK = ".lock"


def resolved(path):
    return os.path.realpath(os.path.abspath(os.path.expanduser(path)))


def inside(path, folder):
    """Whether path is folder or lies under it (both resolved)."""
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def clobber_problem(outputs, inputs):
    """outputs, inputs: {what (the flag that names it): path}. The first output that would write over an input (the
    same file through any link, a path inside an input folder, or a folder holding an input), as one line, or None."""
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


def run_folder_problem(folder, overwrite=False, allow=()):
    """Why writing into folder would touch another run's files (its checkpoint or log, other than the names in allow),
    or None; --overwrite=True takes the responsibility."""
    if overwrite or not os.path.isdir(folder):
        return None
    theirs = [n for n in RUN_FILES if n not in allow and os.path.exists(os.path.join(folder, n))]
    if theirs:
        return (f"{folder} holds another run ({', '.join(theirs)}); choose a new folder, or pass --overwrite=True to "
                f"replace what this command writes there")
    return None


def writable_problem(folder, flag):
    """Why folder (or, if it does not exist yet, the nearest folder above it that does) cannot be written, or None.
    Nothing is created."""
    probe = resolved(folder)
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        return f"{flag}={folder}: {probe} is a file, not a folder; choose another {flag}"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"{flag}={folder}: {probe} is not writable; choose another {flag}"
    return None


def hold(folder):
    """An exclusive lock on folder (created if missing) for the rest of this process: the open lock file, to keep.
    Raises ValueError naming the process that holds it."""
    os.makedirs(folder, exist_ok=True)
    f = open(os.path.join(folder, LOCK), "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "unknown"
        f.close()
        raise ValueError(f"{folder} is being written by another process (pid {holder}); wait for it to finish, "
                         f"or choose another folder") from None
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()}\n")
    f.flush()
    return f
