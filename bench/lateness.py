"""Lateness under load: how long after its ``at`` a task reaches a consumer
while other clients keep the server busy.

One ``delaywheel serve --store memory:// --tick 0.01`` (10 ms ticks: a task
fires on the first tick at or after its due time, so up to 10 ms of lateness
is by design). Up front, ``tasks`` tasks with a 100-byte ``bytes`` body are
added with ``add_many`` (1,000 a call), each with an ``at`` drawn uniformly
(seeded) from a window of ``span_s`` seconds that opens ``LEAD_S`` after the
fill started; fractional seconds, so due times fall anywhere within a tick.

Over that window (from ``PRODUCER_LEAD_S`` before it opens to ``TAIL_S``
after it closes), ``producers`` spawned client processes each call ``add``
one at a time, as fast as the server answers (compare.py's many-processes
load: tasks due in an hour, so none of them fires). Meanwhile ``consumers``
threads of this process, each on a connection of its own, loop on a
blocking ``reserve`` (timeout ``RESERVE_TIMEOUT_S``) and ``ack`` every task
they get. For each task, lateness = the wall-clock time the ``reserve``
reply was read, less the task's ``at`` as ``reserve`` returns it: the
server's firing delay plus the reply's trip and the wait behind the load.
There are enough consumers that one is nearly always blocked in ``reserve``
when a task fires, so the server hands it over at once: with 2 of them
against 8 producers, each got too small a share of the server to do the
~1,000 reserve+ack pairs a second the window needs, and the p99 (~200 ms)
measured their backlog, not the server.

Figures: the 50th and 99th percentiles (nearest rank) and the maximum
lateness, in ms, and how many tasks arrived early: lateness below
``-EARLY_TOLERANCE_S`` (1 ms). The server and this process read the same
system clock, so a task can only look early through a server that fired it
before its time; the millisecond absorbs float rounding of tick times. The
producers' total add rate is given as the load it was measured under. One
pass, so no figure lists runs. ``run(quick=True)``: 1,000 tasks over 2 s,
2 producers.
"""

from __future__ import annotations

import math
import random
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from typing import Any

from bench import Figure, Report, Target, progress
from bench._loads import BODY, DELAY_S, Address, client_process, dw_client, warm_up
from bench._procs import server_process
from bench.fire import add_in_batches

TOPIC = "due"
TICK_S = 0.01
LEAD_S = 1.0  # from the start of the fill to the window's opening
PRODUCER_LEAD_S = 0.2  # the producers' load starts this long before the first due time
TAIL_S = 0.5  # and goes on this long after the last
RESERVE_TIMEOUT_S = 0.2  # a consumer's blocking reserve, so that it notices the end
GIVE_UP_S = 10.0  # after the window: a consumer stops waiting for what never came
EARLY_TOLERANCE_S = 0.001
SEED = 20_240_601


@dataclass(frozen=True)
class Plan:
    tasks: int  # tasks due over the window
    span_s: float  # the window's length
    producers: int  # client processes adding far-future tasks meanwhile
    consumers: int  # threads reserving and acking the due tasks


FULL = Plan(tasks=20_000, span_s=20.0, producers=8, consumers=8)
QUICK = Plan(tasks=1_000, span_s=2.0, producers=2, consumers=4)


def percentile(ordered: list[float], fraction: float) -> float:
    """Nearest rank: the smallest value with at least ``fraction`` of them at or below it."""
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def consume(address: Address, count: int, until_s: float, lateness: list[float]) -> None:
    """Reserve and ack until ``count`` tasks came in all (``lateness`` is shared) or ``until_s``."""
    clock = time.time
    with dw_client(address) as client:
        while len(lateness) < count and clock() < until_s:
            task = client.reserve(TOPIC, RESERVE_TIMEOUT_S)
            if task is None:
                continue
            lateness.append(clock() - task["at"])  # list.append is atomic: no lock
            client.ack(task["id"])


