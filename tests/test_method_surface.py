"""One method surface: the table in delaywheel_client/methods.py (built from the
definitions in commands.py) against everything that lists methods.

- The clients: ``Client``, ``AsyncClient`` and their pipelines have one method per
  method of the table (``CLIENT_SPELLINGS`` names the exceptions), with the same
  signatures and docstrings, and each sends the method its name says: the real
  server's request counters (``--metrics-port``) count what arrived
  (tests/test_client_commands.py: each is served from its one definition).
- The server: its routes, its arity messages, its auth check and what it holds
  for the store follow the table (a real server, over real sockets).
- docs/protocol.md: its method table, its read-only list and its open methods.
"""

from __future__ import annotations

import asyncio
import inspect
import re
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from delaywheel_client import AsyncClient, AsyncPipeline, Client, Pipeline
from delaywheel_client.methods import (
    CLIENT_SPELLINGS,
    METHODS,
    OPEN_METHODS,
    READ_ONLY_METHODS,
)
from delaywheel_client.pipeline import QueuedCalls
from prometheus_client.parser import text_string_to_metric_families
from rawpeer import Raw
from serverproc import ServerProcess

from delaywheel.config import Settings
from delaywheel.engine.engine import Engine
from delaywheel.net.server import Server
from delaywheel.store.memory import MemoryStore

DOCS = Path(__file__).resolve().parent.parent / "docs"


def _surface() -> list[str]:
    """The client methods that stand for protocol methods: the table's, under the
    clients' names, and ``call``, which sends any method by name."""
    names = []
    for method in METHODS:
        spelled = CLIENT_SPELLINGS.get(method, method)
        if spelled is not None:
            names.append(spelled)
    return [*names, "call"]


SURFACE = _surface()

CLASSES: list[type[Any]] = [Client, AsyncClient, Pipeline, AsyncPipeline]


def _parameters(function: Callable[..., Any]) -> list[tuple[str, Any, Any, Any]]:
    """Every parameter as (name, kind, default, annotation); annotations are the
    source's strings (the modules use ``from __future__ import annotations``)."""
    return [
        (p.name, p.kind, p.default, p.annotation)
        for p in inspect.signature(function).parameters.values()
    ]


def _public(cls: type[Any]) -> set[str]:
    return {
        name
        for name, value in inspect.getmembers(cls)
        if not name.startswith("_") and callable(value) and not inspect.isclass(value)
    }


# -- the clients ---------------------------------------------------------------------------


def test_every_table_method_has_a_client_method_and_only_auth_is_spelled_otherwise() -> None:
    assert set(CLIENT_SPELLINGS) <= set(METHODS)
    assert dict(CLIENT_SPELLINGS) == {"auth": None}  # sent at connect, when token= is given
    assert "auth" not in SURFACE and "list" in SURFACE
    for cls in CLASSES:
        missing = [name for name in SURFACE if not callable(getattr(cls, name, None))]
        assert not missing, f"{cls.__name__} lacks {missing}"


@pytest.mark.parametrize("name", SURFACE)
def test_client_async_client_and_pipelines_agree_on_a_method(name: str) -> None:
    sync, coroutine = getattr(Client, name), getattr(AsyncClient, name)
    queued = getattr(QueuedCalls, name)
    # The pipelines queue the same calls: both inherit QueuedCalls' methods.
    assert getattr(Pipeline, name) is queued and getattr(AsyncPipeline, name) is queued
    assert inspect.iscoroutinefunction(coroutine)
    assert not inspect.iscoroutinefunction(sync) and not inspect.iscoroutinefunction(queued)
    assert _parameters(sync) == _parameters(coroutine) == _parameters(queued)
    assert inspect.signature(sync).return_annotation == (
        inspect.signature(coroutine).return_annotation
    )
    assert inspect.signature(queued).return_annotation == "None"  # results come from execute
    assert sync.__doc__, f"Client.{name} has no docstring"
    assert sync.__doc__ == coroutine.__doc__ == queued.__doc__


def test_client_and_async_client_have_the_same_other_methods() -> None:
    """Beyond the protocol's methods too: the same names and parameters (AsyncClient
    adds ``connect``, the way to open its connection before the first call)."""
    assert _public(AsyncClient) == _public(Client) | {"connect"}
    for name in _public(Client) - set(SURFACE):
        assert _parameters(getattr(Client, name)) == _parameters(getattr(AsyncClient, name))
    assert _public(QueuedCalls) == set(SURFACE)
    assert _public(Pipeline) == _public(AsyncPipeline) == set(SURFACE) | {"execute"}


