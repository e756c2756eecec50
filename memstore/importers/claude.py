"""Claude Code transcripts: ``~/.claude/projects/<slug>/<sessionId>.jsonl`` and the sub-agent
files ``<slug>/<sessionId>/subagents/agent-<agentId>.jsonl`` (``agent-*.jsonl`` beside the
session file before 2.1.2).

What each line becomes (the full table is in ``docs/import.md``):

- a ``user`` line typed by a person (not a tool result, not ``isMeta``, not command markup,
  not the compaction summary) closes the open turn and opens a new one with a ``user_message``
  item; ``[Request interrupted by user…]`` marks the open turn aborted;
- ``assistant`` lines hold one content block each and share ``message.id`` across the lines of
  one response: ``text`` → ``agent_message``, ``thinking`` → ``reasoning``, ``tool_use`` is held
  until its ``tool_result`` and becomes one paired item; the response's usage counts once, with
  the largest value seen for it (the lines carry growing snapshots);
- ``system/turn_duration`` (2.1) closes the turn; older files close it at the next prompt;
- ``system/compact_boundary`` → ``thread.compact_boundary``;
- ``progress`` lines are dropped (their ``agent_progress`` copies of a sub-agent's messages, and
  its usage, belong to the sub-agent's own session), but they link a Task call to its agent.
"""

from __future__ import annotations

from typing import Any, Optional

from .base import CLAUDE_DECLINED_MARKERS, Parser, u64, usage_dict

# Line types that carry nothing to import (titles, file snapshots, queue bookkeeping, ...).
IGNORED_TYPES = frozenset(
    {
        "summary",
        "file-history-snapshot",
        "queue-operation",
        "progress",
        "custom-title",
        "last-prompt",
        "attachment",
        "permission-mode",
        "mode",
        "agent-name",
        "tag",
        "pr-link",
        "ai-title",
    }
)
# system lines that say nothing an event log keeps (a hook summary, a slash command's output, an
# API retry notice, ...); any other subtype is kept as import.unrecognized.
QUIET_SYSTEM_SUBTYPES = frozenset({"local_command", "stop_hook_summary", "api_error", "informational"})
_MARKUP = ("<command-", "<local-command-", "<bash-input>", "<bash-stdout>", "<bash-stderr>", "<user-memory-input>")
_INTERRUPTED = "[Request interrupted by user"
_SEEN_LIMIT = 4096  # message ids remembered to drop responses replayed from an earlier turn

KNOWN_FIELDS = frozenset(
    {
        "parentUuid",
        "logicalParentUuid",
        "isSidechain",
        "userType",
        "cwd",
        "sessionId",
        "version",
        "gitBranch",
        "type",
        "message",
        "uuid",
        "timestamp",
        "requestId",
        "toolUseResult",
        "sourceToolAssistantUUID",
        "sourceToolUseID",
        "isMeta",
        "isCompactSummary",
        "isVisibleInTranscriptOnly",
        "thinkingMetadata",
        "todos",
        "permissionMode",
        "slug",
        "agentId",
        "subtype",
        "content",
        "level",
        "durationMs",
        "messageCount",
        "compactMetadata",
        "data",
        "toolUseID",
        "parentToolUseID",
        "summary",
        "leafUuid",
        "messageId",
        "snapshot",
        "isSnapshotUpdate",
        "operation",
        "isApiErrorMessage",
        "error",
        "entrypoint",
        "hookCount",
        "hookInfos",
        "hookErrors",
        "hookAdditionalContext",
        "preventedContinuation",
        "stopReason",
        "hasOutput",
        "session_id",
        "customTitle",
        "lastPrompt",
        "attachment",
        "imagePasteIds",
        "teamName",
        "agentName",
        "cause",
        "retryInMs",
        "retryAttempt",
        "maxRetries",
        "apiError",
        "isCompactBoundary",
        "planContent",
        "mcpMeta",
        "origin",
        "promptId",
        "requestDurationMs",
        "ttftMs",
        "costUSD",
        "model",
        "title",
        "isSynthetic",
        "advisorModel",
    }
)


def _text_of(content: Any) -> tuple[str, int]:
    """The text of a message or tool-result content (a string or blocks), and its image count."""
    if isinstance(content, str):
        return content, 0
    if not isinstance(content, list):
        return "", 0
    texts = []
    images = 0
    for block in content:
        if isinstance(block, dict):
            kind = block.get("type")
            if kind == "text" and isinstance(block.get("text"), str):
                texts.append(block["text"])
            elif kind == "image":
                images += 1
    return "\n".join(texts), images


