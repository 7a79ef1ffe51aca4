"""A task, its states, and the one table of legal transitions.

A task lives in exactly one place, chosen by its state: ``delayed`` and
``reserved`` tasks sit in the wheel (at their due time and their TTR deadline),
``ready`` tasks in their topic's ready queue, ``dead`` tasks in their topic's
dead list, ``delivering`` tasks (an HTTP or broker target's attempt in flight)
in the task table's ``delivering``. A dead task's ``deadline_s`` is when it
died (0: not known); with ``--dead-retention`` it is in the wheel too, at the
time it goes. ``done`` tasks (acked or
delivered, and kept for their ``retain`` seconds) sit in the wheel too, at
the time they go (``deadline_s``). ``new`` and ``gone`` are the pseudo-states
before ``add`` and after ``ack``/``delete`` (or a ``done`` task's time
running out): such a task is nowhere. The
task table (``delaywheel.engine.table``) keeps every task in its place.

A task with a ``target`` (HTTP, a broker) never becomes ``ready``: when due it
is ``delivering``, and the attempt's outcome makes it ``gone`` or ``done`` (delivered),
``delayed`` again (its next try) or ``dead``.

The body is kept packed (MessagePack bytes): it is packed anyway to check its
size and to journal it, and most tasks are never read before they are due.
The store record of a task, its codec, is ``delaywheel.engine.record``.
"""

from __future__ import annotations

import sys
from operator import attrgetter
from typing import Any

import msgpack  # type: ignore[import-untyped, unused-ignore]

from delaywheel.errors import RequestError
from delaywheel.wheel import Entry, TimingWheel

NEW = "new"
DELAYED = "delayed"
READY = "ready"
RESERVED = "reserved"
DELIVERING = "delivering"
DEAD = "dead"
DONE = "done"
GONE = "gone"

# A task's priority (docs/protocol.md): 0 is the most urgent; beanstalkd's
# range and default, so its users keep their numbers.
DEFAULT_PRIORITY = 1024
MAX_PRIORITY = 2**31 - 1

# The order is part of the store format (a record's state code is the index
# here): add new states at the end, never reorder.
STATES = (DELAYED, READY, RESERVED, DELIVERING, DEAD, DONE)
# The states whose tasks wait in the wheel (at ``timer_s``).
IN_WHEEL = frozenset({DELAYED, RESERVED, DONE})
# The states a ``wait`` answers at: the task will not run again by itself.
FINAL = frozenset({DONE, DEAD, GONE})

# (state, event) -> the states the event may lead to. The engine picks one
# (a release with no delay goes to ready, a TTR expiry on the last attempt to
# dead, ...); anything not in this table is an illegal transition.
TRANSITIONS: dict[tuple[str, str], frozenset[str]] = {
    (NEW, "add"): frozenset({DELAYED, READY}),
    (DELAYED, "due"): frozenset({READY}),
    (READY, "reserve"): frozenset({RESERVED, GONE}),  # gone: ttr == 0, at-most-once
    (RESERVED, "ack"): frozenset({GONE, DONE}),  # done: kept for its retain seconds
    (RESERVED, "release"): frozenset({DELAYED, READY, DEAD}),
    (RESERVED, "expire"): frozenset({READY, DEAD}),
    (RESERVED, "touch"): frozenset({RESERVED}),
    (DELAYED, "deliver"): frozenset({DELIVERING}),  # a targeted task fell due
    (DELIVERING, "delivered"): frozenset({GONE, DONE}),
    (DONE, "lapse"): frozenset({GONE}),  # its retain seconds are over
    (DEAD, "lapse"): frozenset({GONE}),  # --dead-retention after it died
    (DELIVERING, "fail"): frozenset({DELAYED, DEAD}),  # its next try, or no tries left
    (DEAD, "kick"): frozenset({READY, DELAYED}),  # delayed: a targeted task, due now
    (DELAYED, "update"): frozenset({DELAYED, READY}),
    (READY, "update"): frozenset({DELAYED, READY}),
    (DEAD, "update"): frozenset({DELAYED, READY, DEAD}),
    **{(state, "delete"): frozenset({GONE}) for state in STATES},
}


# The fields a request can change, state first (the journal's undo reads it).
CHANGEABLE = (
    "state",
    "topic",
    "at_s",
    "body_packed",
    "ttr_s",
    "max_attempts",
    "attempts",
    "deadline_s",
    "target",
    "last_error",
    "completion",
    "priority",
)
_snapshot = attrgetter(*CHANGEABLE)


class TransitionError(RequestError):
    """An event that the task's state does not allow: a ``conflict``."""

    def __init__(self, task_id: str, state: str, event: str) -> None:
        super().__init__("conflict", f"cannot {event} task {task_id!r}: it is {state}")
        self.state = state
        self.event = event


def check_transition(task_id: str, state: str, event: str, to: str) -> None:
    allowed = TRANSITIONS.get((state, event))
    if allowed is None:
        raise TransitionError(task_id, state, event)
    if to not in allowed:  # the engine's own bug, not the client's
        raise AssertionError(f"{event} may not take task {task_id!r} from {state} to {to}")


