"""ClusterClient: the surface (Client's methods), the hash and the map, and routing against
real servers.

Until the servers share a keyspace, the multi-node tests give the client a map by hand over
two real servers with their own memory stores: each server answers whatever it is sent, so
which server holds a task shows where the client routed it.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import threading
import time
import zlib
from collections.abc import Iterator
from typing import Any

import pytest
from delaywheel_client import (
    AsyncClient,
    AsyncClusterClient,
    AsyncClusterPipeline,
    Client,
    ClusterClient,
    ClusterPipeline,
    ConnectionFailed,
    Exists,
    Worker,
)
from delaywheel_client.pipeline import QueuedCalls
from delaywheel_client.routing import PartitionMap, parse_seeds, partition_of, with_id
from serverproc import ServerProcess
from test_method_surface import SURFACE, _parameters, _public

# -- the surface ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", SURFACE)
def test_cluster_client_has_each_client_method(name: str) -> None:
    ours, theirs = getattr(ClusterClient, name), getattr(Client, name)
    assert _parameters(ours) == _parameters(theirs), name
    assert inspect.signature(ours).return_annotation == inspect.signature(theirs).return_annotation
    assert ours.__doc__ == theirs.__doc__, name
    assert getattr(ClusterPipeline, name) is getattr(QueuedCalls, name)


def test_cluster_client_has_clients_other_public_methods() -> None:
    # Not from_url: a cluster is given its seeds. It adds node, refresh and partition_map.
    assert _public(Client) - {"from_url"} <= _public(ClusterClient)
    # cluster too, until Client has it (the server's cluster method lands with issue 16).
    extra = {"node", "refresh", "partition_map"} | ({"cluster"} - _public(Client))
    assert _public(ClusterClient) - _public(Client) == extra
    assert _public(ClusterPipeline) == set(SURFACE) | {"execute"}


# -- the hash and the map ------------------------------------------------------------------


def test_partition_is_crc32_of_the_utf8_id_mod_partitions() -> None:
    for task_id in ("a", "order-42", "é-ü-☃", "x" * 300):
        assert partition_of(task_id, 16) == zlib.crc32(task_id.encode("utf-8")) % 16
    assert partition_of("order-42", 16) == 1475806942 % 16  # a figure other languages can check


def test_client_and_server_agree_on_occurrence_ids() -> None:
    from delaywheel.ha.sharing import Sharing
    from delaywheel.store.redis.layout import partition_of as server_partition_of

    sharing = Sharing(node="n", address="a:1", partitions=16, lease_s=10.0)
    for task_id in ("s:a:b:123", "s:x:", "s:x:12a", "s:daily:1767571200", "s:f:1.5", "plain"):
        assert partition_of(task_id, 16) == server_partition_of(task_id, 16)
        assert partition_of(task_id, 16) == sharing.partition_of(task_id)
    assert partition_of("s:a:b:123", 16) == zlib.crc32(b"a:b") % 16
    assert partition_of("s:x:12a", 16) == zlib.crc32(b"s:x:12a") % 16


def test_seeds_parse_from_a_list_or_a_comma_separated_string() -> None:
    assert parse_seeds("a:1, b:2,") == ["a:1", "b:2"]
    assert parse_seeds(["127.0.0.1:3450"]) == ["127.0.0.1:3450"]
    with pytest.raises(ValueError, match="no seed addresses"):
        parse_seeds(" , ")
    with pytest.raises(ValueError, match="bad port in 'h:port'"):
        parse_seeds("a:1,h:port")


def test_a_failover_is_waited_out_for_30_s_unless_told_otherwise() -> None:
    # No connection is made until a call: port 1 has nothing listening.
    with ClusterClient("127.0.0.1:1") as dw:
        assert dw.failover_timeout_s == 30.0  # README, "The Python client"
    with ClusterClient("127.0.0.1:1", failover_timeout_s=5) as dw:
        assert dw.failover_timeout_s == 5


def test_the_map_from_cluster_and_the_moved_hint() -> None:
    result = {
        "node": "n1",
        "partitions": 3,
        "lease_s": 10.0,
        "owners": [
            {"partition": 0, "node": "n1", "address": "h1:1", "epoch": 4},
            {"partition": 1, "node": None, "address": None, "epoch": 2},
            {"partition": 2, "node": "n2", "address": "h2:2", "epoch": 1},
        ],
    }
    pmap = PartitionMap.from_cluster(result, "h1:1")
    assert pmap.owners == ("h1:1", None, "h2:2") and pmap.nodes() == ["h1:1", "h2:2"]
    followed = pmap.followed({"partition": 1, "owner": "h3:3", "epoch": 3})
    assert followed.owners[1] == "h3:3"
    assert pmap.owners[1] is None  # a snapshot: the hint makes a new map
    assert followed.followed({"partition": 9, "owner": "h4:4"}) is followed  # out of range
    assert followed.nodes() == ["h1:1", "h2:2", "h3:3"]
    answer = pmap.answer()
    answer["owners"][0]["address"] = "changed by the caller"
    assert pmap.answer()["owners"][0]["address"] == "h1:1"
    with pytest.raises(Exception, match="partitions 0"):
        PartitionMap.from_cluster({"partitions": 0}, "h1:1")


def test_add_always_gets_an_id() -> None:
    (task,) = with_id("add", ({"topic": "t"},))
    assert len(task["id"]) == 32 and int(task["id"], 16) >= 0
    (kept,) = with_id("add", ({"topic": "t", "id": "mine"},))
    assert kept["id"] == "mine"
    ((first, second),) = with_id("add_many", ([{"topic": "t"}, {"topic": "t", "id": "b"}],))
    assert len(first["id"]) == 32 and second["id"] == "b"


# -- one real server (without the cluster method: it owns everything) ---------------------


def test_every_method_against_one_server(server: ServerProcess, topic: str) -> None:
    host, port = server.address
    with ClusterClient(f"{host}:{port}") as dw, Client(host, port) as direct:
        assert dw.ping() == "pong"
        added = dw.add(topic, {"n": 1}, delay=100)
        assert len(added["id"]) == 32  # client-made
        assert direct.get(added["id"])["body"] == {"n": 1}
        with pytest.raises(Exists):
            dw.add(topic, {"n": 2}, id=added["id"])  # a first send answered exists: raised
        assert dw.update(added["id"], delay=0)["state"] in ("ready", "delayed")
        many = dw.add_many([{"topic": topic, "body": n} for n in range(3)])
        assert [direct.get(r["id"])["body"] for r in many] == [0, 1, 2]
        assert dw.call("get", many[0]["id"])["body"] == 0
        assert len(dw.call("add", {"topic": topic, "delay": 100})["id"]) == 32
        ids = {r["id"] for r in many} | {added["id"]}
        assert {t["id"] for t in dw.iter_tasks(topic=topic, page_size=2)} > ids
        reserved = dw.reserve(topic, timeout=5)
        assert reserved is not None and reserved["id"] in ids
        assert dw.touch(reserved["id"]) > time.time()
        assert dw.release(reserved["id"]) is True
        again = dw.reserve([topic], 5)
        assert again is not None and dw.ack(again["id"]) is True
        assert dw.kick(topic, 5) == 0
        assert dw.delete(added["id"]) in (True, False)
        stats = dw.stats()
        assert list(stats["nodes"]) == [f"{host}:{port}"] and stats["tasks"] >= 2
        assert dw.cluster()["partitions"] == 1
        with dw.pipeline() as pipe:
            pipe.add(topic, "piped")
            pipe.get(many[1]["id"])
        assert len(pipe.results[0]["id"]) == 32 and pipe.results[1]["body"] == 1


# -- two real servers, a map given by hand -------------------------------------------------


@pytest.fixture(scope="module")
def pair_server() -> Iterator[list[ServerProcess]]:
    procs = [ServerProcess(), ServerProcess()]
    yield procs
    for proc in procs:
        proc.stop()


def _addresses(procs: list[ServerProcess]) -> list[str]:
    return [f"{proc.address[0]}:{proc.address[1]}" for proc in procs]


def _give_map(dw: ClusterClient | AsyncClusterClient, addresses: list[str]) -> None:
    """Two partitions, one on each server (servers of no cluster), kept: a map given by
    hand is never fetched again for its age (``MAP_MAX_AGE_S``, which a reserve checks)."""
    dw._map = PartitionMap(2, list(addresses), {"partitions": 2})
    dw._map_s = math.inf


def _two_node_client(procs: list[ServerProcess], **kw: Any) -> ClusterClient:
    addresses = _addresses(procs)
    dw = ClusterClient(addresses, **kw)
    _give_map(dw, addresses)
    return dw


def test_calls_go_to_the_ids_owner(pair_server: list[ServerProcess], topic: str) -> None:
    addresses = _addresses(pair_server)
    directs = [Client(*proc.address) for proc in pair_server]
    with _two_node_client(pair_server) as dw:
        ids = [dw.add(topic, n, delay=60)["id"] for n in range(40)]
        for task_id in ids:
            owner = partition_of(task_id, 2)
            assert directs[owner].get(task_id) is not None
            assert directs[1 - owner].get(task_id) is None
            assert dw.get(task_id) is not None
        assert sorted(dw.stats()["nodes"]) == sorted(addresses)
        assert {t["id"] for t in dw.iter_tasks(topic=topic, page_size=7)} == set(ids)
        with dw.pipeline() as pipe:
            for task_id in ids:
                pipe.delete(task_id)
        assert pipe.results == [True] * len(ids)
        assert all(d.get(task_id) is None for d in directs for task_id in ids)
        # A reserved task's touch, release and ack go to its owner (the other has no such task).
        ready = [
            next(i for i in (f"{topic}-r{n}" for n in range(1000)) if partition_of(i, 2) == p)
            for p in (0, 1)
        ]
        for task_id in ready:
            dw.add(topic, None, id=task_id)
        assert sorted(dw.reserve(topic)["id"] for _ in ready) == sorted(ready)
        released, acked = ready
        assert dw.touch(released) > time.time() and dw.touch(acked) > time.time()
        assert dw.release(released, delay=60) is True
        assert directs[partition_of(released, 2)].get(released)["state"] == "delayed"
        assert dw.ack(acked) is True
        assert directs[partition_of(acked, 2)].get(acked) is None
        assert dw.delete(released) is True
    for d in directs:
        d.close()


def _schedule_calls(prefix: str, topic: str) -> list[tuple[str, tuple[Any, ...]]]:
    """Every schedule method once, for six schedules that land on both nodes."""
    sids = [f"{prefix}-{n}" for n in range(6)]
    now = time.time()
    return [
        *[("schedule_add", ({"id": sid, "every": 3600, "topic": topic},)) for sid in sids],
        ("schedule_update", (sids[0], {"every": 60}, 1)),
        ("schedule_pause", (sids[1], "deploy")),
        ("schedule_resume", (sids[1],)),
        ("schedule_get", (sids[2],)),
        ("schedule_next", (sids[0], 2)),
        ("schedule_next", ({"every": 60}, 2)),
        ("schedule_trigger", (sids[3],)),
        ("schedule_backfill", (sids[4], now - 3 * 3600, now)),
        ("schedule_delete", (sids[5],)),
    ]


def _check_schedule_calls(
    pair_server: list[ServerProcess], calls: list[tuple[str, tuple[Any, ...]]], results: list[Any]
) -> None:
    """Each call went to its schedule's owner (partition of the id), and did its work there."""
    sids = [params[0]["id"] for name, params in calls if name == "schedule_add"]
    assert {partition_of(sid, 2) for sid in sids} == {0, 1}
    by_name = dict(zip([name for name, _ in calls[6:]], results[6:], strict=False))
    assert by_name["schedule_update"]["version"] == 2
    assert by_name["schedule_resume"]["paused"] is False
    assert by_name["schedule_get"]["id"] == sids[2]
    assert len(results[-4]["times"]) == len(results[-5]["times"]) == 2
    assert by_name["schedule_delete"] is True
    put = [by_name["schedule_trigger"]["id"], *by_name["schedule_backfill"]["ids"]]
    assert len(put) == 4  # the trigger's and three hours backfilled
    with Client(*pair_server[0].address) as first, Client(*pair_server[1].address) as second:
        directs = [first, second]
        for sid in sids:
            owner = partition_of(sid, 2)
            assert directs[1 - owner].schedule_get(sid) is None
            assert (directs[owner].schedule_get(sid) is None) == (sid == sids[5])
        for task_id in put:
            owner = partition_of(task_id, 2)
            assert (
                directs[owner].get(task_id) is not None and directs[1 - owner].get(task_id) is None
            )


