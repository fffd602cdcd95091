"""Lua scripts run atomically inside Redis by :class:`~cosmos_primitives.queue.PromptClaims`.

Keys (``P`` = the run's prefix, its stream name): ``P:claims:meta`` (hash: dataset_size,
range_size, seed, which every job must agree on), ``P:claims:next`` (the next range id never
handed out), ``P:claims:deadlines`` (sorted set: range id of each claim in flight -> its deadline,
milliseconds of the Redis server's clock), ``P:claims:owners`` (hash: range id -> the job holding
it; absent once released) and ``P:claims:stats`` (hash of run-wide counters). Every deadline is
computed from ``TIME`` inside the script, so the jobs' clocks never matter.
"""

# KEYS[1] meta. ARGV[1] dataset size, ARGV[2] range size, ARGV[3] seed.
# Stores the settings on first use; returns the stored ones when they differ from ARGV.
_META_CHECK = """
local m = redis.call('HMGET', KEYS[1], 'dataset_size', 'range_size', 'seed')
if not m[1] then
  redis.call('HSET', KEYS[1], 'dataset_size', ARGV[1], 'range_size', ARGV[2], 'seed', ARGV[3])
elseif m[1] ~= ARGV[1] or m[2] ~= ARGV[2] or m[3] ~= ARGV[3] then
  return {'mismatch', m[1], m[2] or '', m[3] or ''}
end
"""

CHECK_META = _META_CHECK + "return {'ok'}\n"

# KEYS[1] meta, KEYS[2] next, KEYS[3] deadlines, KEYS[4] owners, KEYS[5] stats.
# ARGV[1..3] as CHECK_META, ARGV[4] job id, ARGV[5] claim ttl (ms), ARGV[6] range ids in the run
# (-1: no end). The claim whose deadline passed longest ago goes first (a released one has
# deadline 0), then the next new range. Returns {'reissued', range id, previous holder},
# {'new', range id}, {'exhausted', next range id} or {'damaged', the next key's value} (not a range id:
# written by someone else; the trainer repairs it). A member of the deadlines that is not a range id is
# removed (counted as 'garbage_removed'), never handed out.
CLAIM = _META_CHECK + """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local deadline = now + tonumber(ARGV[5])
for _ = 1, 64 do
  local expired = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', 0, 1)
  if #expired == 0 then
    break
  end
  local rid = expired[1]
  if not string.match(rid, '^%d+$') then
    redis.call('ZREM', KEYS[3], rid)
    redis.call('HDEL', KEYS[4], rid)
    redis.call('HINCRBY', KEYS[5], 'garbage_removed', 1)
  else
    local previous = redis.call('HGET', KEYS[4], rid) or ''
    redis.call('ZADD', KEYS[3], deadline, rid)
    redis.call('HSET', KEYS[4], rid, ARGV[4])
    redis.call('HINCRBY', KEYS[5], 'reissued', 1)
    return {'reissued', rid, previous}
  end
end
local raw = redis.call('GET', KEYS[2]) or '0'
if not string.match(raw, '^%d+$') then
  return {'damaged', raw}
end
local nxt = tonumber(raw)
local limit = tonumber(ARGV[6])
if limit >= 0 and nxt >= limit then
  return {'exhausted', string.format('%d', nxt)}
end
local rid = string.format('%d', nxt)
redis.call('SET', KEYS[2], string.format('%d', nxt + 1))
redis.call('ZADD', KEYS[3], deadline, rid)
redis.call('HSET', KEYS[4], rid, ARGV[4])
return {'new', rid}
"""

# KEYS[1] deadlines, KEYS[2] owners. ARGV[1] job id, ARGV[2] claim ttl (ms).
# Moves the deadline of every claim the job holds to now + ttl; returns how many.
RENEW = """
local t = redis.call('TIME')
local deadline = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[2])
local held = redis.call('HGETALL', KEYS[2])
local n = 0
for i = 1, #held, 2 do
  if held[i + 1] == ARGV[1] then
    redis.call('ZADD', KEYS[1], 'XX', deadline, held[i])
    n = n + 1
  end
end
return n
"""

# KEYS[1] deadlines, KEYS[2] owners, KEYS[3] stats. ARGV[1] range id, ARGV[2] job id.
# Done when the job still holds the range (expired or not, as long as nobody else took it over):
# returns 1; otherwise counts a late completion and returns 0.
COMPLETE = """
if redis.call('HGET', KEYS[2], ARGV[1]) == ARGV[2] then
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('HDEL', KEYS[2], ARGV[1])
  redis.call('HINCRBY', KEYS[3], 'completed', 1)
  return 1
end
redis.call('HINCRBY', KEYS[3], 'late_completes', 1)
return 0
"""

