"""A connection's replies in request order: those free to go, and the line of
those waiting for a store write.

A reply to a mutating request waits in the line until the store write that
holds its change returns (group commit, engine/journal.py); the replies behind
it wait too, so replies leave in request order. ``ReplyLine`` keeps that
order and nothing else: it is told each reply and what it waits for
(``queue``), asks the journal to be told when writes are done, and hands out
the bytes that may go now (``take``). Writing them, and reading less while
too much waits (the connection's backpressure), is the connection's
(net/connection.py).

Why a line of groups, and the callbacks it registers, are below: the line is
on every request's path, and each choice was measured (docs/performance.md,
"Measurements behind the code").
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from functools import partial
from operator import attrgetter
from typing import TYPE_CHECKING, cast

from delaywheel.engine.batches import Wait
from delaywheel.engine.journal import Journal
from delaywheel.store.base import StoreError, reply_for

if TYPE_CHECKING:
    from delaywheel_client.protocol import Encoder

    from delaywheel.net.routes import Method


class Durable:
    """What a reply that waits for no write waits for, in a list of waits."""

    __slots__ = ()
    finished = True
    error: StoreError | None = None


DURABLE = Durable()
# Read in C over a group's waits (``take``), not a line of Python per reply.
_finished = attrgetter("finished")
_error = attrgetter("error")


class Replies:
    """Replies next to each other in the connection's line: their payloads in
    request order, and each one's msgid and method, which a failed write needs
    to answer it with its error and count it against its method. ``wait`` is
    the store write (a journal ``Batch`` or ``Joint``) they all wait for, while
    they wait for one (None: none); ``waits`` is each one's, once they differ on a store of lanes
    (a Redis keyspace's partitions are lanes of their own, and consecutive
    requests mostly touch different ones).

    A group rather than an object per reply: a pipeline's replies mostly wait
    for one batch, so the line is emptied a group at a time, and only its
    head is looked at when a write is done (docs/performance.md,
    "Measurements behind the code"). A group whose replies wait for different
    writes leaves the line a prefix at a time: a reply goes once its own write
    and every one before it are done, whatever the later ones wait for."""

    __slots__ = ("msgids", "payloads", "routes", "size", "wait", "waits")

    def __init__(self, wait: Wait | None) -> None:
        self.wait = wait
        self.waits: list[Wait | Durable] | None = None
        self.size = 0  # bytes of its payloads
        self.payloads: list[bytes] = []
        self.msgids: list[int] = []
        self.routes: list[Method] = []  # the method each answers: a failed write counts against it


class ReplyLine:
    """One connection's replies, in request order: ``ready`` (bytes free to go
    now) then ``groups``, the line of those waiting for a store write and all
    behind them (``Replies``). ``queued`` counts the replies in the line,
    ``line_bytes`` their bytes; ``turn_bytes`` the bytes of the replies made
    this turn (the connection resets it at a turn's start)."""

    __slots__ = (
        "encoder",
        "groups",
        "inline",
        "journal",
        "lanes",
        "line_bytes",
        "listening",
        "queued",
        "ready",
        "rearm",
        "turn_bytes",
        "waiting_on",
        "wake",
    )

    def __init__(self, journal: Journal, encoder: Encoder, rearm: Callable[[], None]) -> None:
        self.journal = journal
        self.encoder = encoder
        # A failed write's rollback may have put back an earlier timer: the
        # tick driver looks again (the server's rearm).
        self.rearm = rearm
        # Called when a write the line waits on is done: the connection's
        # flush while it is connected (``attach``), None before and after. Not
        # given when built: the connection holds the line, so the line holds
        # the connection only while the transport does, and a connection that
        # never connected (a failed TLS handshake) is freed without the collector.
        self.wake: Callable[[], None] | None = None
        self.ready: list[bytes] = []
        self.groups: deque[Replies] = deque()
        self.queued = 0
        self.line_bytes = 0
        self.turn_bytes = 0
        # The last write we registered a callback on (most replies wait on the one
        # before theirs: no set to look in), and every one whose callback has
        # not run yet, each registered once.
        self.waiting_on: Wait | None = None
        # On a store of lanes: whether we wait to be told of the next store answer.
        self.listening = False
        # One lane (memory, SQLite): batches only move forward, so a batch
        # other than ``waiting_on`` is always a new one: no set to keep.
        self.lanes = journal.lanes > 1
        # An inline store (memory) has written every change of a turn when the
        # turn ends (``Journal.release``), and the connection's last flush of
        # the turn sends their replies: no callback to register on a write.
        self.inline = journal.inline

    def attach(self, wake: Callable[[], None]) -> None:
        """The connection is connected: call ``wake`` when a write is done."""
        self.wake = wake

    def detach(self) -> None:
        """The connection is gone: a write done later still settles its replies
        (a failure counted against its method), and nothing is written."""
        self.wake = None

    def queue(self, msgid: int, payload: bytes, wait: Wait | None, route: Method) -> None:
        """The reply ``payload`` to ``msgid``, free to go once ``wait`` is done
        (None: at once) and every reply before it has gone."""
        groups = self.groups
        size = len(payload)
        self.turn_bytes += size
        if not groups:
            if wait is None:  # nothing to wait for, nothing ahead of it
                self.ready.append(payload)
                return
            group = Replies(wait)
            groups.append(group)
        else:
            group = groups[-1]
            waits = group.waits
            if waits is not None:
                waits.append(DURABLE if wait is None else wait)
            elif group.wait is not wait:
                if self.lanes:  # from here on, each reply's own
                    waits = group.waits = [cast(Wait, group.wait)] * len(group.payloads)
                    waits.append(DURABLE if wait is None else wait)
                else:  # one lane: the next batch's replies, a group of their own
                    group = Replies(wait)
                    groups.append(group)
        if wait is not None and not self.inline:
            if self.lanes:  # told once a store answer has settled writes
                if not self.listening:
                    self.listening = True
                    self.journal.on_settled(self._settled)
            elif wait is not self.waiting_on:
                self.waiting_on = wait
                wait.add_callback(partial(self._write_done, wait))
        group.payloads.append(payload)
        group.msgids.append(msgid)
        group.routes.append(route)
        group.size += size
        self.line_bytes += size
        self.queued += 1

    def take(self) -> bytes | None:
        """The replies free to go now, as one write (None: none): the ready ones
        and those at the head of the line whose writes are done."""
        groups, ready = self.groups, self.ready
        while groups:
            group = groups[0]
            waits = group.waits
            if waits is None:
                wait = group.wait
                if wait is not None:
                    if not wait.finished:
                        break
                    if wait.error is not None:
                        self._failed(group, 0, len(group.payloads), wait.error)
            elif all(map(_finished, waits)):  # one store answer settles every lane: commonest
                if any(map(_error, waits)):
                    for i, each in enumerate(waits):
                        if each.error is not None:
                            self._failed(group, i, i + 1, each.error)
            else:
                self._take_prefix(group, waits)
                break
            groups.popleft()
            ready += group.payloads
            self.queued -= len(group.payloads)
            self.line_bytes -= group.size
        if not ready:
            return None
        data = ready[0] if len(ready) == 1 else b"".join(ready)
        ready.clear()
        return data

    def _take_prefix(self, group: Replies, waits: list[Wait | Durable]) -> None:
        """The head group's replies wait for different writes and some are not
        done: those before the first not done leave; the rest stay at the head."""
        done = 0
        for each in waits:
            if not each.finished:
                break
            if each.error is not None:
                self._failed(group, done, done + 1, each.error)
            done += 1
        left = group.payloads[:done]
        self.ready += left
        self.queued -= done
        size = sum(map(len, left))
        group.size -= size
        self.line_bytes -= size
        del group.payloads[:done], group.msgids[:done], group.routes[:done], waits[:done]

    def _failed(self, group: Replies, first: int, end: int, error: StoreError) -> None:
        """The replies ``first:end`` of ``group`` get the error of their write."""
        if self.inline:  # no callback rearms for us (_write_done, _settled do otherwise)
            self.rearm()  # the rollback may have put back an earlier timer
        code, data = reply_for(error)
        message, encode = str(error), self.encoder.error_response
        for i in range(first, end):
            payload = encode(group.msgids[i], code, message, data)
            grown = len(payload) - len(group.payloads[i])  # the line's bytes stay exact
            group.payloads[i] = payload
            group.size += grown
            self.line_bytes += grown
            group.routes[i].failed(code)

    def _settled(self, failed: bool) -> None:
        """A store answer has settled writes (on a store of lanes; on one lane,
        ``_write_done``: the write the line waited on): the replies at the head
        of the line whose writes are done go; on a store of lanes, if some still
        wait, we are told again after the next answer. The lanes' path (a Redis
        keyspace's) takes no call more than this one."""
        self.listening = False
        if failed:  # the rollback may have put back an earlier timer
            self.rearm()
        wake = self.wake
        if wake is not None:
            wake()
        else:  # the connection is gone: settle, send nothing
            self.take()
        if self.lanes and self.groups and not self.listening:
            self.listening = True
            self.journal.on_settled(self._settled)

    def _write_done(self, wait: Wait, error: StoreError | None) -> None:
        if wait is self.waiting_on:
            self.waiting_on = None  # not to keep a finished batch's tasks alive
        self._settled(error is not None)
