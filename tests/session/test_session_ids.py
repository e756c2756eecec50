"""Session ids: one id, one directory, always inside ``<root>/sessions``; bad ids refused."""

from __future__ import annotations

import string

import hypothesis
import hypothesis.strategies as st
import pytest

import memstore
from memstore.layout import session_dir_name

ids = st.one_of(
    st.text(min_size=1, max_size=40),
    st.text(alphabet=string.ascii_letters + string.digits + "-_./:\\~ ", min_size=1, max_size=300),
    st.text(alphabet="ab/_:.", min_size=1, max_size=8),
).filter(lambda s: s not in (".", "..") and "\0" not in s)


@hypothesis.settings(max_examples=400, deadline=None)
@hypothesis.given(st.sets(ids, min_size=2, max_size=12))
def test_distinct_ids_get_distinct_directories(id_set):
    names = [session_dir_name(i) for i in id_set]
    assert len(set(names)) == len(names)
    for name in names:
        assert "/" not in name and "\0" not in name and name not in ("", ".", "..")
        assert not name.startswith(".")
        assert len(name.encode()) <= 255


def test_ids_that_only_differ_in_what_the_sanitizer_maps_get_their_own_directories(tmp_path):
    directories = set()
    for sid in ("a/b", "a_b", "a:b", "a b", "a\\b"):
        with memstore.open_session(tmp_path, sid) as log:
            log.append({"type": "note", "id": sid})
            directories.add(log.directory)
    assert len(directories) == 5
    for sid in ("a/b", "a_b", "a:b", "a b", "a\\b"):
        with memstore.open_session(tmp_path, sid) as log:
            assert [e["id"] for e in log.iter_events()] == [sid]
            assert log.manifest.session_id == sid


@pytest.mark.parametrize("bad", ["", ".", "..", "a\0b", "x" * 1025, "run-\udce9"])
def test_bad_ids_are_refused_before_anything_is_created(tmp_path, bad):
    root = tmp_path / "store"
    with pytest.raises(memstore.InvalidSessionId):
        memstore.open_session(root, bad)
    with pytest.raises(memstore.InvalidSessionId):
        memstore.session_directory(root, bad)
    assert not root.exists()


def test_a_long_id_works_and_stays_inside_the_store(tmp_path):
    sid = "../" * 300  # 900 characters, every one hostile
    with memstore.open_session(tmp_path, sid) as log:
        log.append({"type": "turn.started"})
        log.append({"type": "turn.completed", "usage": {}})
        directory = log.directory
    assert directory.parent == tmp_path / "sessions"
    assert len(directory.name) < 100
    assert memstore.rebuild(tmp_path, sid).session_id == sid
    # Nothing outside the store's own entries (the rebuild refreshed the catalog).
    assert sorted(p.name for p in tmp_path.iterdir()) == ["catalog.db", "changes", "locks", "sessions", "store.json"]
    assert [p.name for p in (tmp_path / "sessions").iterdir()] == [directory.name]


def test_plain_ids_keep_vt_codes_directory_names():
    for sid in ("session-20260812T093610Z", "run-42", "a.b.c", "_x", "-y"):
        assert session_dir_name(sid) == sid
    assert session_dir_name("x" * 200) == "x" * 200
    assert session_dir_name("x" * 201) != "x" * 201
