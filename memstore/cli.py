"""The ``memstore`` command line: a thin click shell over the library.

Every command takes ``--root``, ``--json``, ``-v``/``-q`` and ``-h``. With no ``--root`` the
store is ``MEMSTORE_ROOT``, else the nearest VT Code workspace's ``.vtcode/``, else the
per-user store (:mod:`memstore.location`; ``memstore path`` says which and why). With
``--json`` an error is printed as ``{"error": ..., "exit_code": ...}`` on stderr, else as one
line. What the library logs (warnings by default; ``-v`` info, ``-vv`` debug, ``-q`` errors
only) goes to stderr as ``memstore: warning: ...``. Exit codes: 0 success, 1 a check that did
not pass (or a turn that is not there), 2 usage errors, invalid input, a session or store that
is not there, and errors reading or writing the store (the message names the path), as the
README says.
"""

from __future__ import annotations

import errno
import itertools
import logging
import os
import shlex
import sys
from collections.abc import Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any, Optional

import click
import orjson

from . import errors
from .events import MAX_SEQ
from .layout import DERIVED_DIR, PACK_FILE
from .location import ENV_VAR, RootReason, StoreLocation, locate_store

logger = logging.getLogger(__name__)

EXPLORER_URL = "http://127.0.0.1:8001/"  # where `memstore serve` listens by default


def _echo_json(data) -> None:
    click.echo(orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode())


