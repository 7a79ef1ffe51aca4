"""A fire burst: many tasks due in the same second, made ready by a real server.

One burst is one fresh ``delaywheel serve --store memory://`` (the default
1 s tick; every task's ``at`` is a whole second, so the burst falls on the
start of one tick). ``tasks`` tasks with a 100-byte ``bytes`` body, all with
the same ``at`` a few seconds ahead (``LEAD_S`` plus time for the fill), are
added with ``Client.add_many``, 1,000 a call. Then, until all of them are
ready, two things run against the server:

- the ready count: the main thread calls ``stats`` every ``POLL_S`` from just
  before the due time until ``states["ready"]`` is the whole burst. The time
  that reply arrived (wall clock, as the server's ``at``) less the due time is
  the burst's duration; "made ready" is tasks over that duration. Its
  resolution is the poll interval plus a round trip (a few ms, against the
  ~1 s of a full burst).
- the stall: a second connection, in a thread of its own, sends ``ping`` in a
  tight loop from ``PING_LEAD_S`` before the due time until the last task is
  ready. The longest round trip of the pings that overlap the burst (sent
  before it ended, answered after it began) is the longest the server's event
  loop was kept from answering: a request arriving then waits as long. The
  longest round trip before the due time is given in the note as the
  baseline.

The server fires at most 1,000 tasks per turn of its loop, so both figures
are about what a turn costs and how often the loop gets back to its sockets.
Nothing is pinned: the server, the pinger and the poller share this
machine's CPUs as the scheduler likes. The burst is repeated ``runs`` times,
each on a fresh server; "made ready" is the median of the runs and the stall
the worst of them, every run listed. ``run(quick=True)``: 20,000 tasks.
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from itertools import islice
from typing import Any

from bench import Figure, Report, Target, progress
from bench._loads import ADD_MANY_BATCH, BODY, Address, dw_client
from bench._procs import server_process

TOPIC = "burst"
LEAD_S = 1.5  # from the fill's expected end to the due time
FILL_RATE_GUESS = 40_000  # tasks/s add_many does here at worst: sets how far ahead the burst is
PING_LEAD_S = 0.3  # the pinger starts this long before the due time
POLL_S = 0.002  # between two stats calls while the burst fires
GIVE_UP_S = 120.0  # after the due time: a burst that never completes ends the run


@dataclass(frozen=True)
class Plan:
    tasks: int  # tasks in one burst
    runs: int  # bursts, each on a fresh server


FULL = Plan(tasks=200_000, runs=3)
QUICK = Plan(tasks=20_000, runs=1)


def add_in_batches(address: Address, tasks: Iterable[Mapping[str, Any]]) -> None:
    """``tasks`` added with ``add_many``, ``ADD_MANY_BATCH`` a call (a fill: not timed)."""
    iterator = iter(tasks)
    with dw_client(address) as client:
        while batch := list(islice(iterator, ADD_MANY_BATCH)):
            client.add_many(batch)


class Pinger(threading.Thread):
    """``ping`` one call at a time on a connection of its own until stopped."""

    def __init__(self, address: Address) -> None:
        super().__init__(name="pinger", daemon=True)
        self.address = address
        self.stopping = threading.Event()
        self.pings: list[tuple[float, float]] = []  # (sent, answered), wall clock
        self.started_pinging = threading.Event()

    def run(self) -> None:
        clock = time.time
        with dw_client(self.address) as client:
            client.ping()  # the connection is open before the first timed ping
            self.started_pinging.set()
            while not self.stopping.is_set():
                sent = clock()
                client.ping()
                self.pings.append((sent, clock()))


@dataclass(frozen=True)
class Burst:
    """One burst: when it was due, when all of it was ready, the pings around it."""

    tasks: int
    due_s: float
    ready_s: float
    pings: list[tuple[float, float]]

    @property
    def rate(self) -> float:
        return self.tasks / (self.ready_s - self.due_s)

    @property
    def stall_ms(self) -> float:
        """The longest round trip of the pings that overlap the burst."""
        during = [
            end - sent for sent, end in self.pings if sent < self.ready_s and end > self.due_s
        ]
        return max(during, default=math.nan) * 1e3

    @property
    def baseline_ms(self) -> float:
        """The longest round trip of the pings answered before the due time."""
        before = [end - sent for sent, end in self.pings if end <= self.due_s]
        return max(before, default=math.nan) * 1e3


def ready_count(stats: dict[str, Any]) -> int:
    return int(stats["states"].get("ready", 0))


def one_burst(count: int, number: int, runs: int) -> Burst:
    """A fresh server, ``count`` tasks due in one second, timed as they are made ready."""
    with server_process("memory://") as (_, address):
        due_s = float(math.ceil(time.time() + LEAD_S + count / FILL_RATE_GUESS))
        progress(f"burst {number}/{runs}: adding {count:,} tasks due at {due_s:.0f}")
        task = {"topic": TOPIC, "body": BODY, "at": due_s}
        add_in_batches(address, (task for _ in range(count)))
        if time.time() > due_s - PING_LEAD_S:
            raise RuntimeError("the fill ended too late: raise LEAD_S or lower FILL_RATE_GUESS")
        pinger = Pinger(address)
        with dw_client(address) as client:
            time.sleep(max(0.0, due_s - PING_LEAD_S - time.time()))
            pinger.start()
            pinger.started_pinging.wait()
            try:
                time.sleep(max(0.0, due_s - 0.01 - time.time()))
                while ready_count(client.stats()) < count:
                    if time.time() > due_s + GIVE_UP_S:
                        raise RuntimeError(f"the burst was not all ready {GIVE_UP_S:g} s on")
                    time.sleep(POLL_S)
                ready_s = time.time()
            finally:
                pinger.stopping.set()
                pinger.join()
    burst = Burst(count, due_s, ready_s, pinger.pings)
    progress(
        f"burst {number}/{runs}: ready in {ready_s - due_s:.3f} s, "
        f"longest ping {burst.stall_ms:.1f} ms over {len(burst.pings):,} pings"
    )
    return burst


def run(quick: bool = False) -> Report:
    started = time.perf_counter()
    plan = QUICK if quick else FULL
    bursts = [one_burst(plan.tasks, number, plan.runs) for number in range(1, plan.runs + 1)]
    rates = tuple(burst.rate for burst in bursts)
    stalls = tuple(burst.stall_ms for burst in bursts)
    durations = tuple((burst.ready_s - burst.due_s) * 1e3 for burst in bursts)
    baseline = max(burst.baseline_ms for burst in bursts)
    figures = [
        Figure(
            "made_ready_rate",
            f"made ready, {plan.tasks:,} due at once",
            statistics.median(rates),
            "tasks/s",
            Target(">=", 200_000),
            rates,
            "due time to the stats reply showing all ready; median",
        ),
        Figure(
            "burst_ms",
            "  burst duration",
            statistics.median(durations),
            "ms",
            runs=durations,
            note=f"stats polled every {POLL_S * 1e3:g} ms",
        ),
        Figure(
            "stall_ms",
            "longest ping round trip, burst",
            max(stalls),
            "ms",
            Target("<=", 20),
            stalls,
            f"worst of the runs; before the burst at most {baseline:.2f} ms",
        ),
    ]
    return Report(
        "fire",
        f"fire burst{' (quick)' if quick else ''}: {plan.tasks:,} tasks due in one second, "
        f"memory store, {plan.runs} runs on fresh servers",
        figures,
        params={
            "quick": quick,
            "tasks": plan.tasks,
            "runs": plan.runs,
            "body_bytes": len(BODY),
            "add_many_batch": ADD_MANY_BATCH,
            "poll_s": POLL_S,
            "ping_lead_s": PING_LEAD_S,
            "pings": [len(burst.pings) for burst in bursts],
        },
        elapsed_s=time.perf_counter() - started,
    )
