"""Which operation a request is for: its method and path against the table.

Each ``Operation`` path (operations.py) under ``/v1`` is a list of segments, literal
or a param (``{id}``, ``{topic}``): a param is one whole segment, not empty. A request's
path is split at its slashes and then each segment percent-decoded, so a slash in an id
arrives as ``%2F`` and stays in it. Operations are tried in the table's order, the first
whose path and method fit wins; a path that fits with another method only is 405, one
that fits nothing 404.
"""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import unquote

from delaywheel.httpapi.operation import Operation

PREFIX = "/v1"
DOCUMENT_PATH = PREFIX + "/openapi.json"

# A segment spec: the literal text, or the param's name with this in front.
_PARAM = "{"


def _segments(path: str) -> list[str]:
    return [
        _PARAM + part[1:-1] if part.startswith("{") and part.endswith("}") else part
        for part in (PREFIX + path).split("/")
    ]


def _fits(spec: list[str], parts: list[str]) -> dict[str, str] | None:
    if len(spec) != len(parts):
        return None
    params = {}
    for want, got in zip(spec, parts, strict=True):
        if want.startswith(_PARAM):
            if not got:
                return None
            params[want[1:]] = got
        elif want != got:
            return None
    return params


class Router:
    def __init__(self, operations: Sequence[Operation]) -> None:
        self._routes = [(op, _segments(op.path)) for op in operations]

    def match(self, method: str, path: str) -> tuple[Operation, dict[str, str]] | int:
        """The operation for ``method`` on ``path`` (as sent) and its path params,
        decoded; or 405 (the path is another method's) or 404."""
        parts = [unquote(part) for part in path.split("/")]
        status = 404
        for op, spec in self._routes:
            params = _fits(spec, parts)
            if params is None:
                continue
            if op.http != method:
                status = 405
                continue
            return op, params
        return status
