#!lua
-- A change of stategate's KEYNOTIFY registrations, applied to the shared copy within its
-- bounds and appended to the change log, in one atomic call. Every replica reads the log and
-- applies the same changes in the same order to its own copy.
--
-- KEYS[1] clients (HASH client -> broker session, '' = unknown)
-- KEYS[2] registrations of all clients (STRING)
-- KEYS[3] the keys this client observes (SET)
-- KEYS[4] change log (STREAM), KEYS[5] its last sequence number (STRING)
-- KEYS[6] when replicas last saw each client (HASH)
-- KEYS[7] the only replica that can reach each client, when only one can (HASH client -> origin)
-- ARGV[1] 'r' register, 'u' unregister, 'd' drop the client
-- ARGV[2] client, ARGV[3] session ('' = unknown), ARGV[4] key
-- ARGV[5] most keys per client, ARGV[6] most registrations in all
-- ARGV[7] approximate most log entries kept, ARGV[8] origin, ARGV[9] a tag unique to this call
-- ARGV[10] the client's home replica ('' = any replica can reach it)
--
-- Returns {outcome, sequence number of the last entry logged (0: none)}; outcome 0 applied,
-- 1 nothing to do, 2 the client has too many keys, 3 the registry is full (a registration
-- from a new session may have dropped the old session's first, and logged that).

local clients, count, keys, log, logseq = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local op, client, session, key = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local last = 0
local entries = 0

local function append(kind, extra)
  last = redis.call('INCR', logseq)
  entries = entries + 1
  local entry = {'n', last, 'u', ARGV[9] .. '.' .. entries, 'o', ARGV[8], 't', kind, 'c', client}
  for i = 1, #extra do entry[#entry + 1] = extra[i] end
  redis.call('XADD', log, 'MAXLEN', '~', ARGV[7], '*', unpack(entry))
end

-- Drops every registration of the client (of `only` session, when not '').
local function drop(only)
  local current = redis.call('HGET', clients, client)
  if not current then return false end
  if only ~= '' and current ~= '' and current ~= only then return false end
  local n = redis.call('SCARD', keys)
  redis.call('DEL', keys)
  redis.call('HDEL', clients, client)
  redis.call('DECRBY', count, n)
  redis.call('HDEL', KEYS[6], client)
  redis.call('HDEL', KEYS[7], client)
  append('D', {'s', only})
  return true
end

-- Checks before any write (a script that fails halfway keeps what it wrote): every key has its
-- type, and both counters hold integers, so INCR/DECR cannot fail later.
redis.call('HLEN', clients)
redis.call('SCARD', keys)
redis.call('XLEN', log)
redis.call('HLEN', KEYS[6])
redis.call('HLEN', KEYS[7])
for _, counter in ipairs({count, logseq}) do
  local v = redis.call('GET', counter)
  if v and not tonumber(v) then
    return redis.error_reply('ERR stategate observe: ' .. counter .. ' does not hold a number')
  end
end

if op == 'r' then
  local current = redis.call('HGET', clients, client)
  -- A newer session of the same client id: the old session and its registrations are gone.
  if current and session ~= '' and current ~= session then
    drop('')
    current = nil
  end
  if current and redis.call('SISMEMBER', keys, key) == 1 then
    return {1, last}
  end
  if redis.call('SCARD', keys) >= tonumber(ARGV[5]) then
    return {2, last}
  end
  if tonumber(redis.call('GET', count) or '0') >= tonumber(ARGV[6]) then
    return {3, last}
  end
  redis.call('SADD', keys, key)
  redis.call('HSET', clients, client, session)
  if ARGV[10] ~= '' then
    redis.call('HSET', KEYS[7], client, ARGV[10])
  else
    redis.call('HDEL', KEYS[7], client)
  end
  redis.call('INCR', count)
  append('r', {'s', session, 'k', key, 'h', ARGV[10]})
  return {0, last}
elseif op == 'u' then
  if redis.call('SREM', keys, key) == 0 then return {1, 0} end
  redis.call('DECR', count)
  if redis.call('SCARD', keys) == 0 then
    redis.call('HDEL', clients, client)
    redis.call('HDEL', KEYS[7], client)
  end
  append('u', {'k', key})
  return {0, last}
elseif op == 'd' then
  if drop(session) then return {0, last} end
  return {1, 0}
end
return redis.error_reply('ERR stategate observe: unknown operation')
