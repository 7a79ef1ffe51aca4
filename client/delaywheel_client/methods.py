"""The protocol's methods, written once, as the server and the clients' retry rule read them.

Each method is defined once, in commands.py: its params by name (and how many trailing
ones may be left out), whether it is read-only (it changes nothing, so sending it again
after its reply was lost is harmless: the clients retry only these) and whether a
connection may send it before ``auth``, beside the client method that stands for it. This
module is the table built from those definitions: the server builds its router and its
auth check from it (delaywheel/net/routes.py), the clients their retry rule.
docs/protocol.md lists the same methods for users, and tests/test_method_surface.py holds
the page, the server and the clients to it.

It imports commands.py and calls.py alone (pure Python, no I/O), so the server can use it
without the rest of the client.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from delaywheel_client.commands import SPECS, MethodSpec

# Every method by name, in docs/protocol.md's order.
METHODS: Final[Mapping[str, MethodSpec]] = MappingProxyType({spec.name: spec for spec in SPECS})

READ_ONLY_METHODS: Final = frozenset(spec.name for spec in SPECS if spec.read_only)
OPEN_METHODS: Final = frozenset(spec.name for spec in SPECS if spec.before_auth)

# The table's methods that the clients (commands.py) spell another way; every
# other method is a method of each client under its own name (and ``call(name, *params)``
# sends any of them as it is). None: no such method. ``auth`` is sent by the client
# itself, first on each new connection, when it was given ``token=``: a pool of
# connections cannot be authenticated by one call.
CLIENT_SPELLINGS: Final[Mapping[str, str | None]] = MappingProxyType({"auth": None})

__all__ = [
    "CLIENT_SPELLINGS",
    "METHODS",
    "OPEN_METHODS",
    "READ_ONLY_METHODS",
    "MethodSpec",
]
