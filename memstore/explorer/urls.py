"""The explorer's URLs: one place builds them and one place reads them back.

Session ids are arbitrary text (``a/b``, ``x:y``, ids with spaces), so they travel
percent-encoded in one path segment. Datasette matches routes against the raw path, so
``%2F`` never splits a segment. An id ending in ``.json`` gets its last dot encoded, so the
``.json`` suffix of the JSON variant is never ambiguous.
"""

from __future__ import annotations

from typing import Optional
from urllib.parse import quote, unquote, urlencode

PREFIX = "-/memstore"


def quote_id(session_id: str) -> str:
    """``session_id`` as one path segment."""
    quoted = quote(session_id, safe="")
    if quoted.endswith(".json"):
        quoted = quoted[: -len(".json")] + "%2Ejson"
    return quoted


def unquote_id(segment: str) -> str:
    """The session id a path segment names (the inverse of :func:`quote_id`)."""
    return unquote(segment, errors="strict")


class Urls:
    """URL builder for the explorer under Datasette's ``base_url`` (``/`` by default)."""

    def __init__(self, base: str = "/", database: str = "catalog"):
        self.base = base if base.endswith("/") else base + "/"
        self.database = database

    def home(self, fmt: str = "", **params) -> str:
        return self._with(f"{self.base}{PREFIX}{fmt}", params)

    def session(self, session_id: str, fmt: str = "", **params) -> str:
        return self._with(f"{self.base}{PREFIX}/sessions/{quote_id(session_id)}{fmt}", params)

    def turn(self, session_id: str, number: int, fmt: str = "", *, anchor: Optional[int] = None, **params) -> str:
        url = self._with(f"{self.base}{PREFIX}/sessions/{quote_id(session_id)}/turns/{int(number)}{fmt}", params)
        return f"{url}#e{int(anchor)}" if anchor is not None else url

    def event(self, session_id: str, seq: int, fmt: str = "") -> str:
        return f"{self.base}{PREFIX}/sessions/{quote_id(session_id)}/events/{int(seq)}{fmt}"

    def search(self, fmt: str = "", **params) -> str:
        return self._with(f"{self.base}{PREFIX}/search{fmt}", params)

    def table(self, table: str, **params) -> str:
        """Datasette's own view of a catalog table (or view), filtered by ``params``."""
        return self._with(f"{self.base}{quote(self.database, safe='')}/{quote(table, safe='')}", params)

    def query(self, name: str) -> str:
        return f"{self.base}{quote(self.database, safe='')}/{quote(name, safe='')}"

    @staticmethod
    def _with(url: str, params: dict) -> str:
        params = {k: v for k, v in params.items() if v is not None and v != ""}
        return f"{url}?{urlencode(params)}" if params else url
