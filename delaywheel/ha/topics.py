"""Topic settings on every node: published by their holder, read by all.

A topic's settings are a record in one partition (engine/topics.py), held
by the node that serves it, but every node serving some of the topic's
tasks applies them (its share of the limits: engine/shares.py). So each
partition's owner publishes the settings it holds to the partition's
``topics`` hash (store/redis/layout.py: topic -> the settings' record, as
the engine packs it), and every node reads every partition's hash. Both
happen once a coordinator round (``period_s``: a third of the lease, at
most half a second), so a change reaches the other nodes within two rounds.

A publish writes only the difference from what the hash holds, and only
while the partition's epoch is still the publisher's (one script, the
partition's keys under one hash tag, as the fenced flush): a node that lost
the partition cannot overwrite what the new owner published. The hash is a
copy: the record in the partition's tasks hash is the truth, which a node
taking the partition over loads and publishes again, so a copy left stale
by a crash between a change and its publish is mended by the next owner.
What is published is what the engine holds, which may be a change whose
write is still in flight; if the store refuses that write, the engine puts
the settings back and the next round publishes them back too.
"""

from __future__ import annotations

from collections.abc import Sequence

from delaywheel.store.redis.scripts import NodeScripts, Script, text

# KEYS: the epoch, the topics hash. ARGV: the epoch expected, how many fields
# to set, those fields and their records, then the fields to delete.
_PUBLISH = Script(
    """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local set = tonumber(ARGV[2])
for i = 3, 2 + 2 * set, 2 do
  redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
end
for i = 3 + 2 * set, #ARGV do
  redis.call('HDEL', KEYS[2], ARGV[i])
end
return 1
"""
)

Published = dict[int, dict[str, bytes]]  # partition -> topic -> record


class TopicBoard(NodeScripts):
    """The partitions' ``topics`` hashes, on the coordinator's redis-py client."""

    SCRIPTS = (_PUBLISH,)

    async def read(
        self, groups: Sequence[Sequence[int]], timeout_s: float | None = None
    ) -> tuple[Published, set[int]]:
        """Every partition's published settings (HGETALLs, a pipeline per group:
        ``read_by_primary``), and the partitions whose primary did not answer."""
        found, unknown = await self.read_by_primary(
            groups, lambda pipe, p: pipe.hgetall(self.layout.partition(p).topics), timeout_s
        )
        published = {
            partition: {text(topic): record for topic, record in fields.items()}
            for partition, fields in found.items()
            if fields
        }
        return published, unknown

    async def publish(
        self, partition: int, epoch: int, have: dict[str, bytes], want: dict[str, bytes]
    ) -> bool:
        """Make ``partition``'s hash hold ``want`` where it holds ``have``;
        False when the partition's epoch is not ``epoch`` (not ours now)."""
        changed = [(topic, record) for topic, record in want.items() if have.get(topic) != record]
        gone = [topic for topic in have if topic not in want]
        if not changed and not gone:
            return True
        keys = self.layout.partition(partition)
        args: list[str | bytes | int] = [str(epoch), len(changed)]
        for topic, record in changed:
            args += [topic, record]
        args += gone
        return bool(await _PUBLISH.run(self.client, [keys.epoch, keys.topics], args))
