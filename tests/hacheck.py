"""The high-availability harness: what was asked, what was delivered, what went wrong.

- ``Sink``: an HTTP server on 127.0.0.1 (port 0) that logs every delivery it
  receives (``Delaywheel-Id``, ``Delaywheel-Epoch`` when sent, the attempt,
  the arrival time) and answers ``status`` (200), once ``answering`` is set
  (it is, unless a test clears it to hold attempts in flight).
- ``RequestLog``: runs each client request and logs it as ``ok``, ``error``
  (certainly not applied) or ``unknown`` (sent, reply lost, or the server
  said ``unavailable``: it may have been applied).
- ``LoadGenerator``: a thread adding tasks aimed at the sink (and deleting
  some), through any client with ``Client``'s ``add``/``delete``
  (``ClusterClient`` included), logging every request.
- ``check(requests, deliveries, pending, faults=...)``: the ``Report``:
  lost (an acknowledged add never delivered, not pending, not deleted),
  resurrected (delivered after its delete was acknowledged), early
  (delivered before it was due), duplicates per id (and those no fault
  explains: neither an attempt in flight at it nor an add resent across
  it, nor the next attempt after one its sender logged as failed), and the
  takeover time (the worst lateness of a task first
  delivered after a fault).

Times are ``time.time()`` of this machine: the servers under test run here
too. A task's due time is its add's send time plus its delay, a lower bound
of the server's (which starts the delay on receipt), so "early" never
blames the client's latency on the server; "late" counts from the reply's
time plus the delay, the upper bound, so that it does not either.
"""

from __future__ import annotations

import contextlib
import itertools
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

from delaywheel_client.errors import ConnectionFailed, DelaywheelError, Exists, Unavailable

Outcome = Literal["ok", "error", "unknown"]


@dataclass(frozen=True)
class Delivery:
    task_id: str
    epoch: int | None  # Delaywheel-Epoch; None when the server sent none
    attempt: int
    at_s: float


class _BurstServer(ThreadingHTTPServer):
    """socketserver listens with a backlog of 5. A node taking partitions over
    sends every overdue task at once (24 in a few ms at scenario 4's SIGCONT);
    the connections past the backlog had their SYN dropped, and arrived (and
    were logged) 1.0 s later, at the SYN's retransmission: a delivery sent
    within ``inflight_s`` of a fault's end was logged past it, and its
    duplicate counted unexplained (TcpExtListenOverflows counted the drops)."""

    request_queue_size = 1024


