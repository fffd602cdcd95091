"""Lua scripts run atomically inside Redis by :class:`~cosmos_primitives.queue.RedisRolloutQueue`.

Each is one server-side step that must not interleave with other clients: a bounded append,
taking delivered records by record id, the "mark trained + acknowledge + delete" of a batch, moving a
bad entry to the dead-letter stream, and renewing this consumer's hold on its entries.
"""

# KEYS[1] stream. ARGV[1] max pending entries, ARGV[2..] record payloads.
# Appends payloads in order while the stream holds fewer than ARGV[1] entries (entries are deleted
# on acknowledgement, so the length is "enqueued and not acknowledged"). Returns how many it added.
BOUNDED_PUT = """
local room = tonumber(ARGV[1]) - redis.call('XLEN', KEYS[1])
local added = 0
for i = 2, #ARGV do
  if room <= 0 then break end
  redis.call('XADD', KEYS[1], '*', 'record', ARGV[i])
  room = room - 1
  added = added + 1
end
return added
"""

# KEYS[1] stream, KEYS[2] sorted set of trained record ids, KEYS[3] hash record id -> the entry that
# carries it for training (its owner). ARGV[1] group, then per delivered entry: record id, entry id.
# Decides per entry, for all consumers at once: 'done' (the id was trained: the entry is acknowledged
# and deleted), 'dup' (another entry of the same id is still in the stream, delivered to some
# consumer, which trains it or, if it dies, hands it on by claim: this copy is acknowledged and
# deleted) or 'new' (this entry becomes the owner: train it). Returns one code per entry.
ACCEPT = """
local out = {}
for i = 2, #ARGV, 2 do
  local rid, eid = ARGV[i], ARGV[i + 1]
  local code = 'new'
  if redis.call('ZSCORE', KEYS[2], rid) then
    code = 'done'
  else
    local owner = redis.call('HGET', KEYS[3], rid)
    if owner and owner ~= eid and #redis.call('XRANGE', KEYS[1], owner, owner) > 0 then
      code = 'dup'
    end
  end
  if code == 'new' then
    redis.call('HSET', KEYS[3], rid, eid)
  else
    redis.pcall('XACK', KEYS[1], ARGV[1], eid)
    redis.call('XDEL', KEYS[1], eid)
  end
  out[#out + 1] = code
end
return out
"""

# KEYS[1] stream, KEYS[2] sorted set of trained record ids (score: Unix time of the ack), KEYS[3]
# owner hash (see ACCEPT), KEYS[4] hash of group-wide counters, KEYS[5] sorted set of record ids ->
# the trainer step that trained them. ARGV[1] group, ARGV[2] now (s), ARGV[3] retention (s), ARGV[4]
# consumer, ARGV[5] that step ('' for none), ARGV[6] 'trained' or 'dropped' (consumed unseen: stale;
# counted as 'dropped_stale' so that the trained count leaves them out), then per record: record id,
# k, k entry ids.
# Records the id as trained (and, as its owner, 'acked:<consumer>'), acknowledges and deletes its
# entries; returns the record ids that another consumer had marked trained already (trained twice),
# also counted in KEYS[4] as 'double_acked' so that the count outlives the consumer. The same
# consumer acknowledging again is its own retry after a lost reply, not a second training. Ids
# older than the retention are forgotten (at most 1000 a call). XACK is pcall'ed: after a restart
# without persistence the group may be gone, and there is then nothing left to acknowledge.
ACK_TRAINED = """
local already = {}
local mark = 'acked:' .. ARGV[4]
local dropped = 0
local i = 7
while i <= #ARGV do
  local rid = ARGV[i]
  local k = tonumber(ARGV[i + 1])
  if redis.call('ZADD', KEYS[2], 'NX', ARGV[2], rid) == 0 then
    if redis.call('HGET', KEYS[3], rid) ~= mark then
      already[#already + 1] = rid
    end
  elseif ARGV[6] == 'dropped' then
    dropped = dropped + 1
  end
  if ARGV[5] ~= '' then
    redis.call('ZADD', KEYS[5], tonumber(ARGV[5]), rid)
  end
  redis.call('HSET', KEYS[3], rid, mark)
  for j = i + 2, i + 1 + k do
    redis.pcall('XACK', KEYS[1], ARGV[1], ARGV[j])
    redis.call('XDEL', KEYS[1], ARGV[j])
  end
  i = i + 2 + k
end
if #already > 0 then
  redis.call('HINCRBY', KEYS[4], 'double_acked', #already)
end
if dropped > 0 then
  redis.call('HINCRBY', KEYS[4], 'dropped_stale', dropped)
end
local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', tonumber(ARGV[2]) - tonumber(ARGV[3]), 'LIMIT', 0, 1000)
if #expired > 0 then
  redis.call('ZREM', KEYS[2], unpack(expired))
  redis.call('HDEL', KEYS[3], unpack(expired))
  redis.call('ZREM', KEYS[5], unpack(expired))
end
return already
"""

