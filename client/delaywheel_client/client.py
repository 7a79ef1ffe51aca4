"""The blocking client: plain sockets, the sans-IO codec, a small pool of connections.

How it works. A call borrows an idle ``Connection`` (or opens one, sending ``auth`` first
when a token is set), exchanges its request and reply on it, then puts the connection back.
So threads never wait for each other: one thread blocked in ``reserve`` holds its own
connection while the others use theirs. At most ``MAX_IDLE_CONNECTIONS`` idle connections
are kept, and one the server closed while it sat idle is thrown away before it is reused,
without counting as a failure. Retries follow ``ClientBase`` (see connection.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar

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
    MAX_IDLE_CONNECTIONS,
    ClientBase,
    Connection,
    Dropped,
    parse_url,
)
from delaywheel_client.errors import ConnectionFailed, error_from_reply
from delaywheel_client.methods import READ_ONLY_METHODS
from delaywheel_client.pipeline import QueuedCalls

_T = TypeVar("_T")


class Client(ClientBase):
    """A blocking delaywheel client, safe to share between threads.

    Example::

        with Client("127.0.0.1", 3450) as dw:  # or Client.from_url("delaywheel://tok@host:3450")
            dw.add("emails", {"to": "a@example.com"}, delay=30, id="welcome-42")
            # -> {"id": "welcome-42", "at": 1767225630.0, "cycle": 0, "slot": 1830}
            task = dw.reserve("emails", timeout=5)  # None after 5 s with nothing ready
            if task is not None:
                dw.ack(task["id"])

    Errors from the server raise the ``errors`` class of their code (``NotFound``,
    ``Conflict``, ...). A lost connection raises ``ConnectionFailed``; requests that were
    never sent are retried ``retries`` times first. A request that was sent but whose reply
    was lost is sent again only for read-only methods: ``add``, ``ack``, ``reserve`` and the
    other writes raise ``ConnectionFailed``, because they may have been applied. Give ``add``
    an ``id`` to make it idempotent: adding the same id again answers ``Exists``.

    ``timeout_s`` is how long to wait for a reply (``reserve`` waits its own ``timeout`` on
    top of it); ``connect_timeout_s`` bounds opening a connection (and its TLS handshake).

    TLS (see ``ClientBase``)::

        Client("queue.internal", 3450, tls_ca="ca.pem")  # verified against a private CA
        Client("queue.internal", 3450, tls_ca="ca.pem",  # mutual TLS
               tls_cert="client.pem", tls_key="client.key")
        Client("queue.example.com", 3450, tls=True)  # a certificate the system trusts

    A certificate that does not verify raises ``ConnectionFailed`` at the first call,
    without retrying.
    """

    def __post_init__(self) -> None:
        super().__post_init__()
        # list.pop() and list.append() are atomic, so the pool needs no lock.
        self._idle: list[Connection] = []

    def __repr__(self) -> str:
        return f"<Client {self._label}>"

    # -- connections -----------------------------------------------------------

    def _connect(self) -> Connection:
        if self._closed:
            raise ConnectionFailed(f"{self._label}: the client is closed")
        conn = Connection.open(
            self.host,
            self.port,
            self.connect_timeout_s,
            self.timeout_s,
            self._ssl,
            self._server_hostname,
        )
        if self.token is not None:
            try:
                reply = conn.exchange("auth", (self.token,), self.timeout_s)
            except Dropped as exc:
                exc.sent = False  # only auth was sent; the caller's request was not
                raise
            if reply.error is not None:
                conn.close()
                raise error_from_reply(reply.error)
        return conn

    def _borrow(self) -> Connection:
        idle = self._idle
        while True:
            try:
                conn = idle.pop()
            except IndexError:
                return self._connect()
            if not conn.stale():
                return conn
            conn.close()  # closed by the server while idle: not a failure, try the next

    def _give_back(self, conn: Connection) -> None:
        if self._closed or len(self._idle) >= MAX_IDLE_CONNECTIONS or conn.decoder.buffered_bytes:
            conn.close()
        else:
            self._idle.append(conn)

    def _exchange(self, read_only: bool, exchange: Callable[[Connection], _T]) -> _T:
        """``exchange(conn)`` on a borrowed connection, retried after a drop as
        ``ClientBase._backoff_s`` allows."""
        attempt = 0
        while True:
            try:
                conn = self._borrow()
            except Dropped as exc:
                time.sleep(self._backoff_s(exc, True, attempt))
                attempt += 1
                continue
            try:
                result = exchange(conn)
            except Dropped as exc:
                time.sleep(self._backoff_s(exc, read_only, attempt))
                attempt += 1
                continue
            except TypeError:
                self._give_back(conn)  # raised while encoding: nothing was sent
                raise
            except BaseException:  # KeyboardInterrupt mid-reply: the stream is out of step
                conn.close()
                raise
            self._give_back(conn)
            return result

    def _call(self, method: str, params: Sequence[Any], timeout_s: float) -> Any:
        reply = self._exchange(
            method in READ_ONLY_METHODS, lambda conn: conn.exchange(method, params, timeout_s)
        )
        if reply.error is None:
            return reply.result
        raise error_from_reply(reply.error)

    def _call_many(self, calls: Sequence[tuple[str, Sequence[Any]]], timeout_s: float) -> list[Any]:
        read_only = all(method in READ_ONLY_METHODS for method, _ in calls)
        return self._exchange(read_only, lambda conn: conn.exchange_many(calls, timeout_s))

    def close(self) -> None:
        """Close the idle connections; ones in use are closed when their call returns."""
        self._closed = True
        while True:
            try:
                self._idle.pop().close()
            except IndexError:
                return

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- methods ---------------------------------------------------------------

    def call(self, method: str, *params: Any) -> Any:
        """Any method by name, with the protocol's params: ``call("get", "task-1")``."""
        return self._call(method, params, reply_timeout_s(method, params, self.timeout_s))

    def ping(self) -> str:
        """``"pong"``."""
        result: str = self._call("ping", (), self.timeout_s)
        return result

    def add(
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
        result: Task = self._call("add", (fields,), self.timeout_s)
        return result

    def add_many(self, tasks: Iterable[Mapping[str, Any]]) -> TaskList:
        """Add task maps all or nothing; returns ``add``'s result for each, in order."""
        result: TaskList = self._call("add_many", ([dict(t) for t in tasks],), self.timeout_s)
        return result

    def update(self, id: str, **changes: Any) -> Task:
        """Change ``delay``/``at``, ``body``, ``topic``, ``ttr``, ``target`` or
        ``max_attempts``; returns the updated task."""
        result: Task = self._call("update", (id, changes), self.timeout_s)
        return result

    def delete(self, id: str) -> bool:
        """True if the task existed."""
        return bool(self._call("delete", (id,), self.timeout_s))

    def get(self, id: str) -> Task | None:
        """The task, or None."""
        result: Task | None = self._call("get", (id,), self.timeout_s)
        return result

    def reserve(self, topics: Topics, timeout: float = 0) -> Task | None:
        """The oldest ready task of ``topics``, now reserved, or None after ``timeout`` s."""
        result: Task | None = self._call(
            "reserve", (topic_list(topics), timeout), timeout + self.timeout_s
        )
        return result

    def ack(self, id: str) -> bool:
        """The reserved task is done and removed."""
        return bool(self._call("ack", (id,), self.timeout_s))

    def release(self, id: str, delay: float = 0) -> bool:
        """Put a reserved task back, due after ``delay`` seconds."""
        return bool(self._call("release", (id, delay), self.timeout_s))

    def touch(self, id: str) -> float:
        """Extend a reservation by its ttr; returns the new deadline (Unix s)."""
        result: float = self._call("touch", (id,), self.timeout_s)
        return result

    def kick(self, topic: str, count: int) -> int:
        """Make up to ``count`` dead tasks of ``topic`` ready again; returns how many."""
        result: int = self._call("kick", (topic, count), self.timeout_s)
        return result

    def kick_task(self, task_id: str) -> bool:
        """Make one dead task ready again (due now, if it has a target); True."""
        result: bool = self._call("kick_task", (task_id,), self.timeout_s)
        return result

    def stats(self) -> dict[str, Any]:
        """Counts by state and topic, wheel settings, store URL, uptime, version, ..."""
        result: dict[str, Any] = self._call("stats", (), self.timeout_s)
        return result

    def cluster(self) -> dict[str, Any]:
        """The keyspace's partition map: ``{"node", "partitions", "lease_s", "owners":
        [{"partition", "node", "address", "epoch"}, ...]}`` (docs/ha.md)."""
        result: dict[str, Any] = self._call("cluster", (), self.timeout_s)
        return result

    def schedule_next(
        self, schedule: str | Mapping[str, Any], n: int | None = None
    ) -> dict[str, Any]:
        """The next ``n`` (1-1000, default 5) times of a schedule id or unsaved spec map
        (``cron``, ``tz`` or ``every``, ``anchor``): ``{"times", "description"}``."""
        params = (schedule,) if n is None else (schedule, n)
        result: dict[str, Any] = self._call("schedule_next", params, self.timeout_s)
        return result

    def pipeline(self) -> Pipeline:
        """A batch: queue calls, then send them in one write and read every reply.

        Example::

            with dw.pipeline() as pipe:  # executes on a clean exit
                for n in range(1000):
                    pipe.add("thumbnails", {"image": n})
            first_id = pipe.results[0]["id"]
        """
        return Pipeline(self)

    def iter_tasks(
        self, *, topic: str | None = None, state: str | None = None, page_size: int = 1000
    ) -> Iterator[Task]:
        """Every matching task, following ``list``'s ``next`` cursor page by page."""
        cursor = None
        while True:
            page = self.list(topic=topic, state=state, limit=page_size, cursor=cursor)
            yield from page["tasks"]
            cursor = page["next"]
            if cursor is None:
                return

    # Defined last: inside the class body, the name ``list`` is this method from here on.
    def schedule_add(self, schedule: Mapping[str, Any]) -> dict[str, Any]:
        """Save a recurring schedule (``id``, ``cron``+``tz`` or ``every``, the task template,
        policies; docs/schedules.md): the schedule map with its state."""
        result: dict[str, Any] = self._call("schedule_add", (dict(schedule),), self.timeout_s)
        return result

    def schedule_update(
        self, schedule_id: str, changes: Mapping[str, Any], expected_version: int | None = None
    ) -> dict[str, Any]:
        """Change a schedule (null removes a field); a stale ``expected_version`` raises
        ``Conflict``. The next occurrence is the first after max(now, last_fired)."""
        result: dict[str, Any] = self._call(
            "schedule_update",
            (schedule_id, dict(changes))
            if expected_version is None
            else (schedule_id, dict(changes), expected_version),
            self.timeout_s,
        )
        return result

    def schedule_pause(self, schedule_id: str, note: str | None = None) -> dict[str, Any]:
        """Pause a schedule (its pending occurrence goes in the same write), with a note."""
        result: dict[str, Any] = self._call(
            "schedule_pause",
            (schedule_id,) if note is None else (schedule_id, note),
            self.timeout_s,
        )
        return result

    def schedule_resume(self, schedule_id: str) -> dict[str, Any]:
        """Resume a paused schedule from now (what passed while paused is not fired)."""
        result: dict[str, Any] = self._call("schedule_resume", (schedule_id,), self.timeout_s)
        return result

    def schedule_delete(self, schedule_id: str) -> bool:
        """Delete a schedule; True if it existed (occurrences already put stay tasks)."""
        result: bool = self._call("schedule_delete", (schedule_id,), self.timeout_s)
        return result

    def schedule_get(self, schedule_id: str) -> dict[str, Any] | None:
        """A schedule's map with ``version``, ``paused``, ``note``, ``next``, ``last_fired``,
        ``counts``; None if there is none."""
        result: dict[str, Any] | None = self._call("schedule_get", (schedule_id,), self.timeout_s)
        return result

    def schedule_list(
        self,
        *,
        topic: str | None = None,
        paused: bool | None = None,
        limit: int | None = None,
        cursor: Any = None,
    ) -> dict[str, Any]:
        """One page: ``{"schedules": [...], "next": cursor or None}`` (limit <= 1000)."""
        result: dict[str, Any] = self._call(
            "schedule_list", (schedule_query(topic, paused, limit, cursor),), self.timeout_s
        )
        return result

    def schedule_trigger(self, schedule_id: str) -> dict[str, Any]:
        """One extra occurrence now: ``{"id": its task id}``."""
        result: dict[str, Any] = self._call("schedule_trigger", (schedule_id,), self.timeout_s)
        return result

    def schedule_backfill(self, schedule_id: str, start: float, end: float) -> dict[str, Any]:
        """Fire the occurrences in [start, min(end, now)] under their own ids (Unix s):
        ``{"ids": [...put], "existing": n}``."""
        result: dict[str, Any] = self._call(
            "schedule_backfill", (schedule_id, start, end), self.timeout_s
        )
        return result

    def list(
        self,
        *,
        topic: str | None = None,
        state: str | None = None,
        limit: int | None = None,
        cursor: Any = None,
    ) -> dict[str, Any]:
        """One page: ``{"tasks": [...], "next": cursor or None}`` (limit <= 1000)."""
        query = list_query(topic, state, limit, cursor)
        result: dict[str, Any] = self._call("list", (query,), self.timeout_s)
        return result


class Pipeline(QueuedCalls):
    """Queued calls sent together by ``execute()``; see ``Client.pipeline()``.

    Each method has ``Client``'s name and params, queues the call and returns None.
    ``execute()`` returns the results in call order. With ``raise_on_error`` (the default)
    the first error is raised after every reply has been read; otherwise errors come back
    as exception instances in the list. Used as a context manager it executes on a clean
    exit and keeps the results in ``results``.
    """

    def __init__(self, client: Client) -> None:
        super().__init__(client.timeout_s)
        self._client = client

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        calls, timeout_s = self._take()
        if not calls:
            self.results = []
            return self.results
        return self._collect(self._client._call_many(calls, timeout_s), raise_on_error)

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.execute()
        else:
            self._take()


# parse_url: importable from here, as before the split.
__all__ = ["Client", "Pipeline", "parse_url"]
