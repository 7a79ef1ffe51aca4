"""``delaywheel serve``: every setting an option, and a ``DELAYWHEEL_<OPTION>`` variable."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click
from delaywheel_client.protocol import DEFAULT_MAX_MESSAGE_BYTES

from delaywheel.cli.errors import EXIT_CANNOT_LISTEN, EXIT_UNREACHABLE
from delaywheel.cli.params import Duration, EnvOption
from delaywheel.config import (
    DEFAULT_API_MAX_REQUESTS,
    DEFAULT_AUTH_TIMEOUT_S,
    DEFAULT_HOST,
    DEFAULT_HTTP_ALLOW,
    DEFAULT_HTTP_CONCURRENCY,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_RESULT_BYTES,
    DEFAULT_MESSAGE_TIMEOUT_S,
    DEFAULT_METRICS_TOPICS,
    DEFAULT_PORT,
    DEFAULT_RETRY_BASE_S,
    DEFAULT_RETRY_CAP_S,
    DEFAULT_SHUTDOWN_GRACE_S,
    DEFAULT_SLOW_FLUSH_S,
    DEFAULT_STORE,
    ConfigError,
    Settings,
)
from delaywheel.delivery.brokers import split_env
from delaywheel.logs import FORMATS, configure
from delaywheel.wheel import DEFAULT_SLOTS, DEFAULT_TICK_S

F = TypeVar("F", bound=Callable[..., Any])


def _serve_option(*names: str, **kwargs: Any) -> Callable[[F], F]:
    """A ``serve`` option read also from ``DELAYWHEEL_<OPTION>``, shown in --help."""
    flag = next(name for name in names if name.startswith("--"))
    envvar = "DELAYWHEEL_" + flag[2:].upper().replace("-", "_")
    return click.option(*names, envvar=envvar, show_envvar=True, cls=EnvOption, **kwargs)


# serve --help in sections, each option in one (tests/test_cli.py holds every
# option of serve to exactly one section). Options keep their declaration order
# within a section.
HELP_SECTIONS: dict[str, tuple[str, ...]] = {
    "Listening and auth": (
        "--host", "--port", "--token", "--insecure-no-auth", "--tls-cert", "--tls-key",
        "--tls-client-ca",
    ),
    "Store": ("--store", "--redis-prefix", "--slow-flush", "--horizon"),
    "The wheel": ("--slots", "--tick"),
    "Limits": (
        "--max-message", "--max-body", "--max-result", "--dead-retention", "--max-connections",
        "--max-connections-per-address", "--message-timeout", "--auth-timeout",
    ),
    "Deliveries": (
        "--http-allow", "--http-concurrency", "--signing-secret", "--broker", "--retry-base",
        "--retry-cap", "--shutdown-grace",
    ),
    "Several nodes (docs/ha.md)": (
        "--node", "--advertise", "--partitions", "--lease", "--replicas",
    ),
    "Metrics": ("--metrics-port", "--metrics-host", "--metrics-topics"),
    "Dashboard (docs/dashboard.md)": (
        "--web-port", "--web-host", "--web-base-path", "--web-viewer-token", "--web-hide-bodies",
        "--web-insecure",
    ),
    "HTTP API (docs/http.md)": ("--api-port", "--api-host", "--api-max-requests"),
    "Logs": ("--log-level", "--log-format"),
}  # fmt: skip


class _SectionedCommand(click.Command):
    """A command whose --help lists its options under ``HELP_SECTIONS``' titles."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows: dict[str, tuple[str, str]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None:
                rows[max(param.opts, key=len)] = record
        for title, names in HELP_SECTIONS.items():
            with formatter.section(title):
                formatter.write_dl([rows.pop(name) for name in names if name in rows])
        if rows:  # --help itself, and any option not given a section yet
            with formatter.section("Other options"):
                formatter.write_dl(list(rows.values()))


