"""Codex CLI sources: rollout files (legacy without envelope, 0.40-style, task-event style) and
``codex exec --json`` streams.

What each rollout line becomes (the full table is in ``docs/import.md``):

- the first ``session_meta`` (or the legacy header line): ``thread.started`` with the source
  metadata; later ones are ignored, as Codex itself does;
- ``event_msg:task_started`` opens a turn, ``task_complete`` closes it (``turn.failed`` when it
  carries an error), ``turn_aborted`` closes it as ``turn.aborted`` once a later line shows that
  no more of its calls follow; in files without task events each ``user_message`` opens a turn
  and the next one closes it;
- ``event_msg:user_message`` (plain ones) becomes a ``user_message`` item; the duplicated
  ``response_item`` user/developer messages (injected context) are dropped, except in legacy
  files, which have no ``event_msg`` at all;
- ``response_item`` assistant messages and reasoning summaries become ``agent_message`` and
  ``reasoning`` items (their ``event_msg`` duplicates are dropped);
- calls are paired with their outputs by ``call_id`` and become ``command_execution``,
  ``file_change``, ``todo_list``, ``mcp_tool_call`` or ``tool_call`` items;
- ``token_count`` totals are cumulative: a turn's usage is the advance of the total since the
  previous turn ended, so the turns of a session sum exactly to its last total;
- ``compacted`` / ``context_compacted`` become one ``thread.compact_boundary``.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from collections.abc import Callable
from typing import Any, Optional

import orjson

from .base import Parser, is_declined_text, parse_patch, u64, usage_dict

_loads = orjson.loads
_JSONDecodeError = orjson.JSONDecodeError

SHELL_TOOLS = frozenset({"shell", "container.exec", "shell_command", "exec_command", "local_shell"})
ENVELOPE_KEYS = frozenset({"timestamp", "type", "payload"})

# event_msg types whose content is imported from elsewhere (their response_item twin) or that
# say nothing an event log keeps.
_IGNORED_EVENTS = frozenset(
    {
        "agent_message",
        "agent_reasoning",
        "agent_reasoning_raw_content",
        "agent_reasoning_section_break",
        "agent_message_delta",
        "agent_reasoning_delta",
        "agent_reasoning_raw_content_delta",
        "entered_review_mode",
        "exited_review_mode",
        "undo_started",
        "undo_completed",
        "thread_rolled_back",
        "thread_name_updated",
        "item_started",
        "item_updated",
        "image_generation_begin",
        "image_generation_end",
        "exec_command_begin",
        "exec_command_end",
        "exec_command_output_delta",
        "terminal_interaction",
        "patch_apply_begin",
        "patch_apply_end",
        "mcp_tool_call_begin",
        "mcp_tool_call_end",
        "web_search_begin",
        "web_search_end",
        "view_image_tool_call",
        "plan_update",
        "plan_delta",
        "turn_diff",
        "background_event",
        "stream_error",
        "warning",
        "session_configured",
        "shutdown_complete",
        "deprecation_notice",
        "raw_response_item",
        "request_user_input",
        "elicitation_request",
        "exec_approval_request",
        "apply_patch_approval_request",
        "model_reroute",
        "context_window_exceeded",
        "mcp_startup_update",
        "mcp_startup_complete",
        "list_skills_response",
        "skills_update_available",
    }
)
_IGNORED_EVENT_PREFIXES = ("collab_", "realtime_", "reasoning_", "agent_message", "agent_reasoning")
# The same drops, recognized from the bytes after the timestamp (Codex's own key order).
_DROPPED_PREFIXES = (
    b'"type":"event_msg","payload":{"type":"agent_reasoning',
    b'"type":"event_msg","payload":{"type":"agent_message',
    b'"type":"response_item","payload":{"type":"message","role":"developer"',
    b'"type":"response_item","payload":{"type":"message","role":"system"',
)
_REPEATABLE_PREFIXES = (b'"type":"turn_context"', b'"type":"event_msg","payload":{"type":"token_count"')
_KNOWN_PREFIXES = _DROPPED_PREFIXES + _REPEATABLE_PREFIXES
_IGNORED_ITEMS = frozenset(
    {
        "ghost_snapshot",
        "compaction",
        "compaction_summary",
        "context_compaction",
        "tool_search_call",
        "tool_search_output",
        "image_generation_call",
        "other",
    }
)
# Text Codex injects as a user message that no human typed (legacy files have no other marker).
_INJECTED_PREFIXES = (
    "<environment_context>",
    "<user_instructions>",
    "<INSTRUCTIONS>",
    "# AGENTS.md instructions",
    "<permissions instructions>",
    "<user_shell_command>",
    "<turn_aborted>",
)
# item_completed items (Codex 0.147 and later) whose content a response_item of the rollout also
# carries, under the same call id: imported once, from the response_item pair.
_CALL_ITEMS = frozenset({"CommandExecution", "FileChange", "McpToolCall", "DynamicToolCall", "ImageView"})
_DONE_CALLS_KEPT = 512  # call ids remembered to recognize an item_completed that repeats a paired call
_ITEM_STATUS = {
    "completed": "completed",
    "failed": "failed",
    "declined": "declined",
    "inProgress": "in_progress",
    "in_progress": "in_progress",
}

_EXIT = re.compile(r"^(?:Exit code:|Process exited with code) *(-?\d+)", re.MULTILINE)
_RUNNING = re.compile(r"^Process running with session ID (\d+)", re.MULTILINE)


def _str(value: Any) -> Optional[str]:
    return value if isinstance(value, str) else None


def _text_parts(content: Any, kinds: tuple) -> tuple[str, int]:
    """Join the text parts of a message or output content list; count its images."""
    if isinstance(content, str):
        return content, 0
    if not isinstance(content, list):
        return "", 0
    texts = []
    images = 0
    for part in content:
        if not isinstance(part, dict):
            continue
        kind = part.get("type")
        if kind in kinds and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind in ("input_image", "image", "output_image"):
            images += 1
    return "\n".join(texts), images


def _output_parts(output: Any) -> tuple[str, int, Optional[bool]]:
    """A tool output as (text, image count, success flag if the source gave one)."""
    if isinstance(output, str):
        return output, 0, None
    if isinstance(output, dict):
        text, images, _ = _output_parts(output.get("content", output.get("output", "")))
        success = output.get("success")
        return text, images, success if isinstance(success, bool) else None
    text, images = _text_parts(output, ("input_text", "output_text", "text"))
    return text, images, None


def _shell_result(text: str) -> tuple[str, Optional[int], bool]:
    """(output, exit code, still running) of a shell-like tool's result text.

    0.40 writes a JSON string ``{"output", "metadata": {"exit_code"}}``; later versions write
    ``Exit code: N`` / ``Process exited with code N`` or ``Process running with session ID N``
    headers above an ``Output:`` line.
    """
    if text.startswith("{"):
        try:
            data = _loads(text)
        except _JSONDecodeError:
            data = None
        if isinstance(data, dict) and isinstance(data.get("output"), str):
            meta = data.get("metadata")
            code = meta.get("exit_code") if isinstance(meta, dict) else None
            return data["output"], code if type(code) is int else None, False
    head, sep, body = text.partition("\nOutput:\n")
    if not sep:
        if text.startswith("Output:\n"):
            head, body = "", text[8:]
        else:
            code = _EXIT.match(text)
            return text, int(code.group(1)) if code else None, bool(_RUNNING.match(text))
    code = _EXIT.search(head)
    return body, int(code.group(1)) if code else None, bool(_RUNNING.search(head))


def _json_args(raw: Any) -> Any:
    """Function-call arguments are a JSON string; keep the raw text when it is not JSON."""
    if not isinstance(raw, str):
        return raw
    try:
        return _loads(raw)
    except _JSONDecodeError:
        return raw


def _command_text(args: Any) -> str:
    if isinstance(args, dict):
        command = args.get("command", args.get("cmd"))
        if isinstance(command, list):
            return shlex.join(str(part) for part in command)
        if isinstance(command, str):
            return command
    return args if isinstance(args, str) else ""


def _patch_in(args: Any, command: str) -> Optional[str]:
    """The patch text of an apply_patch run through the shell, if this command is one."""
    if "*** Begin Patch" not in command:
        return None
    if isinstance(args, dict) and isinstance(args.get("command"), list):
        for part in args["command"]:
            if isinstance(part, str) and "*** Begin Patch" in part:
                return part
    return command


def call_item(call: dict, output: Any, item_id: str) -> dict:
    """The item for a Codex tool call and its output (``output`` is ``None`` when the call
    never got a result: then the item says ``result_missing``)."""
    name = call["name"]
    missing = output is None
    text, images, success = ("", 0, None) if missing else _output_parts(output)
    declined = not missing and is_declined_text(text)
    raw = call.get("args")
    if call["kind"] == "local_shell" or name in SHELL_TOOLS:
        args = call.get("action") if call["kind"] == "local_shell" else _json_args(raw)
        command = _command_text(args)
        patch = _patch_in(args, command)
        out, code, running = _shell_result(text)
        if patch is not None:
            item = _file_change(item_id, patch, out, code, success, declined, missing)
        else:
            if declined:
                status = "declined"
            elif missing:
                status = "failed"
            elif running:
                status = "in_progress"
            elif code is not None:
                status = "completed" if code == 0 else "failed"
            else:
                status = "failed" if success is False else "completed"
            item = {
                "id": item_id,
                "type": "command_execution",
                "command": command,
                "aggregated_output": out,
                "status": status,
            }
            if code is not None:
                item["exit_code"] = code
            if name in ("exec_command", "shell_command"):
                item["tool_name"] = name
    elif name == "apply_patch":
        args = raw if call["kind"] == "custom" else _json_args(raw)
        if isinstance(args, dict):
            args = args.get("input", args.get("patch", ""))
        out, code, _ = _shell_result(text)
        item = _file_change(item_id, args if isinstance(args, str) else "", out, code, success, declined, missing)
    elif name == "update_plan":
        args = _json_args(raw)
        plan = args.get("plan") if isinstance(args, dict) else None
        entries = [
            {"text": str(step.get("step", "")), "completed": step.get("status") == "completed"}
            for step in (plan if isinstance(plan, list) else [])
            if isinstance(step, dict)
        ]
        item = {"id": item_id, "type": "todo_list", "items": entries}
    else:
        status = "declined" if declined else "failed" if (missing or success is False) else "completed"
        args = _json_args(raw) if call["kind"] == "function" else raw
        if name.startswith("mcp__") and "__" in name[5:]:
            server, _, tool = name[5:].partition("__")
            item = {
                "id": item_id,
                "type": "mcp_tool_call",
                "tool_name": name,
                "server": server,
                "tool": tool,
                "arguments": args,
                "result": text,
                "status": status,
            }
            if success is False:
                item["error"] = {"message": text}
        else:
            item = {
                "id": item_id,
                "type": "tool_call",
                "tool_name": name,
                "arguments": args,
                "output": text,
                "status": status,
            }
        if images:
            item["images"] = images
    if missing:
        item["result_missing"] = True
    return item


def _file_change(
    item_id: str, patch: str, out: str, code: Optional[int], success: Optional[bool], declined: bool, missing: bool
) -> dict:
    if declined:
        status = "declined"
    elif missing:
        status = "failed"
    elif code is not None:
        status = "completed" if code == 0 else "failed"
    elif success is not None:
        status = "completed" if success else "failed"
    else:
        status = "completed" if (not out.strip() or out.lstrip().startswith("Success")) else "failed"
    item = {"id": item_id, "type": "file_change", "changes": parse_patch(patch), "status": status, "patch": patch}
    if status != "completed" and out:
        item["output"] = out
    return item


def _mirror_key(text: str) -> str:
    """A short, stable digest of a text (kept in the carry-over: the same in every process)."""
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()


def _user_inputs(content: Any) -> tuple[str, int]:
    """The text (joined as Codex joins it) and image count of a UserMessage item's inputs."""
    if not isinstance(content, list):
        return "", 0
    texts, images = [], 0
    for part in content:
        if isinstance(part, dict):
            if part.get("type") == "text" and isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif part.get("type") in ("image", "local_image", "localImage"):
                images += 1
    return "".join(texts), images


