#!lua flags=no-writes
-- A page of stategate's ordered key index with each key's deadline, in one call.
--
-- KEYS[1] index (ZSET, score 0, member = key), KEYS[2] deadlines (ZSET, score = deadline ms)
-- ARGV[1] lower bound ('-' = from the start, '(' .. key = strictly after key)
-- ARGV[2] most keys to return
--
-- Returns {keys in byte order, their deadlines (nil = none)}. What is expired is decided by
-- the caller, which knows the time.

local keys = redis.call('ZRANGE', KEYS[1], ARGV[1], '+', 'BYLEX', 'LIMIT', 0, ARGV[2])
local deadlines = {}
-- unpack has a stack limit: ask for scores a chunk at a time.
for first = 1, #keys, 1000 do
  local last = math.min(first + 999, #keys)
  local scores = redis.call('ZMSCORE', KEYS[2], unpack(keys, first, last))
  for j = 1, #scores do
    deadlines[first + j - 1] = scores[j]
  end
end
return {keys, deadlines}
