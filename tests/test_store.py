"""The store contract (delaywheel/store/base.py), checked on every store, then each store's own.

The conformance tests are written once and run on memory://, sqlite:/// (in
tmp_path) and the Redis store (store/redis/) on plain Redis (a database of
the private redis-server from conftest.py), a Redis Cluster (conftest.py's)
and Sentinel (a primary, two replicas and three Sentinels, redisfarm.py,
one for the module): the store the server runs, with no owner (it writes
every partition itself, store/redis/owner.py). Everything is real: files,
sockets, redis-server processes. Tests are plain functions running their
scenario with asyncio.run().
"""

from __future__ import annotations

import asyncio
import re
import socket
import sqlite3
import time
from collections import Counter
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import pytest
import redis
import redis.asyncio
from conftest import STORE_KINDS as CONFTEST_STORE_KINDS
from conftest import RedisCluster, RedisServer, free_port
from helpers import load_all, run

from delaywheel.store import (
    Store,
    StoreConfigError,
    StoreError,
    StoreUnavailable,
    open_store,
    redact_url,
)
from delaywheel.store.redis import RedisStore
from delaywheel.store.sqlite import SqliteStore

if TYPE_CHECKING:
    pass

T = TypeVar("T")

PASSWORD = "s3cr3t-Pa55"


async def opened(url: str) -> Store:
    store = open_store(url)
    await store.open()
    return store


# ---------------------------------------------------------------------------
# Conformance: every store
# ---------------------------------------------------------------------------

pytest_plugins = ("redisfarm",)


# Every store the conformance tests run on: conftest.py's, and Sentinel
# (conftest.py's `store_url` makes each).
STORE_KINDS = (*CONFTEST_STORE_KINDS, pytest.param("redis-sentinel", marks=pytest.mark.redis))


def test_empty_store_loads_nothing(store_url: str) -> None:
    async def scenario() -> None:
        async with open_store(store_url) as store:
            assert [batch async for batch in store.load()] == []

    run(scenario)


def test_puts_load_back_exactly(store_url: str) -> None:
    async def scenario() -> None:
        async with open_store(store_url) as store:
            await store.write({"a": b"1", "b": b"2"})
            await store.write({"c": b"3"})
            assert await load_all(store) == {"a": b"1", "b": b"2", "c": b"3"}

    run(scenario)


def test_put_overwrites(store_url: str) -> None:
    async def scenario() -> None:
        async with open_store(store_url) as store:
            await store.write({"a": b"old", "b": b"2"})
            await store.write({"a": b"new"})
            assert await load_all(store) == {"a": b"new", "b": b"2"}

    run(scenario)


def test_removes_and_removing_an_absent_id(store_url: str) -> None:
    async def scenario() -> None:
        async with open_store(store_url) as store:
            await store.write({"a": b"1", "b": b"2"})
            await store.write({"a": None, "never-stored": None})
            assert await load_all(store) == {"b": b"2"}
            await store.write({"b": None})
            assert await load_all(store) == {}

    run(scenario)


def test_puts_and_removes_in_one_write(store_url: str) -> None:
    async def scenario() -> None:
        async with open_store(store_url) as store:
            await store.write({"a": b"1", "b": b"2", "c": b"3"})
            await store.write({"a": None, "b": b"2'", "d": b"4", "absent": None})
            assert await load_all(store) == {"b": b"2'", "c": b"3", "d": b"4"}

    run(scenario)


def test_empty_write_is_a_no_op(store_url: str) -> None:
    async def scenario() -> None:
        async with open_store(store_url) as store:
            await store.write({"a": b"1"})
            await store.write({})
            assert await load_all(store) == {"a": b"1"}

    run(scenario)


def test_many_records_load_in_bounded_batches(store_url: str) -> None:
    records = {f"task-{i:05d}": i.to_bytes(4, "big") * 30 for i in range(25_000)}

    async def scenario() -> list[int]:
        async with open_store(store_url) as store:
            await store.write(records)
            loaded: dict[str, bytes] = {}
            sizes = []
            async for batch in store.load(batch_size=1000):
                sizes.append(len(batch))
                for task_id, record in batch:
                    assert task_id not in loaded
                    loaded[task_id] = record
            assert loaded == records
            return sizes

    sizes = run(scenario)
    assert len(sizes) >= 25
    assert all(0 < size <= 1000 for size in sizes)


