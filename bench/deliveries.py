"""Deliveries: how fast a real server sends due tasks to an HTTP endpoint and
to each broker, and how late queue tasks reach their consumer meanwhile.

Every server here is ``delaywheel serve --store memory:// --tick 0.01
--http-allow 127.0.0.1 --http-concurrency 64`` (64 is the default, given so
that the bound below is the one measured), with a 100-byte ``bytes`` body on
every task. The memory store keeps journaling out of the figures: what is
measured is the wheel handing tasks over, the dispatcher and the senders.

The destinations (``bench/_destinations.py``):

- HTTP: ``bench/http_sink.py``, ``aiohttp.web`` on uvloop in a process of its
  own, answering 200 at once (``/ok/...``), or after 100 ms (``/slow/...``).
- a Redis list (``LPUSH``) and a Redis stream (``XADD``) on a private
  redis-server (AOF, ``appendfsync everysec``), named ``--broker cache=...``;
- RabbitMQ at 127.0.0.1:5672 (guest): a durable queue of our own, uniquely
  named, published to through the default exchange, deleted afterwards;
- NATS JetStream at 127.0.0.1:4222: a stream of our own on a unique subject,
  deleted afterwards.

"Delivered at once": one server serves every destination in turn. For each,
one task is first delivered to the same target, untimed (``warm_up``: a
fresh server's first burst of HTTP deliveries kept its event loop from
pings for 0.1-0.2 s where a warmed one's took under 20 ms, a cost paid once
per process, not once per burst). Then
``tasks`` tasks with that target, ``max_attempts`` 1 and the same ``at``
(``LEAD_S`` after the fill's expected end) are added with ``add_many``; from
the due time the main thread calls ``stats`` every ``POLL_S`` until every
one of them is settled: delivered, or dead after its one failed attempt
(``deliveries.delivered`` and ``.failed`` grown by ``tasks`` between them,
no task left but dead ones). The rate is the tasks delivered over the time
from the due time to that reply (it includes the up to 10 ms tick the tasks
wait to fire, and the poll's resolution); server CPU per delivery is the
server's utime + stime (``/proc/PID/stat``) over the same span, the stats
calls included, divided by the tasks delivered. The other side's CPU (the
sink's, the redis-server's) is given in the note the same way. Then the
destination is asked what it got (the sink's count of answered requests,
``LLEN``, ``XLEN``, the queue's message count, the stream's); fewer than the
server delivered is an error. So a failure never counts in a rate: it is
shown in the note (``FAILED``) and in ``params["failed"]``, and with one
attempt each it does not keep the run waiting for retries seconds apart.

With the 100 ms endpoint, the server keeps ``--http-concurrency`` requests in
flight to it, so the rate should be about 64 / 0.1 s = 640/s.

Lateness during a burst: a fresh server; ``burst_http`` HTTP deliveries to
the 100 ms endpoint due at one moment T (so they stay in flight, 64 at a
time, for the whole window) and ``burst_queue`` queue tasks due at random
(seeded) over ``span_s`` from T, after the same warm-up. ``consumers``
threads reserve and ack them, and each one's lateness is measured as
``bench/lateness.py`` does (its ``consume_all``; the same figures and
targets: p99 <= 15 ms, max <= 50 ms, none early). The HTTP deliveries done
from T to the last queue task's arrival are given as the load.

A rate-limited topic: a fresh server, the same warm-up (to a path of its
own), then ``topic_set`` gives the topic ``rate`` ``LIMITED_RATE`` (500/s)
and the default ``burst`` (20 ms of the rate: 10), and ``limited`` tasks to the sink's
``/ok/limited`` fall due at one moment, timed as above until all settled. The
sink records when each request came in (its monotonic clock). The achieved
rate is the arrivals over the time from the first to the last; steadiness is
the arrivals in each whole ``WINDOW_S`` (100 ms) from the first (a partial
last window left out): min, 5th percentile, median, 95th percentile and max,
their standard deviation in the note; and the most in any ``LIMIT_WINDOW_S``
(1 s), whose target is the contract's ``rate x 1 s + burst`` = 510
(docs/protocol.md, "Topic settings"; measured at the sink, so the
delivery's jitter counts against it).

When RabbitMQ or NATS does not answer, or redis-server is not installed,
their figures are left out and ``params["skipped"]`` says why. One pass of
everything, so no figure lists runs. ``run(quick=True)``: 1,000 tasks per
destination, 200 to the slow endpoint, a burst of 2,000 with 200 queue tasks
over 1 s, 2,000 on the limited topic (about 4 s).
"""

