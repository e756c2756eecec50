"""The index connection of one open session, as its threads share it.

An :class:`IndexSlot` holds the session's current :class:`SessionIndex` (recovery replaces it
when it reopens, discards or rebuilds the index) and the lock that serializes the use of that
connection by the agent's thread, the publisher's and the deriver's. Each of them holds the slot,
not the index, so a replacement is seen by all of them.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Optional

from .index import IndexCorrupt, SavedState, SessionIndex

logger = logging.getLogger("memstore")


class IndexSlot:
    """``index`` is ``None`` until the first :meth:`open` and after :meth:`close`."""

    def __init__(self, path: Path):
        self.path = path
        self.index: Optional[SessionIndex] = None
        self.lock = threading.Lock()

    def open(self, *, fresh: bool = False, readonly: bool = False) -> Optional[SavedState]:
        """(Re)open the index; return what it says about the log, or ``None`` when it is empty,
        was corrupt (then it is discarded and recreated) or ``fresh`` was asked for (then it is
        discarded first). ``readonly`` opens it only to read what it knew (it is about to be
        replaced): then the index may be ``None`` too."""
        if self.index is not None:
            self.index.close()
            self.index = None
        if readonly:
            self.index = SessionIndex.open_readonly(self.path)
            if self.index is not None:
                try:
                    return self.index.load()
                except IndexCorrupt as exc:
                    logger.warning("not reading a corrupt index (it is rebuilt from the log): %s", exc)
                    return None
            if not os.path.lexists(self.path):
                return None
            # Not readable without writing (a WAL without its -shm, left by a crashed writer,
            # must be played back first; or not this memstore's format): the usual open.
        if fresh:
            SessionIndex.discard(self.path)
        try:
            self.index = SessionIndex.open(self.path)
            return self.index.load()
        except IndexCorrupt as exc:
            logger.warning("discarding a corrupt index (it is rebuilt from the log): %s", exc)
            if self.index is not None:
                self.index.close()
            SessionIndex.discard(self.path)
            self.index = SessionIndex.open(self.path)
            return None

    def build_in_memory(self) -> SessionIndex:
        """Close the index and put a new, empty one in its place, held in memory until
        :meth:`persist` writes it over the old file (which stays as it was until then)."""
        if self.index is not None:
            self.index.close()
        self.index = SessionIndex.in_memory(self.path)
        return self.index

    def persist(self) -> None:
        """Write the index built in memory to its path (see :meth:`SessionIndex.persist`); on
        failure the slot keeps the one in memory."""
        assert self.index is not None, "persist() without build_in_memory()"
        self.index = self.index.persist()

    def close(self) -> None:
        if self.index is not None:
            self.index.close()
            self.index = None

    def forget_after_fork(self) -> Optional[SessionIndex]:
        """In a forked child: a fresh lock (the thread that may have held this one does not
        exist there) and no index. Returns the inherited connection, which the caller keeps
        referenced and unused: closing it could checkpoint the parent's database under it."""
        self.lock = threading.Lock()
        index, self.index = self.index, None
        return index
