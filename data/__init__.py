# data/ is a package so train.py / sample.py can do `from data.common import load_tokenizer`.