def tool_item(call: dict, result: Optional[dict], tool_use_result: Any, child: Optional[str]) -> dict:
    """The item for a Claude tool call and its ``tool_result`` block (``None``: the call never
    got one, and the item says ``result_missing``)."""
    name = call["name"]
    args = call["input"] if isinstance(call["input"], dict) else {}
    item_id = f"{call['line']}:{call['block']}"
    if result is None:
        text, images, is_error = "", 0, False
        status = "failed"
    else:
        text, images = _text_of(result.get("content"))
        is_error = result.get("is_error") is True
        if is_error and any(marker in text for marker in CLAUDE_DECLINED_MARKERS):
            status = "declined"
        else:
            status = "failed" if is_error else "completed"
    details = tool_use_result if isinstance(tool_use_result, dict) else {}
    item: dict[str, Any]
    if name == "Bash":
        stdout, stderr = details.get("stdout"), details.get("stderr")
        if isinstance(stdout, str) or isinstance(stderr, str):
            output = "\n".join(part for part in (stdout, stderr) if isinstance(part, str) and part)
        else:
            output = text
        item = {
            "id": item_id,
            "type": "command_execution",
            "command": str(args.get("command", "")),
            "aggregated_output": output,
            "status": status,
        }
        if details.get("interrupted") is True:
            item["interrupted"] = True
    elif name in ("Edit", "MultiEdit", "Write", "NotebookEdit"):
        path = args.get("file_path", args.get("notebook_path", args.get("path", "")))
        kind = "add" if name == "Write" and details.get("type") == "create" else "update"
        item = {
            "id": item_id,
            "type": "file_change",
            "changes": [{"path": str(path), "kind": kind}],
            "status": status,
            "tool_name": name,
            "arguments": args,
        }
        if status != "completed" and text:
            item["output"] = text
    elif name == "TodoWrite":
        todos = args.get("todos")
        entries = [
            {"text": str(t.get("content", "")), "completed": t.get("status") == "completed"}
            for t in (todos if isinstance(todos, list) else [])
            if isinstance(t, dict)
        ]
        item = {"id": item_id, "type": "todo_list", "items": entries}
    elif name == "WebSearch":
        item = {"id": item_id, "type": "web_search", "query": str(args.get("query", ""))}
        if status != "completed":
            item["status"] = status
    elif name.startswith("mcp__") and "__" in name[5:]:
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
        if is_error:
            item["error"] = {"message": text}
    else:
        item = {
            "id": item_id,
            "type": "tool_call",
            "tool_name": name,
            "arguments": call["input"],
            "output": text,
            "status": status,
        }
        if is_error:
            item["is_error"] = True
        if child:
            item["child_session_id"] = child
    if images and item["type"] in ("tool_call", "mcp_tool_call"):
        item["images"] = images
    if result is None:
        item["result_missing"] = True
    return item