def _turn_item(itype: str, item: dict, item_id: str) -> dict:
    """The memstore item for an item_completed tool item with no response_item twin (a command
    the user ran, one a code-mode script ran, ...)."""
    status = _ITEM_STATUS.get(item.get("status"), "completed")  # type: ignore[arg-type]
    if itype == "CommandExecution":
        command = item.get("command")
        text = shlex.join(str(part) for part in command) if isinstance(command, list) else _str(command) or ""
        output = _str(item.get("aggregatedOutput")) or _str(item.get("aggregated_output"))
        if output is None:
            output = "\n".join(p for p in (_str(item.get("stdout")), _str(item.get("stderr"))) if p)
        out: dict = {
            "id": item_id,
            "type": "command_execution",
            "command": text,
            "aggregated_output": output,
            "status": status,
        }
        code = item.get("exitCode", item.get("exit_code"))
        if type(code) is int:
            out["exit_code"] = code
        return out
    if itype == "FileChange":
        changes = []
        raw = item.get("changes")
        if isinstance(raw, dict):
            for path, change in raw.items():
                kind = change.get("type") if isinstance(change, dict) else None
                entry = {"path": str(path), "kind": kind if kind in ("add", "delete", "update") else "update"}
                if isinstance(change, dict) and isinstance(change.get("move_path"), str):
                    entry["move_path"] = change["move_path"]
                changes.append(entry)
        return {"id": item_id, "type": "file_change", "changes": changes, "status": status}
    if itype == "McpToolCall":
        server, tool = _str(item.get("server")) or "", _str(item.get("tool")) or ""
        out = {
            "id": item_id,
            "type": "mcp_tool_call",
            "tool_name": f"mcp__{server}__{tool}",
            "server": server,
            "tool": tool,
            "arguments": item.get("arguments"),
            "result": item.get("result"),
            "status": status,
        }
        error = item.get("error")
        if isinstance(error, dict):
            out["error"] = error
        return out
    if itype == "DynamicToolCall":
        return {
            "id": item_id,
            "type": "tool_call",
            "tool_name": _str(item.get("tool")) or "",
            "arguments": item.get("arguments"),
            "output": item.get("contentItems", item.get("content_items")),
            "status": status,
        }
    return {
        "id": item_id,
        "type": "tool_call",
        "tool_name": "view_image",
        "arguments": {"path": item.get("path")},
        "output": "",
        "status": "completed",
    }


