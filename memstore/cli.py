"""The ``memstore`` command line: a thin click shell over the library.

Every command takes ``--root`` (or ``MEMSTORE_ROOT``) and ``--json``; with ``--json`` an error
is printed as ``{"error": ..., "exit_code": ...}`` on stderr, else as one line. Exit codes: 0
success, 1 a check that did not pass (or a turn that is not there), 2 usage errors, invalid
input, a session or store that is not there, and errors reading or writing the store (the
message names the path), as the README says.
"""

from __future__ import annotations

import errno
import os
import sys
from dataclasses import asdict
from typing import Optional

import click
import orjson

from . import errors
from .events import MAX_SEQ
from .layout import DERIVED_DIR, PACK_FILE


def _echo_json(data) -> None:
    click.echo(orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode())


def plural(n: int, word: str) -> str:
    """``1 event``, ``2 events``."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _remember_json(ctx: click.Context, _param, value: bool) -> bool:
    if value:
        ctx.meta["memstore.json"] = True  # shared with the group, which prints errors
    return value


root_option = click.option(
    "--root",
    envvar="MEMSTORE_ROOT",
    type=click.Path(file_okay=False, path_type=str),
    default=".memstore",
    show_default=True,
    help="Store root (holds sessions/); env MEMSTORE_ROOT. A VT Code .vtcode directory works.",
)
json_option = click.option("--json", "as_json", is_flag=True, callback=_remember_json, is_eager=True,
                           help="Machine-readable JSON output (errors too, on stderr).")


class _Group(click.Group):
    """Turns every error of the library into one clear line (or ``{"error": ...}`` with
    ``--json``) and a meaningful exit code, never a traceback. Usage mistakes too: one line
    that points at the command's --help, instead of click's usage block."""

    def make_context(self, info_name, args, parent=None, **extra):
        argv = list(args)  # (click's parser consumes the list it is given)
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.exceptions.NoArgsIsHelpError:
            raise  # plain `memstore`: the help
        except click.UsageError as exc:  # a mistake in the group's own options
            _report(_one_line(exc, info_name or "memstore"), _wants_json(argv))

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        # Kept to honour --json even when parsing the command fails before --json is processed.
        ctx.meta["memstore.argv"] = list(args)
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except errors.MemstoreError as exc:
            error: click.ClickException = _ExitWith(str(exc), 1 if isinstance(
                exc, (errors.TurnNotFound, errors.EventNotFound)) else 2)
        except click.UsageError as exc:
            error = _one_line(exc, ctx.command_path)
        except click.ClickException as exc:
            error = exc
        except OSError as exc:  # one the library did not wrap: still one line, naming the file
            if exc.errno == errno.EPIPE:
                raise  # `memstore show S | head`: click ends quietly
            where = f"{exc.filename}: " if exc.filename else ""
            error = _ExitWith(f"{where}{exc.strerror or exc}", 2)
        _report(error, ctx.meta.get("memstore.json") or _wants_json(ctx.meta.get("memstore.argv", [])))


def _one_line(exc: click.UsageError, command_path: str) -> click.ClickException:
    """A usage error as one line that points at --help (click prints a usage block first)."""
    where = exc.ctx.command_path if exc.ctx is not None else command_path
    return _ExitWith(f"{exc.format_message()} (see '{where} --help')", exc.exit_code)


def _wants_json(args) -> bool:
    args = list(args)
    return "--json" in args[:args.index("--") if "--" in args else len(args)]


def _report(error: click.ClickException, as_json: bool):
    if as_json:
        click.echo(orjson.dumps({"error": error.format_message(), "exit_code": error.exit_code}).decode(), err=True)
        sys.exit(error.exit_code)
    raise error


@click.group(cls=_Group)
@click.version_option(package_name="memstore")
def cli():
    """memstore: a per-session event store for AI coding agents.

    \b
    Examples:
      memstore demo && memstore serve          # browse a demo store
      memstore import                          # your Codex and Claude Code sessions
      memstore search "cargo test failed"      # BM25 over every session
      memstore show SESSION --turn 3           # one turn's events as JSON Lines
    """


class _ExitWith(click.ClickException):
    """A ClickException ("Error: ..." on stderr) with a chosen exit code."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


def _session_ids(_ctx, _param, value):
    """Session ids from the command line must be text: bytes the terminal could not decode reach
    Python as lone surrogates, which no file name, log line or SQLite row can hold."""
    for sid in (value,) if isinstance(value, str) else value or ():
        try:
            sid.encode("utf-8")
        except UnicodeEncodeError:
            shown = sid.encode("utf-8", "backslashreplace").decode("utf-8")
            raise _ExitWith(f"session id '{shown}' is not valid UTF-8", 2) from None
    return value


def _fail(exc: Exception, code: int = 2) -> "_ExitWith":
    return _ExitWith(str(exc), code)


# --- sessions: demo, append, rebuild, sessions, show ---


@cli.command("demo")
@root_option
@click.option("--sessions", type=click.IntRange(min=3, max=10_000), default=30, show_default=True,
              help="About how many sessions to write.")
