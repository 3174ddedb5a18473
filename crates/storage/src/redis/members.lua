#!lua
-- The replicas that send stategate's KEYNOTIFY notifications (engine/owners.rs): renew this
-- replica's membership, record how far it has sent what it owes, drop the members that
-- stopped renewing, or leave. Every change of the membership is appended to the change log in
-- the same atomic call, so every replica applies it at the same position and agrees on who
-- notifies whom. Liveness is judged by Redis's clock (TIME), the one clock all replicas share.
--
-- A process that joins for the first time also drops the member of the last process of its node
-- (KEYS[5]), with an `L` entry before its own `J`: a node's process is only started again once
-- the last one is gone, so that member is dead. Without it, the dead member kept its observers
-- until its membership lapsed (the member timeout), while the new process, joined at once, was
-- already sending newer notifications to some of them: the dead one's were then handed over
-- late, after newer ones (the fault test bed, a replica killed and restarted behind Mosquitto).
--
-- KEYS[1] members (HASH origin -> ms of the last renewal)
-- KEYS[2] progress (HASH origin -> log position up to which it sent what it owed)
-- KEYS[3] change log (STREAM), KEYS[4] its last sequence number (STRING)
-- KEYS[5] nodes (HASH node id -> origin of its last process to join)
-- ARGV[1] 'h' heartbeat or 'l' leave, ARGV[2] this replica's origin, ARGV[3] its progress
-- ARGV[4] member timeout ms, ARGV[5] approximate most log entries kept, ARGV[6] a unique tag
-- ARGV[7] this replica's node id, ARGV[8] '1' on this process's first heartbeat
--
-- Returns (heartbeat) {origin, progress, ...} of every member; (leave) {}.

local members, progress, log, logseq, nodes = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local op, me, node, first = ARGV[1], ARGV[2], ARGV[7], ARGV[8] == '1'
local mine, timeout, keep = tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5]
if not mine or not timeout or not tonumber(keep) then
  return redis.error_reply('ERR stategate members: bad arguments')
end
-- Type checks before any write.
redis.call('HLEN', members)
redis.call('HLEN', progress)
redis.call('HLEN', nodes)
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

local function drop(m)
  redis.call('HDEL', members, m)
  local p = redis.call('HGET', progress, m) or '0'
  redis.call('HDEL', progress, m)
  append('L', m, {'p', p})
end

if first and node ~= '' and redis.call('HEXISTS', members, me) == 0 then
  local earlier = redis.call('HGET', nodes, node)
  if earlier and earlier ~= me and redis.call('HEXISTS', members, earlier) == 1 then
    drop(earlier)
  end
end
if node ~= '' then
  redis.call('HSET', nodes, node, me)
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local all = redis.call('HGETALL', members)
for i = 1, #all, 2 do
  local m, renewed = all[i], tonumber(all[i + 1]) or 0
  if m ~= me and now - renewed > timeout then
    drop(m)
  end
end
if redis.call('HEXISTS', members, me) == 0 then
  append('J', me, {})
end
redis.call('HSET', members, me, now)
redis.call('HSET', progress, me, mine)
return redis.call('HGETALL', progress)
