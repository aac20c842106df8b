"""
What a command may write, checked before it writes anything: no output is one of its inputs (or inside an input
folder), an output folder holding another run is refused, every output folder is writable, and one process at a time
writes an out_dir (an exclusive lock the kernel releases when the process dies, so a killed run never leaves a stale
one).

    stop_if(clobber_problem({"--export_gguf": path}, {"--out_dir/ckpt.pt": src}))
    stop_if(run_folder_problem(export_dir))
    lock = hold(out_dir)   # until lock.close() or the process ends; a second process: one line with our pid
"""
import contextlib
import fcntl
import os

RUN_FILES = ("ckpt.pt", "log.jsonl")  # what makes a folder a run: train.py's checkpoint and log


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


def run_folder_problem(folder):
    """Why writing into folder would touch another run's files (its checkpoint or log), or None."""
    theirs = [n for n in RUN_FILES if os.path.exists(os.path.join(folder, n))] if os.path.isdir(folder) else []
    return f"{folder} holds another run ({', '.join(theirs)}); choose a new folder" if theirs else None


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


class Busy(ValueError):
    """A folder another process is writing, or that cannot be written at all."""


def hold(folder):
    """An exclusive lock on folder (created if missing) for as long as the returned handle stays open (at most this
    process's life): flock on the folder itself, so no file is left behind. Raises Busy naming the process that
    holds it."""
    created = not os.path.isdir(folder)
    try:
        os.makedirs(folder, exist_ok=True)
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as e:
        raise Busy(f"{folder} is not writable ({e.strerror}); choose another folder") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = lock_holder(fd)
        os.close(fd)
        raise Busy(f"{folder} is being written by another process (pid {holder}); wait for it to finish, "
                   f"or choose another folder") from None
    return Held(fd, folder if created else None)


@contextlib.contextmanager
def holding(folder):
    """hold(folder) for a with-block: released however the block ends (sys.exit included)."""
    lock = hold(folder)
    try:
        yield lock
    finally:
        lock.close()


class Held:
    """An open, locked folder; close() (or the process ending) releases it, and removes the folder if hold created
    it and nothing was written there (a refused run leaves no trace)."""
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
    """The pid holding a flock on the file or folder open as fd, from /proc/locks ("unknown" where there is none).
    A line reads `1: FLOCK ADVISORY WRITE <pid> <major>:<minor>:<inode> 0 EOF`."""
    inode = str(os.fstat(fd).st_ino)
    try:
        with open("/proc/locks") as f:
            for parts in map(str.split, f):
                if "FLOCK" in parts and "->" not in parts:
                    i = parts.index("FLOCK")
                    if parts[i + 4].split(":")[-1] == inode:
                        return parts[i + 3]
    except (OSError, IndexError):
        pass
    return "unknown"
