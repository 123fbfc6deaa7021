#!/usr/bin/env python3
"""Build a real-English FineWeb-Edu-schema corpus from Debian's `rust-doc` package.

The Rust documentation (The Book, the Reference, Rust by Example, the Rustonomicon, the rustc /
rustdoc / edition / unstable books, the standard library's API docs) is English prose and code
written by people, installable from any Debian mirror (`apt-get download rust-doc`, about 17 MB
compressed, 580 MB of HTML). This script

1. downloads the .deb into OUT/src with `apt-get download` (no root needed) unless --deb is given,
   and unpacks it with `dpkg-deb -x`;
2. converts every selected HTML page to plain text (Python's html.parser, stdlib only: the page's
   <main> element, or its <body>; script/style/nav and rustdoc's sidebar and toolbars dropped;
   paragraphs, headings, list items and code blocks kept as blank-line separated blocks);
3. keeps pages with at least --min-chars characters of text, drops exact duplicates (std re-exports
   core items with the same docs), and deals each page to validation when a hash of its path
   falls below --val-fraction, else to training;
4. writes JSON lines (`text`, `id`, `url`, `dump`, `file_path`, `language`, `token_count` = UTF-8
   bytes) into --shards files per split and turns each into a parquet shard with
   `flamia data make-shard --jsonl` (FineWeb-Edu schema, zstd, --rows-per-group rows per group):
   OUT/data/rust-doc/train-0000N-of-0000M.parquet and OUT/data/rust-doc/validation-....parquet.

Deterministic: the same package version gives the same shards. Usage (docs/data.md):

    python3 scripts/make-corpus.py --out data/corpus \\
        --make-shard "cargo run -q --release -p flamia-data --example make_shard --"
    # [data] train = ["data/corpus/data/rust-doc"] with holdout_files = ["validation-*"], val = []
"""

import argparse
import hashlib
import html.parser
import json
import os
import re
import shlex
import subprocess
import sys

# Directories of the package's html/ tree that are read. The API reference of `core` and `alloc`
# repeats `std`'s (re-exports), and the per-architecture intrinsics pages are generated lists.
INCLUDE = [
    "book", "reference", "rust-by-example", "nomicon", "edition-guide", "rustc", "rustdoc",
    "unstable-book", "embedded-book", "style-guide", "error-index.html", "std", "proc_macro",
    "test",
]
EXCLUDE_PARTS = {"arch", "core_arch", "print.html", "search-index.js", "src"}
BLOCK = {"p", "h1", "h2", "h3", "h4", "h5", "h6", "li", "pre", "tr", "dt", "dd", "blockquote",
         "section", "div", "table", "br", "summary", "details"}
SKIP = {"script", "style", "nav", "noscript", "button", "head", "svg", "title"}
SKIP_CLASSES = {"sidebar", "sidebar-elems", "rustdoc-toolbar", "out-of-band", "src", "srclink",
                "mobile-topbar", "search-form", "nav-wrapper", "menu-bar", "anchor", "since"}
HTML_ROOT = "usr/share/doc/rust-doc/html"
UI_LINES = {"Run", "Expand description", "Read more", "Copy item path"}