def _calls(topic: str) -> list[tuple[str, tuple[Any, ...], dict[str, Any]]]:
    """One call of every client method, in an order where each one succeeds."""
    first, second, third = f"{topic}-a", f"{topic}-b", f"{topic}-c"
    return [
        ("ping", (), {}),
        ("add", (topic, {"n": 1}), {"delay": 100, "id": first, "ttr": 30, "max_attempts": 3}),
        ("add_many", ([{"topic": topic, "id": second}],), {}),
        ("update", (first,), {"delay": 200, "body": "changed"}),
        ("get", (first,), {}),
        ("list", (), {"topic": topic, "limit": 10}),
        ("reserve", (topic,), {"timeout": 0}),
        ("touch", (second,), {}),
        ("release", (second,), {"delay": 0}),
        ("reserve", ([topic], 0), {}),
        ("ack", (second,), {"result": {"ok": 1}}),
        # A task released on its last attempt is dead: kick_task makes it ready.
        ("add", (topic, None), {"id": third, "max_attempts": 1}),
        ("reserve", (topic,), {"timeout": 0}),
        ("release", (third,), {}),
        ("kick_task", (third,), {}),
        ("kick", (topic, 1), {}),
        ("delete", (first,), {}),
        ("stats", (), {}),
        ("wait", (third,), {"timeout": 0}),  # ready: nil at once
        ("schedule_next", ({"every": 60}, 3), {}),
        ("schedule_add", ({"id": first, "every": 3600, "topic": topic},), {}),
        ("schedule_get", (first,), {}),
        ("schedule_update", (first, {"every": 7200}), {"expected_version": 1}),
        ("schedule_pause", (first,), {"note": "maintenance"}),
        ("schedule_resume", (first,), {}),
        ("schedule_list", (), {"topic": topic, "limit": 10}),
        ("schedule_trigger", (first,), {}),
        ("schedule_backfill", (first, 0, 7200), {}),
        ("schedule_delete", (first,), {}),
        ("topic_set", (topic, {"concurrency": 4}), {}),
        ("topic_get", (topic,), {}),
        ("topic_list", (), {"paused": False, "limit": 10}),
        ("cluster", (), {}),
        ("call", ("get", first), {}),
    ]


def _shape(result: Any) -> Any:
    """What a result is, without the ids and times that differ from run to run."""
    if isinstance(result, dict):
        return ("map", sorted(result))
    if isinstance(result, list):
        return ("list", [_shape(item) for item in result])
    if isinstance(result, float):
        return "float"
    return result


def _requests_by_method(proc: ServerProcess) -> tuple[dict[str, float], dict[str, float]]:
    """The server's ``delaywheel_requests_total`` and error replies, by method."""
    url = next(m.group(1) for line in proc.log if (m := re.search(r"metrics on (\S+)", line)))
    with urllib.request.urlopen(url, timeout=10) as reply:
        text = reply.read().decode()
    calls: dict[str, float] = {}
    errors: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "delaywheel_requests_total":
                calls[sample.labels["method"]] = sample.value
            elif sample.name == "delaywheel_request_errors_total":
                key = f"{sample.labels['method']} {sample.labels['code']}"
                errors[key] = sample.value
    return calls, errors


@pytest.fixture(scope="module")
def metrics_server() -> Iterator[ServerProcess]:
    proc = ServerProcess("--metrics-port", "0")
    yield proc
    proc.stop()


def test_each_client_method_sends_its_method_with_params_the_server_takes(
    metrics_server: ServerProcess,
) -> None:
    """The same calls through Client, AsyncClient and both pipelines: every one is
    answered without an error, with results of the same shape, and the server counts
    one request of the method's name for each."""
    assert {name for name, _, _ in _calls("t")} == set(SURFACE)
    address = metrics_server.address
    shapes: dict[str, list[Any]] = {}

    with Client(*address) as dw:
        results = [getattr(dw, name)(*args, **kw) for name, args, kw in _calls("sync")]
        shapes["Client"] = [_shape(result) for result in results]
        with dw.pipeline() as pipe:
            for name, args, kw in _calls("sync-pipe"):
                getattr(pipe, name)(*args, **kw)
        shapes["Pipeline"] = [_shape(result) for result in pipe.results]

    async def run_async() -> None:
        async with await AsyncClient.connect(*address) as dw:
            results = [await getattr(dw, name)(*args, **kw) for name, args, kw in _calls("aio")]
            shapes["AsyncClient"] = [_shape(result) for result in results]
            async with dw.pipeline() as pipe:
                for name, args, kw in _calls("aio-pipe"):
                    getattr(pipe, name)(*args, **kw)
            shapes["AsyncPipeline"] = [_shape(result) for result in pipe.results]

    asyncio.run(run_async())
    # What the calls did: the reserves got the task add_many added, the writes answered
    # true, kick_task revived the task its release killed, the kick found nothing
    # dead, and call("get") came after the delete.
    assert results[0] == "pong" and results[4]["body"] == "changed"
    assert results[6]["id"] == results[9]["id"] == "sync-b"
    assert results[12]["id"] == "sync-c"
    assert results[8] is results[10] is results[13] is results[14] is results[16] is True
    assert results[15] == 0 and results[-1] is None
    for flavour in ("Pipeline", "AsyncClient", "AsyncPipeline"):
        assert shapes[flavour] == shapes["Client"], flavour

    calls, errors = _requests_by_method(metrics_server)
    assert errors == {}
    sent: dict[str, int] = {}
    for name, args, _ in _calls("t"):
        method = args[0] if name == "call" else name
        sent[method] = sent.get(method, 0) + 4  # four flavours
    assert {method: calls.get(method, 0) for method in METHODS} == {
        method: sent.get(method, 0) for method in METHODS
    }
    assert calls["auth"] == 0  # no token: the clients never sent it


