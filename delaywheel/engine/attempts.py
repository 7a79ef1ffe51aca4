"""Delivery attempts of targeted tasks: journaled first, sent once durable, outcomes journaled.

A task with an HTTP or broker target is not made ready when due. The wheel
fires it into the task table's ``waiting`` (``due``): still ``delayed``, out of the wheel,
queued by the dispatcher in its destination's lane. Only when the lane has
room does the dispatcher ask for the attempt (``begin``): that is a journaled
change (``delivering``, ``attempts`` counted), and once the record is durable
the dispatcher gets the ``Delivery`` to send. So a burst of 20,000 due at
once costs the wheel a dict entry each, not 20,000 journaled attempts of
which 64 can be in flight; an attempt is counted only when it starts; no
delivery starts before its ``add`` is durable (the attempt's batch comes
after it); and a crash during an attempt leaves the task ``delivering`` in
the store, where loading finds it: it is sent again with the same attempt
number (``start``). The dispatcher reports the outcome (``outcome``): the
task is removed, or goes back to ``delayed`` at its next try
(``RetryPolicy``, ``delaywheel.engine.retry``), or to ``dead`` after ``max_attempts``.

An attempt is sent once, while its owner keeps the partition (docs/ha.md,
"Duplicates"). A write of it that the store took without confirming it
(``Unconfirmed``: too few replicas) is kept, and the task's record is
journaled again (``TaskTable.confirm``) a retry base later, and so on until
a write of it is confirmed: the attempt is sent only then. An outcome the
store did not take at all is undone by the journal (the task is
``delivering`` again, in memory as in the store), and that same outcome is
journaled again a retry base later: never a new attempt, which would send
the task a second time. These wait in ``held`` (``release_held``), a retry
base apart, so that the journal drains between them (a handoff, a stop).

Every change goes through the task table's ``move`` (``delaywheel.engine.table``),
so the transition table, the counts and the journal see it as any other.
"""

from __future__ import annotations

import heapq
import itertools
import logging
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from delaywheel.delivery.base import Delivery
from delaywheel.delivery.brokers import CONNECT_TIMEOUT_S, SEND_TIMEOUT_S
from delaywheel.delivery.targets import destination
from delaywheel.engine.retry import (
    RetryPolicy as RetryPolicy,  # re-exported: app.py imports it here
)
from delaywheel.engine.task import DEAD, DELAYED, DELIVERING, GONE, Task
from delaywheel.store.base import StoreError, Unconfirmed

if TYPE_CHECKING:
    from delaywheel.engine.table import TaskTable

log = logging.getLogger("delaywheel.delivery")

# The dispatcher's queue(task_id, target, priority): a due task for its
# destination's lane.
Queue = Callable[[str, dict[str, Any], int], None]
# Called once per begun attempt: the Delivery to send, or None (not to be sent).
# It answers whether the send began (not once the dispatcher is closed).
Ready = Callable[["Delivery | None"], bool]
# A delivered attempt's answer: its outcome (``HTTP 200``, ``published``) and
# the result kept with the task when it is retained (packed), or None.
Answer = tuple[str, "bytes | None"]