def consume_all(address: Address, count: int, until_s: float, consumers: int) -> list[float]:
    """``consumers`` threads, each on a connection of its own, running ``consume``
    until ``count`` tasks came in all or ``until_s``: every lateness seen (s)."""
    lateness: list[float] = []
    threads = [
        threading.Thread(
            target=consume, args=(address, count, until_s, lateness), name=f"consumer-{number}"
        )
        for number in range(consumers)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return lateness


def measure(plan: Plan) -> tuple[list[float], float]:
    """One pass: every lateness seen (s), and the producers' total add rate."""
    rng = random.Random(SEED)
    spawn = get_context("spawn")
    with (
        server_process("memory://", args=("--tick", str(TICK_S))) as (_, address),
        ProcessPoolExecutor(plan.producers, mp_context=spawn) as pool,
    ):
        progress(f"starting {plan.producers} producer processes")
        for future in [pool.submit(warm_up) for _ in range(plan.producers)]:
            future.result()
        opens_s = time.time() + LEAD_S
        closes_s = opens_s + plan.span_s
        dues = [rng.uniform(opens_s, closes_s) for _ in range(plan.tasks)]
        progress(f"adding {plan.tasks:,} tasks due over {plan.span_s:g} s")
        add_in_batches(address, ({"topic": TOPIC, "body": BODY, "at": at} for at in dues))
        if time.time() > opens_s - PRODUCER_LEAD_S:
            raise RuntimeError("the fill ended too late: raise LEAD_S")
        # client_process runs on the monotonic clock: the same instant on it
        load_starts = time.monotonic() + (opens_s - PRODUCER_LEAD_S - time.time())
        load_s = PRODUCER_LEAD_S + plan.span_s + TAIL_S
        shares = [
            pool.submit(client_process, "add", address, load_starts, load_s)
            for _ in range(plan.producers)
        ]
        progress(f"{plan.producers} producers adding, {plan.consumers} consumers reserving")
        lateness = consume_all(address, plan.tasks, closes_s + GIVE_UP_S, plan.consumers)
        results = [share.result() for share in shares]
    adds = sum(ops for ops, _, _ in results)
    add_s = max(end for _, _, end in results) - min(begin for _, begin, _ in results)
    return lateness, adds / add_s


def lateness_figures(
    lateness: list[float], expected: int, key_prefix: str = "", label: str = "lateness"
) -> tuple[list[Figure], dict[str, Any]]:
    """The figures of one pass's lateness (s): p50, p99 and max (ms) and the early
    count, with their targets; and the params that go with them (received, missing).

    ``key_prefix`` goes before every key and ``label`` starts every label, for a
    section that measures lateness under another load (bench/deliveries.py).
    """
    if not lateness:
        raise RuntimeError("no due task reached a consumer")
    ordered = sorted(lateness)
    received = len(ordered)
    missing = expected - received
    early = sum(1 for late in ordered if late < -EARLY_TOLERANCE_S)
    progress(f"received {received:,} of {expected:,}, {early} early")
    got = f"{received:,} of {expected:,} received" + (f", {missing:,} MISSING" if missing else "")
    ms = 1e3
    figures = [
        Figure(
            f"{key_prefix}lateness_p50_ms",
            f"{label}, 50th percentile",
            percentile(ordered, 0.50) * ms,
            "ms",
            note=f"reserve reply read - task at; {TICK_S * ms:g} ms tick",
        ),
        Figure(
            f"{key_prefix}lateness_p99_ms",
            f"{label}, 99th percentile",
            percentile(ordered, 0.99) * ms,
            "ms",
            Target("<=", 15),
        ),
        Figure(
            f"{key_prefix}lateness_max_ms",
            f"{label}, max",
            ordered[-1] * ms,
            "ms",
            Target("<=", 50),
            note=got,
        ),
        Figure(
            f"{key_prefix}early",
            "tasks received early",
            early,
            "tasks",
            Target("<=", 0),
            note=f"lateness < -{EARLY_TOLERANCE_S * ms:g} ms (clock tolerance)",
        ),
    ]
    params = {"received": received, "missing": missing, "early_tolerance_s": EARLY_TOLERANCE_S}
    return figures, params


def run(quick: bool = False) -> Report:
    started = time.perf_counter()
    plan = QUICK if quick else FULL
    lateness, add_rate = measure(plan)
    figures, counts = lateness_figures(lateness, plan.tasks)
    figures.append(
        Figure(
            "load_add_rate",
            f"load: {plan.producers} processes adding",
            add_rate,
            "/s",
            note=f"add one call at a time, due in {DELAY_S:,} s; total rate",
        )
    )
    return Report(
        "lateness",
        f"lateness under load{' (quick)' if quick else ''}: {plan.tasks:,} tasks due over "
        f"{plan.span_s:g} s, {plan.producers} producer processes, {TICK_S * 1e3:g} ms tick",
        figures,
        params={
            "quick": quick,
            "tasks": plan.tasks,
            "span_s": plan.span_s,
            "producers": plan.producers,
            "consumers": plan.consumers,
            "tick_s": TICK_S,
            **counts,
            "reserve_timeout_s": RESERVE_TIMEOUT_S,
            "seed": SEED,
            "body_bytes": len(BODY),
        },
        elapsed_s=time.perf_counter() - started,
    )
