"""A Redis store's owner for tests (delaywheel/store/redis/owner.py): the epochs
are the test's to set, and the store's calls are recorded."""

from __future__ import annotations

from delaywheel.store.redis import Holders


class RecordingOwner:
    def __init__(self) -> None:
        self.epochs: dict[int, int] = {}
        self.fenced_calls: list[tuple[set[int], Holders]] = []
        self.primaries: list[tuple[str, int]] = []

    def fenced(self, fenced: set[int], holders: Holders) -> None:
        self.fenced_calls.append((fenced, holders))

    def primary_changed(self, host: str, port: int) -> None:
        self.primaries.append((host, port))
