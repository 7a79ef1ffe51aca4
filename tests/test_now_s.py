"""The time is passed in (``now_s``), and only to what uses it.

The engine and the network layer never read a clock for a request: the
connection reads it once per turn and the routes pass it on. A function
that takes a ``now_s`` it never reads makes every caller pass one for
nothing, so none may (an interface's unused one is spelled ``_now_s``).
"""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path
from typing import Any, cast

from delaywheel.config import Settings
from delaywheel.engine.engine import Engine
from delaywheel.net.connection import Connection
from delaywheel.net.server import Server
from delaywheel.store.memory import MemoryStore

ROOT = Path(__file__).resolve().parent.parent / "delaywheel"
T0 = 1_800_000_000.0


def unused_time_params(source: str) -> list[str]:
    """``function(param)`` for each parameter named for a time of now that
    its function never reads."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        args = node.args
        for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
            if not arg.arg.startswith("now"):
                continue
            reads = (n for n in ast.walk(node) if isinstance(n, ast.Name) and n.id == arg.arg)
            if not any(reads):
                found.append(f"{node.name}({arg.arg})")
    return found


def test_no_function_of_the_engine_or_the_network_takes_a_time_it_does_not_use() -> None:
    unused = [
        f"{path.relative_to(ROOT.parent)}: {name}"
        for package in ("engine", "net")
        for path in sorted((ROOT / package).glob("*.py"))
        for name in unused_time_params(path.read_text())
    ]
    assert not unused, "\n".join(unused)


def test_the_check_sees_an_unused_time() -> None:
    source = (
        "def get(self, task_id, now_s):\n    return task_id\n"
        "def add(self, fields, now_s):\n    return now_s\n"
        "def ping(conn, params, _now_s):\n    return 'pong'\n"
    )
    assert unused_time_params(source) == ["get(now_s)"]


def test_routes_pass_the_time_only_to_verbs_that_take_it() -> None:
    """``get`` and ``ack`` take no time (the route would fail calling them
    with one); ``add`` and ``touch`` get the turn's time, as the task shows."""

    async def main() -> None:
        store = MemoryStore("memory://")
        await store.open()
        engine = Engine(store, now_s=T0)
        routes = Server(Settings(store_url="memory://"), engine).routes

        def call(method: str, params: list[Any], now_s: float) -> Any:
            run = routes[method].run
            assert run is not None
            return run(cast(Connection, None), params, now_s)  # verbs never read it

        assert call("add", [{"id": "a", "topic": "t"}], T0 + 1)["at"] == T0 + 1
        assert call("get", ["a"], T0 + 2)["created"] == T0 + 1
        assert engine.try_reserve("t", T0 + 2) is not None
        assert call("touch", ["a"], T0 + 3) == T0 + 3 + 60
        assert call("ack", ["a"], T0 + 4) is True
        assert call("list", [], T0 + 4) == {"tasks": [], "next": None}
        await engine.journal.drain()

    asyncio.run(main())