def plural(n: int, word: str) -> str:
    """``1 event``, ``2 events``."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _remember_json(ctx: click.Context, _param, value: bool) -> bool:
    if value:
        ctx.meta["memstore.json"] = True  # shared with the group, which prints errors
    return value


def _resolve_root(ctx: click.Context, _param, value: Optional[str]) -> str:
    """The store the command uses: ``--root``, else the default (see :mod:`memstore.location`),
    as an absolute path; where it came from is kept for the messages that name the store."""
    location = locate_store(value)
    ctx.meta["memstore.location"] = location
    return str(location.path)


root_option = click.option(
    "--root",
    type=click.Path(file_okay=False, path_type=str),
    default=None,
    callback=_resolve_root,
    help=f"Store root (holds sessions/; a VT Code .vtcode/ works). Default: ${ENV_VAR}, else the nearest "
    "VT Code workspace's .vtcode/, else the per-user store; `memstore path` shows which.",
)
json_option = click.option(
    "--json",
    "as_json",
    is_flag=True,
    callback=_remember_json,
    is_eager=True,
    help="Machine-readable JSON output (errors too, on stderr).",
)


def _location(root: str) -> StoreLocation:
    """Where ``root`` came from (the command's resolved ``--root``)."""
    ctx = click.get_current_context(silent=True)
    location = ctx.meta.get("memstore.location") if ctx is not None else None
    if isinstance(location, StoreLocation) and str(location.path) == root:
        return location
    return locate_store(root)


def _store_named(root: str) -> str:
    """The store for a message: its path, and why it is that one unless someone named it."""
    location = _location(root)
    return root if location.reason is RootReason.OPTION else f"{root} ({location.describe()})"


def _root_arg(root: str) -> str:
    """`` --root R`` for a command shown to the user, when R came from --root (the default,
    MEMSTORE_ROOT or a workspace, is found again by the command as it was here)."""
    return f" --root {shlex.quote(root)}" if _location(root).reason is RootReason.OPTION else ""


# --- verbosity: what the library logs, on stderr ---

_LEVELS = (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR, logging.CRITICAL + 10)


class _StderrHandler(logging.Handler):
    """Writes records to the current ``sys.stderr`` (through click, so a test runner's capture
    sees them) as ``memstore: warning: ...``: one recognisable line per record."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            click.echo(f"memstore: {record.levelname.lower()}: {record.getMessage()}", err=True)
        except Exception:  # noqa: BLE001 - logging must never break the command
            self.handleError(record)


def _set_verbosity(ctx: click.Context, param: click.Parameter, value: int) -> int:
    if value:
        ctx.meta[f"memstore.{param.name}"] = value
        _apply_verbosity(ctx)
    return value


def _apply_verbosity(ctx: click.Context) -> None:
    """The ``memstore`` logger's level from -v/-q: warnings by default, each -v one level more
    detail, each -q one level less (-qq: nothing)."""
    step = ctx.meta.get("memstore.verbose", 0) - ctx.meta.get("memstore.quiet", 0)
    index = max(0, min(len(_LEVELS) - 1, _LEVELS.index(logging.WARNING) - step))
    logging.getLogger("memstore").setLevel(_LEVELS[index])


def _quiet() -> bool:
    ctx = click.get_current_context(silent=True)
    return bool(ctx is not None and ctx.meta.get("memstore.quiet"))


_VERBOSITY = (
    click.Option(
        ["-v", "--verbose"],
        count=True,
        expose_value=False,
        is_eager=True,
        callback=_set_verbosity,
        help="Say more on stderr (-v: what is done, -vv: debugging detail).",
    ),
    click.Option(
        ["-q", "--quiet"],
        count=True,
        expose_value=False,
        is_eager=True,
        callback=_set_verbosity,
        help="Say less on stderr (-q: errors only, no progress bars; -qq: nothing).",
    ),
)


def limit_option(default: Optional[int], help: str, *, minimum: int = 1, maximum: Optional[int] = None):
    """The one name for a result limit: ``-n`` / ``--limit``."""
    return click.option(
        "-n",
        "--limit",
        "limit",
        type=click.IntRange(min=minimum, max=maximum),
        default=default,
        show_default=default is not None,
        help=help,
    )


class _Group(click.Group):
    """Turns every error of the library into one clear line (or ``{"error": ...}`` with
    ``--json``) and a meaningful exit code, never a traceback. Usage mistakes too: one line
    that points at the command's --help, instead of click's usage block."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        """Run the command with the library's log records on stderr (see :class:`_StderrHandler`),
        at the level -v/-q ask for; the ``memstore`` logger is left as it was afterwards."""
        library = logging.getLogger("memstore")
        saved = library.level
        handler = _StderrHandler()
        library.addHandler(handler)
        library.setLevel(logging.WARNING)
        try:
            return super().main(*args, **kwargs)
        finally:
            library.removeHandler(handler)
            library.setLevel(saved)

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
            error: click.ClickException = _ExitWith(
                str(exc), 1 if isinstance(exc, (errors.TurnNotFound, errors.EventNotFound)) else 2
            )
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
    return "--json" in args[: args.index("--") if "--" in args else len(args)]


def _report(error: click.ClickException, as_json: bool):
    if as_json:
        click.echo(orjson.dumps({"error": error.format_message(), "exit_code": error.exit_code}).decode(), err=True)
        sys.exit(error.exit_code)
    raise error


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="memstore")
def cli():
    """memstore: a per-session event store for AI coding agents.

    Every command works on one store: --root, else $MEMSTORE_ROOT, else the nearest VT Code
    workspace's .vtcode/, else your per-user store (`memstore path` says which, and why).

    \b
    Examples:
      memstore demo && memstore serve          # browse a demo store
      memstore import                          # your Codex and Claude Code sessions
      memstore sessions -n 10                  # newest first, with tokens and cost
      memstore search "cargo test failed"      # BM25 over every session
      memstore show SESSION --turn 3           # one turn: prompt, commands, changes, answer
      memstore path                            # which store, and why
    """


@cli.command("path")
@root_option
@json_option
def path_command(root, as_json):
    """Print the store in use (on stdout) and why it is that one (on stderr).

    The store is --root, else $MEMSTORE_ROOT, else the nearest VT Code workspace's .vtcode/
    (in this directory or a parent), else the per-user store, the same from every directory.

    \b
    Examples:
      memstore path
      cd "$(memstore path)" && ls sessions
      memstore path --json
    """
    location = _location(root)
    if as_json:
        _echo_json(location.to_dict())
        return
    click.echo(str(location.path))
    if not _quiet():
        why = location.describe()
        if location.reason is RootReason.USER:
            why += f": no --root, no {ENV_VAR}, no VT Code workspace (.vtcode/) here or above"
        state = "" if location.path.is_dir() else "; not created yet"
        click.echo(f"({why}{state})", err=True)


class _ExitWith(click.ClickException):
    """A ClickException ("Error: ..." on stderr) with a chosen exit code."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code  # type: ignore[misc]  # click declares it on the class


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


def _fail(exc: Exception, code: int = 2) -> _ExitWith:
    return _ExitWith(str(exc), code)


# --- sessions: demo, append, rebuild, sessions, show ---


@cli.command("demo")
@root_option
@click.option(
    "--sessions",
    type=click.IntRange(min=4, max=10_000),
    default=30,
    show_default=True,
    help="About how many sessions to write.",
)
@click.option("--seed", type=int, default=7, show_default=True, help="Seed of the generated sessions.")
@json_option
def demo_command(root, sessions, seed, as_json):
    """Write a realistic demonstration store (about 30 agent sessions) to open in the explorer.

    Multi-turn tasks on four projects (Rust, Python, TypeScript, Go) with commands and their
    output, failing tests then fixes, diffs in each file's language, denied tool calls, a
    compaction, failed and aborted turns; token usage of real agent turns on models the price
    table knows, so every session has a cost; memory envelopes and their facts
    (derived/memory.json); progress ledgers with goals and milestones in most sessions; and
    sessions imported from Codex and Claude Code logs, one with a sub-agent. Seeded, and
    idempotent: running it again changes nothing, and it never removes or rewrites anything
    (a session of a demo name that holds other events is left as it is).

    \b
    Examples:
      memstore demo && memstore serve
      memstore demo --root /tmp/demo --sessions 100 --seed 1
    """
    from .demo import write_demo_store
    from .explorer.urls import Urls

    with _progress_bar("writing the demo store", enabled=not as_json) as progress:
        report = write_demo_store(root, sessions, seed, progress=progress)
    if as_json:
        _echo_json(report.to_dict())
        return
    click.echo(
        f"demo store in {_store_named(root)}: "
        f"{plural(len(report.written) + len(report.imported), 'session')} written "
        f"({plural(report.events, 'event')}), {len(report.skipped)} already there"
    )
    if report.kept:
        click.echo(f"left as they are (they hold events that are not the demo's): {', '.join(report.kept)}")
    click.echo(f"next: memstore serve{_root_arg(root)}   (then open {Urls(EXPLORER_URL).home()})")


PROGRESS_DELAY = 1.0  # seconds of work before a progress bar appears


class _progress_bar:
    """A click progress bar on stderr for ``progress(done, total)`` callbacks; shown only for
    long work (``minimum`` steps or more, still running after :data:`PROGRESS_DELAY` seconds),
    and never in --json mode."""

    def __init__(self, label: str, enabled: bool = True, minimum: int = 2):
        self.label, self.enabled, self.minimum = label, enabled, minimum
        self.bar: Optional[Any] = None
        self.shown = 0
        self.started = 0.0

    def __enter__(self):
        import time

        self.started = time.monotonic()
        return self.update

    def update(self, done: int, total: int) -> None:
        if not self.enabled or total < self.minimum or _quiet():
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


@cli.command("append")
@click.argument("session", callback=_session_ids)
@click.argument("source", type=click.File("rb"), default="-")
@root_option
@click.option("--durability", type=click.Choice(["turn", "event", "none"]), default="turn", show_default=True)
@click.option(
    "--max-events",
    type=click.IntRange(min=0),
    default=10_000,
    show_default=True,
    help="Cap on the events kept (0: no cap).",
)
@click.option(
    "--atomic", is_flag=True, help="Check every line against the event contract first; append all of them or none."
)
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
                raise _ExitWith(
                    f"read {source.name}: {exc.strerror or exc}" + (f" (after line {number})" if number else ""), 2
                ) from None
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
    # Until one is appended, each line is checked in full first ("nothing appended"): the
    # session is created only once its first valid event is ready, so input that is empty or
    # bad from its first line leaves no empty session behind.
    events = (
        iter(checked)
        if checked is not None
        else ((number, parse(number, line, appended or None)) for number, line in lines())
    )
    first = next(events, None)
    if first is None:
        manifest = _manifest_if_there(root, session)
    else:
        try:
            with open_session(root, session, max_events=max_events, durability=durability) as log:
                for number, data in itertools.chain([first], events):
                    try:
                        last_seq = log.append(data)
                    except errors.InvalidEvent as exc:
                        raise _ExitWith(
                            f"line {number}: {exc}; {plural(appended, 'event')} appended before it", 2
                        ) from exc
                    appended += 1
                manifest = log.manifest
        except errors.MemstoreError as exc:
            raise _fail(exc) from exc
    session_id = manifest.session_id if manifest is not None else session
    turns, count = (manifest.turn_count, manifest.event_count) if manifest is not None else (0, 0)
    if as_json:
        _echo_json(
            {
                "session_id": session_id,
                "appended": appended,
                "last_seq": last_seq,
                "turn_count": turns,
                "event_count": count,
            }
        )
    elif manifest is None:
        click.echo(
            f"appended nothing: no events in {getattr(source, 'name', 'the input')}, "
            f"and no session {session!r} was created"
        )
    else:
        click.echo(
            f"appended {plural(appended, 'event')} to {session_id!r} "
            f"({plural(count, 'event')}, {plural(turns, 'turn')})"
        )


def _manifest_if_there(root: str, session: str):
    """The session's manifest as its log says, ``None`` when there is no such session."""
    from .reader import read_session

    try:
        with read_session(root, session) as reader:
            return reader.manifest
    except errors.SessionNotFound:
        return None
    except errors.MemstoreError as exc:
        raise _fail(exc) from exc


@cli.command("rebuild")
@click.argument("sessions", nargs=-1, callback=_session_ids)
@click.option("--all", "rebuild_all", is_flag=True, help="Rebuild every session under the root.")
@click.option(
    "--jobs",
    "-j",
    type=click.IntRange(min=1),
    default=None,
    help="Worker processes (default: one per CPU, at most 8; 1: none).",
)
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
        sessions = tuple(session_ids(root, include_legacy=True))
        if not sessions:
            if as_json:
                _echo_json([])
            else:
                click.echo(f"no sessions in {_store_named(root)}")
            return
    sessions = tuple(dict.fromkeys(sessions))  # each once, as rebuild_each does
    if jobs is None:
        jobs = min(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1, 8)
    results: list[dict] = []
    failures = 0
    with click.progressbar(
        rebuild_each(root, sessions, jobs=jobs),
        length=len(sessions),
        label="rebuilding",
        file=sys.stderr,
        hidden=as_json or len(sessions) < 20 or not sys.stderr.isatty(),
    ) as bar:
        for session, manifest in bar:
            if isinstance(manifest, errors.MemstoreError):
                failures += 1
                results.append({"session_id": session, "error": str(manifest)})
                if not as_json:  # (with --json, the result says it)
                    logger.warning("%s: not rebuilt, the others are: %s", session, manifest)
                continue
            results.append(
                {
                    "session_id": manifest.session_id,
                    "turn_count": manifest.turn_count,
                    "event_count": manifest.event_count,
                    "status": manifest.status,
                }
            )
            if not as_json and len(sessions) < 20:
                click.echo(
                    f"{session}: {plural(manifest.event_count, 'event')}, "
                    f"{plural(manifest.turn_count, 'turn')}, {manifest.status}"
                )
    from .catalog import refresh_catalog

    if failures < len(sessions):  # nothing rebuilt, nothing to refresh (and nothing created)
        refresh_catalog(root)
    if as_json:
        _echo_json(results)
    elif len(sessions) >= 20:
        click.echo(
            f"rebuilt {plural(len(sessions) - failures, 'session')}" + (f", {failures} failed" if failures else "")
        )
    if failures:
        sys.exit(1 if failures < len(sessions) else 2)


@cli.command("sessions")
@root_option
@limit_option(None, "At most this many, newest first.")
@click.option(
    "--machine",
    default=None,
    metavar="STORE",
    help="Only sessions born in this store: its id or label (this store's, or one imported with `memstore import`).",
)
@json_option
def sessions_command(root, limit, machine, as_json):
    """List the sessions of the store, most recently updated first: title, agent, model,
    turns, tokens, cost and when each was last updated; the machine (store) each was born in
    too, once the store holds sessions of several (`memstore import` of another store).

    The details come from the store's catalog, brought up to date first (a progress bar shows
    when that takes long, as the first time on a large store does). Cost is the agent's own
    figure when it recorded one, else the tokens priced from the price table; "+" marks a
    lower bound (some turns of models the table does not know), "-" no figure at all.
    --json: one object per session, with the manifest's keys and those details (the machine as
    origin_store_id and origin_label).

    \b
    Examples:
      memstore sessions -n 10
      memstore sessions --json | jq '.[].session_id'
      memstore sessions --machine devbox
    """
    from .store import Store

    _require_store(root)
    summaries = Store(root).sessions(None if machine is not None else limit)
    details = _session_details(root, [s.session_id for s in summaries], enabled=not as_json)
    if machine is not None:
        if summaries and not details:
            raise click.ClickException("cannot filter by machine: the store's catalog could not be read")
        wanted = machine.strip()
        summaries = [s for s in summaries if wanted in _machine_of(details.get(s.session_id, {}))]
        summaries = summaries[:limit] if limit is not None else summaries
    if as_json:
        _echo_json([{**asdict(s), **details.get(s.session_id, {})} for s in summaries])
        return
    if not summaries:
        of = f" of machine {machine.strip()}" if machine is not None else ""
        click.echo(f"no sessions{of} in {_store_named(root)}")
        return
    # Which machine each session is from, once the store holds sessions of more than one.
    several = len({_machine_of(d) for d in details.values()}) > 1
    rows = []
    for s in summaries:
        d = details.get(s.session_id, {})
        tokens = (d.get("input_tokens") or 0) + (d.get("output_tokens") or 0)
        origin = (d.get("origin_label") or d.get("origin_store_id") or "",) if several else ()
        rows.append(
            (
                s.session_id,
                _shorten(d.get("title") or "", 48),
                d.get("agent") or "",
                *origin,
                d.get("model") or "",
                str(s.turn_count),
                _count(tokens) if d else "",
                _usd(d.get("cost_usd"), d.get("cost_unpriced_turns") or 0) if d else "",
                _when(s.updated_at),
            )
        )
    header = ("session", "title", "agent", *(("machine",) if several else ()), "model", "turns", "tokens", "cost")
    shift = 1 if several else 0
    right = {4 + shift, 5 + shift, 6 + shift}
    for line in _table((*header, "updated"), rows, right=right):  # ids are shown whole: `show` takes them
        click.echo(line)


def _machine_of(details: dict) -> tuple[Optional[str], Optional[str]]:
    """The store id and label of the machine a session was born in, as the catalog says."""
    return details.get("origin_store_id"), details.get("origin_label")


def _session_details(root: str, ids: list[str], *, enabled: bool) -> dict[str, dict]:
    """Title, agent, model, tokens and cost of each of ``ids`` from the catalog, refreshed first
    (with a progress bar on long work). A catalog that cannot be refreshed (a read-only store)
    is read as it is, and one that cannot be read gives no details: both are logged."""
    import sqlite3

    from .layout import catalog_path
    from .pricing import register_sql_functions
    from .store import Store

    if not ids:
        return {}
    try:
        with _progress_bar("updating the catalog", enabled=enabled) as progress:
            Store(root).refresh(progress=progress)
    except errors.MemstoreError as exc:
        logger.warning("sessions listed without the latest details: the catalog was not refreshed: %s", exc)
    path = catalog_path(root)
    if not path.is_file():
        return {}
    try:
        conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        logger.warning("sessions listed without details: %s: %s", path, exc)
        return {}
    try:
        register_sql_functions(conn)
        columns = {row[1] for row in conn.execute("PRAGMA table_info(sessions)")}
        if "cost_usd" in columns:  # the catalog prices turns itself (the agent's figure wins)
            cost = "s.cost_usd, s.cost_unpriced_turns"
        else:  # price each turn's tokens here, with the library's SQL functions
            priced = (
                "memstore_cost_usd(t.model, s.agent, t.input_tokens, t.cached_input_tokens, "
                "t.cache_creation_tokens, t.output_tokens, coalesce(t.ended_at, t.started_at))"
            )
            cost = (
                f"(SELECT CASE WHEN count({priced}) THEN total({priced}) END FROM turns t "
                "WHERE t.session_id = s.session_id), "
                f"(SELECT count(*) - count({priced}) FROM turns t WHERE t.session_id = s.session_id "
                "AND t.input_tokens + t.output_tokens > 0)"
            )
        origin = (
            "s.origin_store_id, s.origin_label" if "origin_store_id" in columns else "NULL, NULL"
        )  # an older catalog (read-only) has no origins
        details = {}
        for row in conn.execute(
            f"SELECT s.session_id, s.title, s.agent, s.model, s.input_tokens, s.cached_input_tokens, "
            f"s.cache_creation_tokens, s.output_tokens, {cost}, {origin} FROM sessions s "
            "WHERE s.session_id IN (SELECT value FROM json_each(?))",
            (orjson.dumps(ids).decode(),),
        ):
            details[row[0]] = dict(
                zip(
                    (
                        "title",
                        "agent",
                        "model",
                        "input_tokens",
                        "cached_input_tokens",
                        "cache_creation_tokens",
                        "output_tokens",
                        "cost_usd",
                        "cost_unpriced_turns",
                        "origin_store_id",
                        "origin_label",
                    ),
                    row[1:],
                )
            )
        return details
    except sqlite3.Error as exc:
        logger.warning("sessions listed without details: %s: %s", path, exc)
        return {}
    finally:
        conn.close()


def _shorten(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _count(n: Optional[int]) -> str:
    """``1,234`` / ``12.3k`` / ``4.5M``: token counts people can compare at a glance."""
    n = n or 0
    if n < 10_000:
        return f"{n:,}"
    if n < 1_000_000:
        return f"{n / 1000:.1f}k"
    return f"{n / 1_000_000:.1f}M"


def _usd(usd: Optional[float], unpriced: int = 0) -> str:
    """A dollar figure; ``+`` when it is a lower bound (some parts unpriced), ``-`` when none."""
    if usd is None:
        return "-"
    text = f"${usd:,.2f}" if usd >= 1 else f"${usd:.4f}" if usd < 0.01 else f"${usd:.3f}"
    return text + ("+" if unpriced else "")


def _when(ts: Optional[str], *, now: Optional[datetime] = None) -> str:
    """``2026-11-03 15:35 (3 h ago)``: a memstore timestamp (UTC) in the local time zone, and how
    long ago it was; as it is when it is not a timestamp."""
    local = _local(ts)
    if not ts or local == ts:
        return ts or ""
    return f"{local} ({_ago(ts, now=now)})"


def _local(ts: Optional[str], *, seconds: bool = False) -> str:
    """A memstore timestamp in the local time zone (``2026-11-03 15:35``, with ``seconds``
    ``15:35:09``); as it is when it is not one."""
    from .events import parse_ts

    when = parse_ts(ts)
    if when is None:
        return ts or ""
    return when.astimezone().strftime("%Y-%m-%d %H:%M:%S" if seconds else "%Y-%m-%d %H:%M")


def _ago(ts: Optional[str], *, now: Optional[datetime] = None) -> str:
    """How long before ``now`` (default: the current time) ``ts`` was, in the largest unit that
    fits: ``just now``, ``12 min ago``, ``3 h ago``, ``5 days ago``, ``4 months ago``,
    ``2 years ago``; ``in 5 min`` for a time ahead of the clock. Empty when ``ts`` is no
    timestamp."""
    from .events import parse_ts

    when = parse_ts(ts)
    if when is None:
        return ""
    seconds = ((now or datetime.now(UTC)) - when).total_seconds()
    ahead, seconds = seconds < 0, abs(seconds)
    if seconds < 60:
        return "just now"
    for size, unit, units in (
        (365 * 86400, "year", "years"),
        (30 * 86400, "month", "months"),
        (86400, "day", "days"),
        (3600, "h", "h"),
        (60, "min", "min"),
    ):
        if seconds >= size * (2 if unit in ("year", "month") else 1):
            n = int(seconds // size)
            text = f"{n} {unit if n == 1 else units}"
            return f"in {text}" if ahead else f"{text} ago"
    return "just now"  # (not reached: every span of 60 s or more has a unit)


def _require_store(root: str) -> None:
    """A command that reads a store refuses a root that is not one, in one clear line that says
    which store it looked for and why that one."""
    import os

    if not os.path.isdir(root):
        raise _ExitWith(
            f"no store at {_store_named(root)}: no such directory (`memstore demo` or `memstore import` "
            f"make one; or set --root or {ENV_VAR})",
            2,
        )


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
@click.option(
    "--turn",
    "turn_number",
    type=_PositiveNumber(),
    default=None,
    help="Show this turn: its prompt, commands, file changes, answer, tokens and cost.",
)
@click.option(
    "--tail",
    "tail_lines",
    type=click.IntRange(min=0),
    default=6,
    show_default=True,
    help="Lines of each command's output to show (its last ones; 0: none).",
)
@click.option(
    "--jsonl", "as_jsonl", is_flag=True, help="The events as JSON Lines (the turn's with --turn, else the session's)."
)
@limit_option(None, "List at most this many turns, the last ones (the session's cost stays its whole cost).")
@root_option
@json_option
def show_command(session, turn_number, tail_lines, as_jsonl, limit, root, as_json):
    """Show SESSION: its manifest, turns, tokens and cost; with --turn N, that turn as a person
    reads it.

    --json: the manifest and turns as JSON (with --turn, the turn's events as a JSON array);
    --jsonl: the events as JSON Lines. Reads without locking, so it works while an agent
    writes the session. Exit 1 when the turn is not there, 2 when the session is not.

    \b
    Examples:
      memstore show run-42
      memstore show run-42 --turn 3
      memstore show run-42 --turn 3 --jsonl | jq .type
      memstore show run-42 --json
    """
    from .reader import read_session

    _require_store(root)
    try:
        with read_session(root, session, redact=True) as reader:
            manifest = reader.manifest
            if turn_number is not None:
                if turn_number > MAX_SEQ:  # no turn is numbered past the largest seq
                    raise errors.TurnNotFound(manifest.session_id, turn_number)
                records = reader.turn_records(turn_number)
                turn = reader.turn(turn_number)
                if as_json:
                    _echo_json([r.event for r in records])
                elif as_jsonl:
                    for record in records:
                        click.echo(orjson.dumps(record.event).decode())
                else:
                    _print_turn(manifest, turn, records, tail_lines, root)
                return
            if as_jsonl:
                for record in reader.iter_records():
                    click.echo(orjson.dumps(record.event).decode())
                return
            turns = reader.turns()
            costs, total = _turn_costs(manifest, reader.iter_records())
    except errors.TurnNotFound as exc:
        raise _ExitWith(str(exc), 1) from exc
    except errors.MemstoreError as exc:
        raise _fail(exc) from exc
    earlier = max(0, len(turns) - limit) if limit is not None else 0
    turns = turns[earlier:]
    if as_json:
        _echo_json({"manifest": manifest.to_dict(), "turns": [asdict(t) for t in turns], "cost": total.to_dict()})
        return
    # turn_count counts closed turns (as VT Code's manifest does): say so when one is open.
    open_turn = " (and 1 open)" if manifest.in_turn else ""
    click.echo(
        f"session {manifest.session_id!r}: {manifest.status}, {plural(manifest.turn_count, 'turn')}{open_turn}, "
        f"{plural(manifest.event_count, 'event')}, updated {_when(manifest.updated_at)}"
    )
    source = manifest.source or {}
    about = [f"{key} {source[key]}" for key in ("agent", "cwd", "git_branch") if isinstance(source.get(key), str)]
    click.echo("  ".join(about + [f"cost {_cost_text(total)}"]))
    if earlier:
        click.echo(f"({plural(earlier, 'earlier turn')} not listed; -n sets how many are)")
    _print_turns(turns, costs)
    if turns:
        click.echo(f"one turn: memstore show {shlex.quote(manifest.session_id)} --turn N{_root_arg(root)}")


def _print_turns(turns, costs: Optional[dict] = None) -> None:
    costs = costs or {}
    rows = []
    for t in turns:
        cost = costs.get(t.number)
        rows.append(
            (
                str(t.number),
                t.status,
                str(t.event_count),
                f"{t.input_tokens:,}",
                f"{t.cached_input_tokens:,}",
                f"{t.output_tokens:,}",
                _usd(float(cost.usd)) if cost is not None and cost.usd is not None else "-",
                t.model or "-",
                _local(t.started_at),
            )
        )
    header = ("turn", "status", "events", "input", "cached", "output", "cost", "model", "started")
    for line in _table(header, rows, right={0, 2, 3, 4, 5, 6}):
        click.echo(line)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], *, right: set[int]) -> list[str]:
    """``header`` and ``rows`` as aligned columns two spaces apart (the columns in ``right``
    right-aligned, as numbers are), each line without trailing spaces."""
    widths = [max([len(header[i]), *(len(r[i]) for r in rows)]) for i in range(len(header))]

    def line(cells) -> str:
        return "  ".join(
            c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))
        ).rstrip()

    return [line(header), *(line(r) for r in rows)]


