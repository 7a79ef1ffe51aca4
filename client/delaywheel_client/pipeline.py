"""Pipelines: calls queued, then sent in one write and answered together.

``QueuedCalls`` holds what every pipeline shares: the methods of the clients
(commands.py), each queuing its call, and the turning of replies into results.
``Client.pipeline()``, ``AsyncClient.pipeline()`` and the cluster clients'
add the sending.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from delaywheel_client.commands import NO_WAIT_S, Queuing, Shape
from delaywheel_client.errors import DelaywheelError, error_from_reply
from delaywheel_client.protocol import Response
from delaywheel_client.serve import serve


@serve
class QueuedCalls(Queuing):
    """The queuing half of a pipeline: every method queues a call and returns None. Its
    docstring is the client method's: what it says is returned is the call's result in
    ``execute()``'s list."""

    def __init__(self, timeout_s: float) -> None:
        self._base_timeout_s = timeout_s
        self._timeout_s = timeout_s  # the longest reply wait any queued call needs
        self._calls: list[tuple[str, Sequence[Any]]] = []
        self.results: list[Any] = []

    def __len__(self) -> int:
        return len(self._calls)

    def _take(self) -> tuple[list[tuple[str, Sequence[Any]]], float]:
        """The queued calls and their reply timeout; the queue starts afresh."""
        calls, self._calls = self._calls, []
        timeout_s, self._timeout_s = self._timeout_s, self._base_timeout_s
        return calls, timeout_s

    def _collect(self, replies: Iterable[Response], raise_on_error: bool) -> list[Any]:
        errors: list[DelaywheelError] = []

        def failed(error: Any) -> DelaywheelError:
            exc = error_from_reply(error)
            errors.append(exc)
            return exc

        # One comprehension over the (msgid, error, result) tuples: the per-reply cost
        # of every pipeline (docs/performance.md).
        results = [result if error is None else failed(error) for _, error, result in replies]
        self.results = results
        if raise_on_error and errors:
            raise errors[0]
        return results

    def _settled(self, results: list[Any], raise_on_error: bool) -> list[Any]:
        """Results already made (a cluster pipeline's: values, or the ``DelaywheelError``
        of each call that failed) kept as ``results``; the first error raised if asked."""
        self.results = results
        errors = [result for result in results if isinstance(result, DelaywheelError)]
        if raise_on_error and errors:
            raise errors[0]
        return results

    def _send(
        self, method: str, params: Sequence[Any], wait_s: float = NO_WAIT_S, shape: Shape = None
    ) -> None:
        """Queue the call; its result comes from ``execute`` as the server sent it."""
        if wait_s is not NO_WAIT_S:  # a reserve's: the replies may take that much longer
            self._timeout_s = max(self._timeout_s, wait_s + self._base_timeout_s)
        self._calls.append((method, params))