from __future__ import annotations

import math
import random
import statistics
import time
from contextlib import ExitStack
from dataclasses import dataclass
from functools import partial
from typing import Any

from delaywheel_client import Client, targets

from bench import Figure, Report, Target, progress
from bench._destinations import (
    CONNECT_TIMEOUT_S,
    Destination,
    broker_destinations,
    http_destinations,
)
from bench._loads import BODY, Address, Run, cpu_s, dw_client
from bench._procs import server_process
from bench.fire import add_in_batches
from bench.http_sink import SLOW_S, Sink
from bench.http_sink import running as running_sink
from bench.lateness import GIVE_UP_S as CONSUMER_GIVE_UP_S
from bench.lateness import SEED, TICK_S, consume_all, lateness_figures, percentile
from bench.lateness import TOPIC as QUEUE_TOPIC

TOPIC = "deliver"
HTTP_CONCURRENCY = 64  # the server's default, given explicitly: the slow endpoint's bound
LEAD_S = 0.5  # from the fill's expected end to the due time
FILL_RATE_GUESS = 15_000  # targeted tasks/s add_many does here at worst: sets the due time
POLL_S = 0.005  # between two stats calls while a run delivers
GIVE_UP_S = 120.0  # after the due time: a run that never completes is an error
LIMITED_RATE = 500.0  # the limited topic's rate (tasks/s); its burst is the default
WINDOW_S = 0.1  # the limited run's arrivals are counted per window this long
LIMIT_WINDOW_S = 1.0  # the window of the most arrivals, checked against rate x it + burst


@dataclass(frozen=True)
class Plan:
    tasks: int  # due at once, per destination
    slow_tasks: int  # due at once to the 100 ms endpoint
    burst_http: int  # HTTP deliveries to the 100 ms endpoint due at T
    burst_queue: int  # queue tasks due over the window after T
    span_s: float  # the window
    consumers: int  # threads reserving the queue tasks
    limited: int  # due at once on the rate-limited topic


FULL = Plan(
    tasks=20_000, slow_tasks=2_000, burst_http=20_000, burst_queue=2_000, span_s=4.0,
    consumers=4, limited=20_000,
)  # fmt: skip
QUICK = Plan(
    tasks=1_000, slow_tasks=200, burst_http=2_000, burst_queue=200, span_s=1.0,
    consumers=4, limited=2_000,
)  # fmt: skip


# -- measuring --------------------------------------------------------------------------


def server_args(*more: str) -> tuple[str, ...]:
    return (
        *("--tick", str(TICK_S), "--http-allow", "127.0.0.1"),
        *("--http-concurrency", str(HTTP_CONCURRENCY)),
        *more,
    )


def wait_connected(client: Client, brokers: set[str]) -> None:
    deadline = time.monotonic() + 3 * CONNECT_TIMEOUT_S
    while True:
        state = client.stats()["deliveries"]["brokers"]
        down = sorted(name for name in brokers if not state[name]["connected"])
        if not down:
            return
        if time.monotonic() > deadline:
            errors = {name: state[name]["last_error"] for name in down}
            raise RuntimeError(f"the server's brokers {down} did not connect: {errors}")
        time.sleep(0.05)


@dataclass(frozen=True)
class Delivered:
    run: Run  # tasks delivered, due time to all settled, the server's CPU time
    peer_cpu_s: float  # the other side's CPU over the same time (nan: not ours)
    failed: int  # tasks whose one attempt failed (dead, not retried)
    arrived: int  # what the destination says it got


def fill_due_at_once(address: Address, tasks: int, target: dict[str, Any]) -> float:
    """``tasks`` tasks with ``target``, all due at one moment; returns it (Unix s).

    One attempt each (``max_attempts`` 1): a failed one makes its task dead at once
    instead of retrying it seconds later, so a run with failures still ends soon,
    and the failures are counted, never delivered late into a figure.
    """
    due_s = time.time() + LEAD_S + tasks / FILL_RATE_GUESS
    task = {"topic": TOPIC, "body": BODY, "at": due_s, "target": target, "max_attempts": 1}
    add_in_batches(address, (task for _ in range(tasks)))
    if time.time() > due_s - POLL_S:
        raise RuntimeError("the fill ended too late: raise LEAD_S or lower FILL_RATE_GUESS")
    return due_s


