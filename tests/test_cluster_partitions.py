"""Partitions and rendezvous assignment (delaywheel/cluster), without Redis:
the hash every client must share, the key layout, and how partitions move
over nodes."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from delaywheel.cluster.membership import assignment, first_choice, plan, ranking
from delaywheel.cluster.partitions import Layout, PartitionsError, partition_of


def crc32_by_the_book(data: bytes) -> int:
    """CRC-32 (reflected, polynomial 0xEDB88320), bit by bit: zlib's, computed apart."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0xEDB88320 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def test_the_hash_is_crc32_of_the_utf8_id() -> None:
    # 0xCBF43926 is CRC-32's published check value, for "123456789".
    assert partition_of("123456789", 2**32) == 0xCBF43926
    assert partition_of("123456789", 16) == 0xCBF43926 % 16 == 6
    for task_id in ("order-42", "café", "01J9Z3ZK6Q", "", "日本語"):
        expected = crc32_by_the_book(task_id.encode("utf-8"))
        assert partition_of(task_id, 16) == expected % 16
        assert partition_of(task_id, 1000) == expected % 1000


@given(st.text(max_size=40), st.integers(1, 5000))
def test_every_id_lands_in_a_partition(task_id: str, partitions: int) -> None:
    p = partition_of(task_id, partitions)
    assert 0 <= p < partitions
    if not task_id.startswith("s:"):
        assert p == crc32_by_the_book(task_id.encode("utf-8")) % partitions


@pytest.mark.parametrize(
    ("task_id", "hashed"),
    [
        ("s:a:b:123", "a:b"),  # the schedule id runs to the last colon
        ("s:daily:1767571200", "daily"),
        ("s:fast:1767571200.25", "fast"),  # a fractional every's occurrence
        ("s:x:", "s:x:"),  # no digits: the whole id
        ("s:x:12a", "s:x:12a"),
        ("s:x:1.", "s:x:1."),
        ("s:x:١٢٣", "s:x:١٢٣"),  # ASCII digits only
        ("x:s:1", "x:s:1"),
        ("s:1", "s:1"),
    ],
)
def test_an_occurrence_hashes_its_schedule_id(task_id: str, hashed: str) -> None:
    for partitions in (16, 1000, 2**32):
        expected = crc32_by_the_book(hashed.encode("utf-8")) % partitions
        assert partition_of(task_id, partitions) == expected


@given(st.text(max_size=30), st.integers(0, 2**40), st.integers(1, 5000))
def test_a_schedule_and_its_occurrences_share_a_partition(
    schedule_id: str, seconds: int, partitions: int
) -> None:
    occurrence = f"s:{schedule_id}:{seconds}"
    assert partition_of(occurrence, partitions) == partition_of(schedule_id, partitions)


def test_each_partition_keeps_its_keys_under_one_tag() -> None:
    layout = Layout("delaywheel", 16)
    keys = layout.partition(7)
    assert (keys.tasks, keys.epoch, keys.lease) == (
        "{delaywheel:p007}:tasks",
        "{delaywheel:p007}:epoch",
        "{delaywheel:p007}:lease",
    )
    assert layout.meta == "{delaywheel}:meta"
    assert layout.single_node_tasks == "{delaywheel}:tasks"  # today's store's key
    assert Layout("x", 2000).partition(1234).tasks == "{x:p1234}:tasks"
    assert layout.of("123456789") == layout.partition(6)
    assert len({k.tag for k in layout}) == 16


@pytest.mark.parametrize("bad", [0, -1, 16385, 2.5, True, "16"])
def test_a_bad_partition_count_is_named(bad: object) -> None:
    with pytest.raises(PartitionsError, match=repr(bad).replace("(", r"\(")):
        Layout("delaywheel", bad)  # type: ignore[arg-type]


def test_a_bad_prefix_or_partition_is_named() -> None:
    with pytest.raises(PartitionsError, match=re.escape("'a{b'")):
        Layout("a{b", 16)
    with pytest.raises(
        PartitionsError, match=re.escape("partition 16: this keyspace has partitions 0..15")
    ):
        Layout("delaywheel", 16).partition(16)


NODES = [f"node-{i}" for i in range(5)]


def _loads(owners: dict[int, str], nodes: list[str]) -> list[int]:
    return [list(owners.values()).count(node) for node in nodes]


@pytest.mark.parametrize("partitions", [16, 64])
def test_each_live_node_owns_p_over_n_rounded_down_or_up(partitions: int) -> None:
    """Plain rendezvous gave two nodes 5 and 11 of 16 (issue 29)."""
    for count in range(1, 9):
        nodes = [f"node-{i}" for i in range(count)]
        fresh = assignment(nodes, partitions)
        assert sorted(fresh) == list(range(partitions))
        low = partitions // count
        assert set(_loads(fresh, nodes)) <= {low, low + (partitions % count > 0)}, count
        # From any owners at all (another balance, a gone node's), balanced too.
        skewed = assignment(nodes, partitions, dict.fromkeys(range(partitions), "node-0"))
        assert set(_loads(skewed, nodes)) <= {low, low + (partitions % count > 0)}, count