@click.option("--seed", type=int, default=7, show_default=True, help="Seed of the generated sessions.")
@json_option
def demo_command(root, sessions, seed, as_json):
    """Write a realistic demonstration store (about 30 agent sessions) to open in the explorer.

    Multi-turn tasks with commands and their output, failing tests then fixes, file changes,
    denied tool calls, a compaction, failed turns, goals with milestones, and sessions imported
    from Codex and Claude Code logs. Seeded, and idempotent: running it again changes nothing,
    and it never removes or rewrites anything (a session of a demo name that holds other events
    is left as it is).

    \b
    Examples:
      memstore demo && memstore serve
      memstore demo --root /tmp/demo --sessions 100 --seed 1
    """
    from .demo import write_demo_store

    with _progress_bar("writing the demo store", enabled=not as_json) as progress:
        report = write_demo_store(root, sessions, seed, progress=progress)
    if as_json:
        _echo_json(report.to_dict())
        return
    click.echo(f"demo store in {root}: {plural(len(report.written) + len(report.imported), 'session')} written "
               f"({plural(report.events, 'event')}), {len(report.skipped)} already there")
    if report.kept:
        click.echo(f"left as they are (they hold events that are not the demo's): {', '.join(report.kept)}")
    root_arg = "" if root == ".memstore" else f" --root {root}"
    click.echo(f"next: memstore serve{root_arg}   (then open http://localhost:8001/-/memstore)")


PROGRESS_DELAY = 1.0  # seconds of work before a progress bar appears


class _progress_bar:
    """A click progress bar on stderr for ``progress(done, total)`` callbacks; shown only for
    long work (``minimum`` steps or more, still running after :data:`PROGRESS_DELAY` seconds),
    and never in --json mode."""

    def __init__(self, label: str, enabled: bool = True, minimum: int = 2):
        self.label, self.enabled, self.minimum = label, enabled, minimum
        self.bar = None
        self.shown = 0
        self.started = 0.0

    def __enter__(self):
        import time

        self.started = time.monotonic()
        return self.update

    def update(self, done: int, total: int) -> None:
        if not self.enabled or total < self.minimum:
            return
        if self.bar is None:
            import time

            if done >= total or time.monotonic() - self.started < PROGRESS_DELAY:
                return  # quick work (or already done): no bar
        if self.bar is None:
            self.bar = click.progressbar(length=total, label=self.label, file=sys.stderr)
            self.bar.__enter__()
        self.bar.update(done - self.shown)
        self.shown = done

    def __exit__(self, *exc_info):
        if self.bar is not None:
            self.bar.__exit__(*exc_info)


def _print_turns(turns) -> None:
    click.echo(f"{'turn':>4}  {'status':<11} {'events':>6}  {'input':>7} {'cached':>7} {'output':>7}  started")
    for t in turns:
        click.echo(f"{t.number:>4}  {t.status:<11} {t.event_count:>6}  {t.input_tokens:>7} "
                   f"{t.cached_input_tokens:>7} {t.output_tokens:>7}  {t.started_at or ''}")


@cli.command("append")
@click.argument("session", callback=_session_ids)
@click.argument("source", type=click.File("rb"), default="-")
@root_option
@click.option("--durability", type=click.Choice(["turn", "event", "none"]), default="turn", show_default=True)
@click.option("--max-events", type=click.IntRange(min=0), default=10_000, show_default=True,
              help="Cap on the events kept (0: no cap).")
@click.option("--atomic", is_flag=True,
              help="Check every line against the event contract first; append all of them or none.")
@json_option
def append_command(session, source, root, durability, max_events, atomic, as_json):
    """Append events to SESSION from SOURCE (JSON Lines; default stdin).

    Each line is an event object ({"type": ...}) or a VT Code envelope ({"event": {...}}), whose
    inner event is appended. Stops at the first invalid line (exit 2), keeping what came before;
    with --atomic, every line is checked before anything is written, and a bad line appends
    nothing (the session is not even created).

    \b
    Examples:
      echo '{"type": "turn.started"}' | memstore append run-42
      memstore append run-42 events.jsonl --atomic --durability event
    """
    from .events import check_event, encode_record, utc_now
    from .session.log import open_session

    def lines():
        number = 0
        while True:
            try:
                line = source.readline()
            except OSError as exc:
                raise _ExitWith(f"read {source.name}: {exc.strerror or exc}"
                                + (f" (after line {number})" if number else ""), 2) from None
            if not line:
                return
            number += 1
            if line.strip():
                yield number, line

    def parse(number: int, line: bytes, appended: Optional[int]):
        after = "nothing appended" if appended is None else f"{plural(appended, 'event')} appended before it"
        try:
            data = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise _ExitWith(f"line {number}: not JSON ({exc}); {after}", 2) from None
        if isinstance(data, dict) and isinstance(data.get("event"), dict) and "type" not in data:
            data = data["event"]
        if appended is None:  # --atomic: what append checks, before anything is written
            try:
                check_event(data)
                encode_record(1, utc_now(), data)
            except errors.InvalidEvent as exc:
                raise _ExitWith(f"line {number}: {exc}; {after}", 2) from None
        return data

    checked = [(number, parse(number, line, None)) for number, line in lines()] if atomic else None
    appended = 0
    last_seq = None
    try:
        with open_session(root, session, max_events=max_events, durability=durability) as log:
            for number, data in checked if checked is not None else (
                    (number, parse(number, line, appended)) for number, line in lines()):
                try:
                    last_seq = log.append(data)
                except errors.InvalidEvent as exc:
                    raise _ExitWith(f"line {number}: {exc}; {plural(appended, 'event')} appended before it", 2) from exc
                appended += 1
            manifest = log.manifest
    except errors.MemstoreError as exc:
        raise _fail(exc) from exc
    if as_json:
        _echo_json({"session_id": manifest.session_id, "appended": appended, "last_seq": last_seq,
                    "turn_count": manifest.turn_count, "event_count": manifest.event_count})
    else:
        click.echo(f"appended {plural(appended, 'event')} to {manifest.session_id!r} "
                   f"({plural(manifest.event_count, 'event')}, {plural(manifest.turn_count, 'turn')})")


@cli.command("rebuild")
@click.argument("sessions", nargs=-1, callback=_session_ids)
@click.option("--all", "rebuild_all", is_flag=True, help="Rebuild every session under the root.")
@click.option("--jobs", "-j", type=click.IntRange(min=1), default=None,
              help="Worker processes (default: one per CPU, at most 8; 1: none).")