def settled(stats: dict[str, Any]) -> tuple[int, int, int]:
    """(delivered, failed) attempts since start, and tasks neither gone nor dead."""
    deliveries = stats["deliveries"]
    live = stats["tasks"] - stats["states"].get("dead", 0)
    return deliveries["delivered"], deliveries["failed"], live


def warm_up(client: Client, target: dict[str, Any]) -> None:
    """One task delivered to ``target`` before anything is timed.

    A fresh server's first HTTP deliveries keep its event loop from
    everything else for 0.1-0.2 s (pings measured it; a warmed server's burst
    of 20,000 held them under 20 ms): a cost paid once per process, not one
    of a burst.
    """
    delivered_before, failed_before, _ = settled(client.stats())
    client.add(TOPIC, BODY, target=target, max_attempts=1)
    deadline = time.monotonic() + GIVE_UP_S
    while True:
        delivered, failed, live = settled(client.stats())
        if live == 0 and delivered + failed > delivered_before + failed_before:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"the warm-up delivery to {target} never settled")
        time.sleep(POLL_S)
    if failed > failed_before:
        raise RuntimeError(f"the warm-up delivery to {target} failed")


def deliver_at_once(client: Client, address: Address, pid: int, dest: Destination) -> Delivered:
    """``dest.tasks`` tasks due at once, timed until the server has sent every one
    (the caller has warmed the server up: ``warm_up``)."""
    arrived_before = dest.arrived()
    delivered_before, failed_before, _ = settled(client.stats())
    progress(f"{dest.label}: {dest.tasks:,} tasks due at once")
    due_s = fill_due_at_once(address, dest.tasks, dest.target)
    time.sleep(max(0.0, due_s - time.time()))
    cpu_before = cpu_s(pid)
    peer_before = cpu_s(dest.peer[1]) if dest.peer else math.nan
    while True:
        delivered, failed, live = settled(client.stats())
        delivered -= delivered_before
        failed -= failed_before
        if live == 0 and delivered + failed >= dest.tasks:
            break
        if time.time() > due_s + GIVE_UP_S:
            raise RuntimeError(f"{dest.label}: {delivered:,} of {dest.tasks:,} delivered so far")
        time.sleep(POLL_S)
    done_s = time.time()
    server_cpu_s = cpu_s(pid) - cpu_before
    peer_cpu_s = cpu_s(dest.peer[1]) - peer_before if dest.peer else math.nan
    arrived = dest.arrived() - arrived_before
    if arrived < delivered:  # the server counted deliveries the destination does not have
        raise RuntimeError(f"{dest.label}: {delivered:,} delivered but {arrived:,} arrived")
    progress(f"{dest.label}: settled in {done_s - due_s:.3f} s, {failed:,} failed")
    return Delivered(Run(delivered, done_s - due_s, server_cpu_s), peer_cpu_s, failed, arrived)


def per_delivery_us(cpu_s: float, delivered: int) -> float:
    return cpu_s / delivered * 1e6 if delivered else math.nan


def delivered_figures(dest: Destination, got: Delivered) -> list[Figure]:
    note = f"due time to stats showing all sent; {got.arrived:,} of {dest.tasks:,} arrived"
    if got.failed:
        note = f"{note}; {got.failed:,} FAILED (not counted)"
    if dest.key == "http_slow":
        bound = HTTP_CONCURRENCY / SLOW_S
        note = f"bound: {HTTP_CONCURRENCY} in flight / {SLOW_S:g} s = {bound:,.0f}/s; {note}"
    cpu_note = ""
    if dest.peer is not None:
        peer_us = per_delivery_us(got.peer_cpu_s, got.run.ops)
        cpu_note = f"{dest.peer[0]}: {peer_us:.1f} us/delivery"
    server_us = per_delivery_us(got.run.server_cpu_s, got.run.ops)
    return [
        Figure(f"{dest.key}_rate", dest.label, got.run.rate, "/s", note=note),
        Figure(f"{dest.key}_cpu_us", "  server CPU", server_us, "us/delivery", note=cpu_note),
    ]


@dataclass(frozen=True)
class Burst:
    lateness: list[float]  # of each queue task received (s)
    delivered: Run  # HTTP deliveries from T to the consumers' end
    waiting: int  # HTTP deliveries still waiting for their turn then


