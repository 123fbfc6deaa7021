"""Checks a converted tokenizer against Python tiktoken, document by document.

Usage (needs `pip install tiktoken pyarrow`):
    flamia tokenizer convert-tiktoken --ranks tokenizer.model --pattern llama3 --out llama3.json
    flamia data tokenize --input data/shards/train.parquet --out train.ftok --tokenizer llama3.json
    python data/scripts/check_tiktoken.py tokenizer.model data/shards/train.parquet train.ftok
Prints the documents, tokens and how many documents' ids differ (0 expected).
"""

import array
import struct
import sys

import pyarrow.parquet as pq
import tiktoken
from tiktoken.load import load_tiktoken_bpe

LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def main(ranks_path, parquet_path, ftok_path):
    enc = tiktoken.Encoding("llama3", pat_str=LLAMA3, mergeable_ranks=load_tiktoken_bpe(ranks_path), special_tokens={})
    raw = open(ftok_path, "rb").read()
    assert raw[:8] == b"FLAMTOK1", "not a .ftok file"
    n_docs, n_tokens, fp_len = struct.unpack("<QQI", raw[8:28])
    at = 28 + fp_len
    tokens = array.array("I")
    tokens.frombytes(raw[at : at + 4 * n_tokens])
    offsets = array.array("Q")
    offsets.frombytes(raw[at + 4 * n_tokens :])
    texts = pq.read_table(parquet_path, columns=["text"]).column("text").to_pylist()
    assert len(texts) == n_docs, (len(texts), n_docs)
    bad = sum(list(tokens[offsets[i] : offsets[i + 1]]) != enc.encode_ordinary(t) for i, t in enumerate(texts))
    print(f"documents {n_docs} tokens {n_tokens} mismatching documents {bad}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
