"""What a delivery is, and what every sender does with one."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import quote

from delaywheel.schedules.occurrence import Occurrence


@dataclass(frozen=True, slots=True)
class Delivery:
    """One attempt to deliver one task, as the engine journaled it.

    ``target`` is the checked target map (``targets.check``): its ``type``
    says which sender takes it. ``attempt`` counts from 1; a receiver sees it,
    and may drop a repeat of a task id it has already handled. ``epoch`` is
    the partition's epoch at the node that journaled the attempt (0 on a
    single-node store, which has no epochs): a receiver seeing a lower epoch
    than it has seen for the id is hearing from a deposed owner.
    ``occurrence`` is set for a schedule's occurrence only.
    ``result_bytes``: how much of the receiver's answer to keep as the
    task's result (0: none, the task is not kept once delivered).
    """

    task_id: str
    topic: str
    attempt: int
    at_s: float  # the task's due time (Unix s)
    body_packed: bytes  # the body as MessagePack, as the task holds it
    target: dict[str, Any]
    epoch: int = 0
    occurrence: Occurrence | None = None
    result_bytes: int = 0


# What a receiver answered a delivered attempt: its outcome as the task shows
# it (``HTTP 200``) and the result kept with the task (None: none).
Answer = tuple[str, Any]
# A broker's confirmation: no answer of its own.
PUBLISHED: Answer = ("published", None)


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


def occurrence_headers(occurrence: Occurrence, now_s: float) -> dict[str, str]:
    """An occurrence's HTTP and NATS headers (docs/delivery.md), ``Delaywheel-Late-By``
    counted to ``now_s``, when the attempt goes out."""
    return {
        "Delaywheel-Schedule": header_value(occurrence.schedule_id),
        "Delaywheel-Nominal": occurrence.nominal_utc,
        "Delaywheel-Nominal-Local": occurrence.nominal_local,
        "Delaywheel-Late-By": f"{occurrence.late_by_s(now_s):.3f}",
    }


class DeliveryFailed(Exception):
    """A failed attempt. The message says why, for the log and ``get``; it
    never holds a password, a token or the body."""


class Sender(Protocol):
    """Delivers to one kind of target (HTTP) or one named broker."""

    async def send(self, delivery: Delivery) -> Answer | None:
        """Return once the receiver has taken the task (2xx, a broker's
        confirmation), with its answer (None: ``PUBLISHED``); raise
        ``DeliveryFailed`` for anything else. Must not
        raise anything but ``DeliveryFailed`` and ``asyncio.CancelledError``."""
        ...

    def state(self) -> dict[str, Any]:
        """What ``stats`` shows of this sender (no secrets)."""
        ...

    async def close(self) -> None:
        """Release connections; called once, at shutdown, after the grace period."""
        ...
