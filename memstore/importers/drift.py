"""Format drift: how much of each agent version's logs the importers understood, and warnings
when that changes.

Agents change their log formats without notice; a parser that silently stops understanding a
new version produces sessions with no turns or no tokens, and nothing says so. So every import
(and ``memstore doctor``) reports, per agent and per agent version (Codex ``cli_version``, Claude
Code ``version``): sessions, turns, tokens, records understood, records kept but not understood
(``import.unrecognized`` events, by type), and the sessions that produced no turn or no token
although their source has records. It warns (lines starting with :data:`DRIFT_PREFIX`) when

- a version is neither one the importers were written for (:data:`KNOWN_VERSIONS`) nor one an
  import already saw in this store (``<root>/import-versions.json``);
- the share of records not understood jumps: over 1 % of a version's records and over twice the
  share last recorded for that version (or, for a version new to the store, for the agent's
  other versions);
- sessions produced no turn, or turns without any token, from sources that have records (and
  whose format records usage).
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import asdict, dataclass, field
from typing import Optional

import orjson

from .. import events as ev
from ..errors import StoreIOError
from ..fsio import atomic_write, read_no_follow
from ..layout import import_versions_path

logger = logging.getLogger(__name__)

DRIFT_PREFIX = "warning: format drift:"
# The agent versions the importers were written and tested for, as major.minor: versions within
# the span of an agent's list are known; older or newer ones are not.
KNOWN_VERSIONS: dict[str, tuple[str, ...]] = {
    "codex": ("0.40", "0.104", "0.147", "0.148"),
    "claude": ("2.0", "2.1"),
}
JUMP_FLOOR = 0.01  # a share of records not understood below this never warns
JUMP_FACTOR = 2.0
NO_VERSION = "(none)"
_VERSION = re.compile(r"(\d+)\.(\d+)")


def version_known(agent: str, version: Optional[str]) -> bool:
    """Whether the importers were written for ``version`` of ``agent`` (a source without a
    version, a legacy Codex file or an exec stream, counts as known: there is nothing to check)."""
    if version is None:
        return True
    known = [minor for minor in map(_minor, KNOWN_VERSIONS.get(agent, ())) if minor is not None]
    mine = _minor(version)
    if mine is None or not known:
        return False
    return min(known) <= mine <= max(known)


def _minor(version: str) -> Optional[tuple[int, int]]:
    match = _VERSION.match(version)
    return (int(match.group(1)), int(match.group(2))) if match else None


@dataclass
class SourceStats:
    """What one imported session holds, from its import's point of view."""

    session_id: str
    agent: str
    version: Optional[str]
    turns: int  # turns the source opened (closed ones, and the open one)
    input_tokens: int
    cached_input_tokens: int
    cache_creation_tokens: int
    output_tokens: int
    records: Optional[int]  # records (non-blank lines) read from the source; None when unknown
    not_understood: dict  # record type -> count, kept as import.unrecognized
    expects_usage: bool  # the format records token usage (legacy Codex files do not)


def source_stats(session_id: str, agent: str, state: dict, expects_usage: bool) -> SourceStats:
    """The stats of a session from its parser's state (live, or the saved carry)."""
    raw_stats = state.get("stats")
    stats: dict = raw_stats if isinstance(raw_stats, dict) else {}
    raw_usage = state.get("usage")
    usage: list = raw_usage if isinstance(raw_usage, list) and len(raw_usage) == 4 else [0, 0, 0, 0]
    raw_turns = state.get("turns")
    turns = raw_turns if type(raw_turns) is int else 0
    if state.get("turn") is not None:
        turns += 1
    records = stats.get("records")
    unrecognized = stats.get("unrecognized")
    version = state.get("version")
    return SourceStats(
        session_id,
        agent,
        version if isinstance(version, str) else None,
        turns,
        usage[0],
        usage[1],
        usage[2],
        usage[3],
        records if type(records) is int else None,
        dict(unrecognized) if isinstance(unrecognized, dict) else {},
        expects_usage,
    )


