"""While the index is still being updated (the previous rewrite's commit syncs the WAL), the
cap lets a session run past ``max_events`` by at most half its headroom instead of making the
crossing append wait; the append past that slack waits and rewrites. Caps under 20 have no
slack: they are enforced at the crossing append, as VT Code does."""

from __future__ import annotations

import threading

import memstore
from memstore.session.cap import cap_low_water, cap_slack


def test_the_slack_is_half_the_headroom():
    assert [cap_slack(n) for n in (2, 6, 19, 20, 100, 10_000)] == [0, 0, 0, 1, 5, 500]
    assert all(cap_slack(n) <= n - cap_low_water(n) for n in range(1, 500))


def test_a_busy_index_delays_the_rewrite_by_at_most_the_slack(tmp_path, fault):
    released = threading.Event()
    blocking = threading.Event()

    def hold_the_publisher(**context):
        if threading.current_thread().name == "memstore-publisher" and blocking.is_set():
            released.wait(30)

    log = memstore.open_session(tmp_path, "s", max_events=100)
    fault.arm("index.commit", hold_the_publisher)
    log.append({"type": "turn.started"})
    while log.event_count < 100:
        log.append({"type": "item.completed", "item": {"type": "agent_message", "text": f"step {log.event_count}"}})
    blocking.set()
    log.append({"type": "turn.completed", "usage": {}})  # 101: the publisher is held with this turn
    log.append({"type": "turn.started"})
    while log.event_count < 100 + cap_slack(100):
        log.append({"type": "turn.completed", "usage": {}} if log.event_count % 2 else {"type": "turn.started"})
    assert log.event_count == 105  # past the cap, within the slack: nobody waited
    timer = threading.Timer(0.3, released.set)
    timer.start()
    log.append({"type": "item.completed", "item": {"type": "agent_message", "text": "past the slack"}})
    timer.join()
    assert log.event_count <= cap_low_water(100)  # this append waited for the index and rewrote
    log.close()
