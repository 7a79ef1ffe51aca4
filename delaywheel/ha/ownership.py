"""Which task ids this node serves: what the engine is given when it is built.

The engine asks one object, whatever the store: whether a request's task is
served here (``check``: ``moved`` or ``tryagain`` if not), an id for an add
without one (``new_id``), the epoch a delivery's headers carry
(``epoch_of``), and which partition an id is in when partitions are dropped.
A node of several gets a ``Sharing`` (ha/sharing.py), which the coordinator
keeps up to date as partitions are gained and lost; a single node gets
``WholeKeyspace``, which owns everything.

``owns_all`` is a plain attribute, True while every partition is served (a
single node always). The engine's hot paths (``add``, and the verbs that
find a task by id) read it before calling ``check`` or ``new_id``: an add on
a single node costs no hash and no call more than before there was HA
(docs/performance.md, "Measurements behind the code").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol


class Ownership(Protocol):
    @property
    def owns_all(self) -> bool:
        """Every partition is served now: no call needed (see above). A plain
        attribute in each kind, read as one."""
        ...

    @property
    def node(self) -> str | None:
        """This node's name among several; None for a single node."""
        ...

    @property
    def partitions(self) -> int:
        """P: how many partitions the keyspace has (1 for a single node)."""
        ...

    def partition_of(self, task_id: str) -> int:
        """The partition of ``task_id``."""
        ...

    def partition_counts(self) -> dict[str, int]:
        """How many partitions each node serves, by name: this node's from what
        it serves now, the others' from the leases last read (a topic's limits
        are split by them: engine/shares.py)."""
        ...

    def owns(self, task_id: str) -> bool:
        """Whether this node serves ``task_id`` now."""
        ...

    def check(self, task_id: str) -> None:
        """Raise ``moved`` or ``tryagain`` unless this node serves ``task_id`` now."""
        ...

    def new_id(self, first: str, more: Callable[[], str]) -> str:
        """``first``, or the first id of ``more()`` that this node serves; a
        ``tryagain`` error when it serves no partition."""
        ...

    def epoch_of(self, task_id: str) -> int:
        """The epoch under which this node serves ``task_id``'s partition, or
        loads it (acquired, not yet served); 0: none."""
        ...

    def stats(self) -> list[dict[str, int]] | None:
        """The ``stats`` reply's ``partitions``: served ones and their epochs."""
        ...

    def cluster_map(self, here: str) -> dict[str, Any]:
        """The ``cluster`` reply; ``here`` is the address this server listens on."""
        ...


class WholeKeyspace:
    """A single node's ownership: every id is served here, in partition 0, epoch 0."""

    def __init__(self) -> None:
        # Instance attributes, not class ones: CPython 3.11 specializes an
        # instance's attribute read, not a class attribute read through one
        # (the hot paths read owns_all on every add).
        self.owns_all = True
        self.node: str | None = None
        self.partitions = 1

    def partition_of(self, task_id: str) -> int:
        return 0

    def partition_counts(self) -> dict[str, int]:
        return {"": 1}

    def owns(self, task_id: str) -> bool:
        return True

    def check(self, task_id: str) -> None:
        return None

    def new_id(self, first: str, more: Callable[[], str]) -> str:
        return first

    def epoch_of(self, task_id: str) -> int:
        return 0

    def stats(self) -> None:
        return None

    def cluster_map(self, here: str) -> dict[str, Any]:
        """One partition, this node's."""
        return {
            "node": here,
            "partitions": 1,
            "lease_s": None,
            "owners": [{"partition": 0, "node": here, "address": here, "epoch": 0}],
        }
