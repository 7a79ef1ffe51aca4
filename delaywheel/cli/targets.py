"""The target options of ``add`` and ``update``: one target map from the options given.

``--target JSON`` takes any map; ``--http``, ``--redis-list``, ``--redis-stream``,
``--amqp`` and ``--nats`` build one with the client's ``targets`` module, so the CLI and
Python users make the same maps. One target kind per call; an option that qualifies a
kind (``--method``, ``--exchange``, ``--broker``...) without that kind is a usage error
rather than silently ignored, since the user plainly meant it to change something.
What the server accepts (its ``--http-allow`` list, its brokers) is left to the server.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, TypeVar, cast

import click
from delaywheel_client import targets

from delaywheel.cli.output import from_json
from delaywheel.cli.params import DURATION

F = TypeVar("F", bound=Callable[..., Any])

BROKER_KINDS = ("--redis-list", "--redis-stream", "--amqp", "--nats")


def _headers(
    ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
) -> dict[str, str] | None:
    """``--header "Name: value"``, repeated, as a map; None when none was given."""
    if not values:
        return None
    headers: dict[str, str] = {}
    seen: set[str] = set()
    for text in values:
        name, colon, value = text.partition(":")
        name = name.strip()
        if not colon:
            raise click.BadParameter(f"{text!r} has no colon: give 'Name: value'", ctx, param)
        # The server refuses names that differ only in case; a dict would silently keep
        # the last of two identical ones, so both are caught here.
        if name.lower() in seen:
            raise click.BadParameter(f"{name!r} given twice (names ignore case)", ctx, param)
        seen.add(name.lower())
        headers[name] = value.strip()
    return headers


def _method(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    # Not click.Choice: with case_sensitive=False it lists the methods in lower case.
    if value is None:
        return None
    if value.upper() not in targets.HTTP_METHODS:
        choices = ", ".join(targets.HTTP_METHODS)
        raise click.BadParameter(f"{value!r} is not one of {choices}", ctx, param)
    return value.upper()


_OPTIONS = (
    click.option(
        "--target",
        "target_json",
        metavar="JSON",
        help='Delivery target map, e.g. {"type": "http", "url": "https://..."}.',
    ),
    click.option("--http", metavar="URL", help="Deliver by an HTTP request to URL when due."),
    click.option(
        "--method",
        metavar="METHOD",
        callback=_method,
        help=f"With --http: {', '.join(targets.HTTP_METHODS)} "
        f"(default {targets.DEFAULT_HTTP_METHOD}).",
    ),
    click.option(
        "--header",
        "headers",
        metavar="'NAME: VALUE'",
        multiple=True,
        callback=_headers,
        help="With --http: a request header; repeat for more.",
    ),
    click.option(
        "--http-timeout",
        "http_timeout_s",
        type=DURATION,
        help="With --http: how long the server waits for the answer "
        f"(default {targets.DEFAULT_HTTP_TIMEOUT_S:g}s).",
    ),
    click.option("--redis-list", metavar="KEY", help="Deliver by LPUSH to a Redis list."),
    click.option("--redis-stream", metavar="KEY", help="Deliver by XADD to a Redis stream."),
    click.option(
        "--amqp", metavar="ROUTING_KEY", help="Deliver by publishing to RabbitMQ (needs --broker)."
    ),
    click.option(
        "--exchange", help="With --amqp: the exchange (default '', the default exchange)."
    ),
    click.option(
        "--nats", metavar="SUBJECT", help="Deliver by JetStream publish (needs --broker)."
    ),
    click.option(
        "--broker",
        metavar="NAME",
        help="The server's broker (its --broker NAME=URL) to push to; for --redis-list and "
        f"--redis-stream the default is {targets.STORE_BROKER!r}, the store's own Redis.",
    ),
)


@dataclass(frozen=True)
class TargetOptions:
    """The target options as click parsed them, each None when not given."""

    target_json: str | None
    http: str | None
    method: str | None
    headers: dict[str, str] | None
    http_timeout_s: float | None
    redis_list: str | None
    redis_stream: str | None
    amqp: str | None
    exchange: str | None
    nats: str | None
    broker: str | None

    def kind(self) -> tuple[str, str] | None:
        """The one target option given, as (flag, value); a usage error when more were."""
        kinds = (
            ("--target", self.target_json),
            ("--http", self.http),
            ("--redis-list", self.redis_list),
            ("--redis-stream", self.redis_stream),
            ("--amqp", self.amqp),
            ("--nats", self.nats),
        )
        given = [(flag, value) for flag, value in kinds if value is not None]
        if len(given) > 1:
            raise click.UsageError(f"give one target, not {' and '.join(f for f, _ in given)}")
        return given[0] if given else None

    def target(self) -> dict[str, Any] | None:
        """The target map to send, or None when no target option was given."""
        given = self.kind()
        flag = given[0] if given else None
        _only_with(flag, "--http", method=self.method, header=self.headers,
                   http_timeout=self.http_timeout_s)  # fmt: skip
        _only_with(flag, "--amqp", exchange=self.exchange)
        if self.broker is not None and flag not in BROKER_KINDS:
            kinds = f"{', '.join(BROKER_KINDS[:-1])} or {BROKER_KINDS[-1]}"
            raise click.UsageError(f"--broker goes with {kinds}")
        if given is None:
            return None
        flag, value = given
        if flag == "--target":
            return _json_target(value)
        # Options left out are not passed, so the defaults are the client's alone.
        if flag == "--http":
            return targets.http(value, **_given(method=self.method, headers=self.headers,
                                                timeout_s=self.http_timeout_s))  # fmt: skip
        if flag == "--redis-list":
            return targets.redis_list(value, **_given(broker=self.broker))
        if flag == "--redis-stream":
            return targets.redis_stream(value, **_given(broker=self.broker))
        # RabbitMQ and NATS have no broker of the server's own to default to.
        if self.broker is None:
            raise click.UsageError(f"{flag} needs --broker NAME, one of the server's brokers")
        if flag == "--amqp":
            return targets.amqp(value, broker=self.broker, **_given(exchange=self.exchange))
        return targets.nats(value, broker=self.broker)


def _only_with(flag: str | None, needed: str, **values: Any) -> None:
    """A usage error naming the first of ``values`` given when ``flag`` is not ``needed``."""
    if flag == needed:
        return
    for option, value in values.items():
        if value is not None:
            raise click.UsageError(f"--{option.replace('_', '-')} goes with {needed}")


def _given(**values: Any) -> dict[str, Any]:
    return {name: value for name, value in values.items() if value is not None}


_FIELDS = tuple(field.name for field in fields(TargetOptions))


def _json_target(text: str) -> dict[str, Any]:
    try:
        value = from_json(json.loads(text))
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="'--target'") from None
    # What a map holds is the server's to judge; anything else (null above all, which
    # would read as "no target given") is refused here.
    if not isinstance(value, dict):
        raise click.BadParameter(f"must be a JSON object, got {text}", param_hint="'--target'")
    return value


def target_options(func: F) -> F:
    """Add the target options to a command; ``func`` gets ``target``, the map to send or
    None, in their place."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        options = TargetOptions(**{name: kwargs.pop(name) for name in _FIELDS})
        return func(*args, target=options.target(), **kwargs)

    for option in reversed(_OPTIONS):
        wrapper = option(wrapper)
    return cast(F, wrapper)
