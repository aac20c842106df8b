"""
A child process under a time limit, stopped with every process it started when the limit passes
(the C++ kernel's build, each step of the GPU check): nothing it spawned is left behind.

    status, output = run_limited([sys.executable, "build.py"], seconds=90)   # TimeoutExpired past it
"""
import glob
import os
import signal
import subprocess


def run_limited(command, seconds, output=subprocess.PIPE, **popen):
    """Runs command -> (its exit status, its stdout + stderr; "" where output is a file); after
    `seconds` it is killed with every process it started (ninja puts each compiler in a process
    group of its own, so a group kill would miss them) and subprocess.TimeoutExpired raised."""
    proc = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, text=True, **popen)
    try:
        out = proc.communicate(timeout=seconds)[0]
        return proc.returncode, out or ""
    except subprocess.TimeoutExpired:
        for pid in [proc.pid, *descendants(proc.pid)]:  # all found before any is killed and re-parented
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        proc.communicate()
        raise


def descendants(pid):
    """The pids of every process below pid (Linux: the parent is field 4 of /proc/<pid>/stat)."""
    parent = {}
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as f:
                parent[int(stat.split("/")[2])] = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    found, frontier = [], [pid]
    while frontier:
        children = [p for p, pp in parent.items() if pp in frontier]
        found, frontier = found + children, children
    return found
