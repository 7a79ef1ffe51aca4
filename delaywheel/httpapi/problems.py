"""Errors as RFC 9457 problem details: the protocol's error code in ``code``, an HTTP status.

``detail`` is the protocol's message, which names the offending value (``checks.show``);
``data``, when the protocol sends one (``conflict``'s ``{"version": v}``), goes along.
``moved`` and ``tryagain`` never reach this: the API forwards those (forward.py), and
what is left when forwarding gives up is ``unavailable``.
"""

from __future__ import annotations

import json
from typing import Any

from delaywheel.errors import RequestError
from delaywheel.httpapi.messages import Reply
from delaywheel.httpapi.values import BadInput

MEDIA_TYPE = "application/problem+json"
TYPE_PREFIX = "urn:delaywheel:problem:"
# Seconds a client is told to wait after a 503 (or a 429): a store that is back, a
# partition handed over, a request slot free again are all a matter of a second or two.
RETRY_AFTER_S = 1

# The protocol's codes and their statuses; bad_request is 422 when the protocol's checks
# refuse a value, 400 when the request could not be read as the protocol's params.
STATUS_OF_CODE: dict[str, int] = {
    "bad_request": 422,
    "not_found": 404,
    "exists": 409,
    "conflict": 409,
    "too_large": 413,
    "unauthorized": 401,
    "unavailable": 503,
    "no_method": 404,
}
TITLES: dict[int, str] = {
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    409: "Conflict",
    413: "Content Too Large",
    422: "Unprocessable Content",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    501: "Not Implemented",
    503: "Service Unavailable",
    505: "HTTP Version Not Supported",
}


def status_of(exc: RequestError) -> int:
    if isinstance(exc, BadInput):
        return 400
    return STATUS_OF_CODE.get(exc.code, 500)


def problem(
    status: int,
    code: str,
    detail: str,
    instance: str,
    data: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
) -> Reply:
    """One problem response; 503 and 429 say when to come back (``Retry-After``)."""
    document: dict[str, Any] = {
        "type": TYPE_PREFIX + code,
        "title": TITLES.get(status, "Error"),
        "status": status,
        "code": code,
        "detail": detail,
        "instance": instance,
    }
    if data:
        document["data"] = data
    all_headers = dict(headers or {})
    if status in (429, 503):
        all_headers.setdefault("Retry-After", str(RETRY_AFTER_S))
    return Reply(status, json.dumps(document).encode(), MEDIA_TYPE, all_headers)


def from_error(exc: RequestError, instance: str) -> Reply:
    return problem(status_of(exc), exc.code, exc.message, instance, exc.data)


# The document's schema (openapi.py), written beside what makes it.
SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "RFC 9457 problem details; `code` is the protocol's error code.",
    "required": ["type", "title", "status", "code", "detail"],
    "properties": {
        "type": {"type": "string"},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "code": {"type": "string", "enum": sorted({*STATUS_OF_CODE, "internal"})},
        "detail": {"type": "string"},
        "instance": {"type": "string"},
        "data": {"type": "object"},
    },
}
