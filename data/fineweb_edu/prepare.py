"""
FineWeb-Edu (HuggingFaceFW/fineweb-edu, "sample-10BT") with the GPT-2 BPE tokenizer (uint16
bins), or with the tokenizer of a Hugging Face model folder (--tokenizer=hf
--hf_tokenizer=FOLDER, e.g. Qwen3's: uint32 bins), for GPU runs. Needs network access to the
Hugging Face hub and `pip install datasets`. Documents are streamed, so nothing is held in
memory: each one becomes its tokens plus
<|endoftext|> (hf: <|endoftext|> if the tokenizer has it, else its eos), the first ~99% of the tokens go to train.bin,
the last documents to val.bin. Batches of documents are tokenized in parallel (--num_threads,
default one per core); the bar shows tokens/s. Everything is written to temp files renamed into
place at the end, so an interrupted run leaves no corrupt dataset behind: run it again and it
starts over.

python data/fineweb_edu/prepare.py [--num_tokens 100000000] [--out_dir DIR]
python data/fineweb_edu/prepare.py --tokenizer=hf --hf_tokenizer=Qwen3-0.6B --num_tokens=600000000
    --out_dir=data/fineweb_edu_qwen3
(100M tokens is about 200 MB on disk; config/fineweb/*.py want --num_tokens 2600000000, about 5.2
GB) Flags by argparse: data/ imports only data/ and the one output guard,
nanovha/outputs.py (CONTRIBUTING.md).
"""
import argparse, os, sys
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from data.common import HFEncoding, add_overwrite, doc_pieces, gpt2_encoding, gpt2_meta, write_bins
from nanovha.outputs import preparing


def with_progress(pieces, total):
    """Pass (split, ids) chunks through, showing tokens done on a progress bar."""
    from tqdm import tqdm
    bar = tqdm(total=total, unit="tok", unit_scale=True)  # shows tokens/s
    for split, ids in pieces:
        bar.update(len(ids))
        yield split, ids
    bar.close()


def main():
    parser = argparse.ArgumentParser(description="FineWeb-Edu sample-10BT, GPT-2 BPE or a Hugging Face tokenizer "
                                                 "-> train.bin/val.bin/meta.pkl")
    parser.add_argument("--num_tokens", type=int, default=100_000_000, help="total tokens to write (train + val)")
    parser.add_argument("--val_frac", type=float, default=0.01, help="share of tokens (whole docs) for val")
    parser.add_argument("--out_dir", default=os.path.dirname(os.path.abspath(__file__)))
    parser.add_argument("--num_threads", type=int, default=0, help="tokenizer threads (0: one per core)")
    parser.add_argument("--tokenizer", choices=["gpt2", "hf"], default="gpt2",
                        help="gpt2: GPT-2 BPE; hf: --hf_tokenizer's")
    parser.add_argument("--hf_tokenizer", default="",
                        help="with --tokenizer=hf: the Hugging Face model folder (tokenizer.json) "
                             "of the model to train, e.g. Qwen3-0.6B")
    add_overwrite(parser)
    args = parser.parse_args()
    if args.num_tokens <= 0 or not 0 < args.val_frac < 1 or args.num_threads < 0:
        raise SystemExit("error: --num_tokens must be > 0, --val_frac between 0 and 1, --num_threads >= 0")
    if (args.tokenizer == "hf") != bool(args.hf_tokenizer):
        raise SystemExit("error: --tokenizer=hf and --hf_tokenizer=FOLDER (a Hugging Face model "
                         "folder) go together; "
                         "give both")
    try:
        from datasets import load_dataset
    except ImportError:
        raise SystemExit("error: fineweb_edu needs the Hugging Face datasets package: pip install datasets") from None

    # one writer, checked now
    with preparing(args.out_dir, [("--hf_tokenizer", args.hf_tokenizer)], args.overwrite):
        enc = HFEncoding(args.hf_tokenizer, args.num_threads or None) if args.hf_tokenizer else gpt2_encoding()
        # network and hub failures are OSErrors (requests, huggingface_hub): one line, not a
        # traceback
        try:
            ds = load_dataset("HuggingFaceFW/fineweb-edu", name="sample-10BT", split="train", streaming=True)
            docs = (row["text"] for row in ds)
            meta = {**(enc.meta() if args.hf_tokenizer else gpt2_meta(enc)),
                    "source": "HuggingFaceFW/fineweb-edu sample-10BT"}
            pieces = with_progress(doc_pieces(docs, enc, args.num_tokens, args.val_frac,
                                              num_threads=args.num_threads or None), args.num_tokens)
            meta = write_bins(pieces, args.out_dir, meta)
        except OSError as e:
            raise SystemExit(f"error: streaming FineWeb-Edu failed ({type(e).__name__}: {e}); check the network "
                             "(the Hugging Face hub must be reachable) and run again") from None
    print(f"train has {meta['train_tokens']:,} tokens, val has {meta['val_tokens']:,} tokens")
    print(f"wrote train.bin, val.bin, meta.pkl to {args.out_dir}")


if __name__ == "__main__":
    main()
