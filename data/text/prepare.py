"""
Any UTF-8 text of your own -> train.bin, val.bin, meta.pkl. Files are joined with a blank line in
the order given; the first 90% of the text is train.

python data/text/prepare.py --input a.txt [b.txt ...] --out_dir data/mytext --tokenizer char|gpt2
python data/text/prepare.py --input a.txt --out_dir data/mytext_qwen3 --tokenizer hf --hf_tokenizer Qwen3-0.6B
(hf: the tokenizer of a Hugging Face model folder, offline; ids above 65,535 are written as
uint32) Flags by argparse: data/ imports only data/ and the one output guard,
nanovha/outputs.py (CONTRIBUTING.md).
"""
import argparse, os, sys
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from data.common import add_overwrite, prepare_text
from nanovha.outputs import preparing


def main():
    parser = argparse.ArgumentParser(description="UTF-8 text files -> train.bin/val.bin/meta.pkl")
    parser.add_argument("--input", nargs="+", required=True, help="UTF-8 text file(s)")
    parser.add_argument("--out_dir", required=True, help="folder for the dataset, e.g. data/mytext")
    parser.add_argument("--tokenizer", choices=["char", "gpt2", "hf"], default="char",
                        help="char: one token per character (small text); gpt2: GPT-2 BPE (more text); "
                             "hf: --hf_tokenizer's")
    parser.add_argument("--hf_tokenizer", default="",
                        help="with --tokenizer=hf: a Hugging Face model folder (tokenizer.json), "
                             "the one the model to train was imported from")
    add_overwrite(parser)
    args = parser.parse_args()
    inputs = [("--input", p) for p in args.input] + [("--hf_tokenizer", args.hf_tokenizer)]
    # one writer; no input inside, no dataset replaced unasked
    with preparing(args.out_dir, inputs, args.overwrite):
        prepare_text(args.input, args.out_dir, args.tokenizer, args.hf_tokenizer)


if __name__ == "__main__":
    main()