def _agent_of(manifest) -> Optional[str]:
    agent = (manifest.source or {}).get("agent")
    return agent if isinstance(agent, str) else None


def _turn_costs(manifest, records) -> tuple[dict, Any]:
    """Each closed turn's cost (by number, from its end event: the agent's figure, else its
    tokens priced) and the session's (the agent's whole-session figure when it recorded one)."""
    from .events import THREAD_COMPLETED, TURN_ENDS, TURN_STARTED
    from .pricing import session_cost, turn_cost

    costs: dict[int, Any] = {}
    number = manifest.retained_turn_base - 1
    completed = None
    for record in records:
        kind = record.event.get("type")
        if kind == TURN_STARTED:
            number += 1
        elif kind in TURN_ENDS:
            costs[number] = turn_cost(record.event, provider_hint=_agent_of(manifest), when=record.ts)
        elif kind == THREAD_COMPLETED:
            completed = record.event
    return costs, session_cost(costs.values(), completed)


def _cost_text(summary) -> str:
    """A session's cost for people: ``$0.123 (estimated)``, ``+`` when some turns are unpriced."""
    if summary.usd is None:
        return "- (unpriced)" if summary.unpriced else "-"
    return f"{_usd(float(summary.usd), summary.unpriced)} ({summary.source.value})"