def burst_lateness(plan: Plan, sink: Sink) -> Burst:
    """Queue tasks due over a window that opens with a burst of slow HTTP deliveries."""
    rng = random.Random(SEED)
    with server_process("memory://", args=server_args()) as (_, address):
        with dw_client(address) as client:
            warm_up(client, targets.http(sink.url("ok", "warm-up")))
            delivered_before = client.stats()["deliveries"]["delivered"]
        count = plan.burst_http + plan.burst_queue
        progress(
            f"burst: {plan.burst_http:,} HTTP deliveries due at T, "
            f"{plan.burst_queue:,} queue tasks over {plan.span_s:g} s after it"
        )
        due_s = time.time() + LEAD_S + count / FILL_RATE_GUESS
        closes_s = due_s + plan.span_s
        dues = [rng.uniform(due_s, closes_s) for _ in range(plan.burst_queue)]
        target = targets.http(sink.url("slow", "burst"))
        http_task = {"topic": TOPIC, "body": BODY, "at": due_s, "target": target}
        add_in_batches(address, (http_task for _ in range(plan.burst_http)))
        add_in_batches(address, ({"topic": QUEUE_TOPIC, "body": BODY, "at": at} for at in dues))
        if time.time() > due_s - POLL_S:
            raise RuntimeError("the fill ended too late: raise LEAD_S or lower FILL_RATE_GUESS")
        until_s = closes_s + CONSUMER_GIVE_UP_S
        found = consume_all(address, plan.burst_queue, until_s, plan.consumers)
        with dw_client(address) as client:
            deliveries = client.stats()["deliveries"]
        delivered = Run(deliveries["delivered"] - delivered_before, time.time() - due_s)
    return Burst(found, delivered, deliveries["waiting"])


def burst_figures(plan: Plan, burst: Burst) -> tuple[list[Figure], dict[str, Any]]:
    figures, counts = lateness_figures(burst.lateness, plan.burst_queue, "burst_", "queue lateness")
    load = burst.delivered
    figures.append(
        Figure(
            "burst_http_rate",
            "load: HTTP deliveries meanwhile",
            load.rate,
            "/s",
            note=f"{plan.burst_http:,} due at T, {SLOW_S * 1e3:g} ms each; "
            f"{burst.waiting:,} still waiting at the end",
        )
    )
    return figures, {f"burst_{name}": value for name, value in counts.items()}


@dataclass(frozen=True)
class Limited:
    delivered: Delivered  # as the server counted them, due time to all settled
    settings: dict[str, Any]  # the topic's settings, as topic_set answered them
    arrivals_s: list[float]  # when each came in at the sink (its monotonic clock), in order


def limited_deliveries(plan: Plan, sink: Sink) -> Limited:
    """``plan.limited`` HTTP deliveries due at once on a topic limited to ``LIMITED_RATE``."""
    url = sink.url("ok", "limited")
    label = f"HTTP, topic limited to {LIMITED_RATE:g}/s"
    arrived = partial(sink.answered, url)
    dest = Destination("limited", label, targets.http(url), plan.limited, arrived)
    with (
        server_process("memory://", args=server_args()) as (pid, address),
        dw_client(address) as client,
    ):
        warm_up(client, targets.http(sink.url("ok", "limited-warm-up")))
        settings = client.topic_set(TOPIC, {"rate": LIMITED_RATE})
        got = deliver_at_once(client, address, pid, dest)
    return Limited(got, settings, sorted(sink.arrivals("limited")))


def per_window(arrivals_s: list[float]) -> list[int]:
    """Arrivals in each whole ``WINDOW_S`` from the first (a last, partial one left out)."""
    first_s = arrivals_s[0]
    counts = [0] * int((arrivals_s[-1] - first_s) / WINDOW_S)
    for at_s in arrivals_s:
        index = int((at_s - first_s) / WINDOW_S)
        if index < len(counts):
            counts[index] += 1
    return counts


def most_within(arrivals_s: list[float], span_s: float) -> int:
    """The most arrivals in any ``span_s`` (each window ends at an arrival)."""
    most = oldest = 0
    for newest, at_s in enumerate(arrivals_s):
        while arrivals_s[oldest] <= at_s - span_s:
            oldest += 1
        most = max(most, newest - oldest + 1)
    return most