@pytest.mark.parametrize("partitions", [16, 64])
def test_a_join_or_a_leave_moves_no_more_than_it_must(partitions: int) -> None:
    """Growing 1 -> 9 nodes and shrinking back, each step from the owners the
    last one left: a join moves only what the new node takes, its P // N (the
    fewest a balanced assignment can), a leave only the leaver's: 27 and 115
    partitions over the eight joins with P 16 and 64, 32 and 120 over the
    eight leaves (the oldest node leaving each time, with a larger share).
    Plain rendezvous moved 26 and 108 joining (less than a share at some
    joins: it left the nodes unbalanced) and 33 and 123 leaving."""
    owners: dict[int, str] = {}
    nodes: list[str] = []
    moved_total = left_total = 0
    for count in range(1, 10):
        nodes.append(f"node-{count}")
        after = assignment(nodes, partitions, owners)
        moved = {p for p in owners if after[p] != owners[p]}
        assert all(after[p] == nodes[-1] for p in moved)  # nothing moves between the others
        if owners:
            assert len(moved) == partitions // count
        moved_total += len(moved)
        owners = after
    while len(nodes) > 1:
        gone = nodes.pop(0)
        left = {p: node for p, node in owners.items() if node != gone}
        after = assignment(nodes, partitions, left)
        assert all(after[p] == node for p, node in left.items())  # only the leaver's move
        left_total += partitions - len(left)
        owners = after
    assert moved_total == sum(partitions // count for count in range(2, 10))
    assert left_total == {16: 32, 64: 120}[partitions]  # each time the leaver's own


def test_the_assignment_is_the_same_whatever_the_order() -> None:
    for p in range(50):
        assert ranking(p, NODES) == ranking(p, list(reversed(NODES)))
        assert first_choice(p, NODES) == ranking(p, NODES)[0]
    assert first_choice(3, []) is None
    assert assignment([], 16) == {}
    assert assignment(NODES, 16) == assignment(list(reversed(NODES)), 16)


names = st.lists(st.text("abcdefgh0123456789-", min_size=1, max_size=8), unique=True)


@settings(max_examples=100)
@given(names.filter(lambda n: len(n) >= 1), st.text("xyz", min_size=1, max_size=6))
def test_a_joining_node_takes_only_its_share(nodes: list[str], new: str) -> None:
    before = assignment(nodes, 64)
    after = assignment([*nodes, new], 64, before)
    for p in range(64):
        assert after[p] in (before[p], new)  # nothing moves between the old nodes
    assert list(after.values()).count(new) == 64 // (len(nodes) + 1)


@settings(max_examples=100)
@given(names.filter(lambda n: len(n) >= 2), st.data())
def test_a_leaving_node_gives_up_only_its_own(nodes: list[str], data: st.DataObject) -> None:
    gone = data.draw(st.sampled_from(nodes))
    before = assignment(nodes, 64)
    after = assignment([n for n in nodes if n != gone], 64, before)
    for p in range(64):
        if before[p] != gone:
            assert after[p] == before[p]


def test_plan_claims_free_firsts_and_hands_back_to_live_firsts() -> None:
    three = ["a", "b", "c"]
    first = assignment(three, 32)
    mine = {p for p, n in first.items() if n == "a"}
    # Alone, "a" claims everything free; the others are not registered yet.
    alone = plan("a", [], 32, {})
    assert alone.claim == frozenset(range(32)) and not alone.hand_back
    # Holding everything while b and c register: hand back exactly theirs.
    held_all = plan("a", ["b", "c"], 32, dict.fromkeys(range(32), "a"))
    kept = assignment(three, 32, dict.fromkeys(range(32), "a"))
    assert held_all.hand_back == frozenset(p for p in range(32) if kept[p] != "a")
    assert len(held_all.hand_back) == 32 - 11  # "a" owns the most: a larger share, 11
    assert not held_all.claim
    # A partition held by someone else is neither claimed nor handed back.
    others = plan("a", ["b", "c"], 32, dict.fromkeys(range(32), "b"))
    assert not others.claim and not others.hand_back
    # Free partitions: only those assigned to "a" among the live.
    free = plan("a", ["a", "b", "c"], 32, {})
    assert free.claim == frozenset(mine)
    # "a" keeps its share even when its own registration lapsed.
    lapsed = plan("a", ["b"], 32, dict.fromkeys(range(32), "a"))
    keeps = assignment(["a", "b"], 32, dict.fromkeys(range(32), "a"))
    assert lapsed.hand_back == frozenset(p for p in range(32) if keeps[p] == "b")
    assert len(lapsed.hand_back) == 16


def test_plan_never_claims_a_partition_it_still_holds() -> None:
    # Every lease key deleted under a node serving all 8 (HA scenario 5): the
    # free ones it holds are not claimed (loaded a second time, fired twice)
    # until the keeper has dropped them.
    gone = plan("a", ["a"], 8, {}, held={0, 1, 2, 3, 4, 5, 6, 7})
    assert not gone.claim and not gone.hand_back
    some = plan("a", ["a"], 8, {}, held={2, 5})
    assert some.claim == frozenset({0, 1, 3, 4, 6, 7})
