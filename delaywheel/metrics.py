"""Prometheus metrics over HTTP (``--metrics-port``; docs/metrics.md lists them).

Nothing here runs per request. The server already keeps what the metrics
show, or counts it where the event is handled with one int addition
(``delaywheel.tallies``); ``ServerCollector.collect`` reads it all when
Prometheus scrapes, in time proportional to the topics, methods and
brokers, never to the tasks. The engine's figures come from the same
snapshot that ``stats`` answers from (``delaywheel.engine.snapshot``), so
the two cannot disagree. Per-topic series are capped at
``--metrics-topics``, the largest topics by task count; the others are
summed into ``delaywheel_other_topics_tasks``, so a server with a million
topics still exposes a bounded number of series.

The endpoint is an aiohttp site on the server's own event loop: a scrape
is one callback between requests, and the collector reads the engine's
state without a lock because nothing else runs meanwhile. This module
imports aiohttp and prometheus-client, so the server imports it only when
metrics are on.
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client import GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import CollectorRegistry

from delaywheel.engine.snapshot import Snapshot
from delaywheel.engine.task import STATES
from delaywheel.net.httpsite import BoundedSite
from delaywheel.net.limits import METRICS_CONNECTIONS
from delaywheel.tallies import Histogram

if TYPE_CHECKING:
    from delaywheel.net.server import Server

log = logging.getLogger("delaywheel.metrics")  # pinned: its name is documented

PATH = "/metrics"
# Label values a labelled counter has from the start, at 0 (docs/metrics.md):
# delivery target types and outcomes, and the codes a connection is refused with.
DELIVERY_TARGETS = ("http", "redis", "amqp", "nats")
DELIVERY_OUTCOMES = ("delivered", "failed")
REFUSAL_CODES = ("bad_request", "too_large", "unauthorized", "unavailable")

# The engine's event counts (``EventCounts``) as counters: (slot, name, help).
_EVENTS = (
    ("added", "delaywheel_tasks_added_total", "Tasks added (add and add_many)."),
    ("updated", "delaywheel_tasks_updated_total", "Tasks updated."),
    ("deleted", "delaywheel_tasks_deleted_total", "Tasks deleted."),
    ("reserved", "delaywheel_tasks_reserved_total", "Tasks reserved by consumers."),
    ("acked", "delaywheel_tasks_acked_total", "Reserved tasks acked."),
    ("released", "delaywheel_tasks_released_total", "Reserved tasks released."),
    ("touched", "delaywheel_tasks_touched_total", "Reservations touched (TTR restarted)."),
    (
        "expired",
        "delaywheel_tasks_expired_total",
        "Reservations whose TTR ran out: the task is delivered again, or dead after its last "
        "attempt.",
    ),
    ("kicked", "delaywheel_tasks_kicked_total", "Dead tasks kicked back to life."),
    (
        "lapsed",
        "delaywheel_tasks_lapsed_total",
        "Done tasks dropped once their retain seconds were over, and dead ones once "
        "their topic's dead_retain (else --dead-retention) was.",
    ),
)


class ServerCollector:
    """Reads a running server's state into metric families, at scrape time."""

    def __init__(self, server: Server, *, topics: int) -> None:
        self._server = server
        self._topics = topics

    def collect(self) -> Iterator[Metric]:
        snapshot = self._server.engine.snapshot()
        yield from self._info(snapshot)
        yield from self._tasks(snapshot)
        yield from self._events(snapshot)
        yield from self._store(snapshot)
        yield from self._requests()
        yield from self._deliveries()
        yield from self._schedules()
        yield from self._topic_settings()
        yield from self._cluster()

    def _topic_settings(self) -> Iterator[Metric]:
        """The topics with settings this node holds (docs/protocol.md, "Topic
        settings"): whether each is paused, and its limits."""
        held = self._server.engine.topics.settings
        now_s = time.time()
        paused = GaugeMetricFamily(
            "delaywheel_topic_paused", "1 while the topic is paused.", labels=["topic"]
        )
        rate = GaugeMetricFamily(
            "delaywheel_topic_rate_limit",
            "The topic's rate limit, tasks a second handed out (topics with one).",
            labels=["topic"],
        )
        concurrency = GaugeMetricFamily(
            "delaywheel_topic_concurrency_limit",
            "The topic's concurrency limit: reserved or delivering at once (topics with one).",
            labels=["topic"],
        )
        for name, settings in sorted(held.items())[: self._topics]:
            paused.add_metric([name], 1 if settings.paused(now_s) else 0)
            if settings.rate is not None:
                rate.add_metric([name], settings.rate)
            if settings.concurrency is not None:
                concurrency.add_metric([name], settings.concurrency)
        yield paused
        yield rate
        yield concurrency

    def _schedules(self) -> Iterator[Metric]:
        """Recurring schedules (docs/schedules.md): those this node serves, and
        what their occurrences did since the start."""
        table = self._server.engine.schedules
        held = table.stats()
        by_paused = GaugeMetricFamily(
            "delaywheel_schedules", "Schedules this node serves, by paused.", labels=["paused"]
        )
        by_paused.add_metric(["false"], held["count"] - held["paused"])
        by_paused.add_metric(["true"], held["paused"])
        yield by_paused
        yield CounterMetricFamily(
            "delaywheel_schedule_occurrences_fired_total",
            "Schedule occurrences fired: their task put (trigger and backfill not counted).",
            value=table.fired,
        )
        skipped = CounterMetricFamily(
            "delaywheel_schedule_occurrences_skipped_total",
            "Schedule occurrences skipped, by reason (overlap: the previous one in flight).",
            labels=["reason"],
        )
        for reason, n in sorted(table.skipped.items()):
            skipped.add_metric([reason], n)
        yield skipped
        yield CounterMetricFamily(
            "delaywheel_schedule_occurrences_missed_total",
            "Schedule occurrences dropped by the catch-up policy after downtime or a forward "
            "clock jump.",
            value=table.missed,
        )
        yield _histogram(
            "delaywheel_schedule_fire_lateness_seconds",
            "How late each fired occurrence was put after its firing time (nominal plus "
            "jitter): a tick when up, the downtime for a catch-up.",
            [((), table.lateness)],
        )

    def _cluster(self) -> Iterator[Metric]:
        """A node in a shared keyspace (docs/ha.md); nothing on a single-node store."""
        coordinator = self._server.coordinator
        if coordinator is None:
            return
        counts = coordinator.counts
        yield GaugeMetricFamily(
            "delaywheel_partitions_owned",
            "Partitions this node serves now.",
            value=len(coordinator.sharing.serving),
        )
        for name, help_text, value in (
            (
                "lease_renewals_failed",
                "Lease renewals that failed.",
                coordinator.keeper.renewals_failed,
            ),
            (
                "fenced_flushes",
                "Journal flushes refused for a partition (fenced).",
                counts.fenced_flushes,
            ),
            ("takeovers", "Partitions acquired and loaded.", counts.takeovers),
            ("handoffs", "Partitions handed back.", counts.handoffs),
            ("partitions_lost", "Leases lost or self-fenced.", counts.lost),
        ):
            yield CounterMetricFamily(f"delaywheel_{name}", help_text, value=value)
        yield CounterMetricFamily(
            "delaywheel_takeover_seconds",
            "Time from acquiring a partition to serving it, summed over takeovers.",
            value=counts.takeover_seconds,
        )
        yield GaugeMetricFamily(
            "delaywheel_partitions_unowned",
            "Partitions whose lease no node held at this node's last look.",
            value=coordinator.unowned(),
        )
        yield CounterMetricFamily(
            "delaywheel_writes_refused_no_replicas",
            "Store writes answered unavailable because WAIT confirmed fewer replicas than "
            "--replicas.",
            value=coordinator.writes_refused_for_replicas(),
        )
        connected = GaugeMetricFamily(
            "delaywheel_redis_replicas_connected",
            "Replicas connected to each Redis primary of the keyspace, as last read.",
            labels=["primary"],
        )
        for primary, count in sorted(coordinator.replicas.connected.items()):
            connected.add_metric([primary], count)
        yield connected
        yield GaugeMetricFamily(
            "delaywheel_replicas_wanted",
            "The --replicas setting.",
            value=coordinator.replicas.wanted,
        )

    def _info(self, snapshot: Snapshot) -> Iterator[Metric]:
        info = GaugeMetricFamily(
            "delaywheel_info", "The server's version and store (1).", labels=["version", "store"]
        )
        info.add_metric([snapshot.version, snapshot.store], 1)
        yield info
        yield GaugeMetricFamily(
            "delaywheel_start_time_seconds",
            "When the server started, in Unix seconds.",
            value=snapshot.started_s,
        )

    def _tasks(self, snapshot: Snapshot) -> Iterator[Metric]:
        counts = snapshot.counts
        by_state = GaugeMetricFamily("delaywheel_tasks", "Tasks by state.", labels=["state"])
        for state, n in counts.by_state().items():
            by_state.add_metric([state], n)
        yield by_state
        named, rest = counts.largest_topics(self._topics)
        by_topic = GaugeMetricFamily(
            "delaywheel_topic_tasks",
            f"Tasks by topic and state, for the {self._topics} topics with the most tasks "
            "(--metrics-topics).",
            labels=["topic", "state"],
        )
        for topic, states in named.items():
            for state, n in states.items():
                by_topic.add_metric([topic, state], n)
        yield by_topic
        other = GaugeMetricFamily(
            "delaywheel_other_topics_tasks",
            "Tasks by state of the topics not in delaywheel_topic_tasks, summed.",
            labels=["state"],
        )
        for state in STATES:
            other.add_metric([state], rest[state])
        yield other
        yield GaugeMetricFamily(
            "delaywheel_topics", "Topics that have a task.", value=counts.topic_count()
        )
        yield GaugeMetricFamily(
            "delaywheel_packed_tasks",
            "Delayed tasks held packed until their window comes (counted in delaywheel_tasks).",
            value=snapshot.packed,
        )
        yield GaugeMetricFamily(
            "delaywheel_waiting_reserves",
            "Blocked reserves waiting for a task.",
            value=snapshot.waiting_reserves,
        )
        yield GaugeMetricFamily(
            "delaywheel_blocked_waits",
            "Blocked waits on a task to be done, dead or gone.",
            value=snapshot.blocked_waits,
        )

    def _events(self, snapshot: Snapshot) -> Iterator[Metric]:
        events = snapshot.events
        for slot, name, doc in _EVENTS:
            yield CounterMetricFamily(name, doc, value=getattr(events, slot))
        yield CounterMetricFamily(
            "delaywheel_tasks_fired_total",
            "Delayed tasks that fell due: made ready, or a delivery attempt started.",
            value=events.fired - events.expired,
        )
        yield CounterMetricFamily(
            "delaywheel_task_deaths_total",
            "Tasks made dead: their last attempt failed (a TTR run out, a release, a failed "
            "delivery).",
            value=snapshot.deaths,
        )
        yield _histogram(
            "delaywheel_fire_lateness_seconds",
            "How late the wheel fired each timer: a delayed task after its due time, a "
            "reservation after its deadline. The tick's rounding up is included.",
            [((), snapshot.lateness)],
        )

    def _store(self, snapshot: Snapshot) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "delaywheel_store_up",
            "0 from a store write that failed until one succeeds, else 1.",
            value=1 if snapshot.store_up else 0,
        )
        yield CounterMetricFamily(
            "delaywheel_store_flushes_total", "Store writes that succeeded.", value=snapshot.flushes
        )
        yield CounterMetricFamily(
            "delaywheel_store_errors_total",
            "Store writes that failed (their requests answered unavailable).",
            value=snapshot.store_errors,
        )
        yield _histogram(
            "delaywheel_store_flush_seconds",
            "How long store writes that succeeded took (not kept for memory://).",
            [((), snapshot.flush_seconds)],
        )
        yield _histogram(
            "delaywheel_store_flush_changes",
            "Changes per store write that succeeded: group commit (not kept for memory://).",
            [((), snapshot.flush_changes)],
        )

    def _requests(self) -> Iterator[Metric]:
        server = self._server
        methods = [*server.routes.values(), server.unknown]
        calls = CounterMetricFamily(
            "delaywheel_requests_total",
            "Requests by method (unknown: any name that is not a method).",
            labels=["method"],
        )
        errors = CounterMetricFamily(
            "delaywheel_request_errors_total",
            "Error replies by method and error code.",
            labels=["method", "code"],
        )
        for method in sorted(methods, key=lambda method: method.name):
            calls.add_metric([method.name], method.calls)
            for code, n in sorted(method.errors.items()):
                errors.add_metric([method.name, code], n)
        yield calls
        yield errors
        yield GaugeMetricFamily(
            "delaywheel_connections", "Client connections open.", value=len(server.connections)
        )
        yield CounterMetricFamily(
            "delaywheel_connections_accepted_total",
            "Client connections accepted.",
            value=server.accepted,
        )
        refused = CounterMetricFamily(
            "delaywheel_connections_refused_total",
            "Connections the server closed: bad input, a limit, a message timeout; by error code.",
            labels=["code"],
        )
        # Every known code from the start, at 0: a panel shows a flat line, not "No data".
        counts = {code: 0 for code in REFUSAL_CODES} | dict(server.refused)
        for code, n in sorted(counts.items()):
            refused.add_metric([code], n)
        yield refused
        accept_errors = CounterMetricFamily(
            "delaywheel_accept_errors_total",
            "Accepts that failed for want of a resource (EMFILE: the open files limit), by errno.",
            labels=["errno"],
        )
        for name, n in sorted(server.accept_errors.items()):
            accept_errors.add_metric([name], n)
        yield accept_errors
        signins = server.signins
        for name, counts, text in (
            ("failures", signins.failures, "Wrong tokens given"),
            ("refused", signins.refused, "Sign-ins refused unread after failures from the address"),
        ):
            family = CounterMetricFamily(
                f"delaywheel_auth_{name}_total",
                f"{text}, by door (protocol auth, dashboard api, sign_in form).",
                labels=["door"],
            )
            for door, n in counts.items():
                family.add_metric([door], n)
            yield family

    def _deliveries(self) -> Iterator[Metric]:
        deliveries = self._server.deliveries
        dispatcher = None if deliveries is None else deliveries.dispatcher
        durations: Mapping[tuple[str, str], Histogram] = (
            {} if dispatcher is None else dispatcher.durations
        )
        done = CounterMetricFamily(
            "delaywheel_deliveries_total",
            "Delivery attempts by target type and outcome (delivered or failed).",
            labels=["target", "outcome"],
        )
        counts = {pair: 0 for pair in itertools.product(DELIVERY_TARGETS, DELIVERY_OUTCOMES)}
        counts |= {pair: histogram.count for pair, histogram in durations.items()}
        for (target, outcome), n in sorted(counts.items()):
            done.add_metric([target, outcome], n)
        yield done
        yield _histogram(
            "delaywheel_delivery_seconds",
            "How long delivery attempts took, by target type and outcome.",
            sorted(durations.items()),
            labels=["target", "outcome"],
        )
        stats = {} if dispatcher is None else dispatcher.stats()
        yield GaugeMetricFamily(
            "delaywheel_deliveries_in_flight",
            "Delivery attempts being sent.",
            value=stats.get("in_flight", 0),
        )
        yield GaugeMetricFamily(
            "delaywheel_deliveries_waiting",
            "Delivery attempts waiting for their destination's turn.",
            value=stats.get("waiting", 0),
        )
        brokers = GaugeMetricFamily(
            "delaywheel_broker_up",
            "1 while the server is connected to the broker, else 0.",
            labels=["broker", "kind"],
        )
        if deliveries is not None:
            for name, state in deliveries.brokers.state().items():
                brokers.add_metric([name, state["kind"]], 1 if state["connected"] else 0)
        yield brokers


