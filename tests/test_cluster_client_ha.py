"""ClusterClient and AsyncClusterClient against real nodes sharing one Redis keyspace:
``moved`` followed (and ``add_many`` grouped again), ``unavailable`` resent, an ``exists``
that answers a resend taken as the first send having landed, a node that closes the
connection, the map as a snapshot, and a Worker draining two nodes.

The nodes are real ``delaywheel serve`` processes on a private redis-server (a database of
the session's, or one of the test's own where the test freezes Redis). The unit tests of
the retry policy (``routing.Retry``) sit at the end: the decisions, without I/O.
"""

from __future__ import annotations

import asyncio
import re
import signal
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import clusternodes
import pytest
from clusternodes import two_nodes as two_nodes
from conftest import RedisServer
from delaywheel_client import (
    AsyncClusterClient,
    Client,
    ClusterClient,
    ConnectionFailed,
    DelaywheelError,
    Exists,
    Moved,
    ServerClosed,
    TooLarge,
    TryAgain,
    Unavailable,
    Worker,
)
from delaywheel_client.retry import (
    CONFIRM,
    MAX_UNKNOWN_RESENDS,
    RAISE,
    RESEND,
    BatchPlan,
    Retry,
    confirmed_adds,
    needs_resend,
)
from delaywheel_client.routing import MAP_MAX_AGE_S, PartitionMap, partition_of
from prometheus_client.parser import text_string_to_metric_families
from serverproc import ServerProcess
from waiting import wait_until

PARTITIONS = clusternodes.PARTITIONS
_node, _address = clusternodes.node, clusternodes.address


def _owners(nodes: list[ServerProcess]) -> dict[str, ServerProcess]:
    return {_address(node): node for node in nodes}


def _stale_map(address: str) -> PartitionMap:
    """A map that says ``address`` owns every partition: half of it is wrong."""
    return PartitionMap(PARTITIONS, [address] * PARTITIONS, {"partitions": PARTITIONS})


def _stored_at_owner(nodes: list[ServerProcess], task_id: str) -> str:
    """The address of the one node that holds ``task_id`` (the others answer moved)."""
    holders = []
    for node in nodes:
        with Client(*node.address) as dw:
            try:
                if dw.get(task_id) is not None:
                    holders.append(_address(node))
            except (Moved, TryAgain):
                pass
    assert len(holders) == 1, (task_id, holders)
    return holders[0]


# -- moved, and add_many grouped again -----------------------------------------------------


@pytest.mark.redis
@pytest.mark.process
def test_moved_is_followed_and_add_many_is_grouped_again(
    two_nodes: list[ServerProcess], topic: str
) -> None:
    first = _address(two_nodes[0])
    with ClusterClient([first]) as dw:
        true_map = dw.refresh()
        dw._map = _stale_map(first)
        given = [{"topic": topic, "body": n, "delay": 60} for n in range(40)]
        results = dw.add_many(given)
        # Every task at its true owner, results in the caller's order.
        assert len({r["id"] for r in results}) == 40
        for n, result in enumerate(results):
            assert _stored_at_owner(two_nodes, result["id"]) == true_map.owner_of(result["id"])
            assert dw.get(result["id"])["body"] == n
        assert {true_map.owner_of(r["id"]) for r in results} == set(_owners(two_nodes))
        # The refreshed map is the true one; one call with a stale map again follows moved.
        assert dw.partition_map().owners == true_map.owners
        dw._map = _stale_map(first)
        foreign = next(r["id"] for r in results if true_map.owner_of(r["id"]) != first)
        assert dw.delete(foreign) is True


@pytest.mark.redis
@pytest.mark.process
def test_async_client_follows_moved_and_groups_add_many_again(
    two_nodes: list[ServerProcess], topic: str
) -> None:
    first = _address(two_nodes[0])

    async def run() -> tuple[PartitionMap, list[dict[str, Any]]]:
        async with AsyncClusterClient([first]) as dw:
            true_map = await dw.refresh()
            dw._map = _stale_map(first)
            results = await dw.add_many([{"topic": topic, "body": n} for n in range(30)])
            assert [(await dw.get(r["id"]))["body"] for r in results] == list(range(30))
            dw._map = _stale_map(first)
            foreign = next(r["id"] for r in results if true_map.owner_of(r["id"]) != first)
            assert await dw.delete(foreign) is True
            return true_map, [r for r in results if r["id"] != foreign]

    true_map, kept = asyncio.run(run())
    for result in kept:
        assert _stored_at_owner(two_nodes, result["id"]) == true_map.owner_of(result["id"])


