"""Where the archive writers put their lines: one ``Sink`` per file, written whole at the end
and dated (mtime) at its last line, as an agent's finished log is."""

from __future__ import annotations

import os
import random
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

_ALNUM = string.ascii_letters + string.digits


def token(r: random.Random, n: int) -> str:
    """``n`` random letters and digits (the tails of message, request and call ids)."""
    return "".join(r.choices(_ALNUM, k=n))


def hex_id(r: random.Random, n: int) -> str:
    return f"{r.getrandbits(4 * n):0{n}x}"


@dataclass
class WrittenFile:
    path: Path
    size: int
    lines: int


@dataclass
class Sink:
    """The lines of one file being made, and the time of the last one (milliseconds)."""

    path: Path
    clock: int
    parts: list[bytes] = field(default_factory=list)
    size: int = 0

    def emit(self, obj: Any) -> None:
        data = orjson.dumps(obj) + b"\n"
        self.parts.append(data)
        self.size += len(data)

    def tick(self, r: random.Random, low_ms: int, high_ms: int) -> int:
        self.clock += r.randint(low_ms, high_ms)
        return self.clock

    def close(self) -> WrittenFile:
        """Write the file (parents made as needed) and set its mtime to its last line's time."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "wb") as fh:
            fh.write(b"".join(self.parts))
        seconds = self.clock / 1000
        os.utime(self.path, (seconds, seconds))
        written = WrittenFile(self.path, self.size, len(self.parts))
        self.parts = []
        return written
