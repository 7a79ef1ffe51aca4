"""Named brokers (``--broker NAME=URL``) and the targets that push to them.

The operator names each broker at start-up; a task's target names one, and
never carries an address or a credential. ``Brokers`` holds the names, checks
targets at ``add`` (``check_target``), and owns one sender per broker, made
at ``start``: Redis (``_redis_broker``), RabbitMQ (``_amqp_broker``) and
NATS JetStream (``_nats_broker``). Each keeps one long-lived connection,
made and remade in the background (``_broker_link``), so a broker that is
down neither stops start-up nor holds up deliveries to the others.

The name ``store`` is the store's own Redis when the store is Redis.

No URL leaves this package with its password: ``redact`` is what logs,
errors and ``stats`` show.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from delaywheel.delivery._broker_link import BrokerLink
from delaywheel.delivery._broker_targets import check_target as _check_target
from delaywheel.delivery.base import Sender
from delaywheel.store.base import redact_url, scrub, url_secrets

STORE = "store"  # the store's own Redis; no --broker may take the name
KINDS = {
    "redis": "redis",
    "rediss": "redis",
    "amqp": "amqp",
    "amqps": "amqp",
    "nats": "nats",
    "tls": "nats",  # nats-py's scheme for NATS over TLS
}
# A reply from a broker should take milliseconds; 10 s means it is hung, and
# the attempt fails rather than holding a delivery slot.
SEND_TIMEOUT_S = 10.0
CONNECT_TIMEOUT_S = 5.0
DEFAULT_STORE_PREFIX = "delaywheel"  # open_store's default redis_prefix

_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
# Entries of DELAYWHEEL_BROKERS are split at a comma only where NAME= follows,
# so a comma inside a URL (in a password, say) stays in it.
_ENTRY_SEPARATOR = re.compile(r",(?=\s*[A-Za-z0-9_.-]{1,64}\s*=)")
_AROUND_ENTRIES = " \t\r\n,"
# Each kind's sender, imported when a broker of that kind starts: aio-pika and
# nats-py together take a tenth of a second to import, which the CLI (it
# reads DELAYWHEEL_BROKERS through this module) and a server without such a
# broker need not pay.
_SENDERS = {
    "redis": ("delaywheel.delivery._redis_broker", "RedisSender"),
    "amqp": ("delaywheel.delivery._amqp_broker", "AmqpSender"),
    "nats": ("delaywheel.delivery._nats_broker", "NatsSender"),
}


def _sender_class(kind: str) -> type[BrokerLink]:
    module, name = _SENDERS[kind]
    found: type[BrokerLink] = getattr(importlib.import_module(module), name)
    return found


def redact(url: str) -> str:
    """``url`` as logs, errors and ``stats`` show it: the password is ``***``.

    A NATS URL's user without a password is a token (``nats://TOKEN@host``),
    so it is hidden too.
    """
    shown = redact_url(url)
    token = _nats_token(url)
    return shown.replace(f"//{token}@", "//***@", 1) if token else shown


def secrets(url: str) -> list[str]:
    """Every secret in ``url``, to scrub from a driver's error text."""
    token = _nats_token(url)
    return sorted({*url_secrets(url), *([token] if token else [])}, key=len, reverse=True)


def _nats_token(url: str) -> str | None:
    try:
        parts = urlsplit(url)
        if parts.scheme not in ("nats", "tls") or parts.password is not None:
            return None
        return parts.username or None
    except ValueError:
        return None


def split_env(value: str) -> list[str]:
    """``DELAYWHEEL_BROKERS`` (``NAME=URL,NAME=URL``) as the specs ``--broker`` takes."""
    # Stray commas and spaces around entries (",," or a trailing ",") are dropped.
    entries = (entry.strip(_AROUND_ENTRIES) for entry in _ENTRY_SEPARATOR.split(value))
    return [entry for entry in entries if entry]


def parse_broker_specs(specs: list[str]) -> dict[str, str]:
    """``{name: url}`` from ``NAME=URL`` specs; ``ValueError`` names a bad one (redacted)."""
    urls: dict[str, str] = {}
    for spec in specs:
        name, equals, url = spec.partition("=")
        name, url = name.strip(), url.strip()
        shown = f"{name}={redact(url)}" if equals else redact(spec)
        if not equals or not url:
            raise ValueError(f"broker {shown!r}: must be NAME=URL")
        try:
            check_name(name)
            kind_of_url(url)
        except ValueError as exc:
            raise ValueError(f"broker {shown!r}: {exc}") from None
        if name in urls:
            raise ValueError(f"broker {shown!r}: the name {name!r} is given twice")
        urls[name] = url
    return urls


