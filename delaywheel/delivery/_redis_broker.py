"""The Redis sender: ``LPUSH`` of a packed map, or ``XADD`` of fields.

It connects as the store does (``store.redis.client.connect``): a plain
client with hiredis, or a Cluster client when the node says it is one, so
``broker: "store"`` works whatever the store's Redis is. redis-py reconnects
a pooled connection by itself on the next command, so after a connection
error this sender only has to find out when Redis answers again: a probe
PINGs with backoff and marks the broker back.

A user that Redis's ACL lets push and nothing more will do: the client
needs no command beyond ``LPUSH`` or ``XADD`` (and ``SELECT`` for a
database other than 0).

A reply from Redis is its confirmation: ``LPUSH`` and ``XADD`` answer once
the write is applied (and, with ``appendfsync always``, on disk).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable
from typing import Any

import msgpack  # type: ignore[import-untyped, unused-ignore]
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoPermissionError, ResponseError

from delaywheel.checks import show
from delaywheel.delivery._broker_link import BrokerLink
from delaywheel.delivery.base import Delivery
from delaywheel.store.redis.client import CLIENT_ERRORS, Client, close_quietly, connect

# A MessagePack fixmap's first byte holds its size (up to 15 keys).
_FIXMAP = 0x80


def list_entry(delivery: Delivery) -> bytes:
    """The packed map ``{"id", "topic", "body", "attempt", "at", "epoch"}`` that
    ``LPUSH`` pushes, and for a schedule's occurrence ``schedule``, ``nominal``,
    ``nominal_local`` and ``late_by`` (``occurrence_fields``) too.

    The body is spliced in as the task holds it, already MessagePack: the
    map's ``body`` is the body itself, not bytes of MessagePack, and nothing
    is lost to a round trip through Python values (a float32 stays one).
    """
    pack = msgpack.Packer(use_bin_type=True).pack
    parts = [
        pack("id"),
        pack(delivery.task_id),
        pack("topic"),
        pack(delivery.topic),
        pack("body"),
        delivery.body_packed,
        pack("attempt"),
        pack(delivery.attempt),
        pack("at"),
        pack(delivery.at_s),
        pack("epoch"),
        pack(delivery.epoch),
    ]
    extra = occurrence_fields(delivery)
    for name, value in extra.items():
        parts += (pack(name), pack(value))
    return bytes((_FIXMAP | (6 + len(extra)),)) + b"".join(parts)


def occurrence_fields(delivery: Delivery) -> dict[str, Any]:
    """A schedule occurrence's fields, as the task map of ``reserve`` has them
    (docs/protocol.md); none for any other task."""
    occurrence = delivery.occurrence
    if occurrence is None:
        return {}
    return {
        "schedule": occurrence.schedule_id,
        "nominal": occurrence.nominal_s,
        "nominal_local": occurrence.nominal_local,
        "late_by": occurrence.late_by_s(time.time()),
    }


def stream_fields(delivery: Delivery) -> dict[str, bytes | str | int | float]:
    """The fields that ``XADD`` adds: the body raw when it is bin or str, else packed."""
    value = msgpack.unpackb(delivery.body_packed, raw=False, strict_map_key=False)
    body: bytes
    if type(value) is bytes:
        body = value
    elif type(value) is str:
        body = value.encode()
    else:
        body = delivery.body_packed
    return {
        "id": delivery.task_id,
        "topic": delivery.topic,
        "attempt": delivery.attempt,
        "epoch": delivery.epoch,
        "body": body,
        **occurrence_fields(delivery),
    }


class RedisSender(BrokerLink):
    kind = "redis"

    def __init__(self, name: str, url: str, **options: Any) -> None:
        super().__init__(name, url, **options)
        self._client: Client | None = None
        self._probing = False

    def start(self) -> None:
        self.spawn(self.retry(self._connect))

    async def _connect(self) -> None:
        try:
            self._client = await connect(
                self._raw_url, connect_timeout_s=self.connect_timeout_s, timeout_s=self.timeout_s
            )
        except NoPermissionError:
            # An ACL user that may only push (no CLIENT SETNAME, INFO or PING):
            # Redis answered, so it is up; talk to it as a plain server.
            self._client = Redis.from_url(
                self._raw_url,
                socket_connect_timeout=self.connect_timeout_s,
                socket_timeout=self.timeout_s,
                # As the store's client: one retry, at once, reconnects a
                # pooled connection that a Redis restart closed.
                retry=Retry(NoBackoff(), retries=1, supported_errors=(RedisConnectionError,)),
            )

    async def _ping(self) -> None:
        assert self._client is not None
        with contextlib.suppress(NoPermissionError):  # refused, so Redis is answering
            await asyncio.wait_for(self._client.ping(), self.timeout_s)

    async def _probe(self) -> None:
        try:
            await self.retry(self._ping)
        finally:
            self._probing = False

    def _lost(self, error: BaseException | str) -> None:
        self.mark_down(error)
        if not self._probing and not self._closing:
            self._probing = True
            self.spawn(self._probe())

    async def send(self, delivery: Delivery) -> None:
        await self.usable()
        client = self._client
        assert client is not None  # usable() saw it connected
        key: str = delivery.target["key"]
        stream = delivery.target["mode"] == "stream"
        command = f"{'XADD' if stream else 'LPUSH'} {show(key)}"
        call: Awaitable[Any]
        try:
            if stream:
                call = client.xadd(key, stream_fields(delivery))  # type: ignore[arg-type]
            else:
                call = client.lpush(key, list_entry(delivery))
            await asyncio.wait_for(call, self.timeout_s)
        except ResponseError as exc:  # Redis answered, and refused (WRONGTYPE, OOM, READONLY)
            raise self.failed(f"{command} refused: {self.describe(exc)}") from None
        except asyncio.TimeoutError:
            why = f"no answer to {command} within {self.timeout_s:g} s"
            self._lost(why)
            raise self.failed(why) from None
        except CLIENT_ERRORS as exc:
            self._lost(exc)
            raise self.failed(f"{command} failed: {self.describe(exc)}") from None
        except Exception as exc:  # never anything but DeliveryFailed
            raise self.failed(f"{command} failed: {self.describe(exc)}") from None

    async def _release(self) -> None:
        if self._client is not None:
            await close_quietly(self._client)
            self._client = None
