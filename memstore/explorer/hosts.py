"""Which ``Host`` a request to the explorer may name.

A server on 127.0.0.1 is reachable from any page the browser on that machine opens: a page of
``evil.example`` whose name the attacker then points at 127.0.0.1 (DNS rebinding) reads the
explorer's answers as its own origin's, every transcript included. What such a request cannot
hide is its ``Host`` header, the attacker's name. So the explorer answers only requests naming
a host it was started for: the localhost names, the address the request came in on (the one the
server is bound to, for a server bound to one address; the interface's, for 0.0.0.0), and the
names the user allowed (``memstore serve --allow-host NAME``, or the ``allow_hosts`` list of the
``memstore`` plugin's configuration in Datasette's metadata). ``*`` allows every name (behind a
proxy that checks it, say). Others get a 403 that says what to do.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import Optional

LOCAL_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
ANY = "*"


def normalize(name: str) -> str:
    """A host name as compared: lowercase, no brackets around an IPv6 address, no final dot."""
    name = name.strip().lower()
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    return name.rstrip(".")


def host_of(header: str) -> Optional[str]:
    """The host a ``Host`` header names, without its port (``None`` for one that is malformed)."""
    value = header.strip()
    if not value or any(c in value for c in " /\\@\t"):
        return None
    if value.startswith("["):
        end = value.find("]")
        if end < 0 or (value[end + 1 :] and not value[end + 1 :].startswith(":")):
            return None
        return normalize(value[: end + 1])
    if value.count(":") == 1:
        value, port = value.split(":")
        if port and not port.isdigit():
            return None
    elif value.count(":") > 1:
        return None  # a bare IPv6 address must be in brackets
    return normalize(value)


def _is_loopback(name: str) -> bool:
    if name in LOCAL_NAMES or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def allowed(header: Optional[str], extra: Iterable[str] = (), server: Optional[str] = None) -> bool:
    """Whether a request with this ``Host`` header may be answered: a localhost name (``*.localhost``
    resolves to loopback by the standard), a loopback address, ``server`` (the local address the
    request came in on) or one of ``extra``. A request without the header (HTTP/1.0) names no
    other site and is answered."""
    names = {normalize(n) for n in extra}
    if ANY in names:
        return True
    if header is None:
        return True
    host = host_of(header)
    if host is None:
        return False
    if _is_loopback(host) or host in names:
        return True
    return server is not None and host == normalize(server)
