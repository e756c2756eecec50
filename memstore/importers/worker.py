"""An import's worker process: ``python -m memstore.importers.worker``, driven over its standard
input and output by :mod:`.pipeline`.

A worker is a fresh interpreter (nothing of the parent is inherited: no threads, no open
sessions, no locks, and the caller's main module is never run again, as ``multiprocessing``'s
spawn would). It reads frames from standard input: first the run's :class:`Settings`, then
tasks; it writes frames to its standard output: the bytes it read as it goes, the log records
of memstore's loggers, and each task's outcomes, or the error that stopped it. A frame is an
8-byte big-endian length followed by a pickle (both ends are this package: nothing foreign is
ever unpickled). Anything else that writes to standard output is sent to standard error, so it
cannot corrupt the frames. The worker ends when its input closes.
"""

from __future__ import annotations

import logging
import os
import pickle
import struct
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, Optional

_HEADER = struct.Struct(">Q")
# A worker tells the bytes it read at most this often.
PROGRESS_SECONDS = 0.1


def write_frame(stream: IO[bytes], message: Any) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def read_frame(stream: IO[bytes]) -> Optional[Any]:
    """The next message, or ``None`` at the end of the stream (a frame cut short counts as the
    end: its writer died)."""
    header = _read_exactly(stream, _HEADER.size)
    if header is None:
        return None
    body = _read_exactly(stream, _HEADER.unpack(header)[0])
    return None if body is None else pickle.loads(body)


def _read_exactly(stream: IO[bytes], size: int) -> Optional[bytes]:
    chunks = []
    while size:
        chunk = stream.read(size)
        if not chunk:
            return None
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


class ForwardLogs(logging.Handler):
    """Sends the log records of memstore's loggers to the parent, which logs them as its own."""

    def __init__(self, send: Callable[[Any], None]):
        super().__init__()
        self.send = send

    def emit(self, record: logging.LogRecord) -> None:
        try:
            record.msg = record.getMessage()
            record.args = None
            if record.exc_info:
                record.exc_text = logging.Formatter().formatException(record.exc_info)
                record.exc_info = None
            self.send(("log", record))
        except Exception:  # a log record must never break the import
            self.handleError(record)


def serve(requests: IO[bytes], replies: IO[bytes]) -> None:
    """Run tasks read from ``requests`` until it ends, replying on ``replies``."""
    from ..tombstones import Tombstones
    from .staging import Staging
    from .tasks import run_task

    def send(message: Any) -> None:
        write_frame(replies, message)

    settings = read_frame(requests)
    if settings is None:
        return
    memstore_logger = logging.getLogger("memstore")
    memstore_logger.setLevel(settings.log_level)
    memstore_logger.addHandler(ForwardLogs(send))
    memstore_logger.propagate = False
    root = Path(settings.root)
    staging = Staging.join(root, settings.staging)
    tombstones = Tombstones(root)
    try:
        while True:
            request = read_frame(requests)
            if request is None:
                return
            number, task, area = request
            pending = [0, time.monotonic()]

            def advance(n: int, pending: list = pending) -> None:
                pending[0] += n
                now = time.monotonic()
                if now - pending[1] >= PROGRESS_SECONDS:
                    send(("bytes", pending[0]))
                    pending[0], pending[1] = 0, now

            try:
                results = run_task(task, settings, staging.area(area), tombstones, advance)
            except BaseException as exc:  # told to the parent, which stops the run
                if pending[0]:
                    send(("bytes", pending[0]))
                send(("error", number, _portable(exc)))
                if not isinstance(exc, Exception):
                    raise
                continue
            if pending[0]:
                send(("bytes", pending[0]))
            send(("done", number, results))
    finally:
        staging.close(remove=False)


def _portable(exc: BaseException) -> BaseException:
    """``exc`` if it survives a pickle round trip, else a RuntimeError saying what it was."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        return RuntimeError(f"an import worker failed: {text}")


def main() -> None:
    # The frames go to the real standard output; anything printed goes to standard error.
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    serve(sys.stdin.buffer, replies)


if __name__ == "__main__":
    main()
