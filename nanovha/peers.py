"""
When one process of a DDP job dies or hangs, the others stop within seconds with one line that
names it, not a hang until the collective's timeout nor a wall of tracebacks. train.py calls,
after init_process_group:

    watch = PeerWatch(rank, world_size, report)   # report(what, ckpt_iter, store_ok) -> the one line to print
    watch.checkpoint_written(it)                  # after each save: a survivor can name it if rank 0 dies

The survivors learn of a death from a collective that fails (a broken connection, or the process
group's timeout for a hung peer) or from torchrun's SIGTERM (its agent stops the job when one of
its processes dies); which rank it was, from a roll call in the c10d store (torchrun's agent
hosts it, so it outlives any rank). Every process answers the roll call from a thread, which runs
even while its main thread is stuck in a collective: the ranks that do not answer within
ROLL_CALL_S are the dead (or hung) ones. When all answer, the failure is this process's own (a
bug, out of memory) and it keeps its traceback.
"""
import os
import signal
import sys
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

ROLL_CALL_S = 5  # a live process answers in milliseconds


def start_ddp(device, gradient_accumulation_steps, timeout_seconds):
    """Joins the process group torchrun launched (nccl on GPUs, gloo on CPU); one GPU per local
    rank. Returns (rank, local_rank, world_size, device); raises ValueError for a launch that
    cannot work."""
    rank, local_rank, world_size = (int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]),
                                    int(os.environ["WORLD_SIZE"]))
    if gradient_accumulation_steps % world_size:
        raise ValueError(f"gradient_accumulation_steps={gradient_accumulation_steps} must be a multiple of the "
                         f"{world_size} processes (it is the global number of micro-steps)")
    cuda = device.startswith("cuda")
    if cuda:
        gpus = torch.cuda.device_count()
        if local_rank >= gpus:
            raise ValueError(f"{local_rank + 1}+ processes on this node but only {gpus} GPUs; "
                             f"use --nproc_per_node={gpus}")
        device = f"cuda:{local_rank}"
        torch.cuda.set_device(device)
    dist.init_process_group(backend="nccl" if cuda else "gloo", timeout=timedelta(seconds=timeout_seconds))
    return rank, local_rank, world_size, device



class Stopped(Exception):
    """torchrun's SIGTERM: it stops the job, usually because another of its processes died."""


class PeerWatch:
    def __init__(self, rank, world_size, report):
        self.rank, self.world_size, self.report = rank, world_size, report
        # a torchrun restart starts a new roll call
        tag = f"nanovha/{os.environ.get('TORCHELASTIC_RESTART_COUNT', 0)}/"
        connect = lambda: dist.PrefixStore(tag, dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                                                              is_master=False, timeout=timedelta(seconds=10)))
        # two connections: the answering thread blocks on its own
        self.store, answers = connect(), connect()

        def answer_roll_call():
            try:
                answers.wait(["roll_call"], timedelta(days=365))
                answers.set(f"alive/{rank}", "")
            except Exception:  # the store is gone: the job is over
                pass

        threading.Thread(target=answer_roll_call, daemon=True).start()
        signal.signal(signal.SIGTERM, self.on_sigterm)
        sys.excepthook = self.on_failure

    def checkpoint_written(self, it):
        self.store.set("ckpt_iter", str(it))

    def on_sigterm(self, *_):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise Stopped

    def roll_call(self):
        """-> (the ranks that did not answer, the last checkpoint's iteration or None, whether this process reports).
        """
        self.store.set("roll_call", "")
        keys, deadline = [f"alive/{r}" for r in range(self.world_size)], time.time() + ROLL_CALL_S
        while not self.store.check(keys) and time.time() < deadline:
            time.sleep(0.05)
        gone = [r for r, k in enumerate(keys) if not self.store.check([k])]
        ckpt_iter = int(self.store.get("ckpt_iter")) if self.store.check(["ckpt_iter"]) else None
        # one process reports, the others stay quiet
        return gone, ckpt_iter, self.store.add("reported", 1) == 1

    def on_failure(self, kind, e, tb):
        if not issubclass(kind, Exception):
            return sys.__excepthook__(kind, e, tb)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # torchrun's SIGTERM to the survivors: this is the stopping
        try:
            (gone, ckpt_iter, first), store_ok = self.roll_call(), True
        except Exception:  # the store is gone too (its host, torchrun's agent on the first node, ended)
            gone, ckpt_iter, first, store_ok = None, None, True, False
        if first and gone == [] and kind is not Stopped:  # everyone is alive: the error is this process's own
            sys.__excepthook__(kind, e, tb)
        elif first:
            what = ("torchrun or the job scheduler stopped the job (SIGTERM)" if gone == [] else
                    "another process of this job died (which one is unknown: the c10d store is gone too)"
                    if gone is None else
                    f"process rank{'s' * (len(gone) > 1)} {', '.join(map(str, gone))} of this job died (or hangs)")
            print(self.report(what, ckpt_iter, store_ok), file=sys.stderr)
        sys.stdout.flush(), sys.stderr.flush()
        os._exit(1)  # now: the process group's teardown could wait on the dead peer