def test_invalid_batch_size(store_url: str) -> None:
    async def scenario() -> None:
        async with open_store(store_url) as store:
            with pytest.raises(ValueError, match="batch_size"):
                await load_all(store, batch_size=0)

    run(scenario)


def test_binary_records_round_trip(store_url: str) -> None:
    records = {
        "every-byte": bytes(range(256)),
        "reversed": bytes(range(255, -1, -1)),
        "empty": b"",
        "nul": b"\x00",
        "high": b"\xff" * 1000,
        "big": bytes(range(256)) * 4096,  # 1 MiB
    }

    async def scenario() -> None:
        async with open_store(store_url) as store:
            await store.write(records)
            assert await load_all(store) == records

    run(scenario)


def test_unicode_and_odd_ids_round_trip(store_url: str) -> None:
    ids = [
        "é",
        "日本語のタスク",
        "🚀-launch",
        "a b",
        "tab\there",
        "new\nline",
        "{braces}",
        "x" * 500,
    ]
    records = {task_id: task_id.encode() for task_id in ids}

    async def scenario() -> None:
        async with open_store(store_url) as store:
            await store.write(records)
            assert await load_all(store) == records
            await store.write({"日本語のタスク": None})
            del records["日本語のタスク"]
            assert await load_all(store) == records

    run(scenario)


def test_concurrent_writes_apply_in_call_order(store_url: str) -> None:
    async def scenario() -> None:
        async with open_store(store_url) as store:
            await asyncio.gather(*(store.write({"a": str(i).encode()}) for i in range(20)))
            await asyncio.gather(store.write({"b": b"x"}), store.write({"b": None}))
            assert await load_all(store) == {"a": b"19"}

    run(scenario)


def test_close_is_idempotent_and_final(store_url: str) -> None:
    async def scenario() -> None:
        store = open_store(store_url)
        await store.close()  # before open: fine too
        store = await opened(store_url)
        await store.write({"a": b"1"})
        await store.close()
        await store.close()
        with pytest.raises(StoreUnavailable, match="closed"):
            await store.write({"b": b"2"})
        with pytest.raises(StoreUnavailable, match="closed"):
            await load_all(store)
        with pytest.raises(StoreError):
            await store.open()

    run(scenario)


def test_writes_called_before_close_complete(store_url: str) -> None:
    async def scenario() -> None:
        store = await opened(store_url)
        pending = [asyncio.ensure_future(store.write({f"t{i}": b"x"})) for i in range(5)]
        await asyncio.sleep(0)  # let each write start (it is "called") before close()
        await store.close()
        await asyncio.gather(*pending)
        store = await opened(store_url)
        try:
            expected = {f"t{i}": b"x" for i in range(5)} if store.persistent else {}
            assert await load_all(store) == expected
        finally:
            await store.close()

    run(scenario)


def test_use_before_open(store_url: str) -> None:
    async def scenario() -> None:
        store = open_store(store_url)
        with pytest.raises(StoreUnavailable, match="not open"):
            await store.write({"a": b"1"})
        await store.open()
        with pytest.raises(StoreError, match="already open"):
            await store.open()
        await store.close()

    run(scenario)


def test_records_survive_close_and_reopen_when_persistent(store_url: str) -> None:
    """The memory store says it is not persistent, and this checks that it is not."""

    async def scenario() -> None:
        async with open_store(store_url) as store:
            await store.write({"a": b"1", "b": b"2"})
            await store.write({"b": None, "c": b"3"})
        async with open_store(store_url) as store:
            expected = {"a": b"1", "c": b"3"} if store.persistent else {}
            assert await load_all(store) == expected

    run(scenario)


def test_url_and_warnings_are_plain_strings(store_url: str) -> None:
    async def scenario() -> None:
        async with open_store(store_url) as store:
            assert store.url == store_url  # no password in these URLs
            assert store.url in repr(store)
            warnings = store.warnings()
            assert isinstance(warnings, list)
            assert all(isinstance(w, str) and w for w in warnings)
            assert bool(warnings) == (not store.persistent)  # only memory:// warns here

    run(scenario)