def _print_turn(manifest, turn, records, tail_lines: int, root: str) -> None:
    """One turn for a person: what was asked, each command with its exit code and the tail of
    its output, tool calls, file changes, the answer, then tokens and cost (see
    ``memstore.explorer.render``, which says what each event is)."""
    from .events import TURN_ENDS
    from .explorer.render import display_event
    from .pricing import turn_cost

    head = f"session {manifest.session_id!r}, turn {turn.number}: {turn.status}"
    click.echo(click.style(head, bold=True) + _span(turn.started_at, turn.ended_at))
    end_event = None
    views = [display_event(record.event) for record in records]
    answers = [i for i, view in enumerate(views) if view.get("kind") == "message" and view.get("role") == "agent"]
    for i, (record, view) in enumerate(zip(records, views)):
        if record.event.get("type") in TURN_ENDS:
            end_event = record
        if answers and i == answers[-1]:
            view = {**view, "role": "answer"}  # the turn's last word: its answer
        for line in _turn_lines(view, tail_lines, root):
            click.echo(line)
    usage = (
        f"tokens: {turn.input_tokens:,} in ({turn.cached_input_tokens:,} cached"
        + (f", {turn.cache_creation_tokens:,} written to the cache" if turn.cache_creation_tokens else "")
        + f"), {turn.output_tokens:,} out"
    )
    if end_event is not None:
        cost = turn_cost(end_event.event, provider_hint=_agent_of(manifest), when=end_event.ts)
        priced = (
            f"{_usd(float(cost.usd))} ({cost.source.value}"
            + (f", {cost.model_matched}" if cost.model_matched else "")
            + ")"
            if cost.usd is not None
            else (f"- ({cost.note})" if cost.note else "-")
        )
        usage += f"; cost {priced}"
    click.echo(f"{turn.model + ': ' if turn.model else ''}{usage}")


