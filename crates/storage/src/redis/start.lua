#!lua flags=no-writes
-- Where a replica starts reading stategate's change log, the KEYNOTIFY registrations and the
-- replicas that send notifications as of that point, read atomically (no change can fall
-- between them).
--
-- KEYS[1] change log (STREAM), KEYS[2] its last sequence number, KEYS[3] clients (HASH)
-- KEYS[4] members (HASH origin -> last renewal), KEYS[5] clients' home replicas (HASH)
-- ARGV[1] the prefix of the per-client key sets
--
-- Returns {id of the newest entry ('' = none), its sequence number, its tag,
--          {{client, session, home, {keys...}}...}, {member origins...}}

local newest = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
local id, tag = '', ''
local seq = redis.call('GET', KEYS[2]) or '0'
if #newest > 0 then
  id = newest[1][1]
  local fields = newest[1][2]
  for i = 1, #fields, 2 do
    if fields[i] == 'n' then seq = fields[i + 1] end
    if fields[i] == 'u' then tag = fields[i + 1] end
  end
end
local registrations = {}
local all = redis.call('HGETALL', KEYS[3])
for i = 1, #all, 2 do
  local home = redis.call('HGET', KEYS[5], all[i]) or ''
  registrations[#registrations + 1] = {all[i], all[i + 1], home, redis.call('SMEMBERS', ARGV[1] .. all[i])}
end
return {id, seq, tag, registrations, redis.call('HKEYS', KEYS[4])}
