"""The redis+sentinel:// store (store/redis/sentinel.py): the URL, and the store on a
real primary, two replicas and three Sentinels (tests/redisfarm.py) through a
SIGKILL of the primary; READONLY on the journal link against real servers."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from conftest import RedisServer
from helpers import load_all, run
from waiting import wait_until

from delaywheel.store import StoreConfigError, StoreError, open_store
from delaywheel.store.redis import RedisStore
from delaywheel.store.redis.link import JournalLink, pipeline
from delaywheel.store.redis.sentinel import (
    Answer,
    SentinelTarget,
    SentinelTopology,
    answer_of,
    parse_sentinel_url,
    vouched,
)

if TYPE_CHECKING:
    from redisfarm import SentinelFarm

pytest_plugins = ("redisfarm",)

FAILOVER_BOUND_S = 30.0


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("redis+sentinel://h:26379/mymaster", SentinelTarget([("h", 26379)], "mymaster", 0, None)),
        (
            "redis+sentinel://:s%40cret@a:1,b:2,c:3/m/5",
            SentinelTarget([("a", 1), ("b", 2), ("c", 3)], "m", 5, "s@cret"),
        ),
        ("redis+sentinel://[::1]:26379/m", SentinelTarget([("::1", 26379)], "m", 0, None)),
    ],
)
def test_a_sentinel_url_names_sentinels_master_and_db(url: str, expected: SentinelTarget) -> None:
    assert parse_sentinel_url(url) == expected


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("redis+sentinel://h:26379", "no MASTER name"),
        ("redis+sentinel://h:26379/", "no MASTER name"),
        ("redis+sentinel://h/m", "sentinel 'h' is not host:port"),
        ("redis+sentinel://h:1,:2/m", "sentinel ':2' is not host:port"),
        ("redis+sentinel://h:99999/m", "sentinel 'h:99999' is not host:port"),
        ("redis+sentinel://h:1/m/x", "'x' is not a database number"),
        ("redis+sentinel://h:1/m/1/2", "'1/2' is not a database number"),
        ("redis+sentinel://user:pw@h:1/m", "the password goes as :password@"),
        ("redis+sentinel://h:1/m?db=2", "takes no query"),
    ],
)
def test_a_bad_sentinel_url_is_named(url: str, why: str) -> None:
    with pytest.raises(StoreConfigError, match=why) as caught:
        open_store(url)
    assert "expected redis+sentinel://" in str(caught.value)
    assert "pw" not in str(caught.value)


OLD = ("127.0.0.1", 7001)  # the primary before the failover
PROMOTED = ("127.0.0.1", 7002)


def seen(named: tuple[str, int], flags: str, epoch: int = 0) -> Answer:
    """A Sentinel's answer: its SENTINEL MASTERS entry (for OLD, parsed as
    redis-py parses it) and GET-MASTER-ADDR-BY-NAME's ``named``."""
    given = set(flags.split(","))
    state = {
        "ip": OLD[0],
        "port": OLD[1],
        "flags": flags,
        "is_sdown": "s_down" in given,
        "is_odown": "o_down" in given,
        "config-epoch": epoch,
    }
    return answer_of(state, (named[0].encode(), named[1]))


@pytest.mark.parametrize(
    ("answers", "usable", "vouches"),
    [
        ([seen(OLD, "master")] * 3, True, True),
        # One Sentinel cut off from the primary: its own s_down holds nothing up.
        ([seen(OLD, "s_down,master"), seen(OLD, "master"), seen(OLD, "master")], True, True),
        # A primary frozen, then woken: every Sentinel still flags it down.
        ([seen(OLD, "s_down,o_down,master")] * 2 + [seen(OLD, "s_down,master")], False, False),
        # The leader, before it sees the replica promoted, names the old primary.
        ([seen(OLD, "master,failover_in_progress"), seen(OLD, "master")], True, False),
        # Then it names the promoted replica, its entry still the old one, down.
        ([seen(PROMOTED, "s_down,o_down,master,failover_in_progress", epoch=1)], True, True),
    ],
)
def test_an_answer_vouches_for_a_primary_no_quorum_sees_down_or_fails_over(
    answers: list[Answer], usable: bool, vouches: bool
) -> None:
    assert any(not answer.down for answer in answers) == usable
    assert vouched(answers) == vouches


KEY = "{delaywheel:p000}:tasks"


def sentinel_url(farm: SentinelFarm, db: int) -> str:
    hosts = ",".join(f"{host}:{port}" for host, port in farm.sentinel_addresses)
    return f"redis+sentinel://{hosts}/dwmaster/{db}"


async def write(store: RedisStore, changes: dict[str, bytes | None]) -> StoreError | None:
    done: asyncio.Future[StoreError | None] = asyncio.get_running_loop().create_future()
    store.submit(changes, done.set_result)
    return await done


