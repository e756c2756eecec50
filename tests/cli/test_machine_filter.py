"""`memstore sessions --machine` and `memstore search --machine`: with a devbox's store imported
into a laptop's (by `memstore import`), each lists exactly the sessions born in the machine
named, by its label or its store id, and nothing for a machine the store has none of."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from machines import DEVBOX_SESSIONS, LAPTOP_SESSIONS, TwoMachines, two_machines

from memstore.cli import cli


@pytest.fixture(scope="module")
def machines(tmp_path_factory) -> TwoMachines:
    return two_machines(tmp_path_factory.mktemp("cli-machines"))


def run_json(*args: str):
    result = CliRunner().invoke(cli, [*args, "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.mark.parametrize("which", ["laptop", "devbox"])
def test_sessions_and_search_by_machine(machines, which):
    expected = set(LAPTOP_SESSIONS if which == "laptop" else DEVBOX_SESSIONS)
    store_id = machines.laptop_id if which == "laptop" else machines.devbox_id
    root = str(machines.root)
    for machine in (which, store_id):
        listed = run_json("sessions", "--root", root, "--machine", machine)
        assert {s["session_id"] for s in listed} == expected
        assert {(s["origin_store_id"], s["origin_label"]) for s in listed} == {(store_id, which)}
        hits = run_json("search", "widget", "--root", root, "--machine", machine, "-n", "50")
        assert {h["session_id"] for h in hits} == expected


def test_machine_filter_with_a_limit_and_an_unknown_machine(machines):
    root = str(machines.root)
    assert len(run_json("sessions", "--root", root)) == 4
    one = run_json("sessions", "--root", root, "--machine", "devbox", "-n", "1")
    assert len(one) == 1 and one[0]["session_id"] in DEVBOX_SESSIONS
    assert run_json("sessions", "--root", root, "--machine", "nowhere") == []
    assert run_json("search", "widget", "--root", root, "--machine", "nowhere") == []
    text = CliRunner().invoke(cli, ["sessions", "--root", root, "--machine", "devbox"], catch_exceptions=False)
    assert text.exit_code == 0
    assert all(sid in text.stdout for sid in DEVBOX_SESSIONS)
    assert not any(sid in text.stdout for sid in LAPTOP_SESSIONS)


def test_the_table_names_each_sessions_machine(machines):
    """Once the store holds sessions of two machines, `memstore sessions` says whose each is."""
    result = CliRunner().invoke(cli, ["sessions", "--root", str(machines.root)], catch_exceptions=False)
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert "machine" in lines[0].split()
    for line in lines[1:]:
        sid = line.split()[0]
        assert ("laptop" if sid in LAPTOP_SESSIONS else "devbox") in line.split(), line
    none = CliRunner().invoke(cli, ["sessions", "--root", str(machines.root), "--machine", "nowhere"])
    assert none.exit_code == 0 and none.stdout.startswith("no sessions of machine nowhere in ")
