"""The NATS sender: a JetStream publish that waits for the stream's PubAck.

One nats-py client per broker, made with ``max_reconnect_attempts=-1``: it
retries the first connection and every reconnection by itself, every
``RECONNECT_MAX_S``, and reports through its callbacks, which keep this
sender's state. With that setting ``connect`` returns only once connected,
so it runs in the background; the client object is made first so that
``close`` can stop it while it is still trying.

``Nats-Msg-Id`` is the task id: a second push of the same task within the
stream's duplicate window (2 minutes unless the stream says otherwise), as
after a crash mid-attempt, is acknowledged with ``duplicate`` and not stored
again. That counts as delivered: the stream has the task.
"""

from __future__ import annotations

import time
from typing import Any

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js import JetStreamContext

from delaywheel.checks import show
from delaywheel.delivery import body
from delaywheel.delivery._broker_link import RECONNECT_MAX_S, BrokerLink, log
from delaywheel.delivery.base import Delivery, header_value, occurrence_headers


def headers(delivery: Delivery, content_type: str) -> dict[str, str]:
    sent = {
        "Content-Type": content_type,
        "Delaywheel-Topic": header_value(delivery.topic),
        "Delaywheel-Attempt": str(delivery.attempt),
        "Delaywheel-Epoch": str(delivery.epoch),
        "Nats-Msg-Id": header_value(delivery.task_id),
    }
    if delivery.occurrence is not None:
        sent.update(occurrence_headers(delivery.occurrence, time.time()))
    return sent


class NatsSender(BrokerLink):
    kind = "nats"

    def __init__(self, name: str, url: str, **options: Any) -> None:
        super().__init__(name, url, **options)
        self._client = Client()
        self._js: JetStreamContext | None = None

    def start(self) -> None:
        self.spawn(self._connect())

    async def _connect(self) -> None:
        try:
            await self._client.connect(
                self._raw_url,
                name=f"delaywheel broker {self.name}",
                connect_timeout=max(1, round(self.connect_timeout_s)),
                reconnect_time_wait=max(1, round(RECONNECT_MAX_S)),
                max_reconnect_attempts=-1,
                error_cb=self._on_error,
                disconnected_cb=self._on_disconnected,
                reconnected_cb=self._on_reconnected,
            )
        except Exception as exc:  # not a down server (that is retried): a bad URL or option
            self.mark_down(exc)
            return
        self._js = self._client.jetstream(timeout=self.timeout_s)
        self.mark_up()

    async def _on_error(self, exc: Exception) -> None:
        if self._client.is_connected:  # e.g. a slow consumer: not this sender's business
            log.debug("broker %r: %s", self.name, self.describe(exc))
        else:
            self.mark_down(exc)

    async def _on_disconnected(self) -> None:
        error = self._client.last_error
        self.mark_down(error if error is not None else "the connection was lost")

    async def _on_reconnected(self) -> None:
        self.mark_up()

    async def send(self, delivery: Delivery) -> None:
        await self.usable()
        js = self._js
        if js is None or not self._client.is_connected:  # reconnecting
            raise self.failed(f"not connected ({self.last_error or 'reconnecting'})")
        subject: str = delivery.target["subject"]
        shown = show(subject)
        try:
            payload, content_type = body.encode(delivery.body_packed)
            ack = await js.publish(
                subject, payload, timeout=self.timeout_s, headers=headers(delivery, content_type)
            )
        except nats.js.errors.NoStreamResponseError:
            raise self.failed(f"no JetStream stream takes subject {shown}") from None
        except nats.errors.TimeoutError:
            raise self.failed(
                f"no acknowledgement for {shown} within {self.timeout_s:g} s"
            ) from None
        except nats.js.errors.APIError as exc:  # the stream refused it (full, limits)
            reason = exc.description or self.describe(exc)
            raise self.failed(f"JetStream refused the message on {shown}: {reason}") from None
        except Exception as exc:  # a lost connection, say: send raises only DeliveryFailed
            raise self.failed(f"publish to {shown} failed: {self.describe(exc)}") from None
        if ack.duplicate:
            log.debug("broker %r: task %r already in %s", self.name, delivery.task_id, ack.stream)

    async def _release(self) -> None:
        if not self._client.is_closed:
            await self._client.close()
