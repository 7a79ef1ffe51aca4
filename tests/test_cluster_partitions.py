"""Partitions and rendezvous assignment (delaywheel/ha), without Redis:
the hash every client must share, the key layout, and how partitions move
over nodes."""

from __future__ import annotations

import itertools
import random
import re
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from delaywheel.ha.assignment import assignment, first_choice, moved, plan, ranking, rebalance
from delaywheel.store.redis.layout import Layout, PartitionsError, partition_of


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
    assert (keys.tasks, keys.epoch, keys.lease, keys.topics) == (
        "{delaywheel:p007}:tasks",
        "{delaywheel:p007}:epoch",
        "{delaywheel:p007}:lease",
        "{delaywheel:p007}:topics",
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
        owners = assignment(nodes, partitions)
        assert sorted(owners) == list(range(partitions))
        low = partitions // count
        assert set(_loads(owners, nodes)) <= {low, low + (partitions % count > 0)}, count


def test_two_nodes_own_8_each_where_plain_rendezvous_gave_5_and_11() -> None:
    nodes = ["a", "b"]
    plain = {p: first_choice(p, nodes) for p in range(16)}
    assert _loads(plain, nodes) == [5, 11]  # the imbalance the balanced assignment ends
    assert _loads(assignment(nodes, 16), nodes) == [8, 8]


Members = list[str]


def _grow_then_shrink(prefix: str) -> list[Members]:
    """Eight joins (1 -> 9 nodes), then eight leaves, the oldest node first."""
    nodes = [f"{prefix}-{i}" for i in range(1, 10)]
    return [nodes[:count] for count in range(1, 10)] + [nodes[gone:] for gone in range(1, 9)]


def _churn(seed: int, steps: int = 16, most: int = 8) -> list[Members]:
    """Random joins and leaves (of any member) between 1 and ``most`` nodes."""
    rng = random.Random(seed)
    live: Members = []
    made, sequence = 0, []
    for _ in range(steps):
        if len(live) <= 1 or (len(live) < most and rng.random() < 0.5):
            made += 1
            live = [*live, f"s{seed}-{made}"]
        else:
            gone = rng.choice(live)
            live = [node for node in live if node != gone]
        sequence.append(live)
    return sequence


SEQUENCES = [_grow_then_shrink("node"), _grow_then_shrink("n")] + [_churn(s) for s in range(8)]


def _rendezvous(nodes: Members, partitions: int) -> dict[int, str]:
    return {p: str(first_choice(p, nodes)) for p in range(partitions)}


def _moves(assign: Callable[[Members, int], dict[int, str]], partitions: int) -> int:
    """Partitions that changed node over every step of every sequence."""
    moved = 0
    for sequence in SEQUENCES:
        owners = assign(sequence[0], partitions)
        for nodes in sequence[1:]:
            after = assign(nodes, partitions)
            moved += sum(after[p] != owners[p] for p in range(partitions))
            owners = after
    return moved


def _fewest_balanced(partitions: int) -> int:
    """A lower bound for any balanced assignment: a joiner takes at least
    P // N, a leaver gives at least P // N (of N before it left)."""
    fewest = 0
    for sequence in SEQUENCES:
        for before, after in itertools.pairwise(sequence):
            fewest += partitions // max(len(before), len(after))
    return fewest


def _fewest_from(before: dict[int, str], nodes: Members, partitions: int) -> int:
    """The fewest moves from ``before`` to any assignment balanced over ``nodes``,
    counted apart from ``rebalance``: a node keeps at most P // N of what it owns,
    and at most P % N nodes keep one more."""
    low, extra = divmod(partitions, len(nodes))
    owned = _loads(before, nodes)
    kept = sum(min(count, low) for count in owned) + min(extra, sum(c > low for c in owned))
    return partitions - kept


def _replayed(partitions: int) -> int:
    """Partitions moved over every step of every sequence, each step's assignment
    rebalanced from the one before (as the record is), each checked balanced and
    the fewest moves balance allows."""
    moves = 0
    for sequence in SEQUENCES:
        owners = assignment(sequence[0], partitions)
        for nodes in sequence[1:]:
            after = rebalance(owners, nodes, partitions)
            assert sorted(after) == list(range(partitions))
            low = partitions // len(nodes)
            assert set(_loads(after, nodes)) <= {low, low + 1}, nodes
            step = moved(owners, after)
            assert step == _fewest_from(owners, nodes, partitions), nodes
            moves += step
            owners = after
    return moves


# Measured over SEQUENCES (10 sequences of 16 joins and leaves, N <= 9): the
# record, rebalanced at each step / the assignment from the member list alone
# (a keyspace's first record) / plain rendezvous / the fewest any balanced
# assignment can move, whatever it owned before each step.
MOVES = {
    16: (709, 836, 729, 690),
    64: (2859, 3153, 2873, 2841),
    256: (11505, 12063, 11336, 11486),
}


@pytest.mark.parametrize("partitions", sorted(MOVES))
def test_each_join_or_leave_moves_the_fewest_partitions_balance_allows(partitions: int) -> None:
    """Each step balanced and moving the fewest a balanced assignment could from
    the step's start (``_replayed``): a join moves the joiner's share, a leave
    the leaver's partitions. Over the sequences that is within 3 % of the
    balanced floor; the rest is the leaves of a node that owned P // N + 1."""
    replayed, alone, _, fewest = MOVES[partitions]
    assert (_replayed(partitions), _moves(assignment, partitions)) == (replayed, alone)
    assert _fewest_balanced(partitions) == fewest <= replayed <= 1.03 * fewest < alone


@pytest.mark.parametrize("partitions", sorted(MOVES))
def test_the_record_moves_no_more_than_plain_rendezvous_where_balance_allows(
    partitions: int,
) -> None:
    """Rendezvous is not balanced, and at P 256 its luck here moved fewer than
    any balanced assignment can (a joiner took less than its share): there no
    balanced assignment can match it."""
    replayed, _, plain, fewest = MOVES[partitions]
    assert (_moves(_rendezvous, partitions), _fewest_balanced(partitions)) == (plain, fewest)
    if partitions == 256:
        assert plain < fewest <= replayed
    else:
        assert replayed <= plain


def test_the_assignment_is_the_same_whatever_the_order() -> None:
    for p in range(50):
        assert ranking(p, NODES) == ranking(p, list(reversed(NODES)))
        assert first_choice(p, NODES) == ranking(p, NODES)[0]
    assert first_choice(3, []) is None
    assert assignment([], 16) == {}
    assert assignment(NODES, 16) == assignment(list(reversed(NODES)), 16)


names = st.lists(st.text("abcdefgh0123456789-", min_size=1, max_size=8), unique=True, max_size=8)


@settings(max_examples=100)
@given(names.filter(lambda n: len(n) >= 1), st.text("xyz", min_size=1, max_size=6))
def test_a_joining_node_takes_its_share_and_nothing_else_moves(nodes: list[str], new: str) -> None:
    before = assignment(nodes, 64)
    after = rebalance(before, [*nodes, new], 64)
    share = 64 // (len(nodes) + 1)
    taken = list(after.values()).count(new)
    assert moved(before, after) == taken  # each move is to the joiner
    # The larger shares go to those that own more than the share already.
    over = sum(count > share for count in _loads(before, nodes))
    assert taken == (share if 64 % (len(nodes) + 1) <= over else share + 1)


@settings(max_examples=100)
@given(names.filter(lambda n: len(n) >= 2), st.data())
def test_a_leaving_node_gives_its_partitions_and_nothing_else_moves(
    nodes: list[str], data: st.DataObject
) -> None:
    gone = data.draw(st.sampled_from(nodes))
    before = assignment(nodes, 64)
    after = rebalance(before, [n for n in nodes if n != gone], 64)
    assert sorted(after) == list(range(64)) and gone not in after.values()
    assert moved(before, after) == list(before.values()).count(gone)


def test_a_balanced_assignment_is_kept_as_it_is() -> None:
    """Whatever made it: a record written by a node of another release, say."""
    striped = {p: NODES[p % 5] for p in range(16)}
    assert rebalance(striped, NODES, 16) == striped
    assert rebalance(striped, reversed(NODES), 16) == striped
    # One partition too many: the fewest moves again, from the fullest.
    lopsided = {**striped, 1: "node-0"}  # node-0 owns 5, node-1 2
    after = rebalance(lopsided, NODES, 16)
    assert [(lopsided[p], after[p]) for p in range(16) if after[p] != lopsided[p]] == [
        ("node-0", "node-1")
    ]


def test_plan_claims_its_free_partitions_and_hands_back_only_to_live_nodes() -> None:
    three = assignment(["a", "b", "c"], 32)
    mine = {p for p, n in three.items() if n == "a"}
    everything_a = dict.fromkeys(range(32), "a")
    # Alone, "a" claims everything free; the others are not registered yet.
    alone = plan("a", [], everything_a, {})
    assert alone.claim == frozenset(range(32)) and not alone.hand_back
    # Holding everything while b and c register: hand back exactly theirs.
    held_all = plan("a", ["b", "c"], three, everything_a)
    assert held_all.hand_back == frozenset(set(range(32)) - mine)
    assert not held_all.claim
    # Never to a node that is not registered: c's stay while c is not.
    c_gone = plan("a", ["a", "b"], three, everything_a)
    assert c_gone.hand_back == frozenset(p for p, n in three.items() if n == "b")
    # A partition held by someone else is neither claimed nor handed back.
    others = plan("a", ["b", "c"], three, dict.fromkeys(range(32), "b"))
    assert not others.claim and not others.hand_back
    # Free partitions: only those assigned to "a".
    free = plan("a", ["a", "b", "c"], three, {})
    assert free.claim == frozenset(mine)
    # "a" keeps its share even when its own registration lapsed.
    keeps = rebalance(everything_a, ["a", "b"], 32)
    lapsed = plan("a", ["b"], keeps, everything_a)
    assert lapsed.hand_back == frozenset(p for p in range(32) if keeps[p] == "b")
    assert len(lapsed.hand_back) == 16


def test_plan_never_claims_a_partition_it_still_holds() -> None:
    # Every lease key deleted under a node serving all 8 (HA scenario 5): the
    # free ones it holds are not claimed (loaded a second time, fired twice)
    # until the keeper has dropped them.
    mine = dict.fromkeys(range(8), "a")
    gone = plan("a", ["a"], mine, {}, held={0, 1, 2, 3, 4, 5, 6, 7})
    assert not gone.claim and not gone.hand_back
    some = plan("a", ["a"], mine, {}, held={2, 5})
    assert some.claim == frozenset({0, 1, 3, 4, 6, 7})