@root_option
@json_option
def rebuild_command(sessions, rebuild_all, jobs, root, as_json):
    """Regenerate the views of SESSIONS (or --all) from their events.jsonl: the index, the
    search chunks, and their rows in the catalog.

    \b
    Examples:
      memstore rebuild run-42
      memstore rebuild --all --json
      memstore rebuild --all --jobs 1
    """
    from .maintenance import rebuild_each, session_ids

    if rebuild_all and sessions:
        raise click.UsageError("give SESSION names or --all, not both")
    if not rebuild_all and not sessions:
        raise click.UsageError("name at least one SESSION, or give --all")
    _require_store(root)
    if rebuild_all:
        sessions = tuple(session_ids(root))
        if not sessions:
            if as_json:
                _echo_json([])
            else:
                click.echo(f"no sessions under {root}")
            return
    sessions = tuple(dict.fromkeys(sessions))  # each once, as rebuild_each does
    if jobs is None:
        jobs = min(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1, 8)
    results, failures = [], 0
    with click.progressbar(rebuild_each(root, sessions, jobs=jobs), length=len(sessions), label="rebuilding",
                           file=sys.stderr, hidden=as_json or len(sessions) < 20 or not sys.stderr.isatty()) as bar:
        for session, manifest in bar:
            if isinstance(manifest, errors.MemstoreError):
                failures += 1
                results.append({"session_id": session, "error": str(manifest)})
                if not as_json:
                    click.echo(f"{session}: error: {manifest}", err=True)
                continue
            results.append({"session_id": manifest.session_id, "turn_count": manifest.turn_count,
                            "event_count": manifest.event_count, "status": manifest.status})
            if not as_json and len(sessions) < 20:
                click.echo(f"{session}: {plural(manifest.event_count, 'event')}, "
                           f"{plural(manifest.turn_count, 'turn')}, {manifest.status}")
    from .catalog import refresh_catalog

    if failures < len(sessions):  # nothing rebuilt, nothing to refresh (and nothing created)
        refresh_catalog(root)
    if as_json:
        _echo_json(results)
    elif len(sessions) >= 20:
        click.echo(f"rebuilt {plural(len(sessions) - failures, 'session')}"
                   + (f", {failures} failed" if failures else ""))
    if failures:
        sys.exit(1 if failures < len(sessions) else 2)


@cli.command("sessions")
@root_option
@click.option("--limit", type=click.IntRange(min=1), default=None, help="At most this many, newest first.")
@json_option
def sessions_command(root, limit, as_json):
    """List the sessions under the root, most recently updated first.

    \b
    Examples:
      memstore sessions --limit 10
      memstore sessions --json | jq '.[].session_id'
    """
    from .session.manifest import list_sessions

    _require_store(root)
    summaries = _with_unlisted(root, list_sessions(root), limit)
    if as_json:
        _echo_json([asdict(s) for s in summaries])
        return
    if not summaries:
        click.echo(f"no sessions under {root}")
        return
    # Ids are shown whole (they are what `show` takes), so the column is as wide as the longest.
    width = max(len("session"), *(len(s.session_id) for s in summaries))
    click.echo(f"{'session':<{width}} {'status':<10} {'turns':>5} {'events':>7}  updated")
    for s in summaries:
        click.echo(f"{s.session_id:<{width}} {s.status:<10} {s.turn_count:>5} {s.event_count:>7}  {s.updated_at}")


def _with_unlisted(root: str, summaries: list, limit: Optional[int]) -> list:
    """``summaries`` (from the manifests) plus the sessions whose manifest is missing or damaged,
    read from their logs (the manifest is a view), newest first, at most ``limit``."""
    import os

    from .layout import session_dir_name, sessions_root
    from .layout import EVENTS_FILE
    from .session.manifest import SessionSummary
    from .reader import read_session_dir

    listed = set()
    for s in summaries:
        try:
            listed.add(session_dir_name(s.session_id))
        except errors.InvalidSessionId:
            pass
    try:
        entries = list(os.scandir(sessions_root(root)))
    except OSError:
        entries = []
    for entry in entries:
        if entry.name in listed or entry.name.startswith(".") or not entry.is_dir(follow_symlinks=False):
            continue
        if not os.path.isfile(os.path.join(entry.path, EVENTS_FILE)):
            continue  # not a session
        try:
            with read_session_dir(entry.path) as reader:
                m = reader.manifest
        except errors.MemstoreError:
            continue
        summaries.append(SessionSummary(m.session_id, m.turn_count, m.event_count, m.status, m.updated_at))
    summaries.sort(key=lambda s: s.updated_at, reverse=True)
    return summaries[:limit] if limit is not None else summaries


def _require_store(root: str) -> None:
    """A command that reads a store refuses a root that is not one, in one clear line."""
    import os

    if not os.path.isdir(root):
        raise _ExitWith(f"no store at {root} (no such directory; set --root or MEMSTORE_ROOT)", 2)


class _PositiveNumber(click.ParamType):
    """A whole number from 1 up, of any size (a turn past the store's largest is simply not
    there; click's IntRange passed 20-digit numbers on to SQLite, which overflowed)."""

    name = "integer"

    def convert(self, value, param, ctx):
        if isinstance(value, int) and not isinstance(value, bool):
            text = str(value)
        else:
            text = str(value).strip()
        if not (text.isascii() and text.isdigit()) or int(text[:30]) == 0:
            self.fail(f"{text[:40]!r} is not a whole number of 1 or more", param, ctx)
        return int(text) if len(text) <= 30 else 10**30


@cli.command("show")
@click.argument("session", callback=_session_ids)
@click.option("--turn", "turn_number", type=_PositiveNumber(), default=None,
              help="Print this turn's events as JSON Lines.")