def _turn_lines(view: dict, tail_lines: int, root: str) -> list[str]:
    """The lines one displayed event takes in ``memstore show --turn`` (none for the turn's
    start and end: the header and footer say those)."""
    kind, title = view.get("kind"), view.get("title") or ""
    text = (view.get("text") or {}).get("text", "") if isinstance(view.get("text"), dict) else ""
    error = view.get("tone") == "error"
    if kind == "lifecycle":
        return [f"{title}: {_first_line(text)}"] if view.get("status") == "aborted" else []
    if kind == "message":
        if view.get("role") == "reasoning":
            return [click.style(f"(thinking) {_shorten(text, 100)}", dim=True)] if text else []
        label = {"user": "prompt", "agent": "agent", "answer": "answer"}.get(view.get("role") or "", title.lower())
        return [click.style(f"{label}:", bold=True)] + [f"  {line}" for line in text.rstrip().splitlines()]
    if kind == "command":
        code = view.get("exit_code")
        state = f"exit {code}" if code is not None else view.get("status") or "no exit code"
        lines = [
            click.style(f"$ {view.get('command')}", bold=True)
            + "  "
            + click.style(f"[{state}]", fg="red" if error else "green" if code == 0 else None)
        ]
        output = (view.get("output") or {}).get("text", "").rstrip("\n")
        if tail_lines and output:
            out = output.splitlines()
            if len(out) > tail_lines:
                lines.append(click.style(f"  | ... {plural(len(out) - tail_lines, 'line')} above", dim=True))
            lines.extend(f"  | {line}" for line in out[-tail_lines:])
        return lines
    if kind == "tool":
        args = (view.get("arguments") or {}).get("text", "")
        status = view.get("status") or ""
        line = f"tool {view.get('tool')}({_shorten(args, 80)})" + (f"  [{status}]" if status else "")
        lines = [click.style(line, fg="red") if error else line]
        if view.get("child_session_id"):
            child = view["child_session_id"]
            lines.append(f"  -> sub-agent session {child}: memstore show {shlex.quote(child)}{_root_arg(root)}")
        return lines
    if kind == "tool_output":
        return (
            [click.style(f"  -> {_shorten((view.get('output') or {}).get('text', ''), 100)}", fg="red")]
            if error
            else []
        )
    if kind == "file_change":
        counts = " ".join(
            f"{sign}{view[key]}" for sign, key in (("+", "additions"), ("-", "deletions")) if view.get(key) is not None
        )
        return [
            f"changed {c['path']} ({c['kind']}{', ' + counts if counts else ''})" for c in view.get("changes") or []
        ] or [f"file change{' ' + counts if counts else ''}"]
    if kind in ("error", "notice"):
        line = f"{title}" + (f": {_first_line(text)}" if text else "")
        return [click.style(line, fg="red" if error else "yellow")]
    if kind == "todo":
        return ["to-do:"] + [f"  [{'x' if i['done'] else ' '}] {i['text']}" for i in view.get("items") or []]
    return [click.style(title, dim=True)]


