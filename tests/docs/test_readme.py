"""The README's Python example runs as written, and its commands name real entry points."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def python_blocks():
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_python_examples_run():
    blocks = python_blocks()
    assert blocks
    for block in blocks:
        exec(compile(block, str(README), "exec"), {"__name__": "readme_example"})


def test_readme_quick_start_commands_match_ci():
    text = README.read_text()
    commands = re.findall(r"```bash\n(python3 -m venv .*?)\n```", text)
    assert len(commands) == 2
    ci = (README.parent / ".ci" / "run").read_text()
    assert "pip install -e '.[test]'" in ci and "python -m pytest" in ci
    assert "pip install -e '.[test]'" in commands[1] and "python -m pytest" in commands[1]
