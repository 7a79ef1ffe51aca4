"""What a delivery is, and what every sender does with one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


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
