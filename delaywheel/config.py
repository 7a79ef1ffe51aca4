"""Server settings: one dataclass with the defaults, checked in one place.

The CLI fills it from flags and ``DELAYWHEEL_*`` environment variables; tests
build it directly.
"""

from __future__ import annotations

import ipaddress
import math
import re
from dataclasses import dataclass

from delaywheel_client.protocol import DEFAULT_MAX_MESSAGE_BYTES

# Re-exported: the CLI takes every default from here. Each is defined once,
# by the layer that applies it.
from delaywheel.engine.retry import DEFAULT_RETRY_BASE_S as DEFAULT_RETRY_BASE_S
from delaywheel.engine.retry import DEFAULT_RETRY_CAP_S as DEFAULT_RETRY_CAP_S
from delaywheel.engine.validate import DEFAULT_MAX_BODY_BYTES as DEFAULT_MAX_BODY_BYTES
from delaywheel.engine.validate import DEFAULT_MAX_DELAY_S as DEFAULT_MAX_DELAY_S
from delaywheel.engine.validate import DEFAULT_MAX_RESULT_BYTES as DEFAULT_MAX_RESULT_BYTES
from delaywheel.engine.validate import Limits
from delaywheel.store.base import redact_url
from delaywheel.store.redis.layout import check_partitions
from delaywheel.store.watch import DEFAULT_SLOW_FLUSH_S as DEFAULT_SLOW_FLUSH_S
from delaywheel.wheel import DEFAULT_SLOTS, DEFAULT_TICK_S, MAX_SLOTS, MIN_TICK_S

# The shortest --horizon: the two windows of packed tasks the engine decodes
# ahead (engine/cold.py, a minute each) must fit below it.
MIN_HORIZON_S = 120.0
# The default's floor: a fast tick shortens the lap, not what memory should hold
# (an hour of tasks, as the default wheel's lap).
DEFAULT_HORIZON_S = 3600.0

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 3450
DEFAULT_STORE = "redis://127.0.0.1:6379/0"
DEFAULT_MAX_CONNECTIONS = 10_000
DEFAULT_MESSAGE_TIMEOUT_S = 30.0
# A connection to a server with a token must sign in within this long: idle
# connections that never do would otherwise hold --max-connections' slots.
DEFAULT_AUTH_TIMEOUT_S = 10.0
# Without --max-connections-per-address, one address may hold this share of
# --max-connections: an application's hosts each keep a pool of connections,
# and no one of them (or an attacker's) may take every slot. But always at
# least a small pool's worth (or all, when --max-connections is smaller).
DEFAULT_PER_ADDRESS_SHARE = 4  # a quarter
MIN_PER_ADDRESS = 16
DEFAULT_HTTP_ALLOW = "public"
DEFAULT_HTTP_CONCURRENCY = 64
DEFAULT_SHUTDOWN_GRACE_S = 10.0
# Topics named in the per-topic task metrics; the rest are summed apart
# (docs/metrics.md): each topic is a series per state in Prometheus.
DEFAULT_METRICS_TOPICS = 20
# Requests the HTTP API runs at once; a long poll that waits is not counted.
DEFAULT_API_MAX_REQUESTS = 256
DEFAULT_LEASE_S = 10.0
MIN_LEASE_S = 0.5
MAX_LEASE_S = 600.0
REDIS_SCHEMES = ("redis://", "rediss://", "redis+sentinel://")


# --web-base-path: where a reverse proxy mounts the dashboard.
_BASE_PATH = re.compile(r"(/[A-Za-z0-9._~-]+)+")


class ConfigError(ValueError):
    """A setting out of range; the message names it and its value."""


