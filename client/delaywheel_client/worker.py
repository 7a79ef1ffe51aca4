"""Run registered handlers on reserved tasks: ack on success, release with backoff on failure.

The loop: one ``reserve`` across every registered topic (waiting up to
``reserve_timeout_s``), the topic's handler called with the task map, then ``ack`` (with
what the handler returned as the ack's ``result``, when not None); when the
handler raises, the error is logged and the task released with a delay of
``retry_base_s * 2**(attempts - 1)``, capped at ``retry_cap_s``. The server moves a task
that has used its ``max_attempts`` to ``dead`` (``kick`` revives it). A lost connection is
logged and retried with backoff, and so are ``Unavailable`` (the server's store is down) and
``Internal``; only errors a retry cannot fix (a wrong token, say) end ``run()``.

Delivery is at least once: a task whose handler outlives its ``ttr``, or whose ack is lost
with the connection, is delivered again. Make handlers idempotent, or ``touch`` long work.
"""

from __future__ import annotations

import logging
import shlex
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any, TypeVar

from delaywheel_client.client import Client
from delaywheel_client.cluster import ClusterClient
from delaywheel_client.errors import ConnectionFailed, DelaywheelError, Internal, Unavailable

log = logging.getLogger(__name__)

Handler = Callable[[dict[str, Any]], object]
F = TypeVar("F", bound=Handler)

# Backoff while the server cannot be reached: 0.1 s doubling to 10 s.
RECONNECT_BASE_S = 0.1
RECONNECT_CAP_S = 10.0
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Worker:
    """Consume tasks with one handler per topic.

    Example::

        worker = Worker(Client("127.0.0.1", 3450))  # or Worker(ClusterClient([...]))

        @worker.handler("emails")
        def send_email(task: dict) -> None:
            smtp_send(**task["body"])  # return: acked (a value: its result); raise: released

        worker.run()  # until SIGINT/SIGTERM or worker.stop()

    ``run()`` returns the number of tasks handled. In the main thread it stops cleanly on
    SIGINT or SIGTERM, finishing the task in hand (a second SIGINT interrupts at once);
    from another thread, ``stop()`` does the same.
    """

    def __init__(
        self,
        client: Client | ClusterClient,
        *,
        reserve_timeout_s: float = 1.0,
        retry_base_s: float = 1.0,
        retry_cap_s: float = 3600.0,
    ) -> None:
        self.client = client
        self.reserve_timeout_s = reserve_timeout_s
        self.retry_base_s = retry_base_s
        self.retry_cap_s = retry_cap_s
        self._handlers: dict[str, Handler] = {}
        self._stop = threading.Event()

    def handler(self, topic: str) -> Callable[[F], F]:
        """Decorator: ``@worker.handler("emails")`` registers the function for a topic."""

        def register(fn: F) -> F:
            self.register(topic, fn)
            return fn

        return register

    def register(self, topic: str, fn: Handler) -> None:
        """Handle ``topic``'s tasks with ``fn(task)``; replaces an earlier handler."""
        self._handlers[topic] = fn

    def retry_delay_s(self, attempts: int) -> float:
        """The release delay after a task's ``attempts``-th delivery failed."""
        exponent = min(max(attempts - 1, 0), 64)  # 2**64 s is past any cap
        return float(min(self.retry_base_s * 2**exponent, self.retry_cap_s))

    def stop(self) -> None:
        """Ask ``run()`` to return after the task in hand; safe from any thread."""
        self._stop.set()

    def run(self, *, max_tasks: int | None = None) -> int:
        """Handle tasks until ``stop()``, a stop signal or ``max_tasks``; returns how many."""
        if not self._handlers:
            raise ValueError("no handlers registered: use @worker.handler(topic) first")
        topics = list(self._handlers)
        restore = self._install_signal_handlers()
        handled = 0
        failures = 0
        try:
            while not self._stop.is_set() and (max_tasks is None or handled < max_tasks):
                try:
                    task = self.client.reserve(topics, self.reserve_timeout_s)
                except (ConnectionFailed, Unavailable, Internal) as exc:
                    delay_s = min(RECONNECT_BASE_S * 2 ** min(failures, 16), RECONNECT_CAP_S)
                    failures += 1
                    log.warning("reserve failed (%s); retrying in %.1f s", exc, delay_s)
                    self._stop.wait(delay_s)
                    continue
                failures = 0
                if task is not None:
                    self._handle(task)
                    handled += 1
        finally:
            restore()
            self._stop.clear()
        return handled

    def _handle(self, task: dict[str, Any]) -> None:
        task_id, topic = task["id"], task["topic"]
        try:
            result = self._handlers[topic](task)
        except Exception:
            attempts = int(task.get("attempts") or 1)
            max_attempts = task.get("max_attempts")
            if isinstance(max_attempts, int) and attempts >= max_attempts:
                # The server makes it dead on this release: no retry is coming.
                delay_s = 0.0
                log.exception(
                    "task %r of topic %r failed on its last attempt (%d of %d): it is now dead;"
                    " `delaywheel kick %s` (or client.kick(%r)) makes it due again",
                    *(task_id, topic, attempts, max_attempts, shlex.quote(topic), topic),
                )
            else:
                delay_s = self.retry_delay_s(attempts)
                log.exception(
                    "task %r of topic %r failed on attempt %d of %s; releasing it for %.3g s",
                    *(task_id, topic, attempts, max_attempts or "?", delay_s),
                )
            self._settle("release", task_id, lambda: self.client.release(task_id, delay_s))
        else:
            # What the handler returned is the task's result (kept with a retained task).
            self._settle("ack", task_id, lambda: self.client.ack(task_id, result))

    def _settle(self, what: str, task_id: str, call: Callable[[], object]) -> None:
        try:
            call()
        except DelaywheelError as exc:
            # Conflict/NotFound: the ttr ran out or the task was deleted meanwhile; a lost
            # connection: the server delivers the task again when its ttr runs out.
            log.warning("%s of task %r failed: %s", what, task_id, exc)

    def _install_signal_handlers(self) -> Callable[[], None]:
        if threading.current_thread() is not threading.main_thread():
            return lambda: None
        previous = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}

        def on_signal(signum: int, frame: FrameType | None) -> None:
            if self._stop.is_set() and signum == signal.SIGINT:
                raise KeyboardInterrupt
            log.info("%s: stopping after the task in hand", signal.Signals(signum).name)
            self.stop()

        for signum in STOP_SIGNALS:
            signal.signal(signum, on_signal)

        def restore() -> None:
            for signum, handler in previous.items():
                # None: a handler installed outside Python, which cannot be put back.
                signal.signal(signum, signal.SIG_DFL if handler is None else handler)

        return restore


__all__ = ["Worker"]