# KEYS[1] stream, KEYS[2] dead-letter stream, KEYS[3] owner hash (see ACCEPT). ARGV[1] group,
# ARGV[2] entry id, ARGV[3] dead-letter max length, ARGV[4] record id ('' when the entry has none
# that could be read), ARGV[5..] field / value pairs describing the entry. Copies, acknowledges,
# deletes, and forgets the owner of a record that was refused after it was taken.
DEAD_LETTER = """
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[3], '*', unpack(ARGV, 5))
redis.pcall('XACK', KEYS[1], ARGV[1], ARGV[2])
redis.call('XDEL', KEYS[1], ARGV[2])
if ARGV[4] ~= '' and redis.call('HGET', KEYS[3], ARGV[4]) == ARGV[2] then
  redis.call('HDEL', KEYS[3], ARGV[4])
end
return 1
"""

# KEYS[1] stream. ARGV[1] group, ARGV[2] consumer, ARGV[3..] entry ids delivered to that consumer.
# Resets the idle time of the entries the consumer still owns (XCLAIM JUSTID does not count as a
# delivery); returns the ids it no longer owns (claimed by another consumer, or gone).
RENEW = """
local lost = {}
for i = 3, #ARGV do
  local p = redis.pcall('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1)
  if type(p) == 'table' and p[1] and p[1][2] == ARGV[2] then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'JUSTID')
  else
    lost[#lost + 1] = ARGV[i]
  end
end
return lost
"""

# KEYS[1] stream, KEYS[2] owner hash (see ACCEPT), KEYS[3] hash of group-wide counters. ARGV[1] group,
# ARGV[2] the counter to add to, then per record: record id, k, k entry ids.
# Hands delivered records back unconsumed: acknowledges and deletes their entries and forgets them as
# owners, without marking them trained (a copy put again is delivered). Returns how many records.
RETURN = """
local n = 0
local i = 3
while i <= #ARGV do
  local rid = ARGV[i]
  local k = tonumber(ARGV[i + 1])
  local owner = redis.call('HGET', KEYS[2], rid)
  for j = i + 2, i + 1 + k do
    redis.pcall('XACK', KEYS[1], ARGV[1], ARGV[j])
    redis.call('XDEL', KEYS[1], ARGV[j])
    if owner == ARGV[j] then
      redis.call('HDEL', KEYS[2], rid)
    end
  end
  n = n + 1
  i = i + 2 + k
end
redis.call('HINCRBY', KEYS[3], ARGV[2], n)
return n
"""

# KEYS[1] trained record ids, KEYS[2] their trainer steps (see ACK_TRAINED), KEYS[3] owner hash,
# KEYS[4] hash of group-wide counters. ARGV: record ids. Forgets that they were trained (a trainer
# resumed from a checkpoint older than their step rolled their training back with its weights), so
# that a copy put again is delivered and trained; counted as 'rolled_back'. Returns how many were
# marked trained.
UNTRAIN = """
local n = 0
for i = 1, #ARGV do
  n = n + redis.call('ZREM', KEYS[1], ARGV[i])
  redis.call('ZREM', KEYS[2], ARGV[i])
  redis.call('HDEL', KEYS[3], ARGV[i])
end
redis.call('HINCRBY', KEYS[4], 'rolled_back', n)
return n
"""