def check_name(name: str) -> None:
    if not _NAME.fullmatch(name):
        raise ValueError(f"the name {name!r} must be 1 to 64 of A-Z a-z 0-9 _ . -")
    if name == STORE:
        raise ValueError(f"the name {STORE!r} is reserved for the store's own Redis")


def kind_of_url(url: str) -> str:
    """``redis``, ``amqp`` or ``nats`` for a broker URL, else ``ValueError`` (which does
    not repeat the URL: the caller names the broker and its redacted URL)."""
    try:
        parts = urlsplit(url)
        kind = KINDS.get(parts.scheme.lower())
        host, _port = parts.hostname, parts.port  # .port raises on a bad port
    except ValueError as exc:
        raise ValueError(f"the URL is malformed ({scrub(str(exc), secrets(url))})") from None
    if kind is None:
        schemes = ", ".join(f"{scheme}://" for scheme in KINDS)
        raise ValueError(f"the URL must start with one of {schemes}")
    if not host:
        raise ValueError("the URL has no host")
    return kind


class Brokers:
    """The server's named brokers, and one sender for each once started.

    ``urls`` is ``{name: url}`` (``parse_broker_specs``). ``store_url`` is
    the store's URL: when it is Redis, the name ``store`` refers to it and a
    target may not push into the store's own keys (``{store_prefix}...``).
    """

    def __init__(
        self,
        urls: Mapping[str, str],
        store_url: str | None = None,
        *,
        store_prefix: str = DEFAULT_STORE_PREFIX,
        timeout_s: float = SEND_TIMEOUT_S,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
    ) -> None:
        self._urls: dict[str, str] = {}
        self._kinds: dict[str, str] = {}
        for name, url in urls.items():
            try:
                check_name(name)
                self._kinds[name] = kind_of_url(url)
            except ValueError as exc:
                shown = f"{name}={redact(url)}"
                raise ValueError(f"broker {shown!r}: {exc}") from None
            self._urls[name] = url
        if store_url is not None and urlsplit(store_url).scheme in ("redis", "rediss"):
            self._urls[STORE], self._kinds[STORE] = store_url, "redis"
        # The store's keys share one hash tag: "{prefix}:tasks" and any it adds later.
        self._store_keys = f"{{{store_prefix}}}"
        self._timeout_s = timeout_s
        self._connect_timeout_s = connect_timeout_s
        self._senders: dict[str, BrokerLink] = {}

    def names(self) -> list[str]:
        return sorted(self._urls)

    def kind_of(self, name: str) -> str | None:
        """``"redis"``, ``"amqp"`` or ``"nats"``; None for a name the server does not have."""
        return self._kinds.get(name)

    def check_target(self, value: dict[str, Any]) -> dict[str, Any]:
        """The client's broker target map, checked, with every field present.

        Raises ``RequestError("bad_request", ...)`` naming the field and value.
        """
        return _check_target(value, self._kinds, self._store_keys)

    def sender(self, name: str) -> Sender:
        """The sender of broker ``name`` (after ``start``; ``KeyError`` for an unknown name)."""
        if name not in self._urls:
            raise KeyError(f"no broker named {name!r}")
        if name not in self._senders:
            raise RuntimeError("Brokers.sender() before start()")
        return self._senders[name]

    async def start(self) -> None:
        """Make every sender and let it connect in the background: never waits for a broker."""
        for name, url in self._urls.items():
            if name in self._senders:
                continue
            sender = _sender_class(self._kinds[name])(
                name,
                url,
                display_url=redact(url),
                secrets=secrets(url),
                timeout_s=self._timeout_s,
                connect_timeout_s=self._connect_timeout_s,
            )
            sender.start()
            self._senders[name] = sender

    def state(self) -> dict[str, dict[str, Any]]:
        """For ``stats``: each broker's kind, redacted URL and connection."""
        return {name: self._state_of(name) for name in sorted(self._urls)}

    def _state_of(self, name: str) -> dict[str, Any]:
        sender = self._senders.get(name)
        if sender is not None:
            return sender.state()
        return {  # not started, or closed
            "kind": self._kinds[name],
            "url": redact(self._urls[name]),
            "connected": False,
            "failing_since": None,
            "last_error": None,
        }

    async def close(self) -> None:
        senders, self._senders = list(self._senders.values()), {}
        for sender in senders:
            await sender.close()
