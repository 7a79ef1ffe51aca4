"""The ``delaywheel`` command: ``serve`` runs the server; the rest talk to one.

Exit codes: 0 success; 1 not found, conflict or exists (also ``reserve`` that got
nothing); 2 usage error (click's own, a bad duration or time, and the server's
``bad_request``, ``too_large`` and ``unauthorized``); 3 the server cannot be reached or
is ``unavailable``. A failure is one line on stderr, never a traceback.

Every setting of ``serve`` can also come from an environment variable named
``DELAYWHEEL_<OPTION>`` (``--tick`` from ``DELAYWHEEL_TICK``, ``--max-body`` from
``DELAYWHEEL_MAX_BODY``); the global client options likewise (``DELAYWHEEL_SERVER``,
``DELAYWHEEL_TOKEN``, ``DELAYWHEEL_JSON``, ``DELAYWHEEL_TIMEOUT``). ``DELAYWHEEL_TOKEN``
is read by both sides on purpose: one secret for the server and its clients.

With ``--json`` every command prints one JSON document on stdout: the server's result
for the method it calls. Bytes (a bin ``body``) are written as ``{"$bin": "<base64>"}``,
and the same wrapper is read back by ``--json-body`` and ``import``.
"""

from __future__ import annotations

import base64
import functools
import json
import logging
import math
import os
import re
import stat
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext, suppress
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any, NoReturn, TypeVar, cast

import click
from delaywheel_client.protocol import DEFAULT_MAX_MESSAGE_BYTES

from delaywheel import __version__
from delaywheel.config import (
    DEFAULT_HOST,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_PORT,
    DEFAULT_STORE,
    ConfigError,
    Settings,
)
from delaywheel.durations import (
    format_duration,
    format_relative,
    format_time,
    parse_duration,
    parse_when,
)
from delaywheel.wheel import DEFAULT_SLOTS, DEFAULT_TICK_S

if TYPE_CHECKING:
    from delaywheel_client import Client

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3

DEFAULT_SERVER = f"127.0.0.1:{DEFAULT_PORT}"
DEFAULT_TIMEOUT_S = 10.0
STATES = ("delayed", "ready", "reserved", "delivering", "dead")

# Server error codes (PROTOCOL.md, plus the client's "connection") -> exit code, label.
_ERRORS: dict[str, tuple[int, str]] = {
    "not_found": (EXIT_FAILED, "not found"),
    "exists": (EXIT_FAILED, "exists"),
    "conflict": (EXIT_FAILED, "conflict"),
    "bad_request": (EXIT_USAGE, "bad request"),
    "too_large": (EXIT_USAGE, "too large"),
    "unauthorized": (EXIT_USAGE, "unauthorized"),
    "connection": (EXIT_UNREACHABLE, "cannot reach the server"),
    "unavailable": (EXIT_UNREACHABLE, "server unavailable"),
    "no_method": (EXIT_FAILED, "unknown method"),
    "internal": (EXIT_FAILED, "server error"),
}

F = TypeVar("F", bound=Callable[..., Any])


# -- errors ---------------------------------------------------------------------


class CliError(click.ClickException):
    """A failure printed as its message, on one line; exits 1."""

    exit_code = EXIT_FAILED


class _UsageFailure(CliError):
    exit_code = EXIT_USAGE


class _UnreachableFailure(CliError):
    exit_code = EXIT_UNREACHABLE


def cli_error(message: str, exit_code: int = EXIT_FAILED) -> CliError:
    """A ``CliError`` that exits with ``exit_code`` (1, 2 or 3)."""
    kind = {EXIT_USAGE: _UsageFailure, EXIT_UNREACHABLE: _UnreachableFailure}.get(
        exit_code, CliError
    )
    return kind(message)


def _server_error(exc: BaseException, prefix: str = "", suffix: str = "") -> CliError:
    """A ``delaywheel_client.errors.DelaywheelError`` as a one-line ``CliError``."""
    code = str(getattr(exc, "code", "internal"))
    return _failure(code, str(getattr(exc, "message", exc)), prefix, suffix)


