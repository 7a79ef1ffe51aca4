"""A protocol method called without a connection: the HTTP API's and the dashboard's way in.

``call`` runs a method through the server's own route (``routes.py``: the same arity
check and engine verb a connection's request gets, counted in the same metrics), and
returns only once the store write holding its change is durable (``durable``), as a
connection holds its reply. ``reserve`` is the connection's reserve without the
connection: the same checks (``connection.reserve_params``), the same ready queues, and a
blocked one waits in the engine's line of waiters, costing what a blocked ``reserve`` of
the protocol costs; cancelling the caller (its HTTP client went away) leaves the line.
``wait`` is held the same way, in the task table's line of watches.
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
from delaywheel.net.connection import WAIT_MOVED_RETRY_MS, reserve_params, wait_params
from delaywheel.store.base import StoreError, reply_for

if TYPE_CHECKING:
    from delaywheel.engine.engine import Engine
    from delaywheel.engine.journal import Wait
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


# A blocked call's answer: the map it gets, or None (timed out, stopped; a wait's
# task's partition gone elsewhere).
Answer = Callable[[dict[str, Any] | None], None]


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
    answers them."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.waiting: set[asyncio.Future[dict[str, Any] | None]] = set()
        # Stopping: a reserve that finds nothing answers at once rather than wait
        # (a long poll arriving during the stop would hold it up for its timeout).
        self.stopped = False

    async def reserve(self, params: list[Any]) -> dict[str, Any] | None:
        """``reserve`` with the protocol's params: a task, reserved and durable, or None
        after the timeout (or at once when the server stops)."""
        server, engine = self.server, self.server.engine
        route = server.routes["reserve"]
        route.calls += 1
        try:
            topics, timeout_s = reserve_params(params)
            task = engine.try_reserve(topics, time.time())
        except RequestError as exc:
            route.failed(exc.code)
            raise
        wait = engine.journal.pending() if task is not None else None
        if task is None and timeout_s > 0 and not self.stopped:
            task, wait = await self._wait(topics, timeout_s)
        if task is not None:
            server.rearm()  # a reservation's deadline is a timer
            await durable(engine, wait)
        return task

    async def wait(self, params: list[Any]) -> dict[str, Any] | None:
        """``wait`` with the protocol's params: the task's final map, durable, or None
        after the timeout (or at once when the server stops)."""
        server, engine = self.server, self.server.engine
        route = server.routes["wait"]
        route.calls += 1
        try:
            task_id, timeout_s = wait_params(params)
            final = engine.wait_now(task_id)
        except RequestError as exc:
            route.failed(exc.code)
            raise
        wait = engine.journal.pending() if final is not None else None
        if final is None and timeout_s > 0 and not self.stopped:

            def hold(answer: Answer) -> Callable[[], None]:
                watch = Watch(task_id, answer)
                engine.watch(watch)
                return partial(engine.cancel_watch, watch)

            final, wait = await self._held(hold, timeout_s, moved=task_id)
        if final is not None:
            await durable(engine, wait)
        return final

    async def _wait(
        self, topics: Any, timeout_s: float
    ) -> tuple[dict[str, Any] | None, Wait | None]:
        """Wait in the engine's line, as a connection's blocked reserve does."""
        engine = self.server.engine

        def hold(answer: Answer) -> Callable[[], None]:
            waiter = Waiter(validate.topics(topics), answer)
            engine.wait_reserve(waiter)
            return partial(engine.cancel_wait, waiter)

        return await self._held(hold, timeout_s)

    async def _held(
        self, hold: Callable[[Answer], Callable[[], None]], timeout_s: float, moved: str = ""
    ) -> tuple[dict[str, Any] | None, Wait | None]:
        """A blocked call: ``hold(answer)`` puts it in the engine's line and returns
        how to take it out. A future and a timer, no task beside the request's own
        (a held long poll should cost little more than its connection). The answer,
        and the store write holding the change it reports (taken when it came, as the
        connection takes it). A wait told its task's partition left (``moved``, its
        id): ``tryagain``, which the caller forwards to the new owner."""
        engine = self.server.engine
        loop = asyncio.get_running_loop()
        got: asyncio.Future[dict[str, Any] | None] = loop.create_future()
        writes: list[Wait | None] = [None]
        left = [False]

        def answer(task: dict[str, Any] | None) -> None:
            if not got.done():
                left[0] = task is None  # only a wait is answered None: moved
                got.set_result(task)
                if task is not None:
                    writes[0] = engine.journal.pending()

        def timed_out() -> None:
            if not got.done():
                got.set_result(None)

        release = hold(answer)
        timer = loop.call_later(timeout_s, timed_out)
        self.waiting.add(got)
        try:
            found = await got
        finally:
            timer.cancel()
            self.waiting.discard(got)
            if got.cancelled() or got.result() is None:  # timed out, stopped, or gone
                release()
        if left[0]:
            raise RequestError(
                "tryagain",
                f"task {moved!r} is no longer served here",
                {"partition": None, "retry_after_ms": WAIT_MOVED_RETRY_MS},
            )
        return found, writes[0]

    def stop(self) -> None:
        """The server is stopping: every blocked reserve is answered None now, and
        any made from now on answers at once."""
        self.stopped = True
        for got in list(self.waiting):
            if not got.done():
                got.set_result(None)
