"""A connection's ``reserve`` and ``wait``: the two calls that may block.

Either is answered in line, as any call is, when it can be at once (a task
is ready; the awaited task is final; a timeout of 0). Otherwise it blocks:
it waits in the engine's line (a ``Waiter`` among a topic's blocked
reserves, a ``Watch`` in the task table's line for the id) with a timer and
a callback, nothing else while idle (no task, no coroutine frame), and is
answered out of line, when it gets its answer or times out: the only
replies that do not keep request order. The answer reports a change (the
reservation; the change that made a task final), so it goes once that
change is durable, or as the error of the write that failed.

``reserve_params`` and ``wait_params`` are the calls' checks, shared with
the calls made without a connection (net/calls.py).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from delaywheel import checks
from delaywheel.engine import validate
from delaywheel.engine.queues import Waiter, Watch
from delaywheel.errors import RequestError
from delaywheel.net.connlog import internal_error
from delaywheel.store.base import StoreError, reply_for

if TYPE_CHECKING:
    from delaywheel_client.protocol import Request

    from delaywheel.net.replies import ReplyLine
    from delaywheel.net.routes import Method
    from delaywheel.net.server import Server

# A reserve may block for at most a day; longer waits are a client bug.
MAX_RESERVE_TIMEOUT_S = 86_400.0
# A blocked wait whose task's partition left this node: when to send it again.
WAIT_MOVED_RETRY_MS = 100
# Topics one reserve may name. A blocked reserve waits in a line per topic
# (about 0.6 kB each), so 100,000 topics (1.2 MB sent) held 90 MB; a worker
# that watches more than this many topics is better served by fewer.
MAX_RESERVE_TOPICS = 1_000


class Blocked:
    """One connection's ``reserve`` and ``wait`` calls, and those of them that
    block: each one's timeout timer and the msgid it answers (``waiters``,
    ``watches``). Answers in line go into the connection's ``line``; those out
    of line are written to ``transport``."""

    __slots__ = ("encoder", "engine", "line", "routes", "transport", "waiters", "watches")

    def __init__(self, server: Server, line: ReplyLine, transport: asyncio.Transport) -> None:
        self.engine = server.engine
        self.encoder = server.encoder
        self.routes = server.routes
        self.line = line
        self.transport: asyncio.Transport | None = transport  # None once the connection is gone
        # Blocked reserves: each one's timeout timer and the msgid it answers.
        self.waiters: dict[Waiter, tuple[asyncio.TimerHandle, int]] = {}
        # Blocked waits, the same way: each one's timeout timer and msgid.
        self.watches: dict[Watch, tuple[asyncio.TimerHandle, int]] = {}

    # -- reserve -------------------------------------------------------------------

    def reserve(self, request: Request, route: Method, now_s: float) -> None:
        msgid = request.msgid
        try:
            topics, timeout_s = reserve_params(request.params)
            result = self.engine.try_reserve(topics, now_s)
        except RequestError as exc:
            self._refused(msgid, exc, route)
            return
        except Exception as exc:
            route.failed("internal")
            reply = internal_error(self.encoder, msgid, "reserve", exc)
            self.line.queue(msgid, reply, None, route)
            return
        if result is not None or timeout_s == 0:
            batch = self.engine.journal.pending() if result is not None else None
            self.line.queue(msgid, self.encoder.response(msgid, result), batch, route)
            return
        waiter = Waiter(validate.topics(topics), lambda task: self._reserved(waiter, msgid, task))
        timer = asyncio.get_running_loop().call_later(
            timeout_s, lambda: self._reserve_timed_out(waiter, msgid)
        )
        self.waiters[waiter] = (timer, msgid)
        self.engine.wait_reserve(waiter)

    def _refused(self, msgid: int, exc: RequestError, route: Method) -> None:
        """The call's params or state refused it: its error, answered in line."""
        route.failed(exc.code)
        reply = self.encoder.error_response(msgid, exc.code, exc.message, exc.data)
        self.line.queue(msgid, reply, None, route)

    def _reserved(self, waiter: Waiter, msgid: int, task: dict[str, Any]) -> None:
        blocked = self.waiters.pop(waiter, None)
        if blocked is not None:
            blocked[0].cancel()
        self._answer_once_durable(msgid, task, "reserve")

    def _answer_once_durable(self, msgid: int, task: dict[str, Any], method: str) -> None:
        """A blocked call's answer, out of line, once the change it reports
        (the reservation; the change that made a waited-for task final) is
        durable: an error instead if that write fails."""
        payload = self.encoder.response(msgid, task)
        batch = self.engine.journal.pending()
        if batch is None:
            self._send(payload)
            return

        def durable(error: StoreError | None) -> None:
            if error is None:
                self._send(payload)
            else:
                code, data = reply_for(error)
                self.routes[method].failed(code)
                self._send(self.encoder.error_response(msgid, code, str(error), data))

        batch.add_callback(durable)

    def _reserve_timed_out(self, waiter: Waiter, msgid: int) -> None:
        blocked = self.waiters.pop(waiter, None)
        if blocked is None:
            return
        blocked[0].cancel()  # when called before its time, by stop
        self.engine.cancel_wait(waiter)
        self._send(self.encoder.response(msgid, None))

    # -- wait ----------------------------------------------------------------------

    def wait(self, request: Request, route: Method) -> None:
        """``wait``: the task's map once it is done, dead or gone, or nil after
        the timeout. Held as a blocked reserve is: a ``Watch`` in the task
        table's line for the id, a timer, nothing else while idle. Raises
        ``NeedsStore`` (engine/horizon.py) when the task is only in the store."""
        msgid = request.msgid
        try:
            task_id, timeout_s = wait_params(request.params)
            final = self.engine.wait_now(task_id)
        except RequestError as exc:
            self._refused(msgid, exc, route)
            return
        if final is not None or timeout_s == 0:
            # A state read as the store may not hold it yet: answered once it does.
            batch = self.engine.journal.pending() if final is not None else None
            self.line.queue(msgid, self.encoder.response(msgid, final), batch, route)
            return
        watch = Watch(task_id, lambda task: self._waited(watch, msgid, task))
        timer = asyncio.get_running_loop().call_later(
            timeout_s, lambda: self._wait_timed_out(watch, msgid)
        )
        self.watches[watch] = (timer, msgid)
        self.engine.watch(watch)

    def _waited(self, watch: Watch, msgid: int, task: dict[str, Any] | None) -> None:
        blocked = self.watches.pop(watch, None)
        if blocked is None:
            return
        blocked[0].cancel()
        if task is None:  # its partition left this node: a cluster client asks the new owner
            self.routes["wait"].failed("tryagain")
            message = f"task {watch.task_id!r} is no longer served here: send wait again"
            data = {"partition": None, "retry_after_ms": WAIT_MOVED_RETRY_MS}
            self._send(self.encoder.error_response(msgid, "tryagain", message, data))
            return
        self._answer_once_durable(msgid, task, "wait")

    def _wait_timed_out(self, watch: Watch, msgid: int) -> None:
        blocked = self.watches.pop(watch, None)
        if blocked is None:
            return
        self.engine.cancel_watch(watch)
        self._send(self.encoder.response(msgid, None))

    def _drop_watches(self) -> None:
        """The connection is going: its waits are answered by nothing (a
        client that is still there sends its ``wait`` again: it is read-only)."""
        for watch, (timer, _) in self.watches.items():
            timer.cancel()
            self.engine.cancel_watch(watch)
        self.watches.clear()

    def _send(self, payload: bytes) -> None:
        """Write a reply that does not wait its turn (a blocked reserve's)."""
        if self.transport is not None:
            self.transport.write(payload)

    # -- the connection ends -------------------------------------------------------

    def stop(self) -> None:
        """The server is stopping: a blocked reserve is answered nil now, as if
        its timeout had run out, rather than cut off; a wait is not (a nil is a
        timeout): left unanswered, its client's retry sends it again to the
        server's next run."""
        for waiter, (_, msgid) in list(self.waiters.items()):
            self._reserve_timed_out(waiter, msgid)
        self._drop_watches()

    def drop(self) -> None:
        """The connection is gone: every blocked call leaves the engine's lines,
        unanswered."""
        for waiter, (timer, _) in self.waiters.items():
            timer.cancel()
            self.engine.cancel_wait(waiter)
        self.waiters.clear()
        self._drop_watches()
        self.transport = None


def reserve_params(params: list[Any]) -> tuple[Any, float]:
    """``reserve``'s params checked: its topics (as sent; ``try_reserve`` checks each)
    and its timeout in seconds. Raises ``bad_request`` naming what is wrong."""
    topics, timeout = validate.params("reserve", params, "topics", "timeout", optional=1)
    timeout_s = checks.number(
        "timeout", 0 if timeout is None else timeout, high=MAX_RESERVE_TIMEOUT_S
    )
    if type(topics) is list and len(topics) > MAX_RESERVE_TOPICS:
        raise RequestError(
            "bad_request",
            f"reserve may name at most {MAX_RESERVE_TOPICS} topics, got {len(topics)}",
        )
    return topics, timeout_s


def wait_params(params: list[Any]) -> tuple[str, float]:
    """``wait``'s params checked: the task id and the timeout in seconds."""
    task_id, timeout = validate.params("wait", params, "id", "timeout", optional=1)
    timeout_s = checks.number(
        "timeout", 0 if timeout is None else timeout, high=MAX_RESERVE_TIMEOUT_S
    )
    return validate.task_id(task_id), timeout_s
