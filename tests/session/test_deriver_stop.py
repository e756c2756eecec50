"""A session's deriver is started by the publisher's thread (its wake, after a commit) and
stopped by the writer's close: the two may meet, and stop() must then wait for the start in
progress instead of joining a thread not started yet (RuntimeError, which failed a close)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace

from memstore.session.deriver import Deriver


def test_stopping_a_deriver_while_it_is_being_started_does_not_fail(monkeypatch):
    """The publisher's thread starts the deriver (its wake) while the writer's close stops it:
    stop() waits for a start in progress instead of joining a thread not started yet."""
    started = threading.Event()
    real_start = threading.Thread.start

    def slow_start(self):
        started.set()
        time.sleep(0.2)
        real_start(self)

    source = SimpleNamespace(lock=threading.RLock(), active=0.0, log=SimpleNamespace(dir=Path(".")))
    deriver = Deriver(source)  # type: ignore[arg-type]
    monkeypatch.setattr(threading.Thread, "start", slow_start)
    waker = threading.Thread(target=deriver.wake)
    real_start(waker)
    assert started.wait(5)
    deriver.stop()  # joined the thread the wake started, or none
    waker.join()
