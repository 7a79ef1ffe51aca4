"""The open-files limit at start: raised to what ``--max-connections`` needs.

Every client connection is a file descriptor, and so is every socket of the
store, the brokers, the HTTP deliveries and the metrics endpoint. Linux
starts a process with a soft limit of 1,024 open files, far below the
default ``--max-connections`` (10,000): without this, the 1,021st client's
connection fails. So at start the server raises its soft ``RLIMIT_NOFILE``
to the connections plus ``reserved_descriptors``, as Redis does for its
``maxclients``. Only the hard limit caps it, and only root (or the service
manager: ``LimitNOFILE=`` in systemd, ``ulimits: nofile:`` in compose) can
raise that; when it falls short the server says so in one line and serves
what it can. docs/operations.md ("Connections") has the sizing.
"""

from __future__ import annotations

import logging
import resource
from contextlib import suppress
from dataclasses import dataclass
from urllib.parse import urlsplit

from delaywheel.config import Settings
from delaywheel.delivery.brokers import kind_of_url, parse_broker_specs

log = logging.getLogger("delaywheel")  # the start-up lines' logger

# What the process holds besides its sockets: stdin, stdout and stderr, the
# event loop's own descriptors (epoll, its wake-up pipe or eventfd, the
# signal pipe), uvloop's reserve descriptor, the listening sockets, files
# being read (certificates, /dev/urandom), DNS lookups of HTTP deliveries.
MARGIN_DESCRIPTORS = 64
# A SQLite store: the database, its -wal and -shm files, and a journal.
SQLITE_DESCRIPTORS = 4
# A Redis store: the journal's connection and redis-py's for the checks and
# the loading; as the ``store`` broker, a pool like any Redis broker's.
REDIS_STORE_DESCRIPTORS = 4
# redis-py's asyncio pool holds at most 100 connections (the Redis lane keeps
# 64 pushes in flight within it: delivery/dispatcher.py).
REDIS_BROKER_DESCRIPTORS = 100
# RabbitMQ and NATS: one connection each, and a reconnect overlapping it.
BROKER_DESCRIPTORS = 2
# Connections the metrics endpoint serves at once (more are answered 503,
# net/httpsite.py): Prometheus and a person or two.
METRICS_CONNECTIONS = 15
# Connections the dashboard serves at once (more are answered 503): a browser
# keeps about six to a host, and each open page one more for its event stream.
WEB_CONNECTIONS = 128
# Each of those, and its listening socket.
METRICS_DESCRIPTORS = METRICS_CONNECTIONS + 1
WEB_DESCRIPTORS = WEB_CONNECTIONS + 1
# Connections the HTTP API serves at once (more are answered 503): each held
# long poll is one, so room for a fleet of workers; and the forwarding
# client's connections to the other nodes (one per node: a margin of them).
API_CONNECTIONS = 1024
API_DESCRIPTORS = API_CONNECTIONS + 1 + 16


def reserved_descriptors(settings: Settings) -> int:
    """Descriptors the server may hold besides its client connections."""
    reserved = MARGIN_DESCRIPTORS + settings.http_concurrency  # aiohttp's pool limit
    scheme = urlsplit(settings.store_url).scheme
    if scheme.startswith("sqlite"):
        reserved += SQLITE_DESCRIPTORS
    elif scheme.startswith("redis"):
        reserved += REDIS_STORE_DESCRIPTORS + REDIS_BROKER_DESCRIPTORS  # the `store` broker
    for url in parse_broker_specs(list(settings.brokers)).values():
        redis = kind_of_url(url) == "redis"
        reserved += REDIS_BROKER_DESCRIPTORS if redis else BROKER_DESCRIPTORS
    if settings.metrics_port is not None:
        reserved += METRICS_DESCRIPTORS
    if settings.web_port is not None:
        reserved += WEB_DESCRIPTORS
    if settings.api_port is not None:
        reserved += API_DESCRIPTORS
    return reserved


@dataclass(frozen=True)
class OpenFiles:
    """The soft limit before and after, the hard limit, and what was wanted."""

    before: int
    soft: int
    hard: int  # resource.RLIM_INFINITY when unlimited
    wanted: int
    reserved: int

    @property
    def short(self) -> bool:
        return self.soft < self.wanted


def raise_open_files_limit(settings: Settings) -> OpenFiles:
    """Raise the soft open-files limit to what ``settings`` need, up to the hard
    limit, and log what was done: one line when it was raised, a warning when
    the hard limit (or the kernel's ``fs.nr_open``) left it short."""
    reserved = reserved_descriptors(settings)
    wanted = settings.max_connections + reserved
    before, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    soft = before
    if soft != resource.RLIM_INFINITY and soft < wanted:
        target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        with suppress(ValueError, OSError):  # over fs.nr_open: keep what we have
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    result = OpenFiles(before, soft, hard, wanted, reserved)
    if result.short:
        _log_short(result, settings.max_connections)
    elif soft != before:
        log.info(
            "open files limit raised from %d to %d: --max-connections %d and %d for "
            "the store, brokers, deliveries, metrics, dashboard and a margin",
            *(before, soft, settings.max_connections, reserved),
            extra={"before": before, "limit": soft, "wanted": wanted},
        )
    return result


def _log_short(result: OpenFiles, max_connections: int) -> None:
    hard = "unlimited" if result.hard == resource.RLIM_INFINITY else str(result.hard)
    log.warning(
        "open files limit is %d (hard limit %s), below the %d that --max-connections %d "
        "needs (and %d for the store, brokers, deliveries, metrics, dashboard and a margin): fewer "
        "than %d connections can be open at once, the rest wait to be accepted. Raise the "
        "hard limit (LimitNOFILE= in systemd, ulimits: nofile: in compose, ulimit -Hn in a "
        "shell) or lower --max-connections",
        *(result.soft, hard, result.wanted, max_connections, result.reserved, result.soft),
        extra={"limit": result.soft, "hard_limit": hard, "wanted": result.wanted},
    )
