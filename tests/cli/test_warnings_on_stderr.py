"""What a command handles and goes on from is logged as a warning of a `memstore` logger and
reaches the person on stderr as `memstore: warning: ...` (stdout stays the command's answer);
-q leaves errors only, -v adds what the library reports at info level."""

from __future__ import annotations

import logging

from click.testing import CliRunner

import memstore
from memstore.cli import cli


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def test_a_session_that_does_not_rebuild_is_a_warning_and_the_others_go_on(tmp_path):
    with memstore.open_session(tmp_path, "real") as log:
        log.append({"type": "turn.started"})
    result = run("rebuild", "real", "gone", "--root", tmp_path)
    assert result.exit_code == 1
    assert "real: 1 event" in result.stdout and "gone" not in result.stdout
    (line,) = [line for line in result.stderr.splitlines() if "gone" in line]
    assert line.startswith("memstore: warning: gone: not rebuilt, the others are:")
    quiet = run("rebuild", "real", "gone", "--root", tmp_path, "-q")
    assert quiet.exit_code == 1 and "gone" not in quiet.stderr


def test_an_import_problem_is_a_warning_and_the_import_goes_on(tmp_path):
    """A file that is no agent log is reported (a warning naming it) and skipped; the import
    of the rest is done and summarised on stdout."""
    logs = tmp_path / "logs"
    logs.mkdir()
    stray = logs / "notes.jsonl"
    stray.write_text('{"hello": "this is not an agent log"}\n')
    result = run("import", logs, "--root", tmp_path / "store")
    assert result.exit_code == 0, result.output
    assert f"memstore: warning: {stray}: not a Codex or Claude Code log" in result.stderr
    assert "1 problem" in result.stdout and "memstore: warning" not in result.stdout
    assert "warning" not in run("import", logs, "--root", tmp_path / "store", "-q").stderr


def test_verbose_shows_info_and_the_level_is_restored(tmp_path):
    """-v lowers the memstore logger to INFO for the command (so `memstore: info:` lines
    appear when the library reports at that level); afterwards the level is as it was."""
    seen: list[int] = []

    class Spy(logging.Handler):
        def emit(self, record):
            pass

        def handle(self, record):
            seen.append(logging.getLogger("memstore").level)
            return True

    library = logging.getLogger("memstore")
    before = library.level
    spy = Spy()
    library.addHandler(spy)
    try:
        with memstore.open_session(tmp_path, "s") as log:
            log.append({"type": "turn.started"})
        result = run("-v", "rebuild", "s", "gone", "--root", tmp_path)
        assert result.exit_code == 1
        assert seen and set(seen) == {logging.INFO}
        seen.clear()
        run("-vv", "rebuild", "gone", "--root", tmp_path)
        assert seen and set(seen) == {logging.DEBUG}
    finally:
        library.removeHandler(spy)
    assert library.level == before
