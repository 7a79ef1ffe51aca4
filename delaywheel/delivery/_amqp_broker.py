"""The AMQP (RabbitMQ) sender: persistent messages with publisher confirms.

One robust connection per broker and one channel on it, opened with
publisher confirms and ``on_return_raises``, so ``publish(mandatory=True)``
returns only on the broker's ack and raises on a nack or on a return (no
queue bound to the routing key). aio-pika reconnects the connection and
reopens the channel by itself once the first connection is made; the first
one is this sender's own loop (``BrokerLink.retry``), since aio-pika's
``connect_robust`` gives up when the broker is down at start-up.

Publishing to an exchange that does not exist makes the broker close the
channel (404). aio-pika reopens it in the background; until it has,
``channel.is_closed`` is true and a publish would fail at once, so a send
waits (within its timeout) for the channel to be open again. The attempt
that hit the missing exchange fails; the sender goes on working.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aio_pika
from aio_pika.abc import (
    AbstractExchange,
    AbstractRobustChannel,
    AbstractRobustConnection,
)
from aiormq.exceptions import (
    ChannelClosed,
    ChannelNotFoundEntity,
    DeliveryError,
    PublishError,
)

from delaywheel.delivery import body
from delaywheel.delivery._broker_link import RECONNECT_MAX_S, BrokerLink
from delaywheel.delivery.base import Delivery
from delaywheel.validate import show

# How often a send looks whether aio-pika has reopened a closed channel; it
# takes a few milliseconds (one round trip) when the connection is up.
CHANNEL_POLL_S = 0.005
# Exchange objects are cheap, but a target names any exchange it likes: the
# cache is emptied when it reaches this many, so it cannot grow without bound.
MAX_CACHED_EXCHANGES = 256


def message(delivery: Delivery) -> aio_pika.Message:
    payload, content_type = body.encode(delivery.body_packed)
    return aio_pika.Message(
        payload,
        content_type=content_type,
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        message_id=delivery.task_id,
        headers={"delaywheel-topic": delivery.topic, "delaywheel-attempt": delivery.attempt},
    )


class AmqpSender(BrokerLink):
    kind = "amqp"

    def __init__(self, name: str, url: str, **options: Any) -> None:
        super().__init__(name, url, **options)
        self._connection: AbstractRobustConnection | None = None
        self._channel: AbstractRobustChannel | None = None
        self._exchanges: dict[str, AbstractExchange] = {}

    def start(self) -> None:
        self.spawn(self.retry(self._connect))

    async def _connect(self) -> None:
        connection = await aio_pika.connect_robust(
            self._raw_url,
            timeout=self.connect_timeout_s,
            reconnect_interval=RECONNECT_MAX_S,
            client_properties={"connection_name": f"delaywheel broker {self.name}"},
        )
        try:
            channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        except BaseException:
            await connection.close()
            raise
        connection.close_callbacks.add(self._on_connection_close)
        connection.reconnect_callbacks.add(self._on_reconnect)
        self._connection, self._channel = connection, channel

    def _on_connection_close(self, _connection: Any, exc: BaseException | None) -> None:
        self.mark_down(exc if exc is not None else "the connection closed")

    def _on_reconnect(self, _connection: Any) -> None:
        self.mark_up()

    async def _exchange(self, name: str) -> AbstractExchange:
        assert self._channel is not None
        if name == "":
            return self._channel.default_exchange
        found = self._exchanges.get(name)
        if found is None:
            if len(self._exchanges) >= MAX_CACHED_EXCHANGES:
                self._exchanges.clear()
            # ensure=False: no round trip, and no channel closed by a passive
            # declare of a missing exchange; the publish finds out instead.
            found = await self._channel.get_exchange(name, ensure=False)
            self._exchanges[name] = found
        return found

    async def _publish(self, delivery: Delivery) -> None:
        channel = self._channel
        assert channel is not None
        while channel.is_closed:  # being reopened by aio-pika (see the module's docstring)
            await asyncio.sleep(CHANNEL_POLL_S)
        exchange = await self._exchange(delivery.target["exchange"])
        await exchange.publish(
            message(delivery),
            routing_key=delivery.target["routing_key"],
            mandatory=True,
            timeout=self.timeout_s,
        )

    async def send(self, delivery: Delivery) -> None:
        await self.usable()
        name, routing_key = delivery.target["exchange"], delivery.target["routing_key"]
        where = f"exchange {show(name)}" if name else "the default exchange"
        try:
            await asyncio.wait_for(self._publish(delivery), self.timeout_s)
        except PublishError:  # a Basic.Return: mandatory, and nothing took it
            why = f"no queue is bound to routing key {show(routing_key)} on {where}"
            raise self.failed(why) from None
        except DeliveryError:  # a Basic.Nack (its text would name the message: not shown)
            raise self.failed(f"the broker refused the message on {where} (nack)") from None
        except ChannelNotFoundEntity as exc:
            self._exchanges.pop(name, None)
            raise self.failed(f"{where} does not exist ({self.describe(exc)})") from None
        except ChannelClosed as exc:
            raise self.failed(f"the broker closed the channel: {self.describe(exc)}") from None
        except asyncio.TimeoutError:
            why = f"no confirmation from the broker within {self.timeout_s:g} s"
            raise self.failed(why) from None
        except Exception as exc:  # a lost connection, say: send raises only DeliveryFailed
            raise self.failed(f"publish to {where} failed: {self.describe(exc)}") from None

    async def _release(self) -> None:
        connection, self._connection, self._channel = self._connection, None, None
        self._exchanges.clear()
        if connection is not None:
            await connection.close()
