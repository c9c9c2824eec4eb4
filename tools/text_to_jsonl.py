#!/usr/bin/env python3
"""Write a text corpus as JSONL shards, for trying fp4train's JSONL input (docs/data.md).

Usage: python3 tools/text_to_jsonl.py SRC OUT_DIR [--docs-per-shard N] [--plain]

SRC is a directory of text files (one document per file, as data/brown/text) or one text
file (documents separated by blank lines). Each document becomes one record
{"text": ..., "source": <file name>} in OUT_DIR/shard-NNNN.jsonl.zst (zstd level 3, with the
python3-zstandard module that scripts/setup installs, else the zstd program), or .jsonl
with --plain. Documents keep the corpus order, so fp4train holds out the same documents and
trains the same tokens as on SRC (the cache key differs: documents are named by file and
line).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys


# fp4train's whitespace (docs/data.md): blank lines and empty documents are judged by these
# only, not by Python's Unicode-aware str.strip().
ASCII_SPACE = " \t\n\r\f\v"


def documents(src):
    if os.path.isdir(src):
        paths = []
        for root, dirs, files in os.walk(src):
            dirs[:] = [d for d in dirs if not d.startswith(".")]
            for f in files:
                if not f.startswith("."):
                    paths.append(os.path.relpath(os.path.join(root, f), src).replace(os.sep, "/"))
        for rel in sorted(paths):
            with open(os.path.join(src, rel), encoding="utf-8", newline="") as f:
                yield rel, f.read()
    else:
        text = open(src, encoding="utf-8", newline="").read()
        k = 0
        doc = []
        for line in text.split("\n") + [""]:
            if line.strip(ASCII_SPACE) == "":
                if doc:
                    yield "%s#%d" % (os.path.basename(src), k), "\n".join(doc)
                    k += 1
                    doc = []
            else:
                doc.append(line)


def compress(data, path):
    try:
        import zstandard
        with open(path, "wb") as f:
            f.write(zstandard.ZstdCompressor(level=3).compress(data))
    except ImportError:
        if not shutil.which("zstd"):
            sys.exit("text_to_jsonl: needs python3-zstandard or the zstd program (scripts/setup)")
        subprocess.run(["zstd", "-q", "-3", "-f", "-o", path], input=data, check=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("src")
    ap.add_argument("out")
    ap.add_argument("--docs-per-shard", type=int, default=100)
    ap.add_argument("--plain", action="store_true", help="write .jsonl, not .jsonl.zst")
    a = ap.parse_args()
    if not os.path.exists(a.src):
        sys.exit("text_to_jsonl: %s does not exist" % a.src)
    os.makedirs(a.out, exist_ok=True)
    old = [f for f in os.listdir(a.out) if f.startswith("shard-") and ".jsonl" in f]
    if old:
        sys.exit("text_to_jsonl: %s already holds shards (%s, ...); choose an empty directory"
                 % (a.out, old[0]))
    shard, lines, n = 0, [], 0

    def flush():
        nonlocal shard, lines
        if not lines:
            return
        data = "".join(lines).encode("utf-8")
        name = os.path.join(a.out, "shard-%04d.jsonl" % shard)
        if a.plain:
            open(name, "wb").write(data)
        else:
            compress(data, name + ".zst")
        shard, lines = shard + 1, []

    for name, text in documents(a.src):
        if not text.strip(ASCII_SPACE):
            continue
        lines.append(json.dumps({"text": text, "source": name}, ensure_ascii=False) + "\n")
        n += 1
        if len(lines) >= a.docs_per_shard:
            flush()
    flush()
    print("text_to_jsonl: %d documents in %d shards under %s" % (n, shard, a.out))


if __name__ == "__main__":
    main()