class Attempts:
    def __init__(self, table: TaskTable, retry: RetryPolicy, result_bytes: int = 0) -> None:
        self._table = table
        self.retry = retry
        # How much of a receiver's answer a kept task holds as its result.
        self._result_bytes = result_bytes
        self._queue: Queue | None = None  # the dispatcher's, from start()
        # Loaded delivering tasks queued to be sent again as they are, by id. The
        # task itself, not its id alone: a partition dropped and loaded again
        # holds another Task of that id, maybe not delivering any more (its
        # attempt failed at another owner meanwhile), which must begin anew.
        self._resume: dict[str, Task] = {}
        # Attempts taken over from another node whose deadline has not passed:
        # (deadline_s, n, task, None, False), sent again once it has
        # (``release_held``). n orders equal deadlines: a partition lost and
        # taken again adopts the same task twice (as two objects), and Tasks
        # do not compare. And writes to journal again (the module docstring):
        # (when_s, n, task, what to do then, whether the attempt was sent here).
        self.held: list[tuple[float, int, Task, _Again | None, bool]] = []
        self._held_count = itertools.count()
        # Attempts handed to the dispatcher whose outcome has not come yet (their
        # send is in flight here), by id: a handoff waits for these to end, not
        # for their outcomes' writes, which may fail for as long as the store does.
        self._sending: dict[str, Task] = {}
        self.deaths = 0  # tasks dead after their last attempt, once durable (for metrics)
        # Due tasks of topics whose gate is shut (engine/flow.py), by topic: a
        # heap of (priority, due time, n, task), most urgent first. And the
        # tasks let through the gate to the dispatcher whose attempt has not
        # begun: counted in their topic's flight meanwhile.
        self.gated: dict[str, list[tuple[int, float, int, Task]]] = {}
        self._let_through: dict[str, str] = {}  # task id: topic
        self._gated_count = itertools.count()

    def start(self, queue: Queue) -> None:
        """Queue every due task with ``queue(task_id, target)`` from now on,
        starting with those loaded from the store: attempts a crash or a stop
        interrupted (sent again as they are) and tasks due already."""
        self._queue = queue
        for task in list(self._table.delivering.values()):
            self._resend(task)
        for task in list(self._table.waiting.values()):
            self._through_gate(task)

    def adopt(self, tasks: list[Task], now_s: float) -> None:
        """Delivering tasks loaded while serving (a partition taken over): their
        attempts are in the store already and are sent again, as at a start,
        but not before their deadline (``begin``): until then the previous
        owner, if it is only paused, may still be sending."""
        for task in tasks:
            if task.deadline_s > now_s:
                self._hold(task.deadline_s, task, None, sent=False)
            else:
                self._resend(task)

    def sending(self, tasks: list[Task]) -> list[Task]:
        """Those of ``tasks`` whose attempt is being sent from here now: handed to
        the dispatcher, its outcome not in yet. Not an attempt held by ``adopt``
        (nothing of it is sent until its deadline, and a node taking it over
        holds it to the same one), nor one whose send has ended and whose
        outcome's write failed (it is ``delivering`` again, but nothing is in
        flight: waiting for it cannot help while the store refuses writes)."""
        sending = self._sending
        return [task for task in tasks if sending.get(task.id) is task]

    def _hold(self, when_s: float, task: Task, again: _Again | None, *, sent: bool) -> None:
        heapq.heappush(self.held, (when_s, next(self._held_count), task, again, sent))

    def held_until_s(self) -> float | None:
        """When the first of ``held`` is due: an attempt held by ``adopt`` to be
        sent again, or a write to journal again."""
        return self.held[0][0] if self.held else None

    def release_held(self, now_s: float) -> None:
        """Send again the taken-over attempts whose deadline has passed, and
        journal again the outcomes due to be, unless their tasks are gone since
        (deleted, or their partition dropped again)."""
        held = self.held
        while held and held[0][0] <= now_s:
            _, _, task, again, _ = heapq.heappop(held)
            if again is not None:
                again()  # it looks whether it still applies
            elif self._table.delivering.get(task.id) is task:
                self._resend(task)

    def forget(self, leaving: Callable[[str], bool]) -> None:
        """Forget the attempts to resend of tasks dropped from the table (their
        partition is another node's): ``begin`` would not send them anyway."""
        delivering = self._table.delivering
        for found in (self._resume, self._sending):
            for task_id, task in list(found.items()):
                if leaving(task_id) and delivering.get(task_id) is not task:
                    del found[task_id]

    def due(self, task: Task) -> None:
        """The wheel fired a targeted task: it waits for its destination's turn."""
        self._table.wait_for_lane(task)
        self._through_gate(task)

    def _through_gate(self, task: Task) -> None:
        """A due task to its destination's lane, unless its topic's gate is
        shut (engine/flow.py): then it waits in ``gated``, still delayed."""
        flow = self._table.flow
        if self._queue is None or not flow.limited or task.topic not in flow.limited:
            self._enqueue(task)  # (not started: start() queues every waiting task)
            return
        entry = (task.priority, task.at_s, next(self._gated_count), task)
        heapq.heappush(self.gated.setdefault(task.topic, []), entry)
        self.release_gated(self._table.wheel.now_s)

    def release_gated(self, now_s: float) -> None:
        """Let through the gated tasks whose topic's gate is open, most urgent
        first, each taking its topic's slot and token."""
        flow, waiting = self._table.flow, self._table.waiting
        for topic in list(self.gated):
            line = self.gated[topic]
            while line and flow.is_open(topic, now_s):
                task = heapq.heappop(line)[3]
                if waiting.get(task.id) is not task:
                    continue  # deleted or changed since: not due here any more
                if task.id not in self._let_through:  # (queued twice: begun once)
                    flow.starting(topic, 1)
                    self._let_through[task.id] = topic
                flow.took(topic, now_s)
                self._enqueue(task)
            if not line:
                del self.gated[topic]

    def _resend(self, task: Task) -> None:
        """A loaded attempt, in the store already: to be sent again as it is."""
        self._resume[task.id] = task
        self._enqueue(task)

    def _enqueue(self, task: Task) -> None:
        if self._queue is not None:
            assert task.target is not None
            self._queue(task.id, task.target, task.priority)

    def begin(self, task_id: str, ready: Ready) -> bool:
        """The destination has room for this task: journal its attempt, and call
        ``ready`` with the ``Delivery`` once that is durable (with None if the
        task is not to be sent after all: deleted meanwhile, or the write
        failed). False, and no call, when it is no longer waiting (deleted,
        changed or begun since it was queued)."""
        through = self._let_through.pop(task_id, None)
        if through is not None:  # its topic's flight counts it as delivering from here on
            self._table.flow.starting(through, -1)
        resumed = self._resume.pop(task_id, None)
        if resumed is not None and self._table.delivering.get(task_id) is resumed:
            self._send(resumed, ready)  # its attempt is in the store already
            return True
        # Otherwise a due task (one resumed before its partition was dropped and
        # loaded again may be due now, its attempt failed at another owner).
        task = self._table.waiting.get(task_id)
        if task is None:
            return False
        deadline_s = self._table.wheel.now_s + attempt_bound_s(task.target)
        self._table.move(
            task, "deliver", DELIVERING, attempts=task.attempts + 1, deadline_s=deadline_s
        )
        batch = self._table.journal.pending()
        assert batch is not None  # move() has just recorded the change
        batch.add_callback(partial(self._durable, task, task.attempts, ready))
        return True

    def _durable(self, task: Task, attempt: int, ready: Ready, error: StoreError | None) -> None:
        table = self._table
        current = task.attempts == attempt and table.delivering.get(task.id) is task
        if error is None:
            if current:  # not deleted (nor its partition dropped) since
                self._send(task, ready)
                return
        elif current and isinstance(error, Unconfirmed):
            # In the store, not confirmed: kept, not sent yet. Its record
            # again a retry base later, until a write of it is confirmed.
            again = partial(self._confirm_attempt, task, attempt, ready)
            self._hold(table.wheel.now_s + self.retry.base_s, task, again, sent=False)
            return
        elif current:
            # Confirming it failed (nothing to undo: the rewrite changed
            # nothing). Never sent: tried again as a new attempt, a retry base on.
            table.defer(task, table.wheel.now_s + self.retry.base_s)
        elif task.state == DELAYED and task.scheduled:
            # Undone (the table's rollback): due again, in the past. Try again
            # after a retry base rather than at once, or a store that fails
            # fast would spin.
            table.retime(task, table.wheel.now_s + self.retry.base_s)
        ready(None)

    def _send(self, task: Task, ready: Ready) -> None:
        """Hand a durable attempt to the dispatcher: being sent from here until
        its outcome comes, unless the dispatcher did not take it (closed by a
        stop), which a handback would otherwise wait out its grace for."""
        self._sending[task.id] = task
        if not ready(self._delivery(task)):
            del self._sending[task.id]

    def _confirm_attempt(self, task: Task, attempt: int, ready: Ready) -> None:
        """Journal an unconfirmed attempt's record again; ``_durable`` sends it
        once that write is confirmed."""
        if task.attempts != attempt or self._table.delivering.get(task.id) is not task:
            ready(None)  # deleted, or its partition dropped, since
            return
        self._table.confirm(task.id)
        self._wait_for_journal(partial(self._durable, task, attempt, ready))

    def _wait_for_journal(self, then: Callable[[StoreError | None], None]) -> None:
        """Call ``then`` with the outcome of the write of what was just recorded."""
        wait = self._table.journal.pending()
        assert wait is not None  # something has just been recorded
        wait.add_callback(then)

    def _delivery(self, task: Task) -> Delivery:
        """The attempt to send: with its partition's epoch here (0 on a
        single-node store), and for a schedule's occurrence, what it is."""
        assert task.target is not None
        table = self._table
        epoch = table.ownership.epoch_of(task.id)
        found = table.occurrence_of(task.id) if task.id.startswith("s:") else None
        keep = self._result_bytes if table.retain_of(task) > 0 else 0
        return Delivery(
            task.id, task.topic, task.attempts, task.at_s, task.body_packed, task.target,
            epoch, found, keep,
        )  # fmt: skip

    def outcome(
        self,
        task_id: str,
        attempt: int,
        error: str | None,
        now_s: float,
        answer: Answer | None = None,
    ) -> None:
        """Attempt ``attempt`` of a task ended: ``error`` None for delivered,
        else why it failed. ``answer``: the receiver's, for a delivered one
        (its outcome, ``HTTP 200`` or ``published``, and its result packed).
        A task deleted during its attempt is gone already."""
        table = self._table
        self._sending.pop(task_id, None)
        task = table.delivering.get(task_id)
        if task is None or task.attempts != attempt:
            return
        if error is None:
            outcome, result_packed = answer if answer is not None else ("delivered", None)
            table.complete(task, "delivered", outcome, result_packed, now_s)
        elif task.attempts >= task.max_attempts:  # its deadline: when it died
            table.move(task, "fail", DEAD, last_error=error, deadline_s=now_s)
        else:
            retry_at_s = now_s + self.retry.delay_s(task.attempts)
            table.move(task, "fail", DELAYED, at_s=retry_at_s, last_error=error, deadline_s=0.0)
        self._wait_for_journal(partial(self._outcome_written, task, attempt, error, answer))
        if self.gated:  # its slot freed: a gated task may go
            self.release_gated(now_s)

    def _outcome_written(
        self,
        task: Task,
        attempt: int,
        sent: str | None,
        answer: Answer | None,
        error: StoreError | None,
    ) -> None:
        """The write of attempt ``attempt``'s outcome (``sent``: outcome's
        ``error``) is done. The attempt was sent: it is never sent again
        while this node keeps the partition (the module docstring).

        - Not taken (undone by the journal: the task is delivering again, in
          memory as in the store): the same outcome, journaled again a retry
          base from now (``release_held``), not a new attempt. While the store
          stays down nothing more is sent; if this node stops or loses the
          partition first, the store's ``delivering`` record is sent again by
          the next owner (docs/ha.md, "Duplicates").
        - Taken, not confirmed (kept): the task's state (its record, or its
          absence) journaled again until a write of it is confirmed, unless a
          later change of the task (a new attempt, a request) is that write.
        - A death is logged once it is durable, so a death the store did not
          take is not."""
        table = self._table
        if error is None:
            if task.state == DEAD and task.attempts == attempt:
                self.deaths += 1
                _log_death(task)  # once it is dead in the store too
            return
        if isinstance(error, Unconfirmed):
            again = partial(self._confirm_outcome, task, attempt, sent, answer)
        elif task.state == DELIVERING and task.attempts == attempt:
            again = partial(self._outcome_again, task, attempt, sent, answer)
        else:
            return
        self._hold(table.wheel.now_s + self.retry.base_s, task, again, sent=True)

    def _outcome_again(
        self, task: Task, attempt: int, sent: str | None, answer: Answer | None
    ) -> None:
        """Journal again an outcome the store did not take (the task is
        delivering again), unless the task is gone from here since."""
        if task.attempts == attempt and self._table.delivering.get(task.id) is task:
            self.outcome(task.id, attempt, sent, self._table.wheel.now_s, answer)

    def _confirm_outcome(
        self, task: Task, attempt: int, sent: str | None, answer: Answer | None
    ) -> None:
        """Journal again the state an unconfirmed outcome left (the task's
        record, or its absence), unless a later change of the task (a new
        attempt, a request, a new task of its id) is written since, or the
        task is gone from here (its partition dropped)."""
        table = self._table
        found = table.index.by_id.get(task.id)
        # Gone, and no new task of its id; its partition still served (a
        # dropped one's tasks are out of the index too, gone or not).
        gone = task.state == GONE and found is None and table.ownership.owns(task.id)
        if gone or (found is task and task.attempts == attempt and task.state != DELIVERING):
            table.confirm(task.id)
            self._wait_for_journal(partial(self._outcome_written, task, attempt, sent, answer))


# A write to journal again, once its time in ``held`` has come.
_Again = Callable[[], None]


def attempt_bound_s(target: dict[str, Any] | None) -> float:
    """How long an attempt to ``target`` can take at most: its deadline, which
    the journal keeps so that a node taking its partition over waits it out."""
    assert target is not None
    if target["type"] == "http":
        return float(target["timeout"])
    return CONNECT_TIMEOUT_S + SEND_TIMEOUT_S


def _log_death(task: Task) -> None:
    """One warning per task that dies: what it was, where it went, why it failed.
    The error comes from the sender, which never puts a URL's query string or
    a broker's password in it; the body and the headers are never shown."""
    assert task.target is not None
    kind, where = task.target["type"], destination(task.target)
    log.warning(
        "task %r (topic %r) is dead after %d %s to %s %s: %s",
        *(task.id, task.topic, task.attempts, "attempt" if task.attempts == 1 else "attempts"),
        *(kind, where, task.last_error),
        extra={
            "task_id": task.id,
            "topic": task.topic,
            "attempts": task.attempts,
            "target_type": kind,
            "destination": where,
            "error": task.last_error,
        },
    )