@pytest.mark.redis
@pytest.mark.process
def test_a_pipeline_resends_what_was_moved(two_nodes: list[ServerProcess], topic: str) -> None:
    first = _address(two_nodes[0])
    with ClusterClient([first]) as dw:
        true_map = dw.refresh()
        dw._map = _stale_map(first)
        with dw.pipeline() as pipe:
            for n in range(20):
                pipe.add(topic, n, delay=60)
        ids = [r["id"] for r in pipe.results]
        assert [dw.get(task_id)["body"] for task_id in ids] == list(range(20))
        assert {true_map.owner_of(task_id) for task_id in ids} == set(_owners(two_nodes))


# -- a Worker on two nodes -----------------------------------------------------------------


@pytest.mark.redis
@pytest.mark.process
def test_a_worker_drains_tasks_from_two_nodes(two_nodes: list[ServerProcess], topic: str) -> None:
    with ClusterClient([_address(node) for node in two_nodes]) as dw:
        ids = {dw.add(topic, n)["id"] for n in range(24)}
        pmap = dw.partition_map()
        assert {pmap.owner_of(task_id) for task_id in ids} == set(_owners(two_nodes))
        seen: list[str] = []
        worker = Worker(dw, reserve_timeout_s=0.2)
        worker.register(topic, lambda task: seen.append(task["id"]))
        assert worker.run(max_tasks=24) == 24
        assert sorted(seen) == sorted(ids)  # each once
        assert all(dw.get(task_id) is None for task_id in ids)  # acked at its owner
        assert dw.reserve(topic, timeout=0.3) is None


