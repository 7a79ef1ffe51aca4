"""Delivery targets: the maps that ``add``, ``update`` and pipelines take as ``target=``.

Each constructor returns the protocol's map with every field present, so a task's
target reads back from ``get`` equal to what was built (the server fills in the same
defaults when a field is left out)::

    from delaywheel_client import Client, targets

    dw = Client("127.0.0.1", 3450)
    dw.add("invoices", {"invoice": 7}, delay=3600,
           target=targets.http("https://billing.example.com/hooks/due",
                               headers={"Authorization": "Bearer s3cret"}))
    dw.add("emails", {"to": "a@example.com"}, delay=60, target=targets.redis_list("emails"))
    dw.update(task_id, target=targets.QUEUE)  # back to the server's own ready queue

These build maps and check nothing: the server is the one judge of a target (its
``--http-allow`` list, the brokers it was started with) and refuses a bad one with
``BadRequest`` naming the field. A task names a broker, never its address: the
operator starts the server with ``--broker NAME=URL``; ``store`` is the store's own
Redis when the store is Redis.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, TypeAlias

Target: TypeAlias = dict[str, Any]

# The methods the server sends HTTP targets with (docs/protocol.md).
HTTP_METHODS: Final = ("GET", "POST", "PUT", "PATCH", "DELETE")

DEFAULT_HTTP_METHOD: Final = "POST"
DEFAULT_HTTP_TIMEOUT_S: Final = 10.0
# The broker name that means the store's own Redis.
STORE_BROKER: Final = "store"

# The default target: the task joins its topic's ready queue, for ``reserve``. A plain
# dict because msgpack packs only dicts; copy it before changing it.
QUEUE: Final[Target] = {"type": "queue"}


def http(
    url: str,
    *,
    method: str = DEFAULT_HTTP_METHOD,
    headers: Mapping[str, str] | None = None,
    timeout_s: float = DEFAULT_HTTP_TIMEOUT_S,
) -> Target:
    """The server makes this request when the task is due; a 2xx answer completes it.

    ``method`` is one of ``HTTP_METHODS``; ``headers`` are sent as given (the server adds
    ``Delaywheel-Id``, ``-Topic``, ``-Attempt`` and ``-Signature``, which they cannot
    override); ``timeout_s`` is how long it waits for the answer, 0.1 to 300 s.
    """
    return {
        "type": "http",
        "url": url,
        "method": method,
        "headers": dict(headers or {}),
        "timeout": timeout_s,
    }


def redis_list(key: str, *, broker: str = STORE_BROKER) -> Target:
    """``LPUSH`` the task (a packed ``{"id", "topic", "body", "attempt", "at"}``) to ``key``."""
    return _redis(key, "list", broker)


def redis_stream(key: str, *, broker: str = STORE_BROKER) -> Target:
    """``XADD`` the task to the stream ``key`` (fields ``id``, ``topic``, ``attempt``, ``body``)."""
    return _redis(key, "stream", broker)


def _redis(key: str, mode: str, broker: str) -> Target:
    return {"type": "redis", "key": key, "mode": mode, "broker": broker}


def amqp(routing_key: str, *, broker: str, exchange: str = "") -> Target:
    """Publish to RabbitMQ ``broker`` (persistent, with publisher confirms); ``exchange``
    ``""`` is the default exchange, where ``routing_key`` is a queue's name."""
    return {"type": "amqp", "broker": broker, "exchange": exchange, "routing_key": routing_key}


def nats(subject: str, *, broker: str) -> Target:
    """A JetStream publish to ``subject`` on NATS ``broker``; a stream must cover it."""
    return {"type": "nats", "broker": broker, "subject": subject}


__all__ = [
    "DEFAULT_HTTP_METHOD",
    "DEFAULT_HTTP_TIMEOUT_S",
    "HTTP_METHODS",
    "QUEUE",
    "STORE_BROKER",
    "Target",
    "amqp",
    "http",
    "nats",
    "redis_list",
    "redis_stream",
]
