"""Benchmarks of importing agent logs, each measured side by side with its baseline in one run.

    python bench/bench_import.py             # the full sizes (a 100 MB rollout, 1,000 sources)
    python bench/bench_import.py --quick     # smaller sizes, for a smoke run

- throughput: ``import_logs`` of one generated Codex rollout (0.104 style: task events, a
  turn_context per model request carrying the AGENTS.md instructions, reasoning with encrypted
  content, exec_command calls with kilobytes of output, token counts written twice)
  against a bare loop that reads the same file line by line and ``orjson.loads`` each line.
  Ratio = bare time / import time (goal >= 0.25).
- re-import: a tree of 1,000 sources (Codex rollouts of 12-400 kB and Claude transcripts of
  2-40 turns, half of each) imported once, then imported again unchanged. Ratio = re-import time / first import time
  (goal <= 0.05).

Timings alternate between the two sides and report the median of the repetitions, as wall time
and as this process's CPU time (the steadier figure when other work shares the machine). Each
repetition imports into a fresh store.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import memstore  # noqa: E402

WORDS = (
    "cargo test build error warning file src main lib mod fn struct impl trait pub use let mut self return "
    "match some none ok err vec string option result parser token line offset"
).split()


def _text(rng: random.Random, n_words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


def _output(rng: random.Random, n_bytes: int) -> str:
    lines, size = [], 0
    while size < n_bytes:
        line = f"{rng.choice(WORDS)}: {_text(rng, 8)} at src/{rng.choice(WORDS)}.rs:{rng.randint(1, 900)}"
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines)


def write_rollout(
    path: Path, target_bytes: int, seed: int = 11, thread: str = "019c0000-0000-7000-8000-000000000001"
) -> int:
    """A Codex 0.104-style rollout of about ``target_bytes``; returns its line count."""
    rng = random.Random(seed)
    clock = [1_771_000_000.0, ""]

    def tick() -> None:
        # Codex stamps each line with its write time; lines written together share it.
        clock[0] += rng.random() * 2
        whole = int(clock[0])
        clock[1] = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)) + f".{int((clock[0] - whole) * 1000):03d}Z"

    def ts() -> str:
        if not clock[1] or rng.random() < 0.5:
            tick()
        return clock[1]

    def line(kind: str, payload: dict) -> bytes:
        return orjson.dumps({"timestamp": ts(), "type": kind, "payload": payload}) + b"\n"

    agents_md = "# AGENTS.md instructions for /home/dev/app\n\n" + _text(rng, 250)

    def context(turn: int) -> bytes:
        # Written once per model request (the reference counts 136 of them for 13 prompts).
        return line(
            "turn_context",
            {
                "turn_id": f"t{turn}",
                "cwd": "/home/dev/app",
                "approval_policy": "on-request",
                "sandbox_policy": {
                    "type": "workspace-write",
                    "network_access": False,
                    "exclude_tmpdir_env_var": False,
                    "exclude_slash_tmp": False,
                },
                "model": "gpt-5.3-codex",
                "personality": "pragmatic",
                "effort": "medium",
                "summary": "auto",
                "user_instructions": agents_md,
                "truncation_policy": {"mode": "tokens", "limit": 10000},
            },
        )

    limits = {
        "primary": {"used_percent": 4.0, "window_minutes": 300, "resets_at": 1771003600},
        "secondary": {"used_percent": 21.0, "window_minutes": 10080, "resets_at": 1771500000},
        "credits": {"has_credits": False, "unlimited": False, "balance": None},
        "plan_type": "plus",
    }
    total = [0, 0, 0, 0]
    n_lines = 0
    with open(path, "wb") as fh:
        fh.write(
            line(
                "session_meta",
                {
                    "id": thread,
                    "timestamp": ts(),
                    "cwd": "/home/dev/app",
                    "originator": "codex_cli_rs",
                    "cli_version": "0.104.0",
                    "source": "cli",
                    "model_provider": "openai",
                    "base_instructions": {"text": _text(rng, 3000)},
                },
            )
        )
        n_lines += 1
        turn = 0
        while fh.tell() < target_bytes:
            turn += 1
            out = [
                line("event_msg", {"type": "task_started", "turn_id": f"t{turn}", "model_context_window": 258400}),
                context(turn),
                line(
                    "response_item",
                    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": _text(rng, 30)}]},
                ),
                line(
                    "event_msg",
                    {
                        "type": "user_message",
                        "message": _text(rng, 30),
                        "images": [],
                        "local_images": [],
                        "text_elements": [],
                    },
                ),
            ]
            for step in range(rng.randint(3, 8)):
                if step:
                    out.append(context(turn))
                summary = _text(rng, 12)
                out.append(line("event_msg", {"type": "agent_reasoning", "text": summary}))
                out.append(
                    line(
                        "response_item",
                        {
                            "type": "reasoning",
                            "summary": [{"type": "summary_text", "text": summary}],
                            "content": None,
                            "encrypted_content": "gAAAA" + "x" * rng.randint(800, 2400),
                        },
                    )
                )
                call_id = f"call_{turn}_{step}"
                out.append(
                    line(
                        "response_item",
                        {
                            "type": "function_call",
                            "name": "exec_command",
                            "call_id": call_id,
                            "arguments": json.dumps({"cmd": f"cargo {rng.choice(WORDS)}", "workdir": "/home/dev/app"}),
                        },
                    )
                )
                code = rng.choice((0, 0, 0, 1))
                out.append(
                    line(
                        "response_item",
                        {
                            "type": "function_call_output",
                            "call_id": call_id,
                            "output": f"Chunk ID: {rng.randint(0, 1 << 24):06x}\nWall time: 1.2 seconds\n"
                            f"Process exited with code {code}\nOriginal token count: 100\nOutput:\n"
                            + _output(rng, rng.randint(500, 6000)),
                        },
                    )
                )
                last = [rng.randint(2000, 9000), 0, rng.randint(20, 400), rng.randint(0, 200)]
                last[1] = last[0] - rng.randint(0, 1500)
                total = [a + b for a, b in zip(total, last)]
                usage = {
                    "input_tokens": total[0],
                    "cached_input_tokens": total[1],
                    "output_tokens": total[2],
                    "reasoning_output_tokens": total[3],
                    "total_tokens": total[0] + total[2],
                }
                count = line(
                    "event_msg",
                    {
                        "type": "token_count",
                        "info": {"total_token_usage": usage, "last_token_usage": usage, "model_context_window": 258400},
                        "rate_limits": limits,
                    },
                )
                out.extend((count, count))  # Codex repeats token counts
            out.append(context(turn))
            answer = _text(rng, 60)
            out.append(line("event_msg", {"type": "agent_message", "message": answer}))
            out.append(
                line(
                    "response_item",
                    {
                        "type": "message",
                        "role": "assistant",
                        "phase": "final_answer",
                        "content": [{"type": "output_text", "text": answer}],
                    },
                )
            )
            out.append(
                line("event_msg", {"type": "task_complete", "turn_id": f"t{turn}", "last_agent_message": answer})
            )
            fh.write(b"".join(out))
            n_lines += len(out)
    return n_lines


def write_claude(path: Path, seed: int, session: str, turns: int) -> None:
    rng = random.Random(seed)
    lines = []
    clock = 1_768_000_000 + seed * 3600
    parent = None
    for t in range(turns):

        def stamp(offset: float, t: int = t) -> str:
            return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(clock + t * 60 + offset)) + ".000Z"

        base = {
            "isSidechain": False,
            "userType": "external",
            "cwd": "/home/dev/app",
            "sessionId": session,
            "version": "2.1.14",
            "gitBranch": "main",
        }
        lines.append(
            {
                **base,
                "parentUuid": parent,
                "type": "user",
                "message": {"role": "user", "content": _text(rng, 20)},
                "uuid": f"u{t}",
                "timestamp": stamp(0),
            }
        )
        usage = {
            "input_tokens": 3,
            "cache_creation_input_tokens": 200,
            "cache_read_input_tokens": 9000,
            "output_tokens": 50,
        }
        lines.append(
            {
                **base,
                "parentUuid": f"u{t}",
                "type": "assistant",
                "requestId": f"r{t}",
                "uuid": f"a{t}",
                "timestamp": stamp(2),
                "message": {
                    "model": "claude-sonnet-4-5",
                    "id": f"msg_{seed}_{t}",
                    "type": "message",
                    "role": "assistant",
                    "usage": usage,
                    "content": [
                        {"type": "tool_use", "id": f"tu{t}", "name": "Bash", "input": {"command": "cargo test"}}
                    ],
                },
            }
        )
        lines.append(
            {
                **base,
                "parentUuid": f"a{t}",
                "type": "user",
                "uuid": f"r{t}",
                "timestamp": stamp(4),
                "message": {
                    "role": "user",
                    "content": [{"tool_use_id": f"tu{t}", "type": "tool_result", "content": _output(rng, 400)}],
                },
                "toolUseResult": {"stdout": "ok", "stderr": "", "interrupted": False, "isImage": False},
            }
        )
        lines.append(
            {
                **base,
                "parentUuid": f"r{t}",
                "type": "assistant",
                "requestId": f"r{t}b",
                "uuid": f"b{t}",
                "timestamp": stamp(6),
                "message": {
                    "model": "claude-sonnet-4-5",
                    "id": f"msg_{seed}_{t}b",
                    "type": "message",
                    "role": "assistant",
                    "usage": usage,
                    "content": [{"type": "text", "text": _text(rng, 40)}],
                },
            }
        )
        lines.append(
            {
                **base,
                "parentUuid": f"b{t}",
                "type": "system",
                "subtype": "turn_duration",
                "durationMs": 6000,
                "uuid": f"s{t}",
                "timestamp": stamp(7),
            }
        )
        parent = f"s{t}"
    path.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))


def bare_loads(path: Path) -> int:
    n = 0
    with open(path, "rb") as fh:
        for line in fh:
            orjson.loads(line)
            n += 1
    return n


def drop_store(root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)
    os.sync()


class Timer:
    """Wall time and this process's CPU time of a block. On a shared machine the CPU time is the
    steadier measure of what the code costs; both are reported."""

    def __enter__(self) -> Timer:
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc) -> None:
        self.wall = time.perf_counter() - self.wall
        self.cpu = time.process_time() - self.cpu


def medians(timers: list) -> tuple[float, float]:
    return statistics.median(t.wall for t in timers), statistics.median(t.cpu for t in timers)


def bench_throughput(work: Path, size: int, reps: int) -> tuple[tuple, tuple, int]:
    source = work / "rollout-2026-02-13T00-00-00-019c0000-0000-7000-8000-000000000001.jsonl"
    n_lines = write_rollout(source, size)
    bare_times, import_times = [], []
    for rep in range(reps):
        with Timer() as bare:
            bare_loads(source)
        bare_times.append(bare)
        root = work / f"store-{rep}"
        with Timer() as imported:
            report = memstore.import_logs(root, source)
        import_times.append(imported)
        assert report.sessions_created == 1 and not report.problems, report
        drop_store(root)
    return medians(bare_times), medians(import_times), n_lines


def bench_reimport(work: Path, n_sources: int, reps: int) -> tuple[tuple, tuple]:
    tree = work / "tree"
    for i in range(n_sources):
        if i % 2:
            folder = tree / "claude" / f"-home-dev-p{i % 7}"
            folder.mkdir(parents=True, exist_ok=True)
            session = f"00000000-0000-4000-8000-{i:012d}"
            write_claude(folder / f"{session}.jsonl", i, session, turns=random.Random(i).randint(2, 40))
        else:
            folder = tree / "codex" / "2026" / "02" / f"{i % 28 + 1:02d}"
            folder.mkdir(parents=True, exist_ok=True)
            thread = f"019c0000-0000-7000-8000-{i:012d}"
            size = random.Random(i).randint(12_000, 400_000)
            write_rollout(folder / f"rollout-2026-02-01T00-00-00-{thread}.jsonl", size, seed=i, thread=thread)
    first_times, again_times = [], []
    for rep in range(reps):
        root = work / f"tree-store-{rep}"
        with Timer() as first:
            report = memstore.import_logs(root, tree)
        first_times.append(first)
        assert report.sessions_created == n_sources and not report.problems, report
        with Timer() as again:
            report = memstore.import_logs(root, tree)
        again_times.append(again)
        assert report.sessions_unchanged == n_sources and report.events_appended == 0, report
        drop_store(root)
    return medians(first_times), medians(again_times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller sizes (a smoke run)")
    parser.add_argument("--reps", type=int, default=None)
    parser.add_argument("--only", choices=("throughput", "reimport"), default=None, help="run one of the two")
    args = parser.parse_args()
    size = (10 << 20) if args.quick else (100 << 20)
    n_sources = 100 if args.quick else 1000
    reps = args.reps or (3 if args.quick else 5)
    with tempfile.TemporaryDirectory(prefix="bench-import-") as tmp:
        work = Path(tmp)
        if args.only != "reimport":
            (bare, bare_cpu), (imported, imported_cpu), n_lines = bench_throughput(work, size, reps)
            print(
                f"throughput: {size / 2**20:.0f} MB rollout, {n_lines} lines: import {imported * 1000:.0f} ms "
                f"({size / 2**20 / imported:.1f} MB/s), bare orjson.loads loop {bare * 1000:.0f} ms; "
                f"ratio {bare / imported:.2f}x wall, {bare_cpu / imported_cpu:.2f}x cpu (goal >= 0.25x)"
            )
        if args.only != "throughput":
            (first, first_cpu), (again, again_cpu) = bench_reimport(work, n_sources, reps)
            print(
                f"re-import: {n_sources} unchanged sources: first import {first * 1000:.0f} ms, "
                f"again {again * 1000:.0f} ms; ratio {again / first:.3f}x wall, "
                f"{again_cpu / first_cpu:.3f}x cpu (goal <= 0.05x)"
            )


if __name__ == "__main__":
    main()
