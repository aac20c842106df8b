"""
Any UTF-8 text of your own -> train.bin, val.bin, meta.pkl.
Files are joined with a blank line in the order given; the first 90% of the text is train.

python data/text/prepare.py --input a.txt [b.txt ...] --out_dir data/mytext --tokenizer char|gpt2
"""
import argparse, os, sys
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from data.common import prepare_text


def main():
    parser = argparse.ArgumentParser(description="UTF-8 text files -> train.bin/val.bin/meta.pkl")
    parser.add_argument("--input", nargs="+", required=True, help="UTF-8 text file(s)")
    parser.add_argument("--out_dir", required=True, help="folder for the dataset, e.g. data/mytext")
    parser.add_argument("--tokenizer", choices=["char", "gpt2"], default="char",
                        help="char: one token per character (small text); gpt2: GPT-2 BPE (more text)")
    args = parser.parse_args()
    prepare_text(args.input, args.out_dir, args.tokenizer)


if __name__ == "__main__":
    main()
