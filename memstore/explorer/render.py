"""What a turn's events look like to a person: each event becomes a plain dict a template
lays out (and that the ``.json`` variant returns as it is).

A display dict has ``kind`` (the template's block to use), ``title``, ``status`` and
``tone`` (``ok``, ``error``, ``warn``, ``muted`` or ``""``), and, as the event has them,
``text`` (a message), ``command``, ``exit_code`` (with ``exit_meaning`` when a non-zero code is an
answer, such as ``rg`` finding no match: see :mod:`.commands`), ``output``, ``arguments`` (pretty JSON),
``changes`` (``[{path, kind}]``), ``diff`` (``[{text, cls}]`` lines), ``items`` (a checklist)
and ``usage``. Long text is cut at :data:`MAX_TEXT` characters (the event page has it all) and
text longer than :data:`FOLD_LINES` lines is marked ``folded`` (shown collapsed).

Nothing here escapes: the templates do (Jinja autoescape), so every value stays plain text.
"""

from __future__ import annotations

from typing import Any, Optional

from ..events import value_text
from .commands import benign_exit

MAX_TEXT = 20_000
FOLD_LINES = 24
FAILED_STATUSES = {
    "failed",
    "error",
    "declined",
    "permission_rejected",
    "permission_cancelled",
    "hook_denied",
    "invalid_tool",
    "cancelled",
}


def _text(value: Any) -> str:
    return value_text(value, pretty=True)


def _block(value: Any) -> dict:
    """A text block: ``{text, lines, truncated, folded}``."""
    text = _text(value)
    truncated = len(text) > MAX_TEXT
    if truncated:
        text = text[:MAX_TEXT]
    lines = text.count("\n") + (1 if text and not text.endswith("\n") else 0)
    return {"text": text, "lines": lines, "truncated": truncated, "folded": truncated or lines > FOLD_LINES}


def _diff(text: str) -> list[dict]:
    """Lines of a unified diff or a patch, each with the class that colours it."""
    out = []
    for line in text[:MAX_TEXT].splitlines():
        if line.startswith(("+++", "---", "*** ")):
            cls = "diff-file"
        elif line.startswith("@@"):
            cls = "diff-hunk"
        elif line.startswith("+"):
            cls = "diff-add"
        elif line.startswith("-"):
            cls = "diff-del"
        else:
            cls = ""
        out.append({"text": line, "cls": cls})
    return out


def _tone(status: Optional[str], exit_code: Any = None) -> str:
    if isinstance(exit_code, int) and not isinstance(exit_code, bool) and exit_code != 0:
        return "error"
    if status in FAILED_STATUSES:
        return "error"
    if status == "in_progress":
        return "warn"
    return "ok" if status in ("completed", "success") else ""


def _usage(event: dict) -> Optional[dict]:
    usage = event.get("usage")
    if not isinstance(usage, dict):
        return None
    keys = ("input_tokens", "cached_input_tokens", "cache_creation_tokens", "output_tokens")
    return {k: usage.get(k) for k in keys if isinstance(usage.get(k), int)}


def display_event(event: dict) -> dict:
    """How ``event`` (the inner event of one log line) is shown; see the module docstring."""
    raw_kind = event.get("type")
    kind: str = raw_kind if isinstance(raw_kind, str) else "?"
    if kind in ("item.completed", "item.started", "item.updated"):
        item = event.get("item")
        if isinstance(item, dict):
            view = display_item(item)
            if kind != "item.completed":
                view["title"] = f"{view['title']} ({kind.split('.', 1)[1]})"
                view["tone"] = "muted"
            return view
        return {"kind": "other", "title": kind, "tone": "muted", "status": None, "text": _block(event)}
    if kind == "turn.started":
        return {"kind": "lifecycle", "title": "Turn started", "tone": "muted", "status": None}
    if kind == "turn.completed":
        return {
            "kind": "lifecycle",
            "title": "Turn completed",
            "tone": "ok",
            "status": "completed",
            "usage": _usage(event),
            "model": event.get("model") if isinstance(event.get("model"), str) else None,
        }
    if kind == "turn.failed":
        return {
            "kind": "error",
            "title": "Turn failed",
            "tone": "error",
            "status": "failed",
            "text": _block(event.get("message")),
            "usage": _usage(event),
        }
    if kind == "turn.aborted":
        return {
            "kind": "lifecycle",
            "title": "Turn aborted",
            "tone": "warn",
            "status": "aborted",
            "text": _block(event.get("reason") or "stopped"),
            "usage": _usage(event),
        }
    if kind == "thread.started":
        source = event.get("source") if isinstance(event.get("source"), dict) else None
        return {
            "kind": "lifecycle",
            "title": "Session started",
            "tone": "muted",
            "status": None,
            "text": _block(source) if source else None,
        }
    if kind == "thread.completed":
        subtype = event.get("subtype") if isinstance(event.get("subtype"), str) else None
        return {
            "kind": "lifecycle",
            "title": f"Session completed ({subtype or 'unknown'})",
            "tone": "ok" if subtype == "success" else "error",
            "status": subtype,
            "text": _block(event.get("result")) if event.get("result") else None,
            "usage": _usage(event),
        }
    if kind == "thread.compact_boundary":
        parts = [f"trigger {event.get('trigger', 'unknown')}"]
        if event.get("original_message_count") is not None:
            parts.append(f"{event.get('original_message_count')} messages → {event.get('compacted_message_count')}")
        if event.get("pre_tokens") is not None:
            parts.append(f"{event.get('pre_tokens')} tokens before")
        return {
            "kind": "notice",
            "title": "Context compacted",
            "tone": "warn",
            "status": None,
            "text": _block(", ".join(str(p) for p in parts)),
        }
    if kind == "error":
        return {
            "kind": "error",
            "title": "Error",
            "tone": "error",
            "status": "error",
            "text": _block(event.get("message")),
        }
    if kind.startswith("permission."):
        decision = event.get("decision")
        tool = event.get("tool_name")
        title = f"Permission {'requested' if kind.endswith('requested') else decision or 'resolved'}: {_text(tool)}"
        return {
            "kind": "notice",
            "title": title,
            "tone": "error" if decision in ("deny", "cancelled") else "muted",
            "status": decision if isinstance(decision, str) else None,
        }
    if kind == "interjected":
        return {
            "kind": "message",
            "role": "user",
            "title": "User interjected",
            "tone": "",
            "status": None,
            "text": _block(event.get("text")),
        }
    return {"kind": "other", "title": kind, "tone": "muted", "status": None, "text": _block(event)}


