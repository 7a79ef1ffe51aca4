"""The AMQP (RabbitMQ) sender: persistent messages with publisher confirms.

One robust connection per broker and one publishing channel on it, opened
with publisher confirms and ``on_return_raises``, so ``publish(mandatory=True)``
returns only on the broker's ack and raises on a nack or on a return (no
queue bound to the routing key). aio-pika reconnects the connection and
reopens the channel by itself once the first connection is made; the first
one is this sender's own loop (``BrokerLink.retry``), since aio-pika gives up
on a first connection when the broker is down.

The connection object is made, and kept, before it connects, so that
``close`` can close it while it is still connecting. Cancelling the connect
would not be enough: aio-pika's reconnect loop goes on, swallowing every
cancellation, until its connection is closed, and the server never exits.
Closing it is not quite enough either: a close that lands after aiormq has
finished its handshake and before aio-pika holds the result (aio-pika 10.2
awaits the connection's readiness in between, and does not close it when
cancelled there) leaves an open aiormq connection that nothing refers to,
its reader, writer and heartbeat tasks running. So the sender opens its
sockets itself (``Sockets``) and shuts, at close, any that is still open.

Publishing to an exchange that does not exist makes the broker close the
channel (404), failing every other publish awaiting a confirmation there. So
the first publish to a named exchange looks it up on a short-lived channel
of its own (a passive declare: a 404 closes only that channel); pushes to
the same new exchange at once share one look-up. Exchanges found are
remembered; a missing one fails only the pushes aimed at it, and is looked
up again at the next attempt (it may have been declared since).

Should the publishing channel close anyway (an exchange deleted after it was
looked up, say), every push awaiting a confirmation fails saying so, the
remembered exchanges are forgotten, and aio-pika reopens the channel in the
background; until it has, ``channel.is_closed`` is true and a send waits
(within its timeout) for it to be open again. (aiormq 7.2 may still send a
push that was waiting for the channel on the closed channel; RabbitMQ then
closes the whole connection, 504, and aio-pika makes it again 2 s later.)
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aio_pika
from aio_pika.abc import AbstractExchange, AbstractRobustChannel, AbstractRobustConnection
from aio_pika.connection import make_url
from aiormq import TransportFactory
from aiormq.connection import TCPTransportFactory, TLSTransportFactory
from aiormq.exceptions import (
    ChannelClosed,
    ChannelInvalidStateError,
    ChannelNotFoundEntity,
    DeliveryError,
    PublishError,
)

from delaywheel.checks import show
from delaywheel.delivery import body
from delaywheel.delivery._broker_link import RECONNECT_MAX_S, BrokerLink
from delaywheel.delivery.base import Delivery

# How often a send looks whether aio-pika has reopened a closed channel; it
# takes a few milliseconds (one round trip) when the connection is up.
CHANNEL_POLL_S = 0.005
# A target names any exchange it likes, so the names known to exist are
# bounded: past this many the oldest is forgotten, costing one more look-up.
MAX_KNOWN_EXCHANGES = 256


class Sockets(TransportFactory):
    """Opens a connection's sockets as aiormq would, and remembers them until closed."""

    def __init__(self, tls: bool) -> None:
        self._opener = TLSTransportFactory() if tls else TCPTransportFactory()
        self._writers: set[asyncio.StreamWriter] = set()

    async def create(
        self, url: Any, **kwargs: Any
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await self._opener.create(url, **kwargs)
        # Reconnects add one each; those already closed are forgotten here.
        self._writers = {known for known in self._writers if not known.is_closing()}
        self._writers.add(writer)
        return reader, writer

    def close_all(self) -> None:
        """Shut every socket still open: its aiormq connection sees the end and stops."""
        writers, self._writers = self._writers, set()
        for writer in writers:
            writer.close()


class LookupFailed(Exception):
    """An exchange's look-up found it missing, or could not tell; the text says which."""


def message(delivery: Delivery) -> aio_pika.Message:
    payload, content_type = body.encode(delivery.body_packed)
    headers: dict[str, Any] = {
        "delaywheel-topic": delivery.topic,
        "delaywheel-attempt": delivery.attempt,
        "delaywheel-epoch": delivery.epoch,
    }
    occurrence = delivery.occurrence
    if occurrence is not None:  # AMQP's header values are typed: no text encoding needed
        headers["delaywheel-schedule"] = occurrence.schedule_id
        headers["delaywheel-nominal"] = occurrence.nominal_utc
        headers["delaywheel-nominal-local"] = occurrence.nominal_local
        headers["delaywheel-late-by"] = occurrence.late_by_s(time.time())
    return aio_pika.Message(
        payload,
        content_type=content_type,
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        message_id=delivery.task_id,
        headers=headers,
    )


class AmqpSender(BrokerLink):
    kind = "amqp"

    def __init__(self, name: str, url: str, **options: Any) -> None:
        super().__init__(name, url, **options)
        self._connection: AbstractRobustConnection | None = None
        self._sockets: Sockets | None = None
        self._channel: AbstractRobustChannel | None = None
        self._known: dict[str, None] = {}  # exchanges known to exist, oldest first
        self._lookups: dict[str, asyncio.Task[None]] = {}  # under way, by exchange

    def start(self) -> None:
        self.spawn(self.retry(self._connect))

    async def _connect(self) -> None:
        url = make_url(self._raw_url)
        connection = aio_pika.RobustConnection(
            url,
            reconnect_interval=RECONNECT_MAX_S,
            client_properties={"connection_name": f"delaywheel broker {self.name}"},
        )
        sockets = Sockets(tls=url.scheme == "amqps")
        # aio-pika hands its connection's keyword arguments to aiormq's connect.
        connection.kwargs["transport_factory"] = sockets
        # Both kept before connecting: see the module's docstring.
        self._connection, self._sockets = connection, sockets
        try:
            channel = await asyncio.wait_for(self._open(connection), self.connect_timeout_s)
        except Exception:
            self._connection, self._sockets = None, None
            await connection.close()
            sockets.close_all()
            raise
        connection.close_callbacks.add(self._on_connection_close)
        connection.reconnect_callbacks.add(self._on_reconnect)
        self._channel = channel

    async def _open(self, connection: AbstractRobustConnection) -> AbstractRobustChannel:
        await connection.connect(timeout=self.connect_timeout_s)
        channel = connection.channel(publisher_confirms=True, on_return_raises=True)
        await channel
        return channel

    def _on_connection_close(self, _connection: Any, exc: BaseException | None) -> None:
        self.mark_down(exc if exc is not None else "the connection closed")

    def _on_reconnect(self, _connection: Any) -> None:
        self._known.clear()  # a broker that restarted may have lost an exchange
        self.mark_up()

    # -- exchanges: looked up once, on a channel of their own ------------------------

    async def _exchange(self, channel: AbstractRobustChannel, name: str) -> AbstractExchange:
        if name == "":
            return channel.default_exchange
        if name not in self._known:
            lookup = self._lookups.get(name)
            if lookup is None:
                lookup = self.spawn(self._look_up(name))
                self._lookups[name] = lookup
                lookup.add_done_callback(lambda done: self._looked_up(name, done))
            # Waited for, not awaited: a push giving up (its timeout) leaves the
            # look-up to the others waiting for it.
            await asyncio.wait((lookup,))
            if lookup.cancelled():
                raise LookupFailed(f"the look-up of exchange {show(name)} was stopped (closing)")
            lookup.result()  # raises its LookupFailed
        # ensure=False: no round trip; the look-up has already found it.
        return await channel.get_exchange(name, ensure=False)

    def _looked_up(self, name: str, lookup: asyncio.Task[None]) -> None:
        if self._lookups.get(name) is lookup:
            del self._lookups[name]
        if not lookup.cancelled():
            lookup.exception()  # retrieved here too: every push waiting for it may be gone

    async def _look_up(self, name: str) -> None:
        where = f"exchange {show(name)}"
        try:
            await asyncio.wait_for(self._declare_passive(name), self.timeout_s)
        except ChannelNotFoundEntity as exc:
            raise LookupFailed(f"{where} does not exist ({self.describe(exc)})") from None
        except asyncio.TimeoutError:
            raise LookupFailed(f"no answer on {where} within {self.timeout_s:g} s") from None
        except Exception as exc:  # a lost connection, say
            raise LookupFailed(f"looking up {where} failed: {self.describe(exc)}") from None
        if len(self._known) >= MAX_KNOWN_EXCHANGES:
            del self._known[next(iter(self._known))]
        self._known[name] = None

    async def _declare_passive(self, name: str) -> None:
        connection = self._connection
        assert connection is not None
        # A plain channel, not a robust one: aio-pika would reopen a robust one
        # that the broker closed, and this one is meant to stay closed.
        probe = aio_pika.Channel(connection, publisher_confirms=False)
        await probe.initialize()
        try:
            await probe.declare_exchange(name, passive=True)
        finally:
            if not probe.is_closed:  # a 404 has closed it already
                await probe.close()

    # -- publishing -------------------------------------------------------------------

    async def _publish(self, delivery: Delivery) -> None:
        channel = self._channel
        assert channel is not None
        exchange = await self._exchange(channel, delivery.target["exchange"])
        while channel.is_closed:  # being reopened by aio-pika (see the module's docstring)
            await asyncio.sleep(CHANNEL_POLL_S)
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
        except LookupFailed as exc:
            raise self.failed(str(exc)) from None
        except PublishError:  # a Basic.Return: mandatory, and nothing took it
            why = f"no queue is bound to routing key {show(routing_key)} on {where}"
            raise self.failed(why) from None
        except DeliveryError:  # a Basic.Nack (its text would name the message: not shown)
            raise self.failed(f"the broker refused the message on {where} (nack)") from None
        except ChannelClosed as exc:
            # The publishing channel closed under this push, whichever push made it
            # close: the broker's reason names the cause, which may not be this push.
            self._known.clear()
            raise self.failed(f"the broker closed the channel: {self.describe(exc)}") from None
        except ChannelInvalidStateError:  # closed as above, before this push went out
            raise self.failed("the channel closed before the message went out") from None
        except asyncio.TimeoutError:
            why = f"no confirmation from the broker within {self.timeout_s:g} s"
            raise self.failed(why) from None
        except Exception as exc:  # a lost connection, say: send raises only DeliveryFailed
            raise self.failed(f"publish to {where} failed: {self.describe(exc)}") from None

    async def _release(self) -> None:
        connection, self._connection, self._channel = self._connection, None, None
        sockets, self._sockets = self._sockets, None
        self._known.clear()
        if connection is not None:
            await connection.close()
        if sockets is not None:
            sockets.close_all()
