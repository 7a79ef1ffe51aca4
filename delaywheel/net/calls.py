"""A protocol method called without a connection: the HTTP API's and the dashboard's way in.

``call`` runs a method through the server's own route (``routes.py``: the same arity
check and engine verb a connection's request gets, counted in the same metrics), and
returns only once the store write holding its change is durable (``durable``), as a
connection holds its reply. ``Reserves`` has the connection's reserve without the
connection: the same checks (``blocked.reserve_params``), the same ready queues, and a
blocked one waits in the engine's line of waiters with a timer and a callback, as a
connection's blocked ``reserve`` does (no task, no coroutine frame); the caller whose
HTTP client went away leaves the line. ``wait`` is held the same way, in the task
table's line of watches.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from delaywheel.engine import validate
from delaywheel.engine.horizon import MAX_FETCHES, NeedsStore
from delaywheel.engine.queues import Waiter, Watch
from delaywheel.errors import RequestError
from delaywheel.net.blocked import WAIT_MOVED_RETRY_MS, reserve_params, wait_params
from delaywheel.store.base import StoreError, reply_for

if TYPE_CHECKING:
    from delaywheel.engine.batches import Wait
    from delaywheel.engine.engine import Engine
    from delaywheel.net.server import Server


async def durable(engine: Engine, wait: Wait | None = None) -> None:
    """Wait for the store write holding the changes made so far (or ``wait``, taken
    before any await); a failed write (the engine rolled them back) raises
    ``unavailable``, as the protocol answers."""
    batch = engine.journal.pending() if wait is None else wait
    if batch is None:
        return
    if batch.finished:  # taken earlier (a reserve's, when its task was handed over)
        if batch.error is not None:
            raise RequestError("unavailable", str(batch.error))
        return
    done: asyncio.Future[Exception | None] = asyncio.get_running_loop().create_future()

    def finished(error: Exception | None) -> None:
        if not done.done():
            done.set_result(error)

    # No flush here: the journal has scheduled one for the end of this loop turn, so
    # the changes of every request handled in the turn go in one store write.
    batch.add_callback(finished)
    error = await done
    if error is not None:
        code, data = reply_for(error) if isinstance(error, StoreError) else ("unavailable", None)
        raise RequestError(code, str(error), data)


# How a call made without a connection is answered: its result, or the error it met.
Reply = Callable[[Any, "RequestError | None"], None]


def reply_when_durable(wait: Wait | None, result: Any, reply: Reply) -> None:
    """``reply(result, None)`` once the store write ``wait`` is durable (at once when
    there is none, or it is done); ``unavailable`` instead if that write failed."""

    def finished(error: Exception | None) -> None:
        if error is None:
            reply(result, None)
        else:
            reply(None, RequestError("unavailable", str(error)))

    if wait is None:
        reply(result, None)
    elif wait.finished:
        finished(wait.error)
    else:
        wait.add_callback(finished)


class _Caller:
    """What a route reads of its connection: the server (``stats``, ``cluster``)."""

    __slots__ = ("server",)

    def __init__(self, server: Server) -> None:
        self.server = server


async def call(server: Server, method: str, params: list[Any]) -> Any:
    """``method`` with ``params`` as a connection's request runs it; its result once
    durable. Raises ``RequestError`` with the protocol's code (``moved`` and
    ``tryagain`` included: the caller forwards those)."""
    route = server.routes.get(method)
    if route is None or route.run is None:  # reserve has its own way; auth is the caller's
        raise RequestError("no_method", f"no method named {method!r} here")
    route.calls += 1
    for _ in range(MAX_FETCHES + 1):
        try:
            result = route.run(_Caller(server), params, time.time())  # type: ignore[arg-type]
            break
        except RequestError as exc:
            route.failed(exc.code)
            server.engine.horizon.settle()
            raise
        except NeedsStore as need:  # a store read first (engine/horizon.py), then again
            try:
                await need.fetch()
            except StoreError as exc:
                route.failed("unavailable")
                raise RequestError("unavailable", str(exc)) from None
    else:
        route.failed("unavailable")
        raise RequestError("unavailable", "the store kept changing under the request")
    server.engine.horizon.settle()
    if route.mutating:
        wait = server.engine.journal.pending()  # this change's write, before any await
        server.rearm()  # it may have moved the next timer, as a request's change may
        try:
            await durable(server.engine, wait)
        except RequestError as exc:
            route.failed(exc.code)
            raise
    return result


class Reserves:
    """The blocked reserves and waits made without a connection, so that a stop
    answers them.

    ``reserve_then`` and ``wait_then`` are held as a connection holds its blocked
    reserve: an entry in the engine's line, a timer and the ``reply`` callback,
    no task and no coroutine frame (a held long poll costs what a blocked
    ``reserve`` costs, docs/http.md). They return how to leave the line (the
    HTTP client went away), or None when ``reply`` is already on its way.
    ``reserve`` and ``wait`` await the same."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.waiting: set[_Held] = set()
        # Stopping: a reserve that finds nothing answers at once rather than wait
        # (a long poll arriving during the stop would hold it up for its timeout).
        self.stopped = False

    def reserve_then(self, params: list[Any], reply: Reply) -> Callable[[], None] | None:
        """``reserve`` with the protocol's params: ``reply`` gets a task, reserved and
        durable, or None after the timeout (or at once when the server stops)."""
        server, engine = self.server, self.server.engine
        route = server.routes["reserve"]
        route.calls += 1
        try:
            topics, timeout_s = reserve_params(params)
            task = engine.try_reserve(topics, time.time())
        except RequestError as exc:
            route.failed(exc.code)
            reply(None, exc)
            return None
        if task is not None:
            server.rearm()  # a reservation's deadline is a timer
            reply_when_durable(engine.journal.pending(), task, reply)
            return None
        if timeout_s <= 0 or self.stopped:
            reply(None, None)
            return None
        held = _Held(self, reply, "")
        waiter = Waiter(validate.topics(topics), held.answer)
        engine.wait_reserve(waiter)
        return held.start(timeout_s, partial(engine.cancel_wait, waiter))

    def wait_then(self, params: list[Any], reply: Reply) -> Callable[[], None] | None:
        """``wait`` with the protocol's params: ``reply`` gets the task's final map,
        durable, or None after the timeout (or at once when the server stops); a
        ``tryagain`` error when its partition leaves this node while it waits."""
        server, engine = self.server, self.server.engine
        route = server.routes["wait"]
        route.calls += 1
        try:
            task_id, timeout_s = wait_params(params)
            final = engine.wait_now(task_id)
        except RequestError as exc:
            route.failed(exc.code)
            reply(None, exc)
            return None
        if final is not None:
            reply_when_durable(engine.journal.pending(), final, reply)
            return None
        if timeout_s <= 0 or self.stopped:
            reply(None, None)
            return None
        held = _Held(self, reply, task_id)
        watch = Watch(task_id, held.answer)
        engine.watch(watch)
        return held.start(timeout_s, partial(engine.cancel_watch, watch))

    async def reserve(self, params: list[Any]) -> dict[str, Any] | None:
        """``reserve_then``, awaited."""
        return await _awaited(self.reserve_then, params)  # type: ignore[no-any-return]

    async def wait(self, params: list[Any]) -> dict[str, Any] | None:
        """``wait_then``, awaited."""
        return await _awaited(self.wait_then, params)  # type: ignore[no-any-return]

    def stop(self) -> None:
        """The server is stopping: every blocked reserve is answered None now, and
        any made from now on answers at once."""
        self.stopped = True
        for held in list(self.waiting):
            held.timed_out()


