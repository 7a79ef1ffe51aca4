"""Flow control: what a topic's settings hold back (engine/topics.py).

A topic's gate is shut while it is paused, while it has ``concurrency``
tasks reserved or delivering (the task counts say how many), or while its
token bucket is empty: the bucket holds up to ``burst`` tokens, gains
``rate`` a second, and each task handed out takes one. ``reserve`` looks
only at the topics whose gate is open (``open_topics``); a blocked
reserve waits on, and is answered when a gate opens: by a slot freed (an
ack, a release, an expired TTR, a delete), by time (a timed pause's end,
a token; ``next_open_s`` tells the ticker when) or by a change of the
settings.

Only topics whose settings can hold anything back are in ``limited``: with
none, the checks cost the hot paths one empty-dict test. Nothing here
changes a task: a task waiting on a gate is ready (counted so) and keeps
its TTR, attempts and place in its queue.

On several nodes a gate holds this node's share of the limits
(engine/shares.py), made again when the partitions it serves, or those it
knows the others serve, change (``reshare``). A concurrency below the
number of nodes serving partitions is not split but handed between them
(ha/seats.py): its gate holds the seats this node has now (``seat``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from delaywheel.engine.index import TaskCounts
from delaywheel.engine.shares import ALONE, Basis, Gate, gate_of, handed
from delaywheel.engine.task import DELIVERING, READY, RESERVED
from delaywheel.engine.topics import PAUSED_FOR_EVER_S, TopicSettings


def _alone() -> Basis:
    return ALONE


class Flow:
    def __init__(self, counts: TaskCounts, basis: Callable[[], Basis] = _alone) -> None:
        self._counts = counts
        self._basis_now = basis  # who serves what, now (the engine's ownership)
        self._basis = basis()
        self.limited: dict[str, Gate] = {}  # only topics that hold something back
        self._settings: dict[str, TopicSettings] = {}  # theirs, whole
        self._buckets: dict[str, tuple[float, float]] = {}  # topic: (tokens, as of when)
        # Topics whose gate may have opened since the last look (a settings
        # change, a slot freed): their waiters are looked at again.
        self.woken: set[str] = set()
        # Deliveries let through a topic's gate whose attempt has not begun
        # (engine/attempts.py): in its flight already.
        self._starting: dict[str, int] = {}
        # The seats this node holds of the topics whose concurrency is handed
        # between the nodes (ha/seats.py); a topic not here holds none.
        self._seats: dict[str, int] = {}

    def changed(self, topic: str, settings: TopicSettings) -> None:
        """A topic's settings changed (``TopicTable``): keep them if they hold back."""
        if settings.limits():
            before = self._settings.get(topic)
            self._settings[topic] = settings
            self.limited[topic] = self._gate(topic, settings)
            if before is not None and (before.rate, before.burst) != (
                settings.rate,
                settings.burst,
            ):
                self._buckets.pop(topic, None)  # a new bucket, full
        else:
            self._settings.pop(topic, None)
            self.limited.pop(topic, None)
            self._buckets.pop(topic, None)
        self.woken.add(topic)

    def reshare(self) -> None:
        """The partitions served here or elsewhere may have changed: each gate
        anew, for this node's share (a bucket keeps its tokens, up to its new burst)."""
        basis = self._basis_now()
        if basis == self._basis:
            return
        self._basis = basis
        for topic, settings in self._settings.items():
            self.limited[topic] = self._gate(topic, settings)
            self.woken.add(topic)

    def _gate(self, topic: str, settings: TopicSettings) -> Gate:
        return gate_of(topic, settings, self._basis, self._seats.get(topic, 0))

    def handed(self) -> dict[str, int]:
        """The topics whose concurrency is handed between the nodes (below the
        number of nodes serving partitions), with that concurrency."""
        return {
            topic: settings.concurrency
            for topic, settings in self._settings.items()
            if settings.concurrency is not None and handed(settings, self._basis)
        }

    def seat(self, topic: str, seats: int) -> None:
        """This node holds ``seats`` of ``topic``'s handed concurrency now: its
        gate lets that many be in flight (woken when it opens wider)."""
        if seats:
            self._seats[topic] = seats
        else:
            self._seats.pop(topic, None)
        settings = self._settings.get(topic)
        if settings is None:
            return
        before = self.limited[topic]
        gate = self._gate(topic, settings)
        self.limited[topic] = gate
        if (gate.concurrency or 0) > (before.concurrency or 0):
            self.woken.add(topic)

    def shares(self) -> dict[str, dict[str, float | int | None]]:
        """What this node applies to each limited topic, for ``stats``."""
        return {topic: gate.to_map() for topic, gate in sorted(self.limited.items())}

    def freed(self, topic: str) -> None:
        """A task of ``topic`` left ``reserved`` or ``delivering``: a slot may be free."""
        if topic in self.limited:
            self.woken.add(topic)

    def is_open(self, topic: str, now_s: float) -> bool:
        gate = self.limited.get(topic)
        if gate is None:
            return True
        if gate.paused(now_s):
            return False
        if gate.concurrency is not None and self.in_flight(topic) >= gate.concurrency:
            return False
        return gate.rate is None or self._tokens(topic, gate, now_s) >= 1.0

    def open_topics(self, topics: Iterable[str], now_s: float) -> list[str]:
        return [topic for topic in topics if self.is_open(topic, now_s)]

    def took(self, topic: str, now_s: float) -> None:
        """A task of ``topic`` was handed out: one token less."""
        gate = self.limited.get(topic)
        if gate is not None and gate.rate is not None:
            self._buckets[topic] = (self._tokens(topic, gate, now_s) - 1.0, now_s)

    def starting(self, topic: str, n: int) -> None:
        """``n`` more (or fewer) deliveries of ``topic`` let through, not begun."""
        left = self._starting.get(topic, 0) + n
        if left:
            self._starting[topic] = left
        else:
            self._starting.pop(topic, None)

    def in_flight(self, topic: str) -> int:
        counts = self._counts.of_topic(topic)
        return counts.get(RESERVED, 0) + counts.get(DELIVERING, 0) + self._starting.get(topic, 0)

    def _tokens(self, topic: str, gate: Gate, now_s: float) -> float:
        assert gate.rate is not None
        tokens, as_of_s = self._buckets.get(topic, (float(gate.burst), now_s))
        return min(float(gate.burst), tokens + max(0.0, now_s - as_of_s) * gate.rate)

    def next_open_s(self, now_s: float, waiting: Callable[[str], bool]) -> float | None:
        """When the first shut gate of a topic with something ``waiting`` opens
        by time alone (a timed pause ends, a token comes); None: none will."""
        first: float | None = None
        for topic, gate in self.limited.items():
            if not waiting(topic):
                continue
            when_s: float | None = None
            if gate.paused(now_s):
                if gate.paused_until is not None and gate.paused_until < PAUSED_FOR_EVER_S:
                    when_s = gate.paused_until
            elif gate.rate:  # a share of 0 (no partition here) never opens by time
                tokens = self._tokens(topic, gate, now_s)
                if tokens < 1.0:
                    when_s = now_s + (1.0 - tokens) / gate.rate
            if when_s is not None and (first is None or when_s < first):
                first = when_s
        return first

    def opened(self, now_s: float, waiting: Callable[[str], bool]) -> list[str]:
        """The limited topics with something ``waiting`` whose gate is open now,
        and those woken since the last call."""
        woken, self.woken = self.woken, set()
        for topic in self.limited:
            if waiting(topic) and self.is_open(topic, now_s):
                woken.add(topic)
        return list(woken)

    def ready_count(self, topic: str) -> int:
        return self._counts.of_topic(topic).get(READY, 0)