# -- unavailable, resent -------------------------------------------------------------------


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of this test alone: the test freezes it, or gives it a replica."""
    server = RedisServer(tmp_path / "primary", ["--repl-diskless-sync-delay", "0"])
    server.directory.mkdir()
    server.start()
    yield server
    server.kill()


@pytest.mark.redis
@pytest.mark.process
@pytest.mark.slow
def test_unavailable_is_resent_until_the_replica_confirms(
    private_redis: RedisServer, tmp_path: Path, topic: str
) -> None:
    replica = RedisServer(
        tmp_path / "replica", ["--replicaof", "127.0.0.1", str(private_redis.port)]
    )
    replica.directory.mkdir()
    replica.start()
    node = _node(private_redis.url, "w", "--replicas", "1")
    try:
        with ClusterClient(_address(node)) as dw:
            wait_until(lambda: _acknowledged(dw, topic), 20, "the replica to confirm a write")
            assert replica.proc is not None
            replica.proc.send_signal(signal.SIGSTOP)  # WAIT 1 now times out: unavailable
            answer: list[Any] = []
            adder = threading.Thread(target=lambda: answer.append(_add_or_error(dw, topic)))
            adder.start()
            wait_until(lambda: "0 replica(s) confirmed" in node.log_text(), 20, "an unavailable")
            replica.proc.send_signal(signal.SIGCONT)
            adder.join(30)
            (added,) = answer
            assert isinstance(added, dict), added  # resent, and the resend was confirmed
            assert dw.get(added["id"])["body"] == "through"
        # Once in the store: a second node sees it after the first is gone.
        node.stop()
        with private_redis.client() as direct:
            keys = [key for key in direct.keys("*") if b"tasks" in key]
            assert any(direct.hexists(key, added["id"]) for key in keys)
    finally:
        if replica.proc is not None:
            replica.proc.send_signal(signal.SIGCONT)
        node.stop()
        replica.kill()


def _acknowledged(dw: ClusterClient, topic: str) -> bool:
    try:
        dw.add(topic, "warm-up", delay=600)
    except Unavailable:
        return False
    return True


def _add_or_error(dw: ClusterClient, topic: str) -> dict[str, Any] | DelaywheelError:
    try:
        return dw.add(topic, "through", delay=600)
    except DelaywheelError as exc:
        return exc


@pytest.mark.redis
@pytest.mark.process
@pytest.mark.slow
def test_unavailable_is_resent_a_bounded_number_of_times(
    private_redis: RedisServer, topic: str
) -> None:
    node = _node(private_redis.url, "w", "--replicas", "1")  # no replica: every write fails
    try:
        with ClusterClient(_address(node)) as dw:
            started = time.monotonic()
            with pytest.raises(Unavailable, match="replica"):
                dw.add(topic, "never", delay=600)
            took_s = time.monotonic() - started
        tries = node.log_text().count("0 replica(s) confirmed")
        # The first failure is a warning line; then each try waits out WAIT's 1 s.
        assert tries >= 1
        assert 1.0 * (1 + MAX_UNKNOWN_RESENDS) <= took_s < 30
    finally:
        node.stop()


# -- exists after a resend -------------------------------------------------------------------


@pytest.mark.redis
@pytest.mark.process
@pytest.mark.slow
def test_an_exists_that_answers_a_resent_add_is_the_first_send(
    private_redis: RedisServer, topic: str
) -> None:
    # A 10 s lease (the later --lease wins): Redis frozen for 3 s is no reason to fence.
    node = _node(private_redis.url, "w", "--metrics-port", "0", "--lease", "10")
    try:
        with ClusterClient(_address(node), timeout_s=2.0) as dw:
            dw.refresh()
            # A reply lost: with Redis frozen the add's reply does not come within 2 s, so
            # it is sent again; Redis thawed at 3 s, the first send's write lands, and the
            # resend is answered exists (the server answers it once that write is durable).
            assert private_redis.proc is not None
            private_redis.proc.send_signal(signal.SIGSTOP)
            thaw = threading.Timer(3.0, private_redis.proc.send_signal, (signal.SIGCONT,))
            thaw.start()
            try:
                added = dw.add(topic, {"n": 1}, id="resent-1", delay=600)
            finally:
                thaw.join()
            assert added["id"] == "resent-1" and added["at"] > time.time()
            assert _exists_answered(node) == 1  # the resend's, taken as ours
            assert _durable(private_redis, "resent-1")
            # Another task under that id is not ours: a first send answering exists raises.
            with pytest.raises(Exists):
                dw.add(topic, {"n": 2}, id="resent-1")
            assert dw.get("resent-1")["body"] == {"n": 1}
    finally:
        if private_redis.proc is not None:
            private_redis.proc.send_signal(signal.SIGCONT)
        node.stop()


def _exists_answered(node: ServerProcess) -> float:
    """``add`` requests the node answered ``exists``, by its /metrics."""
    url = next(m.group(1) for line in node.log if (m := re.search(r"metrics on (\S+)", line)))
    with urllib.request.urlopen(url, timeout=10) as reply:
        text = reply.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "delaywheel_request_errors_total"
        and sample.labels == {"method": "add", "code": "exists"}
    )


def _durable(redis_server: RedisServer, task_id: str) -> bool:
    with redis_server.client() as direct:
        return any(direct.hexists(key, task_id) for key in direct.keys("*") if b"tasks" in key)


# -- a node that closes the connection ---------------------------------------------------------


@pytest.mark.process
def test_a_node_refusing_the_connection_is_tried_again() -> None:
    node = ServerProcess("--max-connections", "1")
    try:
        holder = socket.create_connection(node.address)  # takes the only connection
        with ClusterClient(_address(node), failover_timeout_s=20) as dw:
            dw._map = PartitionMap.single(_address(node))  # as fetched before the holder came
            wait_until(lambda: _refused(dw), 10, "the node to refuse a second connection")
            threading.Timer(0.5, holder.close).start()
            started = time.monotonic()
            added = dw.add("closed", "after the refusal")  # ServerClosed unavailable: waited
            assert time.monotonic() - started >= 0.4
            assert dw.get(added["id"])["body"] == "after the refusal"
    finally:
        node.stop()


def _refused(dw: ClusterClient) -> bool:
    try:
        dw.node(next(iter(dw.seeds))).ping()
    except ServerClosed as exc:
        return exc.code == "unavailable"
    return False


@pytest.mark.process
def test_a_node_closing_on_a_message_over_its_limit_raises_at_once() -> None:
    node = ServerProcess("--max-body", "1024", "--max-message", "65536")
    try:
        with ClusterClient(_address(node)) as dw:
            started = time.monotonic()
            with pytest.raises(ServerClosed) as closed:
                dw.add("limits", b"x" * 100_000)
            assert closed.value.code == "too_large"
            assert time.monotonic() - started < dw.failover_timeout_s / 3  # not waited out
            with pytest.raises(TooLarge):
                dw.add("limits", b"x" * 2000)  # an error reply: raised as it is
    finally:
        node.stop()


# -- the map is a snapshot ---------------------------------------------------------------------


@pytest.mark.redis
@pytest.mark.process
def test_threads_share_a_client_while_its_map_is_replaced(
    two_nodes: list[ServerProcess], topic: str
) -> None:
    first = _address(two_nodes[0])
    errors: list[BaseException] = []
    with ClusterClient([first]) as dw:
        ids = [r["id"] for r in dw.add_many([{"topic": topic, "delay": 60} for _ in range(40)])]

        def reader() -> None:
            try:
                for _ in range(3):
                    for task_id in ids:
                        assert dw.get(task_id) is not None
            except BaseException as exc:  # reported by the test's own thread
                errors.append(exc)

        threads = [threading.Thread(target=reader) for _ in range(4)]
        for thread in threads:
            thread.start()
        while any(thread.is_alive() for thread in threads):
            dw._map = _stale_map(first)  # wrong half the time: every reader follows moved
            time.sleep(0.005)
        for thread in threads:
            thread.join()
    assert errors == []


def test_the_map_cannot_be_changed_in_place() -> None:
    pmap = PartitionMap(2, ["a:1", "b:2"], {"partitions": 2})
    assert pmap.owners == ("a:1", "b:2")
    with pytest.raises(AttributeError):
        pmap.owners = ("c:3", "c:3")  # type: ignore[misc]
    assert pmap.followed({"partition": 0, "owner": "c:3"}).owners == ("c:3", "b:2")
    assert pmap.owners == ("a:1", "b:2")


# -- the retry policy, without I/O -------------------------------------------------------------


def _retry(method: str = "add", resent: bool = False) -> Retry:
    return Retry(method, time.monotonic() + 30, resent)


def test_moved_is_followed_until_the_deadline_at_once_three_times_then_backing_off() -> None:
    retry = _retry("get")
    moved = Moved("elsewhere", data={"partition": 1, "owner": "b:2", "epoch": 3})
    now_s = time.monotonic()
    steps = [retry.after(moved, now_s) for _ in range(12)]
    # Never raised for a partition that has an owner while the call has time left.
    assert [s.action for s in steps] == [RESEND] * 12
    assert all(s.hint == {"partition": 1, "owner": "b:2", "epoch": 3} for s in steps)
    assert [s.wait_s for s in steps[:3]] == [0.0, 0.0, 0.0]
    waits = [s.wait_s for s in steps[3:]]
    assert waits == sorted(waits) and 0 < waits[0] <= waits[-1] <= 1.0
    retry.progressed()  # one batch of an add_many got through: at once again
    assert retry.after(moved, now_s).wait_s == 0.0
    # Past its deadline the call raises what the nodes say.
    assert retry.after(moved, retry.deadline_s).action == RAISE


def test_a_moved_follow_never_waits_past_the_deadline() -> None:
    retry = Retry("get", time.monotonic() + 0.01)
    moved = Moved("elsewhere", data={"partition": 1, "owner": "b:2", "epoch": 3})
    for _ in range(3):
        retry.after(moved, time.monotonic())
    assert retry.after(moved, time.monotonic()).wait_s <= 0.01


def test_tryagain_sleeps_the_servers_retry_after_then_resends() -> None:
    retry = _retry("get")
    now_s = time.monotonic()
    step = retry.after(TryAgain("no owner", data={"partition": 2, "retry_after_ms": 250}), now_s)
    assert (step.action, step.wait_s) == (RESEND, 0.25)
    # Without a retry_after_ms: a backoff that doubles, from 50 ms.
    waits = [retry.after(TryAgain("no owner"), now_s).wait_s for _ in range(3)]
    assert waits == [0.1, 0.2, 0.4]


def test_unavailable_is_resent_only_when_resending_is_safe() -> None:
    add = _retry("add")
    actions = [
        add.after(Unavailable("too few replicas"), time.monotonic()).action for _ in range(4)
    ]
    assert actions == [RESEND] * MAX_UNKNOWN_RESENDS + [RAISE]
    assert _retry("ack").after(Unavailable("x"), time.monotonic()).action == RAISE
    assert _retry("get").after(Unavailable("x"), time.monotonic()).action == RESEND
    lost = ConnectionFailed("reply lost")
    lost.maybe_applied = True
    assert _retry("delete").after(lost, time.monotonic()).action == RAISE
    assert _retry("add_many").after(lost, time.monotonic()).action == RESEND
    never_sent = ConnectionFailed("refused")
    assert _retry("delete").after(never_sent, time.monotonic()).action == RESEND


def test_exists_is_confirmed_only_after_a_resend() -> None:
    exists = Exists("taken")
    assert _retry("add").after(exists, time.monotonic()).action == RAISE
    retry = _retry("add")
    assert retry.after(TryAgain("no owner", data={"retry_after_ms": 10}), 0).action == RESEND
    assert retry.after(exists, time.monotonic()).action == CONFIRM
    assert _retry("add", resent=True).after(exists, time.monotonic()).action == CONFIRM
    assert _retry("schedule_add", resent=True).after(exists, time.monotonic()).action == RAISE
    sent = [{"id": "a", "topic": "t", "body": 1}]
    stored = [{"id": "a", "topic": "t", "body": 1, "at": 5.0, "state": "delayed"}]
    assert confirmed_adds(sent, stored, exists) == [{"id": "a", "at": 5.0}]
    for other in ({**stored[0], "body": 2}, {**stored[0], "topic": "u"}, None):
        with pytest.raises(Exists):
            confirmed_adds(sent, [other], exists)


def test_server_closed_is_waited_out_only_when_it_said_unavailable() -> None:
    deadline = time.monotonic() + 30
    refused = ServerClosed("too many connections", "unavailable")
    assert Retry("ack", deadline).after(refused, time.monotonic()).action == RESEND
    too_large = ServerClosed("message over the limit", "too_large")
    assert Retry("add", deadline).after(too_large, time.monotonic()).action == RAISE
    past = Retry("get", time.monotonic() - 1)
    assert past.after(TryAgain("no owner"), time.monotonic()).action == RAISE


def test_a_batch_plan_regroups_what_is_left_by_the_new_map() -> None:
    ids = [f"t{n}" for n in range(12)]
    plan = BatchPlan([{"id": task_id, "topic": "t"} for task_id in ids])
    everything_on_a = PartitionMap(2, ["a:1", "a:1"], {})
    group = plan.next_group(everything_on_a, lambda: "a:1")
    assert group == ("a:1", list(range(12)))
    # a:1 refused the batch (moved): the true map splits it.
    true_map = PartitionMap(2, ["a:1", "b:2"], {})
    first = plan.next_group(true_map, lambda: "a:1")
    assert first is not None
    address, indexes = first
    assert {partition_of(ids[i], 2) for i in indexes} == {0 if address == "a:1" else 1}
    plan.done(indexes, [{"id": ids[i]} for i in indexes])
    second = plan.next_group(true_map, lambda: "a:1")
    assert second is not None and second[0] != address
    plan.done(second[1], [{"id": ids[i]} for i in second[1]])
    assert plan.next_group(true_map, lambda: "a:1") is None
    assert [r["id"] for r in plan.results] == ids  # the caller's order


def test_a_pipeline_resends_unavailable_only_for_safe_methods() -> None:
    from delaywheel_client.protocol import Response

    unavailable = Response(0, ["unavailable", "too few replicas"], None)
    assert needs_resend("add", unavailable) and needs_resend("get", unavailable)
    assert not needs_resend("ack", unavailable)
    assert needs_resend("ack", Response(0, ["moved", "m", {}], None))
    assert not needs_resend("ack", Response(0, None, True))
    assert needs_resend("ack", None)


# -- a node going away ----------------------------------------------------------------------


@pytest.mark.redis
@pytest.mark.process
@pytest.mark.slow
def test_calls_go_on_at_the_new_owner_while_a_node_stops(redis_url: str, topic: str) -> None:
    nodes = [_node(redis_url, "a"), _node(redis_url, "b")]
    try:
        wait_until(lambda: clusternodes.settled(nodes), 20, "two nodes sharing the partitions")
        leaving, staying = nodes
        errors: list[BaseException] = []
        added: list[str] = []
        stop = threading.Event()

        def keep_adding(dw: ClusterClient) -> None:
            n = 0
            while not stop.is_set():
                n += 1
                try:
                    task_id = dw.add(topic, n, id=f"{topic}-{n}", delay=0.2)["id"]
                    added.append(task_id)
                    assert dw.get(task_id)["body"] == n  # read at the owner, as it is now
                except BaseException as exc:  # reported below
                    errors.append(exc)

        with ClusterClient([_address(node) for node in nodes]) as dw:
            adder = threading.Thread(target=keep_adding, args=(dw,))
            adder.start()
            wait_until(lambda: len(added) >= 50, 20, "adds to both nodes")
            assert leaving.stop() == 0  # SIGTERM: it hands its partitions to b
            wait_until(lambda: len(clusternodes.served(staying)) == PARTITIONS, 20, "b owns all")
            count_at_stop = len(added)
            wait_until(lambda: len(added) >= count_at_stop + 50, 20, "adds after the stop")
            stop.set()
            adder.join(30)
            assert errors == []
            # Every task added is there once: the worker drains them all from b.
            seen: list[str] = []
            worker = Worker(dw, reserve_timeout_s=0.2)
            worker.register(topic, lambda task: seen.append(task["id"]))
            assert worker.run(max_tasks=len(added)) == len(added)
            assert sorted(seen) == sorted(added)
            assert dw.reserve(topic, timeout=0.5) is None
    finally:
        for node in nodes:
            node.kill()


def _back_with_a_task(nodes: list[ServerProcess], leaving: ServerProcess, topic: str) -> str:
    """Start ``leaving`` again (on its port: the same address), wait until it
    serves its share, and add a ready task of ``topic`` in one of its
    partitions, directly; the task's id."""
    leaving.start()
    wait_until(lambda: clusternodes.settled(nodes), 20, "b serving its share again")
    on_b = clusternodes.served(leaving)
    task_id = next(
        f"{topic}-{n}" for n in range(1000) if partition_of(f"{topic}-{n}", PARTITIONS) in on_b
    )
    with Client(*leaving.address) as direct:
        direct.add(topic, "on b", id=task_id)
    return task_id