class _TotalsMixin:
    """Usage from a cumulative total: a turn's usage is how far the total advanced since the
    previous turn ended (``base``)."""

    has_reasoning = True
    s: dict

    note: Callable[..., None]  # the importer's (an annotation only: nothing here overrides it)

    def advance_total(self, new: list, lineno: int) -> None:
        s = self.s
        old = s["total"]
        if new == old:
            return  # a repeated token_count (about half of them in 0.104 files)
        if any(n < o for n, o in zip(new, old)):
            # The total restarted: keep what the open turn already used, count on from the new total.
            self.note(
                lineno,
                "the cumulative token total went backwards; later usage counts from the new total",
                skipped=False,
            )
            s["base"] = [n - (o - b) for n, o, b in zip(new, old, s["base"])]
        s["total"] = new

    def turn_usage(self, turn: dict) -> dict:
        s = self.s
        delta = [t - b for t, b in zip(s["total"], s["base"])]
        s["base"] = list(s["total"])
        usage = usage_dict(delta[0], delta[1], 0, delta[2])
        if self.has_reasoning:
            usage["reasoning_output_tokens"] = max(delta[3], 0)
        return usage

    def extra_usage(self) -> Optional[dict]:
        s = self.s
        delta = [t - b for t, b in zip(s["total"], s["base"])]
        if not any(d > 0 for d in delta):
            return None
        s["base"] = list(s["total"])
        return usage_dict(delta[0], delta[1], 0, delta[2])