def _failure(code: str, message: str, prefix: str = "", suffix: str = "") -> CliError:
    exit_code, label = _ERRORS.get(code, (EXIT_FAILED, code.replace("_", " ")))
    return cli_error(f"{prefix}{label}: {message}{suffix}", exit_code)


def _one_line(text: str) -> str:
    return " ".join(text.split())


class _Group(click.Group):
    """A group whose failures are one line on stderr (click prints usage, then the error)."""

    def main(
        self,
        args: Any = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, **extra)
        try:
            result = super().main(args, prog_name, complete_var, False, **extra)
        except click.UsageError as exc:
            where = _command_name(exc.ctx)
            click.echo(_one_line(f"{where}: {exc.format_message()}"), err=True)
            sys.exit(exc.exit_code)
        except click.ClickException as exc:
            click.echo(_one_line(exc.format_message()), err=True)
            sys.exit(exc.exit_code)
        except click.Abort:
            click.echo("delaywheel: aborted", err=True)
            sys.exit(EXIT_FAILED)
        sys.exit(result if isinstance(result, int) else 0)


def _command_name(ctx: click.Context | None) -> str:
    """``delaywheel add``, whatever name the program was started by (``python -m``...)."""
    names = []
    while ctx is not None and ctx.parent is not None:
        names.append(ctx.info_name or "")
        ctx = ctx.parent
    return " ".join(["delaywheel", *reversed(names)])