def _sync_schedule_run(
    pair_server: list[ServerProcess], calls: list[tuple[str, tuple[Any, ...]]], topic: str
) -> tuple[list[Any], list[str]]:
    """The calls through ClusterClient, then schedule_list's pages of ``topic``."""
    with _two_node_client(pair_server) as dw:
        results = [getattr(dw, name)(*params) for name, params in calls]
        listed, cursor = [], None
        while True:
            page = dw.schedule_list(topic=topic, limit=2, cursor=cursor)
            listed += [s["id"] for s in page["schedules"]]
            if (cursor := page["next"]) is None:
                return results, listed


async def _async_schedule_run(
    pair_server: list[ServerProcess], calls: list[tuple[str, tuple[Any, ...]]], topic: str
) -> tuple[list[Any], list[str]]:
    """The same through AsyncClusterClient."""
    async with AsyncClusterClient(_addresses(pair_server)) as dw:
        _give_map(dw, _addresses(pair_server))
        results = [await getattr(dw, name)(*params) for name, params in calls]
        listed, cursor = [], None
        while True:
            page = await dw.schedule_list(topic=topic, limit=2, cursor=cursor)
            listed += [s["id"] for s in page["schedules"]]
            if (cursor := page["next"]) is None:
                return results, listed


def test_schedule_calls_go_to_the_schedules_owner(
    pair_server: list[ServerProcess], topic: str
) -> None:
    """ClusterClient and AsyncClusterClient: each schedule method reaches the
    owner of the schedule's id, and schedule_list pages over both nodes."""
    for flavour in ("sync", "async"):
        name = f"{topic}-{flavour}"
        calls = _schedule_calls(name, name)
        if flavour == "sync":
            results, listed = _sync_schedule_run(pair_server, calls, name)
        else:
            results, listed = asyncio.run(_async_schedule_run(pair_server, calls, name))
        _check_schedule_calls(pair_server, calls, results)
        added = [params[0]["id"] for call, params in calls if call == "schedule_add"]
        assert sorted(listed) == sorted(added[:5]), flavour  # the sixth was deleted