@pytest.mark.redis
@pytest.mark.process
@pytest.mark.slow
def test_a_reserve_finds_the_tasks_of_a_node_that_came_back(redis_url: str, topic: str) -> None:
    """A reserve asks the nodes of its map; a node that stopped and started
    again is in the map once it is fetched again, which a reserve does when
    the map is older than MAP_MAX_AGE_S, though nothing else tells it to
    (a reserve is never answered ``moved``)."""
    nodes = [_node(redis_url, "a"), _node(redis_url, "b")]
    try:
        wait_until(lambda: clusternodes.settled(nodes), 20, "two nodes sharing the partitions")
        staying, leaving = nodes
        with ClusterClient([_address(node) for node in nodes]) as dw:
            assert leaving.stop() == 0  # SIGTERM: it hands its partitions to a
            wait_until(lambda: len(clusternodes.served(staying)) == PARTITIONS, 20, "a owns all")
            assert dw.reserve(topic, 0) is None  # b refuses: the map is fetched, a alone
            assert dw.partition_map().nodes() == [_address(staying)]
            task_id = _back_with_a_task(nodes, leaving, topic)
            started_s = time.monotonic()
            task = dw.reserve(topic, 3 * MAP_MAX_AGE_S)
            assert task is not None and task["id"] == task_id
            assert time.monotonic() - started_s < MAP_MAX_AGE_S + 2
            assert sorted(dw.partition_map().nodes()) == sorted(_address(n) for n in nodes)
    finally:
        for node in nodes:
            node.kill()


