"""Property-based requests to every operation of /v1/openapi.json (schemathesis), against a
real server: no 5xx but a documented 503, and every response as the document says
(its status listed, its content type, its body matching the schema).

Examples per operation are few (``EXAMPLES``, positive and negative ones) so that the
run takes well under a minute; a long poll's generated timeout is cut to ``POLL_S``, or
one example could wait a day.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from apicalls import api_url
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)
from serverproc import ServerProcess

from delaywheel.httpapi.operations import OPERATIONS

pytestmark = [pytest.mark.process, pytest.mark.slow]

TOKEN = "schema-test-token"
EXAMPLES = 40
POLL_S = 0.05
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    # --max-body and --max-message small: generated bodies meet the limits too.
    proc = ServerProcess(
        "--api-port", "0", "--token", TOKEN, "--max-message", "65536", "--max-body", "8192"
    )  # fmt: skip
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def api_schema(server: ServerProcess) -> Any:
    return schemathesis.openapi.from_url(api_url(server) + "/openapi.json")


def test_the_document_is_valid_openapi(api_schema: Any) -> None:
    """Checked against the OpenAPI 3.1 schema (schemathesis's own check, not skipped)."""
    assert api_schema.raw_schema["openapi"] == "3.1.0"
    api_schema.validate()


# By id, from the server's own table: one test per operation (pytest-9 cannot take
# schemathesis's lazy fixture-made schema, so the operations are named here).
@pytest.mark.parametrize("op_id", [op.op_id for op in OPERATIONS])
def test_every_operation_answers_as_documented(api_schema: Any, op_id: str) -> None:
    operation = api_schema.find_operation_by_id(op_id)
    cases = st.one_of(
        operation.as_strategy(GenerationMode.POSITIVE),
        operation.as_strategy(GenerationMode.NEGATIVE),
    )

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=True,  # the same examples every run: a failure is one to reproduce
        database=None,
    )
    @given(cases)
    def answers(case: Any) -> None:
        if case.path.endswith(("/reserve", "/wait")) and isinstance(case.query, dict):
            timeout = case.query.get("timeout")
            if isinstance(timeout, (int, float)) and timeout > POLL_S:
                case.query["timeout"] = POLL_S
        case.call_and_validate(headers={"Authorization": f"Bearer {TOKEN}"}, checks=CHECKS)

    answers()
