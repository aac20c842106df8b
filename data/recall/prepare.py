"""
A synthetic recall dataset (see tasks.py): writes meta.pkl (the task spec) and val.npz (held-out
rows). Training rows are not stored: train.py generates each batch from the spec and its (seed,
iter, micro-step) stream, at the difficulty its curriculum has reached, so there is no file to
outgrow and resume stays exact.

python data/recall/prepare.py [--task mqar] [--n_pairs 16 --n_keys 128 --gap 0 ...] [--n_val 512] [--out_dir DIR]
Flags by argparse: data/ imports only data/ and the one output guard,
nanovha/outputs.py (CONTRIBUTING.md).
"""
import argparse, os, pickle, sys
import numpy as np
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from data.common import add_overwrite
from data.recall import tasks
from nanovha.outputs import preparing


def main():
    parser = argparse.ArgumentParser(description="token-level recall rows -> meta.pkl + val.npz")
    parser.add_argument("--out_dir", default=os.path.dirname(os.path.abspath(__file__)))
    parser.add_argument("--task", default="mqar", choices=tasks.TASKS)
    parser.add_argument("--n_val", type=int, default=512, help="held-out rows at full difficulty")
    knobs = sorted({k for d in tasks.DEFAULTS.values() for k in d})
    for k in knobs:
        parser.add_argument(f"--{k}", type=int,
                            help="default: " + ", ".join(f"{t} {'as gap' if d[k] is None else d[k]}"
                                                         for t, d in tasks.DEFAULTS.items() if k in d))
    add_overwrite(parser)
    args = parser.parse_args()
    given = {k: getattr(args, k) for k in knobs if getattr(args, k) is not None}
    try:
        spec = tasks.make_spec(args.task, **given)
    except ValueError as e:
        sys.exit(f"error: {e}")
    if args.n_val < 1:
        sys.exit("error: --n_val must be >= 1")
    x, y = tasks.eval_rows(spec, args.n_val)
    meta = tasks.meta(spec, args.n_val)
    # one writer; no dataset replaced unasked
    with preparing(args.out_dir, overwrite=args.overwrite):
        for name, write in (("val.npz", lambda f: np.savez(f, x=x.astype(np.int32), y=y.astype(np.int32))),
                            # meta last: its presence means complete
                            ("meta.pkl", lambda f: pickle.dump(meta, f))):
            tmp = os.path.join(args.out_dir, f".{name}.tmp{os.getpid()}")
            with open(tmp, "wb") as f:
                write(f)
            os.replace(tmp, os.path.join(args.out_dir, name))
    print(f"{meta['source']}: vocab {meta['vocab_size']}, rows of {meta['row_length']} tokens, "
          f"{args.n_val} held-out rows; wrote {args.out_dir}")


if __name__ == "__main__":
    main()