class Text(html.parser.HTMLParser):
    """Collects the visible text of <main> (or <body> when a page has no <main>)."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack = []  # (tag, skipped) of open elements
        self.skip = 0
        self.main = None  # text inside <main>, if any
        self.body = []
        self.in_main = 0
        self.pre = 0

    def handle_starttag(self, tag, attrs):
        classes = set((dict(attrs).get("class") or "").split())
        skipped = tag in SKIP or bool(classes & SKIP_CLASSES)
        if tag in ("br", "img", "hr", "meta", "link", "input", "wbr"):
            if tag == "br":
                self._emit("\n")
            return
        self.stack.append((tag, skipped))
        self.skip += skipped
        if tag == "main":
            self.in_main += 1
            if self.main is None:
                self.main = []
        if tag == "pre":
            self.pre += 1
        if tag in BLOCK:
            self._emit("\n\n")

    def handle_endtag(self, tag):
        # Pop to the matching tag (HTML in the wild is not always well formed).
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i][0] == tag:
                for t, s in self.stack[i:]:
                    self.skip -= s
                    if t == "main":
                        self.in_main -= 1
                    if t == "pre":
                        self.pre -= 1
                del self.stack[i:]
                break
        if tag in BLOCK:
            self._emit("\n\n")

    def handle_data(self, data):
        if self.skip:
            return
        self._emit(data if self.pre else re.sub(r"\s+", " ", data))

    def _emit(self, s):
        if self.skip:
            return
        self.body.append(s)
        if self.in_main:
            self.main.append(s)

    def text(self):
        raw = "".join(self.main if self.main else self.body)
        # rustdoc's "Run" (playground) buttons and "Expand description" toggles are links.
        lines = [ln.rstrip() for ln in raw.split("\n") if ln.strip() not in UI_LINES]
        out = "\n".join(ln if ln.strip() else "" for ln in lines)
        return re.sub(r"\n{3,}", "\n\n", out).strip()


def page_text(path):
    with open(path, "rb") as f:
        raw = f.read()
    try:
        html_text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None  # not UTF-8: skipped and counted
    if 'http-equiv="refresh"' in html_text[:2000] and len(html_text) < 3000:
        return ""  # a redirect stub
    p = Text()
    p.feed(html_text)
    p.close()
    return p.text()


def selected(root):
    for top in INCLUDE:
        base = os.path.join(root, top)
        if os.path.isfile(base):
            yield base
            continue
        for d, dirs, files in os.walk(base):
            dirs[:] = sorted(x for x in dirs if x not in EXCLUDE_PARTS)
            for f in sorted(files):
                if f.endswith(".html") and f not in EXCLUDE_PARTS:
                    yield os.path.join(d, f)


def unit_hash(rel):
    return int.from_bytes(hashlib.sha256(rel.encode()).digest()[:8], "little") / 2.0**64


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--deb", help="a rust-doc .deb already downloaded (default: apt-get download)")
    ap.add_argument("--make-shard", default="flamia data make-shard",
                    help="command writing a shard: CMD --jsonl IN --out OUT --rows-per-group N "
                         "(`flamia data make-shard`), or the example's positional form when the "
                         "command ends in `--example make_shard --` or is the example's binary "
                         "(target/*/examples/make_shard)")
    ap.add_argument("--val-fraction", type=float, default=0.02)
    ap.add_argument("--min-chars", type=int, default=400)
    ap.add_argument("--shards", type=int, default=4, help="training shards (validation gets 1)")
    ap.add_argument("--rows-per-group", type=int, default=100)
    a = ap.parse_args()

    src = os.path.join(a.out, "src")
    os.makedirs(src, exist_ok=True)
    deb = a.deb
    if deb is None:
        subprocess.run(["apt-get", "download", "rust-doc"], cwd=src, check=True)
        debs = sorted(f for f in os.listdir(src) if f.startswith("rust-doc_") and f.endswith(".deb"))
        deb = os.path.join(src, debs[-1])
    unpacked = os.path.join(src, "unpacked")
    if not os.path.isdir(os.path.join(unpacked, HTML_ROOT)):
        subprocess.run(["dpkg-deb", "-x", deb, unpacked], check=True)
    root = os.path.join(unpacked, HTML_ROOT)
    version = os.path.basename(deb).split("_")[1] if "_" in os.path.basename(deb) else "unknown"

    splits = {"train": [], "validation": []}
    seen = set()
    stats = {"pages": 0, "short": 0, "duplicate": 0, "not_utf8": 0}
    for path in selected(root):
        stats["pages"] += 1
        text = page_text(path)
        if text is None:
            stats["not_utf8"] += 1
            continue
        if len(text) < a.min_chars:
            stats["short"] += 1
            continue
        digest = hashlib.sha256(text.encode()).hexdigest()
        if digest in seen:
            stats["duplicate"] += 1
            continue
        seen.add(digest)
        rel = os.path.relpath(path, root)
        split = "validation" if unit_hash(rel) < a.val_fraction else "train"
        splits[split].append({
            "text": text,
            "id": f"rust-doc/{rel}",
            "dump": f"debian-rust-doc-{version}",
            "url": f"https://doc.rust-lang.org/1.63.0/{rel}",
            "file_path": rel,
            "language": "en",
            "language_score": 1.0,
            "token_count": len(text.encode()),
            "score": 3.0,
            "int_score": 3,
        })

    out_dir = os.path.join(a.out, "data", "rust-doc")
    os.makedirs(out_dir, exist_ok=True)
    cmd = shlex.split(a.make_shard)
    # The flamia-data example (`cargo run ... --example make_shard --`, or its binary) takes
    # positional arguments; `flamia data make-shard` takes options.
    example = cmd[-2:] == ["make_shard", "--"] or os.path.basename(cmd[-1]) == "make_shard"
    for split, docs in splits.items():
        n = a.shards if split == "train" else 1
        for i in range(n):
            part = docs[i::n]
            stem = f"{split}-{i:05d}-of-{n:05d}"
            jl = os.path.join(src, stem + ".jsonl")
            with open(jl, "w", encoding="utf-8") as f:
                for d in part:
                    f.write(json.dumps(d, ensure_ascii=False) + "\n")
            pq = os.path.join(out_dir, stem + ".parquet")
            args = (["--jsonl", jl, pq, str(a.rows_per_group)] if example
                    else ["--jsonl", jl, "--out", pq, "--rows-per-group", str(a.rows_per_group)])
            subprocess.run(cmd + args, check=True)
        chars = sum(len(d["text"]) for d in docs)
        nbytes = sum(d["token_count"] for d in docs)
        print(f"{split}: {len(docs)} documents, {chars} characters, {nbytes} UTF-8 bytes", file=sys.stderr)
    print(f"pages read {stats['pages']}, kept {sum(len(d) for d in splits.values())}, "
          f"shorter than {a.min_chars} chars {stats['short']}, duplicates {stats['duplicate']}, "
          f"not UTF-8 {stats['not_utf8']}", file=sys.stderr)


if __name__ == "__main__":
    main()
