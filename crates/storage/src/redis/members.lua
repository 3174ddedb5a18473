#!lua
-- The replicas that send stategate's KEYNOTIFY notifications (engine/owners.rs): renew this
-- replica's membership, record how far it has sent what it owes, drop the members that
-- stopped renewing, or leave. Every change of the membership is appended to the change log in
-- the same atomic call, so every replica applies it at the same position and agrees on who
-- notifies whom. Liveness is judged by Redis's clock (TIME), the one clock all replicas share.
--
-- KEYS[1] members (HASH origin -> ms of the last renewal)
-- KEYS[2] progress (HASH origin -> log position up to which it sent what it owed)
-- KEYS[3] change log (STREAM), KEYS[4] its last sequence number (STRING)
-- ARGV[1] 'h' heartbeat or 'l' leave, ARGV[2] this replica's origin, ARGV[3] its progress
-- ARGV[4] member timeout ms, ARGV[5] approximate most log entries kept, ARGV[6] a unique tag
--
-- Returns (heartbeat) {origin, progress, ...} of every member; (leave) {}.

local members, progress, log, logseq = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local op, me = ARGV[1], ARGV[2]
local mine, timeout, keep = tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5]
if not mine or not timeout or not tonumber(keep) then
  return redis.error_reply('ERR stategate members: bad arguments')
end
-- Type checks before any write.
redis.call('HLEN', members)
redis.call('HLEN', progress)
redis.call('XLEN', log)
local seq = redis.call('GET', logseq)
if seq and not tonumber(seq) then
  return redis.error_reply('ERR stategate members: bad log sequence')
end

local entries = 0
local function append(kind, member, extra)
  local n = redis.call('INCR', logseq)
  entries = entries + 1
  local entry = {'n', n, 'u', ARGV[6] .. '.' .. entries, 'o', me, 't', kind, 'm', member}
  for i = 1, #extra do entry[#entry + 1] = extra[i] end
  redis.call('XADD', log, 'MAXLEN', '~', keep, '*', unpack(entry))
end

if op == 'l' then
  if redis.call('HDEL', members, me) == 1 then
    append('L', me, {'p', mine})
  end
  redis.call('HDEL', progress, me)
  return {}
elseif op ~= 'h' then
  return redis.error_reply('ERR stategate members: unknown operation')
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local all = redis.call('HGETALL', members)
for i = 1, #all, 2 do
  local m, renewed = all[i], tonumber(all[i + 1]) or 0
  if m ~= me and now - renewed > timeout then
    redis.call('HDEL', members, m)
    local p = redis.call('HGET', progress, m) or '0'
    redis.call('HDEL', progress, m)
    append('L', m, {'p', p})
  end
end
if redis.call('HEXISTS', members, me) == 0 then
  append('J', me, {})
end
redis.call('HSET', members, me, now)
redis.call('HSET', progress, me, mine)
return redis.call('HGETALL', progress)