def test_reserve_serves_every_node_fairly(pair_server: list[ServerProcess], topic: str) -> None:
    directs = [Client(*proc.address) for proc in pair_server]
    for node, direct in enumerate(directs):
        for n in range(10):
            direct.add(topic, node, id=f"{topic}-{node}-{n}")
    with _two_node_client(pair_server) as dw:
        served = [dw.reserve(topic)["body"] for _ in range(10)]
    # Each call starts one node further on: both nodes serve half, none waits for the other.
    assert sorted(served) == [0] * 5 + [1] * 5
    for d in directs:
        d.close()


def test_a_blocking_reserve_sees_a_task_on_any_node(
    pair_server: list[ServerProcess], topic: str
) -> None:
    with _two_node_client(pair_server, reserve_slice_s=0.2) as dw:
        for node, direct_proc in enumerate(pair_server):
            with Client(*direct_proc.address) as direct:
                timer = threading.Timer(0.5, direct.add, (topic, node))
                timer.start()
                started = time.monotonic()
                task = dw.reserve(topic, timeout=10)
                waited_s = time.monotonic() - started
                timer.join()
            assert task is not None and task["body"] == node
            assert waited_s < 5  # the slice is 0.2 s: generous for a loaded machine
        started = time.monotonic()
        assert dw.reserve(topic, timeout=0.6) is None
        assert 0.5 < time.monotonic() - started < 5


