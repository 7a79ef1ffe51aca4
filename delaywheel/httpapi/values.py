"""JSON in and out: task bodies, list cursors and query values, as the protocol has them.

A body is any MessagePack value; JSON holds most of them as they are. The rest travel
base64'd, said by ``body_encoding`` beside the body:

- ``"base64"``: the body is bytes (MessagePack bin);
- ``"msgpack"``: the body's MessagePack encoding, for a value JSON cannot hold (a map with
  keys that are not strings, bin inside a map or list, an ext type, a float that is not
  finite, an int past 64 bits, nesting deeper than ``MAX_JSON_DEPTH``).

So a body added over HTTP and read over the protocol (and back) is the same value.
A ``list`` or ``schedule_list`` cursor is handed out opaque: the protocol's ``next``
(an int, an id, or a cluster client's ``[address, cursor]``) as base64url JSON.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Mapping
from typing import Any

import msgpack  # type: ignore[import-untyped, unused-ignore]

from delaywheel.checks import show
from delaywheel.errors import RequestError

BODY_ENCODINGS = ("base64", "msgpack")
# Deeper bodies go as "msgpack": JSON encoders recurse, and a reader's stack is not ours.
MAX_JSON_DEPTH = 64
_INT_LOW, _INT_HIGH = -(2**63), 2**64 - 1


class BadInput(RequestError):
    """A request the HTTP layer cannot turn into the protocol's params: 400, not 422."""

    def __init__(self, message: str) -> None:
        super().__init__("bad_request", message)


def body_in(fields: Mapping[str, Any], where: str = "") -> dict[str, Any]:
    """A task (or schedule, or changes) map from JSON: its ``body`` decoded as its
    ``body_encoding`` says, which is removed. Every other field is left for the
    protocol's own checks."""
    encoding = fields.get("body_encoding")
    if "body_encoding" not in fields:
        return dict(fields)
    out = {key: value for key, value in fields.items() if key != "body_encoding"}
    if encoding not in BODY_ENCODINGS:
        raise BadInput(
            f"{where}body_encoding must be one of {', '.join(BODY_ENCODINGS)}, got {show(encoding)}"
        )
    text = out.get("body")
    if type(text) is not str:
        raise BadInput(
            f"{where}body with body_encoding {encoding} must be a base64 string, got {show(text)}"
        )
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise BadInput(f"{where}body is not base64: {show(text)}") from None
    if encoding == "base64":
        out["body"] = raw
        return out
    try:
        out["body"] = msgpack.unpackb(raw, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several kinds for bad input
        raise BadInput(f"{where}body is not one MessagePack value: {exc}") from None
    return out


def body_out(fields: dict[str, Any]) -> dict[str, Any]:
    """A task (or schedule) map for JSON: its ``body`` (and a done task's
    ``result``) as JSON holds it, or base64'd with ``body_encoding``
    (``result_encoding``; see the module docstring)."""
    fields = _encoded(fields, "body")
    return _encoded(fields, "result") if fields.get("result") is not None else fields


def _encoded(fields: dict[str, Any], name: str) -> dict[str, Any]:
    if name not in fields:
        return fields
    value = fields[name]
    if isinstance(value, bytes):
        return fields | {name: _b64(value), f"{name}_encoding": "base64"}
    if _json_safe(value):
        return fields
    packed = msgpack.packb(value, use_bin_type=True)
    return fields | {name: _b64(packed), f"{name}_encoding": "msgpack"}


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _json_safe(value: Any) -> bool:
    """True when JSON holds ``value`` exactly (walked without recursion)."""
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        kind = type(item)
        if item is None or kind is bool or kind is str:
            continue
        if kind is int:
            if not _INT_LOW <= item <= _INT_HIGH:
                return False
            continue
        if kind is float:
            if not math.isfinite(item):
                return False
            continue
        if depth >= MAX_JSON_DEPTH:
            return False
        if kind is list:
            stack.extend((x, depth + 1) for x in item)
        elif kind is dict:
            if not all(type(k) is str for k in item):
                return False
            stack.extend((x, depth + 1) for x in item.values())
        else:  # bytes inside, ext types, tuples
            return False
    return True


def cursor_out(cursor: Any) -> str | None:
    """The protocol's ``next`` as an opaque string (None: the last page)."""
    if cursor is None:
        return None
    return base64.urlsafe_b64encode(json.dumps(cursor).encode()).decode("ascii").rstrip("=")


def cursor_in(text: str | None) -> Any:
    """A cursor from ``cursor_out`` back to the protocol's (None when not given)."""
    if text is None or text == "":
        return None
    try:
        return json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    except (binascii.Error, ValueError):
        raise BadInput(f"cursor must be a value returned as next, got {show(text)}") from None


def query_number(name: str, text: str | None) -> Any:
    """A number from the query string: an int when it is one, a float, or the text as
    it is (so that the protocol's own check names it), None when not given."""
    if text is None:
        return None
    for kind in (int, float):
        try:
            number = kind(text)
        except ValueError:
            continue
        if kind is float and not math.isfinite(number):
            break
        return number
    return text


def query_bool(name: str, text: str | None) -> Any:
    """``true``/``false`` from the query string, else the text as it is, or None."""
    if text is None:
        return None
    return {"true": True, "false": False}.get(text.lower(), text)
