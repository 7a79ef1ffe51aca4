"""The server the target tests share (tests/test_client_targets.py, tests/test_cli_targets.py).

One real server per module on a Redis database of its own, which may call
HTTP targets on this machine and has three brokers: ``q`` (RabbitMQ), ``n``
(NATS) and ``r`` (the store's Redis again, under another name). Import the
fixture into a test module by name: ``from targetserver import server``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from serverproc import ServerProcess


@pytest.fixture(scope="module")
def server(module_redis_url: str, rabbitmq_url: str, nats_url: str) -> Iterator[ServerProcess]:
    proc = ServerProcess(
        "--http-allow", "127.0.0.1",
        "--broker", f"q={rabbitmq_url}",
        "--broker", f"n={nats_url}",
        "--broker", f"r={module_redis_url}",  # the store's Redis again, under another name
        store=module_redis_url,
    )  # fmt: skip
    yield proc
    proc.stop()
