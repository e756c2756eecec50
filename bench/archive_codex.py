"""Codex CLI rollouts: ``sessions/YYYY/MM/DD/rollout-<local time>-<thread id>.jsonl``.

Three styles, as described in shared/reference/agent-log-formats.md (section 1) and the
fixtures in tests/fixtures/import/codex:

- LEGACY (before the envelope, summer 2025): a bare header line, then bare response items
  and ``record_type`` state lines, no per-line times and no token counts;
- EARLY (0.40-like): ``{timestamp, type, payload}`` lines, ``shell`` calls whose output is a
  JSON string with the exit code, ``user_message`` events opening turns, flat rate limits;
- TASKS (0.104-like): ``task_started``/``task_complete``, a ``turn_context`` (with the
  AGENTS.md text) per model request, ``exec_command`` with its text header, ``apply_patch`` as
  a custom tool, assistant ``phase``, web searches, compaction inside a turn, token counts
  written twice.

The version strings are labels of these styles (LEGACY below 0.31, EARLY below 0.60).
"""

from __future__ import annotations

import enum
import json
import random
import time
from pathlib import Path
from typing import Any, Optional

import archive_vocab as V
from archive_sink import Sink, WrittenFile, hex_id, token
from archive_text import TECHNICAL, Project, Texts, Zipf, codex_add_patch, codex_patch, hash_seed, iso_ms
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

LOCAL_OFFSET_MS = -5 * 3600 * 1000  # the archive owner's time zone: file names use local time
OUTPUT_LIMIT = 10_000  # Codex keeps the head and tail of a longer tool output
CONTEXT_LIMIT = 200_000  # tokens of context that trigger a compaction (TASKS style)
_BASE_INSTRUCTIONS: dict[str, str] = {}


class Style(enum.Enum):
    LEGACY = "legacy"
    EARLY = "early"
    TASKS = "tasks"


def style_of(version: str) -> Style:
    v = version_tuple(version)
    return Style.LEGACY if v < (0, 31) else Style.EARLY if v < (0, 60) else Style.TASKS


def thread_id(r: random.Random, ms: int) -> str:
    """A UUID v7 (time-ordered, as Codex names threads) for a start time in milliseconds."""
    h = f"{ms:012x}"
    return f"{h[:8]}-{h[8:12]}-7{hex_id(r, 3)}-{r.choice('89ab')}{hex_id(r, 3)}-{hex_id(r, 12)}"


