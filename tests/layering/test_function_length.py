#!/usr/bin/env python3
"""Self-test of tests/layering/function_length.py on hand-written C++ in a temporary directory.

Each case writes a small tree (src/a/*.cpp and docs/design.md with a "## Long functions" table)
and runs the script on it as the CTest does, checking its output and exit status: a function of
121 lines is reported and one of 120 is not; braces in strings, character literals, comments,
raw strings and preprocessor lines are not counted; members, constructors with brace
initializers, operators and lambdas are measured whole and named; a listed function is excused,
and a listed function that is gone or no longer long is reported (the list cannot rot).
Run: python3 tests/layering/test_function_length.py (exit 0 when every case passes).
"""
import os
import subprocess
import sys
import tempfile
import unittest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "function_length.py")
DESIGN = """# Design

## Long functions

Only fused numeric kernels may be listed, each with its reason.

| file | function | why |
|------|----------|-----|
{rows}
## Next section

| file | function | why |
|------|----------|-----|
| `src/a/x.cpp` | `not_the_list` | a table of another section is not read |
"""


def body(n, first="void f() {", filler="  x += 1;"):
    """A function whose braces are N lines apart, both lines included."""
    return first + "\n" + "\n".join([filler] * (n - 2)) + "\n}\n"


class FunctionLength(unittest.TestCase):
    def run_tree(self, files, rows="", dirs=("src/a",), extra=()):
        with tempfile.TemporaryDirectory() as root:
            for path, text in files.items():
                full = os.path.join(root, path)
                os.makedirs(os.path.dirname(full), exist_ok=True)
                with open(full, "w") as f:
                    f.write(text)
            os.makedirs(os.path.join(root, "docs"), exist_ok=True)
            if rows is not None:
                with open(os.path.join(root, "docs", "design.md"), "w") as f:
                    f.write(DESIGN.format(rows=rows))
            r = subprocess.run([sys.executable, SCRIPT, "--root", root, *extra, *dirs],
                               capture_output=True, text=True)
            return r.returncode, r.stdout, r.stderr

    def test_121_lines_reported_120_not(self):
        rc, out, _ = self.run_tree({"src/a/x.cpp": body(120, "void ok() {") + body(121, "int too_long(int a) {")})
        self.assertEqual(rc, 1)
        self.assertIn("src/a/x.cpp:121 too_long 121 lines", out)
        self.assertNotIn(" ok ", out)

    def test_120_lines_pass(self):
        rc, out, _ = self.run_tree({"src/a/x.cpp": "namespace fp4 {\nnamespace {\n" + body(120) + "}\n}\n"})
        self.assertEqual((rc, out), (0, ""))

    def test_braces_in_literals_comments_and_preprocessor_are_ignored(self):
        lines = [
            '  const char* s = "}}{";',
            "  char c = '}'; char d = '\\'';",
            "  int big = 1'000'000; // } a comment {",
            "  /* { a block",
            "     comment } } */",
            '  auto r = R"x(}} )" still inside {)x";',
            '  auto m = u8R"(',
            "}  a raw string over lines {",
            '  )";',
            "#define CLOSE }",
            "  #define BLOCK(x) \\",
            "    { x; \\",
            "    }}",
            '  const char* e = "\\"}\\"";',
        ]
        fn = "void braces() {\n" + "\n".join(lines + ["  x += 1;"] * (121 - 2 - len(lines))) + "\n}\n"
        rc, out, _ = self.run_tree({"src/a/x.cpp": fn + body(121, "void after() {")})
        self.assertEqual(rc, 1)
        self.assertIn("src/a/x.cpp:1 braces 121 lines", out)
        self.assertIn("src/a/x.cpp:122 after 121 lines", out)

    def test_members_constructors_operators_lambdas(self):
        text = (
            "namespace fp4 {\n"
            "struct Base {};\n"
            "template <typename T = int>\n"
            "class Widget : public Base {\n"
            " public:\n"
            + body(121, "  Widget(int a) : a_(a), b_{a, 2}, c_{} {")
            + body(121, "  bool operator==(const Widget& o) const noexcept {")
            + "  int a_; int b_[2]; int c_;\n"
            "};\n"
            + body(121, "int Widget<int>::size() const {",
                   "  auto g = [&](int v) { if (v) { return v; } return 0; };")
            + "const int kTable[] = {\n" + "  1,\n" * 200 + "};\n"
            + body(121, "const auto kLambda = [](int v) {")
            + "}  // namespace fp4\n"
        )
        rc, out, _ = self.run_tree({"src/a/w.h": text})
        self.assertEqual(rc, 1, out)
        names = sorted(line.split()[1] for line in out.splitlines() if line.startswith("src/"))
        self.assertEqual(names, ["Widget::Widget", "Widget::operator==", "Widget::size",
                                 "kLambda"], out)
        self.assertNotIn("kTable", out)

    def test_a_listed_function_is_excused(self):
        rows = "| `src/a/x.cpp` | `kernel` | a fused numeric kernel: one pass over the tile |\n"
        rc, out, _ = self.run_tree({"src/a/x.cpp": body(200, "void kernel(float* p) {")}, rows)
        self.assertEqual((rc, out), (0, ""))

    def test_a_listed_function_that_is_gone_is_stale(self):
        rows = "| `src/a/x.cpp` | `kernel` | a fused numeric kernel |\n"
        rc, out, _ = self.run_tree({"src/a/x.cpp": body(10, "void other() {")}, rows)
        self.assertEqual(rc, 1)
        self.assertIn("src/a/x.cpp: kernel is listed", out)
        self.assertIn("no longer exists", out)

    def test_a_listed_function_no_longer_long_is_stale(self):
        rows = "| `src/a/x.cpp` | `kernel` | a fused numeric kernel |\n"
        rc, out, _ = self.run_tree({"src/a/x.cpp": body(120, "void kernel() {")}, rows)
        self.assertEqual(rc, 1)
        self.assertIn("is 120 lines, not over 120", out)

    def test_entries_outside_the_searched_directories_are_not_checked(self):
        rows = "| `src/b/y.cpp` | `kernel` | a fused numeric kernel |\n"
        rc, out, _ = self.run_tree({"src/a/x.cpp": body(10)}, rows)
        self.assertEqual((rc, out), (0, ""))

    def test_max_option(self):
        rc, out, _ = self.run_tree({"src/a/x.cpp": body(11, "void f() {")}, extra=("--max", "10"))
        self.assertEqual(rc, 1)
        self.assertIn("f 11 lines", out)

    def test_usage_errors_exit_2(self):
        rc, _, err = self.run_tree({"src/a/x.cpp": body(10)}, dirs=("src/missing",))
        self.assertEqual(rc, 2)
        self.assertIn("no such directory", err)
        rc, _, err = self.run_tree({"src/a/x.cpp": body(10)}, rows=None)
        self.assertEqual(rc, 2)
        rc, _, _ = self.run_tree({"src/a/x.cpp": body(10)}, dirs=())
        self.assertEqual(rc, 2)


if __name__ == "__main__":
    unittest.main()