@root_option
@json_option
def show_command(session, turn_number, root, as_json):
    """Show SESSION's manifest and turns (or, with --turn N, that turn's events).

    Reads without locking, so it works while an agent writes the session.

    \b
    Examples:
      memstore show run-42
      memstore show run-42 --turn 3 --json
    """
    from .reader import read_session

    _require_store(root)
    try:
        with read_session(root, session) as reader:
            manifest = reader.manifest
            if turn_number is not None:
                if turn_number > MAX_SEQ:  # no turn is numbered past the largest seq
                    raise errors.TurnNotFound(manifest.session_id, turn_number)
                events = reader.reconstruct_turn(turn_number)
                if as_json:
                    _echo_json(events)
                else:
                    for event in events:
                        click.echo(orjson.dumps(event).decode())
                return
            turns = reader.turns()
    except errors.TurnNotFound as exc:
        raise _ExitWith(str(exc), 1) from exc
    except errors.MemstoreError as exc:
        raise _fail(exc) from exc
    if as_json:
        _echo_json({"manifest": manifest.to_dict(), "turns": [asdict(t) for t in turns]})
        return
    # turn_count counts closed turns (as VT Code's manifest does): say so when one is open.
    open_turn = " (and 1 open)" if manifest.in_turn else ""
    click.echo(f"session {manifest.session_id!r}: {manifest.status}, {plural(manifest.turn_count, 'turn')}{open_turn}, "
               f"{plural(manifest.event_count, 'event')}, updated {manifest.updated_at}")
    _print_turns(turns)


# --- progress and audit packs ---


@cli.command("progress")
@click.argument("session", callback=_session_ids)
@root_option
@json_option
def progress_command(session, root, as_json):
    """Print the progress ledger of SESSION as Markdown (--json: the ledger JSON).

    Exit 1 when the session has no ledger, 2 when there is no such session or its ledger
    cannot be read or parsed.

    \b
    Examples:
      memstore progress run-42
      memstore progress run-42 --json
    """
    from .views.progress import load_progress, progress_path

    _require_store(root)
    _existing_session_dir(root, session)
    try:
        ledger = load_progress(root, session)
    except errors.MemstoreError as exc:
        raise _ExitWith(str(exc), 2) from exc
    if ledger is None:
        raise _ExitWith(f"no progress ledger for session {session!r} (looked for {progress_path(root, session)})", 1)
    if as_json:
        _echo_json(ledger.to_dict())
    else:
        click.echo(ledger.to_markdown(), nl=False)


@cli.command("pack")
@click.argument("session", callback=_session_ids)
@click.option(
    "--output",
    "-o",
    type=click.Path(dir_okay=False, path_type=str),
    default=None,
    help=f"Where to write the pack (default: <session>/{DERIVED_DIR}/{PACK_FILE}).",
)
@root_option
@json_option
def pack_command(session, output, root, as_json):
    """Write an audit pack of SESSION: the SHA-256 and size of every file in it.

    \b
    Examples:
      memstore pack run-42
      memstore pack run-42 --output /audits/run-42.json
    """
    from .pack import write_audit_pack

    _require_store(root)
    _existing_session_dir(root, session)  # before the library creates derived/ for a session that is not there
    try:
        pack, path = write_audit_pack(root, session, output)
    except errors.MemstoreError as exc:
        raise _ExitWith(str(exc), 2) from exc
    if as_json:
        _echo_json({"path": str(path), "pack": pack.to_dict()})
    else:
        total = sum(entry.bytes for entry in pack.entries)
        click.echo(f"wrote {path} ({plural(len(pack.entries), 'file')}, {plural(total, 'byte')})")


@cli.command("verify")
@click.argument("session", callback=_session_ids)
@click.argument("pack_path", metavar="[PACK]", required=False, type=click.Path(dir_okay=False, path_type=str))
@root_option
@json_option
def verify_command(session, pack_path, root, as_json):
    """Verify SESSION against an audit pack (default: <session>/derived/audit-pack.json).

    Exit 0 verified, 1 not verified (files changed or missing), 2 invalid pack, unreadable
    input or usage error. Files added since packing are listed but do not fail verification.

    \b
    Examples:
      memstore verify run-42
      memstore verify run-42 /audits/run-42.json --json
    """
    from .pack import default_pack_path, read_audit_pack, verify_audit_pack

    _require_store(root)
    _existing_session_dir(root, session)
    path = pack_path if pack_path is not None else default_pack_path(root, session)
    try:
        pack = read_audit_pack(path)
        result = verify_audit_pack(root, session, pack)
    except errors.InvalidPack as exc:
        message = str(exc)
        if not message.startswith(str(path)):
            message = f"{path}: {message}"
        raise _ExitWith(message, 2) from exc
    except errors.MemstoreError as exc:
        raise _ExitWith(str(exc), 2) from exc
    if pack.session_id != session:
        click.echo(f"warning: {path} is a pack of session {pack.session_id!r}, not {session!r}", err=True)
    if as_json:
        _echo_json(result.to_dict())
    else:
        for name in result.mismatches:
            click.echo(f"mismatch: {name}" + (f" ({result.details[name]})" if name in result.details else ""))
        for name in result.missing:
            click.echo(f"missing: {name}")
        for name in result.unaccounted:
            click.echo(f"unaccounted (informational): {name}")
        if result.verified:
            click.echo(f"verified: {len(pack.entries)} {'file matches' if len(pack.entries) == 1 else 'files match'}")
        else:
            click.echo(f"NOT verified: {len(result.mismatches)} mismatched, {len(result.missing)} missing")
    if not result.verified:
        sys.exit(1)


# --- search ---