# KEYS[1] deadlines, KEYS[2] owners, KEYS[3] stats. ARGV[1] job id.
# Hands every claim of the job back: deadline 0 (re-issued before anything else), no holder.
RELEASE = """
local held = redis.call('HGETALL', KEYS[2])
local n = 0
for i = 1, #held, 2 do
  if held[i + 1] == ARGV[1] then
    redis.call('ZADD', KEYS[1], 'XX', 0, held[i])
    redis.call('HDEL', KEYS[2], held[i])
    n = n + 1
  end
end
if n > 0 then
  redis.call('HINCRBY', KEYS[3], 'released', n)
end
return n
"""

# KEYS[1] meta, KEYS[2] next, KEYS[3] deadlines, KEYS[4] stats.
# Returns {next range id or '', claims in flight, of those past their deadline, flat meta, flat stats}.
POSITION = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return {redis.call('GET', KEYS[2]) or '', redis.call('ZCARD', KEYS[3]),
        redis.call('ZCOUNT', KEYS[3], '-inf', now), redis.call('HGETALL', KEYS[1]), redis.call('HGETALL', KEYS[4])}
"""

# KEYS[1] next, KEYS[2] deadlines, KEYS[3] stats. ARGV: range ids.
# Hands ranges out again (their records were lost to a trainer's rollback or returned untrained):
# each range handed out before (any range, when the position is not a range id) and not in flight
# now gets deadline 0 and no holder, so the next
# claim re-issues it before any new range; one in flight is left to its holder, who puts it anyway.
# Counted as 'requeued'. Returns how many ranges it added.
REISSUE = """
local raw = redis.call('GET', KEYS[1]) or '0'
local nxt = string.match(raw, '^%d+$') and tonumber(raw) or math.huge
local n = 0
for i = 1, #ARGV do
  if tonumber(ARGV[i]) < nxt and not redis.call('ZSCORE', KEYS[2], ARGV[i]) then
    redis.call('ZADD', KEYS[2], 0, ARGV[i])
    n = n + 1
  end
end
if n > 0 then
  redis.call('HINCRBY', KEYS[3], 'requeued', n)
end
return n
"""

# KEYS[1] deadlines, KEYS[2] owners, KEYS[3] stats, KEYS[4] meta, KEYS[5] next. ARGV[1] the furthest a
# deadline may lie ahead (ms). The trainer's sweep of what it did not write: a key of another type is an
# error naming it; members that are not range ids are removed, and a deadline further ahead than any
# renewal sets (it would hold its range forever) is set to 0, so the range is re-issued.
# Returns {range ids in flight, how many removed, how many deadlines reset}.
SWEEP = """
local kinds = {'zset', 'hash', 'hash', 'hash', 'string'}
for i = 1, 5 do
  local kind = redis.call('TYPE', KEYS[i])['ok']
  if kind ~= 'none' and kind ~= kinds[i] then
    return redis.error_reply('key ' .. KEYS[i] .. ' is a ' .. kind .. ', not a ' .. kinds[i])
  end
end
local t = redis.call('TIME')
local horizon = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[1])
local all = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
local ids, removed, reset = {}, 0, 0
for i = 1, #all, 2 do
  local rid = all[i]
  if not string.match(rid, '^%d+$') then
    redis.call('ZREM', KEYS[1], rid)
    redis.call('HDEL', KEYS[2], rid)
    removed = removed + 1
  else
    if tonumber(all[i + 1]) > horizon then
      redis.call('ZADD', KEYS[1], 0, rid)
      redis.call('HDEL', KEYS[2], rid)
      reset = reset + 1
    end
    ids[#ids + 1] = rid
  end
end
if removed > 0 then
  redis.call('HINCRBY', KEYS[3], 'garbage_removed', removed)
end
return {ids, removed, reset}
"""

# KEYS[1] next. ARGV[1] a range id. Moves the position forward to ARGV[1] when it is behind it (the
# ranges before were all trained: handing them out again would only waste generation); returns 1 if moved.
RAISE_NEXT = """
local raw = redis.call('GET', KEYS[1]) or '0'
if string.match(raw, '^%d+$') and tonumber(raw) >= tonumber(ARGV[1]) then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1])
return 1
"""
