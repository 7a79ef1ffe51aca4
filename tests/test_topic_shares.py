"""A node's share of a topic's limits (delaywheel/engine/shares.py), pure: split
by the partitions each node serves, the sums never over the topic's."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from delaywheel.engine.shares import ALONE, Basis, Gate, gate_of, seats
from delaywheel.engine.topics import TopicSettings

LIMITED = TopicSettings(paused_until=5.0, rate=10.0, burst=4, concurrency=3)


def basis(node: str, partitions: int, **counts: int) -> Basis:
    return Basis(node, partitions, tuple(sorted(counts.items())))


def test_a_single_node_applies_the_settings_whole() -> None:
    assert gate_of("t", LIMITED, ALONE) == Gate(5.0, 10.0, 4, 3)
    assert gate_of("t", LIMITED, basis("a", 16, a=16)) == Gate(5.0, 10.0, 4, 3)


def test_two_nodes_of_eight_partitions_split_each_limit() -> None:
    a, b = (gate_of("t", LIMITED, basis(n, 16, a=8, b=8)) for n in "ab")
    assert (a.rate, b.rate) == (5.0, 5.0)
    assert (a.burst, b.burst) == (2, 2)
    assert sorted([a.concurrency, b.concurrency]) == [1, 2]  # type: ignore[type-var]
    assert a.paused_until == b.paused_until == 5.0  # a pause holds everywhere


def test_the_odd_seats_follow_the_largest_remainder_then_the_topic() -> None:
    counts = {"a": 6, "b": 5, "c": 5}
    # 10 * 6/16 = 3.75, 3.125, 3.125: three each, the one left to a.
    assert seats("t", 10, basis("a", 16, **counts)) == {"a": 4, "b": 3, "c": 3}
    # 2 * 5/16 = .625 each, 2 * 6/16 = .75: a first, then one of b and c by the
    # topic: different topics put it on different nodes.
    chosen = {n for t in range(20) for n, k in seats(f"t{t}", 2, basis("a", 16, **counts)).items()}
    assert "a" in chosen and chosen & {"b", "c"} and len(chosen) == 3


def test_each_node_has_a_seat_when_the_limit_has_enough() -> None:
    # 3 * 1/16 rounds to nothing: the node with most gives one up.
    assert seats("t", 3, basis("a", 16, a=15, b=1)) == {"a": 2, "b": 1}
    # Fewer seats than nodes: the sum stays the limit, one node has none.
    assert sorted(seats("t", 1, basis("a", 16, a=8, b=8)).values()) == [0, 1]
    # A burst smaller than one task lets nothing out: each node has one.
    assert seats("t", 1, basis("a", 16, a=8, b=8), at_least_one=True) == {"a": 1, "b": 1}


def test_unowned_partitions_hold_their_share_back() -> None:
    gates = [gate_of("t", LIMITED, basis(n, 16, a=7, b=8)) for n in "ab"]
    assert sum(g.rate for g in gates if g.rate) == 10.0 * 15 / 16
    assert sum(g.concurrency or 0 for g in gates) == 2  # 3 * 15/16, rounded down
    lonely = gate_of("t", LIMITED, basis("c", 16, a=8, b=8))  # a node serving nothing
    assert (lonely.rate, lonely.concurrency) == (0.0, 0)


@given(
    counts=st.lists(st.integers(0, 40), min_size=1, max_size=6),
    spare=st.integers(0, 10),
    concurrency=st.integers(1, 50),
    burst=st.integers(1, 50),
    topic=st.text(min_size=1, max_size=5),
)
def test_the_nodes_shares_never_add_up_past_the_limit(
    counts: list[int], spare: int, concurrency: int, burst: int, topic: str
) -> None:
    by_node = {f"n{i}": k for i, k in enumerate(counts)}
    partitions = sum(counts) + spare or 1
    settings = TopicSettings(rate=7.0, burst=burst, concurrency=concurrency)
    gates = [gate_of(topic, settings, basis(n, partitions, **by_node)) for n in by_node]
    serving = [g for g, k in zip(gates, counts, strict=True) if k]
    assert sum(g.rate or 0.0 for g in gates) <= 7.0 + 1e-9
    assert sum(g.concurrency or 0 for g in gates) <= concurrency
    assert sum(g.burst for g in serving) <= max(burst, len(serving))
    if concurrency >= len(serving) and not spare:
        assert all(g.concurrency for g in serving)
