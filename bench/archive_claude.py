"""Claude Code transcripts: ``projects/<slug>/<sessionId>.jsonl`` and its sub-agents.

The lines follow the format described in shared/reference/agent-log-formats.md (section 2)
and the fixtures in tests/fixtures/import/claude: one line per content block of a response
(sharing ``message.id`` with growing usage snapshots), ``tool_result`` user lines with the
tool's structured ``toolUseResult``, ``progress`` lines (hooks, Bash output, sub-agent copies),
``file-history-snapshot`` lines, and from 2.1 ``system/turn_duration`` closing each turn.
Sub-agents get their own file: ``<sessionId>/subagents/agent-<id>.jsonl`` from 2.1.2, beside
the session file before that.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Optional

from archive_sink import Sink, WrittenFile, hex_id, token
from archive_text import Edit, Project, Texts, new_uuid
from archive_text import iso_ms as _ts
from archive_turns import (
    Change,
    Glob,
    Grep,
    Mcp,
    Outcome,
    Plan,
    Read,
    SessionSpec,
    Shell,
    Step,
    Task,
    Turn,
    Web,
    Write,
    plan_turn,
    turn_gap,
    version_tuple,
)

DECLINED = (
    "The user doesn't want to proceed with this tool use. The tool use was rejected (eg. if it was a file "
    "edit, the new_string was NOT written to the file). STOP what you are doing and wait for the user to "
    "tell you how to proceed."
)
COMPACT_PREAMBLE = (
    "This session is being continued from a previous conversation that ran out of context. The "
    "conversation is summarized below:\n"
)
CONTEXT_LIMIT = 155_000  # tokens of context that trigger an automatic compaction
BASH_LIMIT = 30_000  # Claude Code cuts a Bash result's text here
ADJECTIVES = ("brave", "quiet", "swift", "lucky", "gentle", "bright", "calm", "eager", "mellow", "witty")
ANIMALS = ("otter", "falcon", "badger", "heron", "lynx", "marmot", "puffin", "gecko", "walrus", "koala")


def slug_of(cwd: str) -> str:
    """The project folder name Claude Code uses for a working directory."""
    return "".join("-" if ch in "/.\\:_ " else ch for ch in cwd)


def numbered(start: int, lines: list[str]) -> str:
    return "\n".join(f"{start + i:>6}→{line}" for i, line in enumerate(lines))


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    head = text[: limit // 2]
    tail = text[-limit // 2 :]
    return f"{head}\n\n... [{text.count(chr(10), limit // 2, len(text) - limit // 2)} lines truncated] ...\n\n{tail}"


class _Transcript:
    """One file of the session (the main one or a sub-agent's): its sink and thread state."""

    def __init__(self, sink: Sink, agent_id: Optional[str], model: str):
        self.sink = sink
        self.agent_id = agent_id
        self.model = model
        self.parent: Optional[str] = None
        self.context = 0  # tokens in the model's context (cache reads of the next response)


class ClaudeSession:
    """Writes one Claude Code session (and its sub-agent files) for a spec."""

    def __init__(self, spec: SessionSpec, project: Project, texts: Texts, root: Path):
        self.spec = spec
        self.p = project
        self.t = texts
        self.r: random.Random = texts.r
        self.session_id = new_uuid(self.r)
        version = version_tuple(spec.version)
        self.v21 = version >= (2, 1, 0)
        self.subagent_dir = version >= (2, 1, 2)
        self.folder = root / slug_of(project.cwd)
        self.branch = self.r.choice(project.branches)
        self.slug = f"{self.r.choice(ADJECTIVES)}-{self.r.choice(ADJECTIVES)}-{self.r.choice(ANIMALS)}"
        self.main = _Transcript(Sink(self.folder / f"{self.session_id}.jsonl", spec.start_ms), None, spec.model)
        self.written: list[WrittenFile] = []
        self.todos: list[dict] = []
        self.next_prompt: Optional[str] = None

    # -- lines ---------------------------------------------------------------------------

    def _line(
        self,
        tr: _Transcript,
        kind: str,
        body: dict,
        *,
        parent: Any = "chain",
        uuid: Optional[str] = None,
        tail: Optional[dict] = None,
    ) -> str:
        """Emit one envelope line; return its uuid (the next line's parent)."""
        uid = uuid or new_uuid(self.r)
        line: dict = {
            "parentUuid": tr.parent if parent == "chain" else parent,
            "isSidechain": tr.agent_id is not None,
            "userType": "external",
            "cwd": self.p.cwd,
            "sessionId": self.session_id,
            "version": self.spec.version,
            "gitBranch": self.branch,
        }
        if tr.agent_id is not None:
            line["agentId"] = tr.agent_id
        if self.v21 and tr.agent_id is None:
            line["slug"] = self.slug
        line["type"] = kind
        line.update(body)
        line["uuid"] = uid
        line["timestamp"] = _ts(tr.sink.clock)
        if tail:
            line.update(tail)
        tr.sink.emit(line)
        tr.parent = uid
        return uid

    def _user(self, tr: _Transcript, content: Any, **tail: Any) -> str:
        tr.sink.tick(self.r, 5, 400)
        return self._line(tr, "user", {"message": {"role": "user", "content": content}}, tail=tail or None)

    def _response(self, tr: _Transcript, blocks: list[dict], *, model: Optional[str] = None) -> list[str]:
        """One API response, a line per content block sharing its id; returns the line uuids."""
        r = self.r
        tr.sink.tick(r, 800, 9000)
        message_id = "msg_01" + token(r, 22)
        request_id = "req_011C" + token(r, 18)
        created = r.randint(200, 4000)
        read = tr.context
        tr.context += created
        output = 0
        uids = []
        for block in blocks:
            output += max(1, len(str(block)) // 4)
            usage = {
                "input_tokens": r.randint(1, 12),
                "cache_creation_input_tokens": created,
                "cache_read_input_tokens": read,
                "cache_creation": {"ephemeral_5m_input_tokens": created, "ephemeral_1h_input_tokens": 0},
                "output_tokens": output,
                "service_tier": "standard",
            }
            message = {
                "model": model or tr.model,
                "id": message_id,
                "type": "message",
                "role": "assistant",
                "content": [block],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": usage,
            }
            uids.append(self._line(tr, "assistant", {"message": message, "requestId": request_id}))
            tr.sink.tick(r, 5, 300)
        tr.context += output
        return uids

    def _system(self, tr: _Transcript, subtype: str, **fields: Any) -> None:
        tr.sink.tick(self.r, 1, 50)
        self._line(tr, "system", {"subtype": subtype, **fields})

    def _progress(self, tr: _Transcript, data: dict, tool_id: str, parent_tool: str) -> None:
        tr.sink.tick(self.r, 5, 2000)
        self._line(tr, "progress", {"data": data, "toolUseID": tool_id, "parentToolUseID": parent_tool})

    # -- tools ---------------------------------------------------------------------------

    def _tool(self, action: Any) -> tuple[str, dict]:
        """The name and input of the tool_use block for an action."""
        cwd, r = self.p.cwd, self.r
        if isinstance(action, Read):
            args: dict = {"file_path": f"{cwd}/{action.path}"}
            if action.start > 1:
                args.update(offset=action.start, limit=len(action.lines))
            return "Read", args
        if isinstance(action, Shell):
            args = {"command": action.command, "description": self.t.prose(r.randint(3, 8)).rstrip(".?:!")}
            if action.seconds > 30:
                args["timeout"] = 600000
            return "Bash", args
        if isinstance(action, Grep):
            return "Grep", {"pattern": action.pattern, "path": cwd, "output_mode": "content", "-n": True}
        if isinstance(action, Glob):
            return "Glob", {"pattern": action.pattern}
        if isinstance(action, Change):
            e = action.edit
            return "Edit", {
                "file_path": f"{cwd}/{e.path}",
                "old_string": "\n".join(e.old),
                "new_string": "\n".join(e.new),
            }
        if isinstance(action, Write):
            return "Write", {"file_path": f"{cwd}/{action.path}", "content": "\n".join(action.lines)}
        if isinstance(action, Plan):
            return "TodoWrite", {
                "todos": [{"content": text, "status": status, "activeForm": text} for text, status in action.items]
            }
        if isinstance(action, Web):
            return "WebSearch", {"query": action.query}
        if isinstance(action, Mcp):
            return f"mcp__{action.server}__{action.tool}", action.arguments
        if isinstance(action, Task):
            return "Task", {
                "description": action.description,
                "prompt": action.turn.prompt,
                "subagent_type": action.agent_type,
            }
        raise TypeError(f"no Claude tool for {action!r}")

    def _result(self, action: Any, tool_id: str) -> tuple[Any, Any, bool]:
        """(tool_result content, toolUseResult, is_error) of an action."""
        cwd = self.p.cwd
        if isinstance(action, Read):
            text = "\n".join(action.lines)
            return (
                numbered(action.start, action.lines),
                {
                    "type": "text",
                    "file": {
                        "filePath": f"{cwd}/{action.path}",
                        "content": text,
                        "numLines": len(action.lines),
                        "startLine": action.start,
                        "totalLines": action.total,
                    },
                },
                False,
            )
        if isinstance(action, Shell):
            out = _cut(action.output, BASH_LIMIT)
            if action.exit_code:
                text = f"Exit code {action.exit_code}\n{out}"
                return text, f"Error: {text}", True
            return out, {"stdout": out, "stderr": "", "interrupted": False, "isImage": False}, False
        if isinstance(action, Grep):
            text = "\n".join(f"{cwd}/{m}" for m in action.matches) or "No matches found"
            return (
                text,
                {
                    "mode": "content",
                    "numFiles": len(action.files),
                    "filenames": [],
                    "content": text,
                    "numLines": len(action.matches),
                },
                False,
            )
        if isinstance(action, Glob):
            files = [f"{cwd}/{f}" for f in action.files]
            return (
                "\n".join(files),
                {"filenames": files, "durationMs": self.r.randint(5, 400), "numFiles": len(files), "truncated": False},
                False,
            )
        if isinstance(action, Change):
            e = action.edit
            snippet = numbered(
                max(1, e.start - 4),
                e.original[max(0, e.start - 5) : e.start - 1]
                + e.new
                + e.original[e.start - 1 + len(e.old) : e.start + len(e.old) + 4],
            )
            return (
                (
                    f"The file {cwd}/{e.path} has been updated. Here's the result of running `cat -n` on a snippet "
                    f"of the edited file:\n{snippet}"
                ),
                {
                    "filePath": f"{cwd}/{e.path}",
                    "oldString": "\n".join(e.old),
                    "newString": "\n".join(e.new),
                    "originalFile": "\n".join(e.original),
                    "structuredPatch": [_hunk(e)],
                    "userModified": False,
                    "replaceAll": False,
                },
                False,
            )
        if isinstance(action, Write):
            return (
                f"File created successfully at: {cwd}/{action.path}",
                {
                    "type": "create",
                    "filePath": f"{cwd}/{action.path}",
                    "content": "\n".join(action.lines),
                    "structuredPatch": [],
                },
                False,
            )
        if isinstance(action, Plan):
            new = [{"content": text, "status": status, "activeForm": text} for text, status in action.items]
            old, self.todos = self.todos, new
            return (
                (
                    "Todos have been modified successfully. Ensure that you continue to use the todo list to track "
                    "your progress. Please proceed with the current tasks if applicable"
                ),
                {"oldTodos": old, "newTodos": new},
                False,
            )
        if isinstance(action, Web):
            links = ", ".join(f'{{"title":"{title}","url":"{url}"}}' for title, url in action.results)
            text = f'Web search results for query: "{action.query}"\n\nLinks: [{links}]\n\n{action.summary}'
            return (
                text,
                {
                    "query": action.query,
                    "results": [
                        {
                            "tool_use_id": "srvtoolu_01" + token(self.r, 22),
                            "content": [{"title": title, "url": url} for title, url in action.results],
                        },
                        action.summary,
                    ],
                    "durationSeconds": round(self.r.uniform(2, 20), 3),
                },
                False,
            )
        if isinstance(action, Mcp):
            return [{"type": "text", "text": action.result}], [{"type": "text", "text": action.result}], action.is_error
        raise TypeError(f"no Claude result for {action!r}")

    # -- steps and turns -------------------------------------------------------------------

    def _step(self, tr: _Transcript, step: Step, declined: bool = False) -> None:
        blocks: list[dict] = []
        if step.reasoning:
            blocks.append({"type": "thinking", "thinking": step.reasoning, "signature": "Eq" + token(self.r, 300)})
        if step.message:
            blocks.append({"type": "text", "text": step.message})
        calls = []
        for action in step.actions:
            name, args = self._tool(action)
            tool_id = "toolu_01" + token(self.r, 22)
            calls.append((action, tool_id))
            blocks.append({"type": "tool_use", "id": tool_id, "name": name, "input": args})
        uids = self._response(tr, blocks)
        for n, (action, tool_id) in enumerate(calls):
            call_uid = uids[len(blocks) - len(calls) + n]
            if isinstance(action, Task):
                self._task(tr, action, tool_id, call_uid)
                continue
            tr.sink.tick(self.r, 30, int(getattr(action, "seconds", 0.5) * 1000) + 60)
            if isinstance(action, Shell) and action.seconds > 5 and self.r.random() < 0.5:
                self._bash_progress(tr, action, tool_id)
            if declined and n == len(calls) - 1:
                content: Any = DECLINED
                details: Any = "Error: " + DECLINED
                is_error = True
            else:
                content, details, is_error = self._result(action, tool_id)
            block: dict = {"tool_use_id": tool_id, "type": "tool_result", "content": content}
            if is_error:
                block["is_error"] = True
            tail: dict = {"toolUseResult": details}
            if self.v21:
                tail["sourceToolAssistantUUID"] = call_uid
            self._user(tr, [block], **tail)
            if self.v21 and tr.agent_id is None and self.r.random() < 0.3:
                self._progress(
                    tr,
                    {
                        "type": "hook_progress",
                        "hookEvent": "PostToolUse",
                        "hookName": f"PostToolUse:{self._tool(action)[0]}",
                        "command": "${CLAUDE_PLUGIN_ROOT}/hooks/post_tool_use.sh",
                    },
                    tool_id,
                    tool_id,
                )

    def _bash_progress(self, tr: _Transcript, action: Shell, tool_id: str) -> None:
        lines = action.output.splitlines()
        for k in range(1, self.r.randint(2, 5)):
            shown = "\n".join(lines[: len(lines) * k // 5])
            self._progress(
                tr,
                {
                    "type": "bash_progress",
                    "output": shown[-2000:],
                    "fullOutput": shown[-8000:],
                    "elapsedTimeSeconds": k * 2,
                    "totalLines": len(lines) * k // 5,
                },
                "bash-progress-" + str(k),
                tool_id,
            )

    def _task(self, tr: _Transcript, action: Task, tool_id: str, call_uid: str) -> None:
        """Run a sub-agent: its own file, progress copies of its messages here, then the result."""
        agent_id = hex_id(self.r, 7) if not self.v21 else hex_id(self.r, 7 if self.r.random() < 0.5 else 17)
        name = f"agent-{agent_id}.jsonl"
        path = self.folder / self.session_id / "subagents" / name if self.subagent_dir else self.folder / name
        model = "claude-haiku-4-5-20251001" if action.agent_type == "Explore" else tr.model
        sub = _Transcript(Sink(path, tr.sink.clock), agent_id, model)
        sub.context = self.r.randint(8000, 20000)
        self._user(sub, action.turn.prompt)
        for step in action.turn.steps:
            self._step(sub, step)
            if self.r.random() < 0.5:  # the parent shows the sub-agent's latest message as progress
                copy = {
                    "type": "assistant",
                    "timestamp": _ts(sub.sink.clock),
                    "message": {
                        "model": model,
                        "id": "msg_01" + token(self.r, 22),
                        "type": "message",
                        "role": "assistant",
                        "content": [{"type": "text", "text": step.message or step.reasoning or action.description}],
                        "usage": {
                            "input_tokens": 3,
                            "cache_creation_input_tokens": 400,
                            "cache_read_input_tokens": 9000,
                            "output_tokens": 60,
                        },
                    },
                }
                tr.sink.clock = max(tr.sink.clock, sub.sink.clock)
                self._progress(
                    tr,
                    {"type": "agent_progress", "agentId": agent_id, "prompt": "", "message": copy},
                    "agent_msg_01" + token(self.r, 22),
                    tool_id,
                )
        answer = action.turn.answer or self.t.answer()
        self._response(sub, [{"type": "text", "text": answer}])
        self.written.append(sub.sink.close())
        tr.sink.clock = max(tr.sink.clock, sub.sink.clock) + 50
        content = [{"type": "text", "text": answer}]
        tail: dict = {
            "toolUseResult": {
                "status": "completed",
                "prompt": action.turn.prompt,
                "agentId": agent_id,
                "content": content,
                "totalDurationMs": self.r.randint(5000, 300000),
                "totalTokens": sub.context,
                "totalToolUseCount": sum(len(s.actions) for s in action.turn.steps),
                "usage": {
                    "input_tokens": 5,
                    "cache_creation_input_tokens": 900,
                    "cache_read_input_tokens": sub.context,
                    "output_tokens": 700,
                },
            }
        }
        if self.v21:
            tail["sourceToolAssistantUUID"] = call_uid
        self._user(tr, [{"tool_use_id": tool_id, "type": "tool_result", "content": content}], **tail)

    def _slash_command(self, tr: _Transcript) -> None:
        r = self.r
        command = r.choice(("/model", "/cost", "/status", "/memory", "/init"))
        self._user(
            tr,
            "Caveat: The messages below were generated by the user while running local commands. "
            "DO NOT respond to these messages or otherwise consider them in your response unless the user "
            "explicitly asks you to.",
            isMeta=True,
        )
        self._user(
            tr,
            f"<command-name>{command}</command-name>\n<command-message>{command[1:]}</command-message>\n"
            f"<command-args></command-args>",
        )
        self._user(tr, f"<local-command-stdout>{self.t.prose(r.randint(3, 20))}</local-command-stdout>")

    def _compact(self, tr: _Transcript) -> None:
        """An automatic compaction: the boundary, the summary the model continues from and, from
        2.1.2, the summarizer's own transcript as a sub-agent file."""
        r = self.r
        tr.sink.tick(r, 20000, 90000)
        summary = "\n\n".join(
            f"{k}. {self.t.title()}:\n{self.t.paragraphs(r.randint(40, 200))}" for k in range(1, r.randint(4, 9))
        )
        pre = tr.context
        if self.subagent_dir:
            agent_id = "acompact-" + hex_id(r, 6)
            sub = _Transcript(
                Sink(self.folder / self.session_id / "subagents" / f"agent-{agent_id}.jsonl", tr.sink.clock - 15000),
                agent_id,
                tr.model,
            )
            sub.context = pre
            self._user(
                sub,
                "Your task is to create a detailed summary of the conversation so far, paying close "
                "attention to the user's explicit requests and your previous actions.\n\n"
                + self.t.paragraphs(r.randint(60, 200)),
            )
            self._response(sub, [{"type": "text", "text": summary}])
            self.written.append(sub.sink.close())
        boundary = self._line(
            tr,
            "system",
            {
                "subtype": "compact_boundary",
                "content": "Conversation compacted",
                "isMeta": False,
                "level": "info",
                "compactMetadata": {"trigger": "auto", "preTokens": pre},
                "logicalParentUuid": tr.parent,
            },
            parent=None,
        )
        tr.parent = boundary
        self._user(tr, COMPACT_PREAMBLE + summary, isCompactSummary=True, isVisibleInTranscriptOnly=True)
        tr.context = r.randint(12000, 25000)

    def _turn(self, turn: Turn) -> None:
        tr, r = self.main, self.r
        tr.sink.clock += turn_gap(r, tr.sink.clock)
        if tr.context > CONTEXT_LIMIT:
            self._compact(tr)
        if r.random() < 0.04:
            self._slash_command(tr)
        prompt_uid = new_uuid(r)
        tr.sink.emit(
            {
                "type": "file-history-snapshot",
                "messageId": prompt_uid,
                "snapshot": {"messageId": prompt_uid, "trackedFileBackups": {}, "timestamp": _ts(tr.sink.clock)},
                "isSnapshotUpdate": False,
            }
        )
        if self.next_prompt is not None:
            tr.sink.emit(
                {
                    "type": "queue-operation",
                    "operation": "dequeue",
                    "timestamp": _ts(tr.sink.clock),
                    "sessionId": self.session_id,
                }
            )
            prompt, self.next_prompt = self.next_prompt, None
        else:
            prompt = turn.prompt
        tr.sink.tick(r, 5, 400)
        extra = {"thinkingMetadata": {"level": "high", "disabled": False, "triggers": []}} if self.v21 else {}
        self._line(
            tr,
            "user",
            {"message": {"role": "user", "content": prompt}},
            uuid=prompt_uid,
            tail={"permissionMode": "default", **extra} if self.v21 else None,
        )
        started = tr.sink.clock
        steps = turn.steps
        if turn.outcome is Outcome.INTERRUPTED:
            steps = steps[: r.randint(0, len(steps))]
        for k, step in enumerate(steps):
            self._step(tr, step)
            if k == 0 and turn.queued is not None:
                tr.sink.emit(
                    {
                        "type": "queue-operation",
                        "operation": "enqueue",
                        "timestamp": _ts(tr.sink.clock),
                        "sessionId": self.session_id,
                        "content": turn.queued,
                    }
                )
                self.next_prompt = turn.queued
        if turn.outcome is Outcome.INTERRUPTED:
            self._user(tr, [{"type": "text", "text": "[Request interrupted by user]"}])
        elif turn.outcome is Outcome.DECLINED:
            self._step(tr, Step(None, None, [Change(self.t.edit(self.t.path()))]), declined=True)
            self._user(tr, [{"type": "text", "text": "[Request interrupted by user for tool use]"}])
        elif turn.outcome is Outcome.FAILED:
            tr.sink.tick(r, 1000, 60000)
            message = {
                "id": new_uuid(r),
                "model": "<synthetic>",
                "role": "assistant",
                "stop_reason": "stop_sequence",
                "stop_sequence": "",
                "type": "message",
                "usage": {
                    "input_tokens": 0,
                    "output_tokens": 0,
                    "cache_creation_input_tokens": 0,
                    "cache_read_input_tokens": 0,
                },
                "content": [
                    {
                        "type": "text",
                        "text": 'API Error: 529 {"type":"error","error":{"type":'
                        '"overloaded_error","message":"Overloaded"}}',
                    }
                ],
            }
            self._line(tr, "assistant", {"message": message}, tail={"isApiErrorMessage": True})
        else:
            self._response(tr, [{"type": "text", "text": turn.answer or ""}])
        if self.v21:
            if r.random() < 0.5:
                self._system(
                    tr,
                    "stop_hook_summary",
                    hookCount=1,
                    hookInfos=[{"command": "~/.claude/hooks/stop.sh"}],
                    hookErrors=[],
                    preventedContinuation=False,
                    stopReason="",
                    hasOutput=False,
                    level="suggestion",
                )
            self._system(tr, "turn_duration", durationMs=tr.sink.clock - started, isMeta=False)

    def write(self) -> list[WrittenFile]:
        """Write the session's turns until its main file reaches the spec's size."""
        tr, r = self.main, self.r
        tr.context = r.randint(14000, 24000)
        while True:
            self._turn(plan_turn(self.t, allow_task=True, budget=self.spec.target_bytes - tr.sink.size))
            if tr.sink.size >= self.spec.target_bytes:
                break
        if r.random() < 0.3:
            tr.sink.emit({"type": "summary", "summary": self.t.title(), "leafUuid": tr.parent})
        self.written.append(tr.sink.close())
        return self.written


def _hunk(e: Edit) -> dict:
    before = e.original[max(0, e.start - 4) : e.start - 1]
    after = e.original[e.start - 1 + len(e.old) : e.start - 1 + len(e.old) + 3]
    first = e.start - len(before)
    return {
        "oldStart": first,
        "oldLines": len(before) + len(e.old) + len(after),
        "newStart": first,
        "newLines": len(before) + len(e.new) + len(after),
        "lines": [" " + x for x in before]
        + ["-" + x for x in e.old]
        + ["+" + x for x in e.new]
        + [" " + x for x in after],
    }
