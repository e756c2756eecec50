"""Helpers of the importer tests (a uniquely named module, see tests/conftest.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

_KILLED_AT = """
import os, signal, sys, memstore
from memstore.importers import pipeline, staging, stores
pipeline.BATCH_SESSIONS = stores.BATCH_SESSIONS = int(sys.argv[5])
calls = [0]
real = getattr(staging, sys.argv[3])
def die_on_the_nth(*args, **kwargs):
    calls[0] += 1
    if calls[0] == int(sys.argv[4]):
        os.kill(os.getpid(), signal.SIGKILL)
    return real(*args, **kwargs)
setattr(staging, sys.argv[3], die_on_the_nth)
memstore.import_logs(sys.argv[1], sys.argv[2], jobs=1)
"""


def import_killed_at(root: Path, source: Path, where: str, nth: int, batch: int) -> int:
    """Run ``import_logs(root, source)`` in a child process (batches of ``batch`` sessions) that
    SIGKILLs itself on its ``nth`` call of ``memstore.importers.staging.<where>``; return its
    exit status."""
    done = subprocess.run(
        [sys.executable, "-c", _KILLED_AT, str(root), str(source), where, str(nth), str(batch)], cwd=REPO, timeout=300
    )
    return done.returncode
