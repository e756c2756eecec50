"""The Python examples of the reference pages run as written (each in its own temporary store),
so a renamed method or a changed result breaks the build instead of the reader."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"
# Pages whose every ```python block is self-contained (import.md's examples name the user's own
# directories and are not run).
RUNNABLE_PAGES = ["python-api.md"]


def _blocks(page: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", (DOCS / page).read_text(encoding="utf-8"), flags=re.DOTALL)


@pytest.mark.parametrize("page", RUNNABLE_PAGES)
def test_page_examples_run(page):
    """Every Python block of the page runs without error, its assertions included."""
    blocks = _blocks(page)
    assert blocks, f"{page} has no Python example"
    for block in blocks:
        exec(compile(block, str(DOCS / page), "exec"), {"__name__": "doc_example"})