def test_a_worker_on_a_cluster_client(pair_server: list[ServerProcess], topic: str) -> None:
    with _two_node_client(pair_server) as dw:
        ids = {dw.add(topic, n)["id"] for n in range(12)}
        seen: list[str] = []
        worker = Worker(dw, reserve_timeout_s=0.2)
        worker.register(topic, lambda task: seen.append(task["id"]))
        assert worker.run(max_tasks=12) == 12
        assert set(seen) == ids
        assert all(dw.get(task_id) is None for task_id in ids)  # each acked at its owner


@pytest.mark.process
def test_an_unreachable_seed_is_skipped(server: ServerProcess) -> None:
    host, port = server.address
    with ClusterClient(["127.0.0.1:1", f"{host}:{port}"], connect_timeout_s=1) as dw:
        assert dw.cluster()["owners"][0]["address"] == f"{host}:{port}"
    dead = ClusterClient("127.0.0.1:1", retries=0, connect_timeout_s=1)
    with dead, pytest.raises(ConnectionFailed, match="no node answered cluster"):
        dead.ping()


# -- AsyncClusterClient ----------------------------------------------------------------------


@pytest.mark.parametrize("name", SURFACE)
def test_async_cluster_client_has_each_async_client_method(name: str) -> None:
    ours, theirs = getattr(AsyncClusterClient, name), getattr(AsyncClient, name)
    assert inspect.iscoroutinefunction(ours), name
    assert _parameters(ours) == _parameters(theirs), name
    assert inspect.signature(ours).return_annotation == inspect.signature(theirs).return_annotation
    assert ours.__doc__ == theirs.__doc__, name
    assert getattr(AsyncClusterPipeline, name) is getattr(QueuedCalls, name)


