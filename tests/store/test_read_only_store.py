"""A store this process may not write (a copy made read-only with ``chmod -R a-w``, run as a
user that is not root, so that the bits bite) can be read, listed, searched and checked by
doctor; every write is refused with :class:`memstore.StoreReadOnly` naming what could not be
written; and memstore changes no permission bit, anywhere, to get past it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from unprivileged import chown_tree, run_unprivileged, unprivileged_dir

import memstore
from memstore.maintenance import check_store, session_ids
from memstore.retention import RetentionPolicy
from memstore.session.manifest import list_sessions

PRELOAD = (
    "memstore.search",
    "memstore.catalog",
    "memstore.maintenance",
    "memstore.retention",
    "memstore.reader",
    "memstore.session.writer",
    "memstore.bm25",
    "memstore.importers",
    "memstore.views.registry",
    "memstore.session.manifest",
    "memstore.identity",
    "sqlite_utils",
    "numpy",
    "filelock",
    "encodings.idna",
)
USAGE = {"input_tokens": 900, "cached_input_tokens": 300, "cache_creation_tokens": 0, "output_tokens": 120}
REPLIES = [
    "The flaky upload test fails because the retry loop reuses a closed HTTP connection pool.",
    "Moved the connection pool into the retry scope and added a regression test for timeouts.",
    "Benchmarked the parser: tokenizing dominates, so the regex alternation was split in two.",
]


def _make_store(root: Path) -> None:
    for n, text in enumerate(REPLIES):
        with memstore.open_session(root, f"s{n}") as log:
            log.append({"type": "turn.started"})
            log.append({"type": "item.completed", "item": {"type": "agent_message", "text": text}})
            log.append({"type": "turn.completed", "usage": USAGE})
    memstore.refresh_catalog(root)


def _modes(root: Path) -> dict[str, tuple[int, int]]:
    """Every entry under ``root`` (and ``root``) with its mode and size."""
    found = {".": (os.lstat(root).st_mode, 0)}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            found[os.path.relpath(path, root)] = (st.st_mode, st.st_size if stat.S_ISREG(st.st_mode) else 0)
    return found


def _make_read_only(root: Path) -> None:
    """As ``cp -r`` under a umask of 022 and then ``chmod -R a-w`` leave a copy: directories
    0555, files 0444 (the catalog's lock file and the like included)."""
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            os.chmod(os.path.join(dirpath, name), 0o444)
    for dirpath, _dirnames, _filenames in os.walk(root, topdown=False):
        os.chmod(dirpath, 0o555)


def _read_everything(root: str) -> dict:
    """What a reader gets from the read-only store (run as the unprivileged user)."""
    with memstore.read_session(root, "s1") as reader:
        turns = reader.manifest.turn_count
    hits = memstore.search_memory(root, "connection pool retry")
    report = check_store(root)
    fixed = check_store(root, fix=True)
    return {
        "fixed_any": any(p.fixed for p in fixed.problems),
        "turns": turns,
        "ids": session_ids(root),
        "listed": len(list_sessions(root)),
        "hits": sorted({h.session_id for h in hits}),
        "doctor_sessions": report.sessions,
        "doctor_kinds": sorted({p.check for p in report.problems}),
    }


def _write(root: str, what: str) -> str:
    """One write to the read-only store; the error it raised, as ``ClassName: message``."""
    try:
        if what == "append":
            with memstore.open_session(root, "s0") as log:
                log.append({"type": "turn.started"})
        elif what == "new session":
            with memstore.open_session(root, "brand-new") as log:
                log.append({"type": "turn.started"})
        elif what == "refresh":
            memstore.refresh_catalog(root)
        elif what == "retention":
            memstore.apply_retention(root, RetentionPolicy(max_sessions=0, max_age_days=0), apply=True)
        elif what == "rebuild":
            memstore.rebuild(root, "s0")
        elif what == "label":
            memstore.Store(root).set_label("mine") if hasattr(memstore.Store, "set_label") else (
                __import__("memstore.identity").identity.set_label(root, "mine")
            )
        else:
            raise AssertionError(what)
    except memstore.StoreReadOnly as exc:
        return f"StoreReadOnly: {exc}"
    except BaseException as exc:  # the test says which
        return f"{type(exc).__name__}: {exc}"
    return "no error"


@pytest.fixture(scope="module")
def read_only_store():
    with unprivileged_dir() as base:
        root = base / "store"
        _make_store(root)
        chown_tree(base)
        _make_read_only(root)
        yield root, _modes(root)


def test_a_read_only_store_is_read_listed_searched_and_checked(read_only_store):
    root, before = read_only_store
    seen = run_unprivileged(_read_everything, str(root), preload=PRELOAD)
    assert seen["turns"] == 1
    assert seen["ids"] == ["s0", "s1", "s2"]
    assert seen["listed"] == 3
    assert seen["hits"] and set(seen["hits"]) <= {"s0", "s1"}
    assert seen["doctor_sessions"] == 3
    # The copy is readable by everyone (chmod a-w keeps r-x): doctor says so, and that is all;
    # --fix leaves the permissions of a store it may not write as they are.
    assert seen["doctor_kinds"] == ["permissions"]
    assert not seen["fixed_any"]
    assert _modes(root) == before


@pytest.mark.parametrize("what", ["append", "new session", "refresh", "retention", "rebuild", "label"])
def test_every_write_to_a_read_only_store_is_a_store_read_only_error(read_only_store, what):
    root, before = read_only_store
    outcome = run_unprivileged(_write, str(root), what, preload=PRELOAD)
    assert outcome.startswith("StoreReadOnly: "), outcome
    assert str(root) in outcome
    assert _modes(root) == before  # nothing created, nothing chmodded
