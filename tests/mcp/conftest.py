"""A realistic store for the MCP server and the read-only SQL, and an MCP client that drives the
server as a real subprocess over stdio (the SDK's own client), shared by a test module."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest
from mcp_support import (
    REPO,
    McpSession,
    StoreInfo,
    build_store,
)


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> StoreInfo:
    return build_store(tmp_path_factory.mktemp("mcp-store"))


@pytest.fixture(scope="module")
def mcp(store: StoreInfo) -> Iterator[McpSession]:
    sdk = pytest.importorskip("mcp")  # a test dependency: memstore[test] installs it
    from anyio.from_thread import start_blocking_portal

    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    params = sdk.StdioServerParameters(
        command=sys.executable, args=["-m", "memstore", "mcp", "--root", str(store.root)], env={"PYTHONPATH": path}
    )
    with start_blocking_portal() as portal:
        client = sdk.Client(params, read_timeout_seconds=120)
        with portal.wrap_async_context_manager(client) as live:
            yield McpSession(portal, live)