@cli.command("search")
@click.argument("query")
@click.option("--session", "session_id", default=None, callback=_session_ids, help="Only this session.")
@click.option("--since", default=None, help="Only events from this date (YYYY-MM-DD) or time on.")
@click.option("--source", type=click.Choice(["event", "session"]), default=None,
              help="Only event text, or only memory facts.")
@click.option("-n", "--max-results", type=click.IntRange(min=1, max=1000), default=10, show_default=True)
@click.option("--no-recency", is_flag=True, help="Plain BM25, without the mild preference for recent events.")
@root_option
@json_option
def search_command(query, session_id, since, source, max_results, no_recency, root, as_json):
    """BM25 search over every session: where did the agent do QUERY?

    \b
    Examples:
      memstore search "mismatched types"
      memstore search "cargo test" --since 2026-11-01 -n 20 --json
    """
    from .search import search_memory

    _require_store(root)
    if session_id is not None:
        _existing_session_dir(root, session_id)
    try:
        results = search_memory(root, query, max_results, source=source, session_id=session_id, since=since,
                                recency=not no_recency)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--since") from exc
    if as_json:
        _echo_json([r.to_dict() for r in results])
        return
    if not results:
        click.echo("no results")
        return
    for r in results:
        where = f"{r.session_id} turn {r.turn} seq {r.seq}" if r.seq is not None else f"{r.session_id} (memory)"
        click.echo(f"{r.score:7.3f}  {where}  [{r.kind or r.source}]  {r.created_at or ''}")
        click.echo(f"         {r.snippet}")


# --- importing other agents' logs ---


@cli.command("import")
@click.argument("paths", nargs=-1, type=click.Path(exists=True, path_type=str))
@click.option("--source", type=click.Choice(["auto", "codex", "codex-exec", "claude"]), default="auto", show_default=True,
              help="What the files are; auto tells each file by its lines.")
@root_option
@json_option
def import_command(paths, source, root, as_json):
    """Import Codex CLI and Claude Code session logs from PATHS (files or directories), or the
    sessions of another memstore store (a copy of another machine's store directory).

    With no PATH, imports ~/.codex/sessions and ~/.claude/projects ($CODEX_HOME and
    $CLAUDE_CONFIG_DIR are honoured) where they exist. Importing again appends only what the
    logs gained since; no import removes an event (a session whose log was rewritten is set
    aside, renamed, and the log imported afresh). Records not understood are kept and counted;
    problems are reported, never fatal. Per agent version it prints sessions, turns, tokens and
    records understood; "warning: format drift:" lines (stderr) flag an agent version never seen
    before, a jump in records not understood, and sessions with no turn or no token.

    Another store's sessions keep their ids and record the store (machine) they came from; one
    whose id names a different session here comes in as ID-from-ORIGIN. An import that runs
    longer than a second shows sessions, MB, rate and time left on stderr.

    \b
    Examples:
      memstore import
      memstore import ~/.codex/sessions/2026/11 --source codex
      memstore import ~/.claude/projects/my-app --json
      memstore import /mnt/laptop/memstore         # another machine's store
    """
    import os

    from .importers import ProgressLine, import_logs

    if not paths:
        codex_home = os.environ.get("CODEX_HOME") or os.path.expanduser("~/.codex")
        claude_home = os.environ.get("CLAUDE_CONFIG_DIR") or os.path.expanduser("~/.claude")
        paths = tuple(p for p in (os.path.join(codex_home, "sessions"), os.path.join(claude_home, "projects"))
                      if os.path.isdir(p))
        if not paths:
            if as_json:  # an empty report: there was nothing to import, which is no error
                from .importers import ImportReport

                _echo_json(ImportReport().to_dict())
            click.echo("nothing to import: neither ~/.codex/sessions nor ~/.claude/projects exists", err=True)
            return
    # Sessions and bytes with a rate and a time left, on stderr, once the import has run a while.
    line = None if as_json else ProgressLine("importing", sys.stderr, delay=PROGRESS_DELAY)
    try:
        report = import_logs(root, paths, source, progress=line)
    except errors.MemstoreError as exc:
        raise _fail(exc) from exc
    finally:
        if line is not None:
            line.close()
    for warning in report.warnings:  # format drift: on stderr, with or without --json
        click.echo(warning, err=True)
    if as_json:
        _echo_json(report.to_dict())
        return
    for problem in report.problems:
        where = f"{problem.path}:{problem.line}" if problem.line else problem.path
        click.echo(f"{where}: {problem.reason}", err=True)
    click.echo(f"imported {plural(report.events_appended, 'event')} from {plural(report.sources, 'source')}: "
               f"{plural(report.sessions_created, 'session')} created, {report.sessions_updated} updated, "
               f"{report.sessions_regenerated} regenerated, {report.sessions_unchanged} unchanged; "
               f"{plural(report.lines_skipped, 'line')} skipped, {plural(len(report.problems), 'problem')}")
    for entry in report.renamed:
        click.echo(f"imported {entry.session_id} as {entry.imported_as} (that id names another session here)")
    for entry in report.set_aside:
        click.echo(f"set aside {entry.session_id} as {entry.set_aside_as} ({entry.reason}; every event kept)")
    if report.tombstoned:
        click.echo(f"not imported: {plural(len(report.tombstoned), 'source')} of sessions removed on purpose "
                   "(tombstoned)")
    for agent in report.agents:
        click.echo(agent.line())
    if report.sessions:
        shown = report.sessions[:10]
        more = f" and {len(report.sessions) - len(shown)} more" if len(report.sessions) > len(shown) else ""
        click.echo(f"sessions: {', '.join(shown)}{more}")


# --- retention, pins, legacy migration, memory facts ---


@cli.command("retention")
@root_option
@click.option("--max-sessions", type=click.IntRange(min=0), default=50, show_default=True,
              help="Keep at most this many removable (completed, unpinned, idle) sessions.")
