"""Where a store's explorer runs (memstore.location): `memstore serve` records its URL; the
record counts only while its process lives and its port answers; a server removes only its
own record; a record that cannot be written or read costs the links, never the command."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from click.testing import CliRunner

from memstore.cli import cli
from memstore.location import (
    ExplorerRecord,
    explorer_record_path,
    forget_explorer,
    record_explorer,
    running_explorer,
)


def listening() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    return sock


def test_a_record_counts_while_its_process_lives_and_its_port_answers(tmp_path):
    with listening() as sock:
        port = sock.getsockname()[1]
        record = ExplorerRecord(str(tmp_path), f"http://localhost:{port}/", "127.0.0.1", port, os.getpid())
        assert record_explorer(record) == explorer_record_path(tmp_path)
        assert running_explorer(tmp_path) == record
        assert running_explorer(tmp_path / "other") is None  # each store its own record
        dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
        gone = ExplorerRecord(str(tmp_path), record.base_url, "127.0.0.1", port, int(dead.stdout))
        record_explorer(gone)
        assert running_explorer(tmp_path) is None  # its process has exited (killed, say)
    record_explorer(record)
    assert running_explorer(tmp_path) is None  # the port no longer answers


def test_a_server_forgets_only_its_own_record(tmp_path):
    mine = ExplorerRecord(str(tmp_path), "http://localhost:1/", "127.0.0.1", 1, os.getpid())
    record_explorer(mine)
    forget_explorer(tmp_path, os.getpid() + 1)  # another server of the same store, stopping
    assert explorer_record_path(tmp_path).is_file()
    forget_explorer(tmp_path, os.getpid())
    assert not explorer_record_path(tmp_path).exists()
    forget_explorer(tmp_path, os.getpid())  # nothing there: nothing to do


def test_a_damaged_record_is_no_explorer(tmp_path):
    path = explorer_record_path(tmp_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for text in (b"", b"{not json", b'{"root": "x"}', b'{"root":"x","base_url":"u","host":"h","port":"p","pid":1}'):
        path.write_bytes(text)
        assert running_explorer(tmp_path) is None


def test_serve_without_a_runtime_directory_warns_and_serves(tmp_path, monkeypatch):
    """A runtime directory that cannot be made: a warning says links will not be offered, and
    the server runs all the same."""
    from memstore import open_session
    from memstore.explorer import server

    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)  # (platformdirs takes only a private one)
    (runtime / "memstore").write_text("")  # a file where memstore's runtime directory goes
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    with open_session(tmp_path / "store", "s") as log:
        log.append({"type": "turn.started"})
    served = []
    monkeypatch.setattr(server, "_run_server", lambda app, host, port: served.append(port))
    result = CliRunner().invoke(cli, ["serve", "--root", str(tmp_path / "store"), "--port", "0"])
    assert result.exit_code == 0, result.output
    assert served and "memstore: warning: links to this explorer will not be offered" in result.stderr


def test_no_safe_runtime_directory_costs_only_the_links(tmp_path, monkeypatch, caplog):
    """platformdirs refuses a runtime directory another user could have made (a fault this
    test cannot make as root, hence the stand-in): nothing is recorded, a warning says so,
    and looking for an explorer finds none instead of failing."""
    import logging

    import platformdirs

    def refuse(*args, **kwargs):
        raise PermissionError("runtime directory /tmp/runtime-1000 is not owned by you")

    monkeypatch.setattr(platformdirs, "user_runtime_dir", refuse)
    record = ExplorerRecord(str(tmp_path), "http://localhost:1/", "127.0.0.1", 1, os.getpid())
    with caplog.at_level(logging.WARNING, logger="memstore"):
        assert record_explorer(record) is None
    assert "no runtime directory" in caplog.text
    assert running_explorer(tmp_path) is None
    forget_explorer(tmp_path, os.getpid())
