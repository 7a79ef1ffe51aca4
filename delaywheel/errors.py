"""The one error type a request can end in, carrying its protocol error code."""

from __future__ import annotations

from typing import Any


class RequestError(Exception):
    """A request the server refuses; ``code`` is a protocol error code.

    ``data``, when given, is sent as the error's third element: what a client
    needs to act on it (``moved``: the partition's owner; ``tryagain``: when).
    """

    def __init__(self, code: str, message: str, data: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data