# ---------------------------------------------------------------------------
# open_store() and URLs
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    ["mysql://user:hunter2@db/x", "redis+cluster://:hunter2@h:1/0", "nonsense", "", "memory:///x"],
)
def test_open_store_rejects_unknown_urls(url: str) -> None:
    with pytest.raises(StoreConfigError) as info:
        open_store(url)
    message = str(info.value)
    assert "hunter2" not in message
    assert redact_url(url) in message


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:pw@h:6379/0", "redis://:***@h:6379/0"),
        ("redis://user:pw@h:6379/0", "redis://user:***@h:6379/0"),
        ("rediss://user:p%40ss@h/2", "rediss://user:***@h/2"),
        ("redis://user@h:6379/0", "redis://user@h:6379/0"),
        ("redis://h:6379/0?password=pw&db=1", "redis://h:6379/0?password=***&db=1"),
        ("sqlite:///x.db", "sqlite:///x.db"),
        ("redis://:pw@h:notaport/0", "redis://:***@h:notaport/0"),
        ("redis://:pw@[::1/0", "redis://***@[::1/0"),  # urlsplit refuses it
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_redis_prefix_must_keep_the_hash_tag_intact() -> None:
    for prefix in ["", "a{b", "a}b"]:
        with pytest.raises(StoreConfigError, match="prefix"):
            open_store("redis://127.0.0.1:1/0", redis_prefix=prefix)


def test_bad_redis_url_is_a_config_error() -> None:
    with pytest.raises(StoreConfigError) as info:
        open_store(f"redis://:{PASSWORD}@127.0.0.1:6379/0?socket_timeout=soon")
    assert PASSWORD not in str(info.value)


# ---------------------------------------------------------------------------
# SQLite
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(("query", "level"), [("", 2), ("?synchronous=normal", 1)])
def test_sqlite_wal_and_synchronous(tmp_path: Path, query: str, level: int) -> None:
    async def scenario() -> None:
        async with open_store(f"sqlite:///{tmp_path}/s.db{query}") as store:
            assert isinstance(store, SqliteStore)
            assert await store.read_pragma("journal_mode") == "wal"
            assert await store.read_pragma("synchronous") == level  # 2 FULL, 1 NORMAL
            warned = any("synchronous=normal" in w for w in store.warnings())
            assert warned == (level == 1)

    run(scenario)


def test_sqlite_relative_and_absolute_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "abs").mkdir()
    relative = open_store("sqlite:///rel.db")
    absolute = open_store(f"sqlite:///{tmp_path}/abs/abs.db")
    assert isinstance(relative, SqliteStore)
    assert isinstance(absolute, SqliteStore)
    assert relative.path == tmp_path / "rel.db"
    assert absolute.path == tmp_path / "abs" / "abs.db"

    async def scenario() -> None:
        for store in (relative, absolute):
            async with store:
                await store.write({"a": b"1"})

    run(scenario)
    assert (tmp_path / "rel.db").is_file()
    assert (tmp_path / "abs" / "abs.db").is_file()
    assert not (tmp_path / "abs.db").exists()


@pytest.mark.parametrize(
    "url",
    [
        "sqlite://",
        "sqlite:///",
        "sqlite://host/x.db",
        "sqlite:///dir/",
        "sqlite:///x.db?synchronous=off",
        "sqlite:///x.db?journal=wal",
    ],
)
def test_sqlite_bad_urls(url: str) -> None:
    with pytest.raises(StoreConfigError, match="sqlite"):
        open_store(url)