def _client_command(func: F) -> F:
    """Turn client errors (and any surprise) raised by a command into one-line failures."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        # Imported here so that ``serve`` never depends on the client's network code.
        from delaywheel_client import errors

        try:
            return func(*args, **kwargs)
        except (click.ClickException, click.exceptions.Exit, click.Abort, BrokenPipeError):
            raise  # click reports these itself (a closed pipe exits quietly)
        except errors.DelaywheelError as exc:
            raise _server_error(exc) from None
        except Exception as exc:
            raise cli_error(f"unexpected error: {type(exc).__name__}: {exc}") from None

    return cast(F, wrapper)


def _not_found(task_id: str) -> NoReturn:
    raise cli_error(f"not found: {task_id}", EXIT_FAILED)


@contextmanager
def _missing_is(task_id: str) -> Iterator[None]:
    """Report a ``not_found`` server error as ``not found: ID``."""
    try:
        yield
    except Exception as exc:
        if getattr(exc, "code", None) == "not_found":
            _not_found(task_id)
        raise


# -- parameter types --------------------------------------------------------------

# click made ParamType generic in 8.2; pyproject allows 8.1, where it cannot be subscripted.
if TYPE_CHECKING:
    _FloatType = click.ParamType[float]
    _AddressType = click.ParamType[tuple[str, int]]
else:
    _FloatType = _AddressType = click.ParamType


class Duration(_FloatType):
    """Seconds: ``90``, ``1.5``, ``90s``, ``30m``, ``2h``, ``5d``, ``1h30m``."""

    name = "duration"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        try:
            return parse_duration(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class When(_FloatType):
    """Unix seconds from an ISO 8601 time or a duration from now."""

    name = "time"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        try:
            return parse_when(value, time.time())
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


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


DURATION = Duration()
WHEN = When()


# -- JSON --------------------------------------------------------------------------


def to_json(value: Any) -> Any:
    """``value`` with bytes wrapped as ``{"$bin": base64}``, ready for ``json.dumps``."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"$bin": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, dict):
        return {_json_key(k): to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def _json_key(key: Any) -> str:
    if isinstance(key, (bytes, bytearray)):
        return bytes(key).decode("utf-8", "backslashreplace")
    if isinstance(key, str):
        return key
    return json.dumps(to_json(key))


def from_json(value: Any) -> Any:
    """The inverse of ``to_json``: a map whose only key is ``"$bin"`` becomes bytes."""
    if isinstance(value, dict):
        if len(value) == 1 and "$bin" in value:
            encoded = value["$bin"]
            if not isinstance(encoded, str):
                raise ValueError(f'"$bin" must hold a base64 string, got {encoded!r}')
            try:
                return base64.b64decode(encoded, validate=True)
            except ValueError:
                raise ValueError(f'"$bin" holds bad base64: {encoded[:40]!r}') from None
        return {k: from_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [from_json(v) for v in value]
    return value


def _dumps(value: Any) -> str:
    return json.dumps(to_json(value), ensure_ascii=False)


# -- the connection --------------------------------------------------------------


@dataclass
class Env:
    """The global options, and the client made from them on first use."""

    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    token: str | None = None
    as_json: bool = False
    timeout_s: float = DEFAULT_TIMEOUT_S
    _clients: list[Client] = field(default_factory=list)

    def client(self) -> Client:
        """A ``delaywheel_client.Client`` for the global options (it connects on first use)."""
        from delaywheel_client import Client

        made = Client(
            self.host,
            self.port,
            token=self.token,
            timeout_s=self.timeout_s,
            connect_timeout_s=min(5.0, self.timeout_s),
        )
        self._clients.append(made)
        return made

    def close(self) -> None:
        for made in self._clients:
            with suppress(Exception):  # best effort: the process is ending anyway
                made.close()
        self._clients.clear()

    def emit(self, result: Any, text: str | Callable[[], str]) -> None:
        """Print ``result`` as JSON with ``--json``, else ``text``."""
        if self.as_json:
            click.echo(_dumps(result))
        else:
            click.echo(text() if callable(text) else text)


# -- readable output --------------------------------------------------------------


def _when(unix_s: Any, now_s: float) -> str:
    if not isinstance(unix_s, (int, float)) or not math.isfinite(unix_s):
        return str(unix_s)
    try:
        return f"{format_time(unix_s)} ({format_relative(unix_s, now_s)})"
    except (OverflowError, OSError, ValueError):
        return str(unix_s)


def _iso(unix_s: Any) -> str:
    if not isinstance(unix_s, (int, float)) or not math.isfinite(unix_s):
        return str(unix_s)
    try:
        return format_time(unix_s)
    except (OverflowError, OSError, ValueError):
        return str(unix_s)


def _seconds(value: Any) -> str:
    if isinstance(value, (int, float)) and math.isfinite(value) and value >= 0:
        return format_duration(value)
    return str(value)


def _body_text(body: Any) -> tuple[str, str]:
    """(label, text) for a task body."""
    if isinstance(body, str):
        return "body (str)", body
    if isinstance(body, (bytes, bytearray)):
        raw = bytes(body)
        try:
            return f"body (bin, {len(raw)} bytes)", raw.decode("utf-8")
        except UnicodeDecodeError:
            return f"body (bin, {len(raw)} bytes, base64)", base64.b64encode(raw).decode()
    return "body (json)", json.dumps(to_json(body), ensure_ascii=False, indent=2)


def _target_text(target: Any) -> str:
    if not isinstance(target, dict):
        return str(target)
    kind = target.get("type", "queue")
    if kind == "http":
        return f"http {target.get('method', 'POST')} {target.get('url')}"
    if kind == "redis":
        return f"redis {target.get('mode', 'list')} {target.get('key')}"
    return str(kind)


def _task_text(task: dict[str, Any]) -> str:
    now = time.time()
    rows: list[tuple[str, str]] = [
        ("id", str(task.get("id"))),
        ("topic", str(task.get("topic"))),
        ("state", str(task.get("state"))),
        ("due", _when(task.get("at"), now)),
    ]
    if task.get("deadline") is not None:
        rows.append(("deadline", _when(task["deadline"], now)))
    rows.append(("attempts", f"{task.get('attempts', 0)} of {task.get('max_attempts', '?')}"))
    if "ttr" in task:
        rows.append(("ttr", _seconds(task["ttr"])))
    if "target" in task:
        rows.append(("target", _target_text(task["target"])))
    if "created" in task:
        rows.append(("created", _when(task["created"], now)))
    if "cycle" in task or "slot" in task:
        rows.append(("wheel", f"cycle {task.get('cycle')}, slot {task.get('slot')}"))
    shown = {"id", "topic", "state", "at", "deadline", "attempts", "max_attempts", "ttr"}
    shown |= {"target", "created", "cycle", "slot", "body"}
    rows.extend((key, _dumps(value)) for key, value in task.items() if key not in shown)
    width = max(len(key) for key, _ in rows) + 1
    lines = [f"{key + ':':<{width}} {value}" for key, value in rows]
    label, text = _body_text(task.get("body"))
    lines.append(f"{label}:")
    lines.append(text)
    return "\n".join(lines)


def _table(tasks: list[dict[str, Any]]) -> str:
    header = ("ID", "TOPIC", "STATE", "DUE", "ATTEMPTS")
    rows = [
        (
            str(t.get("id")),
            str(t.get("topic")),
            str(t.get("state")),
            _iso(t.get("at")),
            f"{t.get('attempts', 0)}/{t.get('max_attempts', '?')}",
        )
        for t in tasks
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    )


def _stats_text(stats: Any, indent: int = 0) -> str:
    if not isinstance(stats, dict):
        return " " * indent + str(to_json(stats))
    lines = []
    pad = " " * indent
    for key, value in stats.items():
        name = _json_key(key)
        if isinstance(value, dict):
            if value:
                lines.append(f"{pad}{name}:")
                lines.append(_stats_text(value, indent + 2))
            else:
                lines.append(f"{pad}{name}: none")
        elif name in ("uptime", "uptime_s") and isinstance(value, (int, float)):
            lines.append(f"{pad}{name}: {_seconds(value)}")
        elif name in ("tick", "tick_s") and isinstance(value, (int, float)):
            lines.append(f"{pad}{name}: {value * 1000:g} ms")
        else:
            lines.append(f"{pad}{name}: {to_json(value)}")
    return "\n".join(lines)


# -- shared options ----------------------------------------------------------------

_UNSET: Any = object()


def _time_options(func: F) -> F:
    func = click.option(
        "--at",
        type=WHEN,
        help="Due time: ISO 8601 (2026-12-24T09:00:00Z, +01:00 offsets; naive is local "
        "time) or a duration from now. Not with --delay.",
    )(func)
    return click.option(
        "--delay", type=DURATION, help="Due after this long: 90, 90s, 30m, 2h, 5d, 1h30m."
    )(func)


def _body_options(func: F) -> F:
    func = click.option(
        "--json-body",
        metavar="JSON",
        help='Body as a JSON value, sent as that value ({"$bin": "<base64>"} is bytes).',
    )(func)
    func = click.option(
        "--body-file",
        type=click.File("rb"),
        help="Body from a file ('-' for stdin), sent as bin bytes.",
    )(func)
    return click.option("--body", metavar="TEXT", help="Body as text, sent as a str.")(func)


def _task_options(func: F) -> F:
    func = click.option(
        "--target",
        metavar="JSON",
        help='Delivery target map, e.g. {"type": "http", "url": "https://..."}.',
    )(func)
    func = click.option(
        "--max-attempts", type=click.IntRange(min=1), help="Deliveries before the task is dead."
    )(func)
    return click.option(
        "--ttr", type=DURATION, help="Time to run once reserved (duration; 0 = at most once)."
    )(func)


def _json_option(text: str | None, option: str) -> Any:
    if text is None:
        return _UNSET
    try:
        return from_json(json.loads(text))
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint=f"'{option}'") from None


def _body(body: str | None, body_file: IO[bytes] | None, json_body: str | None) -> Any:
    given = [name for name, value in (("--body", body), ("--body-file", body_file),
                                      ("--json-body", json_body)) if value is not None]  # fmt: skip
    if len(given) > 1:
        raise click.UsageError(f"give one of --body, --body-file, --json-body, not {given}")
    if body is not None:
        return body
    if body_file is not None:
        return body_file.read()
    return _json_option(json_body, "--json-body")


def _changes(
    delay: float | None,
    at: float | None,
    body: Any,
    ttr: float | None,
    max_attempts: int | None,
    target: str | None,
) -> dict[str, Any]:
    if delay is not None and at is not None:
        raise click.UsageError("give --delay or --at, not both")
    fields: dict[str, Any] = {}
    if delay is not None:
        fields["delay"] = delay
    if at is not None:
        fields["at"] = at
    if body is not _UNSET:
        fields["body"] = body
    if ttr is not None:
        fields["ttr"] = ttr
    if max_attempts is not None:
        fields["max_attempts"] = max_attempts
    parsed_target = _json_option(target, "--target")
    if parsed_target is not _UNSET:
        fields["target"] = parsed_target
    return fields


# -- the group ---------------------------------------------------------------------

_EPILOG = """\
Exit codes: 0 success; 1 not found, conflict or exists; 2 usage error or a request
the server refuses (bad_request, too_large, unauthorized); 3 server unreachable or
unavailable. Failures are one line on stderr.

With --json each command prints one JSON document on stdout: the result of the
server method it calls. Bytes (a bin body) appear as {"$bin": "<base64>"}; the
same wrapper is accepted by --json-body and import.

Durations: 90, 1.5, 90s, 30m, 2h, 5d, 1w, 1h30m. Times: ISO 8601
(2026-12-24T09:00:00Z, with an offset, or naive = local) or a duration from now.
"""


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]}, epilog=_EPILOG)
@click.option(
    "--server",
    type=ServerAddress(),
    default=DEFAULT_SERVER,
    show_default=True,
    envvar="DELAYWHEEL_SERVER",
    show_envvar=True,
    help="Server to talk to, HOST:PORT.",
)
@click.option(
    "--token",
    envvar="DELAYWHEEL_TOKEN",
    show_envvar=True,
    help="Sent with auth before the first request (the server's --token).",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    envvar="DELAYWHEEL_JSON",
    show_envvar=True,
    help='Machine output: one JSON document per command on stdout; bytes as {"$bin": base64}.',
)
@click.option(
    "--timeout",
    "timeout_s",
    type=DURATION,
    default=DEFAULT_TIMEOUT_S,
    show_default=True,
    envvar="DELAYWHEEL_TIMEOUT",
    show_envvar=True,
    help="Seconds to wait for each reply (reserve adds its own --timeout).",
)
@click.version_option(__version__, prog_name="delaywheel")
@click.pass_context
def main(
    ctx: click.Context, server: tuple[str, int], token: str | None, as_json: bool, timeout_s: float
) -> None:
    """delaywheel: a delay-queue server built on a hierarchical time wheel.

    `delaywheel serve` runs the server; the other commands talk to one.
    """
    if timeout_s <= 0:
        raise click.BadParameter(
            f"must be more than 0, got {timeout_s:g}", param_hint="'--timeout'"
        )
    env = Env(host=server[0], port=server[1], token=token or None, as_json=as_json,
              timeout_s=timeout_s)  # fmt: skip
    ctx.obj = env
    ctx.call_on_close(env.close)


