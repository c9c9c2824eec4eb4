#!/usr/bin/env bash
# Citations that resolve (docs/design.md "Conventions"): a comment gives its reason by citing a
# docs/ page and heading, never a README section or an issue number, which a reader of the code
# cannot look up (README.md is the front page and points to docs/; there is no tracker with the
# code). In src/, include/ and python/ this fails on
#   - `README "Section"` or `README, "Section"`, and `README` at the end of a line (a section
#     name that continues on the next);
#   - `issue N` or `issues N` (any case), the number of a tracker issue (`oneDNN issue #4845`, a
#     public one, is written with its `#` and is not matched); this one also in docs/*.md and in
#     the comments of configs/**/*.toml, which have no tracker to point to either;
#   - `docs/PAGE.md "Heading"` where PAGE.md does not exist or has no heading spelled so (the
#     whole heading, without its #s and with or without its code marks; a citation may continue
#     on the next comment line); this one also in docs/*.md, README.md, scripts/, bench/ and
#     configs/ (a bold paragraph is cited after its heading: "Heading", "Paragraph").
# Usage: doc_citations.sh <fp4train binary (unused)> <source dir>
set -u
src=${2:?source dir}
cd "$src" || exit 1
fail=0
dirs="src include python"
hits=$(grep -rnE 'README,? *\\?"|README[[:space:]]*$' $dirs)
if [ -n "$hits" ]; then
  echo "doc_citations: README sections cited (cite docs/PAGE.md \"Heading\" instead):"
  echo "$hits"
  fail=1
fi
issue_re='(^|[^[:alnum:]_#])issues? [0-9]'
hits=$(grep -rniE "$issue_re" $dirs docs/*.md; grep -rniE --include='*.toml' "$issue_re" configs)
if [ -n "$hits" ]; then
  echo "doc_citations: issue numbers cited (cite docs/PAGE.md \"Heading\", or write the reason):"
  echo "$hits"
  fail=1
fi
command -v python3 >/dev/null || { echo "doc_citations: SKIP the heading check: no python3"; exit $((fail ? 1 : 77)); }
python3 - $dirs docs README.md scripts bench configs <<'PY' || fail=1
import os, re, sys
heads = {}
for page in sorted(os.listdir("docs")):
    if not page.endswith(".md"):
        continue
    fence, hs = False, set()
    for line in open(os.path.join("docs", page), encoding="utf-8"):
        if line.startswith("```"):
            fence = not fence
        elif not fence and re.match(r"#+ ", line):
            hs.add(line.split(" ", 1)[1].strip().replace("`", ""))  # cited without code marks
    heads[page] = hs
cite = re.compile(r'docs/([\w.-]+\.md)[,;:]?\s+\(?\\?"([^"\\]+)\\?"')
bad = 0
def sources(top):
    if os.path.isfile(top):
        yield top
        return
    for base, _, files in sorted(os.walk(top)):
        for name in sorted(files):
            path = os.path.join(base, name)
            # code; docs; scripts (bench/*.sh and scripts/ without an extension); configs
            if name.endswith((".cpp", ".h", ".inc", ".py", ".md", ".sh", ".toml")) or (
                    top == "scripts" and "." not in name):
                yield path
for top in sys.argv[1:]:
    for path in sources(top):
        text = open(path, encoding="utf-8", errors="replace").read()
        if path.endswith(".md"):  # a citation may run over lines of a paragraph
            text = re.sub(r"\n[ \t]*", " ", text)
        # One citation may run over comment lines and over adjacent C++ string literals.
        text = re.sub(r"\n[ \t]*(?:///|//|#)[ \t]?", " ", text)
        text = re.sub(r'"[ \t]*\n[ \t]*"', "", text)
        for m in cite.finditer(text):
            page, heading = m.group(1), " ".join(m.group(2).replace("`", "").split())
            if page not in heads:
                print(f"doc_citations: {path}: docs/{page} does not exist")
                bad += 1
            elif heading not in heads[page]:
                print(f'doc_citations: {path}: docs/{page} has no heading "{heading}"')
                bad += 1
sys.exit(1 if bad else 0)
PY
[ "$fail" -eq 0 ] && echo "doc_citations: ok"
exit "$fail"