def test_the_store_follows_sentinel_to_the_new_primary(redis_sentinels: SentinelFarm) -> None:
    farm = redis_sentinels

    async def scenario() -> tuple[dict[str, bytes], float]:
        store = RedisStore(sentinel_url(farm, 3), partitions=1)  # every record in KEY
        assert isinstance(store.topology, SentinelTopology)
        await store.open()
        try:
            assert await write(store, {"a": b"1", "b": b"2"}) is None
            with farm.primary.client(3) as client:
                assert client.hgetall(KEY) == {b"a": b"1", b"b": b"2"}
                assert client.wait(2, 5000) == 2
            farm.primary.kill()
            killed_s = time.monotonic()
            # Writes fail (unavailable) until the Sentinels name a new primary.
            while (error := await write(store, {"c": b"3"})) is not None:
                assert time.monotonic() - killed_s < FAILOVER_BOUND_S, str(error)
                await asyncio.sleep(0.2)
            took_s = time.monotonic() - killed_s
            assert await write(store, {"a": None}) is None
            return await load_all(store), took_s
        finally:
            await store.close()

    loaded, took_s = run(scenario)
    assert loaded == {"b": b"2", "c": b"3"}
    # The first Sentinel, which current_primary asks, may learn of the failover
    # a moment after the one the store heard it from.
    new = wait_until(
        lambda: next((s for s in [farm.current_primary()] if s is not farm.primary), None),
        10,
        "the first Sentinel to name the new primary",
    )
    with new.client(3) as client:
        assert client.hgetall(KEY) == {b"b": b"2", b"c": b"3"}
    print(f"writes resumed {took_s:.1f} s after the primary's SIGKILL")


class TwoNodes:
    """Two private redis-servers, and a resolver that names ``first`` once, then ``second``."""

    def __init__(self, tmp_path: Path, first_args: list[str], second_args: list[str]) -> None:
        (tmp_path / "second").mkdir()
        (tmp_path / "first").mkdir()
        self.second = RedisServer(tmp_path / "second", second_args)
        self.second.start()
        first_args = [str(self.second.port) if a == "SECOND" else a for a in first_args]
        self.first = RedisServer(tmp_path / "first", first_args)
        self.first.start()
        self.answers = [("127.0.0.1", self.first.port), ("127.0.0.1", self.second.port)]
        self.asked: list[tuple[str, int]] = []

    async def resolve(self) -> tuple[str, int]:
        self.asked.append(self.answers[min(len(self.asked), 1)])
        return self.asked[-1]

    async def send(self, link: JournalLink, *values: str) -> list[Exception | None]:
        """HSET k f to each of ``values`` in turn; each flush's error or None."""
        errors = []
        for value in values:
            done: asyncio.Future[Exception | None] = asyncio.get_running_loop().create_future()
            link.send(pipeline([("HSET", "k", "f", value)]), done.set_result)
            errors.append(await done)
        await link.close()
        return errors

    def stop(self) -> None:
        # SIGKILL: a primary stopped with SIGTERM waits up to 10 s for its replicas.
        self.first.kill()
        self.second.kill()


@pytest.mark.redis
def test_readonly_sends_the_flush_to_the_node_looked_up_again(tmp_path: Path) -> None:
    """A link whose node was demoted (READONLY) asks its resolver again, reconnects
    and resends: here the first answer is a replica, the next its primary."""
    nodes = TwoNodes(tmp_path, ["--replicaof", "127.0.0.1", "SECOND"], [])
    try:
        link = JournalLink("unresolved", 0, handshake=[("PING",)], resolve=nodes.resolve)
        assert run(lambda: nodes.send(link, "v")) == [None]
        assert nodes.asked == nodes.answers
        with nodes.second.client() as client:
            assert client.hget("k", "f") == b"v"
    finally:
        nodes.stop()


@pytest.mark.redis
def test_a_refused_handshake_looks_the_primary_up_again(tmp_path: Path) -> None:
    """The first node named refuses the handshake (it is not the one whose
    password we hold); the next write asks again and reaches the right one."""
    nodes = TwoNodes(tmp_path, ["--requirepass", "another"], ["--requirepass", "ours"])
    try:
        link = JournalLink("unresolved", 0, handshake=[("AUTH", "ours")], resolve=nodes.resolve)
        first, second = run(lambda: nodes.send(link, "first", "second"))
        assert first is not None and "refused the handshake" in str(first)
        assert second is None
        assert nodes.asked == nodes.answers
        with nodes.second.client(password="ours") as client:
            assert client.hget("k", "f") == b"second"
    finally:
        nodes.stop()