pass_env = click.make_pass_decorator(Env)


# -- serve ---------------------------------------------------------------------------


def _serve_option(*names: str, **kwargs: Any) -> Callable[[F], F]:
    """A ``serve`` option read also from ``DELAYWHEEL_<OPTION>``, shown in --help."""
    flag = next(name for name in names if name.startswith("--"))
    envvar = "DELAYWHEEL_" + flag[2:].upper().replace("-", "_")
    return click.option(*names, envvar=envvar, show_envvar=True, **kwargs)


@main.command()
@_serve_option("--host", default=DEFAULT_HOST, show_default=True, help="Address to listen on.")
@_serve_option(
    "--port", default=DEFAULT_PORT, show_default=True, type=int, help="0 picks a free port."
)
@_serve_option(
    "--store",
    "store_url",
    default=DEFAULT_STORE,
    show_default=True,
    help="redis://host:port/db, sqlite:///path or memory://",
)
@_serve_option(
    "--redis-prefix", default="delaywheel", show_default=True, help="Key prefix in Redis."
)
@_serve_option("--slots", default=DEFAULT_SLOTS, show_default=True, type=int, help="Wheel slots.")
@_serve_option(
    "--tick",
    "tick_s",
    default=DEFAULT_TICK_S,
    show_default=True,
    type=float,
    help="Seconds per tick (0.001 or more).",
)
@_serve_option(
    "--token",
    default=None,
    help="Clients must send auth [token] first (the same variable as the client's --token).",
)
@_serve_option(
    "--max-message",
    "max_message_bytes",
    default=DEFAULT_MAX_MESSAGE_BYTES,
    show_default=True,
    type=int,
    help="Largest message, in bytes.",
)
@_serve_option(
    "--max-body",
    "max_body_bytes",
    default=DEFAULT_MAX_BODY_BYTES,
    show_default=True,
    type=int,
    help="Largest packed task body, in bytes.",
)
@_serve_option(
    "--max-connections",
    default=DEFAULT_MAX_CONNECTIONS,
    show_default=True,
    type=int,
    help="Connections served at once.",
)
@_serve_option(
    "--log-level",
    default="info",
    show_default=True,
    type=click.Choice(["debug", "info", "warning", "error"]),
)
def serve(log_level: str, **options: object) -> None:
    """Run the server in the foreground until SIGINT or SIGTERM."""
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        settings = Settings(**options)  # type: ignore[arg-type]
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    from delaywheel.app import run
    from delaywheel.store.base import StoreError

    try:
        run(settings)
    except StoreError as exc:
        click.echo(f"delaywheel: {exc}", err=True)
        sys.exit(EXIT_UNREACHABLE)


