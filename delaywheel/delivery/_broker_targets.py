"""Checking a broker target map at ``add`` (docs/protocol.md, "Delivery targets").

The checked map has every field, defaults filled in, so a sender reads it
without a default of its own. Every refusal is ``bad_request`` naming the
field and the offending value, and, for a broker, which brokers there are.

Limits: a Redis key or NATS subject is 1 to 1024 bytes (ample for a name; a
longer one is a mistake). AMQP exchange names and routing keys are short
strings on the wire, at most 255 bytes, so that is their limit.
"""

from __future__ import annotations

import re
from typing import Any

from delaywheel.checks import bad, show
from delaywheel.errors import RequestError

MAX_NAME_BYTES = 1024  # a Redis key, a NATS subject
MAX_SHORTSTR_BYTES = 255  # AMQP's shortstr: an exchange name, a routing key
MODES = ("list", "stream")
FIELDS = {
    "redis": ("type", "key", "mode", "broker"),
    "amqp": ("type", "broker", "exchange", "routing_key"),
    "nats": ("type", "broker", "subject"),
}
# A NATS subject to publish to: dot-separated tokens, none empty, no
# whitespace (CR/LF would end the protocol line) and no wildcard.
_SUBJECT_TOKEN = re.compile(r"[^\s.*>]+")


def check_target(value: dict[str, Any], kinds: dict[str, str], store_keys: str) -> dict[str, Any]:
    """``value`` checked against the brokers in ``kinds`` ({name: kind}).

    ``store_keys`` is the prefix of the store's own Redis keys, which a
    ``store`` target may not write to.
    """
    kind = value.get("type")
    if kind not in FIELDS:
        raise bad(f"target type must be one of {', '.join(FIELDS)}, got {show(kind)}")
    for field in sorted(value, key=str):
        if field not in FIELDS[kind]:
            wanted = ", ".join(FIELDS[kind])
            raise bad(f"target has unknown field {show(field)}; a {kind} target takes {wanted}")
    if kind == "redis":
        broker = _broker(value.get("broker", "store"), "redis", kinds)
        key = _text(value.get("key"), "key", 1, MAX_NAME_BYTES)
        if broker == "store" and key.startswith(store_keys):
            raise bad(f"target key {show(key)} is one of the store's own keys ({store_keys}...)")
        mode = value.get("mode", "list")
        if mode not in MODES:
            raise bad(f"target mode must be 'list' or 'stream', got {show(mode)}")
        return {"type": "redis", "key": key, "mode": mode, "broker": broker}
    if kind == "amqp":
        return {
            "type": "amqp",
            "broker": _broker(value.get("broker"), "amqp", kinds),
            "exchange": _text(value.get("exchange", ""), "exchange", 0, MAX_SHORTSTR_BYTES),
            "routing_key": _text(value.get("routing_key"), "routing_key", 1, MAX_SHORTSTR_BYTES),
        }
    return {
        "type": "nats",
        "broker": _broker(value.get("broker"), "nats", kinds),
        "subject": _subject(value.get("subject")),
    }


def _text(value: Any, field: str, least: int, most: int) -> str:
    try:
        size = len(value.encode()) if type(value) is str else -1
    except UnicodeEncodeError:  # a lone surrogate: no broker could take it
        size = -1
    if not least <= size <= most:
        raise bad(f"target {field} must be a str of {least} to {most} bytes, got {show(value)}")
    return value  # type: ignore[no-any-return]


def _subject(value: Any) -> str:
    subject = _text(value, "subject", 1, MAX_NAME_BYTES)
    if not all(_SUBJECT_TOKEN.fullmatch(token) for token in subject.split(".")):
        raise bad(
            "target subject must be dot-separated tokens without spaces, empty tokens"
            f" or wildcards (* >), got {show(subject)}"
        )
    if subject.startswith("$"):  # $JS.API..., $SYS...: a publish there is a command
        raise bad(f"target subject must not start with '$' (NATS's own API), got {show(subject)}")
    return subject


def _broker(name: Any, kind: str, kinds: dict[str, str]) -> str:
    if type(name) is not str:
        raise bad(f"target broker must be a broker's name (a str), got {show(name)}")
    found = kinds.get(name)
    if found is None:
        raise _unknown(name, kinds)
    if found != kind:
        raise bad(f"target broker {show(name)} is {found}, not {kind}")
    return name


def _unknown(name: str, kinds: dict[str, str]) -> RequestError:
    have = ", ".join(f"{other!r} ({kinds[other]})" for other in sorted(kinds))
    listing = f"this server has {have}" if have else "this server has no brokers"
    if name == "store":
        return bad(
            f"target broker 'store' is unknown: the store is not Redis; {listing};"
            " use --broker NAME with --broker NAME=redis://... on the server"
        )
    return bad(f"target broker {show(name)} is unknown; {listing}")
