"""No test binds a fixed port: a `memstore serve` a person runs (on 8001) or another test run
on the same machine would make such a test fail, or the test would break the person's server.
Tests bind port 0, or a free port found that way."""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
BIND = re.compile(r"""\.bind\(\(\s*["'][^"']*["']\s*,\s*(\d+)\s*\)\)""")
PORT_OPTION = re.compile(r"""["']--port["']\s*,\s*["']?(\d+)["']?""")
PORT_KEYWORD = re.compile(r"""\bport\s*=\s*(\d+)\b""")


def fixed_ports(text: str) -> list[str]:
    """Literal ports a test would bind: nonzero and valid (an out-of-range one is a test of the
    error it gives, and binds nothing)."""
    found = []
    for pattern in (BIND, PORT_OPTION, PORT_KEYWORD):
        for match in pattern.finditer(text):
            port = int(match.group(1))
            if 0 < port <= 65535:
                found.append(match.group(0))
    return found


def test_the_check_finds_fixed_ports():
    assert fixed_ports('sock.bind(("127.0.0.1", 8001))') == ['.bind(("127.0.0.1", 8001))']
    assert fixed_ports('["serve", "--port", "8002"]') and fixed_ports("serve(root, port=8001)")
    assert not fixed_ports('sock.bind(("127.0.0.1", 0))') and not fixed_ports('["--port", "99999"]')
    assert not fixed_ports('["--port", str(port)]') and not fixed_ports('["--port", "0"]')


def test_no_test_binds_a_fixed_port():
    offenders = {}
    for path in sorted(TESTS.rglob("*.py")):
        if path == Path(__file__).resolve():
            continue
        found = fixed_ports(path.read_text(encoding="utf-8"))
        if found:
            offenders[str(path.relative_to(TESTS))] = found
    assert offenders == {}