@click.option("--max-age-days", type=click.IntRange(min=0), default=30, show_default=True,
              help="Remove sessions whose last event is older; also marks idle active ones completed (0: no sweep).")
@click.option("--preserve", "preserve", default=None, metavar="SESSION", callback=_session_ids,
              help="Never touch this session.")
@click.option("--include-imported", is_flag=True,
              help="Also age out sessions imported from Codex and Claude Code logs (tombstoned, so that no import "
                   "recreates them). By default they are kept and not counted.")
@click.option("--apply", "apply_", is_flag=True, help="Remove for real (default: a dry run that only shows).")
@json_option
def retention_command(root, max_sessions, max_age_days, preserve, include_imported, apply_, as_json):
    """Show which sessions retention would remove (a dry run), or remove them with --apply.

    Removals are recorded in <root>/gc-log.jsonl. Live, pinned and preserved sessions are never
    touched; see `memstore pin`. Sessions imported from agent logs (`memstore import`) are your
    history, whose sources the agents may have deleted: they are kept unless --include-imported,
    and each one that option removes is tombstoned in <root>/tombstones.jsonl so that the next
    import does not bring it back.

    \b
    Examples:
      memstore retention --max-sessions 50 --max-age-days 30
      memstore retention --max-age-days 90 --preserve run-42 --apply
      memstore retention --max-age-days 365 --include-imported --apply
    """
    from .retention import RetentionPolicy, apply_retention_preserving

    _require_store(root)
    try:
        policy = RetentionPolicy(max_sessions, max_age_days, include_imported=include_imported)
        report = apply_retention_preserving(root, policy, preserve, dry_run=not apply_)
    except errors.MemstoreError as exc:
        raise _fail(exc) from exc
    if as_json:
        _echo_json(report.to_dict())
        return
    verb = "removed" if apply_ else "would remove"
    click.echo(f"{verb} {plural(report.count, 'session')} ({plural(report.bytes, 'byte')})")
    for r in report.removed:
        click.echo(f"  {r.directory:<40} {r.reason:<12} {r.bytes:>10} bytes  updated {r.updated_at}")
    if report.marked_abandoned:
        click.echo(f"{'marked' if apply_ else 'would mark'} completed (abandoned): {', '.join(report.marked_abandoned)}")
    if report.imported_kept:
        click.echo(f"kept {plural(report.imported_kept, 'imported session')} (pass --include-imported to age them out)")
    if report.skipped:
        click.echo("left alone:")
        for s in report.skipped:
            click.echo(f"  {s.directory}: {s.reason}")
    if not apply_:
        click.echo("dry run: nothing was changed; pass --apply to remove")


def _existing_session_dir(root, session):
    from .layout import session_directory

    try:
        directory = session_directory(root, session)
    except errors.InvalidSessionId as exc:
        raise _ExitWith(str(exc), 2) from exc
    if not directory.is_dir() or directory.is_symlink():
        raise _ExitWith(f"no session {session!r} (no directory {directory})", 2)
    return directory


@cli.command("pin")
@click.argument("session", callback=_session_ids)
@click.option("--reason", default="", help="Why it is kept (recorded in retention-pin.json).")
@root_option
@json_option
def pin_command(session, reason, root, as_json):
    """Pin SESSION: retention never removes it until `memstore unpin`.

    \b
    Example:
      memstore pin run-42 --reason "the incident of November 3"
    """
    from .retention import pin_session_retention

    _require_store(root)
    directory = _existing_session_dir(root, session)
    try:
        path = pin_session_retention(directory, reason)
    except errors.MemstoreError as exc:
        raise _fail(exc) from exc
    if as_json:
        _echo_json({"session_id": session, "pinned": True, "path": str(path)})
    else:
        click.echo(f"pinned {session!r} ({path})")


@cli.command("unpin")
@click.argument("session", callback=_session_ids)
@root_option
@json_option
def unpin_command(session, root, as_json):
    """Unpin SESSION, so retention may remove it again.

    \b
    Example:
      memstore unpin run-42
    """
    from .retention import unpin_session_retention

    _require_store(root)
    directory = _existing_session_dir(root, session)
    try:
        removed = unpin_session_retention(directory)
    except errors.MemstoreError as exc:
        raise _fail(exc) from exc
    if as_json:
        _echo_json({"session_id": session, "was_pinned": bool(removed)})
    else:
        click.echo(f"unpinned {session!r}" if removed else f"{session!r} was not pinned")


@cli.command("migrate")
@root_option
@click.option("--remove-legacy", is_flag=True,
              help="Then remove the legacy files whose content was imported (others are kept and listed).")
@json_option
def migrate_command(root, remove_legacy, as_json):
    """Import VT Code's legacy history/*.memory.json and logs/trajectory*.jsonl under the root
    (a workspace's .vtcode) into sessions. Running it again imports only what is new.

    Exit 1 when some legacy file could not be imported (each is listed with the reason).

    \b
    Examples:
      memstore migrate --root ~/project/.vtcode
      memstore migrate --root ~/project/.vtcode --remove-legacy
    """
    import os

    from .migration import migrate_legacy

    if not os.path.isdir(root):
        raise _ExitWith(f"no directory {root} (point --root at a VT Code workspace's .vtcode)", 2)
    try:
        report = migrate_legacy(root, remove_legacy=remove_legacy)
    except errors.MemstoreError as exc:
        raise _fail(exc) from exc
    if as_json:
        _echo_json(report.to_dict())
    else:
        click.echo(f"imported {plural(report.memory_imported, 'memory envelope')} and "
                   f"{plural(report.trajectory_imported, 'trajectory log')} "
                   f"({plural(report.records_imported, 'record')}, {plural(report.bytes_migrated, 'byte')}): "
                   f"{plural(report.sessions_created, 'session')} created, {report.sessions_updated} updated; "
                   f"{report.already_imported} already imported, "
                   f"{report.already_migrated} already migrated by VT Code")
        for m in report.migrated_by_vtcode:
            click.echo(f"migrated by VT Code: {m.path} (session {m.session}): {m.state.value.replace('_', ' ')}")
        for s in report.skipped:
            click.echo(f"not imported: {s.path}: {s.reason}")
        if report.legacy is not None:
            click.echo(f"removed {plural(len(report.legacy.removed), 'legacy file')} "
                       f"({plural(report.legacy.bytes_freed, 'byte')})")
            for s in report.legacy.kept:
                click.echo(f"kept: {s.path}: {s.reason}")
    if report.skipped:
        sys.exit(1)


