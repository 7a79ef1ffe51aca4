"""The task record, its states, and the one table of legal transitions.

A task lives in exactly one place, chosen by its state: ``delayed`` and
``reserved`` tasks sit in the wheel (at their due time and their TTR deadline),
``ready`` tasks in their topic's ready queue, ``dead`` tasks in their topic's
dead list, ``delivering`` tasks (an HTTP or broker target's attempt in flight)
in the engine's set of deliveries. ``new`` and ``gone`` are the pseudo-states
before ``add`` and after ``ack``/``delete``: such a task is nowhere.

A task with a ``target`` (HTTP, a broker) never becomes ``ready``: when due it
is ``delivering``, and the attempt's outcome makes it ``gone`` (delivered),
``delayed`` again (its next try) or ``dead``.

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

# The order is part of the store format (a record's state code is the index
# here): add new states at the end, never reorder.
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
    (DELAYED, "deliver"): frozenset({DELIVERING}),  # a targeted task fell due
    (DELIVERING, "delivered"): frozenset({GONE}),
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
        "last_error",
        "max_attempts",
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
        *,
        body_packed: bytes,
        ttr_s: float,
        max_attempts: int,
        created_s: float,
        attempts: int = 0,
        state: str = NEW,
        deadline_s: float = 0.0,
        target: dict[str, Any] | None = None,
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
        self.last_error: str | None = None  # why the last delivery attempt failed
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
        """The journal record: every field needed to rebuild the task but its
        id, which the store keeps as the record's key."""
        ttr_s = self.ttr_s
        # 60 packs in 1 byte, 60.0 in 9 (and a huge whole float stays a float).
        if type(ttr_s) is float and ttr_s.is_integer() and -_INT_TTR_S < ttr_s < _INT_TTR_S:
            ttr_s = int(ttr_s)
        return _pack_record(  # type: ignore[no-any-return]
            (
                RECORD_VERSION,
                self.topic,
                STATE_CODE[self.state],
                self.at_s,
                self.created_s,
                self.attempts,
                ttr_s,
                self.max_attempts,
                self.deadline_s or 0,  # no reservation: 1 byte, not 9
                self.body_packed,
                self.target,
                self.last_error,
            )
        )

    @classmethod
    def from_record(cls, task_id: str, record: bytes) -> Task:
        """Rebuild task ``task_id`` from its record; raises ValueError when corrupt."""
        return cls.from_fields(task_id, read_record(task_id, record))

    @classmethod
    def from_fields(cls, task_id: str, fields: tuple[Any, ...]) -> Task:
        """Build task ``task_id`` from its record's fields, as ``read_record``
        checked them.

        This runs once per task at start-up (a million times for a million
        tasks), so it builds the object directly instead of through
        ``__init__``.
        """
        (
            _,
            topic,
            state_code,
            at_s,
            created_s,
            attempts,
            ttr_s,
            max_attempts,
            deadline_s,
            body_packed,
            target,
            last_error,
        ) = fields
        task = cls.__new__(cls)
        task._home = None
        task.due_s = 0.0
        task.id = task_id
        task.topic = _intern(topic)
        task.state = STATES[state_code]
        task.at_s = at_s
        task.created_s = created_s
        task.attempts = attempts
        task.ttr_s = float(ttr_s)  # an int in the record when whole
        task.max_attempts = max_attempts
        # Most tasks hold no reservation: they share one 0.0 instead of each
        # keeping its own float (a million of them after a start).
        task.deadline_s = deadline_s or 0.0
        task.body_packed = body_packed
        task.target = target
        task.last_error = last_error
        task.seq = 0
        task.queue_seq = -1
        return task