def _histogram(
    name: str,
    doc: str,
    series: list[tuple[tuple[str, ...], Histogram]],
    labels: list[str] | None = None,
) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, doc, labels=labels or [])
    for values, histogram in series:
        buckets = [(_le(bound), n) for bound, n in histogram.cumulative()]
        family.add_metric(list(values), buckets, histogram.total)
    return family


def _le(bound: float) -> str:
    """A bucket's bound as Prometheus writes ``le`` (``0.25``, ``1.0``, ``+Inf``)."""
    return "+Inf" if bound == math.inf else repr(float(bound))


def registry_for(server: Server, *, topics: int) -> CollectorRegistry:
    """A registry of our own (not prometheus-client's global one) with the
    server's metrics and the process's (CPU, memory, file descriptors, GC)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ServerCollector(server, topics=topics))
    ProcessCollector(registry=registry)
    GCCollector(registry=registry)
    PlatformCollector(registry=registry)
    return registry


class MetricsEndpoint:
    """``GET /metrics`` on its own port, served on the running event loop."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry
        self._runner: web.AppRunner | None = None
        self._site: BoundedSite | None = None

    async def start(self, host: str, port: int) -> tuple[str, int]:
        """Listen; returns the address (the port picked when ``port`` is 0)."""
        app = web.Application()
        app.router.add_get(PATH, self._scrape)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        self._site = site = BoundedSite(runner, max_connections=METRICS_CONNECTIONS, name="metrics")
        try:
            address = await site.start(host, port)
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        return address

    async def _scrape(self, request: web.Request) -> web.Response:
        encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
        return web.Response(body=encoder(self._registry), headers={"Content-Type": content_type})

    async def stop(self) -> None:
        if self._site is not None:
            await self._site.stop()
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