@dataclass
class VersionStats:
    """The sessions of one agent version (``version`` is ``"(none)"`` for sources without one)."""

    agent: str
    version: str
    sessions: int = 0
    turns: int = 0
    input_tokens: int = 0
    cached_input_tokens: int = 0
    cache_creation_tokens: int = 0
    output_tokens: int = 0
    records: int = 0
    records_understood: int = 0
    records_not_understood: int = 0
    not_understood_by_type: dict = field(default_factory=dict)
    zero_turn_sessions: list = field(default_factory=list)
    zero_token_sessions: list = field(default_factory=list)
    known_version: bool = True

    def to_dict(self) -> dict:
        return asdict(self)

    def line(self) -> str:
        """One line for people: ``codex 0.104.0: 1 session, 4 turns, ...``."""
        kinds = ", ".join(f"{kind} {n}" for kind, n in sorted(self.not_understood_by_type.items()))
        text = (
            f"{self.agent} {self.version}: {_n(self.sessions, 'session')}, {_n(self.turns, 'turn')}, "
            f"{self.input_tokens} input ({self.cached_input_tokens} cached) and {self.output_tokens} "
            "output tokens; "
            f"{_n(self.records, 'record')}, {self.records_understood} understood, "
            f"{self.records_not_understood} kept not understood"
        )
        return text + (f" ({kinds})" if kinds else "")


