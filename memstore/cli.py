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


def main() -> None:
    try:
        cli(standalone_mode=True)
    except errors.MemstoreError as exc:  # pragma: no cover - click handles most
        click.echo(f"Error: {exc}", err=True)
        sys.exit(2)