class Sink:
    """Logs every HTTP delivery; ``url`` is the target to give tasks."""

    def __init__(self) -> None:
        self.deliveries: list[Delivery] = []
        self._lock = threading.Lock()
        # Cleared by a test: deliveries are logged on arrival and answered
        # once it is set again (at most 30 s later), in flight meanwhile.
        self.answering = threading.Event()
        self.answering.set()
        self.status = 200  # what each delivery is answered
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                at_s = time.time()
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                epoch = self.headers.get("Delaywheel-Epoch")
                delivery = Delivery(
                    self.headers.get("Delaywheel-Id", ""),
                    int(epoch) if epoch else None,
                    int(self.headers.get("Delaywheel-Attempt") or 0),
                    at_s,
                )
                with sink._lock:
                    sink.deliveries.append(delivery)
                sink.answering.wait(30)
                self.send_response(sink.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass  # one line per delivery would drown the test's output

        self._http = _BurstServer(("127.0.0.1", 0), Handler)
        self.port = self._http.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/deliver"
        self._thread = threading.Thread(target=self._http.serve_forever, daemon=True)
        self._thread.start()

    def received(self) -> list[Delivery]:
        with self._lock:
            return list(self.deliveries)

    def close(self) -> None:
        self._http.shutdown()
        self._http.server_close()
        self._thread.join()


@dataclass(frozen=True)
class Request:
    op: str  # "add" or "delete"
    task_id: str
    sent_s: float
    done_s: float
    outcome: Outcome
    due_s: float | None = None  # add: sent_s + delay
    result: Any = None  # delete: whether the task existed
    detail: str = ""


def outcome_of(exc: BaseException) -> Outcome:
    """``unknown`` when the request may have been applied, ``error`` when it was not."""
    if isinstance(exc, Unavailable):  # with --replicas: written, durability unknown
        return "unknown"
    if isinstance(exc, ConnectionFailed):
        return "unknown" if exc.maybe_applied else "error"
    if isinstance(exc, DelaywheelError):
        return "error"
    return "unknown"  # a timeout or anything else after the send


@dataclass(frozen=True)
class Fault:
    """A fault injected at ``at_s`` whose victim was back (or gone for good) at
    ``until_s``: a kill is an instant, a SIGSTOP lasts until its SIGCONT."""

    at_s: float
    until_s: float | None = None

    @property
    def end_s(self) -> float:
        return self.at_s if self.until_s is None else self.until_s


class RequestLog:
    """Every request a test's clients made, with its outcome."""

    def __init__(self) -> None:
        self.requests: list[Request] = []
        self._lock = threading.Lock()

    def add(self, client: Any, task_id: str, delay_s: float, **fields: Any) -> Outcome:
        def call() -> Any:
            try:
                return client.add("hacheck", {"id": task_id}, id=task_id, delay=delay_s, **fields)
            except Exists:  # a resend of an add that had landed: the task is there
                return "exists"

        return self._log("add", task_id, call, delay_s)

    def delete(self, client: Any, task_id: str) -> Outcome:
        return self._log("delete", task_id, lambda: client.delete(task_id), None)

    def _log(
        self, op: str, task_id: str, call: Callable[[], Any], delay_s: float | None
    ) -> Outcome:
        sent_s = time.time()
        outcome: Outcome = "ok"
        result: Any = None
        detail = ""
        try:
            result = call()
        except Exception as exc:
            outcome, detail = outcome_of(exc), f"{type(exc).__name__}: {exc}"
        due_s = sent_s + delay_s if delay_s is not None else None
        request = Request(op, task_id, sent_s, time.time(), outcome, due_s, result, detail)
        with self._lock:
            self.requests.append(request)
        return outcome

    def snapshot(self) -> list[Request]:
        with self._lock:
            return list(self.requests)


class LoadGenerator:
    """Adds tasks for the sink at ``rate`` per second until ``stop()``; deletes every
    ``delete_every``-th one right after adding it (0: none)."""

    def __init__(
        self,
        client: Any,
        sink: Sink,
        log: RequestLog,
        *,
        rate: float = 50.0,
        delay_s: tuple[float, float] = (0.2, 1.5),
        delete_every: int = 10,
        name: str = "load",
        target_timeout_s: float | None = None,
    ) -> None:
        self.client, self.sink, self.log = client, sink, log
        self.rate, self.delay_s, self.delete_every, self.name = rate, delay_s, delete_every, name
        self.target: dict[str, Any] = {"type": "http", "url": sink.url}
        if target_timeout_s is not None:  # bounds how long a taken-over attempt is held
            self.target["timeout"] = target_timeout_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> LoadGenerator:
        self._thread.start()
        return self

    def _run(self) -> None:
        low, high = self.delay_s
        target = self.target
        for n in itertools.count():
            if self._stop.is_set():
                return
            task_id = f"{self.name}-{n}"
            delay = low + (high - low) * ((n * 7919) % 100) / 100  # spread, reproducible
            self.log.add(self.client, task_id, delay, target=target)
            if self.delete_every and n % self.delete_every == self.delete_every - 1:
                self.log.delete(self.client, task_id)
            self._stop.wait(1 / self.rate)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


@dataclass
class Report:
    lost: list[str] = field(default_factory=list)
    resurrected: list[str] = field(default_factory=list)
    early: list[str] = field(default_factory=list)
    duplicates: dict[str, int] = field(default_factory=dict)  # id -> deliveries (> 1)
    # The duplicates no fault explains: the first delivery came before no
    # fault's end (its attempt cannot have been in flight at a crash or
    # pause), and the add was not resent across one, nor is it the retry of
    # an attempt its sender saw fail (``retried``): none is allowed.
    unexplained: dict[str, int] = field(default_factory=dict)
    # Duplicates whose every delivery but the last is an attempt its sending
    # node logged as failed (the receiver answered after the target's
    # timeout): the next attempt, at-least-once as on one node (docs/delivery.md).
    retried: dict[str, int] = field(default_factory=dict)
    takeover_s: float | None = None  # worst lateness of a first delivery after a fault
    max_late_s: float = 0.0  # worst lateness of any first delivery
    acknowledged: int = 0
    delivered: int = 0
    pending: int = 0

    @property
    def ok(self) -> bool:
        """The scenarios' bar: nothing lost, resurrected or early."""
        return not (self.lost or self.resurrected or self.early)

    def summary(self) -> str:
        takeover = "n/a" if self.takeover_s is None else f"{self.takeover_s:.2f} s"
        return (
            f"{self.acknowledged} acknowledged, {self.delivered} delivered, "
            f"{self.pending} pending: "
            f"{len(self.lost)} lost, {len(self.resurrected)} resurrected, {len(self.early)} early, "
            f"{len(self.duplicates)} duplicated ({len(self.unexplained)} unexplained, "
            f"{len(self.retried)} retried after a failed attempt), "
            f"takeover {takeover}, max late {self.max_late_s:.2f} s"
        )


def check(
    requests: Iterable[Request],
    deliveries: Iterable[Delivery],
    pending: Iterable[str] = (),
    *,
    faults: Sequence[float | Fault] = (),
    failed: Iterable[tuple[str, int]] = (),
    early_margin_s: float = 0.005,
    inflight_s: float = 0.5,
) -> Report:
    """What went wrong. ``pending``: ids the servers still hold at the end.
    ``faults``: when each fault was injected (time.time(); a ``Fault`` for one
    that lasted). ``failed``: the (id, attempt) the servers logged as failed
    (``failed_attempts``). ``inflight_s``: a delivery arriving this soon after a
    delete's reply, or after a fault's end, may have been sent before it, so
    it is neither a resurrection nor an unexplained duplicate."""
    report = Report()
    spans = [f if isinstance(f, Fault) else Fault(f) for f in faults]
    by_id: dict[str, list[Delivery]] = {}
    for delivery in sorted(deliveries, key=lambda d: d.at_s):
        by_id.setdefault(delivery.task_id, []).append(delivery)
    report.delivered = len(by_id)
    pending_ids = set(pending)
    report.pending = len(pending_ids)
    adds: dict[str, Request] = {}
    deletes: dict[str, list[Request]] = {}
    for request in requests:
        if request.op == "add" and request.outcome == "ok":
            adds.setdefault(request.task_id, request)  # the first ok add is the earliest due
        elif request.op == "delete":
            deletes.setdefault(request.task_id, []).append(request)
    report.acknowledged = len(adds)
    first_fault_s = min(f.at_s for f in spans) if spans else None
    for task_id, add in adds.items():
        got = by_id.get(task_id, [])
        tried_delete = any(d.outcome != "error" for d in deletes.get(task_id, []))
        if not got and task_id not in pending_ids and not tried_delete:
            report.lost.append(task_id)
        if not got or add.due_s is None:
            continue
        if got[0].at_s < add.due_s - early_margin_s:
            report.early.append(task_id)
        # Late from the latest the server can have made it due: the reply's time
        # plus the delay, so a client's own retries (to a stopped node, say)
        # are not counted as the server's takeover time.
        late_s = got[0].at_s - (add.done_s + add.due_s - add.sent_s)
        report.max_late_s = max(report.max_late_s, late_s)
        if first_fault_s is not None and got[0].at_s >= first_fault_s:
            report.takeover_s = max(report.takeover_s or 0.0, late_s)
    for task_id, tried in deletes.items():
        acknowledged = [d.done_s for d in tried if d.outcome == "ok" and d.result]
        if acknowledged and any(
            d.at_s > min(acknowledged) + inflight_s for d in by_id.get(task_id, [])
        ):
            report.resurrected.append(task_id)
    counts = Counter(d.task_id for d in itertools.chain.from_iterable(by_id.values()))
    report.duplicates = {task_id: n for task_id, n in counts.items() if n > 1}
    failed_attempts = set(failed)
    report.retried = {
        task_id: n
        for task_id, n in report.duplicates.items()
        if _retried(by_id[task_id], failed_attempts)
    }
    report.unexplained = {
        task_id: n
        for task_id, n in report.duplicates.items()
        if task_id not in report.retried
        and not any(
            _in_flight_at(by_id[task_id], f, inflight_s)
            or _resent_across(adds.get(task_id), by_id[task_id], f, inflight_s)
            for f in spans
        )
    }
    return report


def _retried(got: list[Delivery], failed: set[tuple[str, int]]) -> bool:
    """Whether a duplicate's deliveries are attempts of their own, each before
    the last one its sender saw fail: the receiver had it, but its answer
    came after the target's timeout (or was lost), so the next attempt went
    (docs/delivery.md, "an answer lost on the way back"). Not an attempt sent
    again under its own number: that is a resend, which only a fault explains."""
    attempts = [d.attempt for d in got]
    return len(set(attempts)) == len(attempts) and all(
        (d.task_id, d.attempt) in failed for d in got[:-1]
    )


# A server's line for an attempt that failed (delivery/dispatcher.py).
FAILED_ATTEMPT = re.compile(r"delaywheel\.delivery\.dispatcher: task '([^']+)' attempt (\d+) to ")


def failed_attempts(log_lines: Iterable[str]) -> set[tuple[str, int]]:
    """The (id, attempt) a server's log says failed, for ``check``'s ``failed``."""
    return {
        (found.group(1), int(found.group(2)))
        for line in log_lines
        if (found := FAILED_ATTEMPT.search(line)) and " failed: " in line
    }


def _in_flight_at(got: list[Delivery], fault: Fault, inflight_s: float) -> bool:
    """Whether a duplicate's deliveries straddle ``fault``: the first came before
    its end (the attempt may have been in flight), a later one after its start."""
    return got[0].at_s <= fault.end_s + inflight_s and got[-1].at_s >= fault.at_s


def _resent_across(
    add: Request | None, got: list[Delivery], fault: Fault, inflight_s: float
) -> bool:
    """Whether a duplicate comes of the client resending its add across ``fault``
    (a ``ClusterClient`` resends an add whose outcome is unknown): the add was
    sent before the fault ended and answered only after the first delivery.
    A server delivers nothing before its add is durable, so an earlier send
    had landed; the resend, arriving once that task was delivered and gone,
    made it anew."""
    return add is not None and add.sent_s <= fault.end_s + inflight_s and got[0].at_s < add.done_s


@contextlib.contextmanager
def sink() -> Any:
    """A ``Sink`` for the length of a ``with``."""
    running = Sink()
    try:
        yield running
    finally:
        running.close()
