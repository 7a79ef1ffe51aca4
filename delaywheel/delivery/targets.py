"""A target as a client sends it, checked against the server's settings at ``add``.

``validate.target`` has checked the shape every target shares (a map with a
known ``type``); what each type holds depends on the server: the HTTP
destinations ``--http-allow`` lets it call, the brokers ``--broker`` named.
Each checker returns the target with every field present, which is what the
task keeps, journals and returns; the ready queue is ``None`` (no dict per
task for the common case).

A body sent to HTTP, RabbitMQ or NATS must have a form they carry
(``body``): a map holding bin, say, has no JSON form, and is refused here
rather than failing every attempt later.
"""

from __future__ import annotations

import re
from typing import Any

from yarl import URL

from delaywheel.checks import bad, show
from delaywheel.delivery import body
from delaywheel.delivery.allow import AllowList
from delaywheel.delivery.brokers import Brokers
from delaywheel.delivery.http_target import check_target as check_http_target
from delaywheel.delivery.http_target import shown_url

# The targets that send the body encoded (``body.encode``); a Redis push
# carries it as MessagePack, which any body has.
ENCODED_TYPES = frozenset({"http", "amqp", "nats"})
# The targets that carry the task's id and topic in header lines, where a
# control character cannot go (an id or topic may otherwise hold any str).
HEADER_TYPES = frozenset({"http", "nats"})
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# An HTTP target's URL in a log line: at most this long (a URL may be 2,048).
MAX_SHOWN_URL_CHARS = 200


class TargetRules:
    """What targets this server accepts: its allow list and its brokers."""

    def __init__(self, allow: AllowList | None = None, brokers: Brokers | None = None) -> None:
        self.allow = allow if allow is not None else AllowList.parse("public")
        self.brokers = brokers if brokers is not None else Brokers({})

    def check(
        self, target: dict[str, Any], body_packed: bytes, *, task_id: str | None, topic: str
    ) -> dict[str, Any] | None:
        """The target as the task keeps it (None: the ready queue); raises
        ``bad_request`` naming what is wrong. ``task_id`` None: server-made."""
        kind = target["type"]
        if kind == "queue":
            if len(target) != 1:
                raise bad(f"a queue target holds only its type, got {show(target)}")
            return None
        if kind == "http":
            checked = check_http_target(target, self.allow)
        else:
            checked = self.brokers.check_target(target)
        if kind in HEADER_TYPES:
            for field, text in (("id", task_id), ("topic", topic)):
                if text is not None and _CONTROL.search(text):
                    raise bad(
                        f"a {kind} target sends the {field} in a header: {show(text)} "
                        "has a control character"
                    )
        if kind in ENCODED_TYPES:
            error = body.json_error(body_packed)
            if error is not None:
                raise bad(f"a {kind} target sends the body as bin, str or JSON: {error}")
        return checked


def destination(target: dict[str, Any]) -> str:
    """Where a checked target sends, for a log line: an HTTP target's method and
    URL without its query string (``shown_url``), never its headers; a broker
    target's broker and key, routing key or subject (the broker's URL, with
    its password, is the server's setting and stays out). Names are bounded
    (``show``)."""
    kind = target["type"]
    if kind == "http":
        url = shown_url(URL(target["url"]))
        url = url if len(url) <= MAX_SHOWN_URL_CHARS else url[: MAX_SHOWN_URL_CHARS - 3] + "..."
        return f"{target.get('method', 'POST')} {url}"
    broker = f"broker {show(target.get('broker'))}"
    if kind == "redis":
        return f"{target['mode']} {show(target['key'])} on {broker}"
    if kind == "amqp":
        exchange = show(target["exchange"]) if target["exchange"] else "the default exchange"
        return f"routing key {show(target['routing_key'])} via {exchange} on {broker}"
    if kind == "nats":
        return f"subject {show(target['subject'])} on {broker}"
    return str(kind)
