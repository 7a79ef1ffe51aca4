"""The fire burst under dashboard load: lateness p99 with 4 dashboards open and
one ``/tasks`` page polled every second, against none (issue 18's bench figure).

Each run is a fresh ``delaywheel serve --store memory:// --tick 0.01
--web-port P --metrics-port M`` (no token: the dashboard serves loopback as
the admin). In the loaded runs a thread of its own runs the viewers before
the fill starts and until the burst is all ready: ``STREAMS`` ``GET /events``
streams, read as they come (the snapshots they got are counted: the streams
were live), and one client fetching ``/tasks`` every ``POLL_PAGE_S``, as a
browser on that page with a refresh would (each fetch's time is kept). Then
``tasks`` tasks due at one whole second are added with ``add_many``; the
main thread polls ``stats`` until all are ready.

Lateness is the server's own: the ``delaywheel_fire_lateness_seconds``
histogram from ``/metrics`` after the burst (only the burst fired), its p99
given as the upper bound of the bucket holding it (the bounds are 1, 2.5, 5,
10, 25, 50, 100 ms, ...: coarse). The burst's duration (the due time to the
``stats`` reply showing all ready, polled every 2 ms) is the finer figure
beside it. Runs alternate none / loaded, ``runs`` of each; the figures are
the worst run of each mode, every run listed. ``run(quick=True)``: 5,000
tasks, one run of each.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
import urllib.request
from dataclasses import dataclass, field

import aiohttp

from bench import Figure, Report, Target, progress
from bench._loads import BODY, Address, dw_client
from bench._procs import free_port, server_process
from bench.fire import POLL_S, add_in_batches, ready_count

TOPIC = "burst"
STREAMS = 4
POLL_PAGE_S = 1.0
LEAD_S = 1.5  # from the fill's expected end to the due time
FILL_RATE_GUESS = 20_000  # tasks/s add_many does here at worst, with the viewers running
GIVE_UP_S = 120.0


@dataclass(frozen=True)
class Plan:
    tasks: int
    runs: int  # of each mode


FULL = Plan(tasks=50_000, runs=2)
QUICK = Plan(tasks=5_000, runs=1)


@dataclass
class Viewers:
    """The dashboard load, in a thread with its own event loop."""

    origin: str
    snapshots: int = 0  # SSE snapshots received, all streams
    page_s: list[float] = field(default_factory=list)  # each /tasks fetch's time
    stopping: threading.Event = field(default_factory=threading.Event)
    ready: threading.Event = field(default_factory=threading.Event)

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)
        thread.start()
        if not self.ready.wait(10):
            raise RuntimeError("the event streams did not open")
        return thread

    async def _main(self) -> None:
        async with aiohttp.ClientSession() as http:
            streams = [asyncio.create_task(self._stream(http)) for _ in range(STREAMS)]
            poller = asyncio.create_task(self._poll(http))
            while self.snapshots < STREAMS:  # each stream's first snapshot
                await asyncio.sleep(0.01)
            self.ready.set()
            while not self.stopping.is_set():
                await asyncio.sleep(0.05)
            for task in (*streams, poller):
                task.cancel()
            await asyncio.gather(*streams, poller, return_exceptions=True)

    async def _stream(self, http: aiohttp.ClientSession) -> None:
        async with http.get(self.origin + "/events") as reply:
            reply.raise_for_status()
            async for line in reply.content:
                if line.startswith(b"event: snapshot"):
                    self.snapshots += 1

    async def _poll(self, http: aiohttp.ClientSession) -> None:
        while True:
            started = time.perf_counter()
            async with http.get(self.origin + "/tasks") as reply:
                reply.raise_for_status()
                await reply.read()
            self.page_s.append(time.perf_counter() - started)
            await asyncio.sleep(max(0.0, POLL_PAGE_S - (time.perf_counter() - started)))


def lateness_p99_s(
    metrics_url: str, histogram: str = "delaywheel_fire_lateness_seconds"
) -> tuple[float, int]:
    """The p99 bucket bound of a lateness histogram on /metrics, and its count."""
    with urllib.request.urlopen(metrics_url, timeout=10) as reply:
        text = reply.read().decode()
    buckets: list[tuple[float, float]] = []
    for line in text.splitlines():
        if line.startswith(histogram + "_bucket{"):
            bound = line.split('le="', 1)[1].split('"', 1)[0]
            buckets.append((math.inf if bound == "+Inf" else float(bound), float(line.split()[-1])))
    total = buckets[-1][1]
    for bound, cumulative in buckets:
        if cumulative >= 0.99 * total:
            return bound, int(total)
    return math.inf, int(total)


@dataclass(frozen=True)
class Run:
    loaded: bool
    p99_s: float
    fired: int
    burst_s: float
    snapshots: int
    pages: list[float]


def one_run(count: int, loaded: bool, label: str) -> Run:
    web_port, metrics_port = free_port(), free_port()
    args = ("--tick", "0.01", "--web-port", str(web_port), "--metrics-port", str(metrics_port))
    with server_process("memory://", args=args) as (_, address):
        viewers = Viewers(f"http://127.0.0.1:{web_port}")
        thread = viewers.start() if loaded else None
        try:
            due_s = float(math.ceil(time.time() + LEAD_S + count / FILL_RATE_GUESS))
            progress(f"{label}: adding {count:,} tasks due at {due_s:.0f}")
            task = {"topic": TOPIC, "body": BODY, "at": due_s}
            add_in_batches(address, (task for _ in range(count)))
            if time.time() > due_s - 0.1:
                raise RuntimeError("the fill ended too late: lower FILL_RATE_GUESS")
            ready_s = wait_all_ready(address, count, due_s)
        finally:
            viewers.stopping.set()
            if thread is not None:
                thread.join(10)
        p99_s, fired = lateness_p99_s(f"http://127.0.0.1:{metrics_port}/metrics")
    run = Run(loaded, p99_s, fired, ready_s - due_s, viewers.snapshots, viewers.page_s)
    progress(
        f"{label}: p99 <= {p99_s * 1e3:g} ms over {fired:,} fired, burst {run.burst_s:.3f} s"
        + (f", {run.snapshots} snapshots, {len(run.pages)} /tasks pages" if loaded else "")
    )
    return run


def wait_all_ready(address: Address, count: int, due_s: float) -> float:
    with dw_client(address) as client:
        time.sleep(max(0.0, due_s - 0.01 - time.time()))
        while ready_count(client.stats()) < count:
            if time.time() > due_s + GIVE_UP_S:
                raise RuntimeError(f"the burst was not all ready {GIVE_UP_S:g} s on")
            time.sleep(POLL_S)
        return time.time()


def run(quick: bool = False) -> Report:
    started = time.perf_counter()
    plan = QUICK if quick else FULL
    runs: list[Run] = []
    for number in range(1, plan.runs + 1):
        for loaded in (False, True):
            mode = "loaded" if loaded else "none"
            runs.append(one_run(plan.tasks, loaded, f"run {number}/{plan.runs}, {mode}"))
    none = [r for r in runs if not r.loaded]
    loaded = [r for r in runs if r.loaded]
    pages = [s for r in loaded for s in r.pages]

    def ms(values: list[float]) -> tuple[float, ...]:
        return tuple(v * 1e3 for v in values)

    figures = [
        Figure(
            "p99_none_ms",
            f"lateness p99, {plan.tasks:,} due at once, no viewer",
            max(r.p99_s for r in none) * 1e3,
            "ms",
            runs=ms([r.p99_s for r in none]),
            note="the upper bound of the bucket holding p99 (/metrics); worst run",
        ),
        Figure(
            "p99_loaded_ms",
            f"  with {STREAMS} /events streams and /tasks each {POLL_PAGE_S:g} s",
            max(r.p99_s for r in loaded) * 1e3,
            "ms",
            Target("<=", max(r.p99_s for r in none) * 1e3),
            ms([r.p99_s for r in loaded]),
            f"{sum(r.snapshots for r in loaded)} snapshots, {len(pages)} pages read",
        ),
        Figure(
            "burst_none_ms",
            "burst duration, no viewer",
            max(r.burst_s for r in none) * 1e3,
            "ms",
            runs=ms([r.burst_s for r in none]),
            note=f"due time to stats showing all ready (polled every {POLL_S * 1e3:g} ms)",
        ),
        Figure(
            "burst_loaded_ms",
            "  with the viewers",
            max(r.burst_s for r in loaded) * 1e3,
            "ms",
            runs=ms([r.burst_s for r in loaded]),
        ),
        Figure(
            "page_ms",
            "/tasks page, slowest fetch",
            max(pages, default=math.nan) * 1e3,
            "ms",
            note="over the loaded runs, fill and burst included",
        ),
    ]
    return Report(
        "dashboard",
        f"fire burst under dashboard load{' (quick)' if quick else ''}: {plan.tasks:,} tasks "
        f"due in one second, memory store, --tick 0.01, {plan.runs} runs of each mode",
        figures,
        params={
            "quick": quick,
            "tasks": plan.tasks,
            "runs": plan.runs,
            "streams": STREAMS,
            "poll_page_s": POLL_PAGE_S,
            "tick_s": 0.01,
        },
        elapsed_s=time.perf_counter() - started,
    )