@cli.command("facts")
@root_option
@click.option("--limit", type=click.IntRange(min=0), default=100, show_default=True)
@click.option("--session", "session", default=None, callback=_session_ids, help="Only this session's facts.")
@json_option
def facts_command(root, limit, session, as_json):
    """List the grounded facts of the sessions' memory views (derived/memory.json), newest
    sessions first.

    \b
    Examples:
      memstore facts --limit 20
      memstore facts --session run-42 --json
    """
    from .views.memory_view import query_facts, session_memory_facts

    _require_store(root)
    if session is not None:
        _existing_session_dir(root, session)
    try:
        if session is not None:
            rows = [{"session_id": session, **f} for f in session_memory_facts(root, session)][:limit]
        else:
            rows = [asdict(f) for f in query_facts(root, limit)]
    except errors.MemstoreError as exc:
        raise _fail(exc) from exc
    if as_json:
        _echo_json(rows)
        return
    if not rows:
        click.echo("no facts")
        return
    for row in rows:
        click.echo(f"{row['session_id']}: [{row['source'] or '?'}] {row['fact']}")


# --- the explorer: serve, doctor ---


@cli.command("serve")
@root_option
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Interface to bind (the default is reachable from this machine only).")
@click.option("--port", type=click.IntRange(min=0, max=65535), default=8001, show_default=True)
@click.option("--refresh-interval", type=click.FloatRange(min=0), default=3.0, show_default=True,
              help="Refresh the catalog at most this often (seconds) while pages are requested; 0: never.")
@click.option("--metadata", type=click.Path(exists=True, dir_okay=False, path_type=str), default=None,
              help="Datasette metadata file (default: the project's metadata.yml).")
@click.option("--plugins-dir", type=click.Path(exists=True, file_okay=False, path_type=str), default=None,
              help="Datasette plugins directory (default: the project's plugins/).")
@json_option
def serve_command(root, host, port, refresh_interval, metadata, plugins_dir, as_json):
    """Explore the store in a browser: refresh its catalog and serve it with Datasette.

    Opens http://localhost:8001/-/memstore: sessions, turns, events, search, charts and SQL
    over catalog.db. New sessions appear without a restart (the catalog is refreshed in the
    background while pages are requested). Read-only. Stop with Ctrl-C.

    \b
    Examples:
      memstore demo && memstore serve
      memstore serve --root ~/project/.vtcode --port 8002
      MEMSTORE_ROOT=/srv/agents memstore serve --host 0.0.0.0
    """
    from .explorer import server

    kwargs = {}
    if metadata is not None:
        kwargs["metadata"] = metadata
    if plugins_dir is not None:
        kwargs["plugins_dir"] = plugins_dir
    with _progress_bar("refreshing the catalog", enabled=not as_json, minimum=200) as progress:
        def announce(url):
            if as_json:  # one JSON object on stdout, once the server is about to listen
                _echo_json({"url": url, "root": root, "host": host, "port": port})
            else:
                click.echo(f"memstore explorer on {url}  (store {root}; Ctrl-C to stop)", err=True)

        try:
            server.serve(root, host=host, port=port, refresh_interval=refresh_interval, progress=progress,
                         announce=announce, **kwargs)
        except OSError as exc:  # the port is taken, say (library errors are the group's to print)
            raise _ExitWith(f"cannot serve on {host}:{port}: {exc.strerror or exc}", 2) from exc


@cli.command("mcp")
@root_option
@json_option
def mcp_command(root, as_json):
    """Let agents ask their own memory: a read-only MCP server on stdin/stdout.

    Tools: search, get_session, get_turn, get_event, recent_sessions, memory_facts and
    sql_query, all read-only and redacted. An MCP client (Claude Code, Codex CLI, VT Code)
    starts it; see docs/mcp.md. Needs the MCP SDK: pip install 'memstore[mcp]'. --json: an
    error that stops it is printed as JSON on stderr (stdout is the protocol's).

    \b
    Examples:
      memstore mcp --root ~/.memstore
      claude mcp add memstore -- memstore mcp --root ~/.memstore
      codex mcp add memstore -- memstore mcp --root ~/.memstore
    """
    _require_store(root)
    from .mcp import serve

    serve(root)  # a missing SDK is MCPUnavailable: one line, exit 2


@cli.command("doctor")
@root_option
@click.option("--fix", is_flag=True, help="Repair what is wrong: permissions, rebuilt sessions, a refreshed catalog.")
@json_option
def doctor_command(root, fix, as_json):
    """Check every session of the store and its catalog; --fix repairs what is wrong.

    Per session: log and index agree, no torn tail, private permissions; and the catalog is
    current. Exit 0 when all is well (or fixed), 1 when problems remain, 2 on errors.

    \b
    Examples:
      memstore doctor
      memstore doctor --fix --root ~/project/.vtcode
      memstore doctor --json | jq '.problems'
    """
    from .maintenance import check_store

    with _progress_bar("checking sessions", enabled=not as_json, minimum=200) as progress:
        report = check_store(root, fix=fix, progress=progress)
    if as_json:
        _echo_json(report.to_dict())
    else:
        for p in report.problems:
            where = p.session or p.directory
            state = "fixed" if p.fixed else ("run with --fix" if p.fixable and not fix else "not fixed")
            click.echo(f"{where}: {p.check}: {p.detail} [{state}]")
        if report.live:
            click.echo(f"{plural(len(report.live), 'session')} open in another process "
                       "(their writers keep them current)")
        verdict = "ok" if report.ok else plural(sum(not p.fixed for p in report.problems), "problem")
        click.echo(f"{plural(report.sessions, 'session')} checked: {verdict}")
    if not report.ok:
        sys.exit(1)


