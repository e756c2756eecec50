"""How far an import is: sessions and bytes done, the rate, and the time left.

:class:`ProgressMeter` counts what the import has done (the bytes of the sources it read, the
sessions it finished) and tells the caller's ``progress(done_bytes, total_bytes)`` callback,
and, when that callback also has a ``status`` method, gives it an :class:`ImportProgress` with
the sessions, the rate and an estimate of the time left. :class:`ProgressLine` is such a
callback: it draws one line on a terminal (``memstore import`` uses it).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Optional, TextIO


@dataclass(frozen=True)
class ImportProgress:
    """A snapshot of an import: ``sessions_done`` of ``sessions_total`` (the sources that name a
    session; several sources naming one session count once), ``bytes_done`` of ``bytes_total``
    (the sources' sizes when the import began), the seconds since it began, the rate in bytes
    per second so far, and the seconds left at that rate (``None`` before anything was read)."""

    sessions_done: int
    sessions_total: int
    bytes_done: int
    bytes_total: int
    elapsed: float
    rate: float
    eta: Optional[float]

    def line(self) -> str:
        """``412/1,000 sessions  280.1/684.4 MB  23.4 MB/s  ETA 0:17`` (the time left as
        h:mm:ss past an hour)."""
        eta = "ETA --" if self.eta is None else f"ETA {_clock(self.eta)}"
        return (
            f"{self.sessions_done:,}/{self.sessions_total:,} sessions  "
            f"{self.bytes_done / 1e6:,.1f}/{self.bytes_total / 1e6:,.1f} MB  {self.rate / 1e6:,.1f} MB/s  {eta}"
        )


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class ProgressMeter:
    """Counts an import's progress and tells ``callback`` (see the module docstring). Bytes only
    go forward and never past the total; the last call says ``(total, total)``."""

    def __init__(self, callback: Optional[Callable[[int, int], None]], *, clock: Callable[[], float] = time.monotonic):
        self.callback = callback
        self.status: Optional[Callable[[ImportProgress], None]] = getattr(callback, "status", None)
        self.clock = clock
        self.started = clock()
        self.bytes_total = 0
        self.bytes_done = 0
        self.sessions_total = 0
        self.sessions_done = 0
        self._reserved = (0, 0)

    def reserve(self, bytes_total: int, sessions_total: int) -> None:
        """Work the import does besides what :meth:`begin` will be told (other stores' sessions),
        counted in the totals from the start."""
        self._reserved = (bytes_total, sessions_total)

    def begin(self, bytes_total: int, sessions_total: int) -> None:
        """The import's size, once its sources are known (plus what was reserved)."""
        self.bytes_total = bytes_total + self._reserved[0]
        self.sessions_total = sessions_total + self._reserved[1]
        self.started = self.clock()
        self._tell()

    def advance(self, n: int) -> None:
        """``n`` more bytes read (clamped to the total)."""
        n = max(0, min(n, self.bytes_total - self.bytes_done))
        if n:
            self.bytes_done += n
            self._tell()

    def session_done(self, n: int = 1) -> None:
        self.sessions_done = min(self.sessions_total, self.sessions_done + n)
        self._tell(bytes_moved=False)

    def finish(self) -> None:
        """Everything is done: the bytes reach the total."""
        self.sessions_done = self.sessions_total
        self.advance(self.bytes_total - self.bytes_done)
        self._tell(bytes_moved=False)

    def snapshot(self) -> ImportProgress:
        elapsed = max(0.0, self.clock() - self.started)
        rate = self.bytes_done / elapsed if elapsed > 0 else 0.0
        left = self.bytes_total - self.bytes_done
        eta = left / rate if rate > 0 else (0.0 if left == 0 and self.bytes_done else None)
        return ImportProgress(
            self.sessions_done, self.sessions_total, self.bytes_done, self.bytes_total, elapsed, rate, eta
        )

    def _tell(self, *, bytes_moved: bool = True) -> None:
        # Every change is told; the callback decides how often to draw.
        if self.callback is not None and bytes_moved and self.bytes_done:
            self.callback(self.bytes_done, self.bytes_total)
        if self.status is not None:
            self.status(self.snapshot())


class ProgressLine:
    """A progress callback that draws an :class:`ImportProgress` on one line of ``stream``
    (standard error by default): redrawn in place at most every ``interval`` seconds on a
    terminal; elsewhere written as a new line at most every ``quiet_interval`` seconds. The
    first and the last state are always drawn, except that with ``delay`` nothing is drawn
    before that many seconds have passed (an import that ends sooner shows no line at all).
    Call :meth:`close` at the end."""

    def __init__(
        self,
        label: str = "importing",
        stream: Optional[TextIO] = None,
        *,
        interval: float = 0.2,
        quiet_interval: float = 30.0,
        delay: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.interval = interval if self.tty else quiet_interval
        self.clock = clock
        self.shown_from = clock() + delay
        self.last_drawn: Optional[float] = None
        self.latest: Optional[ImportProgress] = None
        self.latest_drawn = False
        self.width = 0

    def __call__(self, done: int, total: int) -> None:
        """The plain byte callback: drawn only when no :meth:`status` comes with it."""
        if self.latest is None:
            self.status(ImportProgress(0, 0, done, total, 0.0, 0.0, None))

    def status(self, progress: ImportProgress) -> None:
        self.latest = progress
        self.latest_drawn = False
        now = self.clock()
        if now < self.shown_from:
            return
        if self.last_drawn is None or now - self.last_drawn >= self.interval:
            self._draw(progress)
            self.last_drawn = now

    def close(self) -> None:
        """Draw the last state (if it was not) and end the line (nothing when no line was drawn
        because the import ended within the delay)."""
        if self.latest is not None and self.last_drawn is not None:
            if not self.latest_drawn:
                self._draw(self.latest)
            if self.tty:
                self.stream.write("\n")
                self.stream.flush()

    def _draw(self, progress: ImportProgress) -> None:
        text = f"{self.label}  {progress.line()}"
        if self.tty:
            self.stream.write("\r" + text.ljust(self.width))
            self.width = len(text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()
        self.latest_drawn = True


__all__ = ["ImportProgress", "ProgressMeter", "ProgressLine"]
