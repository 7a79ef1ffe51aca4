"""A request and its reply as the HTTP API reads and writes them, whatever carries them.

The API's own port is served by wire.py (an asyncio protocol of ours over httptools, so that
a held long poll costs what a blocked ``reserve`` costs); the dashboard's port by
aiohttp (mount.py).
Both read a request into an ``ApiRequest`` and write the ``Reply`` that site.py makes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

JSON = "application/json"


@dataclass(slots=True)
class ApiRequest:
    method: str
    path: str  # as sent: percent-encoded, no query
    query: Mapping[str, str]  # each name's first value, decoded
    headers: Mapping[str, str]  # lower-cased names, each one's first value
    body: bytes | None = None  # None: none was sent
    remote: str | None = None  # the peer's address (the sign-in rule counts by it)


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    body: bytes = b""
    content_type: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)


def json_reply(status: int, payload: Any) -> Reply:
    """``payload`` as JSON; None: no body (a 204)."""
    if payload is None:
        return Reply(status)
    return Reply(status, json.dumps(payload).encode(), JSON)


def first_values(pairs: Any) -> dict[str, str]:
    """A map of each name's first value (as aiohttp's multidicts ``get``), from
    ``(name, value)`` pairs; names lower-cased when they are headers."""
    found: dict[str, str] = {}
    for name, value in pairs:
        found.setdefault(name, value)
    return found


def query_of(text: str) -> dict[str, str]:
    """A query string's params, decoded (``+`` is a space, as in forms)."""
    return first_values(parse_qsl(text, keep_blank_values=True)) if text else {}
