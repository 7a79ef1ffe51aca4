"""Parameter types: durations, times and server addresses as people type them."""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING, Any, cast

import click
from click.core import ParameterSource

from delaywheel.cli.durations import parse_duration, parse_when
from delaywheel.config import DEFAULT_PORT

# click made ParamType generic in 8.2; pyproject allows 8.1, where it cannot be subscripted.
if TYPE_CHECKING:
    _FloatType = click.ParamType[float]
    _AddressType = click.ParamType[tuple[str, int]]
    _ServersType = click.ParamType[tuple[tuple[str, int], ...]]
else:
    _FloatType = _AddressType = _ServersType = click.ParamType


class _Seconds(_FloatType):
    """Seconds read from text by ``parse``; numbers (defaults) pass through as they are."""

    def parse(self, text: str) -> float:
        raise NotImplementedError

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        try:
            return self.parse(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class Duration(_Seconds):
    """Seconds: ``90``, ``1.5``, ``90s``, ``30m``, ``2h``, ``5d``, ``1h30m``."""

    name = "duration"

    def parse(self, text: str) -> float:
        return parse_duration(text)


class When(_Seconds):
    """Unix seconds from an ISO 8601 time or a duration from now."""

    name = "time"

    def parse(self, text: str) -> float:
        return parse_when(text, time.time())


class ServerAddress(_AddressType):
    """``HOST:PORT``, ``[IPv6]:PORT`` or ``HOST`` (port 3450)."""

    name = "host:port"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> tuple[str, int]:
        if isinstance(value, tuple):
            return cast(tuple[str, int], value)
        text = str(value).strip()
        match = re.fullmatch(r"\[([^\]]+)\](?::(\d+))?|([^:\[\]]+)(?::(\d+))?", text)
        if match is None:
            self.fail(f"expected HOST:PORT, got {text!r}", param, ctx)
        host = match.group(1) or match.group(3)
        port_text = match.group(2) or match.group(4)
        port = DEFAULT_PORT if port_text is None else int(port_text)
        if not 1 <= port <= 65535:
            self.fail(f"port must be 1 to 65535, got {port} in {text!r}", param, ctx)
        return host, port


class ServerList(_ServersType):
    """``--server``: one address as ``ServerAddress`` takes it, or several nodes of one
    keyspace, comma-separated (``10.0.0.1:3450,10.0.0.2:3450``)."""

    name = "host:port[,host:port...]"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> tuple[tuple[str, int], ...]:
        if isinstance(value, tuple):
            return cast(tuple[tuple[str, int], ...], value)
        text = str(value)
        items = [item.strip() for item in text.split(",")]
        if not any(items):
            self.fail(f"expected HOST:PORT or a comma-separated list, got {text!r}", param, ctx)
        if not all(items):
            self.fail(f"an empty address in the list {text!r}", param, ctx)
        one = ServerAddress()
        return tuple(dict.fromkeys(one.convert(item, param, ctx) for item in items))


def address_text(host: str, port: int) -> str:
    """``host:port``, with an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


DURATION = Duration()
WHEN = When()


class EnvOption(click.Option):
    """An option also read from its ``DELAYWHEEL_*`` variable, shown in --help. A bad
    value's error names the variable only when the value came from it: click names
    it always, so ``--server 127.0.0.1:notaport`` given as a flag was reported as
    coming from DELAYWHEEL_SERVER."""

    def get_error_hint(self, ctx: click.Context | None) -> str:
        if ctx is not None and ctx.get_parameter_source(self.name or "") is not (
            ParameterSource.ENVIRONMENT
        ):
            return click.Parameter.get_error_hint(self, ctx)  # without the variable
        return super().get_error_hint(ctx)