def display_item(item: dict) -> dict:
    """How a completed item is shown."""
    get = item.get
    item_type = get("type") if isinstance(get("type"), str) else "item"
    status = get("status") if isinstance(get("status"), str) else None
    outcome = get("outcome") if isinstance(get("outcome"), str) else None
    if item_type in ("agent_message", "user_message", "plan", "reasoning"):
        titles = {"agent_message": "Agent", "user_message": "User", "plan": "Plan", "reasoning": "Reasoning"}
        view: dict[str, Any] = {
            "kind": "message",
            "role": item_type.split("_")[0],
            "title": titles[item_type],
            "tone": "muted" if item_type == "reasoning" else "",
            "status": None,
            "text": _block(get("text")),
        }
        if item_type == "reasoning":
            view["text"]["folded"] = view["text"]["folded"] or view["text"]["lines"] > 6
        return view
    if item_type == "command_execution":
        code = get("exit_code")
        code = code if isinstance(code, int) and not isinstance(code, bool) else None
        answer = benign_exit(get("command"), code)
        return {
            "kind": "command",
            "title": "Command",
            "command": _text(get("command")),
            "exit_code": code,
            # rg exiting 1 found nothing: an answer, not a failure (its status may say "failed").
            "exit_meaning": answer,
            "status": "completed" if answer and status in FAILED_STATUSES else status,
            "tone": "" if answer else _tone(status, code),
            "output": _block(get("aggregated_output")),
        }
    if item_type in ("tool_invocation", "tool_call", "mcp_tool_call"):
        name = get("tool_name") or ".".join(_text(get(k)) for k in ("server", "tool") if get(k)) or "tool"
        state = outcome if outcome and outcome != "success" else status
        view = {
            "kind": "tool",
            "title": f"Tool {_text(name)}",
            "tool": _text(name),
            "status": state,
            "tone": _tone(state),
            "arguments": _block(get("arguments")) if get("arguments") is not None else None,
        }
        result = get("output") if item_type == "tool_call" else get("result") if item_type == "mcp_tool_call" else None
        if result is not None:
            view["output"] = _block(result)
        if get("error"):
            view["error"] = _block(get("error"))
        if get("child_session_id"):
            view["child_session_id"] = _text(get("child_session_id"))
        return view
    if item_type == "tool_output":
        code = get("exit_code")
        code = code if isinstance(code, int) and not isinstance(code, bool) else None
        return {
            "kind": "tool_output",
            "title": "Tool output",
            "status": status,
            "exit_code": code,
            "tone": _tone(status, code),
            "output": _block(get("output")),
        }
    if item_type == "file_change":
        changes = (
            [
                {"path": _text(c.get("path")), "kind": _text(c.get("kind") or "update")}
                for c in get("changes") or []
                if isinstance(c, dict)
            ]
            if isinstance(get("changes"), list)
            else []
        )
        diff_text = get("unified_diff") or get("patch")
        view = {
            "kind": "file_change",
            "title": "File change" if len(changes) == 1 else f"{len(changes)} files changed",
            "status": status,
            "tone": _tone(status),
            "changes": changes,
            "additions": get("additions") if isinstance(get("additions"), int) else None,
            "deletions": get("deletions") if isinstance(get("deletions"), int) else None,
            "diff": _diff(diff_text) if isinstance(diff_text, str) else None,
        }
        if get("output"):
            view["output"] = _block(get("output"))
        return view
    if item_type == "todo_list":
        listed = get("items")
        entries: list = listed if isinstance(listed, list) else []
        return {
            "kind": "todo",
            "title": "To-do list",
            "status": status,
            "tone": "",
            "items": [
                {
                    "text": _text(i.get("text") if isinstance(i, dict) else i),
                    "done": bool(isinstance(i, dict) and i.get("completed")),
                }
                for i in entries
            ],
        }
    if item_type == "web_search":
        return {
            "kind": "message",
            "role": "tool",
            "title": "Web search",
            "status": status,
            "tone": "",
            "text": _block(_text(get("query")) + ("\n\n" + _text(get("results")) if get("results") else "")),
        }
    if item_type == "error":
        return {"kind": "error", "title": "Error", "status": "error", "tone": "error", "text": _block(get("message"))}
    if item_type == "decision":
        return {
            "kind": "message",
            "role": "agent",
            "title": "Decision",
            "status": None,
            "tone": "",
            "text": _block("\n\n".join(_text(get(k)) for k in ("summary", "rationale") if get(k))),
        }
    if item_type == "harness":
        return {
            "kind": "notice",
            "title": f"Harness: {_text(get('event'))}",
            "status": status,
            "tone": _tone(status, get("exit_code")),
            "text": _block(" ".join(_text(get(k)) for k in ("message", "command", "path") if get(k))),
        }
    return {"kind": "other", "title": item_type, "status": status, "tone": _tone(status), "text": _block(item)}