# --- exports: Parquet for query engines, OTLP/JSON traces for observability ---


class _ExportGroup(click.Group):
    """``memstore export``: its help ends with each export's own help, so one page (and the
    generated reference) shows every option."""

    def format_help(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        super().format_help(ctx, formatter)
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is None:
                continue
            sub = click.Context(command, info_name=name, parent=ctx, terminal_width=formatter.width,
                                max_content_width=formatter.width)
            formatter.write_paragraph()
            formatter.write_text(f"--- {sub.command_path} ---")
            command.format_help(sub, formatter)


@cli.group("export", cls=_ExportGroup)
@root_option
@json_option
@click.pass_context
def export_group(ctx, root, as_json):
    """Export the store: Parquet for query engines, OTLP/JSON traces for observability.

    Both refresh the catalog first, price every turn (memstore.pricing) and redact every text
    (the store's redaction rules). See docs/export.md for the schema and the trace mapping.
    --root and --json may come before the export's name too.
    """
    ctx.meta["memstore.export.root"] = root


def _export_options(root: str, as_json: bool) -> tuple[str, bool]:
    """An export's --root and --json: its own, else the export group's (``memstore export
    --root R parquet DEST``)."""
    ctx = click.get_current_context()
    if ctx.get_parameter_source("root") is click.core.ParameterSource.DEFAULT:
        root = ctx.meta.get("memstore.export.root", root)
    return root, as_json or bool(ctx.meta.get("memstore.json"))


@export_group.command("parquet")
@click.argument("dest", type=str)
@click.option("--include-text", is_flag=True, help="Put each event's text in the events table (off: no bulk text).")
@click.option("--full", is_flag=True, help="Write every session again, changed or not.")
@root_option
@json_option
def export_parquet_command(dest, include_text, full, root, as_json):
    """Write the catalog's facts to DEST as Hive-partitioned Parquet (agent=, day=).

    DEST is a directory, or an object-store URL (s3://, gs://, ...) when fsspec and the
    filesystem's package are installed. Tables: sessions, turns (token usage and cost),
    events, tool_calls, commands, file_changes; every row carries the store id. Incremental:
    only sessions that changed since the last export to DEST are written again. Files appear
    whole, and DEST/_memstore_export.json, replaced last, lists them. Needs the export extra
    (pip install 'memstore[export]').

    \b
    Examples:
      memstore export parquet ~/lake/memstore
      memstore export parquet s3://bucket/agents --include-text
      duckdb -c "SELECT * FROM read_parquet('lake/turns/**/*.parquet', hive_partitioning=true)"
    """
    from .exporters.parquet import export_parquet

    root, as_json = _export_options(root, as_json)
    _require_store(root)
    with _progress_bar("exporting", enabled=not as_json, minimum=200) as progress:
        report = export_parquet(root, dest, include_text=include_text, full=full, progress=progress)
    if as_json:
        _echo_json(report.to_dict())
        return
    rows = ", ".join(f"{table} {count}" for table, count in report.rows.items())
    click.echo(f"exported to {report.destination}: {plural(len(report.written), 'session')} written, "
               f"{report.unchanged} unchanged, {len(report.removed)} removed; "
               f"{plural(report.files_written, 'file')} written ({report.bytes_written} bytes), "
               f"{report.files_removed} removed")
    click.echo(f"rows: {rows}")
    for name, reason in report.refresh_errors:
        click.echo(f"{name}: exported as the catalog last saw it ({reason})", err=True)


@export_group.command("otlp")
@click.argument("dest", type=str)
@root_option
@json_option
def export_otlp_command(dest, root, as_json):
    """Write every session to DEST as OpenTelemetry traces in OTLP/JSON (JSON Lines).

    A session is a trace: an invoke_agent span per turn, a chat span with the turn's token
    usage, and an execute_tool span per tool execution (name, arguments, status, duration),
    at the source's times, following the GenAI semantic conventions. DEST is a file (replaced
    whole when done), an fsspec URL, or - for standard output; the collector's otlpjsonfile
    receiver reads it (see docs/export.md).

    \b
    Examples:
      memstore export otlp traces.jsonl
      memstore export otlp - | head -c 2000
    """
    from .exporters.otlp import export_otlp

    root, as_json = _export_options(root, as_json)
    _require_store(root)
    to_stdout = dest == "-"
    with _progress_bar("exporting", enabled=not as_json and not to_stdout, minimum=200) as progress:
        try:
            report = export_otlp(root, dest, progress=progress)
        except ValueError as exc:
            raise _ExitWith(str(exc), 2) from exc
    if as_json and not to_stdout:
        _echo_json(report.to_dict())
    elif not to_stdout:
        click.echo(f"exported to {report.destination}: {plural(report.sessions, 'trace')}, "
                   f"{plural(report.spans, 'span')} in {plural(report.lines, 'request')} ({report.bytes} bytes); "
                   f"tokens: {report.input_tokens} input, {report.output_tokens} output")
    for name, reason in report.refresh_errors:
        click.echo(f"{name}: exported as the catalog last saw it ({reason})", err=True)
