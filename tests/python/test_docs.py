"""The Python examples of docs/python.md run as written (in order, one namespace, in a scratch
directory with the repository's configs/), except blocks whose first line is `# (needs ...)`."""
import os
import re

import pytest

from conftest import SRC


def blocks():
    text = open(os.path.join(SRC, "docs", "python.md"), encoding="utf-8").read()
    return [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if not b.startswith("# (needs")]


def test_docs_examples_run(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    bs = blocks()
    assert len(bs) >= 5
    os.symlink(os.path.join(SRC, "configs"), tmp_path / "configs")
    monkeypatch.chdir(tmp_path)
    ns = {}
    for b in bs:
        exec(compile(b, "docs/python.md", "exec"), ns)
    assert (tmp_path / "x.safetensors").exists()
