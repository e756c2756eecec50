"""The warm state a process keeps of a store's catalog: a connection per thread, which goes
with its thread, so a process whose threads come and go (a server's requests, a worker pool
that is resized) holds no more open catalog files than it has live threads; and ``close``
closes those still held, from any thread."""

from __future__ import annotations

import gc
import os
import threading
import time

from catalog_support import turn

import memstore
from memstore.catalog import LiveCatalog


def catalog_fds(root) -> int:
    """How many of this process's file descriptors are open on ``catalog.db`` (its side files not
    counted)."""
    target = os.path.realpath(os.path.join(root, "catalog.db"))
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == target:
                count += 1
        except OSError:
            continue
    return count


def settled(check, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        gc.collect()
        time.sleep(0.05)
    return True


def test_connections_of_ended_threads_are_closed(tmp_path):
    with memstore.open_session(tmp_path, "a") as log:
        turn(log, 1)
    store = memstore.Store(tmp_path, sweep_interval=3600)
    assert [h.session_id for h in store.search("widget", limit=1)] == ["a"]
    before = catalog_fds(tmp_path)
    assert before >= 1
    found: list[int] = []

    def search() -> None:
        found.append(len(store.search("widget", limit=3)))

    for _ in range(20):
        threads = [threading.Thread(target=search) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert found == [3] * 60
    # 60 threads searched; none left its connection open. SQLite itself keeps a few descriptors
    # of closed connections while another connection of the process holds a lock on the file
    # (closing them would drop the process's locks), and reuses them: a handful, not one per
    # thread (a connection kept per thread would leave 60).
    assert settled(lambda: catalog_fds(tmp_path) <= before + 4)
    store.close()
    assert catalog_fds(tmp_path) == 0


def test_close_closes_every_live_threads_connection(tmp_path):
    with memstore.open_session(tmp_path, "a") as log:
        turn(log, 1)
    live = LiveCatalog(tmp_path, sweep_interval=3600)
    live.ensure_current()
    ready, done = threading.Barrier(3), threading.Event()

    def hold() -> None:
        live.connection().execute("SELECT count(*) FROM sessions").fetchone()
        ready.wait()
        done.wait()

    threads = [threading.Thread(target=hold) for _ in range(2)]
    for t in threads:
        t.start()
    ready.wait()
    assert catalog_fds(tmp_path) >= 2
    live.close()
    assert catalog_fds(tmp_path) == 0
    done.set()
    for t in threads:
        t.join()
    assert settled(lambda: catalog_fds(tmp_path) == 0)
    # Usable again afterwards: a new connection is opened on demand.
    assert live.connection().execute("SELECT count(*) FROM sessions").fetchone() == (1,)
    live.close()
