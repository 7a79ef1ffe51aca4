"""The machine's services some tests need: RabbitMQ, NATS and docker-compose.

A test that needs a broker carries the ``brokers`` marker: by hand
(``@pytest.mark.brokers("rabbitmq")``; bare, it means both), or from the
fixtures ``rabbitmq_url`` and ``nats_url`` (tests/suites.py). Before such a
test is set up, ``need_brokers`` checks that each one it names answers. A
program is checked where it is run, with ``need_program``. Either way a
service that is not there skips the test with the reason; with
``DELAYWHEEL_REQUIRE_SERVICES=1``, which .ci/run sets, it fails the test
instead, so CI can never skip one quietly.

Redis is not among them: the tests start private redis-servers of their own
(conftest.py), and redis-server is required, as Python is.
"""

from __future__ import annotations

import os
import shutil
import socket
from collections.abc import Iterable
from typing import NoReturn

import pytest

REQUIRE_SERVICES = "DELAYWHEEL_REQUIRE_SERVICES"
# The brokers a ``brokers`` marker may name: what each is called, and its port.
BROKERS = {"rabbitmq": ("RabbitMQ", 5672), "nats": ("NATS", 4222)}
AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/"
NATS_URL = "nats://127.0.0.1:4222"
ANSWER_TIMEOUT_S = 1.0  # a local port answers in microseconds; this is for a loaded machine


def services_required() -> bool:
    """Whether a missing service fails the test (CI) rather than skipping it."""
    return os.environ.get(REQUIRE_SERVICES, "") not in ("", "0")


def missing(reason: str) -> NoReturn:
    """Skip the test for ``reason``, or fail it when services are required."""
    if services_required():
        pytest.fail(f"{reason}, and {REQUIRE_SERVICES} is set: it must be there", pytrace=False)
    pytest.skip(reason)


def port_answers(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something accepts a TCP connection on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=ANSWER_TIMEOUT_S):
            return True
    except OSError:
        return False


def need_brokers(names: Iterable[str]) -> None:
    """Go on only if every broker named (keys of ``BROKERS``) answers on its port."""
    for name in names:
        what, port = BROKERS[name]
        if not port_answers(port):
            missing(f"{what} does not answer on 127.0.0.1:{port} (.ci/run starts it)")


def need_program(name: str, package: str) -> str:
    """The path of the program ``name``; go on only if it is installed."""
    path = shutil.which(name)
    if path is None:
        missing(f"{name} is not installed (Debian's package {package}; .ci/run installs it)")
    return path


@pytest.fixture(scope="session")
def rabbitmq_url() -> str:
    """The machine's RabbitMQ (guest, default vhost); tests make and remove their own names."""
    need_brokers(["rabbitmq"])
    return AMQP_URL


@pytest.fixture(scope="session")
def nats_url() -> str:
    """The machine's NATS server with JetStream; tests make and remove their own streams."""
    need_brokers(["nats"])
    return NATS_URL