# -- task commands -----------------------------------------------------------------------


@main.command()
@click.option("--topic", required=True, help="Ready queue the task is delivered to.")
@_time_options
@_body_options
@click.option("--id", "task_id", help="Your own id (makes the add idempotent).")
@_task_options
@pass_env
@_client_command
def add(
    env: Env,
    topic: str,
    delay: float | None,
    at: float | None,
    body: str | None,
    body_file: IO[bytes] | None,
    json_body: str | None,
    task_id: str | None,
    ttr: float | None,
    max_attempts: int | None,
    target: str | None,
) -> None:
    """Add a task, due now, after --delay, or at --at.

    Prints the id, due time, and the task's cycle and slot in the wheel.
    """
    fields = _changes(delay, at, _body(body, body_file, json_body), ttr, max_attempts, target)
    payload = fields.pop("body", None)
    result = env.client().add(topic, payload, id=task_id, **fields)
    env.emit(
        result,
        lambda: (
            f"added {result['id']}, due {_when(result['at'], time.time())}, "
            f"cycle {result['cycle']}, slot {result['slot']}"
        ),
    )


@main.command()
@click.argument("task_id", metavar="ID")
@click.option("--topic", help="Move the task to this topic.")
@_time_options
@_body_options
@_task_options
@pass_env
@_client_command
def update(
    env: Env,
    task_id: str,
    topic: str | None,
    delay: float | None,
    at: float | None,
    body: str | None,
    body_file: IO[bytes] | None,
    json_body: str | None,
    ttr: float | None,
    max_attempts: int | None,
    target: str | None,
) -> None:
    """Change a task: only the options given are sent. Prints the updated task."""
    changes = _changes(delay, at, _body(body, body_file, json_body), ttr, max_attempts, target)
    if topic is not None:
        changes["topic"] = topic
    if not changes:
        raise click.UsageError("nothing to update: give at least one option")
    with _missing_is(task_id):
        task = env.client().update(task_id, **changes)
    env.emit(task, lambda: _task_text(task))


