"""The linked lists the time wheel is made of (see ``delaywheel.wheel.wheel``).

Every ring slot, every bucket above the ring and the overdue list is a circular
doubly linked list whose nodes are the timers themselves, so unlinking one is
O(1) with no search. ``move_front`` is the wheel's one bulk operation: it moves
timers from the front of a bucket to the ring slots of their fire ticks, and
``move_budget`` says how many an advance moves.

A ring slot or the overdue list also knows whether it is *in order*: whether
its entries, front to back, are in due order (ties in the order they were
appended, which is the order they were scheduled). Appending keeps the flag
at the cost of one comparison; an advance with a limit needs it to fire the
front of a list as its earliest entries (see ``_fire``).
"""

from __future__ import annotations

from heapq import heappush
from typing import Any

from delaywheel.wheel._ticks import tick_ceil


class _Node:
    """A link in a circular doubly linked list (entries and list heads alike)."""

    __slots__ = ("_next", "_prev")

    _prev: _Node
    _next: _Node


class _Head(_Node):
    """The head of one list: a ring slot, a bucket, or the overdue list.

    ``key`` is a bucket's span number (its ticks are ``key * span`` to
    ``key * span + span - 1``), or -1 for ring slots and the overdue list.
    ``count`` is how many entries a bucket holds (kept for buckets only).
    ``in_order`` says the entries are in due order, front to back (kept for
    ring slots and the overdue list only, and meaningful only while the list
    is not empty: see the module docstring).
    """

    __slots__ = ("count", "in_order", "key")

    def __init__(self, key: int = -1) -> None:
        self._prev = self._next = self
        self.key = key
        self.count = 0
        self.in_order = True

    def drain_into(self, out: list[Any]) -> None:
        """Unlink every entry and append them to ``out``, in list order.

        Each entry's links are dropped, not left pointing at its old
        neighbours: entries still linked to each other would form reference
        cycles, which only the cyclic collector frees, and the server freezes
        the tasks it loads at start out of that collector's reach. Without
        links, a task is freed the moment nothing else holds it.
        """
        append = out.append
        node: Any = self._next
        while node is not self:
            append(node)
            node._home = None
            nxt = node._next
            del node._prev, node._next
            node = nxt
        self._prev = self._next = self


class Entry(_Node):
    """A timer. Subclass it (with ``__slots__``) to hang your own data on it.

    ``due_s`` is set by the wheel on insert; read it, do not write it while the
    entry is scheduled.
    """

    __slots__ = ("_home", "due_s")

    def __init__(self) -> None:
        self.due_s = 0.0
        self._home: _Head | None = None

    @property
    def scheduled(self) -> bool:
        return self._home is not None


def append(home: _Head, entry: Entry) -> None:
    """Link ``entry`` at the end of ``home``'s list, and keep its ``in_order``."""
    last = home._prev
    if last is home:
        home.in_order = True  # an empty list is in order, whatever it held before
    elif entry.due_s < last.due_s:  # type: ignore[attr-defined]
        home.in_order = False
    entry._prev = last
    entry._next = home
    last._next = entry
    home._prev = entry
    entry._home = home


def move_front(
    bucket: _Head, n: int, ring: list[_Head], tick_s: float, cursor: int, ring_ticks: list[int]
) -> None:
    """Move the first ``n`` entries of ``bucket`` to the end of their ring slots.

    Each goes to the slot of its fire tick (``tick_ceil(due_s)``, never at or
    before ``cursor``); a slot that was empty gets its tick
    pushed on the ``ring_ticks`` heap. The caller guarantees that every fire
    tick is within ``(cursor, cursor + len(ring)]`` and keeps the counts.
    Each slot's ``in_order`` is kept as ``append`` keeps it.
    """
    slots = len(ring)
    first = cursor + 1
    node: Any = bucket._next  # Entry nodes, typed loosely to keep the loop lean
    for _ in range(n):
        nxt = node._next
        due = node.due_s
        tick = tick_ceil(due, tick_s)
        if tick < first:  # float edge, as on insert
            tick = first
        home = ring[tick % slots]
        last: Any = home._prev  # an Entry, or the head itself (loosely typed, as node)
        if last is home:
            heappush(ring_ticks, tick)
            home.in_order = True
        elif due < last.due_s:
            home.in_order = False
        node._prev = last
        node._next = home
        last._next = node
        home._prev = node
        node._home = home
        node = nxt
    bucket._next = node
    node._prev = bucket
    bucket.count -= n


def move_budget(
    buckets: dict[int, _Head], span: int, cursor: int, first: int, last: int, least: int
) -> int:
    """Enough that advancing once a tick moves every bucket before its deadline.

    Buckets ``first`` to ``last`` are within the ring's reach. Earliest
    deadline first, bucket ``k`` and all before it must be moved by the advance
    that leaves the cursor just short of ``k``'s first tick: that is
    ``k * span - cursor`` advances counting this one. Served at this rate once
    a tick, no bucket's rate rises, so the budget (never below ``least``)
    rises only when a bucket comes within reach or a timer joins one.
    """
    budget = least
    queued = 0
    for key in range(first, last + 1):  # at most slots // span + 1 keys
        bucket = buckets.get(key)
        if bucket is not None:
            queued += bucket.count
            budget = max(budget, -(-queued // (key * span - cursor)))
    return budget
