"""Exit codes, and every failure turned into one line on stderr with the right one.

Server error codes (docs/protocol.md, plus the client's ``connection``) map to an exit code
and a label in one table, ``_ERRORS``; everything else goes through ``cli_error``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

import click

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
# ``serve`` only: it cannot listen on its address (--port or --metrics-port is
# taken, or --host is not this machine's). A supervisor may retry: the old
# process holding the port may be draining.
EXIT_CANNOT_LISTEN = 4

# Server error code -> exit code, label.
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


# What a CLI user does about ``unauthorized``: the server's message speaks the
# protocol ("send auth [token]"), which a CLI user never types.
TOKEN_HINT = "give the server's token with --token or DELAYWHEEL_TOKEN"


def server_error(exc: BaseException) -> CliError:
    """A ``delaywheel_client.errors.DelaywheelError`` as a one-line ``CliError``."""
    code = str(getattr(exc, "code", "internal"))
    message = str(getattr(exc, "message", exc))
    if code == "unauthorized":
        message = f"{message.replace(' (send auth [token])', '')}: {TOKEN_HINT}"
    return failure(code, message)


def failure(code: str, message: str, prefix: str = "", suffix: str = "") -> CliError:
    """``PREFIX<label of code>: MESSAGE SUFFIX``, exiting with the code's exit code."""
    exit_code, label = _ERRORS.get(code, (EXIT_FAILED, code.replace("_", " ")))
    return cli_error(f"{prefix}{label}: {message}{suffix}", exit_code)


def not_found(task_id: str) -> NoReturn:
    raise cli_error(f"not found: {task_id}", EXIT_FAILED)


@contextmanager
def missing_is(task_id: str) -> Iterator[None]:
    """Report a ``not_found`` server error as ``not found: ID``."""
    try:
        yield
    except Exception as exc:
        if getattr(exc, "code", None) == "not_found":
            not_found(task_id)
        raise
