"""The ``memstore`` command line: a thin click shell over the library.

Every command takes ``--root`` (or ``MEMSTORE_ROOT``) and, where it prints data, ``--json``.
Exit codes: 0 success, 1 a check that did not pass, 2 usage errors and invalid input.
"""

from __future__ import annotations

import sys

import click
import orjson

from . import errors


def _echo_json(data) -> None:
    click.echo(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode())


root_option = click.option(
    "--root",
    envvar="MEMSTORE_ROOT",
    type=click.Path(file_okay=False, path_type=str),
    default=".memstore",
    show_default=True,
    help="Store root (holds sessions/); env MEMSTORE_ROOT. A VT Code .vtcode directory works.",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON output.")


@click.group()
@click.version_option(package_name="memstore")
def cli():
    """memstore: a per-session event store for AI coding agents."""


# --- progress and audit packs ---


class _ExitWith(click.ClickException):
    """A ClickException ("Error: ..." on stderr) with a chosen exit code."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


@cli.command("progress")
@click.argument("session")
@root_option
@json_option
def progress_command(session, root, as_json):
    """Print the progress ledger of SESSION as Markdown (--json: the ledger JSON).

    Exit 1 when the session has no ledger, 2 when it cannot be read or parsed.
    """
    from .progress import load_progress, progress_path

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
@click.argument("session")
@click.option(
    "--output",
    "-o",
    type=click.Path(dir_okay=False, path_type=str),
    default=None,
    help="Where to write the pack (default: <session>/derived/audit-pack.json).",
)
@root_option
@json_option
def pack_command(session, output, root, as_json):
    """Write an audit pack of SESSION: the SHA-256 and size of every file in it."""
    from .pack import write_audit_pack

    try:
        pack, path = write_audit_pack(root, session, output)
    except errors.MemstoreError as exc:
        raise _ExitWith(str(exc), 2) from exc
    if as_json:
        _echo_json({"path": str(path), "pack": pack.to_dict()})
    else:
        total = sum(entry.bytes for entry in pack.entries)
        click.echo(f"wrote {path} ({len(pack.entries)} files, {total} bytes)")


@cli.command("verify")
@click.argument("session")
@click.argument("pack_path", metavar="[PACK]", required=False, type=click.Path(dir_okay=False, path_type=str))
@root_option
@json_option
def verify_command(session, pack_path, root, as_json):
    """Verify SESSION against an audit pack (default: <session>/derived/audit-pack.json).

    Exit 0 verified, 1 not verified (files changed or missing), 2 invalid pack, unreadable
    input or usage error. Files added since packing are listed but do not fail verification.
    """
    from .pack import default_pack_path, read_audit_pack, verify_audit_pack

    path = pack_path if pack_path is not None else default_pack_path(root, session)
    try:
        pack = read_audit_pack(path)
        result = verify_audit_pack(root, session, pack)
    except errors.MemstoreError as exc:
        raise _ExitWith(str(exc), 2) from exc
    if as_json:
        _echo_json(result.to_dict())
    else:
        for name in result.mismatches:
            click.echo(f"mismatch: {name}")
        for name in result.missing:
            click.echo(f"missing: {name}")
        for name in result.unaccounted:
            click.echo(f"unaccounted (informational): {name}")
        if result.verified:
            click.echo(f"verified: {len(pack.entries)} files match")
        else:
            click.echo(f"NOT verified: {len(result.mismatches)} mismatched, {len(result.missing)} missing")
    if not result.verified:
        sys.exit(1)


def main() -> None:
    try:
        cli(standalone_mode=True)
    except errors.MemstoreError as exc:  # pragma: no cover - click handles most
        click.echo(f"Error: {exc}", err=True)
        sys.exit(2)