class CodexRolloutParser(_TotalsMixin, Parser):
    """A rollout file: ``$CODEX_HOME/sessions/YYYY/MM/DD/rollout-*.jsonl``."""

    importer = "codex"
    agent = "codex"

    def initial_state(self) -> dict:
        s = super().initial_state()
        s.update(
            {
                "legacy": None,  # None until the header line; then whether the file predates the envelope
                "tasks": False,  # the file has task_started events (turns are tasks)
                "total": [0, 0, 0, 0],  # input, cached input, output, reasoning output (cumulative)
                "base": [0, 0, 0, 0],  # the total when the last turn ended
                "last_input": 0,  # the latest request's input tokens (the context size)
                "compact_open": False,  # a compacted line awaits its context_compacted twin
                "held": None,  # a prompt read from a response_item user message, until its twin shows
                "mirror": {},  # per kind and source, keys of this turn's texts not yet seen twice (see mirrored)
                "done": [],  # the last paired call ids (an item_completed repeating one is not imported)
            }
        )
        return s

    def after_load(self) -> None:
        self._done = set(self.s.get("done") or ())
        self.has_reasoning = not self.s.get("legacy")
        self._envelope = self.s.get("legacy") is False
        # The last turn_context / token_count line after its timestamp: an identical repeat
        # changes nothing, so it is not parsed again. Not saved: a resumed parse simply parses
        # the first repeat, with the same (lack of) effect.
        self._repeat_context: Optional[bytes] = None
        self._repeat_count: Optional[bytes] = None

    # -- lines ---------------------------------------------------------------------------

    def feed_lines(self, lines: list, lineno: int) -> int:
        if not self._envelope:
            return super().feed_lines(lines, lineno)
        # The common case, kept flat: many lines of a rollout are recognized from their bytes.
        envelope_line = self.envelope_line
        for line in lines:
            lineno += 1
            rest = None
            if (
                line.startswith(_KNOWN_PREFIXES, 40)
                and line.startswith(b'{"timestamp":"')
                and line.startswith(b'",', 38)
            ):
                if line.startswith(_DROPPED_PREFIXES, 40):
                    continue
                rest = line[40:]
                if rest == self._repeat_count or rest == self._repeat_context:
                    continue
            envelope_line(line, lineno, rest)
        return lineno

    def feed(self, line: bytes, lineno: int) -> None:
        if self._envelope:
            self.feed_lines([line], lineno - 1)
            return
        obj = self.parse(line, lineno)
        if obj is None:
            return
        if self.s["legacy"] is None:
            self.header(obj, lineno)
        else:
            self.legacy_line(obj, lineno)

    def envelope_line(self, line: bytes, lineno: int, rest: Optional[bytes]) -> None:
        """One ``{"timestamp", "type", "payload"}`` line.

        Codex writes ``{"timestamp":"<24 chars>","type":...}``, so the lines the mapping drops
        anyway (``agent_message``/``agent_reasoning`` events, user and developer messages, a
        ``turn_context`` or ``token_count`` identical to the previous one) are recognized from
        their bytes by ``feed_lines`` and never parsed: they never touch the parser's state, so
        skipping them changes nothing. ``rest`` is the line after its timestamp, when it is one
        of the repeatable kinds.
        """
        obj = self.parse(line, lineno)
        if obj is None:
            return
        s = self.s
        kind = obj.get("type")
        payload = obj.get("payload")
        if len(obj) != 3 or type(payload) is not dict:
            if type(payload) is not dict:
                self.keep(lineno, f"{kind!s:.40} (no payload)", f"{kind!s:.40} line without a payload object")
                return
            for key in obj.keys() - ENVELOPE_KEYS:
                self.note(lineno, f"unknown field {key!r:.60} in Codex rollout lines ignored", skipped=False)
        # Only the lines that make events set the time (the end of a turn closed by a later
        # line is the time of its last such line), so bookkeeping lines are handled first.
        if kind == "event_msg":
            etype = payload.get("type")
            if etype == "token_count":
                self.on_token_count(payload, lineno)
                if rest is not None:
                    self._repeat_count = rest
                return
            if etype in _IGNORED_EVENTS or (isinstance(etype, str) and etype.startswith(_IGNORED_EVENT_PREFIXES)):
                return
            raw = obj.get("timestamp")
            if raw == self._raw_ts and raw is not None:
                ts = s["ts"] = raw
            else:
                ts = self.line_ts(raw, lineno)
            if s["held"] is not None and not self.takes_the_held_prompt(etype, payload):
                self.flush_held()
            if not self.on_event(payload, etype, lineno, ts):
                return
        elif kind == "response_item":
            if payload.get("type") == "message" and payload.get("role") != "assistant":
                role = payload.get("role")
                if role == "user":
                    self.user_record(payload, lineno, obj.get("timestamp"))
                elif role not in ("developer", "system"):
                    self.keep(
                        lineno, f"response_item:message role {role!s:.40}", f"message of unknown role {role!s:.40}"
                    )
                return  # injected context, or a prompt held until its user_message twin shows
            raw = obj.get("timestamp")
            if raw == self._raw_ts and raw is not None:
                ts = s["ts"] = raw
            else:
                ts = self.line_ts(raw, lineno)
            if s["held"] is not None:
                self.flush_held()
            if not self.on_response_item(payload, lineno, ts):
                return
        elif kind == "turn_context":
            model = payload.get("model")
            if isinstance(model, str) and model:
                s["model"] = model
            if rest is not None:
                self._repeat_context = rest
            return
        elif kind == "compacted":
            ts = self.line_ts(obj.get("timestamp"), lineno)
            if s["held"] is not None:
                self.flush_held()
            self.compact_boundary(ts)
            s["compact_open"] = True
        elif kind == "session_meta":
            return  # later session_meta lines are ignored, as Codex does
        else:
            self.keep(lineno, f"{kind!s:.40}", f"unknown rollout line type {kind!s:.40}")
            return
        turn = s["turn"]
        if turn is not None:
            turn["ts"] = ts

    def header(self, obj: dict, lineno: int) -> None:
        """The first line: a ``session_meta`` envelope, or a legacy bare header."""
        payload = obj.get("payload")
        if obj.get("type") == "session_meta" and isinstance(payload, dict) and isinstance(payload.get("id"), str):
            self.s["legacy"] = False
            self.after_load()
            ts = self.line_ts(obj.get("timestamp"), lineno)
            self.start_thread(ts, self.meta_source(payload))
        elif "payload" not in obj and isinstance(obj.get("id"), str) and "type" not in obj:
            self.s["legacy"] = True
            self.after_load()
            ts = self.line_ts(obj.get("timestamp"), lineno)
            git = obj["git"] if isinstance(obj.get("git"), dict) else {}
            self.start_thread(
                ts,
                {
                    "agent": "codex",
                    "git_branch": _str(git.get("branch")),
                    "git_commit": _str(git.get("commit_hash")),
                    "path": self.path,
                    "thread_id": obj["id"],
                },
            )
        else:
            self.keep(lineno, "(before session_meta)", "line before the session_meta header")

    def meta_source(self, p: dict) -> dict:
        git = p["git"] if isinstance(p.get("git"), dict) else {}
        source = {
            "agent": "codex",
            "agent_version": _str(p.get("cli_version")),
            "cwd": _str(p.get("cwd")),
            "git_branch": _str(git.get("branch")),
            "git_commit": _str(git.get("commit_hash")),
            "originator": _str(p.get("originator")),
            "path": self.path,
            "thread_id": p["id"],
            "model_provider": _str(p.get("model_provider")),
        }
        origin = p.get("source")
        if isinstance(origin, (str, dict)):
            source["session_source"] = origin
        forked = p.get("forked_from_id")
        if isinstance(forked, str) and forked:
            source["parent_session_id"] = f"codex-{forked}"
        return source

    def legacy_line(self, obj: dict, lineno: int) -> None:
        """A pre-envelope line: a bare ResponseItem, timed by the header (no per-line times)."""
        if "record_type" in obj:
            return
        ts = self.line_ts(None, lineno)
        if not isinstance(obj.get("type"), str):
            self.keep(lineno, "(legacy line without a type)", "legacy line without a type")
        elif self.on_response_item(obj, lineno, ts) and self.s["turn"] is not None:
            self.s["turn"]["ts"] = ts

    # -- event_msg -----------------------------------------------------------------------

    def on_token_count(self, p: dict, lineno: int) -> None:
        info = p.get("info")
        if isinstance(info, dict):
            total = info.get("total_token_usage")
            if isinstance(total, dict):
                self.advance_total(
                    [
                        u64(total.get("input_tokens")),
                        u64(total.get("cached_input_tokens")),
                        u64(total.get("output_tokens")),
                        u64(total.get("reasoning_output_tokens")),
                    ],
                    lineno,
                )
            last = info.get("last_token_usage")
            if isinstance(last, dict):
                self.s["last_input"] = u64(last.get("input_tokens"))

    def on_event(self, p: dict, kind: Any, lineno: int, ts: str) -> bool:
        """Handle an event_msg that matters; return whether it did (and so sets the time)."""
        s = self.s
        if kind == "user_message":
            s["held"] = None  # the event is the prompt; a response_item twin held before it is not
            if p.get("kind") not in (None, "plain"):
                return False  # 0.3x wrote injected instructions and environment context as user_message kinds
            text = _str(p.get("message")) or ""
            images = sum(len(p[k]) for k in ("images", "local_images") if isinstance(p.get(k), list))
            return self.take_prompt(text, images, lineno, ts, "event")
        elif kind == "item_completed":
            return self.on_item_completed(p, lineno, ts)
        elif kind in ("task_started", "turn_started"):
            s["tasks"] = True
            turn = s["turn"]
            if turn is not None and turn.get("adoptable"):
                # The prompt was written before its task_started: the turn it opened is this task.
                turn["explicit"] = True
                turn["adoptable"] = False
                return True
            turn_id = p.get("turn_id")
            self.begin_turn(ts, explicit=True, extra={"turn_id": turn_id} if isinstance(turn_id, str) else None)
            if s["held"] is not None:
                self.flush_held()  # a prompt read before its task began belongs to the task
        elif kind in ("task_complete", "turn_complete"):
            turn = s["turn"]
            if turn is None:
                self.note(lineno, "task_complete without an open turn", skipped=False)
                return False
            error = p.get("error")
            if isinstance(error, (dict, str)):
                message = error.get("message") if isinstance(error, dict) else error
                turn["error"] = message if isinstance(message, str) and message else "error"
            self.close_turn(ts)
        elif kind == "turn_aborted":
            turn = s["turn"]
            if turn is not None:
                # Held: the aborted calls and their outputs are written after this line.
                reason = p.get("reason")
                turn["abort"] = reason if isinstance(reason, str) and reason else "interrupted"
        elif kind == "context_compacted":
            if s["compact_open"]:
                s["compact_open"] = False
            else:
                self.compact_boundary(ts)
        elif kind == "error":
            message = _str(p.get("message")) or "error"
            self.item({"id": str(lineno), "type": "error", "message": message}, ts)
            s["turn"]["error"] = message
        else:
            self.keep(lineno, f"event_msg:{kind!s:.40}", f"unknown event_msg type {kind!s:.40}")
            return False
        return True

    # -- prompts and their twins ---------------------------------------------------------

    def take_prompt(self, text: str, images: int, lineno: int, ts: str, source: str) -> bool:
        """A person's prompt, from a ``user_message`` event, an ``item_completed`` UserMessage
        or a response_item user message (``source``); imported once when its twin from another
        source shows in the same turn. Opens the turn it starts. Returns whether it made an event."""
        s = self.s
        key = _mirror_key(text)
        if self.twin("prompt", source, key):
            return False
        if s["tasks"]:
            # A prompt joins the running task (queued input), unless that task was aborted:
            # then no task is running, and the prompt opens the next one.
            opened = s["turn"] is None or s["turn"]["abort"] is not None
            if opened:
                self.begin_turn(ts, explicit=False)
            self.remember("prompt", source, key)
            self.prompt(text, images, lineno, ts)
            if opened:
                s["turn"]["adoptable"] = True
        else:
            self.begin_turn(ts, explicit=False)
            self.remember("prompt", source, key)
            self.prompt(text, images, lineno, ts)
        return True

    def user_record(self, payload: dict, lineno: int, raw_ts: Any) -> None:
        """A response_item user message in an envelope file: injected context, or the twin of
        a prompt event (0.104 writes both), or (Codex 0.148 sessions with neither) the prompt
        itself. It is held until the next line tells: a prompt event or item right after it is
        the prompt; any other line that makes an event releases it as the prompt."""
        text, images = _text_parts(payload.get("content"), ("input_text", "text"))
        if text.lstrip().startswith(_INJECTED_PREFIXES) or not (text.strip() or images):
            return
        ts = self.line_ts(raw_ts, lineno)
        if self.s["held"] is not None:
            self.flush_held()
        self.s["held"] = [text, images, lineno, ts]

    def takes_the_held_prompt(self, etype: Any, payload: dict) -> bool:
        """Whether this event line is the held prompt's own twin (or starts its task)."""
        if etype in ("user_message", "task_started", "turn_started"):
            return True
        item = payload.get("item") if etype == "item_completed" else None
        return isinstance(item, dict) and item.get("type") == "UserMessage"

    def flush_held(self) -> None:
        held, self.s["held"] = self.s["held"], None
        if held is not None:
            text, images, lineno, ts = held
            self.take_prompt(text, images, lineno, ts, "record")

    def mirrored(self, kind: str, source: str, text: str) -> bool:
        """Whether ``text`` (an answer, a reasoning summary, a search) was already imported in
        this turn from another source of the same content (Codex 0.147 and later write several):
        then it is its twin, not imported again. Otherwise it is remembered for the twin to come."""
        key = _mirror_key(text)
        if self.twin(kind, source, key):
            return True
        self.remember(kind, source, key)
        return False

    def twin(self, kind: str, source: str, key: str) -> bool:
        """Whether the text of ``key`` (see :func:`_mirror_key`) is the twin of one imported in
        this turn from another source (that one is then taken: a third copy is no twin of it)."""
        by_source = self.s["mirror"].get(kind)
        if by_source:
            for other, keys in by_source.items():
                if other != source and key in keys:
                    keys.remove(key)
                    return True
        return False

    def remember(self, kind: str, source: str, key: str) -> None:
        """Remember that the text of ``key`` was imported in this turn from ``source``."""
        self.s["mirror"].setdefault(kind, {}).setdefault(source, []).append(key)

    def close_turn(self, ts: str) -> None:
        super().close_turn(ts)
        self.s["mirror"] = {}

    def finalize(self) -> None:
        if not self.s["finalized"] and self.s["held"] is not None:
            self.flush_held()
        super().finalize()

    def remember_call(self, call_id: Any) -> None:
        """Remember a paired call's id (the last ``_DONE_CALLS_KEPT`` to ``2 *`` that many)."""
        if isinstance(call_id, str) and call_id not in self._done:
            done = self.s["done"]
            done.append(call_id)
            self._done.add(call_id)
            if len(done) > 2 * _DONE_CALLS_KEPT:
                for old in done[:_DONE_CALLS_KEPT]:
                    self._done.discard(old)
                del done[:_DONE_CALLS_KEPT]

    # -- item_completed (Codex 0.147 and later) -------------------------------------------

    def on_item_completed(self, p: dict, lineno: int, ts: str) -> bool:
        """An ``item_completed`` event: the typed turn items newer Codex versions write instead of
        (or beside) the per-turn events. What a response_item twin already carries (the same
        call id, or the same text in the same turn) is not imported twice; the rest becomes
        items; an item type not known here is kept (import.unrecognized)."""
        item = p.get("item")
        itype = item.get("type") if isinstance(item, dict) else None
        if not isinstance(item, dict) or not isinstance(itype, str):
            self.keep(lineno, "event_msg:item_completed (no item)", "item_completed without a typed item")
            return False
        s = self.s
        if itype == "UserMessage":
            s["held"] = None
            text, images = _user_inputs(item.get("content"))
            if not (text.strip() or images):
                return False
            return self.take_prompt(text, images, lineno, ts, "item")
        if itype == "AgentMessage":
            text, _ = _text_parts(item.get("content"), ("Text", "text", "output_text"))
            if not text.strip() or self.mirrored("agent", "item", text):
                return False
            out = {"id": str(lineno), "type": "agent_message", "text": text}
            if isinstance(item.get("phase"), str):
                out["phase"] = item["phase"]
            self.item(out, ts)
            return True
        if itype == "Reasoning":
            summary = item.get("summary_text")
            parts = summary if isinstance(summary, list) else []
            text = "\n".join(t for t in parts if isinstance(t, str) and t.strip())
            if not text or self.mirrored("reasoning", "item", text):
                return False
            self.item({"id": str(lineno), "type": "reasoning", "text": text}, ts)
            return True
        if itype == "Plan":
            text = _str(item.get("text")) or ""
            if not text.strip():
                return False
            self.item({"id": str(lineno), "type": "plan", "text": text}, ts)
            return True
        if itype == "WebSearch":
            query = _str(item.get("query")) or ""
            if self.mirrored("search", "item", query):
                return False
            self.item({"id": str(lineno), "type": "web_search", "query": query}, ts)
            return True
        if itype == "ContextCompaction":
            return False  # the compacted line (and its context_compacted event) says it
        if itype in _CALL_ITEMS:
            call_id = item.get("id")
            if isinstance(call_id, str) and (call_id in s["calls"] or call_id in s["results"] or call_id in self._done):
                return False  # its response_item call (and output) are imported as one item
            self.item(_turn_item(itype, item, str(lineno)), ts)
            self.remember_call(call_id)
            return True
        self.keep(lineno, f"event_msg:item_completed:{itype:.40}", f"item_completed of unknown item type {itype:.40}")
        return False

    def prompt(self, text: str, images: int, lineno: int, ts: str) -> None:
        item: dict[str, Any] = {"id": str(lineno), "type": "user_message", "text": text}
        if images:
            item["images"] = images
        self.item(item, ts)

    def compact_boundary(self, ts: str) -> None:
        event = {"type": "thread.compact_boundary", "thread_id": self.session_id, "trigger": "unknown"}
        if self.s["last_input"]:
            event["pre_tokens"] = self.s["last_input"]
        self.emit(event, ts)

    # -- response_item -------------------------------------------------------------------

    def on_response_item(self, p: dict, lineno: int, ts: str) -> bool:
        """Handle a response_item; return whether it counted (and so sets the time)."""
        kind = p.get("type")
        s = self.s
        if kind in ("function_call_output", "custom_tool_call_output"):
            call_id = p.get("call_id")
            call = s["calls"].pop(call_id, None) if isinstance(call_id, str) else None
            if call is None:
                if not self.hold_result(call_id, {"kind": kind, "output": p.get("output", ""), "line": lineno}):
                    self.orphan_result({"kind": kind, "line": lineno})
                return False
            self.remember_call(call_id)
            self.item(call_item(call, p.get("output", ""), str(call["line"])), ts)
        elif kind in ("function_call", "custom_tool_call", "local_shell_call"):
            call_id = p.get("call_id") or p.get("id")
            if kind == "local_shell_call":
                action = p.get("action")
                call = {
                    "name": "local_shell",
                    "kind": "local_shell",
                    "action": action if isinstance(action, dict) else {},
                }
            else:
                call = {
                    "name": _str(p.get("name")) or "",
                    "kind": "function" if kind == "function_call" else "custom",
                    "args": p.get("arguments") if kind == "function_call" else p.get("input"),
                }
            call["line"] = lineno
            if s["turn"] is None:
                self.begin_turn(ts, explicit=False)
            turn = s["turn"]
            turn["adoptable"] = False
            if not isinstance(call_id, str):
                self.note(lineno, f"{kind} without a call_id (emitted without its result)", skipped=False)
                self.flush_call(call, ts)
                return True
            if call_id in s["calls"]:
                self.flush_call(s["calls"].pop(call_id), ts)
            result = self.take_result(call_id)
            if result is not None:  # its output came first
                self.remember_call(call_id)
                self.item(call_item(call, result["output"], str(lineno)), ts)
                return True
            s["calls"][call_id] = call
        elif kind == "message":
            role = p.get("role")
            if role == "assistant":
                text, _ = _text_parts(p.get("content"), ("output_text", "text"))
                if not text.strip() or self.mirrored("agent", "record", text):
                    return False
                item = {"id": str(lineno), "type": "agent_message", "text": text}
                phase = p.get("phase")
                if isinstance(phase, str):
                    item["phase"] = phase
                self.item(item, ts)
            elif role == "user" and s["legacy"]:
                text, images = _text_parts(p.get("content"), ("input_text", "text"))
                if text.lstrip().startswith(_INJECTED_PREFIXES) or not (text.strip() or images):
                    return False
                self.begin_turn(ts, explicit=False)
                self.prompt(text, images, lineno, ts)
            else:
                return False  # in envelope files these repeat user_message or are injected context
        elif kind == "reasoning":
            summary = p.get("summary")
            texts: list[str] = (
                [part["text"] for part in summary if isinstance(part, dict) and isinstance(part.get("text"), str)]
                if isinstance(summary, list)
                else []
            )
            text = "\n".join(t for t in texts if t.strip())
            if not text or self.mirrored("reasoning", "record", text):
                return False
            self.item({"id": str(lineno), "type": "reasoning", "text": text}, ts)
        elif kind == "web_search_call":
            action = p["action"] if isinstance(p.get("action"), dict) else {}
            query = action.get("query")
            if not isinstance(query, str):
                queries = action.get("queries")
                query = (
                    "\n".join(q for q in queries if isinstance(q, str))
                    if isinstance(queries, list)
                    else (_str(action.get("url")) or "")
                )
            if self.mirrored("search", "record", query):
                return False
            item = {"id": str(lineno), "type": "web_search", "query": query}
            status = p.get("status")
            if isinstance(status, str) and status != "completed":
                item["status"] = status
            self.item(item, ts)
        elif kind in _IGNORED_ITEMS:
            return False
        else:
            self.keep(lineno, f"response_item:{kind!s:.40}", f"unknown response_item type {kind!s:.40}")
            return False
        return True

    def flush_call(self, call: dict, ts: str) -> None:
        self.emit({"type": "item.completed", "item": call_item(call, None, str(call["line"]))}, ts)

    def orphan_result(self, result: dict) -> None:
        self.note(
            result["line"], f"{result['kind']} without a pending call (its call was not imported or already closed)"
        )