@pytest.mark.redis
@pytest.mark.process
@pytest.mark.slow
def test_stats_list_and_ping_visit_a_node_that_came_back(redis_url: str, topic: str) -> None:
    """``stats``, ``list`` and ``ping`` visit the map's nodes, as ``reserve``
    does, the map fetched again first when older than MAP_MAX_AGE_S: a node
    that came back is in their answers within that, unasked."""
    nodes = [_node(redis_url, "a"), _node(redis_url, "b")]
    try:
        wait_until(lambda: clusternodes.settled(nodes), 20, "two nodes sharing the partitions")
        staying, leaving = nodes
        with ClusterClient([_address(node) for node in nodes]) as dw:
            assert leaving.stop() == 0
            wait_until(lambda: len(clusternodes.served(staying)) == PARTITIONS, 20, "a owns all")
            dw.refresh()
            assert list(dw.stats()["nodes"]) == [_address(staying)]
            task_id = _back_with_a_task(nodes, leaving, topic)
            time.sleep(MAP_MAX_AGE_S + 0.5)
            assert sorted(dw.stats()["nodes"]) == sorted(_address(n) for n in nodes)
            assert dw.ping() == "pong"
            listed, cursor = [], None
            while True:
                page = dw.list(topic=topic, cursor=cursor)
                listed += [task["id"] for task in page["tasks"]]
                if (cursor := page["next"]) is None:
                    break
            assert task_id in listed
    finally:
        for node in nodes:
            node.kill()
