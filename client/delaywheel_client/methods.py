"""The protocol's methods, written once.

For each method: its params by name, in order, and how many trailing ones may
be left out; whether it is read-only (it changes nothing, so sending it again
after its reply was lost is harmless: the clients retry only these); and
whether a connection may send it before ``auth``. The server builds its router
and its auth check from this table (delaywheel/net/routes.py), the clients
their retry rule; each method's client method is defined once, in commands.py.
docs/protocol.md lists the same methods for users, and
tests/test_method_surface.py holds the page, the server and the clients to it.

This module imports nothing, so the server can use it without the rest of the
client.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final


@dataclasses.dataclass(frozen=True)
class MethodSpec:
    name: str
    params: tuple[str, ...]
    optional: int = 0  # how many of the trailing params may be left out
    read_only: bool = False
    before_auth: bool = False


_SPECS = (
    MethodSpec("ping", (), read_only=True, before_auth=True),
    MethodSpec("auth", ("token",), read_only=True, before_auth=True),
    MethodSpec("add", ("task",)),
    MethodSpec("add_many", ("tasks",)),
    MethodSpec("update", ("id", "changes")),
    MethodSpec("delete", ("id",)),
    MethodSpec("get", ("id",), read_only=True),
    MethodSpec("list", ("query",), optional=1, read_only=True),
    MethodSpec("reserve", ("topics", "timeout"), optional=1),
    MethodSpec("ack", ("id",)),
    MethodSpec("release", ("id", "delay"), optional=1),
    MethodSpec("touch", ("id",)),
    MethodSpec("kick", ("topic", "count")),
    MethodSpec("kick_task", ("id",)),
    MethodSpec("stats", (), read_only=True),
    MethodSpec("cluster", (), read_only=True),
    MethodSpec("schedule_add", ("schedule",)),
    MethodSpec("schedule_update", ("id", "changes", "expected_version"), optional=1),
    MethodSpec("schedule_pause", ("id", "note"), optional=1),
    MethodSpec("schedule_resume", ("id",)),
    MethodSpec("schedule_delete", ("id",)),
    MethodSpec("schedule_get", ("id",), read_only=True),
    MethodSpec("schedule_list", ("query",), optional=1, read_only=True),
    MethodSpec("schedule_next", ("schedule", "n"), optional=1, read_only=True),
    MethodSpec("schedule_trigger", ("id",)),
    MethodSpec("schedule_backfill", ("id", "start", "end")),
)

# Every method by name, in docs/protocol.md's order.
METHODS: Final[Mapping[str, MethodSpec]] = MappingProxyType({spec.name: spec for spec in _SPECS})

READ_ONLY_METHODS: Final = frozenset(spec.name for spec in _SPECS if spec.read_only)
OPEN_METHODS: Final = frozenset(spec.name for spec in _SPECS if spec.before_auth)

# The table's methods that the clients (commands.py) spell another way; every
# other method is a method of each client under its own name (and ``call(name, *params)``
# sends any of them as it is). None: no such method. ``auth`` is sent by the client
# itself, first on each new connection, when it was given ``token=``: a pool of
# connections cannot be authenticated by one call.
CLIENT_SPELLINGS: Final[Mapping[str, str | None]] = MappingProxyType({"auth": None})
