"""Small helpers the tests share, written once here instead of in each test file.

- ``run``: a coroutine scenario on a fresh event loop (``asyncio.run``).
- ``load_all``: every record a store loads, each id once.
- ``cli``, ``cli_json``: the ``delaywheel`` command in-process (click's
  ``CliRunner``) against a server; ``unique``: a name no other test uses.

Ports and the real server are in serverproc.py; waiting for a condition in
waiting.py; the machine's services in services.py; Redis deployments in
conftest.py and redisfarm.py.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from click.testing import CliRunner, Result

from delaywheel.cli import main as delaywheel_command
from delaywheel.store import Store

T = TypeVar("T")


def run(scenario: Callable[[], Awaitable[T]]) -> T:
    """``scenario()`` run to its end on a new event loop; its result."""

    async def main() -> T:
        return await scenario()

    return asyncio.run(main())


async def load_all(store: Store, batch_size: int = 10_000) -> dict[str, bytes]:
    records: dict[str, bytes] = {}
    async for batch in store.load(batch_size):
        for task_id, record in batch:
            assert task_id not in records, f"{task_id!r} loaded twice"
            records[task_id] = record
    return records


def cli(
    address: str, *args: str, input: str | bytes | None = None, env: dict[str, str] | None = None
) -> Result:
    """Run the command in-process with CliRunner, against ``address``."""
    return CliRunner().invoke(
        delaywheel_command, ["--server", address, *args], input=input, env=env
    )


def cli_json(address: str, *args: str, input: str | bytes | None = None) -> Any:
    result = cli(address, "--json", *args, input=input)
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return json.loads(result.stdout)


def unique(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"