def rollout_path(root: Path, ms: int, tid: str) -> Path:
    local = time.gmtime((ms + LOCAL_OFFSET_MS) // 1000)
    day = time.strftime("%Y/%m/%d", local)
    stamp = time.strftime("%Y-%m-%dT%H-%M-%S", local)
    return root / day / f"rollout-{stamp}-{tid}.jsonl"


def base_instructions(version: str) -> str:
    """The model instructions Codex writes into ``session_meta`` (the same for every session of
    a version, as the real ones are)."""
    text = _BASE_INSTRUCTIONS.get(version)
    if text is None:
        r = random.Random(hash_seed("base-instructions", version))
        words = Zipf(((V.PROSE, 0.7, 1.0), (TECHNICAL, 0.3, 1.0)))
        sections = []
        for _ in range(r.randint(12, 20)):
            title = " ".join(words.draw_few(r, r.randint(2, 4))).capitalize()
            body = "\n".join(
                "- " + " ".join(words.draw_few(r, r.randint(8, 30))).capitalize() + "." for _ in range(r.randint(3, 9))
            )
            sections.append(f"## {title}\n\n{body}")
        text = "You are Codex, a coding agent. " + "\n\n".join(sections)
        _BASE_INSTRUCTIONS[version] = text
    return text


class CodexSession:
    """Writes one Codex rollout (and, rarely, a review sub-agent's rollout) for a spec."""

    def __init__(
        self, spec: SessionSpec, project: Project, texts: Texts, root: Path, *, review_of: Optional[str] = None
    ):
        self.spec = spec
        self.p = project
        self.t = texts
        self.r: random.Random = texts.r
        self.root = root
        self.style = style_of(spec.version)
        self.thread = thread_id(self.r, spec.start_ms)
        self.sink = Sink(rollout_path(root, spec.start_ms, self.thread), spec.start_ms)
        self.review_of = review_of
        self.branch = self.r.choice(project.branches)
        self.total = [0, 0, 0, 0]  # cumulative input, cached input, output, reasoning tokens
        self.context = 0
        self.turn_no = 0
        self.turn_id = ""
        self.plans = 0
        self.agents_md = (
            f"# AGENTS.md instructions for {project.cwd}\n\n<INSTRUCTIONS>\n"
            + _agents_md(project)
            + "\n</INSTRUCTIONS>"
        )
        self.written: list[WrittenFile] = []

    # -- lines ---------------------------------------------------------------------------

    def _line(self, kind: str, payload: dict) -> None:
        if self.style is Style.LEGACY:
            self.sink.emit(payload)
        else:
            self.sink.emit({"timestamp": iso_ms(self.sink.clock), "type": kind, "payload": payload})

    def _tick(self, low: int = 1, high: int = 40) -> None:
        if self.r.random() < 0.6:
            self.sink.tick(self.r, low, high)

    def _message(self, role: str, text: str, phase: Optional[str] = None) -> None:
        kind = "output_text" if role == "assistant" else "input_text"
        payload: dict = {"type": "message", "role": role, "content": [{"type": kind, "text": text}]}
        if phase is not None:
            payload["phase"] = phase
        self._line("response_item", payload)

    def _event(self, payload: dict) -> None:
        self._line("event_msg", payload)

    def _token_count(self, read: int, written: int) -> None:
        if self.style is Style.LEGACY:
            return
        r = self.r
        cached = int(read * r.uniform(0.7, 0.97))
        reasoning = r.randint(0, written)
        last = [read, cached, written, reasoning]
        self.total = [a + b for a, b in zip(self.total, last)]

        def usage(u: list[int]) -> dict:
            return {
                "input_tokens": u[0],
                "cached_input_tokens": u[1],
                "output_tokens": u[2],
                "reasoning_output_tokens": u[3],
                "total_tokens": u[0] + u[2],
            }

        if self.style is Style.EARLY:
            limits: dict = {
                "primary_used_percent": round(r.uniform(0, 90), 1),
                "secondary_used_percent": round(r.uniform(0, 90), 1),
                "primary_window_minutes": 299,
                "secondary_window_minutes": 10079,
            }
        else:
            limits = {
                "primary": {
                    "used_percent": round(r.uniform(0, 90), 1),
                    "window_minutes": 300,
                    "resets_at": self.sink.clock // 1000 + 9000,
                },
                "secondary": {
                    "used_percent": round(r.uniform(0, 90), 1),
                    "window_minutes": 10080,
                    "resets_at": self.sink.clock // 1000 + 400000,
                },
                "credits": {"has_credits": False, "unlimited": False, "balance": None},
                "plan_type": "plus",
            }
        payload = {
            "type": "token_count",
            "info": {
                "total_token_usage": usage(self.total),
                "last_token_usage": usage(last),
                "model_context_window": 258400,
            },
            "rate_limits": limits,
        }
        self._event(payload)
        if self.style is Style.TASKS and r.random() < 0.8:
            self._event(payload)  # written again, unchanged

    def _turn_context(self) -> None:
        if self.style is Style.LEGACY:
            return
        if self.style is Style.EARLY:
            self._line(
                "turn_context",
                {
                    "cwd": self.p.cwd,
                    "approval_policy": "on-request",
                    "sandbox_policy": {"mode": "workspace-write"},
                    "model": self.spec.model,
                    "effort": "high",
                    "summary": "auto",
                },
            )
            return
        self._line(
            "turn_context",
            {
                "turn_id": self.turn_id,
                "cwd": self.p.cwd,
                "approval_policy": "on-request",
                "sandbox_policy": {
                    "type": "workspace-write",
                    "network_access": False,
                    "exclude_tmpdir_env_var": False,
                    "exclude_slash_tmp": False,
                },
                "model": self.spec.model,
                "personality": "pragmatic",
                "collaboration_mode": {
                    "mode": "default",
                    "settings": {"model": self.spec.model, "reasoning_effort": "medium"},
                },
                "effort": "medium",
                "summary": "auto",
                "user_instructions": self.agents_md,
                "truncation_policy": {"mode": "tokens", "limit": 10000},
            },
        )

    # -- tool calls ------------------------------------------------------------------------

    def _shell_call(self, command: str, output: str, code: int, seconds: float, *, declined: bool = False) -> None:
        r = self.r
        call_id = "call_" + token(r, 24)
        if self.style is Style.TASKS:
            self._line(
                "response_item",
                {
                    "type": "function_call",
                    "name": "exec_command",
                    "arguments": json.dumps({"cmd": command, "workdir": self.p.cwd, "yield_time_ms": 10000}),
                    "call_id": call_id,
                },
            )
            self.sink.tick(r, 20, int(seconds * 1000) + 30)
            if declined:
                text = "exec command rejected by user"
            else:
                text = (
                    f"Chunk ID: {hex_id(r, 6)}\nWall time: {seconds:.4f} seconds\nProcess exited with code {code}\n"
                    f"Original token count: {len(output) // 4}\nOutput:\n{_cut(output)}"
                )
            self._line("response_item", {"type": "function_call_output", "call_id": call_id, "output": text})
            return
        argv = ["bash", "-lc", command]
        if self.style is Style.LEGACY and r.random() < 0.3:
            self._line(
                "response_item",
                {
                    "type": "local_shell_call",
                    "call_id": call_id,
                    "status": "completed",
                    "action": {"type": "exec", "command": argv, "working_directory": self.p.cwd},
                },
            )
        else:
            self._line(
                "response_item",
                {
                    "type": "function_call",
                    "name": "shell",
                    "arguments": json.dumps({"command": argv, "workdir": self.p.cwd, "timeout_ms": 120000}),
                    "call_id": call_id,
                },
            )
        self.sink.tick(r, 20, int(seconds * 1000) + 30)
        text = (
            "exec command rejected by user"
            if declined
            else json.dumps(
                {"output": _cut(output), "metadata": {"exit_code": code, "duration_seconds": round(seconds, 1)}}
            )
        )
        self._line("response_item", {"type": "function_call_output", "call_id": call_id, "output": text})

    def _patch(self, patch: str, path: str, added: bool) -> None:
        r = self.r
        call_id = "call_" + token(r, 24)
        result = json.dumps(
            {
                "output": f"Success. Updated the following files:\n{'A' if added else 'M'} {path}\n",
                "metadata": {"exit_code": 0, "duration_seconds": 0.0},
            }
        )
        if self.style is Style.TASKS:
            self._line(
                "response_item",
                {
                    "type": "custom_tool_call",
                    "status": "completed",
                    "call_id": call_id,
                    "name": "apply_patch",
                    "input": patch,
                },
            )
            self._tick(10, 300)
            self._line("response_item", {"type": "custom_tool_call_output", "call_id": call_id, "output": result})
            return
        if r.random() < 0.5:
            args = {"command": ["apply_patch", patch], "workdir": self.p.cwd}
        else:
            args = {"command": ["bash", "-lc", f"apply_patch <<'EOF'\n{patch}\nEOF"], "workdir": self.p.cwd}
        self._line(
            "response_item",
            {"type": "function_call", "name": "shell", "arguments": json.dumps(args), "call_id": call_id},
        )
        self._tick(10, 300)
        self._line("response_item", {"type": "function_call_output", "call_id": call_id, "output": result})

    def _function(self, name: str, args: dict, output: str) -> None:
        call_id = "call_" + token(self.r, 24)
        self._line(
            "response_item", {"type": "function_call", "name": name, "arguments": json.dumps(args), "call_id": call_id}
        )
        self._tick(50, 3000)
        self._line("response_item", {"type": "function_call_output", "call_id": call_id, "output": output})

    def _action(self, action: Any) -> None:
        r, p = self.r, self.p
        if isinstance(action, Shell):
            self._shell_call(action.command, action.output, action.exit_code, action.seconds)
        elif isinstance(action, Read):
            end = action.start + len(action.lines) - 1
            if r.random() < 0.5:
                command = f"sed -n '{action.start},{end}p' {action.path}"
                output = "\n".join(action.lines)
            else:
                command = f"nl -ba {action.path} | sed -n '{action.start},{end}p'"
                output = "\n".join(f"{action.start + i:6d}\t{line}" for i, line in enumerate(action.lines))
            self._shell_call(command, output, 0, round(r.uniform(0.01, 0.2), 3))
        elif isinstance(action, Grep):
            self._shell_call(
                f'rg -n "{action.pattern}" {p.sources[0].split("/")[0]}',
                "\n".join(action.matches),
                0 if action.matches else 1,
                round(r.uniform(0.01, 0.5), 3),
            )
        elif isinstance(action, Glob):
            self._shell_call(f"rg --files -g '{action.pattern}'", "\n".join(action.files), 0, 0.05)
        elif isinstance(action, Change):
            self._patch(codex_patch(action.edit), action.edit.path, False)
        elif isinstance(action, Write):
            self._patch(codex_add_patch(action.path, action.lines), action.path, True)
        elif isinstance(action, Plan):
            self._function(
                "update_plan",
                {"plan": [{"step": text, "status": status} for text, status in action.items]},
                "Plan updated",
            )
        elif isinstance(action, Web) and self.style is Style.TASKS:
            self._line(
                "response_item",
                {"type": "web_search_call", "status": "completed", "action": {"type": "search", "query": action.query}},
            )
        elif isinstance(action, Mcp) and self.style is not Style.LEGACY:
            self._function(f"mcp__{action.server}__{action.tool}", action.arguments, action.result)
        elif isinstance(action, (Web, Mcp, Task)):
            # Not in this style's tool set: the model looked around with the shell instead.
            command, output, code = self.t.listing()
            self._shell_call(command, output, code, 0.02)
        else:
            raise TypeError(f"no Codex call for {action!r}")

    # -- steps and turns -------------------------------------------------------------------

    def _step(self, step: Step, first: bool) -> None:
        r = self.r
        self.sink.tick(r, 800, 12000)
        if not first:
            self._turn_context()
        read = self.context
        written = 0
        if step.reasoning:
            if self.style is not Style.LEGACY:
                self._event({"type": "agent_reasoning", "text": step.reasoning})
            payload: dict = {
                "type": "reasoning",
                "summary": [{"type": "summary_text", "text": step.reasoning}],
                "content": None,
                "encrypted_content": "gAAAAA" + token(r, r.randint(400, 3000)),
            }
            if self.style is Style.LEGACY:
                payload = {
                    "type": "reasoning",
                    "id": "rs_" + token(r, 40),
                    "summary": payload["summary"],
                    "encrypted_content": payload["encrypted_content"],
                }
            self._line("response_item", payload)
            written += len(step.reasoning) // 4
        if step.message:
            self._tick()
            if self.style is not Style.LEGACY:
                self._event({"type": "agent_message", "message": step.message})
            self._message("assistant", step.message, "commentary" if self.style is Style.TASKS else None)
            written += len(step.message) // 4
        before = self.sink.size
        for action in step.actions:
            self._tick()
            self._action(action)
        self.context += written + (self.sink.size - before) // 4 + r.randint(50, 400)
        self._token_count(read, written + r.randint(20, 300))

    def _compact(self) -> None:
        r = self.r
        summary = self.t.paragraphs(r.randint(200, 900))
        history = [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": self.t.prompt()}]}
            for _ in range(r.randint(1, 6))
        ]
        history.append({"type": "message", "role": "user", "content": [{"type": "input_text", "text": summary}]})
        self.sink.tick(r, 5000, 60000)
        self._line("compacted", {"message": "", "replacement_history": history})
        self._event({"type": "context_compacted"})
        self.context = r.randint(8000, 20000)

    def _prompt(self, text: str) -> None:
        if self.style is Style.LEGACY:
            self._message("user", text)
            return
        self._message("user", text)
        if self.style is Style.EARLY:
            self._event({"type": "user_message", "message": text, "kind": "plain"})
        else:
            self._event(
                {"type": "user_message", "message": text, "images": [], "local_images": [], "text_elements": []}
            )

    def _turn(self, turn: Turn) -> None:
        r = self.r
        self.sink.clock += turn_gap(r, self.sink.clock)
        self.turn_no += 1
        self.turn_id = f"{self.turn_no}" if r.random() < 0.5 else f"turn_{token(r, 12)}"
        tasks = self.style is Style.TASKS
        if tasks:
            self._event(
                {
                    "type": "task_started",
                    "turn_id": self.turn_id,
                    "model_context_window": 258400,
                    "collaboration_mode_kind": "default",
                }
            )
        self._turn_context()
        self._prompt(turn.prompt)
        steps = turn.steps
        if turn.outcome is Outcome.INTERRUPTED:
            steps = steps[: r.randint(0, len(steps))]
        for k, step in enumerate(steps):
            if tasks and self.context > CONTEXT_LIMIT:
                self._compact()
            self._step(step, first=k == 0)
            if k == 0 and turn.queued is not None and self.style is not Style.LEGACY:
                self._tick(1000, 20000)
                if tasks:
                    self._event(
                        {
                            "type": "user_message",
                            "message": turn.queued,
                            "images": [],
                            "local_images": [],
                            "text_elements": [],
                        }
                    )
                else:
                    self._prompt(turn.queued)
        if turn.outcome in (Outcome.INTERRUPTED, Outcome.DECLINED):
            self.sink.tick(r, 500, 20000)
            if self.style is not Style.LEGACY:
                self._event({"type": "turn_aborted", "reason": "interrupted"})
            if turn.outcome is Outcome.DECLINED:
                edit = self.t.edit(self.t.path())
                self._shell_call(f"git checkout -- {edit.path}", "", 0, 0.01, declined=True)
            if tasks:
                self._message("user", "<turn_aborted>\nThe user interrupted the previous turn.\n</turn_aborted>")
            return
        if turn.outcome is Outcome.FAILED:
            if tasks:
                self._event(
                    {
                        "type": "error",
                        "message": "stream disconnected before completion: error sending "
                        "request for url (https://chatgpt.com/backend-api/codex/responses)",
                    }
                )
                self._event({"type": "task_complete", "turn_id": self.turn_id, "last_agent_message": None})
            return
        answer = turn.answer or ""
        self.sink.tick(r, 1000, 15000)
        if self.style is not Style.LEGACY:
            self._event({"type": "agent_message", "message": answer})
        self._message("assistant", answer, "final_answer" if tasks else None)
        self._token_count(self.context, len(answer) // 4)
        if tasks:
            self._tick()
            self._event({"type": "task_complete", "turn_id": self.turn_id, "last_agent_message": answer})
        if self.style is Style.LEGACY:
            self.sink.emit({"record_type": "state"})

    def _header(self) -> None:
        r, p, ms = self.r, self.p, self.spec.start_ms
        git = {
            "commit_hash": hex_id(r, 40),
            "branch": self.branch,
            "repository_url": f"git@github.com:{p.package}/{p.name}.git",
        }
        if self.style is Style.LEGACY:
            self.sink.emit({"id": self.thread, "timestamp": iso_ms(ms), "instructions": None, "git": git})
            self.sink.emit({"record_type": "state"})
            self._message("user", f"<user_instructions>\n\n{_agents_md(p)}\n\n</user_instructions>")
            self._message(
                "user",
                f"<environment_context>\n  <cwd>{p.cwd}</cwd>\n  <approval_policy>on-request"
                f"</approval_policy>\n  <sandbox_mode>workspace-write</sandbox_mode>\n"
                f"</environment_context>",
            )
            return
        meta: dict = {
            "id": self.thread,
            "timestamp": iso_ms(ms),
            "cwd": p.cwd,
            "originator": "codex_cli_rs",
            "cli_version": self.spec.version,
        }
        if self.style is Style.EARLY:
            meta["instructions"] = None
        else:
            meta.update(
                source={"subagent": "review"} if self.review_of else "cli",
                model_provider="openai",
                base_instructions={"text": base_instructions(self.spec.version)},
            )
        meta["git"] = git
        self._line("session_meta", meta)
        environment = (
            f"<environment_context>\n  <cwd>{p.cwd}</cwd>\n  <approval_policy>on-request</approval_policy>\n"
            f"  <sandbox_mode>workspace-write</sandbox_mode>\n  <network_access>restricted</network_access>\n"
            f"  <shell>zsh</shell>\n</environment_context>"
        )
        if self.style is Style.TASKS:
            self._message(
                "developer", "<permissions instructions>\n" + self.t.paragraphs(60) + "\n</permissions instructions>"
            )
        self._message("user", self.agents_md)
        self._message("user", environment)
        if self.style is Style.EARLY:
            self._event({"type": "user_message", "message": environment, "kind": "environment_context"})

    def write(self) -> list[WrittenFile]:
        """Write the rollout's turns until it reaches the spec's size (and, rarely, a review)."""
        r = self.r
        self.context = r.randint(9000, 16000)
        self._header()
        if self.review_of:
            turn = plan_turn(self.t, allow_task=False, size=r.randint(2, 8), allow_failure=False)
            turn.prompt = "Review the current changes and report bugs, risks and missing tests.\n\n" + turn.prompt
            self._turn(turn)
        else:
            while True:
                self._turn(plan_turn(self.t, allow_task=False, budget=self.spec.target_bytes - self.sink.size))
                if self.sink.size >= self.spec.target_bytes:
                    break
        self.written.append(self.sink.close())
        if self.style is Style.TASKS and not self.review_of and r.random() < 0.04:
            spec = SessionSpec(
                self.spec.index,
                self.spec.seed,
                self.spec.agent,
                self.spec.version,
                self.spec.model,
                self.sink.clock + r.randint(1000, 60000),
                self.spec.project,
                0,
            )
            self.written.extend(CodexSession(spec, self.p, self.t, self.root, review_of=self.thread).write())
        return self.written


def _cut(text: str) -> str:
    if len(text) <= OUTPUT_LIMIT:
        return text
    half = OUTPUT_LIMIT // 2
    return f"{text[:half]}\n…{(len(text) - OUTPUT_LIMIT) // 4} tokens truncated…\n{text[-half:]}"


def _agents_md(p: Project) -> str:
    r = random.Random(hash_seed(p.seed, "agents-md"))
    words = p.tokens
    parts = [f"# Repository Guidelines for {p.name}"]
    for title in (
        "Project Structure",
        "Build, Test, and Development Commands",
        "Coding Style",
        "Testing",
        "Commit & Pull Request Guidelines",
    )[: r.randint(3, 5)]:
        bullets = "\n".join(
            "- " + " ".join(words.draw_few(r, r.randint(8, 28))).capitalize() + "." for _ in range(r.randint(2, 7))
        )
        parts.append(f"## {title}\n\n{bullets}")
    parts.append(f"Run `{p.test_command}` before committing; `{p.lint_command}` must pass.")
    return "\n\n".join(parts)
