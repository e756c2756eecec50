"""The BM25 tokenizer: what a document and a query are made of.

Tokens are the runs of characters for which ``str.isalnum()`` holds (``_`` and everything else
separates), each lowercased after the split. The same function tokenizes documents and queries,
so a query matches exactly the tokens indexed.
"""

from __future__ import annotations

import re
from typing import Optional

__all__ = ["WORD", "tokenize", "token_keys"]

WORD = re.compile(r"[^\W_]+")
"""One token before lowercasing: ``\\w`` is ``str.isalnum()`` plus ``_``, so this is exactly the
isalnum runs."""

_ASCII_ALNUM = frozenset("0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
# For ASCII text, translate + split does the same as the regex at three times the speed: every
# non-alphanumeric character becomes a space and A-Z become a-z (ASCII lowercasing is per character,
# so lowercasing before the split changes nothing).
_ASCII_STR_TABLE = {i: (chr(i).lower() if chr(i) in _ASCII_ALNUM else " ") for i in range(128)}
_ASCII_BYTES_TABLE = bytes((ord(chr(i).lower()) if chr(i) in _ASCII_ALNUM else 0x20) for i in range(128)) + bytes(
    range(128, 256)
)


def tokenize(text: str) -> list[str]:
    """The BM25 tokens of ``text``: its runs of Unicode letters and digits (``str.isalnum``; ``_``
    and everything else separates), each lowercased after the split.

    Lowercasing after the split matters outside ASCII: ``"İ".lower()`` is ``"i̇"`` (with a combining
    dot, which is not alphanumeric), and lowercasing first would cut the token there.
    """
    if not text:
        return []
    if text.isascii():  # O(1) in CPython
        return text.translate(_ASCII_STR_TABLE).split()
    return [t.lower() for t in WORD.findall(text)]


def token_keys(text: Optional[str]) -> list[bytes]:
    """:func:`tokenize` as UTF-8 bytes, the fast path of indexing (bytes.translate is the quickest
    way Python has to split ASCII text). Same tokens, byte for byte."""
    if not text:
        return []
    if text.isascii():
        return text.encode("ascii").translate(_ASCII_BYTES_TABLE).split()
    # A lowercased token never holds a surrogate (they are not alphanumeric), so this encodes.
    return [t.lower().encode("utf-8") for t in WORD.findall(text)]