# -- the server ----------------------------------------------------------------------------


def test_the_servers_routes_are_the_tables_methods() -> None:
    """What the server holds for the store follows the table: the replies of every
    method that is not read-only wait for its write."""

    async def build() -> Server:
        settings = Settings(port=0, store_url="memory://")
        store = MemoryStore("memory://")
        await store.open()
        engine = Engine(store, now_s=time.time(), tick_s=settings.tick_s, limits=settings.limits)
        try:
            return Server(settings, engine)
        finally:
            await store.close()

    server = asyncio.run(build())
    assert list(server.routes) == list(METHODS)
    for name, route in server.routes.items():
        assert route.name == name
        assert route.mutating is (name not in READ_ONLY_METHODS), name
        # The connection serves the blocking ones.
        assert (route.run is None) is (name in ("reserve", "wait")), name


def _arity_message(method: str) -> str:
    return f"{method} takes [{', '.join(METHODS[method].params)}]"


def test_every_method_checks_its_param_count_as_the_table_says(server: ServerProcess) -> None:
    with Raw(server.address) as raw:
        for method, spec in METHODS.items():
            too_many = [None] * (len(spec.params) + 1)
            expected = f"{_arity_message(method)}, got {len(too_many)} params"
            assert raw.call(method, *too_many) == ("error", "bad_request", expected)
            least = len(spec.params) - spec.optional
            if least:
                too_few = [None] * (least - 1)
                expected = f"{_arity_message(method)}, got {len(too_few)} params"
                assert raw.call(method, *too_few) == ("error", "bad_request", expected)
        # The optional params may be left out: these answer, not bad_request.
        assert set(raw.call("list")) == {"tasks", "next"}
        assert raw.call("reserve", "arity-nothing-ready") is None
        assert raw.call("release", "arity-missing")[:2] == ("error", "not_found")


@pytest.mark.process
def test_only_the_open_methods_answer_before_auth() -> None:
    proc = ServerProcess("--token", "surface-secret")
    try:
        with Raw(proc.address) as raw:
            for method, spec in METHODS.items():
                params = ["wrong-token"] if method == "auth" else [None] * len(spec.params)
                reply = raw.call(method, *params)
                refused = reply == (
                    "error",
                    "unauthorized",
                    f"{method} needs auth first (send auth [token])",
                )
                assert refused is (method not in OPEN_METHODS), (method, reply)
            assert raw.call("auth", "surface-secret") is True
            assert raw.call("get", "nothing") is None
    finally:
        proc.stop()


# -- docs/protocol.md ----------------------------------------------------------------------


def _protocol_text() -> str:
    return " ".join((DOCS / "protocol.md").read_text().split())  # lines joined


def test_the_protocol_pages_method_table_is_the_table() -> None:
    rows = re.findall(r"^\| `(\w+)` \| `\[(.*?)\]` \|", (DOCS / "protocol.md").read_text(), re.M)
    documented = []
    for name, params in rows:
        names = [p for p in params.split(", ") if p]
        optional = sum(p.endswith("?") for p in names)
        assert all(p.endswith("?") for p in names[len(names) - optional :]), name
        documented.append((name, tuple(p.rstrip("?") for p in names), optional))
    assert documented == [(s.name, s.params, s.optional) for s in METHODS.values()]


def test_the_protocol_page_names_the_read_only_and_the_open_methods() -> None:
    text = _protocol_text()
    read_only = re.search(r"The read-only methods [^:]*: ([^.]*)\.", text)
    assert read_only is not None
    assert set(re.findall(r"`(\w+)`", read_only.group(1))) == READ_ONLY_METHODS
    open_methods = re.search(r"Every method but (.*?) fails with `unauthorized`", text)
    assert open_methods is not None
    assert set(re.findall(r"`(\w+)`", open_methods.group(1))) == OPEN_METHODS
    # Durability: the replies that wait for the store are those of the other methods.
    durable = re.search(r"A reply to (.*?) is sent only after the change is in the store", text)
    assert durable is not None
    assert set(re.findall(r"`(\w+)`", durable.group(1))) == set(METHODS) - READ_ONLY_METHODS
    assert "`client/delaywheel_client/methods.py`" in text
    assert "`client/delaywheel_client/commands.py`" in text
