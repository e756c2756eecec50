"""Realistic agent logs of any size, written line by line from the format rules (as the fixture
script does), for tests that need more than the small fixtures: varied prompts, commands and
outputs drawn from a developer's vocabulary, with exact token totals."""

from __future__ import annotations

import json
import random

WORDS = (
    "cargo test build error warning file src main lib mod fn struct impl trait pub use let mut self return match "
    "some none ok err vec string option result parser token line offset index query cache session import "
    "retention catalog search chunk turn event manifest lock writer reader schema migration fixture bench "
    "timeout socket request response header payload retry backoff config profile release branch commit"
).split()
CODEX_ID = "019c7777-5555-7000-8000-00000000e777"
CODEX_SID = f"codex-{CODEX_ID}"


def text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def output(rng: random.Random, n_bytes: int) -> str:
    lines, size = [], 0
    while size < n_bytes:
        line = f"{rng.choice(WORDS)}: {text(rng, 7)} at src/{rng.choice(WORDS)}.rs:{rng.randint(1, 900)}"
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines)


def _line(obj: dict) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


def codex_rollout(tasks: int, seed: int = 7, version: str = "0.104.0") -> tuple[bytes, dict]:
    """A 0.104-style rollout of ``tasks`` tasks (prompt, reasoning, an exec_command with some KB
    of output, an answer, token counts written twice); returns the bytes and the token totals
    the importer must find (the last cumulative total)."""
    rng = random.Random(seed)
    out = [
        _line(
            {
                "timestamp": "2026-02-12T09:00:00.000Z",
                "type": "session_meta",
                "payload": {
                    "id": CODEX_ID,
                    "timestamp": "2026-02-12T09:00:00.000Z",
                    "cwd": "/home/dev/app",
                    "originator": "codex_cli_rs",
                    "cli_version": version,
                    "source": "cli",
                    "model_provider": "openai",
                },
            }
        )
    ]
    total = [0, 0, 0, 0]
    for k in range(tasks):
        ts = f"2026-02-12T{9 + k // 3600:02d}:{k // 60 % 60:02d}:{k % 60:02d}"
        turn = f"t{k}"
        out.append(
            _line(
                {
                    "timestamp": f"{ts}.000Z",
                    "type": "event_msg",
                    "payload": {"type": "task_started", "turn_id": turn, "model_context_window": 258400},
                }
            )
        )
        out.append(
            _line(
                {
                    "timestamp": f"{ts}.001Z",
                    "type": "turn_context",
                    "payload": {
                        "turn_id": turn,
                        "cwd": "/home/dev/app",
                        "approval_policy": "on-request",
                        "sandbox_policy": {"type": "workspace-write"},
                        "model": "gpt-5.3-codex",
                        "summary": "auto",
                    },
                }
            )
        )
        out.append(
            _line(
                {
                    "timestamp": f"{ts}.002Z",
                    "type": "event_msg",
                    "payload": {
                        "type": "user_message",
                        "message": f"task {k}: {text(rng, rng.randint(6, 30))}",
                        "images": [],
                        "local_images": [],
                        "text_elements": [],
                    },
                }
            )
        )
        out.append(
            _line(
                {
                    "timestamp": f"{ts}.100Z",
                    "type": "response_item",
                    "payload": {
                        "type": "reasoning",
                        "summary": [{"type": "summary_text", "text": f"**{text(rng, 4)}**"}],
                        "content": None,
                        "encrypted_content": "gAAAA" + "x" * rng.randint(200, 900),
                    },
                }
            )
        )
        call = f"call_{k}"
        out.append(
            _line(
                {
                    "timestamp": f"{ts}.200Z",
                    "type": "response_item",
                    "payload": {
                        "type": "function_call",
                        "name": "exec_command",
                        "call_id": call,
                        "arguments": json.dumps({"cmd": f"cargo test {rng.choice(WORDS)}", "workdir": "/home/dev/app"}),
                    },
                }
            )
        )
        body = output(rng, rng.choice((300, 800, 2500, 6000)))
        out.append(
            _line(
                {
                    "timestamp": f"{ts}.900Z",
                    "type": "response_item",
                    "payload": {
                        "type": "function_call_output",
                        "call_id": call,
                        "output": f"Chunk ID: {k:06x}\nWall time: 1.0 seconds\nProcess exited with code 0\nOutput:\n{body}",
                    },
                }
            )
        )
        step = [rng.randint(2000, 9000), 0, rng.randint(50, 900), 0]
        step[1] = rng.randint(0, step[0])
        step[3] = rng.randint(0, step[2])
        total = [t + s for t, s in zip(total, step)]
        usage = {
            "input_tokens": total[0],
            "cached_input_tokens": total[1],
            "output_tokens": total[2],
            "reasoning_output_tokens": total[3],
            "total_tokens": total[0] + total[2],
        }
        count = {
            "type": "token_count",
            "info": {"total_token_usage": usage, "last_token_usage": usage, "model_context_window": 258400},
            "rate_limits": None,
        }
        out.append(_line({"timestamp": f"{ts}.950Z", "type": "event_msg", "payload": count}))
        out.append(
            _line(
                {
                    "timestamp": f"{ts}.960Z",
                    "type": "response_item",
                    "payload": {
                        "type": "message",
                        "role": "assistant",
                        "phase": "final_answer",
                        "content": [{"type": "output_text", "text": text(rng, rng.randint(10, 60))}],
                    },
                }
            )
        )
        out.append(_line({"timestamp": f"{ts}.970Z", "type": "event_msg", "payload": count}))
        out.append(
            _line(
                {
                    "timestamp": f"{ts}.980Z",
                    "type": "event_msg",
                    "payload": {"type": "task_complete", "turn_id": turn, "last_agent_message": "done"},
                }
            )
        )
    totals = {
        "input_tokens": total[0],
        "cached_input_tokens": total[1],
        "cache_creation_tokens": 0,
        "output_tokens": total[2],
    }
    return b"".join(out), totals
