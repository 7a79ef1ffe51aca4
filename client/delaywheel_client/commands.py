"""The client's methods, written once: every client serves them by saying how a call is sent.

How it works (redis-py's ``commands/core.py`` pattern). ``Commands`` holds one plain method
per protocol method, and ``call``: its signature, its docstring, and a body that builds the
params and returns ``self._send(method, params)``. Its decorator, ``command``, gives the
protocol's side (the params by name, read-only or not, open before ``auth``: the
``MethodSpec`` that methods.py makes the server's table of) and which param routes the call
on a cluster (``route``); the body says how the reply becomes the return value
(``shape=bool``) and how much longer than ``timeout_s`` the reply may take (a blocking
``reserve``'s ``wait_s``). Each client implements only ``_send`` (and the cluster clients
``_by_name``, for ``call``):

- ``Client`` sends and returns the result; ``ClusterClient`` runs the call's plan (plans.py);
- ``AsyncClient`` and ``AsyncClusterClient`` return a coroutine of the result;
- the pipelines (``QueuedCalls``) queue the call and return None.

``serve`` (serve.py) gives each of those classes its own copy of every method, for its
flavour: ``Blocking``, ``Awaiting`` (each method an ``async def`` awaiting the definition)
or ``Queuing``.

Types. A method returns its result on ``Client``, an awaitable of it on ``AsyncClient`` and
None on a pipeline: Python's types cannot say "the same method returning ``R[T]``". So,
for the type checker only, ``command`` turns each definition into a descriptor whose
``__get__`` is overloaded on the flavour of the instance (``Awaiting``, ``Queuing``, else
blocking): ``client.add(...)`` is ``Task``, ``await aclient.add(...)`` is ``Task`` (the call
itself a ``Coroutine``, so ``asyncio.create_task`` takes it), and ``pipe.add(...)`` is
None, each with the definition's parameters. At run time ``command`` returns the function
itself: no descriptor on the call path. The bodies return ``_send``'s ``Any`` under a
declared type: the reply's type is the protocol's promise (docs/protocol.md), hence the
mypy comment below.

Adding a method: its definition here (params, docstring, route), an engine verb, a route in
delaywheel/net/routes.py and docs/protocol.md. A cluster client sends it to the owner of its
routing param, or to any node; a method that must visit every node needs a plan in plans.py
(``FAN_OUT``).
"""

# mypy: disable-error-code="no-any-return"

from __future__ import annotations

