"""The fast loop's machinery, run on tiny generated test files in a pytest of their own.

- tests/services.py: a service that does not answer skips its test with the
  reason, and fails it when DELAYWHEEL_REQUIRE_SERVICES=1 (as .ci/run sets).
- tests/suites.py: a fixture gives its marker (so ``-m`` deselects the test),
  and a test that starts one of our programs without the ``process`` marker
  fails, naming the marker.

The inner pytest loads this suite's conftest.py (``-p conftest``) and
pyproject.toml, so it runs with the very hooks and markers ``make test`` has.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import free_port
from services import REQUIRE_SERVICES

pytestmark = pytest.mark.process

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
INNER_TIMEOUT_S = 120

NOTHING_PORT = free_port()  # nothing listens there
GENERATED = f"""
import os, subprocess, sys
import pytest
import services
from services import need_program

# The brokers, moved: NATS where nothing listens, RabbitMQ to a listener of the outer test.
services.BROKERS["nats"] = ("NATS", {NOTHING_PORT})
services.BROKERS["rabbitmq"] = ("RabbitMQ", int(os.environ["ANSWERING_PORT"]))

@pytest.mark.brokers("nats")
def test_a_broker_that_does_not_answer():
    pass

@pytest.mark.brokers("rabbitmq")
def test_a_broker_that_answers():
    pass

@pytest.mark.brokers
def test_both_brokers():
    pass

def test_a_program_not_installed():
    need_program("no-such-program-dw", "no-such-package")

@pytest.fixture
def redis_url():
    return "redis://nowhere"  # this file's own: no redis-server is started

def test_a_redis_fixture_marks(request, redis_url):
    assert request.node.get_closest_marker("redis") is not None

def test_starts_python_unmarked():
    subprocess.run([sys.executable, "-c", "pass"], check=True)

@pytest.mark.process
def test_starts_python_marked():
    subprocess.run([sys.executable, "-c", "pass"], check=True)

def test_starts_a_tool():
    subprocess.run(["true"], check=True)
"""
NATS_MISSING = f"NATS does not answer on 127.0.0.1:{NOTHING_PORT} (.ci/run starts it)"
PROGRAM_MISSING = "no-such-program-dw is not installed"
Outcomes = dict[str, tuple[str, str]]  # test name -> (passed, skipped, failure or error; message)


def run_inner(tmp_path: Path, *args: str, **env: str) -> Outcomes:
    """Run the generated tests; each test's outcome and message."""
    (tmp_path / "test_generated.py").write_text(GENERATED)
    report = tmp_path / "report.xml"
    environ = {k: v for k, v in os.environ.items() if k != REQUIRE_SERVICES}
    path = os.pathsep.join(p for p in (str(TESTS), environ.get("PYTHONPATH", "")) if p)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider",
         "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path),
         f"--junitxml={report}", *args, str(tmp_path / "test_generated.py")],
        cwd=tmp_path, env={**environ, "PYTHONPATH": path, **env},
        capture_output=True, text=True, timeout=INNER_TIMEOUT_S, check=False,
    )  # fmt: skip
    assert report.exists(), done.stdout + done.stderr
    outcomes: Outcomes = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        name = case.get("name", "")
        found = [(child.tag, child.get("message", "")) for child in case]
        # a teardown error comes after the call's pass; a skip or failure is alone
        outcome = next((f for f in found if f[0] in ("error", "failure", "skipped")), None)
        outcomes[name] = outcome or ("passed", "")
    return outcomes


@pytest.fixture(scope="module")
def answering_port() -> Iterator[str]:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        yield str(listener.getsockname()[1])


@pytest.fixture(scope="module")
def as_here(tmp_path_factory: pytest.TempPathFactory, answering_port: str) -> Outcomes:
    """The generated tests as ``make test`` would run them on a developer's machine."""
    return run_inner(tmp_path_factory.mktemp("here"), ANSWERING_PORT=answering_port)


def test_a_missing_service_skips_with_its_reason(as_here: Outcomes) -> None:
    assert as_here["test_a_broker_that_does_not_answer"] == ("skipped", NATS_MISSING)
    assert as_here["test_both_brokers"] == ("skipped", NATS_MISSING)
    assert as_here["test_a_broker_that_answers"] == ("passed", "")
    kind, message = as_here["test_a_program_not_installed"]
    assert kind == "skipped"
    assert PROGRAM_MISSING in message and "no-such-package" in message


def test_a_missing_service_fails_when_services_are_required(
    tmp_path: Path, answering_port: str
) -> None:
    got = run_inner(tmp_path, ANSWERING_PORT=answering_port, **{REQUIRE_SERVICES: "1"})
    for name, kind, what in [
        ("test_a_broker_that_does_not_answer", "error", NATS_MISSING),  # at setup
        ("test_both_brokers", "error", NATS_MISSING),
        ("test_a_program_not_installed", "failure", PROGRAM_MISSING),  # in the test
    ]:
        assert got[name][0] == kind, (name, got[name])
        assert what in got[name][1] and f"{REQUIRE_SERVICES} is set" in got[name][1]
    assert got["test_a_broker_that_answers"] == ("passed", "")


def test_the_process_check_names_the_marker_to_add(as_here: Outcomes) -> None:
    kind, message = as_here["test_starts_python_unmarked"]
    assert kind == "error", as_here["test_starts_python_unmarked"]
    assert "needs the marker `process`" in message, message
    assert as_here["test_starts_python_marked"] == ("passed", "")
    assert as_here["test_starts_a_tool"] == ("passed", "")  # a tool is not one of our programs


def test_a_fixture_gives_its_marker(as_here: Outcomes, tmp_path: Path, answering_port: str) -> None:
    assert as_here["test_a_redis_fixture_marks"] == ("passed", "")
    kept = run_inner(tmp_path, "-m", "not redis and not process", ANSWERING_PORT=answering_port)
    assert "test_a_redis_fixture_marks" not in kept
    assert "test_starts_python_marked" not in kept
    assert "test_starts_python_unmarked" in kept
