"""The asyncio client: many requests in flight on one connection.

How it works. One ``ClientProtocol`` (see _aio_protocol.py) carries every call: a call
writes its request and waits on a future that the protocol resolves when the reply with
its msgid arrives. A call costs one future and one timer.

Failures. When the connection drops, every pending call fails with ``ConnectionFailed``
(``ServerClosed`` when the server said why), and the next call connects again. The retry
rules are the blocking client's (``ClientBase`` in connection.py): requests that were never
written are retried up to ``retries`` times, and one that was written is sent again only for
read-only methods. A call that gets no reply within ``timeout_s`` raises ``ConnectionFailed``
and leaves the connection open; its late reply is dropped (a late ``reserve`` reply leaves
that task reserved until its ttr runs out).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any

from delaywheel_client._aio_protocol import ClientProtocol
from delaywheel_client._tls import PathLike, handshake_failure
from delaywheel_client.calls import (
    Task,
    TaskList,
    Topics,
    list_query,
    reply_timeout_s,
    schedule_query,
    task_fields,
    topic_list,
)
from delaywheel_client.connection import (
    DEFAULT_HOST,
    DEFAULT_PORT,
    ClientBase,
    Dropped,
    describe,
)
from delaywheel_client.errors import ConnectionFailed, error_from_reply
from delaywheel_client.methods import READ_ONLY_METHODS
from delaywheel_client.pipeline import QueuedCalls
from delaywheel_client.protocol import Response


class AsyncClient(ClientBase):
    """An asyncio delaywheel client; every ``Client`` method, as a coroutine.

    Example::

        async with await AsyncClient.connect("127.0.0.1", 3450) as dw:
            await dw.add("emails", {"to": "a@example.com"}, delay=30)
            tasks = await asyncio.gather(*(dw.get(f"order-{n}") for n in range(500)))
            task = await dw.reserve(["emails", "sms"], timeout=5)

    One connection carries every call, concurrent ones included. Errors and retries are
    as in ``Client``: server errors raise their ``errors`` class, a lost connection raises
    ``ConnectionFailed`` for the calls in flight and the next call reconnects.

    TLS takes the parameters of ``Client`` (see ``ClientBase``): ``tls``, ``tls_ca``,
    ``tls_cert``, ``tls_key``, ``server_hostname``; ``connect_timeout_s`` bounds the
    handshake too.
    """

    def __post_init__(self) -> None:
        super().__post_init__()
        self._protocol: ClientProtocol | None = None
        self._connecting: asyncio.Lock | None = None

    @classmethod
    async def connect(
        cls,
        host: str = DEFAULT_HOST,
        port: int = DEFAULT_PORT,
        *,
        token: str | None = None,
        timeout_s: float = 10.0,
        connect_timeout_s: float = 5.0,
        retries: int = 3,
        tls: bool | ssl.SSLContext = False,
        tls_ca: PathLike | None = None,
        tls_cert: PathLike | None = None,
        tls_key: PathLike | None = None,
        server_hostname: str | None = None,
    ) -> AsyncClient:
        """A client with its connection open (and authenticated when ``token`` is given)."""
        client = cls(
            host,
            port,
            token=token,
            timeout_s=timeout_s,
            connect_timeout_s=connect_timeout_s,
            retries=retries,
            tls=tls,
            tls_ca=tls_ca,
            tls_cert=tls_cert,
            tls_key=tls_key,
            server_hostname=server_hostname,
        )
        await client._ready()
        return client

    def __repr__(self) -> str:
        return f"<AsyncClient {self._label}>"

    # -- the connection ----------------------------------------------------------

    async def _open(self) -> ClientProtocol:
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            protocol = self._protocol
            if protocol is not None and not protocol.lost:
                return protocol  # another task connected while we waited
            if self._closed:
                raise ConnectionFailed(f"{self._label}: the client is closed")
            loop = asyncio.get_running_loop()
            tls = self._ssl
            connecting = loop.create_connection(
                ClientProtocol,
                self.host,
                self.port,
                ssl=tls,
                server_hostname=None if tls is None else self._server_hostname,
                ssl_handshake_timeout=None if tls is None else self.connect_timeout_s,
            )
            try:
                _, opened = await asyncio.wait_for(connecting, self.connect_timeout_s)
            except ssl.SSLError as exc:
                raise Dropped(handshake_failure(exc), False, permanent=True) from exc
            except (OSError, asyncio.TimeoutError) as exc:
                raise Dropped(f"cannot connect: {describe(exc)}", False) from exc
            if self.token is not None:
                await self._auth(opened, self.token)
            self._protocol = opened
            return opened

    async def _auth(self, protocol: ClientProtocol, token: str) -> None:
        _, future = protocol.send("auth", (token,))
        try:
            reply = await asyncio.wait_for(future, self.timeout_s)
        except Dropped as exc:
            exc.sent = False  # only auth was sent; the caller's request was not
            raise
        except asyncio.TimeoutError as exc:
            protocol.close()
            raise Dropped(f"no reply to auth within {self.timeout_s:g} s", False) from exc
        if reply.error is not None:
            protocol.close()
            raise error_from_reply(reply.error)

    async def _ready(self) -> ClientProtocol:
        attempt = 0
        while True:
            protocol = self._protocol
            if protocol is not None and not protocol.lost:
                return protocol
            try:
                return await self._open()
            except Dropped as exc:
                await asyncio.sleep(self._backoff_s(exc, True, attempt))
                attempt += 1

    async def _call(self, method: str, params: Sequence[Any], timeout_s: float) -> Any:
        attempt = 0
        while True:
            protocol = self._protocol
            if protocol is None or protocol.lost:
                try:
                    protocol = await self._open()
                except Dropped as exc:
                    await asyncio.sleep(self._backoff_s(exc, True, attempt))
                    attempt += 1
                    continue
            if protocol.paused:
                await protocol.wait_drained()
                if protocol.lost:
                    continue  # nothing was written; the next turn reconnects
            msgid, future = protocol.send(method, params)
            timer = protocol.loop.call_later(timeout_s, protocol.time_out, msgid, method, timeout_s)
            try:
                reply = await future
            except Dropped as exc:
                await asyncio.sleep(self._backoff_s(exc, method in READ_ONLY_METHODS, attempt))
                attempt += 1
                continue
            finally:
                timer.cancel()
                protocol.pending.pop(msgid, None)  # when this call was cancelled
            if reply.error is None:
                return reply.result
            raise error_from_reply(reply.error)

    def pipeline(self) -> AsyncPipeline:
        """Queue calls and send them together: the fastest way to make many.

        ``await pipeline.execute()`` (or leaving ``async with client.pipeline()
        as pipe:``) writes every queued request at once and waits for all the
        replies, with no task or coroutine per call::

            async with client.pipeline() as pipe:
                for order in orders:
                    pipe.add("orders", order, delay=1800)
            ids = [added["id"] for added in pipe.results]

        A pipeline is not retried after a lost connection (some of it may have
        been applied); with client-chosen ids a resend is safe (``exists``).
        """
        return AsyncPipeline(self)

    async def _call_many(
        self, calls: Sequence[tuple[str, Sequence[Any]]], timeout_s: float
    ) -> list[Response]:
        if not calls:
            return []
        protocol = await self._ready()
        while protocol.paused:
            await protocol.wait_drained()
            if protocol.lost:  # lost while we waited: nothing was written, so reconnect
                protocol = await self._ready()
        replies = protocol.send_many(calls)
        # Out now, as its own write: pipelines in flight overlap with the
        # server's work instead of being merged into one lock-step burst.
        protocol.write_outbox()
        try:
            return await asyncio.wait_for(replies.future, timeout_s)
        except asyncio.TimeoutError:
            raise ConnectionFailed(
                f"{self._label}: no reply to a pipeline of {len(calls)} within {timeout_s:g} s "
                "(it was sent and may have been applied)"
            ) from None
        except Dropped as exc:
            raise self._failure(exc, False) from exc  # never retried blindly
        finally:
            if replies.left:  # each reply's arrival took its msgid out of pending
                pending = protocol.pending
                for msgid in protocol.msgids(replies.first, len(calls)):
                    pending.pop(msgid, None)

    async def close(self) -> None:
        """Close the connection; calls still in flight fail with ``ConnectionFailed``."""
        self._closed = True
        protocol, self._protocol = self._protocol, None
        if protocol is not None and not protocol.lost:
            protocol.close()
            await protocol.closed

    async def __aenter__(self) -> AsyncClient:
        await self._ready()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # -- methods: Client's, as coroutines, with its docstrings -------------------------

    async def call(self, method: str, *params: Any) -> Any:
        """Any method by name, with the protocol's params: ``call("get", "task-1")``."""
        return await self._call(method, params, reply_timeout_s(method, params, self.timeout_s))

    async def ping(self) -> str:
        """``"pong"``."""
        result: str = await self._call("ping", (), self.timeout_s)
        return result

    async def add(
        self,
        topic: str,
        body: Any = None,
        *,
        delay: float | None = None,
        at: float | None = None,
        id: str | None = None,
        ttr: float | None = None,
        max_attempts: int | None = None,
        target: Mapping[str, Any] | None = None,
    ) -> Task:
        """Add a task; returns ``{"id", "at", "cycle", "slot"}``. Keys left None are not sent
        (the server's defaults apply: due now, ttr 60 s, 5 attempts, the ready queue)."""
        fields = task_fields(topic, body, delay, at, id, ttr, max_attempts, target)
        result: Task = await self._call("add", (fields,), self.timeout_s)
        return result

    async def add_many(self, tasks: Iterable[Mapping[str, Any]]) -> TaskList:
        """Add task maps all or nothing; returns ``add``'s result for each, in order."""
        result: TaskList = await self._call("add_many", ([dict(t) for t in tasks],), self.timeout_s)
        return result

    async def update(self, id: str, **changes: Any) -> Task:
        """Change ``delay``/``at``, ``body``, ``topic``, ``ttr``, ``target`` or
        ``max_attempts``; returns the updated task."""
        result: Task = await self._call("update", (id, changes), self.timeout_s)
        return result

    async def delete(self, id: str) -> bool:
        """True if the task existed."""
        return bool(await self._call("delete", (id,), self.timeout_s))

    async def get(self, id: str) -> Task | None:
        """The task, or None."""
        result: Task | None = await self._call("get", (id,), self.timeout_s)
        return result

    async def reserve(self, topics: Topics, timeout: float = 0) -> Task | None:
        """The oldest ready task of ``topics``, now reserved, or None after ``timeout`` s."""
        result: Task | None = await self._call(
            "reserve", (topic_list(topics), timeout), timeout + self.timeout_s
        )
        return result

    async def ack(self, id: str) -> bool:
        """The reserved task is done and removed."""
        return bool(await self._call("ack", (id,), self.timeout_s))

    async def release(self, id: str, delay: float = 0) -> bool:
        """Put a reserved task back, due after ``delay`` seconds."""
        return bool(await self._call("release", (id, delay), self.timeout_s))

    async def touch(self, id: str) -> float:
        """Extend a reservation by its ttr; returns the new deadline (Unix s)."""
        result: float = await self._call("touch", (id,), self.timeout_s)
        return result

    async def kick(self, topic: str, count: int) -> int:
        """Make up to ``count`` dead tasks of ``topic`` ready again; returns how many."""
        result: int = await self._call("kick", (topic, count), self.timeout_s)
        return result

    async def kick_task(self, task_id: str) -> bool:
        """Make one dead task ready again (due now, if it has a target); True."""
        result: bool = await self._call("kick_task", (task_id,), self.timeout_s)
        return result

    async def stats(self) -> dict[str, Any]:
        """Counts by state and topic, wheel settings, store URL, uptime, version, ..."""
        result: dict[str, Any] = await self._call("stats", (), self.timeout_s)
        return result

    async def cluster(self) -> dict[str, Any]:
        """The keyspace's partition map: ``{"node", "partitions", "lease_s", "owners":
        [{"partition", "node", "address", "epoch"}, ...]}`` (docs/ha.md)."""
        result: dict[str, Any] = await self._call("cluster", (), self.timeout_s)
        return result

    async def schedule_next(
        self, schedule: str | Mapping[str, Any], n: int | None = None
    ) -> dict[str, Any]:
        """The next ``n`` (1-1000, default 5) times of a schedule id or unsaved spec map
        (``cron``, ``tz`` or ``every``, ``anchor``): ``{"times", "description"}``."""
        params = (schedule,) if n is None else (schedule, n)
        result: dict[str, Any] = await self._call("schedule_next", params, self.timeout_s)
        return result

    async def iter_tasks(
        self, *, topic: str | None = None, state: str | None = None, page_size: int = 1000
    ) -> AsyncIterator[Task]:
        cursor = None
        while True:
            page = await self.list(topic=topic, state=state, limit=page_size, cursor=cursor)
            for task in page["tasks"]:
                yield task
            cursor = page["next"]
            if cursor is None:
                return

    async def schedule_add(self, schedule: Mapping[str, Any]) -> dict[str, Any]:
        """Save a recurring schedule (``id``, ``cron``+``tz`` or ``every``, the task template,
        policies; docs/schedules.md): the schedule map with its state."""
        result: dict[str, Any] = await self._call("schedule_add", (dict(schedule),), self.timeout_s)
        return result

    async def schedule_update(
        self, schedule_id: str, changes: Mapping[str, Any], expected_version: int | None = None
    ) -> dict[str, Any]:
        """Change a schedule (null removes a field); a stale ``expected_version`` raises
        ``Conflict``. The next occurrence is the first after max(now, last_fired)."""
        result: dict[str, Any] = await self._call(
            "schedule_update",
            (schedule_id, dict(changes))
            if expected_version is None
            else (schedule_id, dict(changes), expected_version),
            self.timeout_s,
        )
        return result

    async def schedule_pause(self, schedule_id: str, note: str | None = None) -> dict[str, Any]:
        """Pause a schedule (its pending occurrence goes in the same write), with a note."""
        result: dict[str, Any] = await self._call(
            "schedule_pause",
            (schedule_id,) if note is None else (schedule_id, note),
            self.timeout_s,
        )
        return result

    async def schedule_resume(self, schedule_id: str) -> dict[str, Any]:
        """Resume a paused schedule from now (what passed while paused is not fired)."""
        result: dict[str, Any] = await self._call("schedule_resume", (schedule_id,), self.timeout_s)
        return result

    async def schedule_delete(self, schedule_id: str) -> bool:
        """Delete a schedule; True if it existed (occurrences already put stay tasks)."""
        result: bool = await self._call("schedule_delete", (schedule_id,), self.timeout_s)
        return result

    async def schedule_get(self, schedule_id: str) -> dict[str, Any] | None:
        """A schedule's map with ``version``, ``paused``, ``note``, ``next``, ``last_fired``,
        ``counts``; None if there is none."""
        result: dict[str, Any] | None = await self._call(
            "schedule_get", (schedule_id,), self.timeout_s
        )
        return result

    async def schedule_list(
        self,
        *,
        topic: str | None = None,
        paused: bool | None = None,
        limit: int | None = None,
        cursor: Any = None,
    ) -> dict[str, Any]:
        """One page: ``{"schedules": [...], "next": cursor or None}`` (limit <= 1000)."""
        result: dict[str, Any] = await self._call(
            "schedule_list", (schedule_query(topic, paused, limit, cursor),), self.timeout_s
        )
        return result

    async def schedule_trigger(self, schedule_id: str) -> dict[str, Any]:
        """One extra occurrence now: ``{"id": its task id}``."""
        result: dict[str, Any] = await self._call(
            "schedule_trigger", (schedule_id,), self.timeout_s
        )
        return result

    async def schedule_backfill(self, schedule_id: str, start: float, end: float) -> dict[str, Any]:
        """Fire the occurrences in [start, min(end, now)] under their own ids (Unix s):
        ``{"ids": [...put], "existing": n}``."""
        result: dict[str, Any] = await self._call(
            "schedule_backfill", (schedule_id, start, end), self.timeout_s
        )
        return result

    async def list(
        self,
        *,
        topic: str | None = None,
        state: str | None = None,
        limit: int | None = None,
        cursor: Any = None,
    ) -> dict[str, Any]:
        """One page: ``{"tasks": [...], "next": cursor or None}`` (limit <= 1000)."""
        query = list_query(topic, state, limit, cursor)
        result: dict[str, Any] = await self._call("list", (query,), self.timeout_s)
        return result


class AsyncPipeline(QueuedCalls):
    """Queued calls for ``AsyncClient``; see ``AsyncClient.pipeline()``.

    The methods have ``AsyncClient``'s names and params; each queues a call.
    ``await execute()`` returns the results in call order, raising the first
    error after every reply is in (or, with ``raise_on_error=False``, putting
    the exceptions in the list).
    """

    def __init__(self, client: AsyncClient) -> None:
        super().__init__(client.timeout_s)
        self._client = client

    async def execute(self, raise_on_error: bool = True) -> list[Any]:
        calls, timeout_s = self._take()
        if not calls:
            self.results = []
            return self.results
        return self._collect(await self._client._call_many(calls, timeout_s), raise_on_error)

    async def __aenter__(self) -> AsyncPipeline:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        if exc_type is None:
            await self.execute()
        else:
            self._take()


__all__ = ["AsyncClient", "AsyncPipeline"]