class CodexExecParser(_TotalsMixin, Parser):
    """A ``codex exec --json`` stream: already memstore's vocabulary, with three fixes: item
    ids become line numbers (Codex's ``item_N`` counts per process), ``turn.failed`` carries
    its message at the top, and the cumulative ``turn.completed`` usage becomes per turn.

    The stream has no timestamps: every event takes the stream file's modification time at
    its first import (``context["default_ts"]``), the only time the source offers.
    """

    importer = "codex-exec"
    agent = "codex"
    has_reasoning = False

    def initial_state(self) -> dict:
        s = super().initial_state()
        s.update({"total": [0, 0, 0, 0], "base": [0, 0, 0, 0]})
        return s

    def feed(self, line: bytes, lineno: int) -> None:
        obj = self.parse(line, lineno)
        if obj is None:
            return
        s = self.s
        kind = obj.get("type")
        ts = self.line_ts(None, lineno)
        if not s["started"]:
            thread_id = (
                obj.get("thread_id")
                if kind == "thread.started"
                else obj.get("session_id")
                if kind == "session.created"
                else None
            )
            if isinstance(thread_id, str) and thread_id:
                self.start_thread(
                    ts, {"agent": "codex", "originator": "codex_exec", "path": self.path, "thread_id": thread_id}
                )
            else:
                self.keep(lineno, "(before thread.started)", "line before thread.started")
            return
        if kind == "turn.started":
            self.begin_turn(ts, explicit=True)
        elif kind == "item.completed":
            item = obj.get("item")
            if not isinstance(item, dict):
                self.keep(lineno, "item.completed (no item)", "item.completed without an item object")
                return
            item = dict(item)
            if "type" not in item and "item_type" in item:  # captures before codex PR #4525
                item["type"] = item.pop("item_type")
            if item.get("type") == "assistant_message":
                item["type"] = "agent_message"
            if not isinstance(item.get("type"), str):
                self.keep(lineno, "item.completed (no type)", "item without a type")
                return
            item.pop("id", None)
            self.item({"id": str(lineno), **item}, ts)
        elif kind == "turn.completed":
            usage = obj["usage"] if isinstance(obj.get("usage"), dict) else {}
            self.advance_total(
                [
                    u64(usage.get("input_tokens")),
                    u64(usage.get("cached_input_tokens")),
                    u64(usage.get("output_tokens")),
                    0,
                ],
                lineno,
            )
            if s["turn"] is None:
                self.note(lineno, "turn.completed without an open turn", skipped=False)
                return
            # The stream's own verdict: an `error` before it was a notice the turn recovered from.
            s["turn"]["error"] = None
            self.close_turn(ts)
        elif kind == "turn.failed":
            error = obj.get("error")
            message = error.get("message") if isinstance(error, dict) else obj.get("message")
            if s["turn"] is None:
                self.begin_turn(ts, explicit=True)
            s["turn"]["error"] = message if isinstance(message, str) and message else "turn failed"
            self.close_turn(ts)
        elif kind == "error":
            message = _str(obj.get("message")) or "error"
            self.item({"id": str(lineno), "type": "error", "message": message}, ts)
            s["turn"]["error"] = message
        elif kind in ("item.started", "item.updated", "item.plan.delta", "thread.started", "request_user_input"):
            return
        else:
            self.keep(lineno, f"{kind!s:.40}", f"unknown exec event type {kind!s:.40}")
            return

    def flush_call(self, call: dict, ts: str) -> None:  # exec streams carry no separate calls
        return

    def orphan_result(self, result: dict) -> None:  # nor separate results
        return
