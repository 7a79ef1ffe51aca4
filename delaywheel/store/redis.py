"""redis://[[user]:password@]host:port/db and rediss:// (TLS) -- the default store.

How it works: every record lives in ONE hash, ``{<prefix>}:tasks``, field =
task id (UTF-8), value = the record. A write is one MULTI/EXEC transaction in
one round trip, sent on a connection of its own (``_redis_journal``, not
redis-py: see there for why and for the figures): a single HSET carrying every
put and a single HDEL carrying every remove. Both touch the same key, and
Redis queues-then-runs a transaction, so a write is all or nothing: a command
refused while queueing (out of memory, say) aborts the EXEC, and the only run-
time error HSET or HDEL can meet (the key holding another type) would fail
both. A write with only puts, or only removes, is that one command without
MULTI/EXEC: a single command is atomic in Redis already. ``load()`` walks
the hash with HSCAN COUNT batch_size, so Redis is never blocked for long,
and re-cuts the replies into batches of at most batch_size (HSCAN's COUNT
is a hint), dropping the duplicates HSCAN may return if the hash is
rehashed mid walk (this costs a set of the ids seen while loading).

What "durable" means here: Redis acknowledged the EXEC (or the lone
command). Whether that survives a crash is Redis's configuration, checked
by ``warnings()`` at open:

- AOF on with ``appendfsync always``: nothing acknowledged is lost, even on a
  power cut.
- AOF on with ``appendfsync everysec`` (the usual setting): a crash of Redis
  alone loses nothing; a power cut or OS crash can lose up to about the last
  second of writes.
- AOF off: every write since the last RDB snapshot is lost on a Redis crash.
- An evicting ``maxmemory-policy`` can drop records at any time.
- Replication is asynchronous: a failover to a replica can lose the last
  writes acknowledged by the old primary.

Bounded time: connects and replies time out (``connect_timeout_s``,
``timeout_s``), and writes in flight when the connection drops are sent
again, once, on a new connection (which covers a Redis restart between
writes; replaying a transaction of absolute HSETs and HDELs is harmless). So
a dead or silent Redis gives ``StoreUnavailable`` within about
2 x (connect_timeout_s + timeout_s) at worst, and at once when nothing
listens. The journal connection reconnects by itself on the next write once
Redis is back: the store never needs reopening. After a write that could not reach
Redis, writes back off: until the next attempt is due they fail at once
without touching the network. The wait doubles from ``reconnect_min_s`` to
``reconnect_max_s`` (0.05 s and 2 s by default) while failures go on, and
resets on the first write that gets through. So a restarting Redis is not
met by a connection attempt per flush, and writes resume at most
``reconnect_max_s`` after it is back.
Query parameters of the URL (``?socket_timeout=...``) are passed to redis-py
and take precedence.

Redis Cluster: point the URL at any node; ``redis_client.connect()`` sees
the cluster and uses a cluster client. All keys share one hash tag (see
``__init__``), so each write is still one MULTI/EXEC on one node: the
journal connection goes to the node that owns the tag's slot and follows
``MOVED`` when the slot moves.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any, cast

from redis.asyncio import RedisCluster
from redis.asyncio.connection import parse_url
from redis.backoff import ExponentialBackoff
from redis.exceptions import AuthenticationError, ClusterDownError, RedisClusterException
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from delaywheel.store._redis_journal import Command, JournalLink, Resolve, transaction
from delaywheel.store.base import (
    DEFAULT_BATCH_SIZE,
    Changes,
    Done,
    Store,
    StoreConfigError,
    StoreError,
    StoreUnavailable,
    check_batch_size,
    redact_url,
    scrub,
    unavailable,
    url_secrets,
)
from delaywheel.store.fenced import LOAD_SCRIPT, FencedWriter
from delaywheel.store.fenced_cluster import ClusterFencedWriter
from delaywheel.store.redis_client import (
    CLIENT_ERRORS,
    Client,
    close_quietly,
    connect,
    durability_warnings,
)

DEFAULT_PREFIX = "delaywheel"
DEFAULT_CONNECT_TIMEOUT_S = 5.0
DEFAULT_TIMEOUT_S = 5.0
# Failures that mean Redis (or the cluster's node for our slot) is out of
# reach, as opposed to an answer refusing the command.
_UNREACHABLE = (
    RedisConnectionError,
    RedisTimeoutError,
    ClusterDownError,
    RedisClusterException,
    OSError,  # the journal link's ConnectionError and TimeoutError among them
)
# Backoff between attempts to reach a Redis that was unreachable.
RECONNECT_MIN_S = 0.05
RECONNECT_MAX_S = 2.0


class RedisStore(Store):
    def __init__(
        self,
        url: str,
        *,
        prefix: str = DEFAULT_PREFIX,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        reconnect_min_s: float = RECONNECT_MIN_S,
        reconnect_max_s: float = RECONNECT_MAX_S,
    ) -> None:
        super().__init__(redact_url(url))
        self._secrets = url_secrets(url)
        try:
            parse_url(url)
        except ValueError as exc:
            detail = scrub(str(exc), self._secrets)
            raise StoreConfigError(f"store URL {self.url!r}: {detail}") from None
        if not prefix or "{" in prefix or "}" in prefix:
            raise StoreConfigError(f"redis prefix {prefix!r}: must be non-empty, without braces")
        self._raw_url = url
        self.prefix = prefix
        # The braces make the prefix a Redis Cluster hash tag: the slot of a key
        # is computed from the tag alone, so every key this store adds, now or
        # later (leases, partitions), lands in one slot and one MULTI/EXEC can
        # span them. A prefix with braces of its own would break the tag.
        self.key = f"{{{prefix}}}:tasks"
        self._connect_timeout_s = connect_timeout_s
        self._timeout_s = timeout_s
        self._client: Client | None = None  # redis-py: checks and loading
        self._link: JournalLink | None = None  # writes
        self._warnings: list[str] = []
        # Waits reconnect_min_s * 2 ** (failures in a row), at most reconnect_max_s.
        self._backoff = ExponentialBackoff(cap=reconnect_max_s, base=reconnect_min_s)
        self._failures = 0  # writes in a row that could not reach Redis
        self._retry_at_s = 0.0  # time.monotonic() of the next attempt
        self._last_failure = ""  # what the last of those writes raised

    async def open(self) -> None:
        self._start_open()
        try:
            client = await self._connect_client()
        except AuthenticationError as exc:  # before CLIENT_ERRORS: it is a ConnectionError
            raise StoreUnavailable(self._auth_failure()) from exc
        except CLIENT_ERRORS as exc:
            raise self._open_failure(exc) from exc
        try:
            warnings = await durability_warnings(client, self.key, self._secrets)
        except CLIENT_ERRORS as exc:
            await close_quietly(client)
            raise self._open_failure(exc) from exc
        except BaseException:
            await close_quietly(client)
            raise
        self._client = client
        self._link = self._journal_link(client)
        self._warnings = warnings
        self._state = "open"

    def _open_failure(self, exc: BaseException) -> StoreUnavailable:
        failed = str(unavailable(self.url, "open", exc, self._secrets)).rstrip(".")
        return StoreUnavailable(
            f"{failed}. Is Redis running there? Without Redis, use the embedded store:"
            " --store sqlite:///delaywheel.db"
        )

    def _auth_failure(self) -> str:
        """What Redis's refusal means, by whether the URL has a password (never shown)."""
        if self._secrets:
            return (
                f"store {self.url}: Redis refused the password in the URL (a wrong password,"
                " or a user Redis does not know): it goes in as redis://:PASSWORD@host:port/db,"
                " or redis://USER:PASSWORD@host:port/db for an ACL user"
            )
        return (
            f"store {self.url}: Redis needs a password and the URL has none:"
            " put it in the URL as redis://:PASSWORD@host:port/db"
        )

    async def _connect_client(self) -> Client:
        """redis-py's client for checks and loading (sentinel.py finds the primary)."""
        return await connect(
            self._raw_url, connect_timeout_s=self._connect_timeout_s, timeout_s=self._timeout_s
        )

    def _resolve_primary(self) -> Resolve | None:
        """What the journal link asks for its address before each connect (None: the URL's)."""
        return None

    def fenced_writer(
        self, *, replicas: int = 0, wait_timeout_s: float = 1.0
    ) -> FencedWriter | ClusterFencedWriter:
        """Fenced flushes (store/fenced.py) on a link of their own, beside ``submit()``;
        on a Redis Cluster, one link per primary (store/fenced_cluster.py).

        The keyspace of several nodes writes through it (cluster/keyspace.py).
        The link's reply timeout must outlast WAIT's, so it is at least
        ``wait_timeout_s`` + 1 s.
        """
        self._check_open("fenced writes")
        client = self._client
        assert client is not None
        wait_timeout_ms = max(1, round(wait_timeout_s * 1000))

        def link_to(host: str, port: int) -> JournalLink:
            return self._journal_link(
                client,
                name="delaywheel-fenced",
                load=[LOAD_SCRIPT],
                min_timeout_s=wait_timeout_s + 1.0,
                address=(host, port),
            )

        if isinstance(client, RedisCluster):
            return ClusterFencedWriter(
                client, link_to, replicas=replicas, wait_timeout_ms=wait_timeout_ms
            )
        link = self._journal_link(
            client, name="delaywheel-fenced", load=[LOAD_SCRIPT], min_timeout_s=wait_timeout_s + 1.0
        )
        return FencedWriter(link, replicas=replicas, wait_timeout_ms=wait_timeout_ms)

    def _journal_link(
        self,
        client: Client,
        *,
        name: str = "delaywheel-journal",
        load: Sequence[Command] = (),
        min_timeout_s: float = 0.0,
        address: tuple[str, int] | None = None,
    ) -> JournalLink:
        """The write connection's settings, from the URL (and the Cluster's slot map);
        ``load`` is sent last in each connection's handshake. ``address``: one
        Cluster primary of several, whose link leaves MOVED to its caller."""
        options = cast("dict[str, Any]", parse_url(self._raw_url))
        host, port = options.get("host", "localhost"), int(options.get("port", 6379))
        if address is not None:
            host, port = address
        elif isinstance(client, RedisCluster):  # the node that owns the store's slot
            node = client.get_node_from_key(self.key)
            if node is not None:
                host, port = node.host, int(node.port)
        handshake: list[Command] = []
        password = options.get("password")
        if password is not None:
            username = options.get("username")
            handshake.append(("AUTH", username, password) if username else ("AUTH", password))
        if int(options.get("db", 0)) and not isinstance(client, RedisCluster):
            handshake.append(("SELECT", int(options["db"])))
        handshake.append(("CLIENT", "SETNAME", name))
        handshake += load
        return JournalLink(
            host,
            port,
            handshake=handshake,
            tls=_tls_context(options) if self._raw_url.startswith("rediss://") else None,
            connect_timeout_s=float(options.get("socket_connect_timeout", self._connect_timeout_s)),
            timeout_s=max(min_timeout_s, float(options.get("socket_timeout", self._timeout_s))),
            resolve=self._resolve_primary(),
            follow_moved=address is None,
        )

    async def load(
        self, batch_size: int = DEFAULT_BATCH_SIZE
    ) -> AsyncIterator[list[tuple[str, bytes]]]:
        check_batch_size(batch_size)
        self._check_open("load")
        client = self._client
        assert client is not None
        seen: set[str] = set()
        pending: list[tuple[str, bytes]] = []
        scan = asyncio.ensure_future(self._scan(client, 0, batch_size))
        try:
            while True:
                cursor, fields = await scan
                if cursor != 0:
                    # Ask for the next batch now: Redis scans it while the
                    # caller works on this one. The task must get as far as
                    # sending before we hand the batch out (the caller works
                    # without giving the loop a turn), hence the yields.
                    scan = asyncio.ensure_future(self._scan(client, cursor, batch_size))
                    for _ in range(_TURNS_TO_SEND):
                        await asyncio.sleep(0)
                # HSCAN may return a field twice (while Redis rehashes the hash).
                ids = _task_ids(self.url, self.key, fields)
                found = zip(ids, fields.values(), strict=True)
                if seen.isdisjoint(ids):  # the usual case, checked at C speed
                    pending += found
                else:
                    pending += [(i, r) for i, r in found if i not in seen]
                seen.update(ids)
                if len(pending) >= batch_size:
                    full = len(pending) - len(pending) % batch_size
                    for start in range(0, full, batch_size):
                        yield pending[start : start + batch_size]
                    pending = pending[full:]
                if cursor == 0:
                    break
        finally:
            if not scan.done():
                scan.cancel()
                with contextlib.suppress(asyncio.CancelledError, StoreError):
                    await scan
        if pending:
            yield pending

    async def _scan(
        self, client: Client, cursor: int, batch_size: int
    ) -> tuple[int, dict[bytes, bytes]]:
        try:
            cursor, reply = await client.hscan(self.key, cursor, count=batch_size)
        except CLIENT_ERRORS as exc:
            raise unavailable(self.url, "load", exc, self._secrets) from exc
        # decode_responses is off: a dict of bytes field -> bytes record.
        return cursor, cast("dict[bytes, bytes]", reply)

    def submit(self, changes: Changes, done: Done) -> None:
        error = self._not_open("write")
        link = self._link
        if error is not None or link is None:
            done(error or StoreUnavailable(f"store {self.url}: write failed: not open"))
            return
        if not changes:
            done(None)
            return
        wait_s = self._retry_at_s - time.monotonic()
        if wait_s > 0:
            done(
                StoreUnavailable(
                    f"{self._last_failure} (not retried yet: next attempt in {wait_s:.2f} s)"
                )
            )
            return
        puts: list[str | bytes] = ["HSET", self.key]
        removes: list[str] = ["HDEL", self.key]
        for task_id, record in changes.items():
            if record is None:
                removes.append(task_id)
            else:
                puts += (task_id, record)
        commands: list[Command] = [command for command in (puts, removes) if len(command) > 2]

        def written(exc: Exception | None) -> None:
            if exc is None:
                self._failures = 0
                done(None)
                return
            failure = unavailable(self.url, "write", exc, self._secrets)
            if isinstance(exc, _UNREACHABLE):  # not when Redis answered: no reason to wait
                self._retry_at_s = time.monotonic() + self._backoff.compute(self._failures)
                self._failures += 1
                self._last_failure = str(failure)
            done(failure)

        link.send(transaction(commands), written)

    async def close(self) -> None:
        if self._state == "closed":
            return
        self._state = "closed"
        # Writes submitted before close() are finished (or fail) first.
        link, self._link = self._link, None
        if link is not None:
            await link.close()
        client, self._client = self._client, None
        if client is not None:
            await close_quietly(client)

    def warnings(self) -> list[str]:
        return list(self._warnings)


def _tls_context(options: dict[str, Any]) -> ssl.SSLContext:
    """The journal connection's TLS settings, from the URL's ``ssl_*`` options as
    redis-py reads them (verifying by default)."""
    context = ssl.create_default_context(cafile=options.get("ssl_ca_certs"))
    if str(options.get("ssl_cert_reqs", "required")).lower() in ("none", "cert_none"):
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if options.get("ssl_certfile"):
        context.load_cert_chain(options["ssl_certfile"], options.get("ssl_keyfile"))
    return context


def _task_ids(url: str, key: str, fields: dict[bytes, bytes]) -> list[str]:
    try:
        return list(map(bytes.decode, fields))  # UTF-8; a C-level loop
    except UnicodeDecodeError:
        bad = next(f for f in fields if not _is_utf8(f))
        raise StoreError(
            f"store {url}: hash {key} holds a field that is not a UTF-8 task id: {bad!r}"
        ) from None


def _is_utf8(field: bytes) -> bool:
    try:
        field.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


# Loop turns a freshly started HSCAN needs to get its request onto the socket
# (redis-py takes a connection from the pool, then writes). Measured on a
# 1,000,000-task load: one turn overlapped nothing, two did; three for margin.
_TURNS_TO_SEND = 3