import dataclasses
from collections.abc import (
    AsyncIterator,
    Callable,
    Coroutine,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

from delaywheel_client.calls import (
    Task,
    TaskList,
    Topics,
    list_query,
    reply_wait_s,
    schedule_query,
    task_fields,
    topic_list,
)
from delaywheel_client.partitions import settings_key

if TYPE_CHECKING:
    from typing import Concatenate, ParamSpec

    _P = ParamSpec("_P")

_R = TypeVar("_R")

Route = Callable[[Sequence[Any]], str | None]
Shape = Callable[[Any], Any] | None  # how a reply becomes the return value (None: as it is)

# ``_send``'s default wait: a call that waits for nothing more than ``timeout_s``. One object,
# so that a pipeline tells "none given" by identity, the cheapest test on its hot path.
NO_WAIT_S = 0.0


def by_id(params: Sequence[Any]) -> str | None:
    """The first param, a task (or schedule) id."""
    first = params[0] if params else None
    return first if isinstance(first, str) else None


def by_topic(params: Sequence[Any]) -> str | None:
    """The first param, a topic: its settings' key (the partition they live in)."""
    first = params[0] if params else None
    return settings_key(first) if isinstance(first, str) else None


def by_id_field(params: Sequence[Any]) -> str | None:
    """The ``id`` of the first param, a task (or schedule) map."""
    first = params[0] if params else None
    task_id = first.get("id") if isinstance(first, Mapping) else None
    return task_id if isinstance(task_id, str) else None


@dataclasses.dataclass(frozen=True)
class MethodSpec:
    """A method as the protocol has it: its params by name, in order, and how many trailing
    ones may be left out; whether it is read-only (it changes nothing, so sending it again
    after its reply was lost is harmless: the clients retry only these); and whether a
    connection may send it before ``auth``. methods.py makes the server's table of them."""

    name: str
    params: tuple[str, ...]
    optional: int = 0  # how many of the trailing params may be left out
    read_only: bool = False
    before_auth: bool = False


# Every method of the protocol, in the order of the definitions (docs/protocol.md's).
SPECS: list[MethodSpec] = []

# The methods a cluster client sends to the owner of a task, by the param that names it;
# the others go to any node (or, with a plan of their own, to every node: plans.py).
ROUTES: dict[str, Route] = {}

# Every definition by name, ``call`` included: what ``serve`` gives each client.
DEFINITIONS: dict[str, Callable[..., Any]] = {}


def protocol_only(spec: MethodSpec) -> None:
    """A method of the protocol that no client method stands for (``auth``)."""
    SPECS.append(spec)


if TYPE_CHECKING:

    class Command(Generic[_P, _R]):
        """What the type checker sees of a definition: see the module docstring."""

        @overload
        def __get__(self, obj: None, owner: type[Any]) -> Callable[Concatenate[Any, _P], _R]: ...
        @overload
        def __get__(
            self, obj: Awaiting, owner: type[Any]
        ) -> Callable[_P, Coroutine[Any, Any, _R]]: ...
        @overload
        def __get__(self, obj: Queuing, owner: type[Any]) -> Callable[_P, None]: ...
        @overload
        def __get__(self, obj: Commands, owner: type[Any]) -> Callable[_P, _R]: ...
        def __get__(self, obj: Any, owner: Any) -> Any: ...


def command(
    params: tuple[str, ...] | None = None,
    optional: int = 0,
    *,
    read_only: bool = False,
    before_auth: bool = False,
    route: Route | None = None,
) -> Callable[[Callable[Concatenate[Any, _P], _R]], Command[_P, _R]]:
    """Record a definition: the protocol method it stands for (``params`` and the rest are
    ``MethodSpec``'s; None: ``call``, which sends any method), and the param that routes
    it on a cluster. The decorated function is the definition itself."""

    def define(fn: Any) -> Any:
        DEFINITIONS[fn.__name__] = fn
        if params is not None:
            SPECS.append(MethodSpec(fn.__name__, params, optional, read_only, before_auth))
        if route is not None:
            ROUTES[fn.__name__] = route
        return fn

    return define


class Commands:
    """Every protocol method, as a method of each client: see the module docstring."""

    __slots__ = ()

    def _send(
        self, method: str, params: Sequence[Any], wait_s: float = NO_WAIT_S, shape: Shape = None
    ) -> Any:
        """Send one call of ``method`` as its client method does: its reply may take
        ``wait_s`` more than ``timeout_s``, and ``shape(result)`` is returned (a pipeline
        queues the call and returns None; its results come from ``execute``)."""
        raise NotImplementedError

    def _by_name(self, method: str, params: Sequence[Any]) -> Any:
        """``call``'s send: the method as its client method sends it, without a shape
        (the cluster clients send it to one node where their methods may visit every one)."""
        return self._send(method, params, reply_wait_s(method, params))

    @command()
    def call(self, method: str, *params: Any) -> Any:
        """Any method by name, with the protocol's params: ``call("get", "task-1")``."""
        return self._by_name(method, params)

    @command((), read_only=True, before_auth=True)
    def ping(self) -> str:
        """``"pong"``."""
        return self._send("ping", ())

    # No method: the client sends auth itself, first on each new connection, when it was
    # given ``token=`` (a pool of connections cannot be authenticated by one call).
    protocol_only(MethodSpec("auth", ("token",), read_only=True, before_auth=True))

    @command(("task",), route=by_id_field)
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
        priority: int | None = None,
        retain: float | None = None,
    ) -> Task:
        """Add a task; returns ``{"id", "at", "cycle", "slot"}``. Keys left None are not sent
        (the server's defaults apply: due now, ttr 60 s, 5 attempts, the ready queue,
        priority 1024 (0 is the most urgent), kept once done for the topic's retain, else
        not at all)."""
        return self._send(
            "add",
            (task_fields(topic, body, delay, at, id, ttr, max_attempts, target, priority, retain),),
        )

    @command(("tasks",))
    def add_many(self, tasks: Iterable[Mapping[str, Any]]) -> TaskList:
        """Add task maps all or nothing; returns ``add``'s result for each, in order."""
        return self._send("add_many", ([dict(t) for t in tasks],))

    # **changes could name "self" for the type checker; a task has no such field.
    @command(("id", "changes"), route=by_id)  # type: ignore[arg-type]
    def update(self, id: str, **changes: Any) -> Task:
        """Change ``delay``/``at``, ``body``, ``topic``, ``ttr``, ``target``,
        ``max_attempts`` or ``priority``; returns the updated task."""
        return self._send("update", (id, changes))

    @command(("id",), route=by_id)
    def delete(self, id: str) -> bool:
        """True if the task existed."""
        return self._send("delete", (id,), shape=bool)

    @command(("id",), read_only=True, route=by_id)
    def get(self, id: str) -> Task | None:
        """The task, or None."""
        return self._send("get", (id,))

    @command(("query",), optional=1, read_only=True)
    def list(
        self,
        *,
        topic: str | None = None,
        state: str | None = None,
        limit: int | None = None,
        cursor: Any = None,
    ) -> dict[str, Any]:
        """One page: ``{"tasks": [...], "next": cursor or None}`` (limit <= 1000)."""
        return self._send("list", (list_query(topic, state, limit, cursor),))

    @command(("topics", "timeout"), optional=1)
    def reserve(self, topics: Topics, timeout: float = 0) -> Task | None:
        """The oldest ready task of ``topics``, now reserved, or None after ``timeout`` s."""
        return self._send("reserve", (topic_list(topics), timeout), timeout)

    @command(("id", "result"), optional=1, route=by_id)
    def ack(self, id: str, result: Any = None) -> bool:
        """The reserved task is done: removed, or kept ``done`` with ``result`` for its
        ``retain`` seconds."""
        return self._send("ack", (id,) if result is None else (id, result), shape=bool)

    @command(("id", "timeout"), optional=1, read_only=True, route=by_id)
    def wait(self, id: str, timeout: float = 0) -> Task | None:
        """The task's final map once it is ``done``, ``dead`` or gone (``state`` ``gone``),
        or None after ``timeout`` s. Read-only: a client sends it again after a dropped
        connection (give it ``retries`` enough to outlast a server's restart)."""
        return self._send("wait", (id, timeout), timeout)

    @command(("id", "delay"), optional=1, route=by_id)
    def release(self, id: str, delay: float = 0) -> bool:
        """Put a reserved task back, due after ``delay`` seconds."""
        return self._send("release", (id, delay), shape=bool)

    @command(("id",), route=by_id)
    def touch(self, id: str) -> float:
        """Extend a reservation by its ttr; returns the new deadline (Unix s)."""
        return self._send("touch", (id,))

    @command(("topic", "count"))
    def kick(self, topic: str, count: int) -> int:
        """Make up to ``count`` dead tasks of ``topic`` ready again; returns how many."""
        return self._send("kick", (topic, count))

    @command(("id",), route=by_id)
    def kick_task(self, task_id: str) -> bool:
        """Make one dead task ready again (due now, if it has a target); True."""
        return self._send("kick_task", (task_id,), shape=bool)

    @command((), read_only=True)
    def stats(self) -> dict[str, Any]:
        """Counts by state and topic, wheel settings, store URL, uptime, version, ..."""
        return self._send("stats", ())

    @command((), read_only=True)
    def cluster(self) -> dict[str, Any]:
        """The keyspace's partition map: ``{"node", "partitions", "lease_s", "owners":
        [{"partition", "node", "address", "epoch"}, ...]}`` (docs/ha.md)."""
        return self._send("cluster", ())

    @command(("schedule",), route=by_id_field)
    def schedule_add(self, schedule: Mapping[str, Any]) -> dict[str, Any]:
        """Save a recurring schedule (``id``, ``cron``+``tz`` or ``every``, the task template,
        policies; docs/schedules.md): the schedule map with its state."""
        return self._send("schedule_add", (dict(schedule),))

    @command(("id", "changes", "expected_version"), optional=1, route=by_id)
    def schedule_update(
        self, schedule_id: str, changes: Mapping[str, Any], expected_version: int | None = None
    ) -> dict[str, Any]:
        """Change a schedule (null removes a field); a stale ``expected_version`` raises
        ``Conflict``. The next occurrence is the first after max(now, last_fired)."""
        return self._send(
            "schedule_update",
            (schedule_id, dict(changes))
            if expected_version is None
            else (schedule_id, dict(changes), expected_version),
        )

    @command(("id", "note"), optional=1, route=by_id)
    def schedule_pause(self, schedule_id: str, note: str | None = None) -> dict[str, Any]:
        """Pause a schedule (its pending occurrence goes in the same write), with a note."""
        return self._send("schedule_pause", (schedule_id,) if note is None else (schedule_id, note))

    @command(("id",), route=by_id)
    def schedule_resume(self, schedule_id: str) -> dict[str, Any]:
        """Resume a paused schedule from now (what passed while paused is not fired)."""
        return self._send("schedule_resume", (schedule_id,))

    @command(("id",), route=by_id)
    def schedule_delete(self, schedule_id: str) -> bool:
        """Delete a schedule; True if it existed (occurrences already put stay tasks)."""
        return self._send("schedule_delete", (schedule_id,))

    @command(("id",), read_only=True, route=by_id)
    def schedule_get(self, schedule_id: str) -> dict[str, Any] | None:
        """A schedule's map with ``version``, ``paused``, ``note``, ``next``, ``last_fired``,
        ``counts``; None if there is none."""
        return self._send("schedule_get", (schedule_id,))

    @command(("query",), optional=1, read_only=True)
    def schedule_list(
        self,
        *,
        topic: str | None = None,
        paused: bool | None = None,
        limit: int | None = None,
        cursor: Any = None,
    ) -> dict[str, Any]:
        """One page: ``{"schedules": [...], "next": cursor or None}`` (limit <= 1000)."""
        return self._send("schedule_list", (schedule_query(topic, paused, limit, cursor),))

    # A saved schedule lives in the partition of its id; a spec needs no node's state.
    @command(("schedule", "n"), optional=1, read_only=True, route=by_id)
    def schedule_next(
        self, schedule: str | Mapping[str, Any], n: int | None = None
    ) -> dict[str, Any]:
        """The next ``n`` (1-1000, default 5) times of a schedule id or unsaved spec map
        (``cron``, ``tz`` or ``every``, ``anchor``): ``{"times", "description"}``."""
        return self._send("schedule_next", (schedule,) if n is None else (schedule, n))

    @command(("id",), route=by_id)
    def schedule_trigger(self, schedule_id: str) -> dict[str, Any]:
        """One extra occurrence now: ``{"id": its task id}``."""
        return self._send("schedule_trigger", (schedule_id,))

    @command(("id", "start", "end"), route=by_id)
    def schedule_backfill(self, schedule_id: str, start: float, end: float) -> dict[str, Any]:
        """Fire the occurrences in [start, min(end, now)] under their own ids (Unix s):
        ``{"ids": [...put], "existing": n}``."""
        return self._send("schedule_backfill", (schedule_id, start, end))

    @command(("topic",), read_only=True, route=by_topic)
    def topic_get(self, topic: str) -> dict[str, Any]:
        """A topic's settings: ``topic``, ``paused`` (now), ``paused_until``, ``rate``,
        ``burst``, ``concurrency``, ``retain``, ``dead_retain``, ``note`` (the defaults when
        never set)."""
        return self._send("topic_get", (topic,))

    @command(("topic", "settings"), route=by_topic)
    def topic_set(self, topic: str, settings: Mapping[str, Any]) -> dict[str, Any]:
        """Change a topic's settings (only the fields given; nil puts one back to its
        default); returns them all, as ``topic_get``."""
        return self._send("topic_set", (topic, dict(settings)))

    @command(("query",), optional=1, read_only=True)
    def topic_list(
        self, *, paused: bool | None = None, limit: int | None = None, cursor: Any = None
    ) -> dict[str, Any]:
        """One page of the topics that have settings: ``{"topics": [...], "next": cursor or
        None}`` (limit <= 1000)."""
        given = {"paused": paused, "limit": limit, "cursor": cursor}
        return self._send(
            "topic_list", ({name: value for name, value in given.items() if value is not None},)
        )


# -- the flavours: what each kind of client adds, and how it gets the methods -------------------


class Blocking(Commands):
    """The methods return their results: ``Client``, ``ClusterClient``."""

    __slots__ = ()

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


class Awaiting(Commands):
    """The methods are coroutine functions: ``AsyncClient``, ``AsyncClusterClient``."""

    __slots__ = ()

    # Every matching task, following list's next cursor page by page (no docstring, as ever).
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


class Queuing(Commands):
    """The methods queue a call and return None: the pipelines (``QueuedCalls``)."""

    __slots__ = ()
