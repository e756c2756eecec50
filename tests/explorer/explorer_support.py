"""Helpers of the explorer tests: sessions written for them, and real servers on free ports."""

from __future__ import annotations

import http.client
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import memstore

PROJECT = Path(__file__).resolve().parent.parent.parent


def write_session(
    root: Path,
    sid: str,
    *,
    turns: int = 1,
    text: str = "hello world",
    agent: Optional[str] = None,
    model: str = "gpt-5",
    cwd: Optional[str] = None,
) -> None:
    """A session of ``turns`` turns, each a prompt, an answer and token usage."""
    source = {k: v for k, v in (("agent", agent), ("cwd", cwd)) if v}
    with memstore.open_session(root, sid) as log:
        if source and log.manifest.event_count == 0:
            log.append({"type": "thread.started", "thread_id": sid, "source": source})
        for n in range(turns):
            log.append({"type": "turn.started"})
            log.append(
                {
                    "type": "item.completed",
                    "item": {"id": f"u{n}", "type": "user_message", "text": f"prompt {n}: {text}"},
                }
            )
            log.append(
                {
                    "type": "item.completed",
                    "item": {"id": f"a{n}", "type": "agent_message", "text": f"answer {n}: {text}"},
                }
            )
            log.append(
                {
                    "type": "turn.completed",
                    "model": model,
                    "usage": {"input_tokens": 1000 + n, "cached_input_tokens": 200, "output_tokens": 50},
                }
            )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Served:
    """A running `memstore serve`: its store, port and process."""

    root: Path
    port: int
    proc: subprocess.Popen

    def request(self, path: str, *, host: Optional[str] = None, timeout: float = 60.0) -> tuple[int, str]:
        """A real HTTP GET of ``path``, naming ``host`` in its Host header (default: the address)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.putrequest("GET", path, skip_host=True)
            conn.putheader("Host", host if host is not None else f"127.0.0.1:{self.port}")
            conn.endheaders()
            response = conn.getresponse()
            return response.status, response.read().decode("utf-8", "replace")
        finally:
            conn.close()


def start_server(root: Path, *args: str) -> Served:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(PROJECT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "memstore", "serve", "--root", str(root), "--port", str(port), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
    )
    served = Served(root, port, proc)
    deadline = time.monotonic() + 60
    while True:
        try:
            if served.request("/-/memstore.json", timeout=5)[0] == 200:
                return served
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_server(served)
            output = proc.stdout.read().decode() if proc.stdout else ""
            raise RuntimeError(f"memstore serve did not start: {output[-2000:]}")
        time.sleep(0.2)


def stop_server(served: Served) -> None:
    served.proc.terminate()
    try:
        served.proc.wait(10)
    except subprocess.TimeoutExpired:
        served.proc.kill()
        served.proc.wait()
