"""A task body as HTTP, AMQP and NATS carry it (docs/protocol.md, "Delivery targets").

The body is held as MessagePack. A bin body goes out as its bytes
(``application/octet-stream``), a str as UTF-8 (``text/plain; charset=utf-8``),
anything else as JSON (``application/json``). Whether a body has a JSON form
is checked at ``add`` (``json_error``), so a delivery never finds out late.
"""

from __future__ import annotations

import json
from typing import Any

import msgpack  # type: ignore[import-untyped, unused-ignore]

OCTET_STREAM = "application/octet-stream"
TEXT = "text/plain; charset=utf-8"
JSON = "application/json"


def _unpack(body_packed: bytes) -> Any:
    # strict_map_key=False: a body may be a map with int keys, which JSON
    # writes as strings (as json.dumps does).
    return msgpack.unpackb(body_packed, raw=False, strict_map_key=False)


def _json_bytes(value: Any) -> bytes:
    # allow_nan=False: NaN and Infinity are not JSON, whatever Python accepts.
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def json_error(body_packed: bytes) -> str | None:
    """Why this body has no form a target can send (None when it has one)."""
    value = _unpack(body_packed)
    if type(value) in (bytes, str):
        return None
    try:
        _json_bytes(value)
    except (TypeError, ValueError) as exc:
        return f"the body has no JSON form ({exc})"
    return None


def encode(body_packed: bytes) -> tuple[bytes, str]:
    """The body's bytes on the wire and their content type."""
    value = _unpack(body_packed)
    if type(value) is bytes:
        return value, OCTET_STREAM
    if type(value) is str:
        return value.encode(), TEXT
    return _json_bytes(value), JSON
