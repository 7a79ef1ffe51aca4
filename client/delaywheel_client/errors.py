"""Exceptions: one class per protocol error code, all under ``DelaywheelError``.

A server error reply ``[code, message]`` becomes ``error_from(code, message)``; a code this
version does not know still raises, as a plain ``DelaywheelError`` that carries it. Failures
of the connection itself are ``ConnectionFailed`` (code ``"connection"``), and the server's
parting ``[2, "error", [code, message]]`` notification is ``ServerClosed``, a
``ConnectionFailed`` that carries the server's code and message.
"""

from __future__ import annotations

from typing import Any


class DelaywheelError(Exception):
    """Base of every error the client raises. ``code`` is the protocol error code."""

    code: str = "error"
    message: str

    def __init__(self, message: str = "", code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code

    def __str__(self) -> str:
        return f"{self.code}: {self.message}" if self.message else self.code

    def __reduce__(self) -> tuple[Any, ...]:
        # Keep the code across pickling (multiprocessing, concurrent.futures).
        return (type(self), (self.message, self.code))


class BadRequest(DelaywheelError):
    """Wrong params: a missing or ill-typed field, both delay and at, a value out of range."""

    code = "bad_request"


class NotFound(DelaywheelError):
    """No task with that id (update, ack, release, touch)."""

    code = "not_found"


class Exists(DelaywheelError):
    """``add`` with an id that a live task already has."""

    code = "exists"


class Conflict(DelaywheelError):
    """The task's state does not allow it (ack of a task not reserved, say)."""

    code = "conflict"


class TooLarge(DelaywheelError):
    """A message or body over the server's limit."""

    code = "too_large"


class Unauthorized(DelaywheelError):
    """The server has a token and this connection has not sent the matching one."""

    code = "unauthorized"


class Unavailable(DelaywheelError):
    """The server's store cannot be reached; nothing was changed (see docs/protocol.md)."""

    code = "unavailable"


class NoMethod(DelaywheelError):
    """The server has no method of that name."""

    code = "no_method"


class Internal(DelaywheelError):
    """A bug in the server; it logged it and keeps serving."""

    code = "internal"


class ConnectionFailed(DelaywheelError):
    """Cannot connect, or the connection was lost; the message names host:port and the cause."""

    code = "connection"
    # True when the request was sent and its reply lost: a write may have been applied.
    maybe_applied: bool = False


class ServerClosed(ConnectionFailed):
    """The server sent ``[2, "error", [code, message]]`` and closed the connection.

    ``code`` and ``message`` are the server's (``too_large`` for a message over
    ``--max-message``, ``unavailable`` for too many connections, ...).
    """


_BY_CODE: dict[str, type[DelaywheelError]] = {
    cls.code: cls
    for cls in (
        BadRequest,
        NotFound,
        Exists,
        Conflict,
        TooLarge,
        Unauthorized,
        Unavailable,
        NoMethod,
        Internal,
    )
}


def error_from(code: str, message: str) -> DelaywheelError:
    """The exception for a server error ``[code, message]``; unknown codes give the base."""
    cls = _BY_CODE.get(code)
    if cls is None:
        return DelaywheelError(message, code)
    return cls(message)


def error_from_reply(error: Any) -> DelaywheelError:
    """``error_from`` for an ``error`` as decoded off the wire, whatever its shape."""
    if type(error) is list and len(error) == 2:
        code, message = error
        if type(code) is str:
            return error_from(code, message if type(message) is str else repr(message))
    return DelaywheelError(f"malformed error from the server: {error!r}", "internal")


__all__ = [
    "BadRequest",
    "Conflict",
    "ConnectionFailed",
    "DelaywheelError",
    "Exists",
    "Internal",
    "NoMethod",
    "NotFound",
    "ServerClosed",
    "TooLarge",
    "Unauthorized",
    "Unavailable",
    "error_from",
    "error_from_reply",
]
