"""Start-up and shutdown: open the store, rebuild the engine, serve until a signal.

While the store loads, the port is not open yet: clients get "connection
refused" rather than a server that would answer from half its tasks. The
project's client retries a request it could not send ``retries`` times (3 by
default, 0.35 s of backoff in all), so a longer load (about 1.5 s a million
tasks, docs/performance.md) reaches the caller as a connection error; the
client's ``retries`` raises that bound (docs/operations.md, "Restarts").
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import socket
import ssl
import time
from typing import TYPE_CHECKING, NamedTuple

from delaywheel import __version__
from delaywheel.config import DEFAULT_LEASE_S, Settings
from delaywheel.delivery.service import Deliveries, target_rules
from delaywheel.engine.attempts import RetryPolicy
from delaywheel.engine.engine import Engine
from delaywheel.ha.coordinator import Coordinator
from delaywheel.ha.rights import NodeRights
from delaywheel.ha.sharing import Sharing
from delaywheel.logs import shown_settings, start_line
from delaywheel.net.limits import raise_open_files_limit
from delaywheel.net.listen import listen_error
from delaywheel.net.server import Server
from delaywheel.net.tls import tls_of
from delaywheel.store import Store, is_redis_url, open_store
from delaywheel.store.redis import DEFAULT_PARTITIONS, RedisStore

if TYPE_CHECKING:
    from delaywheel.httpapi.site import HttpApi
    from delaywheel.metrics import MetricsEndpoint
    from delaywheel.web.site import Dashboard

log = logging.getLogger("delaywheel")

# The collector's thresholds while serving: a young collection every 20,000
# allocations instead of every 700, the middle generation every 50 of those,
# the full one as by default. Each add leaves a task that lives until it is
# due, which the default settings rescan again and again: under a stream of
# adds the collector took a large share of the server's time, and journaled
# adds were faster in every measured pair with these thresholds
# (docs/performance.md, "Measurements behind the code"). Cyclic garbage is
# still collected, in larger batches.
GC_THRESHOLDS = (20_000, 50, 10)


async def serve(settings: Settings, *, ready: asyncio.Event | None = None) -> None:
    """Run the server until SIGINT or SIGTERM (or the task is cancelled)."""
    tls = tls_of(settings)  # first: a bad file stops the start with its name alone
    store, keyspace = shared_store(settings)
    await store.open()  # the Redis store's errors say what to do (store/redis/topology.py)
    # Not before the store is open: a server that cannot open it exits with
    # one line (the error, which names the store) and nothing else.
    _log_start(settings, store)
    raise_open_files_limit(settings)
    try:
        for warning in store.warnings():
            log.warning("store %s: %s", store.url, warning)
        server, coordinator = _assemble(settings, store, keyspace, tls)
        if coordinator is not None:
            await _take_partitions(coordinator, server, store)
        else:
            await recover(server.engine, store)
        await _listen_until_stopped(server, coordinator, settings, ready)
    finally:
        await store.close()


def _log_start(settings: Settings, store: Store) -> None:
    log.info(
        "delaywheel %s starting: %s",
        *(__version__, start_line(settings)),
        extra={"version": __version__, "settings": shown_settings(settings)},
    )
    log.info("store %s connected", store.url, extra={"store": store.url})
    if settings.open_to_anyone:  # allowed by --insecure-no-auth alone
        log.warning(
            "--insecure-no-auth: listening on %r with no token and no client certificates:"
            " anyone who can reach the port can add, delete and read every task",
            settings.host,
        )


def _assemble(
    settings: Settings,
    store: Store,
    keyspace: Keyspace | None = None,
    tls: ssl.SSLContext | None = None,
) -> tuple[Server, Coordinator | None]:
    """The engine over ``store``, its deliveries and server; a coordinator when
    the store is a keyspace that nodes share (``keyspace``: shared_store's)."""
    rules = target_rules(
        http_allow=settings.http_allow,
        brokers=settings.brokers,
        store_url=settings.store_url,  # store.url hides the password
        store_prefix=settings.redis_prefix,
    )
    sharing = None if keyspace is None else keyspace.sharing
    engine = Engine(
        store,
        now_s=time.time(),
        slots=settings.slots,
        tick_s=settings.tick_s,
        limits=settings.limits,
        targets=rules,
        retry=RetryPolicy(settings.retry_base_s, settings.retry_cap_s),
        ownership=sharing,
        slow_flush_s=settings.slow_flush_s,
        dead_retention_s=settings.dead_retention_s,
        horizon_s=settings.horizon,
    )
    deliveries = Deliveries(
        rules,
        http_concurrency=settings.http_concurrency,
        signing_secret=settings.signing_secret,
    )
    coordinator = _coordinator(settings, engine, keyspace, sharing)
    return Server(settings, engine, deliveries, coordinator, tls=tls), coordinator


def _coordinator(
    settings: Settings, engine: Engine, keyspace: Keyspace | None, sharing: Sharing | None
) -> Coordinator | None:
    if keyspace is None or sharing is None:
        return None
    return Coordinator(
        engine,
        keyspace.store,
        sharing,
        keyspace.rights,
        handoff_wait_s=settings.shutdown_grace_s,
    )


async def _listen_until_stopped(
    server: Server,
    coordinator: Coordinator | None,
    settings: Settings,
    ready: asyncio.Event | None,
) -> None:
    """Start the metrics, HTTP API and dashboard listeners, then the port; at a
    signal, stop them in this order: the HTTP API (its long polls are answered),
    the dashboard (its streams and bulk jobs end), the server (its deliveries
    get their grace), the coordinator (then it hands the partitions back), the
    metrics last. On a shared keyspace the coordinator
    runs the server's stop before its own, within one bound counted from the
    signal (ha/coordinator.py): both wait on Redis."""
    async with contextlib.AsyncExitStack() as running:
        metrics = await _start_metrics(server, settings)
        if metrics is not None:
            running.push_async_callback(metrics.stop)
        api = await _start_api(server, settings)
        dashboard = await _start_dashboard(server, settings, api)
        # Handlers first: a signal right after the listening line (a test, a
        # supervisor) must stop the server cleanly, not kill it.
        stop = _stop_on_signal()
        try:
            host, port = await server.start()
        except OSError as exc:  # the port is taken, or the address is not ours
            _remove_signal_handlers()
            if dashboard is not None:
                await dashboard.stop()
            if api is not None:
                await api.stop()
            raise listen_error("the server", settings.host, settings.port, "--port", exc) from None
        if coordinator is not None:
            running.push_async_callback(coordinator.stop, server)
        else:
            running.push_async_callback(server.stop)
        if dashboard is not None:
            running.push_async_callback(dashboard.stop)
        if api is not None:  # first: its long polls are answered, its forwarding ends
            running.push_async_callback(api.stop)
        running.callback(log.info, "shutting down")
        running.callback(_remove_signal_handlers)
        # Tests and scripts read this line to learn the port when given port 0
        # (tests/serverproc.py); what follows the port is free text.
        log.info("delaywheel listening on %s:%d%s", host, port, _tls_note(settings))
        if ready is not None:
            ready.set()
        await stop.wait()


class Keyspace(NamedTuple):
    """The Redis store, a keyspace nodes share, and this node's rights in it and
    partitions it serves."""

    store: RedisStore
    rights: NodeRights
    sharing: Sharing


def shared_store(settings: Settings) -> tuple[Store, Keyspace | None]:
    """The store of ``settings``; a Redis one is a keyspace nodes share, whose
    partitions this node writes as its coordinator lets it (store/redis/owner.py)."""
    if not is_redis_url(settings.store_url):
        return open_store(settings.store_url), None
    partitions = settings.partitions or DEFAULT_PARTITIONS
    rights = NodeRights(_sharing(settings, partitions))
    store = RedisStore(
        settings.store_url,
        prefix=settings.redis_prefix,
        partitions=partitions,
        replicas=settings.replicas or 0,
        owner=rights,
        node_name=_node_name(settings),
    )
    return store, Keyspace(store, rights, rights.sharing)


def _node_name(settings: Settings) -> str:
    # Host name and the configured port: the same again after a restart, so a
    # node killed and started again takes its partitions back at once (its
    # leases name it). With --port 0 that is "host:0" for every such server
    # on the host: two of them on one keyspace need --node (docs/ha.md).
    return settings.node or f"{socket.gethostname()}:{settings.port}"


def _sharing(settings: Settings, partitions: int) -> Sharing:
    host = socket.gethostname()
    node = _node_name(settings)
    listen = settings.host if settings.host not in ("", "0.0.0.0", "::") else host
    address = settings.advertise or f"{listen}:{settings.port}"
    return Sharing(
        node=node,
        address=address,
        partitions=partitions,
        lease_s=settings.lease_s or DEFAULT_LEASE_S,
    )


async def _take_partitions(coordinator: Coordinator, server: Server, store: Store) -> None:
    """Join the keyspace: take this node's partitions and load them, before serving."""
    started = time.perf_counter()
    gc.disable()
    try:
        await coordinator.start(server.rearm)
    finally:
        gc.freeze()
        gc.set_threshold(*GC_THRESHOLDS)
        gc.enable()
    took_s = time.perf_counter() - started
    loaded, url = len(server.engine.table.index), store.url
    log.info(
        "loaded %d tasks from %s in %.2f s",
        *(loaded, url, took_s),
        extra={"tasks": loaded, "store": url, "duration_s": round(took_s, 3)},
    )


async def _start_metrics(server: Server, settings: Settings) -> MetricsEndpoint | None:
    """The Prometheus endpoint, when ``--metrics-port`` is given (docs/metrics.md)."""
    if settings.metrics_port is None:
        return None
    # Imported only now: aiohttp and prometheus-client take a tenth of a
    # second to import, which a server without metrics need not spend.
    from delaywheel.metrics import MetricsEndpoint, registry_for

    endpoint = MetricsEndpoint(registry_for(server, topics=settings.metrics_topics))
    try:
        host, port = await endpoint.start(settings.metrics_host, settings.metrics_port)
    except OSError as exc:
        where = (settings.metrics_host, settings.metrics_port)
        raise listen_error("metrics", *where, "--metrics-port", exc) from None
    shown = f"[{host}]" if ":" in host else host
    # Like the listening line, tests read the port from it when given 0.
    log.info(
        "metrics on http://%s:%d/metrics",
        shown,
        port,
        extra={"url": f"http://{shown}:{port}/metrics"},
    )
    return endpoint


async def _start_api(server: Server, settings: Settings) -> HttpApi | None:
    """The HTTP API, when ``--api-port`` is given (docs/http.md)."""
    if settings.api_port is None:
        return None
    from delaywheel.httpapi.site import HttpApi  # aiohttp: only when served

    api = HttpApi(server)
    try:
        host, port = await api.start(settings.api_host, settings.api_port, server.listener.tls)
    except OSError as exc:
        await api.stop()
        raise listen_error(
            "the HTTP API", settings.api_host, settings.api_port, "--api-port", exc
        ) from None
    shown = f"[{host}]" if ":" in host else host
    scheme = "https" if settings.tls_cert is not None else "http"
    url = f"{scheme}://{shown}:{port}/v1"
    # Like the listening line, tests read the port from it when given 0.
    log.info("http api on %s", url, extra={"url": url})
    return api


async def _start_dashboard(
    server: Server, settings: Settings, api: HttpApi | None = None
) -> Dashboard | None:
    """The web dashboard, when ``--web-port`` is given (docs/dashboard.md), with the HTTP
    API under /v1 when that is on too."""
    if settings.web_port is None:
        return None
    # Imported only now, like metrics: Jinja2 and the site are not a cost of
    # a server without a dashboard.
    from delaywheel.web.site import Dashboard

    mounts = {} if api is None else {"/v1": api.app()}
    dashboard = Dashboard(server, mounts)
    try:
        host, port = await dashboard.start(settings.web_host, settings.web_port)
    except OSError as exc:
        raise listen_error(
            "the dashboard", settings.web_host, settings.web_port, "--web-port", exc
        ) from None
    if settings.token is None and settings.web_insecure:
        log.warning(
            "--web-insecure: the dashboard on %r has no sign-in: anyone who can reach it can"
            " read, kick and delete every task",
            settings.web_host,
        )
    shown = f"[{host}]" if ":" in host else host
    scheme = "https" if settings.tls_cert is not None else "http"
    url = f"{scheme}://{shown}:{port}{settings.web_base_path}/"
    # Like the listening line, tests read the port from it when given 0.
    log.info("dashboard on %s", url, extra={"url": url})
    return dashboard


def _tls_note(settings: Settings) -> str:
    if settings.tls_cert is None:
        return ""
    return " (TLS, client certificates required)" if settings.tls_client_ca else " (TLS)"


async def recover(engine: Engine, store: Store) -> int:
    """Load every task from the store into the engine; returns how many.

    The collector is off while loading: a million new long-lived objects would
    trigger collections that rescan the growing heap again and again (it
    doubled load time when measured). Afterwards the loaded tasks are frozen
    out of collection, since they live until they are due, and the collector
    runs with ``GC_THRESHOLDS``.
    """
    started = time.perf_counter()
    gc.disable()
    try:
        loaded = await engine.load(store.load())
    finally:
        # Freeze before enabling: otherwise the first allocation afterwards
        # sets off a full collection over everything just loaded.
        gc.freeze()
        gc.set_threshold(*GC_THRESHOLDS)
        gc.enable()
    took_s = time.perf_counter() - started
    log.info(
        "loaded %d tasks from %s in %.2f s",
        *(loaded, store.url, took_s),
        extra={"tasks": loaded, "store": store.url, "duration_s": round(took_s, 3)},
    )
    return loaded


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _stop_on_signal() -> asyncio.Event:
    """An event set by SIGINT or SIGTERM (the handlers stay until removed)."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in _STOP_SIGNALS:
        loop.add_signal_handler(signum, stop.set)
    return stop


def _remove_signal_handlers() -> None:
    loop = asyncio.get_running_loop()
    for signum in _STOP_SIGNALS:
        loop.remove_signal_handler(signum)


def run(settings: Settings) -> None:
    """Run ``serve`` on uvloop when it is installed, else on asyncio's own loop."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(settings))
    else:
        uvloop.run(serve(settings))