def test_sqlite_open_failure_names_the_url(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/no/such/dir/x.db"

    async def scenario() -> None:
        store = open_store(url)
        with pytest.raises(StoreUnavailable, match=url):
            await store.open()
        (tmp_path / "no" / "such" / "dir").mkdir(parents=True)
        await store.open()  # a failed open may be retried
        await store.close()

    run(scenario)


def test_sqlite_write_is_all_or_nothing(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/s.db"

    async def scenario() -> None:
        async with open_store(url) as store:
            await store.write({"keep": b"1", "gone": b"2"})
            # A real failure half way through the transaction: a trigger that
            # refuses one id, installed from a second connection.
            with sqlite3.connect(tmp_path / "s.db") as other:
                other.execute(
                    "CREATE TRIGGER poison BEFORE INSERT ON tasks WHEN NEW.id = 'poison'"
                    " BEGIN SELECT RAISE(ABORT, 'poisoned'); END"
                )
            other.close()
            with pytest.raises(StoreUnavailable, match="poisoned"):
                await store.write({"new": b"3", "gone": None, "poison": b"4", "later": b"5"})
            assert await load_all(store) == {"keep": b"1", "gone": b"2"}
            await store.write({"new": b"3"})  # the store is still usable
            assert await load_all(store) == {"keep": b"1", "gone": b"2", "new": b"3"}

    run(scenario)


# ---------------------------------------------------------------------------
# Redis
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def locked_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A second private server: a password, and CONFIG renamed away as on managed Redis."""
    server = RedisServer(
        tmp_path_factory.mktemp("redis-locked"),
        ["--requirepass", PASSWORD, "--rename-command", "CONFIG", ""],
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_redis_password_never_shown(locked_redis: RedisServer) -> None:
    port = locked_redis.port
    url = f"redis://:{PASSWORD}@127.0.0.1:{port}/0"
    user_url = f"redis://default:{PASSWORD}@127.0.0.1:{port}/0"

    async def scenario() -> None:
        store = open_store(url)
        assert store.url == f"redis://:***@127.0.0.1:{port}/0"
        assert PASSWORD not in repr(store)
        async with store:
            await store.write({"a": b"1"})
            assert await load_all(store) == {"a": b"1"}
            (warning,) = store.warnings()
            assert "could not check" in warning
            assert PASSWORD not in warning
        async with open_store(user_url) as store:
            assert store.url == f"redis://default:***@127.0.0.1:{port}/0"
            assert await load_all(store) == {"a": b"1"}
        wrong = open_store(f"redis://:{PASSWORD}-wrong@127.0.0.1:{port}/0")
        with pytest.raises(StoreUnavailable) as info:
            await wrong.open()
        assert PASSWORD not in str(info.value)
        assert f"redis://:***@127.0.0.1:{port}/0" in str(info.value)
        no_password = open_store(f"redis://127.0.0.1:{port}/0")
        with pytest.raises(StoreUnavailable, match="Redis needs a password and the URL has none"):
            await no_password.open()

    run(scenario)


def test_redis_unreachable_fails_fast_naming_the_url() -> None:
    url = f"redis://:{PASSWORD}@127.0.0.1:{free_port()}/0"  # nobody listens there

    async def scenario() -> None:
        store = open_store(url)
        started = time.monotonic()
        with pytest.raises(StoreUnavailable) as info:
            await store.open()
        assert time.monotonic() - started < 3
        assert store.url in str(info.value)
        assert PASSWORD not in str(info.value)

    run(scenario)


def test_redis_silent_server_times_out() -> None:
    """A peer that accepts connections and never answers: a timeout, not a hang."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)  # the kernel completes handshakes; nobody ever reads
        url = f"redis://127.0.0.1:{listener.getsockname()[1]}/0"

        async def scenario() -> None:
            store = RedisStore(url, connect_timeout_s=0.3, timeout_s=0.3)
            started = time.monotonic()
            with pytest.raises(StoreUnavailable, match="Timeout"):
                await store.open()
            assert time.monotonic() - started < 2.5

        run(scenario)


async def _config_set(redis_url: str, name: str, value: str) -> None:
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        await client.config_set(name, value)
    finally:
        await client.aclose()


@pytest.mark.parametrize("how", ["stop", "kill"])
def test_redis_down_then_back_without_reopening(
    redis_server: RedisServer, redis_url: str, how: str
) -> None:
    async def scenario() -> None:
        if how == "kill":
            # With appendfsync everysec Redis may hold a write back from the AOF
            # for up to 2 s while an fsync is slow (a loaded machine), and answer
            # it anyway: SIGKILL then loses it. "always" writes before answering.
            await _config_set(redis_url, "appendfsync", "always")
        async with open_store(redis_url) as store:
            await store.write({"before": b"1"})
            if how == "stop":
                redis_server.stop()
            else:
                redis_server.kill()
            for _ in range(2):
                started = time.monotonic()
                with pytest.raises(StoreUnavailable) as info:
                    await store.write({"during": b"2"})
                assert time.monotonic() - started < 3
                assert store.url in str(info.value)
            redis_server.start()
            # Back without reopening: the next write connects again. Kept
            # trying for a bounded time: a loaded machine may take a moment
            # to have the restarted server accept.
            deadline = time.monotonic() + 10
            while True:
                await asyncio.sleep(0.05)
                try:
                    await store.write({"after": b"3"})
                    break
                except StoreUnavailable:
                    if time.monotonic() > deadline:
                        raise
            # "before" reached the AOF before Redis answered, so even SIGKILL keeps it.
            assert await load_all(store) == {"before": b"1", "after": b"3"}
        if how == "kill":
            await _config_set(redis_url, "appendfsync", "everysec")

    try:
        run(scenario)
    finally:
        redis_server.start()


@pytest.mark.parametrize("how", ["stop", "kill"])
def test_redis_restart_between_writes_goes_unnoticed(
    redis_server: RedisServer, redis_url: str, how: str
) -> None:
    """The pooled connection died with the old process; the next write reconnects."""

    async def scenario() -> None:
        if how == "kill":
            # With appendfsync everysec Redis may hold a write back from the AOF
            # for up to 2 s while an fsync is slow (a loaded machine), and answer
            # it anyway: SIGKILL then loses it. "always" writes before answering.
            await _config_set(redis_url, "appendfsync", "always")
        async with open_store(redis_url) as store:
            await store.write({"before": b"1"})
            if how == "stop":
                redis_server.stop()
            else:
                redis_server.kill()
            redis_server.start()
            await store.write({"after": b"2"})
            assert await load_all(store) == {"before": b"1", "after": b"2"}

    try:
        run(scenario)
    finally:
        redis_server.start()


def _wait_aof_settled(redis_server: RedisServer) -> None:
    """After turning AOF back on, wait for its rewrite so later restarts keep data."""
    with redis_server.client() as client:
        for _ in range(500):
            info = client.info("persistence")
            if (
                info["aof_enabled"] == 1
                and info["aof_rewrite_in_progress"] == 0
                and info["aof_rewrite_scheduled"] == 0
            ):
                return
            time.sleep(0.01)
    raise AssertionError("AOF rewrite did not finish")


@pytest.mark.parametrize(
    ("setting", "unsafe", "safe", "phrase"),
    [
        ("appendonly", "no", "yes", "lost on a Redis crash"),
        ("maxmemory-policy", "allkeys-lru", "noeviction", "evict"),
        ("appendfsync", "no", "everysec", "power cut"),
    ],
)
def test_redis_warnings(
    redis_server: RedisServer, redis_url: str, setting: str, unsafe: str, safe: str, phrase: str
) -> None:
    async def warnings() -> list[str]:
        async with open_store(redis_url) as store:
            return store.warnings()

    assert run(warnings) == []
    with redis_server.client() as client:
        client.config_set(setting, unsafe)
        try:
            (warning,) = run(warnings)
            assert phrase in warning
        finally:
            client.config_set(setting, safe)
    _wait_aof_settled(redis_server)
    assert run(warnings) == []


def test_redis_keys_all_carry_the_hash_tag(redis_server: RedisServer, redis_url: str) -> None:
    db = int(redis_url.rsplit("/", 1)[1])

    async def scenario() -> None:
        for prefix in ("delaywheel", "tenant-7"):
            store = open_store(redis_url, redis_prefix=prefix)
            async with store:
                await store.write({"a": b"1", "b": b"2"})
                await store.write({"a": None})

    run(scenario)
    with redis_server.client(db) as client:
        keys = sorted(key.decode() for key in client.keys("*"))
    # The keyspace's own keys under {prefix}, each partition's under {prefix:pNNN}.
    tagged = re.compile(r"\{(delaywheel|tenant-7)(:p\d{3})?\}:[a-z]+")
    assert keys and all(tagged.fullmatch(key) for key in keys), keys
    assert "{delaywheel:p000}:epoch" in keys and "{delaywheel}:meta" in keys


@pytest.mark.slow
def test_redis_load_yields_each_task_once_while_the_hash_shrinks(
    redis_server: RedisServer, redis_url: str
) -> None:
    """HSCAN may return a field twice when Redis resizes the hash mid walk;
    ``load()`` must still yield each task once, and every task present
    throughout. A twin hash, put through the same changes and walked with
    plain HSCAN, shows that the scenario does make Redis repeat fields."""
    db = int(redis_url.rsplit("/", 1)[1])
    prefix = "shrink"  # a keyspace of one partition: its one hash is walked
    key, twin = f"{{{prefix}:p000}}:tasks", f"{{{prefix}:p000}}:twin"
    records = {f"id-{i}": b"r" for i in range(20_000)}

    async def walk(client: redis.Redis, stop_after: int) -> int:
        """One load cut short by a shrink; how many fields plain HSCAN repeated."""
        client.delete(key, twin)
        client.hset(key, mapping=records)
        client.hset(twin, mapping=records)
        async with open_store(redis_url, redis_prefix=prefix, partitions=1) as store:
            loading = store.load(100)
            loaded = Counter[str]()
            for _ in range(stop_after):
                loaded.update(i for i, _ in await anext(loading))
            # The store asked for its next batch before handing this one out.
            cursor, scanned = 0, Counter[str]()
            for _ in range(stop_after + 1):
                cursor, fields = client.hscan(twin, cursor, count=100)
                scanned.update(field.decode() for field in fields)
            # Shrink both hashes alike: drop most of what neither walk has seen.
            unseen = [i for i in records if i not in loaded and i not in scanned]
            dropped = unseen[:19_000]
            client.hdel(key, *dropped)
            client.hdel(twin, *dropped)
            # stays: Redis resizes the hash on its next cron run (10 a second), and
            # nothing a client may read says it has
            time.sleep(0.3)
            async for batch in loading:
                loaded.update(i for i, _ in batch)
            while cursor:
                cursor, fields = client.hscan(twin, cursor, count=100)
                scanned.update(field.decode() for field in fields)
        kept = set(records) - set(dropped)
        assert kept <= set(loaded), f"missed {sorted(kept - set(loaded))[:5]}"
        assert max(loaded.values()) == 1, f"yielded twice: {loaded.most_common(3)}"
        return sum(n > 1 for n in scanned.values())

    repeated_by_redis = 0
    with redis_server.client(db) as client:
        for stop_after in range(2, 42, 4):
            repeated_by_redis += run(partial(walk, client, stop_after))
    assert repeated_by_redis, "Redis never repeated a field: the scenario tests nothing"


def test_redis_field_that_is_not_a_task_id_is_named(
    redis_server: RedisServer, redis_url: str
) -> None:
    """Only something other than delaywheel can write a non-UTF-8 field; load()
    refuses the store with an error naming it (the contract's StoreError)."""
    db = int(redis_url.rsplit("/", 1)[1])
    with redis_server.client(db) as client:
        client.hset("{delaywheel:p003}:tasks", mapping={"good": b"r", b"\xff\xfe": b"r"})

    async def scenario() -> None:
        async with open_store(redis_url) as store:
            with pytest.raises(StoreError, match=r"not a UTF-8 task id: b'\\xff\\xfe'"):
                await load_all(store)

    run(scenario)


def test_redis_cluster_warnings_come_from_the_node_holding_the_key(
    redis_cluster: RedisCluster,
) -> None:
    key = "{delaywheel}:meta"  # the keyspace's own key
    url = redis_cluster.far_node_url(key)

    async def warnings() -> list[str]:
        async with open_store(url) as store:
            return store.warnings()

    owner = redis_cluster.owner_of(key)
    with owner.client() as client:
        client.config_set("maxmemory-policy", "allkeys-lru")
        try:
            (warning,) = run(warnings)
        finally:
            client.config_set("maxmemory-policy", "noeviction")
    assert "evict" in warning
    assert run(warnings) == []
