"""Journaled adds: how many acknowledged adds per second each store sustains.

A real server process per store (memory, SQLite, a private Redis with AOF)
takes adds from the project's AsyncClient in pipelines, several in flight on
one connection: the way a producer with a backlog sends. A reply waits for
the store write that holds it (group commit), so the window in flight must
cover a store round trip: with 2,000 in flight Redis gave ~40k/s here, with
8,000 ~60k/s (memory, with no round trip, ~66k/s either way). Every add is acknowledged only once
it is in the store, so this measures group commit end to end. The server's
own ``stats`` then tells how many changes each store round trip carried,
and its ``flushes`` (store writes completed) over the adds sent, the
warm-up adds included, gives the store round trips per 100 writes: at this
saturation group commit should make that at most 1.
Target: >= 100,000 journaled adds per second on Redis (issue 16, "pipelined
journaled adds"; issue 4 asked for 50,000).

``run(quick=True)`` does the same with ``QUICK`` counts: a smoke run.
"""

from __future__ import annotations

import asyncio
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from delaywheel_client import AsyncClient

from bench import Figure, Report, Target, progress
from bench._procs import private_redis, running_server


@dataclass(frozen=True)
class Plan:
    """How much: the full run, or ``QUICK``."""

    adds: int  # adds per drive
    # Drives, one after another on the same server: the figure is their
    # median (one full drive takes about 2 s, short enough for a passing slow
    # moment of the machine to decide it).
    drives: int


FULL = Plan(adds=100_000, drives=3)
QUICK = Plan(adds=5_000, drives=1)
BATCH = 1_000  # adds per pipeline
PRODUCERS = 8  # pipelines in flight at once on the one connection
BODY = {"order": 42, "action": "close-if-unpaid"}


async def _drive(address: tuple[str, int], adds: int) -> tuple[float, dict[str, object]]:
    client = await AsyncClient.connect(*address)
    batches = iter(range(0, adds, BATCH))

    async def producer() -> None:
        # PRODUCERS pipelines in flight at once: the server works on one
        # while the client encodes the next and reads the replies of another.
        for first in batches:
            pipe = client.pipeline()
            for i in range(first, min(first + BATCH, adds)):
                pipe.add("bench", BODY, delay=3600 + i % 600)
            await pipe.execute()

    try:
        await client.add("warmup", BODY)
        started = time.perf_counter()
        await asyncio.gather(*(producer() for _ in range(PRODUCERS)))
        elapsed = time.perf_counter() - started
        return adds / elapsed, await client.stats()
    finally:
        await client.close()


def run(quick: bool = False) -> Report:
    started = time.perf_counter()
    plan = QUICK if quick else FULL
    figures: list[Figure] = []
    directory = Path(tempfile.mkdtemp(prefix="delaywheel-bench-"))
    try:
        with private_redis(directory) as redis_url:
            stores: list[tuple[str, str, Target | None]] = [
                ("memory", "memory://", None),
                ("sqlite", f"sqlite:///{directory / 'journal.db'}", None),
            ]
            if redis_url is None:
                progress("no redis-server installed: Redis skipped")
            else:
                stores.append(("redis", redis_url, Target(">=", 100_000)))
            for name, url, target in stores:
                progress(f"{plan.adds:,} adds through the server on {name}")
                with running_server(url) as address:
                    drives = [asyncio.run(_drive(address, plan.adds)) for _ in range(plan.drives)]
                rates = tuple(rate for rate, _ in drives)
                stats = drives[-1][1]  # the server's totals over all the drives
                flushes = int(stats["flushes"])  # type: ignore[call-overload]
                writes = plan.drives * (plan.adds + 1)  # each drive's adds and its warm-up add
                mean = writes / max(flushes, 1)
                figures.append(
                    Figure(
                        f"adds_{name}",
                        f"journaled adds, {name}",
                        statistics.median(rates),
                        "/s",
                        target,
                        runs=rates,
                        note=f"median of {plan.drives} drives; {flushes:,} store writes",
                    )
                )
                figures.append(
                    Figure(
                        f"batch_mean_{name}",
                        f"  changes per write, {name}",
                        mean,
                        "",
                        note=f"largest {stats['max_flush_size']}",
                    )
                )
                figures.append(
                    Figure(
                        f"round_trips_{name}",
                        f"  store round trips per 100 writes, {name}",
                        100 * flushes / writes,
                        "",
                        Target("<=", 1.0),
                        note=f"stats flushes {flushes:,} over {writes:,} adds",
                    )
                )
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return Report(
        "journal",
        f"Journaled adds{' (quick)' if quick else ''}: AsyncClient pipelines of {BATCH} adds, "
        f"{PRODUCERS} in flight on one connection, {plan.drives} drives of {plan.adds:,} adds",
        figures,
        params={
            "quick": quick,
            "adds": plan.adds,
            "batch": BATCH,
            "pipelines_in_flight": PRODUCERS,
            "drives": plan.drives,
        },
        elapsed_s=time.perf_counter() - started,
    )