@main.command()
@click.argument("task_id", metavar="ID")
@pass_env
@_client_command
def delete(env: Env, task_id: str) -> None:
    """Delete a task, in any state. Exits 1 when there was no such task."""
    if not env.client().delete(task_id):
        _not_found(task_id)
    env.emit(True, f"deleted {task_id}")


@main.command()
@click.argument("task_id", metavar="ID")
@pass_env
@_client_command
def get(env: Env, task_id: str) -> None:
    """Show a task, body included. Exits 1 when there is no such task."""
    task = env.client().get(task_id)
    if task is None:
        _not_found(task_id)
    env.emit(task, lambda: _task_text(task))


@main.command("list")
@click.option("--topic", help="Only tasks of this topic.")
@click.option("--state", type=click.Choice(STATES), help="Only tasks in this state.")
@click.option("--limit", type=click.IntRange(1, 1000), help="Tasks per page (server default 100).")
@click.option("--cursor", type=int, help="Start after this cursor (a previous page's next).")
@click.option("--all", "follow", is_flag=True, help="Follow cursors to the last page.")
@pass_env
@_client_command
def list_(
    env: Env,
    topic: str | None,
    state: str | None,
    limit: int | None,
    cursor: int | None,
    follow: bool,
) -> None:
    """List tasks, oldest first, one page unless --all.

    The table shows id, topic, state, due time and attempts. With --json it prints
    {"tasks": [...], "next": cursor or null}.
    """
    client = env.client()
    tasks: list[dict[str, Any]] = []
    while True:
        page = client.list(topic=topic, state=state, limit=limit, cursor=cursor)
        tasks.extend(page["tasks"])
        cursor = page.get("next")
        if cursor is None or not follow:
            break
    if env.as_json:
        env.emit({"tasks": tasks, "next": cursor}, "")
        return
    click.echo(_table(tasks) if tasks else "no tasks")
    if cursor is not None:
        click.echo(f"more tasks: use --all, or --cursor {cursor} for the next page", err=True)