@dataclass(frozen=True)
class Settings:
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    store_url: str = DEFAULT_STORE
    redis_prefix: str = "delaywheel"
    slots: int = DEFAULT_SLOTS
    tick_s: float = DEFAULT_TICK_S
    token: str | None = None
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    max_delay_s: float = DEFAULT_MAX_DELAY_S
    # An ack's result, and an HTTP target's answer kept with a done task.
    max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES
    # How long a dead task is kept before it goes; None: for ever.
    dead_retention_s: float | None = None
    # Delayed tasks due beyond this are kept only in the store (engine/horizon.py);
    # None: one lap of the wheel (slots x tick), at least DEFAULT_HORIZON_S.
    horizon_s: float | None = None
    # A message must complete within this long of the previous one, or the
    # connection is closed: half-sent messages pin memory (msgpack allocates
    # containers from their headers), so a peer may not park them forever.
    message_timeout_s: float = DEFAULT_MESSAGE_TIMEOUT_S
    # Delivery (docs/delivery.md): where HTTP targets may point, how many
    # requests are in flight to one destination, the key that signs them,
    # the brokers tasks may name (NAME=URL each), and the retry schedule.
    http_allow: str = DEFAULT_HTTP_ALLOW
    http_concurrency: int = DEFAULT_HTTP_CONCURRENCY
    signing_secret: str | None = None
    brokers: tuple[str, ...] = ()
    retry_base_s: float = DEFAULT_RETRY_BASE_S
    retry_cap_s: float = DEFAULT_RETRY_CAP_S
    # How long deliveries in flight may take to finish after SIGTERM.
    shutdown_grace_s: float = DEFAULT_SHUTDOWN_GRACE_S
    # TLS (docs/operations.md, "TLS"): PEM paths of the server's certificate
    # chain and key, both or neither, and the CA that client certificates
    # must be signed by (mutual TLS), which needs them.
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None
    # A store write that takes this long or more is logged (docs/operations.md,
    # "Logging"): the store is struggling before it fails.
    slow_flush_s: float = DEFAULT_SLOW_FLUSH_S
    # Prometheus metrics over HTTP (docs/metrics.md): off while the port is
    # None; 0 picks a free port.
    metrics_port: int | None = None
    metrics_host: str = DEFAULT_HOST
    metrics_topics: int = DEFAULT_METRICS_TOPICS
    # Protected mode, as Redis has it: listening beyond loopback with no token
    # and no client certificates is refused unless this says it is meant
    # (docs/operations.md, "Security"); then every start logs a warning.
    insecure_no_auth: bool = False
    # High availability (docs/ha.md): several nodes on one Redis keyspace.
    # None means "not given": every Redis node shares the keyspace anyway, with
    # these defaults (the node's name: host name and port; its address: the
    # listen address; 16 partitions; a 10 s lease; no replicas awaited).
    node: str | None = None
    advertise: str | None = None
    partitions: int | None = None
    lease_s: float | None = None
    replicas: int | None = None
    # The web dashboard (docs/dashboard.md): off while the port is None. It
    # signs in with --token (the admin) or this viewer token (read-only);
    # with no token it serves loopback peers only, unless web_insecure.
    web_port: int | None = None
    web_host: str = DEFAULT_HOST
    web_base_path: str = ""
    web_viewer_token: str | None = None
    web_hide_bodies: bool = False  # viewers see no task bodies
    web_insecure: bool = False
    # Connections (docs/operations.md, "Connections"): on a server with a
    # token, one that has not signed in within auth_timeout_s is closed; one
    # address may hold at most max_connections_per_address (None: a quarter
    # of max_connections, ``connections_per_address``).
    auth_timeout_s: float = DEFAULT_AUTH_TIMEOUT_S
    max_connections_per_address: int | None = None
    # The HTTP API (docs/http.md): off while the port is None; on the
    # dashboard's port too when both are on. At most api_max_requests
    # requests run at once (long polls aside); more are answered 503.
    api_port: int | None = None
    api_host: str = DEFAULT_HOST
    api_max_requests: int = DEFAULT_API_MAX_REQUESTS

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port must be 0 to 65535, got {self.port}")
        if not 1 <= self.slots <= MAX_SLOTS:
            raise ConfigError(f"slots must be 1 to {MAX_SLOTS}, got {self.slots}")
        if not math.isfinite(self.tick_s) or self.tick_s < MIN_TICK_S:
            raise ConfigError(f"tick must be at least {MIN_TICK_S} s, got {self.tick_s}")
        if self.max_message_bytes < 1024:
            raise ConfigError(
                f"max message must be at least 1024 bytes, got {self.max_message_bytes}"
            )
        if not 1 <= self.max_body_bytes <= self.max_message_bytes:
            raise ConfigError(
                f"max body must be 1 to max message ({self.max_message_bytes}) bytes, "
                f"got {self.max_body_bytes}"
            )
        if not 1 <= self.max_result_bytes <= self.max_message_bytes:
            raise ConfigError(
                f"max result must be 1 to max message ({self.max_message_bytes}) bytes, "
                f"got {self.max_result_bytes}"
            )
        if self.dead_retention_s is not None and not (
            math.isfinite(self.dead_retention_s) and self.dead_retention_s > 0
        ):
            raise ConfigError(f"dead retention must be > 0 s, got {self.dead_retention_s}")
        if self.horizon_s is not None and not (
            math.isfinite(self.horizon_s) and self.horizon_s >= MIN_HORIZON_S
        ):
            raise ConfigError(
                f"horizon must be at least {MIN_HORIZON_S:g} s (two minutes),"
                f" got {self.horizon_s:g}"
            )
        if self.max_connections < 1:
            raise ConfigError(f"max connections must be at least 1, got {self.max_connections}")
        if not self.message_timeout_s > 0:
            raise ConfigError(f"message timeout must be > 0 s, got {self.message_timeout_s}")
        if not (math.isfinite(self.slow_flush_s) and self.slow_flush_s > 0):
            raise ConfigError(f"slow flush must be > 0 s, got {self.slow_flush_s}")
        if self.token == "":
            raise ConfigError("token must not be empty (leave it unset for no auth)")
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise ConfigError(f"metrics port must be 0 to 65535, got {self.metrics_port}")
        if self.metrics_topics < 0:
            raise ConfigError(f"metrics topics must be at least 0, got {self.metrics_topics}")
        if self.open_to_anyone and not self.insecure_no_auth:
            raise ConfigError(
                f"--host {self.host!r} listens beyond this machine with no token: anyone who can"
                " reach the port could add, delete and read every task. Set --token"
                " (DELAYWHEEL_TOKEN), which clients then send, or pass --insecure-no-auth if"
                " that is meant (--tls-client-ca, requiring client certificates, also does)"
            )
        self._check_delivery()
        self._check_cluster()
        self._check_web()
        self._check_api()
        self._check_tls()
        self._check_connections()

    def _check_delivery(self) -> None:
        if self.http_concurrency < 1:
            raise ConfigError(f"http concurrency must be at least 1, got {self.http_concurrency}")
        if self.signing_secret == "":
            raise ConfigError("signing secret must not be empty (leave it unset to not sign)")
        if not (math.isfinite(self.retry_base_s) and self.retry_base_s > 0):
            raise ConfigError(f"retry base must be > 0 s, got {self.retry_base_s}")
        if not (math.isfinite(self.retry_cap_s) and self.retry_cap_s >= self.retry_base_s):
            raise ConfigError(
                f"retry cap must be at least the retry base ({self.retry_base_s} s), "
                f"got {self.retry_cap_s}"
            )
        if not (math.isfinite(self.shutdown_grace_s) and self.shutdown_grace_s >= 0):
            raise ConfigError(f"shutdown grace must be >= 0 s, got {self.shutdown_grace_s}")
        # Parsed here too, so that a bad value stops the start with its message,
        # which names the option (--http-allow) or the spec (broker 'NAME=URL').
        from delaywheel.delivery.allow import AllowList
        from delaywheel.delivery.brokers import parse_broker_specs

        try:
            AllowList.parse(self.http_allow).check_names_resolve()
            parse_broker_specs(list(self.brokers))
        except ValueError as exc:
            raise ConfigError(str(exc)) from None

    def _check_cluster(self) -> None:
        given = [
            flag
            for flag, value in (
                ("--node", self.node),
                ("--advertise", self.advertise),
                ("--partitions", self.partitions),
                ("--lease", self.lease_s),
                ("--replicas", self.replicas),
            )
            if value is not None
        ]
        if given and not self.store_url.startswith(REDIS_SCHEMES):
            raise ConfigError(
                f"{', '.join(given)}: several nodes share a Redis keyspace only;"
                f" the store {redact_url(self.store_url)} serves one node"
            )
        if self.node is not None and (not self.node or any(c.isspace() for c in self.node)):
            raise ConfigError(f"node {self.node!r}: must be non-empty, without spaces")
        if self.advertise is not None:
            _, colon, port = self.advertise.rpartition(":")
            if not colon or not port.isdigit() or not 1 <= int(port) <= 65535:
                raise ConfigError(f"advertise {self.advertise!r}: must be HOST:PORT")
        if self.partitions is not None:
            try:
                check_partitions(self.partitions)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
        if self.lease_s is not None and not (
            math.isfinite(self.lease_s) and MIN_LEASE_S <= self.lease_s <= MAX_LEASE_S
        ):
            raise ConfigError(f"lease must be {MIN_LEASE_S} to {MAX_LEASE_S} s, got {self.lease_s}")
        if self.replicas is not None and self.replicas < 0:
            raise ConfigError(f"replicas must be at least 0, got {self.replicas}")

    def _check_web(self) -> None:
        if self.web_port is not None and not 0 <= self.web_port <= 65535:
            raise ConfigError(f"web port must be 0 to 65535, got {self.web_port}")
        if self.web_base_path and not _BASE_PATH.fullmatch(self.web_base_path):
            raise ConfigError(
                "web base path must be empty or like /delaywheel (segments of letters, digits,"
                f" . _ ~ -, no trailing /), got {self.web_base_path!r}"
            )
        if self.web_viewer_token is not None:
            if self.token is None:
                raise ConfigError("web viewer token needs --token too (the admin's)")
            if self.web_viewer_token in ("", self.token):
                raise ConfigError("web viewer token must be set and differ from --token")
        if (
            self.web_port is not None
            and self.token is None
            and not self.web_insecure
            and not _is_loopback(self.web_host)
        ):
            raise ConfigError(
                f"--web-host {self.web_host!r} serves the dashboard beyond this machine with no"
                " token: anyone who can reach it could delete every task. Set --token (the"
                " dashboard's sign-in), or pass --web-insecure if that is meant"
            )

    def _check_api(self) -> None:
        if self.api_port is not None and not 0 <= self.api_port <= 65535:
            raise ConfigError(f"api port must be 0 to 65535, got {self.api_port}")
        if self.api_max_requests < 1:
            raise ConfigError(f"api max requests must be at least 1, got {self.api_max_requests}")
        if self.api_port is None or self.token is not None or self.insecure_no_auth:
            return
        # The API is served on its own port and, with the dashboard, on the dashboard's.
        hosts = [("--api-host", self.api_host)]
        if self.web_port is not None:
            hosts.append(("--web-host", self.web_host))
        for flag, host in hosts:
            if _is_loopback(host) or (flag == "--api-host" and self.tls_client_ca is not None):
                continue
            raise ConfigError(
                f"{flag} {host!r} serves the HTTP API beyond this machine with no token:"
                " anyone who can reach it could add, delete and read every task. Set --token"
                " (DELAYWHEEL_TOKEN), which clients then send as Authorization: Bearer, or pass"
                " --insecure-no-auth if that is meant"
            )

    def _check_connections(self) -> None:
        if not (math.isfinite(self.auth_timeout_s) and self.auth_timeout_s > 0):
            raise ConfigError(f"auth timeout must be > 0 s, got {self.auth_timeout_s}")
        per_address = self.max_connections_per_address
        if per_address is not None and not 1 <= per_address <= self.max_connections:
            raise ConfigError(
                f"max connections per address must be 1 to max connections"
                f" ({self.max_connections}), got {per_address}"
            )

    @property
    def connections_per_address(self) -> int:
        """The connections one address may hold at once."""
        if self.max_connections_per_address is not None:
            return self.max_connections_per_address
        share = self.max_connections // DEFAULT_PER_ADDRESS_SHARE
        return max(share, min(self.max_connections, MIN_PER_ADDRESS))

    def _check_tls(self) -> None:
        """The TLS files go together; net/tls.py loads them (``tls_of``), at start."""
        if self.tls_cert is None or self.tls_key is None:
            if self.tls_cert is not None or self.tls_key is not None:
                given, missing = ("cert", "key") if self.tls_key is None else ("key", "cert")
                raise ConfigError(f"tls {given} needs a tls {missing} too (both or neither)")
            if self.tls_client_ca is not None:
                raise ConfigError("tls client ca needs a tls cert and key (mutual TLS)")

    @property
    def open_to_anyone(self) -> bool:
        """Listening beyond loopback with no token and no client certificates."""
        return self.token is None and self.tls_client_ca is None and not _is_loopback(self.host)

    @property
    def horizon(self) -> float:
        """The horizon in seconds: --horizon, else one lap of the wheel (at least
        DEFAULT_HORIZON_S)."""
        if self.horizon_s is not None:
            return self.horizon_s
        return max(DEFAULT_HORIZON_S, self.slots * self.tick_s)

    @property
    def limits(self) -> Limits:
        return Limits(
            max_body_bytes=self.max_body_bytes,
            max_delay_s=self.max_delay_s,
            max_result_bytes=self.max_result_bytes,
        )


def _is_loopback(host: str) -> bool:
    """An address or name of this machine's loopback only; any other name may be more."""
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name, or "" (every address)
        return False
