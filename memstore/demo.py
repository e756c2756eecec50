"""A small, realistic demonstration session: what ``memstore demo`` writes and shows."""

from __future__ import annotations

import os
from typing import Iterator

from .log import SessionLog, open_session

_TEST_OUTPUT_FAIL = """running 12 tests
test parser::tests::parses_empty ... ok
test parser::tests::parses_nested ... ok
test store::tests::append_roundtrip ... FAILED

failures:

---- store::tests::append_roundtrip stdout ----
thread 'store::tests::append_roundtrip' panicked at src/store.rs:88:9:
assertion `left == right` failed
  left: 2
 right: 3

test result: FAILED. 11 passed; 1 failed; 0 ignored; 0 measured
"""

_TEST_OUTPUT_OK = "running 12 tests\n" + "".join(
    f"test suite::case_{i:02d} ... ok\n" for i in range(12)
) + "\ntest result: ok. 12 passed; 0 failed; 0 ignored; 0 measured\n"

_DIFF = """--- a/src/store.rs
+++ b/src/store.rs
@@ -84,7 +84,7 @@ impl Store {
     pub fn append(&mut self, event: Event) -> Result<u64> {
-        self.buffer.push(event);
+        self.buffer.push(event.clone());
+        self.count += 1;
         Ok(self.count)
     }
"""


def _usage(inp: int, cached: int, out: int) -> dict:
    return {"input_tokens": inp, "cached_input_tokens": cached, "cache_creation_tokens": 0, "output_tokens": out}


def demo_events(thread_id: str = "demo-run") -> Iterator[dict]:
    """The events of a three-turn agent run: a failing test run, a fix, a green run."""
    yield {"type": "thread.started", "thread_id": thread_id}
    # Turn 1: look around, run the tests, they fail.
    yield {"type": "turn.started"}
    yield {"type": "item.completed", "item": {"id": "r1", "type": "reasoning", "stage": "analysis",
                                              "text": "The user reports append_roundtrip fails. Run the suite first."}}
    yield {"type": "item.completed", "item": {"id": "t1", "type": "tool_invocation", "tool_name": "read_file",
                                              "arguments": {"path": "src/store.rs"}, "tool_call_id": "call_1",
                                              "status": "completed", "outcome": "success"}}
    yield {"type": "item.completed", "item": {"id": "t1:output", "type": "tool_output", "call_id": "t1",
                                              "tool_call_id": "call_1", "output": "pub struct Store { ... }",
                                              "exit_code": 0, "status": "completed"}}
    yield {"type": "item.completed", "item": {"id": "c1", "type": "command_execution", "command": "cargo test",
                                              "aggregated_output": _TEST_OUTPUT_FAIL, "exit_code": 101,
                                              "status": "failed"}}
    yield {"type": "turn.failed", "message": "cargo test failed: 1 test failed", "usage": _usage(5400, 0, 420)}
    # Turn 2: fix the bug.
    yield {"type": "turn.started"}
    yield {"type": "item.completed", "item": {"id": "p2", "type": "plan",
                                              "text": "1. Count appended events\n2. Re-run cargo test"}}
    yield {"type": "item.completed", "item": {"id": "f2", "type": "file_change",
                                              "changes": [{"path": "src/store.rs", "kind": "update"}],
                                              "status": "completed", "unified_diff": _DIFF,
                                              "additions": 2, "deletions": 1}}
    yield {"type": "item.completed", "item": {"id": "m2", "type": "agent_message",
                                              "text": "The append path never incremented the counter; fixed in src/store.rs."}}
    yield {"type": "turn.completed", "usage": _usage(7100, 5200, 380)}
    # Turn 3: verify.
    yield {"type": "turn.started"}
    yield {"type": "item.completed", "item": {"id": "c3", "type": "command_execution", "command": "cargo test",
                                              "aggregated_output": _TEST_OUTPUT_OK, "exit_code": 0,
                                              "status": "completed"}}
    yield {"type": "item.completed", "item": {"id": "m3", "type": "agent_message",
                                              "text": "All 12 tests pass. The fix is in src/store.rs."}}
    yield {"type": "turn.completed", "usage": _usage(7900, 7000, 150)}
    yield {"type": "thread.completed", "thread_id": thread_id, "session_id": thread_id, "subtype": "success",
           "outcome_code": "completed", "result": "Fixed append_roundtrip.", "usage": _usage(20400, 12200, 950),
           "total_cost_usd": 0.0412, "num_turns": 3}


def write_demo_session(root: os.PathLike | str, session_id: str = "demo") -> SessionLog:
    """Append the demo run to ``session_id`` under ``root`` and return the (open) log."""
    log = open_session(root, session_id)
    try:
        for event in demo_events(session_id):
            log.append(event)
    except BaseException:
        log.close()
        raise
    return log