@main.command()
@pass_env
@_client_command
def stats(env: Env) -> None:
    """Show server statistics: tasks by state and topic, the wheel, the store."""
    result = env.client().stats()
    env.emit(result, lambda: _stats_text(result))


@main.command()
@click.argument("topics", nargs=-1, required=True)
@click.option(
    "--timeout",
    "wait_s",
    type=DURATION,
    default=0.0,
    help="How long to wait for a task (duration; default 0: do not wait).",
)
@pass_env
@_client_command
def reserve(env: Env, topics: tuple[str, ...], wait_s: float) -> None:
    """Take the oldest ready task of TOPICS and print it, body included.

    The task is then reserved for its ttr: ack it when done, or release it. Exits 1
    when no task was ready within --timeout.
    """
    task = env.client().reserve(list(topics), wait_s)
    if task is None:
        raise cli_error(f"nothing ready in {', '.join(topics)}", EXIT_FAILED)
    env.emit(task, lambda: _task_text(task))


@main.command()
@click.argument("task_id", metavar="ID")
@pass_env
@_client_command
def ack(env: Env, task_id: str) -> None:
    """Finish a reserved task: it is removed."""
    with _missing_is(task_id):
        result = env.client().ack(task_id)
    env.emit(result, f"acked {task_id}")


@main.command()
@click.argument("task_id", metavar="ID")
@click.option("--delay", type=DURATION, default=0.0, help="Due again after this long.")
@pass_env
@_client_command
def release(env: Env, task_id: str, delay: float) -> None:
    """Give a reserved task back, due again after --delay."""
    with _missing_is(task_id):
        result = env.client().release(task_id, delay)
    env.emit(result, f"released {task_id}, due {'now' if not delay else 'in ' + _seconds(delay)}")


@main.command()
@click.argument("task_id", metavar="ID")
@pass_env
@_client_command
def touch(env: Env, task_id: str) -> None:
    """Extend a reserved task's deadline by its ttr. Prints the new deadline."""
    with _missing_is(task_id):
        deadline = env.client().touch(task_id)
    env.emit(deadline, lambda: f"{task_id}: deadline {_when(deadline, time.time())}")


@main.command()
@click.argument("topic")
@click.option("--count", type=click.IntRange(min=1), default=1, show_default=True)
@pass_env
@_client_command
def kick(env: Env, topic: str, count: int) -> None:
    """Make up to --count dead tasks of TOPIC due again."""
    kicked = env.client().kick(topic, count)
    env.emit(kicked, f"kicked {kicked} task{'' if kicked == 1 else 's'} of {topic}")


@main.command()
@pass_env
@_client_command
def ping(env: Env) -> None:
    """Check that the server answers."""
    client = env.client()
    started = time.perf_counter()
    result = client.ping()
    elapsed_ms = (time.perf_counter() - started) * 1000
    env.emit(result, f"{result} from {env.host}:{env.port} in {elapsed_ms:.1f} ms")


# -- import ------------------------------------------------------------------------------


@dataclass
class _Batch:
    tasks: list[dict[str, Any]] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)
    size: int = 0  # bytes read for it, for the progress bar


def _task_from_line(raw: bytes, now_s: float) -> dict[str, Any]:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 ({exc.reason} at byte {exc.start})") from None
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError(f"expected a task map, got {type(value).__name__}")
    task: dict[str, Any] = from_json(value)
    if isinstance(task.get("delay"), str):
        task["delay"] = parse_duration(task["delay"])
    if isinstance(task.get("ttr"), str):
        task["ttr"] = parse_duration(task["ttr"])
    if isinstance(task.get("at"), str):
        task["at"] = parse_when(task["at"], now_s)
    return task