def test_async_cluster_client_has_the_cluster_clients_other_methods() -> None:
    assert _public(AsyncClusterClient) == _public(ClusterClient) | {"connect"}
    assert _public(AsyncClusterPipeline) == set(SURFACE) | {"execute"}


def test_async_cluster_client_routes_reserves_and_pipelines(
    pair_server: list[ServerProcess], topic: str
) -> None:
    addresses = _addresses(pair_server)
    directs = [Client(*proc.address) for proc in pair_server]

    async def run() -> None:
        async with AsyncClusterClient(addresses, reserve_slice_s=0.2) as dw:
            assert (await dw.cluster())["partitions"] == 1  # these servers have no cluster
            _give_map(dw, addresses)
            assert await dw.ping() == "pong"
            ids = [(await dw.add(topic, n))["id"] for n in range(20)]
            for task_id in ids:
                assert directs[partition_of(task_id, 2)].get(task_id) is not None
            many = await dw.add_many([{"topic": topic, "body": n} for n in range(20, 30)])
            ids += [r["id"] for r in many]
            assert len({t["id"] async for t in dw.iter_tasks(topic=topic, page_size=6)}) == 30
            assert sorted((await dw.stats())["nodes"]) == sorted(addresses)
            served = [await dw.reserve(topic, timeout=5) for _ in range(30)]
            assert {task["id"] for task in served if task} == set(ids)
            assert await dw.reserve(topic, timeout=0.3) is None
            async with dw.pipeline() as pipe:
                for task_id in ids:
                    pipe.ack(task_id)
            assert pipe.results == [True] * 30
            assert await dw.get(ids[0]) is None

    asyncio.run(run())
    for d in directs:
        d.close()
