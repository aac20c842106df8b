"""
Synthetic recall tasks (mqar, variable tracking, passkey; see tasks.py), char-level, generated here.
Writes train.bin, val.bin, meta.pkl next to this file (or to --out_dir).

python data/recall/prepare.py [--out_dir DIR] [--max_len 256] [--train_chars 3000000]

Training text mixes the three tasks at lengths up to --max_len (use the training block_size);
the eval set (ablate.py eval) comes from its own seed stream and is excluded from training.
"""
import argparse, os, sys
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from data.common import write_split
from data.recall import tasks


def main():
    parser = argparse.ArgumentParser(description="recall tasks, char-level -> train.bin/val.bin/meta.pkl")
    parser.add_argument("--out_dir", default=os.path.dirname(os.path.abspath(__file__)))
    parser.add_argument("--max_len", type=int, default=256, help="longest example (the training block_size)")
    parser.add_argument("--train_chars", type=int, default=3_000_000)
    parser.add_argument("--val_chars", type=int, default=200_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    longest_min = max(tasks.MIN_LENGTH.values())
    if args.max_len < longest_min or args.train_chars < 1 or args.val_chars < 1:
        sys.exit(f"error: need --max_len >= {longest_min} (the longest task minimum) and positive --train_chars/--val_chars")
    held_out = tasks.held_out_texts(args.max_len)
    train = tasks.text_stream(args.train_chars, args.max_len, args.seed, "train", exclude=held_out)
    val = tasks.text_stream(args.val_chars, args.max_len, args.seed, "val", exclude=held_out)
    source = f"recall tasks {', '.join(tasks.TASKS)}; lengths up to {args.max_len}; seed {args.seed}"
    meta = write_split(tasks.encode(train), tasks.encode(val), args.out_dir,
                       dict(tasks.meta(), source=source, max_len=args.max_len))
    print(f"{source}: vocab size {meta['vocab_size']} (char)")
    print(f"train has {meta['train_tokens']:,} tokens, val has {meta['val_tokens']:,} tokens; wrote {args.out_dir}")


if __name__ == "__main__":
    main()
