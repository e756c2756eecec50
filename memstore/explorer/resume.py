"""The command that reopens a session in the agent that recorded it, for people to copy.

- Codex: ``codex resume <id>``, the id being the rollout's (memstore imports it as
  ``codex-<id>``);
- Claude Code: ``claude --resume <id>`` (imported as ``claude-<id>``; a sub-agent's transcript,
  ``claude-<id>-agent-<agent>``, cannot be resumed on its own);
- VT Code: ``vtcode --resume <id>``, its session id being memstore's.

Both CLIs look sessions up from the project they ran in, so when the session says where
(``cwd``), the command starts there. Sessions written by other agents (memstore's own, say)
have none. Every word is shell-quoted.
"""

from __future__ import annotations

import re
import shlex
from typing import Optional

_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


def resume_command(session_id: str, agent: Optional[str], cwd: Optional[str] = None) -> Optional[str]:
    """The shell command that resumes ``session_id`` in ``agent``, or ``None`` when there is none."""
    if not isinstance(session_id, str) or not session_id:
        return None
    words: Optional[list[str]] = None
    if agent == "codex" and session_id.startswith("codex-"):
        words = ["codex", "resume", session_id[len("codex-") :]]
    elif agent == "claude" and session_id.startswith("claude-") and _UUID.fullmatch(session_id[len("claude-") :]):
        words = ["claude", "--resume", session_id[len("claude-") :]]
    elif agent == "vtcode":
        words = ["vtcode", "--resume", session_id]
    if words is None or not words[-1]:
        return None
    command = shlex.join(words)
    if isinstance(cwd, str) and cwd and "\n" not in cwd:
        return f"cd {shlex.quote(cwd)} && {command}"
    return command