@click.command(cls=_SectionedCommand)
@_serve_option("--host", default=DEFAULT_HOST, show_default=True, help="Address to listen on.")
@_serve_option(
    "--port", default=DEFAULT_PORT, show_default=True, type=int, help="0 picks a free port."
)
@_serve_option(
    "--store",
    "store_url",
    default=DEFAULT_STORE,
    show_default=True,
    help="redis://host:port/db, rediss:// (TLS), redis+sentinel://host:port,.../MASTER/db,"
    " sqlite:///path or memory://",
)
@_serve_option(
    "--redis-prefix", default="delaywheel", show_default=True, help="Key prefix in Redis."
)
@_serve_option("--slots", default=DEFAULT_SLOTS, show_default=True, type=int, help="Wheel slots.")
@_serve_option(
    "--tick",
    "tick_s",
    default=DEFAULT_TICK_S,
    show_default=True,
    type=float,
    help="Seconds per tick (0.001 or more).",
)
@_serve_option(
    "--token",
    default=None,
    help="Clients must send auth [token] first (the same variable as the client's --token).",
)
@_serve_option(
    "--insecure-no-auth",
    is_flag=True,
    default=False,
    help="Listen beyond loopback with no --token and no --tls-client-ca (refused otherwise); "
    "every start then logs a warning.",
)
@_serve_option(
    "--max-message",
    "max_message_bytes",
    default=DEFAULT_MAX_MESSAGE_BYTES,
    show_default=True,
    type=int,
    help="Largest message, in bytes.",
)
@_serve_option(
    "--max-body",
    "max_body_bytes",
    default=DEFAULT_MAX_BODY_BYTES,
    show_default=True,
    type=int,
    help="Largest packed task body, in bytes.",
)
@_serve_option(
    "--max-result",
    "max_result_bytes",
    default=DEFAULT_MAX_RESULT_BYTES,
    show_default=True,
    type=int,
    help="Largest result kept with a done task (an ack's, packed; an HTTP answer's body), "
    "in bytes.",
)
@_serve_option(
    "--horizon",
    "horizon_s",
    default=None,
    type=Duration(),
    help="Delayed tasks due further ahead than this are kept only in the store, not in "
    "memory (at least 2m) [default: one lap of the wheel, at least 1h].",
)
@_serve_option(
    "--dead-retention",
    "dead_retention_s",
    default=None,
    type=float,
    help="Seconds a dead task is kept before it goes, for topics without a dead_retain "
    "of their own [default: for ever].",
)
@_serve_option(
    "--max-connections",
    default=DEFAULT_MAX_CONNECTIONS,
    show_default=True,
    type=int,
    help="Connections served at once.",
)
@_serve_option(
    "--message-timeout",
    "message_timeout_s",
    default=DEFAULT_MESSAGE_TIMEOUT_S,
    show_default=True,
    type=float,
    help="Seconds a peer may take to finish a message it has started.",
)
@_serve_option(
    "--auth-timeout",
    "auth_timeout_s",
    default=DEFAULT_AUTH_TIMEOUT_S,
    show_default=True,
    type=float,
    help="With --token, seconds a connection may take to send auth before it is closed.",
)
@_serve_option(
    "--max-connections-per-address",
    default=None,
    type=int,
    help="Connections one client address may hold at once [default: a quarter of "
    "--max-connections, at least 16].",
)
@_serve_option(
    "--http-allow",
    default=DEFAULT_HTTP_ALLOW,
    show_default=True,
    help="Where HTTP targets may point: host names, *.suffix, addresses, CIDR ranges, "
    "public (publicly routable addresses only) or *; comma-separated.",
)
@_serve_option(
    "--http-concurrency",
    default=DEFAULT_HTTP_CONCURRENCY,
    show_default=True,
    type=int,
    help="HTTP requests in flight to one destination (scheme, host and port).",
)
@_serve_option(
    "--signing-secret",
    default=None,
    help="Sign HTTP deliveries with this key (the Delaywheel-Signature header).",
)
@click.option(
    "--broker",
    "brokers",
    multiple=True,
    metavar="NAME=URL",
    help="A broker tasks may name (redis://, amqp://, nats://); repeat for more. "
    "Also DELAYWHEEL_BROKERS=NAME=URL,NAME=URL.",
)
@_serve_option(
    "--retry-base",
    "retry_base_s",
    default=DEFAULT_RETRY_BASE_S,
    show_default=True,
    type=float,
    help="Seconds before a failed delivery's first retry; doubled per attempt.",
)
@_serve_option(
    "--retry-cap",
    "retry_cap_s",
    default=DEFAULT_RETRY_CAP_S,
    show_default=True,
    type=float,
    help="Longest wait between delivery attempts, in seconds.",
)
@_serve_option(
    "--shutdown-grace",
    "shutdown_grace_s",
    default=DEFAULT_SHUTDOWN_GRACE_S,
    show_default=True,
    type=float,
    help="Seconds deliveries in flight get to finish after SIGTERM.",
)
@_serve_option(
    "--tls-cert",
    metavar="FILE",
    default=None,
    help="Serve TLS with this PEM certificate chain (needs --tls-key).",
)
@_serve_option("--tls-key", metavar="FILE", default=None, help="The PEM private key of --tls-cert.")
@_serve_option(
    "--tls-client-ca",
    metavar="FILE",
    default=None,
    help="Mutual TLS: clients must present a certificate signed by this PEM CA.",
)
@_serve_option(
    "--slow-flush",
    "slow_flush_s",
    default=DEFAULT_SLOW_FLUSH_S,
    show_default=True,
    type=float,
    help="Log a store write that takes this many seconds or more.",
)
@_serve_option(
    "--metrics-port",
    default=None,
    type=int,
    help="Serve Prometheus metrics at http://HOST:PORT/metrics (off when unset; 0 picks a port).",
)
@_serve_option(
    "--metrics-host",
    default=DEFAULT_HOST,
    show_default=True,
    help="Address the metrics endpoint listens on.",
)
@_serve_option(
    "--metrics-topics",
    default=DEFAULT_METRICS_TOPICS,
    show_default=True,
    type=int,
    help="Topics named in the per-topic task metrics, the largest first; the rest are summed.",
)
@_serve_option(
    "--node",
    default=None,
    help="This node's name in a shared Redis keyspace (default: host name and port).",
)
@_serve_option(
    "--advertise",
    default=None,
    metavar="HOST:PORT",
    help="The address other nodes send clients to (default: the listen address).",
)
@_serve_option(
    "--partitions",
    default=None,
    type=int,
    help="Partitions of a new Redis keyspace (default 16; fixed at its first use).",
)
@_serve_option(
    "--lease",
    "lease_s",
    default=None,
    type=Duration(),
    metavar="DURATION",
    help="How long a node's partition lease lasts without renewal: 10, 10s, 1500ms (default 10 s).",
)
@_serve_option(
    "--replicas",
    default=None,
    type=int,
    help="Acknowledge a change only once this many Redis replicas have it (default 0).",
)
@_serve_option(
    "--web-port",
    default=None,
    type=int,
    help="Serve the web dashboard at http://HOST:PORT/ (off when unset; 0 picks a port).",
)
@_serve_option(
    "--web-host", default=DEFAULT_HOST, show_default=True, help="Address the dashboard listens on."
)
@_serve_option(
    "--web-base-path",
    default="",
    help="Path a reverse proxy mounts the dashboard under, like /delaywheel.",
)
@_serve_option(
    "--web-viewer-token",
    default=None,
    help="A second token that signs in to the dashboard read-only (needs --token).",
)
@_serve_option("--web-hide-bodies", is_flag=True, default=False, help="Viewers see no task bodies.")
@_serve_option(
    "--web-insecure",
    is_flag=True,
    default=False,
    help="Serve the dashboard beyond loopback with no --token (refused otherwise); logs a warning.",
)
@_serve_option(
    "--api-port",
    default=None,
    type=int,
    help="Serve the HTTP API at http://HOST:PORT/v1 (off when unset; 0 picks a port); also"
    " on the dashboard's port when both are on.",
)
@_serve_option(
    "--api-host", default=DEFAULT_HOST, show_default=True, help="Address the HTTP API listens on."
)
@_serve_option(
    "--api-max-requests",
    default=DEFAULT_API_MAX_REQUESTS,
    show_default=True,
    type=int,
    help="HTTP API requests running at once (a waiting long poll not counted); more get 503.",
)
@_serve_option(
    "--log-level",
    default="info",
    show_default=True,
    type=click.Choice(["debug", "info", "warning", "error"]),
    help="The least severe level logged.",
)
@_serve_option(
    "--log-format",
    default="text",
    show_default=True,
    type=click.Choice(FORMATS),
    help="text, or json: one object per line (ts, level, logger, message, fields).",
)
def serve(log_level: str, log_format: str, **options: object) -> None:
    """Run the server in the foreground until SIGINT or SIGTERM."""
    configure(log_level, log_format)
    if not options["brokers"]:
        # One variable for them all, NAME=URL,NAME=URL (click's envvar for a
        # multiple option would split on spaces).
        options["brokers"] = tuple(split_env(os.environ.get("DELAYWHEEL_BROKERS", "")))
    try:
        settings = Settings(**options)  # type: ignore[arg-type]
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    from delaywheel.app import run
    from delaywheel.net.listen import ListenError
    from delaywheel.store.base import StoreError

    try:
        run(settings)
    except ConfigError as exc:  # a TLS file, loaded at start (net/tls.py)
        raise click.UsageError(str(exc)) from None
    except StoreError as exc:
        click.echo(f"delaywheel: {exc}", err=True)
        sys.exit(EXIT_UNREACHABLE)
    except ListenError as exc:
        click.echo(f"delaywheel: {exc}", err=True)
        sys.exit(EXIT_CANNOT_LISTEN)
