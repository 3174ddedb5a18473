#!lua
-- stategate's conditional swap (src/storage/redis.rs describes the layout): apply every
-- (key, expected version, new record or delete) or none. No state store rule lives here: the
-- engine decided every record; this only compares versions, counts keys and writes.
--
-- All or nothing: every check, and every call that could fail (a key of the wrong type, a
-- number that does not parse), runs before the first write, so the script never stops
-- half-applied. The `#!lua` line (no flags) makes Redis refuse the whole call up front when
-- it is out of memory, instead of at the first write.
--
-- KEYS[1] index (ZSET, score 0, member = key)
-- KEYS[2] deadlines (ZSET, score = deadline ms, member = key)
-- KEYS[3] highest version ever written (ZSET, one member, score 0)
-- KEYS[3 + i] the record hash of swap i
-- ARGV[1] most keys after the swap ('' = no limit)
-- then 7 per swap i, from ARGV[2 + 7 * (i - 1)]: key, expected version ('' = must be absent),
-- 'p' (put) or 'd' (delete), value, version, fencing token ('' = none), deadline ('' = none)
--
-- Returns 0 done, 1 conflict (a stored version differs), 2 too many keys.

local swaps = #KEYS - 3
local index, deadlines, highest = KEYS[1], KEYS[2], KEYS[3]

-- Check. These reads also fail now, not halfway through the writes, if a key has another type.
local count = redis.call('ZCARD', index)
redis.call('ZCARD', deadlines)
redis.call('ZCARD', highest)
local added = 0
for i = 1, swaps do
  local a = 2 + 7 * (i - 1)
  local stored = redis.call('HGET', KEYS[3 + i], 'ver')
  local expected = ARGV[a + 1]
  if expected == '' then
    if stored then return 1 end
  elseif stored ~= expected then
    return 1
  end
  if ARGV[a + 2] == 'p' then
    if ARGV[a + 6] ~= '' and not tonumber(ARGV[a + 6]) then
      return redis.error_reply('ERR stategate swap: bad deadline')
    end
    if not stored then added = added + 1 end
  elseif stored then
    added = added - 1
  end
end
if ARGV[1] ~= '' and added > 0 and count + added > tonumber(ARGV[1]) then
  return 2
end

-- Write.
for i = 1, swaps do
  local a = 2 + 7 * (i - 1)
  local record, key = KEYS[3 + i], ARGV[a]
  redis.call('DEL', record)
  redis.call('ZREM', deadlines, key)
  if ARGV[a + 2] == 'p' then
    local version, fencing, deadline = ARGV[a + 4], ARGV[a + 5], ARGV[a + 6]
    local fields = {'v', ARGV[a + 3], 'ver', version}
    if fencing ~= '' then
      fields[#fields + 1] = 'ft'
      fields[#fields + 1] = fencing
    end
    if deadline ~= '' then
      fields[#fields + 1] = 'exp'
      fields[#fields + 1] = deadline
      redis.call('ZADD', deadlines, deadline, key)
    end
    redis.call('HSET', record, unpack(fields))
    redis.call('ZADD', index, 0, key)
    -- Keep only the greatest member: equal scores order members by their bytes, and the
    -- encoding's byte order is the versions' order (no Lua string comparison, which follows
    -- the server's locale).
    redis.call('ZADD', highest, 0, version)
  else
    redis.call('ZREM', index, key)
  end
end
redis.call('ZREMRANGEBYRANK', highest, 0, -2)

-- Seam for the shared change feed: a change record appended here (XADD) is written in this
-- same atomic call, so no replica can see the swap without its change or the other way round.
return 0
