"""The fenced flush's Lua scripts: the epoch check, then the writes.

Both scripts start with the fence (``_FENCE``): refused, writing nothing,
unless the partition's epoch key holds the writer's epoch, and naming the
lease's holder when refused. ``FLUSH_SCRIPT`` writes a partition's puts
and removes, with a branch of its own for one put, the commonest flush (one
request at a time: Redis spends 0.6-0.9 us less on it, docs/performance.md,
"Measurements behind the code"); ``FLUSH_FAR_SCRIPT`` a flush with far-tier
changes (store/base.py, ``Tiers``). How a flush sends them and reads their
replies: fenced.py.

Atomicity: Redis checks for out-of-memory at a script's first write, so a
refused script writes nothing; the HSETs are cut into chunks of
``CHUNK_FIELDS`` fields because Lua's ``unpack`` has a stack limit.

Every link the journal writes over loads both at its handshake (``SCRIPT
LOAD``, ``LOAD_SCRIPTS``), so EVALSHA finds them after a reconnect to a
restarted or promoted Redis, whose script cache is empty.
"""

from __future__ import annotations

import hashlib

from delaywheel.store.redis.link import Command

# Fields per HSET/HDEL inside the script: unpack() of 2,000 values stays far
# below Lua's C stack limit (LUAI_MAXCSTACK, 8,000).
CHUNK_FIELDS = 1000
# Both flushes start so: refused unless KEYS[1] (the partition's epoch) is
# ARGV[1], the writer's, naming the lease (KEYS[3]) that holds it now.
_FENCE = """
local epoch = redis.call('GET', KEYS[1])
if epoch ~= ARGV[1] then
  local now = epoch or 'unset'
  local held = redis.call('GET', KEYS[3]) or ''
  local said = KEYS[1] .. ' is ' .. now .. ', not ' .. ARGV[1]
  return redis.error_reply('FENCED ' .. said .. '; lease ' .. held)
end
"""

FLUSH_SCRIPT = f"""{_FENCE}
if #ARGV == 4 and ARGV[2] == '1' then -- one put (one request): the commonest
  redis.call('HSET', KEYS[2], ARGV[3], ARGV[4])
  return 1
end
local puts_end = 2 + 2 * tonumber(ARGV[2])
for first = 3, puts_end, {2 * CHUNK_FIELDS} do
  local last = math.min(first + {2 * CHUNK_FIELDS - 1}, puts_end)
  redis.call('HSET', KEYS[2], unpack(ARGV, first, last))
end
for first = puts_end + 1, #ARGV, {CHUNK_FIELDS} do
  local last = math.min(first + {CHUNK_FIELDS - 1}, #ARGV)
  redis.call('HDEL', KEYS[2], unpack(ARGV, first, last))
end
return tonumber(ARGV[2])
"""
FLUSH_SHA = hashlib.sha1(FLUSH_SCRIPT.encode()).hexdigest()
LOAD_SCRIPT: Command = ("SCRIPT", "LOAD", FLUSH_SCRIPT)

# A flush with far-tier changes (store/base.py, Tiers), over the partition's
# far hash, due zset and far counts too (KEYS[4..6], the same hash tag).
# ARGV: epoch, then the counts of blind ids, of was_far pairs and of changes,
# then the blind ids with their groups ('' for none: Tiers.groups), the (id,
# topic) pairs, and each change as (id, kind, record, due, topic), kind p
# (near put), r (remove) or f (far put). Answers the blind ids held (an
# array, maybe empty); the other ids of their groups are not put either.
FLUSH_FAR_SCRIPT = (
    _FENCE
    + """
local blind, was_far, changes = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local at = 5
local refused, skip, lost = {}, {}, {}
for _ = 1, blind do
  local id, group = ARGV[at], ARGV[at + 1]
  at = at + 2
  -- An id held already is refused, and its record written again: the flush's
  -- WAIT then confirms it, since the answer (exists) acknowledges the task.
  local key = KEYS[2]
  local held = redis.call('HGET', key, id)
  if not held then
    key = KEYS[4]
    held = redis.call('HGET', key, id)
  end
  if held then
    redis.call('HSET', key, id, held)
    skip[id] = true
    refused[#refused + 1] = id
    if group ~= '' then
      lost[group] = true
    end
  end
end
if next(lost) then  -- an add_many's ids go together: one held, none put
  for i = 5, 4 + 2 * blind, 2 do
    if lost[ARGV[i + 1]] then
      skip[ARGV[i]] = true
    end
  end
end
for _ = 1, was_far do
  local id, topic = ARGV[at], ARGV[at + 1]
  at = at + 2
  if not skip[id] and redis.call('HDEL', KEYS[4], id) == 1 then
    redis.call('ZREM', KEYS[5], id)
    if redis.call('HINCRBY', KEYS[6], topic, -1) <= 0 then
      redis.call('HDEL', KEYS[6], topic)
    end
  end
end
for _ = 1, changes do
  local id, kind = ARGV[at], ARGV[at + 1]
  if not skip[id] then
    if kind == 'r' then
      redis.call('HDEL', KEYS[2], id)
    elseif kind == 'p' then
      redis.call('HSET', KEYS[2], id, ARGV[at + 2])
    else
      redis.call('HDEL', KEYS[2], id)
      redis.call('HSET', KEYS[4], id, ARGV[at + 2])
      redis.call('ZADD', KEYS[5], ARGV[at + 3], id)
      redis.call('HINCRBY', KEYS[6], ARGV[at + 4], 1)
    end
  end
  at = at + 5
end
return refused
"""
)
FLUSH_FAR_SHA = hashlib.sha1(FLUSH_FAR_SCRIPT.encode()).hexdigest()
LOAD_FAR_SCRIPT: Command = ("SCRIPT", "LOAD", FLUSH_FAR_SCRIPT)
# What a link's handshake loads: both flushes.
LOAD_SCRIPTS: list[Command] = [LOAD_SCRIPT, LOAD_FAR_SCRIPT]
