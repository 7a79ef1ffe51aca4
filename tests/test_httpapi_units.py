"""The HTTP API's pieces without a server: the table against the protocol's methods, the
document made from it, bodies in and out of JSON, the settings' checks."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from delaywheel_client.methods import METHODS

from delaywheel.config import ConfigError, Settings
from delaywheel.engine import validate
from delaywheel.errors import RequestError
from delaywheel.httpapi import schemas
from delaywheel.httpapi.openapi import document, error_statuses
from delaywheel.httpapi.operation import Inputs
from delaywheel.httpapi.operations import NOT_OPERATIONS, OPERATIONS
from delaywheel.httpapi.problems import STATUS_OF_CODE, status_of
from delaywheel.httpapi.values import (
    BadInput,
    body_in,
    body_out,
    cursor_in,
    cursor_out,
    query_number,
)


def test_every_protocol_method_has_an_operation() -> None:
    served = {op.method for op in OPERATIONS} | {m for op in OPERATIONS for m in op.also}
    assert served | NOT_OPERATIONS == set(METHODS)


def test_the_contract_paths() -> None:
    routes = {(op.http, "/v1" + op.path) for op in OPERATIONS}
    for route in [
        ("POST", "/v1/tasks"),
        ("GET", "/v1/tasks"),
        ("GET", "/v1/tasks/{id}"),
        ("PATCH", "/v1/tasks/{id}"),
        ("DELETE", "/v1/tasks/{id}"),
        *(("POST", f"/v1/tasks/{{id}}/{verb}") for verb in ("ack", "release", "touch", "kick")),
        ("POST", "/v1/topics/{topic}/reserve"),
        ("POST", "/v1/topics/{topic}/kick"),
        ("POST", "/v1/schedules"),
        ("GET", "/v1/schedules"),
        ("GET", "/v1/schedules/{id}"),
        *(
            ("POST", f"/v1/schedules/{{id}}/{verb}")
            for verb in ("pause", "resume", "trigger", "backfill")
        ),
        ("GET", "/v1/stats"),
        ("GET", "/v1/cluster"),
    ]:
        assert route in routes, route


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [node["$ref"]] if "$ref" in node else []
        return found + [r for value in node.values() for r in _refs(value)]
    if isinstance(node, list):
        return [r for value in node for r in _refs(value)]
    return []


def test_the_document_is_made_from_the_table() -> None:
    doc = document()
    assert doc["openapi"] == "3.1.0"
    json.dumps(doc)  # all of it is JSON
    ops = [op for path in doc["paths"].values() for op in path.values()]
    assert len(ops) == len(OPERATIONS)
    assert len({op["operationId"] for op in ops}) == len(ops)
    for path, item in doc["paths"].items():
        for op in item.values():
            declared = {p["name"] for p in op.get("parameters", []) if p["in"] == "path"}
            assert declared == set(re.findall(r"{(\w+)}", path)), path
            assert op["summary"] and any(s.startswith("2") for s in op["responses"])
            for status, response in op["responses"].items():
                if int(status) >= 400:
                    content = response["content"]["application/problem+json"]
                    assert content["schema"] == schemas.ref("Problem")
    for ref in _refs(doc):
        assert ref.removeprefix("#/components/schemas/") in doc["components"]["schemas"]


def test_the_schemas_hold_the_engines_fields() -> None:
    assert set(schemas.NEW_TASK["properties"]) == validate.TASK_FIELDS | {"body_encoding"}
    assert set(schemas.CHANGES["properties"]) == validate.UPDATE_FIELDS | {"body_encoding"}


def test_error_statuses_follow_from_the_operation() -> None:
    by_id = {op.op_id: op for op in OPERATIONS}
    assert 404 in error_statuses(by_id["getTask"])
    assert {409, 413} <= set(error_statuses(by_id["addTask"]))
    assert 409 not in error_statuses(by_id["stats"])
    assert 503 in error_statuses(by_id["stats"])


def test_each_code_has_its_status() -> None:
    expected = {"not_found": 404, "exists": 409, "conflict": 409, "bad_request": 422}
    expected |= {"unauthorized": 401, "unavailable": 503, "too_large": 413}
    for code, status in expected.items():
        assert STATUS_OF_CODE[code] == status
        assert status_of(RequestError(code, "x")) == status
    assert status_of(BadInput("not JSON")) == 400
    assert "moved" not in STATUS_OF_CODE and "tryagain" not in STATUS_OF_CODE


@pytest.mark.parametrize(
    ("body", "encoding"),
    [
        (b"\x00raw", "base64"),
        ("str", None),
        (7, None),
        (None, None),
        ([1, {"a": None}], None),
        ({1: 2}, "msgpack"),
        ({"k": b"x"}, "msgpack"),
        (float("inf"), "msgpack"),
        (2**64, "msgpack"),
        (
            [
                [
                    [
                        [
                            [
                                [
                                    [
                                        [
                                            [
                                                [
                                                    [
                                                        [
                                                            [
                                                                [
                                                                    [
                                                                        [
                                                                            [
                                                                                [
                                                                                    [
                                                                                        [
                                                                                            [
                                                                                                [
                                                                                                    [
                                                                                                        [
                                                                                                            [
                                                                                                                [
                                                                                                                    [
                                                                                                                        [
                                                                                                                            [
                                                                                                                                [
                                                                                                                                    [
                                                                                                                                        [
                                                                                                                                            [
                                                                                                                                                [
                                                                                                                                                    [
                                                                                                                                                        [
                                                                                                                                                            [
                                                                                                                                                                [
                                                                                                                                                                    [
                                                                                                                                                                        [
                                                                                                                                                                            [
                                                                                                                                                                                [
                                                                                                                                                                                    [
                                                                                                                                                                                        [
                                                                                                                                                                                            [
                                                                                                                                                                                                [
                                                                                                                                                                                                    [
                                                                                                                                                                                                        [
                                                                                                                                                                                                            [
                                                                                                                                                                                                                [
                                                                                                                                                                                                                    [
                                                                                                                                                                                                                        [
                                                                                                                                                                                                                            [
                                                                                                                                                                                                                                [
                                                                                                                                                                                                                                    [
                                                                                                                                                                                                                                        [
                                                                                                                                                                                                                                            [
                                                                                                                                                                                                                                                [
                                                                                                                                                                                                                                                    [
                                                                                                                                                                                                                                                        [
                                                                                                                                                                                                                                                            [
                                                                                                                                                                                                                                                                [
                                                                                                                                                                                                                                                                    [
                                                                                                                                                                                                                                                                        [
                                                                                                                                                                                                                                                                            [
                                                                                                                                                                                                                                                                                [
                                                                                                                                                                                                                                                                                    [
                                                                                                                                                                                                                                                                                        1
                                                                                                                                                                                                                                                                                    ]
                                                                                                                                                                                                                                                                                ]
                                                                                                                                                                                                                                                                            ]
                                                                                                                                                                                                                                                                        ]
                                                                                                                                                                                                                                                                    ]
                                                                                                                                                                                                                                                                ]
                                                                                                                                                                                                                                                            ]
                                                                                                                                                                                                                                                        ]
                                                                                                                                                                                                                                                    ]
                                                                                                                                                                                                                                                ]
                                                                                                                                                                                                                                            ]
                                                                                                                                                                                                                                        ]
                                                                                                                                                                                                                                    ]
                                                                                                                                                                                                                                ]
                                                                                                                                                                                                                            ]
                                                                                                                                                                                                                        ]
                                                                                                                                                                                                                    ]
                                                                                                                                                                                                                ]
                                                                                                                                                                                                            ]
                                                                                                                                                                                                        ]
                                                                                                                                                                                                    ]
                                                                                                                                                                                                ]
                                                                                                                                                                                            ]
                                                                                                                                                                                        ]
                                                                                                                                                                                    ]
                                                                                                                                                                                ]
                                                                                                                                                                            ]
                                                                                                                                                                        ]
                                                                                                                                                                    ]
                                                                                                                                                                ]
                                                                                                                                                            ]
                                                                                                                                                        ]
                                                                                                                                                    ]
                                                                                                                                                ]
                                                                                                                                            ]
                                                                                                                                        ]
                                                                                                                                    ]
                                                                                                                                ]
                                                                                                                            ]
                                                                                                                        ]
                                                                                                                    ]
                                                                                                                ]
                                                                                                            ]
                                                                                                        ]
                                                                                                    ]
                                                                                                ]
                                                                                            ]
                                                                                        ]
                                                                                    ]
                                                                                ]
                                                                            ]
                                                                        ]
                                                                    ]
                                                                ]
                                                            ]
                                                        ]
                                                    ]
                                                ]
                                            ]
                                        ]
                                    ]
                                ]
                            ]
                        ]
                    ]
                ]
            ],
            "msgpack",
        ),
    ],
)
def test_a_body_goes_out_and_comes_back(body: Any, encoding: str | None) -> None:
    try:
        shown = body_out({"id": "a", "body": body})
    except Exception:  # 2**64 is no MessagePack int either: the protocol never holds one
        assert body == 2**64
        return
    assert shown.get("body_encoding") == encoding
    json.dumps(shown, allow_nan=False)
    assert body_in(json.loads(json.dumps(shown)))["body"] == body


def test_bad_bodies_name_the_value() -> None:
    with pytest.raises(BadInput, match="zzz"):
        body_in({"body": "zzz", "body_encoding": "zzz"})
    with pytest.raises(BadInput, match="not base64"):
        body_in({"body": "@@", "body_encoding": "base64"})
    with pytest.raises(BadInput, match="MessagePack"):
        body_in({"body": "wQ==", "body_encoding": "msgpack"})  # 0xc1: never used


def test_cursors_are_opaque_and_come_back() -> None:
    for cursor in (12, "sched-7", ["10.0.0.1:3450", 40]):
        text = cursor_out(cursor)
        assert text is not None and re.fullmatch(r"[A-Za-z0-9_-]+", text)
        assert cursor_in(text) == cursor
    assert cursor_out(None) is None
    with pytest.raises(BadInput, match="cursor"):
        cursor_in("%%%")


def test_query_numbers_are_read_as_the_protocol_takes_them() -> None:
    assert query_number("n", "5") == 5 and type(query_number("n", "5")) is int
    assert query_number("n", "0.5") == 0.5
    assert query_number("n", "nan") == "nan"  # left for the protocol's check to name
    assert query_number("n", None) is None


def test_a_build_leaves_the_checks_to_the_protocol() -> None:
    add = next(op for op in OPERATIONS if op.op_id == "addTask")
    method, params = add.build(Inputs({}, {}, {"topic": 5}, {"idempotency-key": "k"}))
    assert (method, params) == ("add", [{"topic": 5, "id": "k"}])
    with pytest.raises(RequestError):
        validate.new_task(params[0], 0.0, validate.Limits())


def test_the_api_beyond_loopback_needs_a_token() -> None:
    with pytest.raises(ConfigError, match=r"--api-host '0\.0\.0\.0'"):
        Settings(api_port=0, api_host="0.0.0.0")
    Settings(api_port=0, api_host="0.0.0.0", token="t")
    Settings(api_port=0, api_host="0.0.0.0", insecure_no_auth=True)
    Settings(api_port=0)  # loopback: no token needed
    Settings(api_port=0, api_host="0.0.0.0", tls_client_ca="ca.pem", tls_cert="c", tls_key="k")
    # On the dashboard's port too: --web-insecure opens the dashboard, not the API.
    with pytest.raises(ConfigError, match="--web-host"):
        Settings(api_port=0, web_port=0, web_host="0.0.0.0", web_insecure=True)
    with pytest.raises(ConfigError, match="api port"):
        Settings(api_port=70000)
    with pytest.raises(ConfigError, match="api max requests"):
        Settings(api_max_requests=0)