def _batches(stream: IO[bytes], batch_size: int) -> Iterator[_Batch | tuple[int, str]]:
    """Batches of parsed tasks; a bad line ends the iteration with (line number, problem)."""
    batch = _Batch()
    for number, raw in enumerate(stream, start=1):
        batch.size += len(raw)
        if not raw.strip():
            continue
        try:
            batch.tasks.append(_task_from_line(raw, time.time()))
        except ValueError as exc:
            yield number, str(exc)
            return
        batch.lines.append(number)
        if len(batch.tasks) >= batch_size:
            yield batch
            batch = _Batch()
    if batch.tasks or batch.size:
        yield batch


def _stream_size(stream: IO[bytes]) -> int | None:
    try:
        info = os.fstat(stream.fileno())
    except (OSError, ValueError, AttributeError):
        return None
    return info.st_size if stat.S_ISREG(info.st_mode) else None


_TASK_INDEX = re.compile(r"^task (\d+): (.*)$", re.DOTALL)


@main.command("import")
@click.argument("file", type=click.File("rb"))
@click.option(
    "--batch-size",
    type=click.IntRange(1, 100_000),
    default=500,
    show_default=True,
    help="Tasks per add_many request.",
)
@pass_env
@_client_command
def import_(env: Env, file: IO[bytes], batch_size: int) -> None:
    """Add the tasks in FILE ('-' for stdin): JSON lines, one task map per line.

    Each line holds the task fields of the protocol (topic, id, delay, at, body, ttr,
    target, max_attempts). delay and ttr may also be durations ("90s", "2h"), at an
    ISO 8601 time, and {"$bin": "<base64>"} is a bytes value. Blank lines are skipped.

    Tasks go to the server in batches of --batch-size with add_many, and each batch
    is all or nothing. When a line is bad (locally, or refused by the server) the
    error names it and that batch and every later line are not added, but the
    batches before it HAVE been added and stay: the message says how many and
    which line to resume from (e.g. with tail -n +LINE). A progress bar is shown on
    stderr when it is a terminal.
    """
    client = env.client()
    added_ids: list[str] = []
    last_added_line = 0
    batches = 0
    size = _stream_size(file)
    show_bar = size is not None and not env.as_json and sys.stderr.isatty()
    bar: AbstractContextManager[Any] = (
        click.progressbar(length=size, label="importing", file=sys.stderr)
        if show_bar
        else nullcontext(None)
    )

    def done_so_far() -> str:
        if not added_ids:
            return "no task was added"
        return (
            f"{len(added_ids)} tasks of lines 1-{last_added_line} were added by earlier "
            f"batches; resume from line {last_added_line + 1}"
        )

    with bar as progress:
        for item in _batches(file, batch_size):
            if isinstance(item, tuple):
                number, problem = item
                raise cli_error(f"line {number}: {problem}; {done_so_far()}", EXIT_USAGE)
            if item.tasks:
                try:
                    results = client.add_many(item.tasks)
                except Exception as exc:
                    code = getattr(exc, "code", None)
                    if code is None:
                        raise
                    message = str(getattr(exc, "message", exc))
                    where = f"lines {item.lines[0]}-{item.lines[-1]}: "
                    # The server names the bad task by its index in the batch: "task 12: ...".
                    match = _TASK_INDEX.match(message)
                    if match and int(match.group(1)) < len(item.lines):
                        where = f"line {item.lines[int(match.group(1))]}: "
                        message = match.group(2)
                    raise _failure(str(code), message, where, f"; {done_so_far()}") from None
                added_ids.extend(str(result["id"]) for result in results)
                last_added_line = item.lines[-1]
                batches += 1
            if progress is not None:
                progress.update(item.size)
    name = getattr(file, "name", "-")
    name = "stdin" if name in ("-", "<stdin>") else click.format_filename(name)
    env.emit(
        {"added": len(added_ids), "batches": batches, "ids": added_ids},
        f"added {len(added_ids)} task{'' if len(added_ids) == 1 else 's'} from {name} "
        f"in {batches} batch{'' if batches == 1 else 'es'}",
    )