class Completion:
    """What a task holds about its completion: how long it is kept once done
    (``retain_s``; None: the topic's), and once completed, when, how
    (``outcome``: ``acked``, ``HTTP 200``, ``published``) and what it
    returned (``result_packed``: MessagePack, or None). Most tasks have
    none: one slot of None, not four. Never changed in place (the undo of a
    failed write puts the old object back)."""

    __slots__ = ("completed_s", "outcome", "result_packed", "retain_s")

    def __init__(
        self,
        retain_s: float | None,
        completed_s: float = 0.0,
        outcome: str | None = None,
        result_packed: bytes | None = None,
    ) -> None:
        self.retain_s = retain_s
        self.completed_s = completed_s
        self.outcome = outcome
        self.result_packed = result_packed


class Task(Entry):
    """One task. ``due_s`` (from Entry) is its wheel timer while it has one."""

    __slots__ = (
        "at_s",
        "attempts",
        "body_packed",
        "completion",
        "created_s",
        "deadline_s",
        "id",
        "last_error",
        "max_attempts",
        "priority",
        "queue_seq",
        "seq",
        "state",
        "target",
        "topic",
        "ttr_s",
    )

    def __init__(
        self,
        task_id: str,
        topic: str,
        at_s: float,
        body_packed: bytes,
        ttr_s: float,
        max_attempts: int,
        created_s: float,
        target: dict[str, Any] | None = None,
        completion: Completion | None = None,
        priority: int = DEFAULT_PRIORITY,
        attempts: int = 0,
        state: str = NEW,
        deadline_s: float = 0.0,
    ) -> None:
        # Entry's own fields, set here rather than through super().__init__():
        # this runs once per add, and the call costs as much as the rest.
        self._home = None
        self.due_s = 0.0
        self.id = task_id
        self.topic = sys.intern(topic)
        self.at_s = at_s
        self.body_packed = body_packed
        self.ttr_s = ttr_s
        self.max_attempts = max_attempts
        self.created_s = created_s
        self.attempts = attempts
        self.state = state
        self.deadline_s = deadline_s
        self.target = target  # None: the ready queue (most tasks; no dict each)
        self.priority = priority
        self.last_error: str | None = None  # why the last delivery attempt failed
        self.completion = completion  # None: no retain given, not completed
        self.seq = 0  # creation order, for list paging
        self.queue_seq = -1  # ready-queue membership ticket; -1 when not queued

    def snapshot(self) -> tuple[Any, ...]:
        """Every field a request can change (``CHANGEABLE``, state first), for
        undo after a failed store write."""
        return _snapshot(self)

    def restore_fields(self, snap: tuple[Any, ...]) -> None:
        for name, value in zip(CHANGEABLE, snap, strict=True):
            setattr(self, name, value)

    @property
    def timer_s(self) -> float:
        """When the wheel should next look at this task (one in ``IN_WHEEL``):
        a reservation's deadline, when a done task goes, or the due time."""
        return self.at_s if self.state == DELAYED else self.deadline_s


_QUEUE_TARGET = {"type": "queue"}


def place_of(task: Task, wheel: TimingWheel) -> tuple[int | None, int | None]:
    """``(cycle, slot)`` as the protocol reports them: a scheduled task's place in
    the wheel, the cursor for a ready one, nothing for a dead or done one. A delayed
    task out of the wheel until its add is durable (``TaskTable.move``) is
    placed where its time puts it."""
    state = task.state
    if task.scheduled and state != DONE and state != DEAD:  # those two: when they go
        return wheel.place(task)
    if state == DELAYED:
        return wheel.place_at(task.at_s)
    if state in (READY, RESERVED):
        return 0, wheel.cursor_slot
    return None, None


def describe(task: Task, wheel: TimingWheel) -> dict[str, Any]:
    """The task as the protocol returns it (``get``, ``list``, ``reserve``...)."""
    cycle, slot = place_of(task, wheel)
    info: dict[str, Any] = {
        "id": task.id,
        "topic": task.topic,
        "state": task.state,
        "at": task.at_s,
        "body": msgpack.unpackb(task.body_packed, raw=False, strict_map_key=False),
        "ttr": task.ttr_s,
        "max_attempts": task.max_attempts,
        "attempts": task.attempts,
        "priority": task.priority,
        "created": task.created_s,
        "target": _QUEUE_TARGET if task.target is None else task.target,
        "cycle": cycle,
        "slot": slot,
    }
    if task.state == RESERVED:
        info["deadline"] = task.deadline_s
    if task.last_error is not None:
        info["last_error"] = task.last_error
    done = task.completion
    if done is not None:
        if done.retain_s is not None:
            info["retain"] = done.retain_s
        if done.outcome is not None:
            info["completed"] = done.completed_s
            info["outcome"] = done.outcome
            info["result"] = (
                None
                if done.result_packed is None
                else msgpack.unpackb(done.result_packed, raw=False, strict_map_key=False)
            )
    return info
