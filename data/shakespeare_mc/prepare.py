"""
shakespeare_mc, an lm-eval task on the demo's held-out text: after 160 characters of the
validation split that stop before a word, which two words come next? The true two and three other
pairs of words from elsewhere in the validation split (each starting with a lowercase word inside
a line, as the true one does), shuffled. Made by a seeded script from a prepared text dataset's
val.bin (any tokenizer: the items are text), so the same seed and data give the same file byte
for byte. The context ends with the space before the words: lm-eval moves it into each choice.

python data/shakespeare_char/prepare.py          # once: the validation split
python data/shakespeare_mc/prepare.py            # writes shakespeare_mc.jsonl next to this file (the shipped one)
lm_eval --model hf --model_args pretrained=hf-vha-small --tasks shakespeare_mc --include_path
data/shakespeare_mc

shakespeare_mc.yaml loads the jsonl with load_docs below (lm-eval's custom_dataset): no hub, from
any directory. Flags by argparse: data/ imports only data/ and the one output guard,
nanovha/outputs.py (CONTRIBUTING.md).
"""
import argparse, hashlib, json, os, pickle, random, re, sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def load_docs(data_file="shakespeare_mc.jsonl", **_):
    """lm-eval's custom_dataset (its metadata and dataset_kwargs come as keywords): {"test": the
    items as a datasets.Dataset}, read from data_file (relative to this folder)."""
    import datasets
    path = os.path.join(HERE, data_file)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} not found: make it with python "
                                f"data/shakespeare_mc/prepare.py")
    with open(path, encoding="utf-8") as f:
        return {"test": datasets.Dataset.from_list([json.loads(line) for line in f])}


def runs_of_words(text, context_chars, n_words):
    """{offset: the n_words words from there} for every lowercase word that follows a space
    inside a line, has context_chars of text before it and n_words words left in its line."""
    runs = {}
    for m in re.finditer(r"(?<=\S )[a-z]", text):
        i = m.start()
        words = text[i:text.find("\n", i) % (len(text) + 1)].split(" ")  # to the line's end (or the text's)
        if i >= context_chars and len(words) >= n_words:
            runs[i] = " ".join(words[:n_words])
    return runs


def make_items(text, n, seed, context_chars=160, n_words=2, n_choices=4):
    """n items: {"context": the whole words within context_chars before a run of n_words words
    (it ends with the space before them), "choices": that run and n_choices - 1 other runs of
    text, shuffled, "label": the true one's index, "offset": where the run starts in text}.
    Seeded: the same text and seed give the same items."""
    runs = runs_of_words(text, context_chars, n_words)
    pool = sorted(set(runs.values()))
    if len(runs) < n or len(pool) < n_choices:
        raise ValueError(f"the text has {len(runs)} runs of {n_words} words with {context_chars} characters before "
                         f"them ({len(pool)} distinct); need {n} ({n_choices} distinct): give more text or ask for "
                         f"fewer items")
    rng, items = random.Random(seed), []
    for i in sorted(rng.sample(sorted(runs), n)):
        window = text[i - context_chars:i]
        # whole words only: from the first word that starts inside the window
        first = re.search(r"\s\S", window)
        context = window[first.start() + 1:] if first else window
        choices = [runs[i]] + rng.sample([r for r in pool if r != runs[i]], n_choices - 1)
        rng.shuffle(choices)
        items.append({"context": context, "choices": choices, "label": choices.index(runs[i]), "offset": i})
    return items


def val_text(data_dir):
    """The validation split of a prepared text dataset (val.bin + meta.pkl), decoded."""
    sys.path.insert(0, ROOT)
    from data.common import load_tokenizer, read_bin
    paths = [os.path.join(data_dir, n) for n in ("val.bin", "meta.pkl")]
    if missing := [p for p in paths if not os.path.isfile(p)]:
        raise ValueError(f"{missing[0]} not found: prepare the data first (python "
                         f"data/shakespeare_char/prepare.py)")
    with open(paths[1], "rb") as f:
        meta = pickle.load(f)
    return load_tokenizer(meta)[1]([int(t) for t in read_bin(paths[0])])


def main(argv=None):
    parser = argparse.ArgumentParser(description="held-out text -> shakespeare_mc.jsonl (an lm-eval task)")
    parser.add_argument("--data_dir", default=os.path.join(ROOT, "data", "shakespeare_char"))
    parser.add_argument("--out", default=os.path.join(HERE, "shakespeare_mc.jsonl"))
    parser.add_argument("--n", type=int, default=100, help="items")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--context_chars", type=int, default=160, help="at most this many "
                                                                       "characters of context")
    parser.add_argument("--n_words", type=int, default=2, help="words in each choice")
    args = parser.parse_args(argv)
    try:
        if min(args.n, args.context_chars, args.n_words) < 1:
            raise ValueError(f"--n={args.n}, --context_chars={args.context_chars} and "
                             f"--n_words={args.n_words} must "
                             f"be at least 1")
        sys.path.insert(0, ROOT)
        from nanovha.outputs import output_problem  # --out over what it reads, or into a run's folder: refused now
        reads = {f"--data_dir's {n}": os.path.join(args.data_dir, n) for n in ("val.bin", "meta.pkl")}
        if problem := output_problem({"--out": args.out}, reads, kinds={"--out": "items"}):
            raise ValueError(problem)
        items = make_items(val_text(args.data_dir), args.n, args.seed, args.context_chars, args.n_words)
    except ValueError as e:
        sys.exit(f"error: {e}")
    data = "".join(json.dumps(item, ensure_ascii=False) + "\n" for item in items).encode("utf-8")
    tmp = f"{args.out}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, args.out)
    print(f"wrote {len(items)} items ({len(data):,} bytes, sha256 "
          f"{hashlib.sha256(data).hexdigest()[:16]}) "
          f"to {args.out}")


if __name__ == "__main__":
    main()
