#!/usr/bin/env python3
"""Report the functions longer than a limit (120 lines by default) in C++ source directories.

Usage: function_length.py [--max N] [--root DIR] [--design FILE] DIR...

Each DIR (relative to --root, the repository by default) is searched for .cpp, .cc, .h, .hpp
and .inc files. A function is a body at namespace or class scope: a free function, a member
function defined in or out of its class, a constructor (its initializer list is not part of the
body), an operator, or a lambda assigned to a namespace-scope variable. Lambdas and local
classes inside a function count as part of it. A function's length is the number of lines from
the line of its opening brace to the line of its closing brace, both included.

Comments, string and character literals (raw strings included) and preprocessor lines are
blanked first, so a brace in any of them is not seen. Conditional branches (#if ... #else) are
all read, so each must keep its braces balanced.

The functions allowed to be longer are listed in the table under the heading "## Long
functions" of --design (docs/design.md by default), one row per function: | file | function |
why |, the file relative to the repository (`src/...`), the function as this script names it
(`Class::member` for a member defined out of its class). A listed function whose file lies under
a searched DIR must still be there and still be too long, so that the list cannot rot.

Prints `file:line function N lines` for every unlisted function over the limit, and one line per
stale entry. Exit status: 0 when there is none of either, 1 otherwise, 2 on a usage error (a
missing directory, no "## Long functions" section).
"""
import argparse
import os
import re
import sys

EXTENSIONS = (".cpp", ".cc", ".h", ".hpp", ".inc")
IDENT = re.compile(r"[A-Za-z_]\w*")
# Words that may stand right before a parenthesis in a declaration without naming the function.
NOT_A_NAME = {"__attribute__", "alignas", "decltype", "noexcept", "requires", "throw",
              "__declspec", "sizeof", "alignof", "static_assert", "if", "for", "while",
              "switch", "return"}


def blank(text):
    """Return TEXT with comments, literals and preprocessor lines replaced by spaces.

    Newlines are kept, so line numbers are those of TEXT; a string or character literal keeps
    its quotes (`"  "`), so what precedes it (`extern "C"`) stays recognisable."""
    out = []
    i, n = 0, len(text)
    at_line_start = True  # only whitespace since the last newline
    while i < n:
        c = text[i]
        if c == "\n":
            out.append(c)
            i += 1
            at_line_start = True
            continue
        if at_line_start and c == "#":  # a preprocessor line, with its continuations
            j = i
            while j < n and text[j] != "\n":
                if text[j] == "\\" and j + 1 < n and text[j + 1] == "\n":
                    j += 2
                    continue
                if text.startswith("/*", j):  # a block comment starting on the line
                    k = text.find("*/", j + 2)
                    j = n if k < 0 else k + 2
                    continue
                j += 1
            out.append(_spaces(text[i:j]))
            i = j
            continue
        if not c.isspace():
            at_line_start = False
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(_spaces(text[i:j]))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(_spaces(text[i:j]))
            i = j
        elif c == '"':
            m = re.compile(r'(?:u8|[uUL])?R"([^()\\\s]{0,16})\(').match(text, _prefix_start(text, i))
            if m and m.end() > i and text[i - 1] == "R":  # a raw string: R"delim( ... )delim"
                close = text.find(")" + m.group(1) + '"', m.end())
                j = n if close < 0 else close + len(m.group(1)) + 2
                out.append('"' + _spaces(text[i + 1:j - 1]) + '"')
            else:
                j = _literal_end(text, i, '"')
                out.append('"' + _spaces(text[i + 1:j - 1]) + '"')
            i = j
        elif c == "'" and not _in_number(text, i):
            j = _literal_end(text, i, "'")
            out.append("'" + _spaces(text[i + 1:j - 1]) + "'")
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _spaces(s):
    return re.sub(r"[^\n]", " ", s)


def _prefix_start(text, i):
    """Where the encoding prefix and R of a raw string whose quote is at I would start."""
    for p in ("u8R", "uR", "UR", "LR", "R"):
        k = i - len(p)
        if k >= 0 and text[k:i] == p and (k == 0 or not (text[k - 1].isalnum() or text[k - 1] == "_")):
            return k
    return i


def _literal_end(text, i, quote):
    """The index just past the literal opened by the quote at I (escapes honoured)."""
    j = i + 1
    while j < len(text) and text[j] != quote and text[j] != "\n":
        j += 2 if text[j] == "\\" else 1
    return min(j + 1, len(text))


def _in_number(text, i):
    """True when the apostrophe at I is a digit separator (1'000'000, 0x'FF')."""
    j = i - 1
    while j >= 0 and (text[j].isalnum() or text[j] in "_.'"):
        j -= 1
    token = text[j + 1:i]
    return bool(token) and token[0].isdigit()


