#!lua
-- stategate's conditional swap (src/storage/redis.rs describes the layout): apply every
-- (key, expected version, deadline check, new record or delete) or none, append the changes to the shared
-- change log, and leave the request's mark. No state store rule lives here: the engine decided
-- every record; this only compares versions, deadlines and request ids, counts keys and writes. With
-- checks and no swaps it writes nothing: it confirms that the versions a decision was taken
-- on (from a replica's record cache) are still the stored ones, and that the request is new.
--
-- All or nothing: every check, and every call that could fail (a key of the wrong type, a
-- number that does not parse), runs before the first write, so the script never stops
-- half-applied. The `#!lua` line (no flags) makes Redis refuse the whole call up front when
-- it is out of memory, instead of at the first write.
--
-- Numbers given to redis.call, or put in the log entry, are written as strings ('0',
-- string.format('%d', n)): Redis 7.0 turns a Lua number argument into text with printf's
-- '%.17g', and Lua's own `..` with '%.14g', the C library's float formatting either way.
--
-- KEYS[1] index (ZSET, score 0, member = key)
-- KEYS[2] deadlines (ZSET, score = deadline ms, member = key)
-- KEYS[3] highest version ever written (ZSET, one member, score 0)
-- KEYS[4] change log (STREAM), KEYS[5] its last sequence number (STRING)
-- KEYS[6] the request's mark (STRING, with a TTL)
-- KEYS[7] highest version a removal was issued (ZSET, one member, score 0): the floor of the
-- versions of keys created from now on
-- KEYS[7 + i] the record hash of swap i, then KEYS[7 + swaps + j] that of check j
-- ARGV[1] most keys after the swap ('' = no limit)
-- ARGV[2] approximate most log entries kept ('' = write no log)
-- ARGV[3] the request: '' none, 'c' look for its mark only, 's' look and store the outcome
-- ARGV[4] the outcome to store, ARGV[5] how long to keep it, ms
-- ARGV[6] origin (the writing replica), ARGV[7] a tag unique to this call
-- ARGV[8] number of swaps, ARGV[9] number of checks, ARGV[10] number of changes
-- ARGV[11] 'f': a key created must get a version above the removal floor (KEYS[7]); '' (an
-- import, which keeps the versions it was exported with): no floor
-- then 9 per swap i: key, expected version ('' = must be absent), 'p' (put) or 'd' (delete),
-- value, version, fencing token ('' = none), deadline ('' = none), sliding time to live ('' =
-- none), deadline check: '' none, 'l' (a slide: the new deadline must be later than the stored
-- one; none is later than any, and a record stored without one is never slid) or '=' followed
-- by a deadline (an expiry: the stored deadline must still be that one)
-- then 1 per check: expected version ('' = must be absent)
-- then 6 per change: key, 's' (set), 'i' (a set by an import: logged as 's' with the field
-- i = 1, which replicas of earlier releases ignore), 'd' (delete) or 'e' (expire), version,
-- value, deadline, fencing token
--
-- Returns {0, sequence number of the last change logged (0: none)}, {1} conflict (a stored
-- version differs, or a stored deadline fails its check), {2} too many keys, {3, outcome} the
-- request was applied before, {4, floor} a key would be created with a version not above the
-- removal floor (the writer's clock is behind another replica's: it must observe the floor
-- and decide again).

local swaps, checks, changes = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
if not swaps or not checks or not changes or #KEYS ~= 7 + swaps + checks then
  return redis.error_reply('ERR stategate swap: bad counts')
end
local index, deadlines, highest = KEYS[1], KEYS[2], KEYS[3]
local log, logseq, mark, removed = KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local S = 12
local C = S + 9 * swaps

-- A redelivered request: its first execution stands; apply nothing.
if ARGV[3] ~= '' then
  local stored = redis.call('GET', mark)
  if stored then return {3, stored} end
  if ARGV[3] == 's' and not tonumber(ARGV[5]) then
    return redis.error_reply('ERR stategate swap: bad request ttl')
  end
end

-- Check. These reads also fail now, not halfway through the writes, if a key has another type.
local count = redis.call('ZCARD', index)
redis.call('ZCARD', deadlines)
redis.call('ZCARD', highest)
redis.call('ZCARD', removed)
local floored = ARGV[11] == 'f'
local added = 0
for i = 1, swaps do
  local a = S + 9 * (i - 1)
  local stored = redis.call('HGET', KEYS[7 + i], 'ver')
  local expected = ARGV[a + 1]
  if expected == '' then
    if stored then return {1} end
  elseif stored ~= expected then
    return {1}
  end
  local put = ARGV[a + 2] == 'p'
  if put then
    if (ARGV[a + 6] ~= '' and not tonumber(ARGV[a + 6])) or (ARGV[a + 7] ~= '' and not tonumber(ARGV[a + 7])) then
      return redis.error_reply('ERR stategate swap: bad deadline')
    end
    if not stored then
      added = added + 1
      -- A key created (again) gets a version above every removal's: members at or above the
      -- new version, compared as bytes (the encoding's byte order is the versions' order).
      if floored then
        local above = redis.call('ZRANGEBYLEX', removed, '[' .. ARGV[a + 4], '+', 'LIMIT', '0', '1')
        if above[1] then
          return {4, redis.call('ZRANGE', removed, '-1', '-1')[1]}
        end
      end
    end
  elseif stored then
    added = added - 1
  end
  -- The deadline check: a slide moves a deadline under the same version, so a version that
  -- matches does not say the deadline is the one the caller saw.
  local check = ARGV[a + 8]
  if check ~= '' then
    local exp = redis.call('HGET', KEYS[7 + i], 'exp')
    if check == 'l' then
      if not exp then return {1} end
      local old = tonumber(exp)
      if not old then
        return redis.error_reply('ERR stategate swap: bad stored deadline')
      end
      if put and ARGV[a + 6] ~= '' and tonumber(ARGV[a + 6]) <= old then return {1} end
    elseif string.sub(check, 1, 1) == '=' then
      -- Compared as text: both are the same decimal form, exactly.
      if exp ~= string.sub(check, 2) then return {1} end
    else
      return redis.error_reply('ERR stategate swap: bad deadline check')
    end
  end
end
for j = 1, checks do
  local stored = redis.call('HGET', KEYS[7 + swaps + j], 'ver')
  local expected = ARGV[C + j - 1]
  if expected == '' then
    if stored then return {1} end
  elseif stored ~= expected then
    return {1}
  end
end
if ARGV[1] ~= '' and added > 0 and count + added > tonumber(ARGV[1]) then
  return {2}
end
if swaps == 0 then
  return {0, 0}
end
if ARGV[2] ~= '' then
  redis.call('XLEN', log)
  if not tonumber(ARGV[2]) then
    return redis.error_reply('ERR stategate swap: bad log arguments')
  end
  local seq = redis.call('GET', logseq)
  if seq and not tonumber(seq) then
    return redis.error_reply('ERR stategate swap: bad log sequence')
  end
end

-- Write.
for i = 1, swaps do
  local a = S + 9 * (i - 1)
  local record, key = KEYS[7 + i], ARGV[a]
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
    if ARGV[a + 7] ~= '' then
      fields[#fields + 1] = 'sl'
      fields[#fields + 1] = ARGV[a + 7]
    end
    redis.call('HSET', record, unpack(fields))
    redis.call('ZADD', index, '0', key)
    -- Keep only the greatest member: equal scores order members by their bytes, and the
    -- encoding's byte order is the versions' order (no Lua string comparison, which follows
    -- the server's locale).
    redis.call('ZADD', highest, '0', version)
  else
    redis.call('ZREM', index, key)
  end
end
redis.call('ZREMRANGEBYRANK', highest, '0', '-2')

-- The changes, in the same atomic call: no replica sees the swap without its changes or the
-- other way round, and the log's order is the order of the swaps.
local last = 0
if ARGV[2] ~= '' then
  local c = C + checks
  for j = 1, changes do
    local b = c + 6 * (j - 1)
    last = redis.call('INCR', logseq)
    local kind = ARGV[b + 1]
    if kind == 'i' then
      kind = 's'
    elseif kind == 'd' or kind == 'e' then
      redis.call('ZADD', removed, '0', ARGV[b + 2])
    end
    local entry = {'n', string.format('%d', last), 'u', string.format('%s.%d', ARGV[7], j), 'o', ARGV[6], 't', kind, 'k', ARGV[b],
      'v', ARGV[b + 2]}
    if ARGV[b + 1] == 'i' then
      entry[#entry + 1] = 'i'
      entry[#entry + 1] = '1'
    end
    if kind == 's' then
      entry[#entry + 1] = 'x'
      entry[#entry + 1] = ARGV[b + 3]
      if ARGV[b + 4] ~= '' then
        entry[#entry + 1] = 'e'
        entry[#entry + 1] = ARGV[b + 4]
      end
      if ARGV[b + 5] ~= '' then
        entry[#entry + 1] = 'f'
        entry[#entry + 1] = ARGV[b + 5]
      end
    end
    redis.call('XADD', log, 'MAXLEN', '~', ARGV[2], '*', unpack(entry))
  end
end
redis.call('ZREMRANGEBYRANK', removed, '0', '-2')
if ARGV[3] == 's' then
  redis.call('SET', mark, ARGV[4], 'PX', ARGV[5])
end
return {0, last}
