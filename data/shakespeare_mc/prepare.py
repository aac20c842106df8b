"""
shakespeare_mc, an lm-eval task on the demo's held-out text: after a few lines of the validation split, which of
four lines comes next? The true next line and three others drawn from elsewhere in the validation split (every choice
30-60 characters), shuffled. Made by a seeded script from a prepared text dataset's val.bin (any tokenizer: the items
are text), so the same seed and data give the same file byte for byte.

python data/shakespeare_char/prepare.py          # once: the validation split
python data/shakespeare_mc/prepare.py            # writes shakespeare_mc.jsonl next to this file (the shipped one)
lm_eval --model hf --model_args pretrained=hf-vha-small --tasks shakespeare_mc --include_path data/shakespeare_mc

shakespeare_mc.yaml loads the jsonl with load_docs below (lm-eval's custom_dataset): no hub, from any directory.
"""
import argparse, hashlib, json, os, pickle, random, sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def load_docs(data_file="shakespeare_mc.jsonl", **_):
    """lm-eval's custom_dataset (its metadata and dataset_kwargs come as keywords): {"test": the items as a
    datasets.Dataset}, read from data_file (relative to this folder)."""
    import datasets
    path = os.path.join(HERE, data_file)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} not found: make it with python data/shakespeare_mc/prepare.py")
    with open(path, encoding="utf-8") as f:
        return {"test": datasets.Dataset.from_list([json.loads(line) for line in f])}


def line_starts(text, min_chars, max_chars, context_chars):
    """Offsets of the lines of text that can be a choice (min_chars..max_chars long) with context_chars before them."""
    starts, i = [], 0
    for line in text.split("\n"):
        if min_chars <= len(line) <= max_chars and i >= context_chars:
            starts.append(i)
        i += len(line) + 1
    return starts


def make_items(text, n, seed, context_chars=160, min_chars=30, max_chars=60, n_choices=4):
    """n items: {"context": the whole lines within context_chars before the line (ending with its newline),
    "choices": the true line and n_choices - 1 other lines of text, shuffled, "label": the true one's index,
    "offset": where the line starts in text}. Seeded: the same text and seed give the same items."""
    starts = line_starts(text, min_chars, max_chars, context_chars)
    line = lambda i: text[i:text.find("\n", i) % (len(text) + 1)]  # to the line's end (no newline: the text's)
    pool = sorted({line(i) for i in starts})
    if len(starts) < n or len(pool) < n_choices:
        raise ValueError(f"the text has {len(starts)} lines of {min_chars}-{max_chars} characters with {context_chars} "
                         f"characters before them ({len(pool)} distinct); need {n} ({n_choices} distinct): give more "
                         f"text or ask for fewer items")
    rng, items = random.Random(seed), []
    for i in sorted(rng.sample(starts, n)):
        window = text[i - context_chars:i]
        first = window.find("\n") + 1  # whole lines only, unless one line fills the window
        context = (window[first:] if 0 < first < len(window) else window).lstrip("\n")
        true = line(i)
        choices = [true] + rng.sample([p for p in pool if p != true], n_choices - 1)
        rng.shuffle(choices)
        items.append({"context": context, "choices": choices, "label": choices.index(true), "offset": i})
    return items


def val_text(data_dir):
    """The validation split of a prepared text dataset (val.bin + meta.pkl), decoded."""
    sys.path.insert(0, ROOT)
    from data.common import load_tokenizer, read_bin
    paths = [os.path.join(data_dir, n) for n in ("val.bin", "meta.pkl")]
    if missing := [p for p in paths if not os.path.isfile(p)]:
        raise ValueError(f"{missing[0]} not found: prepare the data first (python data/shakespeare_char/prepare.py)")
    with open(paths[1], "rb") as f:
        meta = pickle.load(f)
    return load_tokenizer(meta)[1]([int(t) for t in read_bin(paths[0])])


def main(argv=None):
    parser = argparse.ArgumentParser(description="held-out text -> shakespeare_mc.jsonl (an lm-eval task)")
    parser.add_argument("--data_dir", default=os.path.join(ROOT, "data", "shakespeare_char"))
    parser.add_argument("--out", default=os.path.join(HERE, "shakespeare_mc.jsonl"))
    parser.add_argument("--n", type=int, default=100, help="items")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--context_chars", type=int, default=160, help="at most this many characters of context")
    args = parser.parse_args(argv)
    try:
        if args.n < 1 or args.context_chars < 1:
            raise ValueError(f"--n={args.n} and --context_chars={args.context_chars} must be at least 1")
        items = make_items(val_text(args.data_dir), args.n, args.seed, args.context_chars)
    except ValueError as e:
        sys.exit(f"error: {e}")
    data = "".join(json.dumps(item, ensure_ascii=False) + "\n" for item in items).encode("utf-8")
    tmp = f"{args.out}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, args.out)
    print(f"wrote {len(items)} items ({len(data):,} bytes, sha256 {hashlib.sha256(data).hexdigest()[:16]}) "
          f"to {args.out}")


if __name__ == "__main__":
    main()