def _matching(s, i):
    """The index of the brace closing the one at I in blanked text S."""
    depth = 0
    for k in range(i, len(s)):
        if s[k] == "{":
            depth += 1
        elif s[k] == "}":
            depth -= 1
            if depth == 0:
                return k
    return len(s) - 1


def _top_level(header):
    """HEADER with the contents of (), [] and <> that hold no braces replaced by spaces, except
    the brackets themselves; used to find top-level '=' and ':' in a declaration."""
    out, depth = [], 0
    for ch in header:
        if ch in "([":
            depth += 1
            out.append(ch if depth == 1 else " ")
        elif ch in ")]":
            depth = max(depth - 1, 0)
            out.append(ch if depth == 0 else " ")
        else:
            out.append(ch if depth == 0 else " ")
    return "".join(out)


def _function_name(header):
    """The name a function header declares, or None when HEADER does not declare a function.

    HEADER is the blanked text between the previous ';', '{' or '}' at this scope and the
    body's opening brace."""
    top = _top_level(_strip_template(header))
    m = re.search(r"=\s*\[[^\]]*\]\s*(?:\([^)]*\))?[^=]*$", top)
    if m:  # a lambda assigned to a variable: named by the variable
        names = IDENT.findall(top[:m.start()])
        return names[-1] if names else None
    if "=" in re.sub(r"operator\s*[^\s(]*=|[=!<>]=|=\s*(?:default|delete)|\[=", "", top):
        return None  # an initializer: int a[] = {...}; Foo f = Foo{...}
    for m in reversed(list(re.finditer(r"\(", top))):
        before = top[:m.start()].rstrip()
        op = re.search(r"operator\s*(\(\s*\)|\[\s*\]|[^\w\s(]+|\s\w[\w\s:<>*&]*)$", before)
        if op:
            q = re.search(r"((?:[A-Za-z_]\w*\s*(?:<[^<>]*>)?\s*::\s*)*)operator\s*$",
                          before[:op.start(1)])
            scope = re.sub(r"\s+", "", q.group(1)) if q else ""
            return scope + "operator" + re.sub(r"\s+", " ", op.group(1)).strip()
        m2 = re.search(r"((?:[A-Za-z_]\w*\s*(?:<[^<>]*>)?\s*::\s*)*~?[A-Za-z_]\w*)\s*(?:<[^<>()]*>)?$",
                       before)
        if not m2:
            continue
        name = re.sub(r"\s+", "", m2.group(1))
        if name.split("::")[-1].lstrip("~") in NOT_A_NAME:
            continue
        return re.sub(r"<[^<>]*>", "", name)
    return None


def _strip_template(header):
    """HEADER without its template parameter lists (`template <typename T = int>`), whose '='
    and 'class' would otherwise be read as an initializer or a class."""
    while True:
        m = re.search(r"\btemplate\s*<", header)
        if not m:
            return header
        depth, k = 0, m.end() - 1
        while k < len(header):
            depth += {"<": 1, ">": -1}.get(header[k], 0)
            if depth == 0:
                break
            k += 1
        header = header[:m.start()] + " " * (k + 1 - m.start()) + header[k + 1:]


class Function:
    def __init__(self, path, name, first, last):
        self.path, self.name, self.first, self.last = path, name, first, last

    @property
    def lines(self):
        return self.last - self.first + 1


def functions(path, text):
    """Every function body at namespace or class scope of one file, as Function objects."""
    s = blank(text)
    line_of = [0] * (len(s) + 1)
    line = 1
    for k, ch in enumerate(s):
        line_of[k] = line
        if ch == "\n":
            line += 1
    line_of[len(s)] = line
    found = []
    scopes = [("namespace", "")]  # the kind and name of each open namespace or class
    header_start = 0
    i = 0
    while i < len(s):
        ch = s[i]
        if ch in ";":
            header_start = i + 1
        elif ch == "}":
            if len(scopes) > 1:
                scopes.pop()
            header_start = i + 1
        elif ch == "{":
            header = _strip_template(s[header_start:i])
            flat = " ".join(header.split())
            init = _init_list_start(header)
            if init is not None and _brace_in_init_list(header, init):
                # A member's brace initializer in a constructor's initializer list.
                i = _matching(s, i) + 1
                continue
            if re.search(r"(^|\W)namespace(\W|$)", flat) or re.fullmatch(r'(.*\W)?extern\s*"\s*"\s*', flat):
                scopes.append(("namespace", ""))
                header_start = i + 1
            elif (re.search(r"(^|\W)(class|struct|union)(\W|$)", _top_level(header))
                  and not re.search(r"\)\s*(const|noexcept|override|final|->|\s)*$", _top_level(header))):
                m = re.search(r"(?:class|struct|union)\s+(?:\[\[[^\]]*\]\]\s*)?(?:alignas\s*\([^)]*\)\s*)?"
                              r"([A-Za-z_]\w*)", flat)
                scopes.append(("class", m.group(1) if m else ""))
                header_start = i + 1
            else:
                end = _matching(s, i)
                name = _function_name(header if init is None else header[:init])
                if name and not re.search(r"(^|\W)enum(\W|$)", flat):
                    cls = [n for kind, n in scopes if kind == "class" and n]
                    if cls and "::" not in name:
                        name = "::".join(cls) + "::" + name
                    found.append(Function(path, name, line_of[i], line_of[end]))
                i = end + 1
                header_start = i
                continue
        i += 1
    return found


