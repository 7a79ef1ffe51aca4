"""What high availability asks of the engine and of the server: Protocols only.

``ha`` is below the engine and imports nothing of it: the coordinator and
its parts ask the engine only what ``Host`` names (docs/layout.md).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Collection, Iterable
from typing import Protocol, TypeVar

from delaywheel.ha.seats import SeatHost


class HasId(Protocol):
    @property
    def id(self) -> str: ...


Kept = TypeVar("Kept", bound=HasId)


class Host(SeatHost, Protocol[Kept]):
    """What the coordinator asks of the engine (engine/engine.py keeps it).

    ``Kept`` is the engine's task: the coordinator holds the ones a handoff
    keeps (their attempts in flight) and gives them back by id."""

    async def load_partition(
        self, batches: AsyncIterator[list[tuple[str, bytes]]], partition: int | None = None
    ) -> int:
        """Add a partition's tasks from the store's records (its near tier),
        then its far tier up to the horizon when ``partition`` is given; how many."""
        ...

    def drop_partitions(
        self,
        partitions: Collection[int],
        *,
        keep_delivering: bool = False,
        among: Iterable[str] | None = None,
    ) -> list[Kept]:
        """Forget the tasks of ``partitions``; with ``keep_delivering`` those
        whose attempts are in flight stay and are returned; ``among``: only
        these ids are looked at."""
        ...

    def sending(self, kept: list[Kept]) -> list[Kept]:
        """Those of ``kept`` whose attempt this node is sending now (not one held
        to a deadline, nor one whose send ended and whose outcome's write failed)."""
        ...

    async def drain(self, partitions: Collection[int] | None = None) -> None:
        """Wait until every change made so far (of ``partitions``) is durable (or failed)."""
        ...

    def topic_records(self) -> dict[str, bytes]:
        """The records of the topic settings held here, by topic."""
        ...

    def topics_shared(self, elsewhere: dict[str, bytes]) -> None:
        """The settings the other nodes publish, by topic, read after a look at
        the partitions' owners: apply both."""
        ...


class StopsFirst(Protocol):
    """The server, whose stop runs first, within the node's bound (net/server.py)."""

    async def stop(self, until_s: float | None = None) -> str | None: ...
