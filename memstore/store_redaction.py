"""A store's redaction as the write path sees it: whether events are redacted before they are
written (``[redact] at_write``), and the redactor every derived view of a session uses.

The write path must stay light: an agent that only appends, in a store without a
``config.toml``, pays one failed ``open`` here and never imports :mod:`memstore.redact` (whose
rules take tens of milliseconds to compile) on its own thread. The redactor is made on first use,
which for the search chunks is the deriver's thread; a store that asks for write-time
redaction pays for it at its first append, as it asked.

A malformed ``config.toml`` is never ignored: :func:`store_redaction` raises
:class:`~memstore.redact.RedactConfigError` naming the file, so a typo cannot silently turn
write-time redaction off.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from .layout import config_path

if TYPE_CHECKING:
    from .redact import RedactConfig, Redactor


class StoreRedaction:
    """The redaction settings of the store at ``root``: ``at_write`` and, made on first use,
    the store's :class:`~memstore.redact.Redactor` (:meth:`redactor`, :meth:`redact_event`).
    Safe to share between threads."""

    def __init__(self, root: os.PathLike | str, config: Optional[RedactConfig]):
        self.root = Path(root)
        self._config = config
        self.at_write = bool(config is not None and config.at_write)
        self._redactor: Optional[Redactor] = None
        self._lock = threading.Lock()

    def redactor(self) -> Redactor:
        """The store's redactor (its built-in rules plus ``config.toml``'s)."""
        redactor = self._redactor
        if redactor is None:
            from .redact import Redactor

            with self._lock:
                if self._redactor is None:
                    self._redactor = Redactor(self._config)
                redactor = self._redactor
        return redactor

    def redact_event(self, event: Any) -> Any:
        """``event`` with every secret in it replaced by its marker (the same object when it
        holds none; never modified in place)."""
        return self.redactor().redact_value(event)


def store_redaction(root: os.PathLike | str) -> StoreRedaction:
    """The redaction of the store at ``root``, from its ``config.toml`` (read now; the
    defaults when there is none)."""
    if not os.path.lexists(config_path(root)):
        return StoreRedaction(root, None)
    from .redact import load_config

    return StoreRedaction(root, load_config(root))


__all__ = ["StoreRedaction", "store_redaction"]
