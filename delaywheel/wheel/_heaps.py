"""The time wheel's two lazy heaps: where to look next (see ``delaywheel.wheel.wheel``).

``RingTicks`` holds the fire ticks of ring slots that hold something;
``BucketKeys`` holds the keys of the buckets above the ring. Both are lazy: an
item whose slot or bucket has since emptied stays in the heap until it
surfaces at the top, where ``peek`` drops it; a heap that has grown well past
what it can refer to is rebuilt from what is live. The wheel reads ``heap``
directly on its hot path (``TimingWheel._due_slots``), so ``heap`` is one list for the
heap's whole life: a rebuild refills it in place.
"""

from __future__ import annotations

from heapq import heappop, heappush

from delaywheel.wheel._lists import _Head


class RingTicks:
    """A lazy min-heap of the fire ticks of non-empty ring slots."""

    __slots__ = ("_limit", "_ring", "_slots", "heap")

    def __init__(self, ring: list[_Head]) -> None:
        self.heap: list[int] = []
        self._ring = ring
        self._slots = len(ring)
        self._limit = 2 * self._slots + 64

    def push(self, tick: int, cursor: int) -> None:
        self.trim(cursor)
        heappush(self.heap, tick)

    def trim(self, cursor: int) -> None:
        """Rebuild the heap if it has grown well past the ring."""
        if len(self.heap) > self._limit:
            # Refill-after-empty left stale duplicates: rebuild from the slots.
            heap = self.heap
            heap[:] = sorted({t for t in heap if self.live(t, cursor)})

    def live(self, tick: int, cursor: int) -> bool:
        # A slot holds timers of one fire tick in (cursor, cursor + slots], so a
        # non-empty slot and a tick past the cursor identify each other.
        head = self._ring[tick % self._slots]
        return tick > cursor and head._next is not head

    def peek(self, cursor: int) -> int | None:
        """The next live ring tick, dropping stale ones on the way."""
        heap = self.heap
        while heap:
            tick = heap[0]
            if self.live(tick, cursor):
                return tick
            heappop(heap)
        return None


class BucketKeys:
    """A lazy min-heap of the keys of ``buckets`` (the dict it is given)."""

    __slots__ = ("_buckets", "heap")

    def __init__(self, buckets: dict[int, _Head]) -> None:
        self.heap: list[int] = []
        self._buckets = buckets

    def push(self, key: int) -> None:
        heap = self.heap
        if len(heap) > 2 * len(self._buckets) + 64:
            heap[:] = sorted(self._buckets)
        heappush(heap, key)

    def peek(self) -> int | None:
        """The least key still in ``buckets``, dropping stale ones on the way."""
        heap, buckets = self.heap, self._buckets
        while heap:
            key = heap[0]
            if key in buckets:
                return key
            heappop(heap)
        return None

    def pop(self) -> int:
        """Remove and return the top key (call ``peek`` first: it may be stale)."""
        return heappop(self.heap)