class ClaudeParser(Parser):
    """One Claude Code transcript (a main session or a sub-agent)."""

    importer = "claude"
    agent = "claude"

    def initial_state(self) -> dict:
        s = super().initial_state()
        s.update({"seen": [], "links": {}})  # ids of responses counted in closed turns; Task call -> agent id
        return s

    def after_load(self) -> None:
        self._seen = set(self.s["seen"])

    def new_turn(self, ts: str, explicit: bool) -> dict:
        turn = super().new_turn(ts, explicit)
        turn["msgs"] = {}  # message id -> [input, cache read, cache creation, output], the largest seen
        return turn

    def reopen(self) -> None:
        """The settled transcript grew: the responses of the turn finalizing closed may go on
        (their later lines are imported, and their usage counts only beyond what that turn
        counted)."""
        super().reopen()
        self.s["continued"] = dict(self.s.get("last_msgs") or {})

    def turn_usage(self, turn: dict) -> dict:
        inp = cached = created = out = 0
        seen, seen_set = self.s["seen"], self._seen
        for mid, (i, cr, cc, o) in turn["msgs"].items():
            inp += i + cr + cc
            cached += cr
            created += cc
            out += o
            if mid not in seen_set:
                seen.append(mid)
                seen_set.add(mid)
        # What this turn counted per response, kept until the next turn closes: a source that
        # settled mid-response and then grew (see reopen) continues that response.
        self.s["last_msgs"] = turn["msgs"]
        self.s.pop("continued", None)
        if len(seen) > _SEEN_LIMIT:
            for mid in seen[: len(seen) - _SEEN_LIMIT]:
                seen_set.discard(mid)
            del seen[: len(seen) - _SEEN_LIMIT]
        return usage_dict(inp, cached, created, out)

    # -- lines ---------------------------------------------------------------------------

    def feed(self, line: bytes, lineno: int) -> None:
        obj = self.parse(line, lineno)
        if obj is None:
            return
        kind = obj.get("type")
        if kind in IGNORED_TYPES:
            if kind == "progress":
                self.on_progress(obj)
            return
        if kind not in ("user", "assistant", "system"):
            self.keep(lineno, f"{kind!s:.40}", f"unknown transcript line type {kind!s:.40}")
            return
        for key in obj.keys() - KNOWN_FIELDS:
            self.note(lineno, f"unknown field {key!r:.60} in Claude transcript lines ignored", skipped=False)
        s = self.s
        if obj.get("isSidechain") is True and not s["context"].get("agent_id"):
            return  # a sub-agent's line inside a main transcript: the sub-agent's session has it
        ts = self.line_ts(obj.get("timestamp"), lineno)
        if not s["started"]:
            self.start_thread(ts, self.thread_source(obj))
        if kind == "user":
            self.on_user(obj, lineno, ts)
        elif kind == "assistant":
            self.on_assistant(obj, lineno, ts)
        else:
            self.on_system(obj, lineno, ts)
        turn = s["turn"]
        if turn is not None:
            turn["ts"] = ts

    def thread_source(self, obj: dict) -> dict:
        ctx = self.s["context"]
        session = ctx.get("claude_session") or obj.get("sessionId")
        source = {
            "agent": "claude",
            "agent_version": obj.get("version"),
            "cwd": obj.get("cwd"),
            "git_branch": obj.get("gitBranch"),
            "path": self.path,
            "thread_id": session,
        }
        source = {k: v for k, v in source.items() if isinstance(v, str)}
        if ctx.get("agent_id"):
            source["agent_id"] = ctx["agent_id"]
            if ctx.get("claude_session"):
                source["parent_session_id"] = f"claude-{ctx['claude_session']}"
        return source

    def on_progress(self, obj: dict) -> None:
        data = obj.get("data")
        parent = obj.get("parentToolUseID")
        if (
            isinstance(data, dict)
            and data.get("type") == "agent_progress"
            and isinstance(data.get("agentId"), str)
            and isinstance(parent, str)
            and parent in self.s["calls"]
        ):
            self.s["links"][parent] = data["agentId"]

    def on_user(self, obj: dict, lineno: int, ts: str) -> None:
        if obj.get("isMeta") is True or obj.get("isCompactSummary") is True:
            return
        message = obj.get("message")
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            results = [b for b in content if isinstance(b, dict) and b.get("type") == "tool_result"]
            if results:
                for block in results:
                    self.on_result(block, obj.get("toolUseResult") if len(results) == 1 else None, lineno, ts)
                if any(
                    isinstance(b, dict) and isinstance(b.get("text"), str) and b["text"].startswith(_INTERRUPTED)
                    for b in content
                ):
                    self.interrupted(ts)
                return
        text, images = _text_of(content)
        if not text.strip() and not images:
            return
        stripped = text.lstrip()
        if stripped.startswith(_INTERRUPTED):
            self.interrupted(ts)
            return
        if stripped.startswith(_MARKUP):
            return
        self.begin_turn(ts, explicit=False)
        item: dict[str, Any] = {"id": str(lineno), "type": "user_message", "text": text}
        if images:
            item["images"] = images
        self.item(item, ts)

    def interrupted(self, ts: str) -> None:
        turn = self.s["turn"]
        if turn is not None:
            # Held: the turn's end comes with turn_duration or the next prompt.
            turn["abort"] = "interrupted"
            turn["interrupted_at"] = ts

    def item(self, item: dict, ts: str) -> None:
        self.after_interruption(ts)
        super().item(item, ts)

    def after_interruption(self, ts: str) -> None:
        """An item of the interrupted turn written after its interruption (a result, the answer
        it cut short): the turn, closed at its interruption by a compaction, ends after it too
        (it was dated before its own last items)."""
        turn = self.s["turn"]
        if turn is not None and turn.get("interrupted_at") and ts > turn["interrupted_at"]:
            turn["interrupted_at"] = ts

    def on_result(self, block: dict, tool_use_result: Any, lineno: int, ts: str) -> None:
        call_id = block.get("tool_use_id")
        call = self.s["calls"].pop(call_id, None) if isinstance(call_id, str) else None
        if call is None or not isinstance(call_id, str):
            if not self.hold_result(call_id, {"block": block, "details": tool_use_result, "line": lineno}):
                self.orphan_result({"line": lineno})
            return
        self.item(tool_item(call, block, tool_use_result, self.child_of(call_id, tool_use_result)), ts)

    def child_of(self, call_id: str, tool_use_result: Any) -> Optional[str]:
        agent = self.s["links"].pop(call_id, None)
        if isinstance(tool_use_result, dict) and isinstance(tool_use_result.get("agentId"), str):
            agent = tool_use_result["agentId"]
        session = self.s["context"].get("claude_session")
        return f"claude-{session}-agent-{agent}" if agent and session else None

    def on_assistant(self, obj: dict, lineno: int, ts: str) -> None:
        message = obj.get("message")
        if not isinstance(message, dict):
            self.keep(lineno, "assistant (no message)", "assistant line without a message object")
            return
        mid = message.get("id")
        s = self.s
        counted = s.get("continued", {}).get(mid) if isinstance(mid, str) else None
        if isinstance(mid, str) and mid in self._seen and counted is None:
            self.note(lineno, "assistant response repeated from an earlier turn (counted once)")
            return
        if s["turn"] is None:
            self.begin_turn(ts, explicit=False)
        turn = s["turn"]
        content = message.get("content")
        if obj.get("isApiErrorMessage") is True:
            error_text = _text_of(content)[0] or "API error"
            self.item({"id": str(lineno), "type": "error", "message": error_text}, ts)
            turn["error"] = error_text
            return
        usage = message.get("usage")
        if isinstance(mid, str) and isinstance(usage, dict):
            new = [
                u64(usage.get("input_tokens")),
                u64(usage.get("cache_read_input_tokens")),
                u64(usage.get("cache_creation_input_tokens")),
                u64(usage.get("output_tokens")),
            ]
            if counted is not None:  # a response continued after its source settled: only what it added
                new = [max(0, n - c) for n, c in zip(new, counted)]
            old = turn["msgs"].get(mid)
            turn["msgs"][mid] = new if old is None else [max(a, b) for a, b in zip(old, new)]
        model = message.get("model")
        if isinstance(model, str) and model and model != "<synthetic>":
            turn["model"] = model
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if not isinstance(blocks, list):
            return
        for index, block in enumerate(blocks):
            if not isinstance(block, dict):
                continue
            kind = block.get("type")
            if kind == "text":
                text = block.get("text")
                if isinstance(text, str) and text.strip():
                    self.item({"id": f"{lineno}:{index}", "type": "agent_message", "text": text}, ts)
                    turn["error"] = None
            elif kind == "thinking":
                text = block.get("thinking")
                if isinstance(text, str) and text.strip():
                    self.item({"id": f"{lineno}:{index}", "type": "reasoning", "text": text}, ts)
            elif kind == "tool_use":
                turn["error"] = None
                call_id = block.get("id")
                call = {
                    "id": call_id,
                    "name": str(block.get("name", "")),
                    "input": block.get("input"),
                    "line": lineno,
                    "block": index,
                }
                if not isinstance(call_id, str):
                    self.note(lineno, "tool_use without an id (emitted without its result)", skipped=False)
                    self.flush_call(call, ts)
                    continue
                if call_id in s["calls"]:
                    self.flush_call(s["calls"].pop(call_id), ts)
                result = self.take_result(call_id)
                if result is not None:  # its result came first
                    details = result["details"]
                    self.item(tool_item(call, result["block"], details, self.child_of(call_id, details)), ts)
                    continue
                s["calls"][call_id] = call
            elif kind == "redacted_thinking":
                continue
            else:
                self.keep(
                    lineno, f"assistant block {kind!s:.40}", f"unknown assistant content block {kind!s:.40}", raw=block
                )

    def on_system(self, obj: dict, lineno: int, ts: str) -> None:
        subtype = obj.get("subtype")
        if subtype == "turn_duration":
            if self.s["turn"] is not None:
                self.close_turn(ts)
        elif subtype == "compact_boundary":
            turn = self.s["turn"]
            if turn is not None and turn.get("interrupted_at"):
                # A /compact after an interruption is not part of the interrupted turn: it ends
                # when it was interrupted, not minutes later at the compaction.
                self.close_turn(turn["interrupted_at"])
            meta = obj["compactMetadata"] if isinstance(obj.get("compactMetadata"), dict) else {}
            trigger = meta.get("trigger")
            event = {
                "type": "thread.compact_boundary",
                "thread_id": self.session_id,
                "trigger": trigger if isinstance(trigger, str) and trigger else "unknown",
            }
            if type(meta.get("preTokens")) is int:
                event["pre_tokens"] = meta["preTokens"]
            self.emit(event, ts)
        elif subtype not in QUIET_SYSTEM_SUBTYPES:
            self.keep(lineno, f"system:{subtype!s:.40}", f"unknown system line subtype {subtype!s:.40}")

    def flush_call(self, call: dict, ts: str) -> None:
        self.after_interruption(ts)
        child = self.child_of(call["id"], None) if isinstance(call.get("id"), str) else None
        self.emit({"type": "item.completed", "item": tool_item(call, None, None, child)}, ts)

    def orphan_result(self, result: dict) -> None:
        self.note(result["line"], "tool_result without a pending tool_use (its call was not imported)", skipped=False)
