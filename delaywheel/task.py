"""The task record, its states, and the one table of legal transitions.

A task lives in exactly one place, chosen by its state: ``delayed`` and
``reserved`` tasks sit in the wheel (at their due time and their TTR deadline),
``ready`` tasks in their topic's ready queue, ``dead`` tasks in their topic's
dead list. ``new`` and ``gone`` are the pseudo-states before ``add`` and after
``ack``/``delete``: such a task is nowhere.

The body is kept packed (MessagePack bytes): it is packed anyway to check its
size and to journal it, and most tasks are never read before they are due.
"""

from __future__ import annotations

import math
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
GONE = "gone"

STATES = (DELAYED, READY, RESERVED, DELIVERING, DEAD)
# The states whose tasks wait in the wheel (at ``timer_s``).
IN_WHEEL = frozenset({DELAYED, RESERVED})

# (state, event) -> the states the event may lead to. The engine picks one
# (a release with no delay goes to ready, a TTR expiry on the last attempt to
# dead, ...); anything not in this table is an illegal transition.
TRANSITIONS: dict[tuple[str, str], frozenset[str]] = {
    (NEW, "add"): frozenset({DELAYED, READY}),
    (DELAYED, "due"): frozenset({READY}),
    (READY, "reserve"): frozenset({RESERVED, GONE}),  # gone: ttr == 0, at-most-once
    (RESERVED, "ack"): frozenset({GONE}),
    (RESERVED, "release"): frozenset({DELAYED, READY, DEAD}),
    (RESERVED, "expire"): frozenset({READY, DEAD}),
    (RESERVED, "touch"): frozenset({RESERVED}),
    (DEAD, "kick"): frozenset({READY}),
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


class Task(Entry):
    """One task. ``due_s`` (from Entry) is its wheel timer while it has one."""

    __slots__ = (
        "at_s",
        "attempts",
        "body_packed",
        "created_s",
        "deadline_s",
        "id",
        "max_attempts",
        "queue_seq",
        "seq",
        "state",
        "topic",
        "ttr_s",
    )

    def __init__(
        self,
        task_id: str,
        topic: str,
        at_s: float,
        *,
        body_packed: bytes,
        ttr_s: float,
        max_attempts: int,
        created_s: float,
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
        """When the wheel should next look at this task (one in ``IN_WHEEL``)."""
        return self.deadline_s if self.state == RESERVED else self.at_s

    # -- the store record --------------------------------------------------

    def to_record(self) -> bytes:
        """The journal record: every field needed to rebuild the task."""
        return msgpack.packb(  # type: ignore[no-any-return]
            (
                RECORD_VERSION,
                self.id,
                self.topic,
                self.state,
                self.at_s,
                self.created_s,
                self.attempts,
                self.ttr_s,
                self.max_attempts,
                self.deadline_s,
                self.body_packed,
            ),
            use_bin_type=True,
        )

    @classmethod
    def from_record(cls, record: bytes) -> Task:
        """Rebuild a task from ``to_record()``; raises ValueError when corrupt.

        This runs once per task at start-up (a million times for a million
        tasks), so it builds the object directly instead of through
        ``__init__``, and checks each field's type so that a corrupt record
        is refused here rather than failing later inside the wheel.
        """
        try:
            (
                version,
                task_id,
                topic,
                state,
                at_s,
                created_s,
                attempts,
                ttr_s,
                max_attempts,
                deadline_s,
                body_packed,
            ) = _unpack_record(record)
        except Exception as exc:  # msgpack raises several types for bad bytes
            raise ValueError(f"unreadable record: {exc}") from exc
        known_state = _STATE_NAMED.get(state) if type(state) is str else None
        if version != RECORD_VERSION or known_state is None:
            raise ValueError(f"unknown record version {version!r} or state {state!r}")
        if not (
            type(task_id) is str
            and type(topic) is str
            and type(at_s) is float
            and type(deadline_s) is float
            and type(body_packed) is bytes
            and type(attempts) is int
            and type(max_attempts) is int
            and type(ttr_s) in _NUMBERS
            and type(created_s) in _NUMBERS
        ):
            raise ValueError("a field has the wrong type")
        if not (_isfinite(at_s) and _isfinite(deadline_s)):
            raise ValueError(f"a time is not finite: at {at_s!r}, deadline {deadline_s!r}")
        task = cls.__new__(cls)
        task._home = None
        task.due_s = 0.0
        task.id = task_id
        task.topic = _intern(topic)
        task.state = known_state
        task.at_s = at_s
        task.created_s = created_s
        task.attempts = attempts
        task.ttr_s = ttr_s
        task.max_attempts = max_attempts
        task.deadline_s = deadline_s
        task.body_packed = body_packed
        task.seq = 0
        task.queue_seq = -1
        return task


_NUMBERS = (int, float)
_intern = sys.intern
_isfinite = math.isfinite
# Each state's own string object: a loaded task then shares the constant
# instead of holding its own copy of the name (a million copies at start-up).
_STATE_NAMED = {state: state for state in STATES}


def _unpack_record(record: bytes) -> tuple[Any, ...]:
    # raw=False (str for MessagePack strings) is msgpack 1.x's default; spelling it
    # out costs a twentieth of the call.
    return msgpack.unpackb(record, use_list=False)  # type: ignore[no-any-return]


# A tuple rather than a map: a record is written on every change, and the
# field names would double its size. Bump the version when the layout changes.
RECORD_VERSION = 1


_QUEUE_TARGET = {"type": "queue"}


def place_of(task: Task, wheel: TimingWheel) -> tuple[int | None, int | None]:
    """``(cycle, slot)`` as the protocol reports them: a scheduled task's place in
    the wheel, the cursor for a ready one, nothing for a dead one."""
    if task.scheduled:
        return wheel.place(task)
    if task.state in (READY, RESERVED):
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
        "created": task.created_s,
        "target": _QUEUE_TARGET,
        "cycle": cycle,
        "slot": slot,
    }
    if task.state == RESERVED:
        info["deadline"] = task.deadline_s
    return info
