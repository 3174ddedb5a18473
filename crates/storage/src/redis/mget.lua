-- stategate's point-in-time read of several keys (MGET): one script, so no swap runs between
-- the first record read and the last, and the values are sent only if they fit the caller's
-- budget (a server-side check: nothing large crosses the network to be refused).
--
-- KEYS[i] the record hash of key i
-- ARGV[1] most value bytes, all records together
--
-- Returns 0 when the values exceed the budget, else one {v, ver, ft, exp, sl} per key (absent
-- fields, and every field of an absent record, are nil).

local budget = tonumber(ARGV[1])
if not budget then
  return redis.error_reply('ERR stategate mget: bad budget')
end
local total = 0
for i = 1, #KEYS do
  total = total + redis.call('HSTRLEN', KEYS[i], 'v')
  if total > budget then
    return 0
  end
end
local out = {}
for i = 1, #KEYS do
  out[i] = redis.call('HMGET', KEYS[i], 'v', 'ver', 'ft', 'exp', 'sl')
end
return out