def _init_list_start(header):
    """The index of the ':' that opens a constructor's initializer list in HEADER, or None."""
    top = _top_level(header)
    close = top.find(")")
    if close < 0:
        return None
    m = re.compile(r"\s*(?:noexcept(?:\s*\(\s*\))?\s*)?:(?!:)").match(top, close + 1)
    if m and top[m.end() - 2:m.end()] != "::":
        return m.end() - 1
    return None


def _brace_in_init_list(header, init):
    """True when the '{' following HEADER opens a member's brace initializer (it follows a name
    or a template argument list), not the body (which follows ')' or '}')."""
    tail = header[init + 1:].rstrip()
    return bool(tail) and (tail[-1].isalnum() or tail[-1] in "_>")


def long_functions_listed(design):
    """The (file, function) pairs of the "## Long functions" table of DESIGN, or None when the
    section is missing."""
    with open(design, encoding="utf-8") as f:
        text = f.read()
    m = re.search(r"^## Long functions[ \t]*\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    if not m:
        return None
    listed = set()
    for row in m.group(1).splitlines():
        cells = [c.strip().strip("`").strip() for c in row.strip().strip("|").split("|")]
        if not row.lstrip().startswith("|") or len(cells) < 3:
            continue
        if cells[0].lower() == "file" or set(cells[0]) <= set("-: "):
            continue  # the header row and the separator row
        listed.add((cells[0], cells[1]))
    return listed


def main(argv):
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dirs", nargs="+", metavar="DIR")
    ap.add_argument("--max", type=int, default=120, help="the most lines a function may have")
    ap.add_argument("--root", default=os.path.normpath(os.path.join(here, "..", "..")),
                    help="the repository (default: two levels above this script)")
    ap.add_argument("--design", help="the file with the list (default: ROOT/docs/design.md)")
    a = ap.parse_args(argv)
    design = a.design or os.path.join(a.root, "docs", "design.md")
    if not os.path.isfile(design):
        print(f"function_length: {design}: no such file", file=sys.stderr)
        return 2
    listed = long_functions_listed(design)
    if listed is None:
        print(f'function_length: {design} has no "## Long functions" section', file=sys.stderr)
        return 2
    dirs = [os.path.normpath(d) for d in a.dirs]
    for d in dirs:
        if not os.path.isdir(os.path.join(a.root, d)):
            print(f"function_length: {os.path.join(a.root, d)}: no such directory", file=sys.stderr)
            return 2
    found = []
    for d in dirs:
        for base, _, files in sorted(os.walk(os.path.join(a.root, d))):
            for name in sorted(files):
                if name.endswith(EXTENSIONS):
                    full = os.path.join(base, name)
                    rel = os.path.relpath(full, a.root).replace(os.sep, "/")
                    with open(full, encoding="utf-8", errors="replace") as f:
                        found += functions(rel, f.read())
    bad = 0
    for fn in found:
        if fn.lines > a.max and (fn.path, fn.name) not in listed:
            print(f"{fn.path}:{fn.first} {fn.name} {fn.lines} lines")
            bad += 1
    lengths = {}
    for fn in found:
        key = (fn.path, fn.name)
        lengths[key] = max(lengths.get(key, 0), fn.lines)
    for path, name in sorted(listed):
        if not any(path == d or path.startswith(d + "/") for d in dirs):
            continue
        if (path, name) not in lengths:
            print(f'{path}: {name} is listed in "## Long functions" but no longer exists')
            bad += 1
        elif lengths[(path, name)] <= a.max:
            print(f'{path}: {name} is listed in "## Long functions" but is {lengths[(path, name)]} '
                  f"lines, not over {a.max}")
            bad += 1
    if bad:
        print(f"function_length: {bad} finding(s); a function over {a.max} lines is split, or "
              f'listed with its reason in {os.path.relpath(design, a.root)} "## Long functions"')
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
