"""The replicas behind ``--replicas N``: whether a failover would stop writes, and
whether writes are refused now for lack of them.

With ``--replicas N`` every write waits for N replicas (``WAIT``), and a
failover turns one replica into the primary: a primary with N replicas or
fewer connected is one failover away from refusing every write (the promoted
replica has N - 1 or fewer), until a replica connects to it (the old primary
restarted, say). That is the layout the docs warn about (docs/ha.md, "How
many replicas"); the node says so in the log, one line under
``delaywheel.cluster`` at start and whenever a primary's count changes:

- ``Redis primary H:P has C replica(s) connected and --replicas N: a
  failover of it would stop every write to it ...`` (a warning, C == N);
- ``... has C replica(s) connected, fewer than --replicas N: every write to
  it is refused ...`` (a warning, C < N; not at start, where the store's
  start-up warning says the same);
- ``... has C replica(s) connected: a failover keeps writes`` (info, C > N,
  on a change only).

The primaries of a Cluster in the same state at one look are one line
(``Redis primaries A (1), B (1) have that many replica(s) ...``).

While writes are refused for lack of replicas (``WAIT`` confirmed fewer than
N in its second: the store counts them, ``RedisStore.short_of_replicas``),
one warning when it begins and one every ``REFUSED_LINE_EVERY_S`` while it
lasts: ``writes refused for lack of replicas: W writes in S s confirmed by
fewer than N replica(s) (WAIT), answered unavailable; primary H:P has C
replica(s) connected``, and one info line when writes are confirmed again.

The watch runs in a loop of its own (``CHECK_EVERY_S``), not in the
coordinator's rounds: an INFO to a primary that died waits out its timeout,
and the rounds must go on claiming meanwhile. ``observe`` is the pure part.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from delaywheel.cancelling import cancel_and_wait

log = logging.getLogger("delaywheel.cluster")

# How often the replicas connected to each primary are read (INFO replication).
CHECK_EVERY_S = 2.0
# While writes are refused for lack of replicas, the line says so again this often.
REFUSED_LINE_EVERY_S = 10.0

# Each primary's host:port -> replicas connected to it (a topology's ``replicas_connected``).
ReadCounts = Callable[[], Awaitable[dict[str, int]]]


class ReplicaWatch:
    def __init__(
        self,
        wanted: int,
        read_counts: ReadCounts,
        refused: Callable[[], int],
        confirmed: Callable[[], int],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``wanted``: ``--replicas``; ``read_counts``: each primary's replicas;
        ``refused``: the writes refused for lack of replicas so far (a count);
        ``confirmed``: the writes confirmed in full so far."""
        self.wanted = wanted
        self._read_counts = read_counts
        self._refused = refused
        self._confirmed = confirmed
        self._clock = clock
        self.connected: dict[str, int] = {}  # as last read
        self._seen = False  # a first reading was made
        self._refused_seen = 0  # the count at the last look
        self._confirmed_seen = 0  # likewise
        self._refusing_since_s: float | None = None
        self._refused_in_line = 0  # refused since the last line said so
        self._line_s = 0.0  # when the last refusal line was written
        self._refused_since = 0  # refused since refusing began
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            # An INFO in flight can swallow a cancel (redis-py, delaywheel/cancelling.py):
            # cancelled until it ends, within a bound, and the loop ends on _task too.
            await cancel_and_wait({task})

    async def _run(self) -> None:
        while self._task is asyncio.current_task():
            try:
                counts: Mapping[str, int] | None = await self._read_counts()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Redis away: the store's own lines say so
                log.debug("reading the replicas connected failed: %r", exc)
                counts = None
            self.observe(counts, self._refused(), self._confirmed())
            await asyncio.sleep(CHECK_EVERY_S)

    def observe(self, counts: Mapping[str, int] | None, refused: int, confirmed: int) -> None:
        """One look: ``counts`` (None: not read this time), the refusals and the
        confirmed writes so far."""
        if counts is not None:
            self._counts_seen(counts)
        self._refusals_seen(refused, confirmed)

    def _counts_seen(self, counts: Mapping[str, int]) -> None:
        """One line per kind of change (a Cluster's primaries together)."""
        first, self._seen = not self._seen, True
        wanted = self.wanted
        changed = [(p, n) for p, n in sorted(counts.items()) if self.connected.get(p) != n]
        self.connected = dict(counts)
        if not wanted:
            return
        # Fewer than wanted at start is the store's own start-up warning.
        short = [(p, n) for p, n in changed if n < wanted and not first]
        at_risk = [(p, n) for p, n in changed if n == wanted]
        safe = [(p, n) for p, n in changed if n > wanted and not first]
        if short:
            log.warning(
                "%s connected, fewer than --replicas %d: every write %s is refused"
                " (unavailable) until %d connect",
                *(_said(short), wanted, _to(short), wanted),
                extra=_fields(short, wanted, failover_stops_writes=True),
            )
        if at_risk:
            log.warning(
                "%s connected and --replicas %d: a failover of %s would stop every write"
                " %s (the promoted replica would have %d) until a replica connects to the"
                " new primary; run at least %d replicas",
                *(_said(at_risk), wanted, _it(at_risk), _to(at_risk), wanted - 1, wanted + 1),
                extra=_fields(at_risk, wanted, failover_stops_writes=True),
            )
        if safe:
            log.info(
                "%s connected: a failover keeps writes (--replicas %d)",
                *(_said(safe), wanted),
                extra=_fields(safe, wanted, failover_stops_writes=False),
            )

    def _refusals_seen(self, refused: int, confirmed: int) -> None:
        now_s = self._clock()
        new, self._refused_seen = refused - self._refused_seen, refused
        # A look with no refusal is not a write confirmed: no write may have been made.
        confirmed_any = confirmed > self._confirmed_seen
        self._confirmed_seen = confirmed
        if new > 0:
            self._refused_in_line += new
            self._refused_since += new
            if self._refusing_since_s is None:
                self._refusing_since_s = self._line_s = now_s
                self._refused_line(now_s, 0.0)
            elif now_s - self._line_s >= REFUSED_LINE_EVERY_S:
                self._refused_line(now_s, now_s - self._line_s)
        elif self._refusing_since_s is not None and confirmed_any:
            took_s = now_s - self._refusing_since_s
            log.info(
                "writes confirmed by replicas again: %d writes were refused for lack of"
                " replicas over %.1f s",
                *(self._refused_since, took_s),
                extra={"writes_refused": self._refused_since, "duration_s": round(took_s, 3)},
            )
            self._refusing_since_s = None
            self._refused_since = self._refused_in_line = 0

    def _refused_line(self, now_s: float, over_s: float) -> None:
        connected = ", ".join(f"{p} has {n}" for p, n in sorted(self.connected.items()))
        log.warning(
            "writes refused for lack of replicas: %d write(s)%s confirmed by fewer than"
            " --replicas %d (WAIT), answered unavailable; replicas connected: %s",
            *(self._refused_in_line, f" in {over_s:.0f} s" if over_s else "", self.wanted),
            connected or "unknown",
            extra={
                "writes_refused": self._refused_in_line,
                "replicas": self.wanted,
                "connected": dict(self.connected),
            },
        )
        self._line_s = now_s
        self._refused_in_line = 0

    @property
    def refusing(self) -> bool:
        return self._refusing_since_s is not None

    def stats(self, refused: int) -> dict[str, Any]:
        """``stats``' ``replicas``: what is asked, what is connected, what was refused."""
        return {
            "wanted": self.wanted,
            "connected": dict(self.connected),
            "writes_refused": refused,
            "refusing": self.refusing,
        }


def _said(found: list[tuple[str, int]]) -> str:
    """``Redis primary H:P has N replica(s)``, or several primaries in one line."""
    if len(found) == 1:
        ((primary, count),) = found
        return f"Redis primary {primary} has {count} replica(s)"
    listed = ", ".join(f"{primary} ({count})" for primary, count in found)
    return f"Redis primaries {listed} have that many replica(s)"


def _it(found: list[tuple[str, int]]) -> str:
    return "it" if len(found) == 1 else "one of them"


def _to(found: list[tuple[str, int]]) -> str:
    return "to it" if len(found) == 1 else "to its partitions"


def _fields(found: list[tuple[str, int]], wanted: int, **more: Any) -> dict[str, Any]:
    return {"connected": dict(found), "replicas": wanted, **more}
