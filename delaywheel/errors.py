"""The one error type a request can end in, carrying its protocol error code."""

from __future__ import annotations


class RequestError(Exception):
    """A request the server refuses; ``code`` is a protocol error code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