def read_record(task_id: str, record: bytes) -> tuple[Any, ...]:
    """The fields of task ``task_id``'s record in the current layout (whichever
    version wrote it), each checked; raises ValueError when corrupt.

    Each field's type is checked so that a corrupt record is refused here
    rather than failing later inside the wheel.
    """
    try:
        fields = _unpack_record(record)
    except Exception as exc:  # msgpack raises several types for bad bytes
        raise ValueError(f"unreadable record: {exc}") from exc
    if type(fields) is not tuple:
        raise ValueError(f"not a record: {fields!r:.80}")
    if len(fields) == 11 and fields[0] == 1:
        fields = _fields_of_v1(task_id, fields)
    if len(fields) == 10 and fields[0] in (2, 3):
        fields = (*fields, None, None)  # before v4: a queue task, no error
    try:
        (
            version,
            topic,
            state_code,
            at_s,
            created_s,
            attempts,
            ttr_s,
            max_attempts,
            deadline_s,
            body_packed,
            target,
            last_error,
        ) = fields
    except ValueError:
        raise ValueError(f"a record of {len(fields)} fields, not 12") from None
    if version not in _READ_VERSIONS or type(state_code) is not int:
        raise ValueError(f"unknown record version {version!r} or state {state_code!r}")
    if not 0 <= state_code < len(STATE_CODE):
        raise ValueError(f"unknown state {state_code!r}")
    if not (
        type(topic) is str
        and type(at_s) is float
        and type(deadline_s) in _NUMBERS
        and type(body_packed) is bytes
        and type(attempts) is int
        and type(max_attempts) is int
        and type(ttr_s) in _NUMBERS
        and type(created_s) in _NUMBERS
        and (target is None or (type(target) is dict and type(target.get("type")) is str))
        and (last_error is None or type(last_error) is str)
    ):
        raise ValueError("a field has the wrong type")
    if not (_isfinite(at_s) and _isfinite(deadline_s)):
        raise ValueError(f"a time is not finite: at {at_s!r}, deadline {deadline_s!r}")
    return fields


# A tuple rather than a map: a record is written on every change, and the
# field names would double its size. Bump the version when the layout changes,
# and keep reading the old one.
#   v4: as v3, then the target (nil: the ready queue) and the last delivery
#       error (nil: none); 2 bytes more for a queue task.
#   v3: as v2; ttr and deadline are ints when whole (a record without a
#       reservation is 16 bytes shorter: a tenth of one with a 100-byte body).
#   v2: (2, topic, state code, at, created, attempts, ttr, max_attempts,
#        deadline, body); the state code is its index in STATES.
#   v1: (1, id, topic, state name, at, ...the rest as in v2).
# Version 2 left out the id (the store's key already holds it) and names the
# state by a number: two strings fewer to decode per task, which made loading
# a million tasks about 0.4 s faster.
RECORD_VERSION = 4
_READ_VERSIONS = frozenset({2, 3, 4})  # v2 and v3 read as v4 without its last two fields
_INT_TTR_S = 2.0**32  # a whole ttr below this is written as an int
# One Packer for every record (see validate._pack: a packb per record cost
# 0.82 us against 0.24 us). Records are packed on the event loop's thread.
_pack_record = msgpack.Packer(use_bin_type=True).pack
STATE_CODE = {state: code for code, state in enumerate(STATES)}
# Where read_record's fields hold the topic, the state code and the due time.
TOPIC_FIELD, STATE_FIELD, AT_FIELD = 1, 2, 3
_NUMBERS = (int, float)
_intern = sys.intern
_isfinite = math.isfinite


def _unpack_record(record: bytes) -> Any:
    # raw=False (str for MessagePack strings) is msgpack 1.x's default; spelling it
    # out costs a twentieth of the call.
    return msgpack.unpackb(record, use_list=False)


def _fields_of_v1(task_id: str, fields: tuple[Any, ...]) -> tuple[Any, ...]:
    """A version 1 record's fields in the version 2 layout."""
    _, record_id, topic, state, *rest = fields
    if record_id != task_id:
        raise ValueError(f"record holds id {record_id!r}")
    code = STATE_CODE.get(state) if type(state) is str else None
    if code is None:
        raise ValueError(f"unknown state {state!r}")
    return (RECORD_VERSION, topic, code, *rest, None, None)


_QUEUE_TARGET = {"type": "queue"}


def place_of(task: Task, wheel: TimingWheel) -> tuple[int | None, int | None]:
    """``(cycle, slot)`` as the protocol reports them: a scheduled task's place in
    the wheel, the cursor for a ready one, nothing for a dead one. A delayed
    task out of the wheel until its add is durable (``Engine._move``) is
    placed where its time puts it."""
    if task.scheduled:
        return wheel.place(task)
    if task.state == DELAYED:
        return wheel.place_at(task.at_s)
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
        "target": _QUEUE_TARGET if task.target is None else task.target,
        "cycle": cycle,
        "slot": slot,
    }
    if task.state == RESERVED:
        info["deadline"] = task.deadline_s
    if task.last_error is not None:
        info["last_error"] = task.last_error
    return info
