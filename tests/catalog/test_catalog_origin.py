"""Each session's origin in the catalog, and the machine filter of search: with a devbox's store
imported into a laptop's, the catalog records which store (machine) each session was born in,
and filtering by either machine, by its id or its label, returns exactly that machine's
sessions, through the catalog's SQL and through every search entry point."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from machines import DEVBOX_SESSIONS, LAPTOP_SESSIONS, TwoMachines, two_machines, write_session

import memstore
from memstore.catalog import refresh_catalog
from memstore.identity import set_label
from memstore.search import search_catalog


@pytest.fixture(scope="module")
def machines(tmp_path_factory) -> TwoMachines:
    return two_machines(tmp_path_factory.mktemp("origin"))


def _rows(root: Path, sql: str, params: tuple = ()) -> list[tuple]:
    conn = sqlite3.connect(root / "catalog.db")
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def test_the_catalog_records_where_each_session_was_born(machines):
    """Sessions born here carry this store's id and label and no id elsewhere; imported ones the
    devbox's id and label, their id there and the root they came from. The import's change feed
    brought them in: the refresh after it copied them."""
    assert sorted(machines.refresh.added) == sorted(DEVBOX_SESSIONS)
    rows = {
        row[0]: row[1:]
        for row in _rows(
            machines.root,
            "SELECT session_id, origin_store_id, origin_label, origin_session_id, origin_root FROM sessions",
        )
    }
    assert set(rows) == set(LAPTOP_SESSIONS) | set(DEVBOX_SESSIONS)
    for sid in LAPTOP_SESSIONS:
        assert rows[sid] == (machines.laptop_id, "laptop", None, None)
    for sid in DEVBOX_SESSIONS:
        assert rows[sid] == (machines.devbox_id, "devbox", sid, str(machines.devbox.absolute()))


def test_sql_over_the_catalog_splits_the_sessions_by_machine(machines):
    by_machine = dict(
        _rows(
            machines.root,
            "SELECT origin_label, group_concat(session_id) FROM "
            "(SELECT origin_label, session_id FROM sessions ORDER BY session_id) GROUP BY origin_label",
        )
    )
    assert {k: set(v.split(",")) for k, v in by_machine.items()} == {
        "laptop": set(LAPTOP_SESSIONS),
        "devbox": set(DEVBOX_SESSIONS),
    }


@pytest.mark.parametrize("which", ["laptop", "devbox"])
def test_search_by_machine_returns_exactly_its_sessions(machines, which):
    """By id or by label, through search_memory, Store.search and search_catalog: every hit is of
    that machine's sessions, and every one of its sessions is hit."""
    expected = set(LAPTOP_SESSIONS if which == "laptop" else DEVBOX_SESSIONS)
    store_id = machines.laptop_id if which == "laptop" else machines.devbox_id
    for machine in (which, store_id, f"  {which} "):
        hits = memstore.search_memory(machines.root, "widget", 50, machine=machine)
        assert {h.session_id for h in hits} == expected, machine
        with memstore.Store(machines.root) as store:
            assert {h.session_id for h in store.search("widget", limit=50, machine=machine)} == expected
    conn = sqlite3.connect(machines.root / "catalog.db")
    try:
        page = search_catalog(conn, "widget", limit=50, machine=which)
        assert {r.session_id for r in page.results} == expected and page.total == len(page.results)
    finally:
        conn.close()


def test_search_by_machine_combines_with_the_other_filters(machines):
    everything = memstore.search_memory(machines.root, "widget", 50)
    assert {h.session_id for h in everything} == set(LAPTOP_SESSIONS) | set(DEVBOX_SESSIONS)
    assert memstore.search_memory(machines.root, "widget", 50, machine="devbox", session_id="fix-parser") == []
    one = memstore.search_memory(machines.root, "widget", 50, machine="devbox", session_id="deploy-ci")
    assert {h.session_id for h in one} == {"deploy-ci"}
    assert memstore.search_memory(machines.root, "widget", 50, machine="no-such-machine") == []


def test_a_new_label_reaches_the_sessions_born_here(tmp_path):
    """The label is the store's, not the sessions': renaming the store renames the origin of its
    own sessions at the next refresh, and leaves the imported ones' alone."""
    machines = two_machines(tmp_path)
    set_label(machines.root, "workstation")
    refresh_catalog(machines.root)
    labels = dict(_rows(machines.root, "SELECT session_id, origin_label FROM sessions"))
    assert labels == {**dict.fromkeys(LAPTOP_SESSIONS, "workstation"), **dict.fromkeys(DEVBOX_SESSIONS, "devbox")}
    hits = memstore.search_memory(machines.root, "widget", 50, machine="workstation")
    assert {h.session_id for h in hits} == set(LAPTOP_SESSIONS)


def test_a_catalog_of_the_layout_without_origins_is_built_again_with_them(tmp_path):
    """A catalog of the previous layout (no origin columns) is set aside and rebuilt."""
    machines = two_machines(tmp_path)
    conn = sqlite3.connect(machines.root / "catalog.db")
    with conn:
        conn.execute("UPDATE _sqlite_migrations SET name = 'tables_4' WHERE name = 'tables_5'")
        conn.execute("UPDATE sessions SET origin_store_id = NULL, origin_label = NULL")
    conn.close()
    hits = memstore.search_memory(machines.root, "widget", 50, machine="devbox")
    assert {h.session_id for h in hits} == set(DEVBOX_SESSIONS)
    assert list(machines.root.glob("catalog.db.unreadable-*"))


def test_a_colliding_id_and_a_session_passed_on_keep_their_first_machine(tmp_path):
    """A devbox session whose id names another session here comes in qualified, and is still the
    devbox's; sessions the laptop's store is copied on with (to a third store) stay the machine's
    they were born in, not the store's that passed them on."""
    machines = two_machines(tmp_path / "a")
    third = tmp_path / "ci"
    third.mkdir()
    set_label(third, "ci-runner")
    # The same id as one of the devbox's sessions, another session.
    write_session(third, "deploy-ci", "the widget deploy on the ci runner needed a warm cache", cwd="/builds/widgets")
    memstore.import_logs(third, machines.root)
    refresh_catalog(third)
    rows = {
        sid: (label, there)
        for sid, label, there in _rows(third, "SELECT session_id, origin_label, origin_session_id FROM sessions")
    }
    qualified = [sid for sid in rows if sid.startswith("deploy-ci-from-")]
    assert len(qualified) == 1 and rows[qualified[0]] == ("devbox", "deploy-ci")
    assert rows["deploy-ci"] == ("ci-runner", None)
    assert {sid: label for sid, (label, _there) in rows.items() if label == "laptop"} == dict.fromkeys(
        LAPTOP_SESSIONS, "laptop"
    )
    for machine, expected in (
        ("devbox", {"tune-index", qualified[0]}),
        ("laptop", set(LAPTOP_SESSIONS)),
        ("ci-runner", {"deploy-ci"}),
    ):
        assert {h.session_id for h in memstore.search_memory(third, "widget", 50, machine=machine)} == expected
