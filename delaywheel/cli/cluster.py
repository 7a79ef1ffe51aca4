"""``delaywheel cluster``: the partition map of the keyspace, as any node answers it.

Text: one line about the keyspace, a table with each partition's owner (node, address,
epoch; ``-`` while it has none), then one row per node with how many partitions it
owns. ``--json`` prints the ``cluster`` result as the server sent it
(docs/protocol.md, "Several nodes: partitions").
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import click

from delaywheel.cli.env import Env, client_command
from delaywheel.cli.output import plural, seconds_text, table


@click.command()
@client_command
def cluster(env: Env) -> None:
    """Show the partition map: each partition's owner node, address and epoch, and how
    many partitions each node owns (any node answers for the whole keyspace)."""
    result = env.client().cluster()
    env.emit(result, lambda: cluster_text(result))


def cluster_text(result: dict[str, Any]) -> str:
    owners = [entry for entry in result.get("owners") or () if isinstance(entry, dict)]
    lease_s = result.get("lease_s")
    lease = f"lease {seconds_text(lease_s)}" if isinstance(lease_s, (int, float)) else "no lease"
    lines = [
        f"{plural(result.get('partitions'), 'partition')}, {lease}, "
        f"as node {_cell(result.get('node'))} sees it"
    ]
    rows = [
        (
            str(e.get("partition")),
            _cell(e.get("node")),
            _cell(e.get("address")),
            _cell(e.get("epoch")),
        )
        for e in owners
    ]
    lines += ["", table(("PARTITION", "NODE", "ADDRESS", "EPOCH"), rows), ""]
    owned = Counter((e.get("node"), e.get("address")) for e in owners)
    per_node = [
        (_cell(node), _cell(address), str(count))
        for (node, address), count in sorted(owned.items(), key=_by_node)
    ]
    lines.append(table(("NODE", "ADDRESS", "OWNED"), per_node))
    return "\n".join(lines)


def _cell(value: Any) -> str:
    return "-" if value is None else str(value)


def _by_node(item: tuple[tuple[Any, Any], int]) -> tuple[bool, str]:
    (node, _), _count = item
    return node is None, str(node)  # the unowned row last