def _n(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def aggregate(sources: list[SourceStats]) -> list[VersionStats]:
    """Per agent and version, in agent then version order."""
    found: dict[tuple[str, str], VersionStats] = {}
    for s in sources:
        version = s.version or NO_VERSION
        entry = found.get((s.agent, version))
        if entry is None:
            entry = found[(s.agent, version)] = VersionStats(
                s.agent, version, known_version=version_known(s.agent, s.version)
            )
        entry.sessions += 1
        entry.turns += s.turns
        entry.input_tokens += s.input_tokens
        entry.cached_input_tokens += s.cached_input_tokens
        entry.cache_creation_tokens += s.cache_creation_tokens
        entry.output_tokens += s.output_tokens
        not_understood = sum(s.not_understood.values())
        entry.records += s.records or 0
        entry.records_not_understood += not_understood
        entry.records_understood += max(0, (s.records or 0) - not_understood)
        for kind, count in s.not_understood.items():
            entry.not_understood_by_type[kind] = entry.not_understood_by_type.get(kind, 0) + count
        if s.records:
            if s.turns == 0:
                entry.zero_turn_sessions.append(s.session_id)
            elif s.expects_usage and s.input_tokens + s.output_tokens == 0:
                entry.zero_token_sessions.append(s.session_id)
    return [found[key] for key in sorted(found)]


# --------------------------------------------------------------------------------------------
# The versions a store has seen


def load_versions(root: os.PathLike | str) -> dict:
    """``{agent: {version: {first_seen, last_seen, records, not_understood}}}`` from
    ``<root>/import-versions.json``; empty when missing or unreadable (logged: it only
    decides which warnings are new)."""
    path = import_versions_path(root)
    try:
        raw = read_no_follow(path)
        data = orjson.loads(raw) if raw is not None else {}
    except (StoreIOError, orjson.JSONDecodeError) as exc:
        logger.warning("%s cannot be read (%s); every agent version is taken as new", path, exc)
        return {}
    if not isinstance(data, dict):
        return {}
    return {agent: versions for agent, versions in data.items() if isinstance(versions, dict)}


def save_versions(root: os.PathLike | str, seen: dict, aggregates: list[VersionStats]) -> dict:
    """Record the versions of ``aggregates`` in ``<root>/import-versions.json`` (their record
    counts as this import found them); return the new contents."""
    now = ev.utc_now()
    updated = {agent: dict(versions) for agent, versions in seen.items()}
    for entry in aggregates:
        if not entry.records:
            continue
        versions = updated.setdefault(entry.agent, {})
        previous = versions.get(entry.version)
        old: dict = previous if isinstance(previous, dict) else {}
        versions[entry.version] = {
            "first_seen": old.get("first_seen", now),
            "last_seen": now,
            "records": entry.records,
            "not_understood": entry.records_not_understood,
        }
    if updated != seen:
        try:
            atomic_write(import_versions_path(root), orjson.dumps(updated, option=orjson.OPT_SORT_KEYS), durable=False)
        except StoreIOError as exc:
            logger.warning("could not record the agent versions seen: %s", exc)
    return updated


def warnings_for(aggregates: list[VersionStats], seen: dict, *, new_versions: bool = True) -> list[str]:
    """The drift warnings (see the module docstring), each starting with :data:`DRIFT_PREFIX`.
    ``seen`` is the store's record of versions before this import; ``new_versions=False`` leaves
    out the "new version" warning (``doctor`` looks at a store whose versions imports recorded)."""
    out = []
    for entry in aggregates:
        label = f"{entry.agent} {entry.version}"
        versions = seen.get(entry.agent, {})
        if new_versions and not entry.known_version and entry.version not in versions:
            out.append(
                f"{DRIFT_PREFIX} {label} is a version the importer was not written for and this store has not "
                f"seen before ({_n(entry.sessions, 'session')}); records it does not understand are kept as "
                "import.unrecognized and counted here"
            )
        elif not new_versions and not entry.known_version:
            out.append(
                f"{DRIFT_PREFIX} {label} is a version the importer was not written for "
                f"({_n(entry.sessions, 'session')})"
            )
        if entry.records and entry.records_not_understood:
            share = entry.records_not_understood / entry.records
            baseline = _baseline(versions, entry.version)
            if share > JUMP_FLOOR and share > JUMP_FACTOR * baseline:
                kinds = ", ".join(f"{k} {n}" for k, n in sorted(entry.not_understood_by_type.items()))
                since = f", up from {baseline:.1%}" if versions else ""
                out.append(
                    f"{DRIFT_PREFIX} {label}: {entry.records_not_understood} of {entry.records} records not "
                    f"understood ({share:.1%}; {kinds}){since}"
                )
        if entry.zero_turn_sessions:
            count = _n(len(entry.zero_turn_sessions), "session")
            out.append(
                f"{DRIFT_PREFIX} {label}: {count} produced no turn although "
                f"the source has records: {', '.join(entry.zero_turn_sessions[:5])}"
                + (" ..." if len(entry.zero_turn_sessions) > 5 else "")
            )
        if entry.zero_token_sessions:
            out.append(
                f"{DRIFT_PREFIX} {label}: {_n(len(entry.zero_token_sessions), 'session')} counted no token in "
                f"turns whose source records usage: {', '.join(entry.zero_token_sessions[:5])}"
                + (" ..." if len(entry.zero_token_sessions) > 5 else "")
            )
    return out


def _baseline(versions: dict, version: str) -> float:
    """The share of records not understood last recorded for ``version``, or, when the store has
    not seen it, for the agent's other versions together."""
    mine = versions.get(version)
    if isinstance(mine, dict) and type(mine.get("records")) is int and mine["records"] > 0:
        return _share(mine)
    records = sum(
        v.get("records", 0) for v in versions.values() if isinstance(v, dict) and type(v.get("records")) is int
    )
    unknown = sum(
        v.get("not_understood", 0)
        for v in versions.values()
        if isinstance(v, dict) and type(v.get("not_understood")) is int
    )
    return unknown / records if records else 0.0


def _share(entry: dict) -> float:
    unknown = entry.get("not_understood")
    return (unknown if type(unknown) is int else 0) / entry["records"]


__all__ = [
    "DRIFT_PREFIX",
    "KNOWN_VERSIONS",
    "SourceStats",
    "VersionStats",
    "source_stats",
    "aggregate",
    "version_known",
    "load_versions",
    "save_versions",
    "warnings_for",
]