def _span(started: Optional[str], ended: Optional[str]) -> str:
    """``  (2026-11-03 14:05:09, 2m 31s)``: when a turn started (local time) and how long it took."""
    from .events import parse_ts

    if not started:
        return ""
    start, end = parse_ts(started), parse_ts(ended) if ended else None
    shown = _local(started, seconds=True)
    if start is None or end is None:
        return f"  ({shown})"
    seconds = max(0, round((end - start).total_seconds()))
    took = (
        f"{seconds // 3600}h {seconds % 3600 // 60}m"
        if seconds >= 3600
        else (f"{seconds // 60}m {seconds % 60}s" if seconds >= 60 else f"{seconds}s")
    )
    return f"  ({shown}, {took})"


def _first_line(text: str) -> str:
    return _shorten(text.strip().splitlines()[0] if text.strip() else "", 160)


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
        logger.warning("%s is a pack of session %r, not %r", path, pack.session_id, session)
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
@click.option(
    "--source", type=click.Choice(["event", "session"]), default=None, help="Only event text, or only memory facts."
)
@click.option(
    "--machine",
    default=None,
    metavar="STORE",
    help="Only sessions born in this store: its id or label (this store's, or one imported with `memstore import`).",
)
@limit_option(10, "At most this many results.", maximum=1000)
@click.option("--max-results", "max_results", type=click.IntRange(min=1, max=1000), default=None, hidden=True)
@click.option("--no-recency", is_flag=True, help="Plain BM25, without the mild preference for recent events.")
@click.option(
    "--explorer-url",
    default=None,
    envvar="MEMSTORE_EXPLORER_URL",
    metavar="URL",
    help="Base URL of the explorer, for the links of the hits (env MEMSTORE_EXPLORER_URL). Default: the "
    "`memstore serve` running on this store, if one is; else no links.",
)
@root_option
@json_option
def search_command(
    query, session_id, since, source, machine, limit, max_results, no_recency, explorer_url, root, as_json
):
    """BM25 search over every session: where did the agent do QUERY?

    Each hit says where it is and when (local time, and how long ago), with the `memstore
    show` command that opens its turn and, while `memstore serve` runs on this store (or with
    --explorer-url), its page in the explorer. The first search of a large store builds its
    catalog first (a progress bar shows while that takes long). --json: the hits, each with
    "show" and "url" (null when no explorer is known).

    \b
    Examples:
      memstore search "mismatched types"
      memstore search "cargo test" --since 2026-11-01 -n 20 --json
      memstore search "migration" --machine devbox
      memstore search "flaky test" --explorer-url https://agents.example.com/
    """
    from .explorer.urls import Urls
    from .search import search_memory
    from .store import Store

    _require_store(root)
    if session_id is not None:
        _existing_session_dir(root, session_id)
    if max_results is not None:  # the old spelling, kept for scripts
        limit = max_results
    try:
        with _progress_bar("building the catalog", enabled=not as_json) as progress:
            # The change feed (and a sweep when due), at the cost of what changed; the whole
            # catalog only when it was never built.
            Store(root).refresh(full=False, sweep=False, progress=progress)
    except errors.StoreIOError as exc:  # a read-only store: search what the catalog holds
        logger.warning("searching without refreshing the catalog first: %s", exc)
    try:
        results = search_memory(
            root,
            query,
            limit,
            source=source,
            session_id=session_id,
            since=since,
            recency=not no_recency,
            machine=machine,
        )
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--since") from exc
    missing = getattr(results, "missing", ())
    if missing:
        # On stderr, so stdout stays the results (a list, with --json) whatever happened.
        if as_json:
            warning = {"warning": "partial results", "missing": [m.to_dict() for m in missing]}
            click.echo(orjson.dumps(warning).decode(), err=True)
        else:
            names = ", ".join(f"{m.directory} ({m.reason})" for m in missing[:5])
            more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
            click.echo(
                f"warning: partial results: {plural(len(missing), 'session')} not searched: {names}{more}", err=True
            )
    base = _explorer_base(root, explorer_url)
    urls = Urls(base) if base is not None else None
    hits = [(r, _hit_url(urls, r) if urls is not None else None, _hit_command(r, root)) for r in results]
    if as_json:
        _echo_json([{**r.to_dict(), "url": url, "show": command} for r, url, command in hits])
        return
    if not results:
        click.echo("no results")
        return
    rows = [
        (
            f"{r.score:.3f}",
            _hit_place(r),
            r.kind or r.source or "",
            _when(r.created_at),
        )
        for r, _url, _command in hits
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    indent = " " * (widths[0] + 2)
    for (score, where, kind, when), (r, url, command) in zip(rows, hits):
        click.echo(f"{score:>{widths[0]}}  {where:<{widths[1]}}  {kind:<{widths[2]}}  {when}".rstrip())
        click.echo(f"{indent}{r.snippet}")
        click.echo(click.style(f"{indent}{command}", dim=True))
        if url is not None:
            click.echo(click.style(f"{indent}{url}", dim=True))
    if urls is None and not _quiet():
        click.echo(f"(links to the explorer: run `memstore serve{_root_arg(root)}`, or pass --explorer-url)", err=True)


def _hit_place(hit) -> str:
    """Where a hit is, for people: ``run-42 turn 3 event 17``, or ``run-42 (memory)``."""
    if hit.turn is None:
        return f"{hit.session_id} (memory)"
    return f"{hit.session_id} turn {hit.turn}" + (f" event {hit.seq}" if hit.seq is not None else "")


def _explorer_base(root: str, configured: Optional[str]) -> Optional[str]:
    """The explorer's base URL for links: the one configured (--explorer-url or
    MEMSTORE_EXPLORER_URL), else that of the `memstore serve` running on this store now, else
    None (a link to a server that is not there would only mislead)."""
    from .location import running_explorer

    if configured:
        return configured
    record = running_explorer(root)
    return record.base_url if record is not None else None


def _hit_url(urls, hit) -> str:
    """The explorer page of a hit: its turn, at its event, or for a memory fact the session."""
    if hit.turn is not None:
        return urls.turn(hit.session_id, hit.turn, anchor=hit.seq)
    return urls.session(hit.session_id)


def _hit_command(hit, root: str) -> str:
    """The command that opens a hit: ``memstore show SESSION --turn N``."""
    turn = f" --turn {hit.turn}" if hit.turn is not None else ""
    return f"memstore show {shlex.quote(hit.session_id)}{turn}{_root_arg(root)}"


# --- importing other agents' logs ---


@cli.command("import")
@click.argument("paths", nargs=-1, type=click.Path(exists=True, path_type=str))
@click.option(
    "--source",
    type=click.Choice(["auto", "codex", "codex-exec", "claude"]),
    default="auto",
    show_default=True,
    help="What the files are; auto tells each file by its lines.",
)
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
        paths = tuple(
            p for p in (os.path.join(codex_home, "sessions"), os.path.join(claude_home, "projects")) if os.path.isdir(p)
        )
        if not paths:
            if as_json:  # an empty report: there was nothing to import, which is no error
                from .importers import ImportReport

                _echo_json(ImportReport().to_dict())
            click.echo("nothing to import: neither ~/.codex/sessions nor ~/.claude/projects exists", err=True)
            return
    # Sessions and bytes with a rate and a time left, on stderr, once the import has run a while.
    line = None if as_json or _quiet() else ProgressLine("importing", sys.stderr, delay=PROGRESS_DELAY)
    try:
        report = import_logs(root, paths, source, progress=line)
    except errors.MemstoreError as exc:
        raise _fail(exc) from exc
    finally:
        if line is not None:
            line.close()
    if not _quiet():  # format drift: on stderr, with or without --json (-q: errors only)
        for warning in report.warnings:
            click.echo(warning, err=True)  # already "warning: format drift: ..." (the importer's prefix)
    if as_json:
        _echo_json(report.to_dict())
        return
    for problem in report.problems:
        where = f"{problem.path}:{problem.line}" if problem.line else problem.path
        logger.warning("%s: %s", where, problem.reason)
    click.echo(
        f"imported {plural(report.events_appended, 'event')} from {plural(report.sources, 'source')} "
        f"into {_store_named(root)}: "
        f"{plural(report.sessions_created, 'session')} created, {report.sessions_updated} updated, "
        f"{report.sessions_regenerated} regenerated, {report.sessions_unchanged} unchanged; "
        f"{plural(report.lines_skipped, 'line')} skipped, {plural(len(report.problems), 'problem')}"
    )
    for renamed in report.renamed:
        click.echo(f"imported {renamed.session_id} as {renamed.imported_as} (that id names another session here)")
    for aside in report.set_aside:
        click.echo(f"set aside {aside.session_id} as {aside.set_aside_as} ({aside.reason}; every event kept)")
    if report.tombstoned:
        click.echo(
            f"not imported: {plural(len(report.tombstoned), 'source')} of sessions removed on purpose (tombstoned)"
        )
    for agent in report.agents:
        click.echo(agent.line())
    if report.sessions:
        named = report.sessions[:10]
        more = f" and {len(report.sessions) - len(named)} more" if len(report.sessions) > len(named) else ""
        click.echo(f"sessions: {', '.join(named)}{more}")


# --- retention, pins, legacy migration, memory facts ---


@cli.command("retention")
@root_option
@click.option(
    "--max-sessions",
    type=click.IntRange(min=0),
    default=50,
    show_default=True,
    help="Keep at most this many removable (completed, unpinned, idle) sessions.",
)
@click.option(
    "--max-age-days",
    type=click.IntRange(min=0),
    default=30,
    show_default=True,
    help="Remove sessions whose last event is older than this, first marking idle active ones that old "
    "completed (0: no age limit: nothing ages out, nothing is marked).",
)
@click.option(
    "--preserve", "preserve", default=None, metavar="SESSION", callback=_session_ids, help="Never touch this session."
)
@click.option(
    "--include-imported",
    is_flag=True,
    help="Also age out sessions imported from Codex and Claude Code logs (tombstoned, so that no import "
    "recreates them). By default they are kept and not counted.",
)
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
    click.echo(f"{verb} {plural(report.count, 'session')} ({plural(report.bytes, 'byte')}) from {_store_named(root)}")
    for r in report.removed:
        click.echo(f"  {r.directory:<40} {r.reason:<12} {r.bytes:>10} bytes  updated {r.updated_at}")
    if report.marked_abandoned:
        click.echo(
            f"{'marked' if apply_ else 'would mark'} completed (abandoned): {', '.join(report.marked_abandoned)}"
        )
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
@click.option(
    "--remove-legacy",
    is_flag=True,
    help="Then remove the legacy files whose content was imported (others are kept and listed).",
)
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
        click.echo(
            f"imported {plural(report.memory_imported, 'memory envelope')} and "
            f"{plural(report.trajectory_imported, 'trajectory log')} "
            f"({plural(report.records_imported, 'record')}, {plural(report.bytes_migrated, 'byte')}): "
            f"{plural(report.sessions_created, 'session')} created, {report.sessions_updated} updated; "
            f"{report.already_imported} already imported, "
            f"{report.already_migrated} already migrated by VT Code"
        )
        for m in report.migrated_by_vtcode:
            click.echo(f"migrated by VT Code: {m.path} (session {m.session}): {m.state.value.replace('_', ' ')}")
        for s in report.skipped:
            click.echo(f"not imported: {s.path}: {s.reason}")
        if report.legacy is not None:
            click.echo(
                f"removed {plural(len(report.legacy.removed), 'legacy file')} "
                f"({plural(report.legacy.bytes_freed, 'byte')})"
            )
            for s in report.legacy.kept:
                click.echo(f"kept: {s.path}: {s.reason}")
    if report.skipped:
        sys.exit(1)


@cli.command("facts")
@root_option
@limit_option(100, "At most this many facts.", minimum=0)
@click.option("--session", "session", default=None, callback=_session_ids, help="Only this session's facts.")
@json_option
def facts_command(root, limit, session, as_json):
    """List the grounded facts of the sessions' memory views (derived/memory.json), newest
    sessions first.

    \b
    Examples:
      memstore facts -n 20
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
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Interface to bind (the default is reachable from this machine only).",
)
@click.option(
    "--port",
    type=click.IntRange(min=0, max=65535),
    default=8001,
    show_default=True,
    help="Port to listen on (0: a free one, announced).",
)
@click.option(
    "--refresh-interval",
    type=click.FloatRange(min=0),
    default=3.0,
    show_default=True,
    help="Refresh the catalog at most this often (seconds) while pages are requested; 0: never.",
)
@click.option(
    "--allow-host",
    "allow_hosts",
    multiple=True,
    metavar="NAME",
    help="Also answer requests for this host name (repeatable; '*': any). Local names and the "
    "bound address are always answered; others are refused (DNS rebinding).",
)
@click.option(
    "--metadata",
    type=click.Path(exists=True, dir_okay=False, path_type=str),
    default=None,
    help="Your Datasette metadata file, laid over the explorer's own.",
)
@click.option(
    "--plugins-dir",
    type=click.Path(exists=True, file_okay=False, path_type=str),
    default=None,
    help="Your Datasette plugins directory (the explorer's plugin is always loaded).",
)
@json_option
def serve_command(root, host, port, refresh_interval, allow_hosts, metadata, plugins_dir, as_json):
    """Explore the store in a browser: refresh its catalog and serve it with Datasette.

    Opens http://localhost:8001/-/memstore: sessions, turns, events, search, charts and SQL
    over catalog.db. New sessions appear without a restart (the catalog is refreshed in the
    background while pages are requested). Read-only. Stop with Ctrl-C. While it runs,
    `memstore search` on the same store links each hit to its page here.

    \b
    Examples:
      memstore demo && memstore serve
      memstore serve --root ~/project/.vtcode --port 8002
      MEMSTORE_ROOT=/srv/agents memstore serve --host 0.0.0.0 --allow-host agents.example.org
    """
    from .explorer import server
    from .explorer.urls import PREFIX
    from .location import ExplorerRecord, forget_explorer, record_explorer

    kwargs = {}
    if metadata is not None:
        kwargs["metadata"] = metadata
    if plugins_dir is not None:
        kwargs["plugins_dir"] = plugins_dir
    if port == 0:  # a free port chosen here, so that the URL announced is the one served
        try:
            port = _free_port(host)
        except OSError as exc:
            raise _ExitWith(f"cannot serve on {host}: {exc.strerror or exc}", 2) from exc
    recorded = False
    with _progress_bar("refreshing the catalog", enabled=not as_json, minimum=200) as progress:

        def announce(url):
            nonlocal recorded
            base = url[: -len(PREFIX)] if url.endswith(PREFIX) else url
            if host in ("0.0.0.0", "::", ""):  # every interface: links from this machine go to localhost
                base = f"http://localhost:{port}/"
            recorded = record_explorer(ExplorerRecord(root, base, host, port, os.getpid())) is not None
            if as_json:  # one JSON object on stdout, once the server is about to listen
                _echo_json({"url": url, "root": root, "host": host, "port": port})
            else:
                click.echo(f"memstore explorer on {url}  (store {root}; Ctrl-C to stop)", err=True)

        try:
            server.serve(
                root,
                host=host,
                port=port,
                refresh_interval=refresh_interval,
                progress=progress,
                announce=announce,
                allowed_hosts=allow_hosts,
                **kwargs,
            )
        except OSError as exc:  # the port is taken, say (library errors are the group's to print)
            raise _ExitWith(f"cannot serve on {host}:{port}: {exc.strerror or exc}", 2) from exc
        finally:
            if recorded:
                forget_explorer(root, os.getpid())


def _free_port(host: str) -> int:
    """A port free on ``host`` now (the system's choice, as binding to port 0 makes it)."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


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
            click.echo(
                f"{plural(len(report.live), 'session')} open in another process (their writers keep them current)"
            )
        verdict = "ok" if report.ok else plural(sum(not p.fixed for p in report.problems), "problem")
        click.echo(f"{plural(report.sessions, 'session')} checked: {verdict} (store {_store_named(root)})")
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
            sub = click.Context(
                command, info_name=name, parent=ctx, terminal_width=formatter.width, max_content_width=formatter.width
            )
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
    click.echo(
        f"exported to {report.destination}: {plural(len(report.written), 'session')} written, "
        f"{report.unchanged} unchanged, {len(report.removed)} removed; "
        f"{plural(report.files_written, 'file')} written ({report.bytes_written} bytes), "
        f"{report.files_removed} removed"
    )
    click.echo(f"rows: {rows}")
    for name, reason in report.refresh_errors:
        logger.warning("%s: exported as the catalog last saw it (%s)", name, reason)


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
        click.echo(
            f"exported to {report.destination}: {plural(report.sessions, 'trace')}, "
            f"{plural(report.spans, 'span')} in {plural(report.lines, 'request')} ({report.bytes} bytes); "
            f"tokens: {report.input_tokens} input, {report.output_tokens} output"
        )
    for name, reason in report.refresh_errors:
        logger.warning("%s: exported as the catalog last saw it (%s)", name, reason)


# --- secrets: scrub, forget ---


@cli.command("scrub")
@click.argument("session", required=False, callback=_session_ids)
@click.option("--all", "scrub_all", is_flag=True, help="Scrub every session of the store.")
@root_option
@json_option
def scrub_command(session, scrub_all, root, as_json):
    """Rewrite SESSION's log (or, with --all, every log) with its secrets redacted.

    Keeps seqs, turn numbers and every byte that is not a secret; crash-safe; recorded in
    gc-log.jsonl; the session's views are rebuilt. Refuses a session that is open for writing.

    \b
    Examples:
      memstore scrub run-42
      memstore scrub --all --json
    """
    from .scrub import scrub_session, scrub_store

    if (session is None) == (not scrub_all):
        raise _ExitWith("give a SESSION or --all (not both)", 2)
    _require_store(root)
    if session is not None:
        _existing_session_dir(root, session)
    try:
        reports = scrub_store(root) if scrub_all else [scrub_session(root, session)]
    except errors.SessionBusyError as exc:
        raise _ExitWith(str(exc), 1) from exc
    except errors.MemstoreError as exc:
        raise _fail(exc) from exc
    if as_json:
        _echo_json([r.to_dict() for r in reports])
        return
    for r in reports:
        if r.changed:
            found = ", ".join(f"{n} {kind}" for kind, n in r.secrets.items())
            click.echo(
                f"{r.session_id}: scrubbed {plural(r.lines_changed, 'line')} ({found}); "
                f"{r.bytes_before} -> {r.bytes_after} bytes"
            )
        elif not scrub_all:
            click.echo(f"{r.session_id}: no secret found; nothing changed")
    if scrub_all:
        click.echo(f"scrubbed {plural(sum(r.changed for r in reports), 'session')} of {len(reports)}")


@cli.command("forget")
@click.argument("session", callback=_session_ids)
@click.option("--undo", is_flag=True, help="Remove SESSION's tombstone: its next import recreates it.")
@root_option
@json_option
def forget_command(session, undo, root, as_json):
    """Remove SESSION for good: its directory goes, and a tombstone keeps `memstore import`
    from bringing it back. --undo removes the tombstone (the data stays gone).

    \b
    Examples:
      memstore forget codex-019982b8-2222-79e0-8b3b-00000000b002
      memstore forget --undo codex-019982b8-2222-79e0-8b3b-00000000b002
    """
    from .forget import NotForgotten, forget_session, unforget_session

    _require_store(root)
    try:
        if undo:
            stone = unforget_session(root, session)
        else:
            report = forget_session(root, session)
    except errors.SessionNotFound as exc:
        raise _ExitWith(str(exc), 1) from exc
    except NotForgotten as exc:
        raise _ExitWith(str(exc), 1) from exc
    except errors.SessionBusyError as exc:
        raise _ExitWith(str(exc), 1) from exc
    except errors.MemstoreError as exc:
        raise _fail(exc) from exc
    if undo:
        if as_json:
            _echo_json({"session_id": session, "forgotten": False, "tombstone": stone.to_dict()})
        else:
            click.echo(f"{session!r} is no longer forgotten: its next import recreates it")
        return
    if as_json:
        _echo_json({"forgotten": True, **report.to_dict()})
    else:
        click.echo(
            f"forgot {session!r} ({plural(report.bytes, 'byte')}); a tombstone keeps imports from "
            "bringing it back (memstore forget --undo to allow it)"
        )


def _add_verbosity(command: click.Command) -> None:
    """-v/-q on ``command`` and, for a group, on each of its commands: every command takes them."""
    names = {opt for p in command.params for opt in p.opts}
    command.params.extend(option for option in _VERBOSITY if not names & set(option.opts))
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            _add_verbosity(sub)


_add_verbosity(cli)
