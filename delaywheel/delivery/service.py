"""A server's deliveries: its senders and dispatcher, started and stopped together."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from delaywheel.delivery.allow import AllowList
from delaywheel.delivery.base import Sender
from delaywheel.delivery.brokers import Brokers, parse_broker_specs
from delaywheel.delivery.dispatcher import Dispatcher
from delaywheel.delivery.targets import TargetRules

if TYPE_CHECKING:
    from delaywheel.delivery.http import HttpSender


def target_rules(
    *, http_allow: str, brokers: Sequence[str], store_url: str, store_prefix: str
) -> TargetRules:
    """What targets the server accepts (the engine checks every ``add`` with it):
    ``--http-allow``, the ``--broker NAME=URL`` specs, and the store's URL and
    key prefix (a Redis store is the broker ``store``)."""
    named = Brokers(
        parse_broker_specs(list(brokers)), store_url=store_url, store_prefix=store_prefix
    )
    return TargetRules(AllowList.parse(http_allow), named)


class Deliveries:
    def __init__(
        self, rules: TargetRules, *, http_concurrency: int, signing_secret: str | None
    ) -> None:
        self.brokers = rules.brokers
        self.dispatcher: Dispatcher | None = None
        self._http_concurrency = http_concurrency  # --http-concurrency: per HTTP origin
        self._signing_secret = signing_secret
        self._allow = rules.allow
        self._http: HttpSender | None = None  # made by start()

    def _sender_for(self, target: dict[str, Any]) -> Sender:
        if target["type"] != "http":
            return self.brokers.sender(target["broker"])
        assert self._http is not None  # start() made it
        return self._http

    async def start(self, engine: Any, changed: Any) -> None:
        """Connect the brokers (in the background: one that is down fails its
        own deliveries) and start sending the engine's attempts."""
        # Imported here, not at the top: aiohttp takes a tenth of a second to
        # import, which the CLI (it imports this module's neighbours) need not
        # spend; at the first delivery instead, it stalled the loop 0.1-0.2 s.
        from delaywheel.delivery.http import HttpSender

        # Its own bound is only a backstop: the dispatcher's lanes keep each
        # destination to --http-concurrency requests in flight.
        self._http = HttpSender(
            self._allow,
            concurrency=self._http_concurrency * 16,
            signing_secret=self._signing_secret,
        )
        await self.brokers.start()
        self.dispatcher = Dispatcher(
            self._sender_for,
            engine.attempts.begin,
            engine.delivered,
            http_lane_limit=self._http_concurrency,
            changed=changed,
        )
        engine.start_deliveries(self.dispatcher.queue)

    async def stop(self, grace_s: float) -> None:
        if self.dispatcher is not None:
            await self.dispatcher.drain(grace_s)
        if self._http is not None:
            await self._http.close()
        await self.brokers.close()

    def stats(self) -> dict[str, Any]:
        running = {} if self.dispatcher is None else self.dispatcher.stats()
        return {**running, "http": self._http_stats(), "brokers": self.brokers.state()}

    def _http_stats(self) -> dict[str, Any]:
        """The sender's figures, with ``concurrency`` the setting (per destination) and
        ``concurrency_total`` the sender's own backstop over all destinations."""
        if self._http is None:
            return {}
        sender = self._http.state()
        return {
            "in_flight": sender["in_flight"],
            "waiting": sender["waiting"],
            "concurrency": self._http_concurrency,
            "concurrency_total": sender["concurrency"],
        }
