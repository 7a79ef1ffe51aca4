"""What a delivery is, and what every sender does with one."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import quote


@dataclass(frozen=True, slots=True)
class Delivery:
    """One attempt to deliver one task, as the engine journaled it.

    ``target`` is the checked target map (``targets.check``): its ``type``
    says which sender takes it. ``attempt`` counts from 1; a receiver sees it,
    and may drop a repeat of a task id it has already handled.
    """

    task_id: str
    topic: str
    attempt: int
    at_s: float  # the task's due time (Unix s)
    body_packed: bytes  # the body as MessagePack, as the task holds it
    target: dict[str, Any]


# A task's id and topic in a header (HTTP's Delaywheel-Id and -Topic, NATS's
# Nats-Msg-Id and Delaywheel-Topic): header values are stripped and cannot
# hold line breaks or other control characters, so " t-8" would arrive as
# "t-8", and a receiver deduplicating by id would take two tasks for one.
# Those characters (and "%", so that decoding is exact) go percent-encoded,
# and urllib.parse.unquote gives the id back; ids without them, which is
# nearly all, go out unchanged (docs/protocol.md, "Ids in headers").
_NEEDS_QUOTING = re.compile(r"[%\x00-\x1f\x7f]|^\s|\s$")
_QUOTED_INSIDE = re.compile(r"[%\x00-\x08\x0a-\x1f\x7f]")  # HTAB inside is a fine value


def header_value(text: str) -> str:
    """``text`` safe as a header value that arrives exactly (docs/protocol.md)."""
    if not _NEEDS_QUOTING.search(text):
        return text
    start, end = len(text) - len(text.lstrip()), len(text.rstrip())
    return "".join(
        quote(char, safe="") if _QUOTED_INSIDE.match(char) or not start <= i < end else char
        for i, char in enumerate(text)
    )


class DeliveryFailed(Exception):
    """A failed attempt. The message says why, for the log and ``get``; it
    never holds a password, a token or the body."""


class Sender(Protocol):
    """Delivers to one kind of target (HTTP) or one named broker."""

    async def send(self, delivery: Delivery) -> None:
        """Return once the receiver has taken the task (2xx, a broker's
        confirmation); raise ``DeliveryFailed`` for anything else. Must not
        raise anything but ``DeliveryFailed`` and ``asyncio.CancelledError``."""
        ...

    def state(self) -> dict[str, Any]:
        """What ``stats`` shows of this sender (no secrets)."""
        ...

    async def close(self) -> None:
        """Release connections; called once, at shutdown, after the grace period."""
        ...