class _Held:
    """One blocked call in the engine's line: its timer, how to leave the line, its
    reply. ``moved``: a wait's task id (answered None, its partition left: tryagain)."""

    __slots__ = ("moved", "release", "reply", "reserves", "timer")

    def __init__(self, reserves: Reserves, reply: Reply, moved: str) -> None:
        self.reserves = reserves
        self.reply: Reply | None = reply
        self.moved = moved
        self.timer: asyncio.TimerHandle | None = None
        self.release: Callable[[], None] | None = None

    def start(self, timeout_s: float, release: Callable[[], None]) -> Callable[[], None]:
        self.release = release
        self.timer = asyncio.get_running_loop().call_later(timeout_s, self.timed_out)
        self.reserves.waiting.add(self)
        return self.cancel

    def _done(self) -> Reply | None:
        """The reply, once: None when already answered or cancelled."""
        reply, self.reply = self.reply, None
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.reserves.waiting.discard(self)
        return reply

    def answer(self, found: dict[str, Any] | None) -> None:
        """From the engine: a task for it (the line is left), or None (a wait's
        partition went elsewhere)."""
        reply = self._done()
        if reply is None:
            return
        release, self.release = self.release, None
        server = self.reserves.server
        if found is None:
            if release is not None:
                release()
            server.routes["wait"].failed("tryagain")
            data = {"partition": None, "retry_after_ms": WAIT_MOVED_RETRY_MS}
            message = f"task {self.moved!r} is no longer served here"
            reply(None, RequestError("tryagain", message, data))
            return
        server.rearm()  # a reservation's deadline is a timer
        reply_when_durable(server.engine.journal.pending(), found, reply)

    def timed_out(self) -> None:
        """Its timeout, or the server stopping: answered None, out of the line."""
        reply = self._done()
        if reply is None:
            return
        self.cancel()
        reply(None, None)

    def cancel(self) -> None:
        """Its client went away: out of the line, answered by nothing."""
        self._done()
        release, self.release = self.release, None
        if release is not None:
            release()


async def _awaited(start: Callable[[list[Any], Reply], Any], params: list[Any]) -> Any:
    """A callback-answered call (``reserve_then``, ``wait_then``) as a coroutine;
    cancelling it leaves the line."""
    got: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    def reply(result: Any, error: RequestError | None) -> None:
        if got.done():
            return
        if error is None:
            got.set_result(result)
        else:
            got.set_exception(error)

    cancel = start(params, reply)
    try:
        return await got
    finally:
        if cancel is not None and not got.done():
            cancel()