def limited_figures(limited: Limited) -> list[Figure]:
    """The achieved rate at the sink, arrivals per ``WINDOW_S`` and the most in a second."""
    times = limited.arrivals_s
    if len(times) < 2 or times[-1] - times[0] < WINDOW_S:
        raise RuntimeError(f"limited: {len(times)} arrivals, too few or too close to measure")
    rate, burst = limited.settings["rate"], limited.settings["burst"]
    note = (
        f"rate {rate:g}, burst {burst}; {len(times):,} arrivals / first to last at the sink; "
        f"server: {limited.delivered.run.rate:,.1f}/s from the due time"
    )
    if limited.delivered.failed:
        note = f"{note}; {limited.delivered.failed:,} FAILED"
    windows = sorted(per_window(times))
    spread = (
        f"{len(windows)} whole windows from the first arrival; rate x window "
        f"= {rate * WINDOW_S:g}; std {statistics.pstdev(windows):.1f}"
    )
    bound = rate * LIMIT_WINDOW_S + burst
    most_note = f"rate x {LIMIT_WINDOW_S:g} s + burst = {bound:g}; at the sink, so jitter counts"
    per = f"  arrivals per {WINDOW_S * 1e3:g} ms"
    return [
        Figure(
            "limited_rate",
            f"HTTP, topic limited to {rate:g}/s",
            len(times) / (times[-1] - times[0]),
            "/s",
            note=note,
        ),
        Figure("limited_window_min", f"{per}, min", windows[0], "tasks", note=spread),
        Figure("limited_window_p5", f"{per}, 5th percentile", percentile(windows, 0.05), "tasks"),
        Figure("limited_window_p50", f"{per}, median", statistics.median(windows), "tasks"),
        Figure("limited_window_p95", f"{per}, 95th percentile", percentile(windows, 0.95), "tasks"),
        Figure("limited_window_max", f"{per}, max", windows[-1], "tasks"),
        Figure(
            "limited_1s_max",
            f"  most in any {LIMIT_WINDOW_S:g} s",
            most_within(times, LIMIT_WINDOW_S),
            "tasks",
            Target("<=", bound),
            note=most_note,
        ),
    ]


def run(quick: bool = False) -> Report:
    started = time.perf_counter()
    plan = QUICK if quick else FULL
    skipped: list[str] = []
    figures: list[Figure] = []
    failed: dict[str, int] = {}
    with ExitStack() as stack:
        sink = stack.enter_context(running_sink())
        brokers, broker_options = broker_destinations(stack, plan.tasks, skipped)
        destinations = http_destinations(sink, plan.tasks, plan.slow_tasks) + brokers
        progress("starting the server")
        with (
            server_process("memory://", args=server_args(*broker_options)) as (pid, address),
            dw_client(address) as client,
        ):
            wait_connected(client, {dest.broker for dest in brokers if dest.broker})
            for dest in destinations:
                warm_up(client, dest.target)
                got = deliver_at_once(client, address, pid, dest)
                figures += delivered_figures(dest, got)
                failed[dest.key] = got.failed
        lateness, counts = burst_figures(plan, burst_lateness(plan, sink))
        figures += lateness
        limited = limited_deliveries(plan, sink)
        figures += limited_figures(limited)
        failed["limited"] = limited.delivered.failed
    return Report(
        "deliveries",
        f"deliveries{' (quick)' if quick else ''}: {plan.tasks:,} due at once per destination, "
        f"memory store, {TICK_S * 1e3:g} ms tick; queue lateness under a burst of "
        f"{plan.burst_http:,} slow HTTP deliveries",
        figures,
        params={
            "quick": quick,
            "tasks": plan.tasks,
            "slow_tasks": plan.slow_tasks,
            "slow_s": SLOW_S,
            "http_concurrency": HTTP_CONCURRENCY,
            "tick_s": TICK_S,
            "poll_s": POLL_S,
            "body_bytes": len(BODY),
            "failed": failed,
            "burst_http": plan.burst_http,
            "burst_queue": plan.burst_queue,
            "span_s": plan.span_s,
            "consumers": plan.consumers,
            **counts,
            "limited": plan.limited,
            "limited_rate": LIMITED_RATE,
            "window_s": WINDOW_S,
            "seed": SEED,
            "skipped": skipped,
        },
        elapsed_s=time.perf_counter() - started,
    )
