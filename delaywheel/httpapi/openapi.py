"""/v1/openapi.json: the OpenAPI 3.1 document, made from the operations the server routes by.

Nothing here is written beside the table: each path, param, body and result is an
``Operation``'s (operations.py), each schema is schemas.py's (built from the server's
own field sets and limits), each summary the client method's docstring, and the errors
an operation can answer follow from what it is (a body: 400 and 413; a task's id: 404;
a change: 409; every one: 401, 422, 429 and 503).
"""

from __future__ import annotations

from typing import Any

from delaywheel import __version__
from delaywheel.httpapi import schemas
from delaywheel.httpapi.operation import Operation
from delaywheel.httpapi.operations import OPERATIONS
from delaywheel.httpapi.problems import MEDIA_TYPE, TITLES

PREFIX = "/v1"

_ERROR_EXAMPLE = {
    "type": "urn:delaywheel:problem:not_found",
    "title": "Not Found",
    "status": 404,
    "code": "not_found",
    "detail": "no task with id 'k3vq7a2m1a'",
    "instance": "/v1/tasks/k3vq7a2m1a",
}


def error_statuses(op: Operation) -> list[int]:
    """The error statuses ``op`` may answer, as the document lists them."""
    found = {400, 401, 422, 429, 503, *(s for s in op.extra_statuses if s >= 400)}
    if op.body is not None:
        found |= {408, 413}
    if "{id}" in op.path:
        found.add(404)
    if op.mutating and op.http != "GET":
        found.add(409)
    if op.method in ("schedule_next",):  # a saved schedule's id, or a spec
        found.add(404)
    return sorted(found)


def _operation(op: Operation) -> dict[str, Any]:
    out: dict[str, Any] = {
        "operationId": op.op_id,
        "summary": op.summary,
        "description": f"The protocol's `{op.method}`"
        + "".join(f" (or `{m}`)" for m in op.also)
        + " (docs/protocol.md): the same params, checks and errors.",
        "responses": {},
    }
    if op.params:
        out["parameters"] = [
            {
                "name": p.name,
                "in": p.where,
                "required": p.required or p.where == "path",
                "description": p.description,
                "schema": p.schema,
            }
            for p in op.params
        ]
    if op.body is not None:
        out["requestBody"] = {
            "required": op.body_required,
            "content": {"application/json": {"schema": op.body}},
        }
    responses = out["responses"]
    responses[str(op.status)] = {
        "description": "done",
        "content": {"application/json": {"schema": op.response}},
    }
    if 204 in op.extra_statuses:
        responses["204"] = {"description": "no task within the timeout"}
    for status in error_statuses(op):
        entry: dict[str, Any] = {
            "description": TITLES[status],
            "content": {MEDIA_TYPE: {"schema": schemas.ref("Problem"), "example": _ERROR_EXAMPLE}},
        }
        if status in (429, 503):
            entry["headers"] = {
                "Retry-After": {"description": "seconds to wait", "schema": {"type": "string"}}
            }
        responses[str(status)] = entry
    out["security"] = [{"bearer": []}]
    return out


def document(server_url: str | None = None) -> dict[str, Any]:
    """The whole document."""
    paths: dict[str, dict[str, Any]] = {}
    for op in OPERATIONS:
        paths.setdefault(PREFIX + op.path, {})[op.http.lower()] = _operation(op)
    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {
            "title": "delaywheel HTTP API",
            "version": __version__,
            "description": "Every protocol method as a resource (docs/http.md). Bodies that "
            "are bytes travel base64'd with body_encoding; errors are RFC 9457 problems "
            "whose code is the protocol's error code.",
        },
        "paths": paths,
        "components": {
            "schemas": schemas.COMPONENTS,
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "the server's --token (no header when it has none)",
                }
            },
        },
    }
    if server_url is not None:
        doc["servers"] = [{"url": server_url}]
    return doc
