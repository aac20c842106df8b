"""
Synthetic GPT-2-vocab token bins, made offline in about a second: for smoke runs of the training
path (the GPU check) where no text may be downloaded. Not language: `n_phrases` fixed phrases of
`phrase_len` distinct GPT-2 ids each,
drawn with Zipf weights and each closed by <|endoftext|>. Inside a phrase every next token is determined, so a model
that learns bigrams takes the loss from ln 50257 = 10.8 to well under 1 nat: a fall that shows
the path learns.

python data/synthetic/prepare.py [--out_dir DIR] [--train_tokens 2097152] [--seed 0]
Flags by argparse: data/ imports only data/ and the one output guard,
nanovha/outputs.py (CONTRIBUTING.md).
"""
import argparse, os, sys
import numpy as np
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from data.common import add_overwrite, write_split
from nanovha.outputs import preparing

# r50k_base: ids 0..50255 are BPE tokens, 50256 is <|endoftext|>
GPT2_VOCAB, GPT2_EOT = 50257, 50256


def phrase_table(seed, n_phrases=512, phrase_len=16):
    """(phrases (n_phrases, phrase_len + 1): distinct ids, each row closed by GPT2_EOT; their
    probabilities, 1/rank normalized). It depends on seed only, so train and val share it."""
    table_rng = np.random.default_rng(seed)
    # no id in two phrases
    ids = table_rng.choice(GPT2_EOT, size=n_phrases * phrase_len, replace=False)
    phrases = np.concatenate([ids.reshape(n_phrases, phrase_len), np.full((n_phrases, 1), GPT2_EOT)], 1)
    weights = 1.0 / np.arange(1, n_phrases + 1)
    return phrases, weights / weights.sum()


def draw(phrases, probs, n_tokens, rng):
    """(n_tokens,) ids: whole phrases drawn with probs, concatenated and cut to n_tokens."""
    n = -(-n_tokens // phrases.shape[1])  # ceil
    # (n * (phrase_len + 1),)
    return phrases[rng.choice(len(phrases), size=n, p=probs)].reshape(-1)[:n_tokens]


def main():
    parser = argparse.ArgumentParser(description="synthetic GPT-2-vocab phrases -> "
                                                 "train.bin/val.bin/meta.pkl")
    parser.add_argument("--out_dir", default=os.path.dirname(os.path.abspath(__file__)))
    parser.add_argument("--train_tokens", type=int, default=1 << 21)
    parser.add_argument("--seed", type=int, default=0)
    add_overwrite(parser)
    args = parser.parse_args()
    if args.train_tokens < 4096:
        sys.exit(f"error: --train_tokens must be at least 4096 (a few windows of 1024), got {args.train_tokens}")
    phrases, probs = phrase_table(args.seed)
    train = draw(phrases, probs, args.train_tokens, np.random.default_rng(args.seed + 1))
    val = draw(phrases, probs, max(args.train_tokens // 16, 4096), np.random.default_rng(args.seed + 2))
    source = f"synthetic phrases (data/synthetic/prepare.py, seed {args.seed}): GPT-2 ids, not text"
    # one writer; no dataset replaced unasked
    with preparing(args.out_dir, overwrite=args.overwrite):
        meta = write_split(train, val, args.out_dir, {"tokenizer": "gpt2", "vocab_size": GPT2_VOCAB,
                                                     "eot_token": GPT2_EOT, "source": source})
    print(f"{source}: train {meta['train_tokens']:,} tokens, val {meta['val_tokens']:,}; wrote {args.out_dir}")


if __name__ == "__main__":
    main()
