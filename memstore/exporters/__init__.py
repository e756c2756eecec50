"""Exports of a store for other tools: Parquet for query engines, OTLP/JSON traces for
observability backends.

- :func:`memstore.exporters.parquet.export_parquet` writes the catalog's facts (sessions, turns,
  events, tool calls, commands, file changes, token usage and cost) as Hive-partitioned Parquet,
  incrementally (only sessions that changed are written again), never leaving a reader a
  half-written file.
- :func:`memstore.exporters.otlp.export_otlp` writes each session as an OpenTelemetry trace
  following the GenAI semantic conventions.

Both read the catalog (refreshed first), price turns with :mod:`memstore.pricing` and pass
every text through the store's redactor. Parquet needs the ``export`` extra (``pyarrow``); an
object-store destination needs ``fsspec`` and the filesystem's package. The reference is
``docs/export.md``.
"""

from __future__ import annotations

from ..errors import MemstoreError


class ExportError(MemstoreError):
    """An export cannot be done as asked (a destination that holds something else, say)."""


class MissingExtra(ExportError):
    """An export needs a package that is not installed; the message says what to install."""


__all__ = ("ExportError", "MissingExtra")
