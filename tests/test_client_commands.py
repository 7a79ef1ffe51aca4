"""The client's methods are written once (delaywheel_client/commands.py) and every client
serves them: the blocking and cluster clients run the definition itself, the pipelines
too (returning None), and the asyncio clients await it. Routing follows the definitions,
and the types the checker sees are each client's own (tests/test_method_surface.py holds
the definitions to the table, the server and docs/protocol.md).
"""

from __future__ import annotations

import inspect
import textwrap
from pathlib import Path
from typing import Any

import pytest
from delaywheel_client import (
    AsyncClient,
    AsyncClusterClient,
    Client,
    ClusterClient,
)
from delaywheel_client.commands import ROUTES, Commands
from delaywheel_client.methods import METHODS
from delaywheel_client.pipeline import QueuedCalls
from delaywheel_client.routing import route
from test_method_surface import SURFACE

BLOCKING: list[type[Any]] = [Client, ClusterClient, QueuedCalls]
AWAITING: list[type[Any]] = [AsyncClient, AsyncClusterClient]


def test_the_definitions_are_the_surface() -> None:
    defined = {
        name
        for name, value in vars(Commands).items()
        if inspect.isfunction(value) and not name.startswith("_")
    }
    assert defined == set(SURFACE)


@pytest.mark.parametrize("name", SURFACE)
def test_every_client_serves_the_one_definition(name: str) -> None:
    definition = vars(Commands)[name]
    for cls in BLOCKING:
        served = vars(cls)[name]  # its own copy: named after the class
        assert served.__code__ is definition.__code__, cls
        assert served.__qualname__ == f"{cls.__qualname__}.{name}"
    for cls in AWAITING:
        served = vars(cls)[name]
        assert inspect.iscoroutinefunction(served)
        assert served.__globals__["_definition"] is definition  # it awaits the definition
        assert name in inspect.getsource(served)  # the generated source, kept in linecache


def test_routes_follow_the_definitions() -> None:
    assert set(ROUTES) <= set(METHODS)
    assert route("get", ("t-1",)) == "t-1" and route("get", (7,)) is None
    assert route("add", ({"topic": "q", "id": "t-2"},)) == "t-2"
    assert route("add", ({"topic": "q"},)) is None  # the cluster gives it an id first
    assert route("schedule_add", ({"id": "nightly", "every": 60},)) == "nightly"
    assert route("schedule_next", ("nightly", 3)) == "nightly"
    assert route("schedule_next", ({"every": 60},)) is None  # a spec: any node
    for method in ("ping", "stats", "list", "reserve", "kick", "add_many", "cluster"):
        assert method not in ROUTES  # any node, or a plan of its own (plans.py)


TYPED_USE = """\
from typing import Any, Coroutine

from typing_extensions import assert_type

from delaywheel_client import AsyncClient, AsyncClusterClient, Client, ClusterClient


def blocking(dw: Client, cluster: ClusterClient, either: Client | ClusterClient) -> None:
    assert_type(dw.add("q", {"n": 1}, delay=30), dict[str, Any])
    assert_type(dw.delete("t"), bool)
    assert_type(cluster.get("t"), dict[str, Any] | None)
    assert_type(either.touch("t"), float)
    with dw.pipeline() as pipe:
        assert_type(pipe.add("q"), None)
    dw.add("q", delay="soon")  # E: [arg-type]


async def awaiting(dw: AsyncClient, cluster: AsyncClusterClient) -> None:
    assert_type(await dw.add("q", id="t"), dict[str, Any])
    acked = assert_type(dw.ack("t"), Coroutine[Any, Any, bool])  # create_task takes it
    await acked
    assert_type(await cluster.kick("q", 5), int)
    async with dw.pipeline() as pipe:
        assert_type(pipe.release("t", delay=5), None)
    async for task in dw.iter_tasks(topic="q"):
        assert_type(task, dict[str, Any])
"""


@pytest.mark.slow
def test_the_type_checker_sees_each_clients_own_return_types(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    api = pytest.importorskip("mypy.api")
    source = tmp_path / "typed_use.py"
    source.write_text(TYPED_USE)
    root = Path(__file__).resolve().parent.parent
    monkeypatch.setenv("MYPYPATH", str(root / "client"))  # the client from its source
    stdout, stderr, status = api.run(
        [
            "--strict",
            "--no-error-summary",
            "--cache-dir",
            str(root / ".mypy_cache"),
            "--config-file",
            "",
            str(source),
        ]
    )
    errors = [line for line in stdout.splitlines() if ": error:" in line]
    # Exactly the one wrong argument the snippet makes on purpose.
    assert len(errors) == 1, textwrap.indent(stdout + stderr, "  ")
    assert ':15: error: Argument "delay" has incompatible type "str"' in errors[0]
    assert status == 1
