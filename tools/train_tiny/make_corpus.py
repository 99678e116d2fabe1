#!/usr/bin/env python3
"""Build the training corpus and the held-out text for the tiny model (runs here, not on the GPU box).

Sources (Debian packages, install with `apt-get install python3.11-doc miscfiles`):
  - python3.11-doc: the reStructuredText sources of the Python 3.11 documentation
    (/usr/share/doc/python3.11/html/_sources/**/*.rst.txt), PSF License Version 2;
  - miscfiles: the US Constitution and Declaration of Independence
    (/usr/share/state/us-constitution.gz, us-declaration.gz), public domain.

Held out (never in the training split): tutorial/classes.rst.txt, written to
tests/data/tiny/heldout.txt for the perplexity / golden checks.

Output: .carry/corpus/train.jsonl, one JSON object {"name", "text"} per document,
sorted by name (deterministic), plus manifest.json with sizes and sha256.

usage: python3 tools/train_tiny/make_corpus.py [--out .carry/corpus] [--heldout tests/data/tiny/heldout.txt]
"""

import argparse
import gzip
import hashlib
import json
import os

DOC_ROOT = "/usr/share/doc/python3.11/html/_sources"
STATE = "/usr/share/state"
HELDOUT = "tutorial/classes.rst.txt"
# whatsnew/changelog is a 75-byte stub in this package; nothing else is excluded.
SKIP = {HELDOUT}


def read_docs():
    docs = []
    for root, _, files in os.walk(DOC_ROOT):
        for f in files:
            if not f.endswith(".rst.txt"):
                continue
            p = os.path.join(root, f)
            rel = os.path.relpath(p, DOC_ROOT)
            if rel in SKIP:
                continue
            with open(p, encoding="utf-8") as fh:
                text = fh.read()
            if len(text) >= 200:
                docs.append({"name": "python3.11-doc/" + rel, "text": text})
    for f in ("us-constitution.gz", "us-declaration.gz"):
        with gzip.open(os.path.join(STATE, f), "rt", encoding="utf-8") as fh:
            docs.append({"name": "miscfiles/" + f[:-3], "text": fh.read()})
    docs.sort(key=lambda d: d["name"])
    return docs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".carry/corpus")
    ap.add_argument("--heldout", default="tests/data/tiny/heldout.txt")
    a = ap.parse_args()
    if not os.path.isdir(DOC_ROOT) or not os.path.isdir(STATE):
        raise SystemExit("install the sources first: apt-get install python3.11-doc miscfiles")
    docs = read_docs()
    os.makedirs(a.out, exist_ok=True)
    train = os.path.join(a.out, "train.jsonl")
    with open(train, "w", encoding="utf-8") as fh:
        for d in docs:
            fh.write(json.dumps(d, ensure_ascii=False) + "\n")
    with open(os.path.join(DOC_ROOT, HELDOUT), encoding="utf-8") as fh:
        held = fh.read()
    assert all(held not in d["text"] for d in docs)
    os.makedirs(os.path.dirname(a.heldout), exist_ok=True)
    with open(a.heldout, "w", encoding="utf-8") as fh:
        fh.write(held)
    chars = sum(len(d["text"]) for d in docs)
    man = {"documents": len(docs), "chars": chars,
           "train_sha256": hashlib.sha256(open(train, "rb").read()).hexdigest(),
           "heldout": "python3.11-doc/" + HELDOUT, "heldout_chars": len(held)}
    with open(os.path.join(a.out, "manifest.json"), "w") as fh:
        json.dump(man, fh, indent=1)
    print(json.dumps(man))


if __name__ == "__main__":
    main()
