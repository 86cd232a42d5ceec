-- finish.lua: end one task: its terminal fields, its result lifetime, its stream entry
-- acknowledged and deleted, the model's depth counted down, pollers told; optionally a copy
-- of the entry on the dead-letter stream. One atomic call, so a poller never sees a result
-- whose entry is still pending, and a duplicate delivery cannot end a task twice.
--
-- KEYS[1]  the task's hash          KEYS[2]  its partition stream
-- KEYS[3]  the model's depth        KEYS[4]  the dead-letter stream
-- ARGV[1]  the stream entry id      ARGV[2]  the consumer group
-- ARGV[3]  the task id (published)  ARGV[4]  the done channel
-- ARGV[5]  n: how many of the next values are the dead letter's (field, value) pairs
--          (0: not dead-lettered); the values after those are the task's (field, value) pairs.
-- Returns  {ended, removed}: ended 1 when this call ended the task (0: it had ended before,
--          or its hash is gone), removed 1 when this call deleted the entry (and counted the
--          depth down: exactly once per entry).

local key = KEYS[1]
local n = tonumber(ARGV[5])
local ended = 0
local status = redis.call("HGET", key, "status")
if status and status ~= "done" and status ~= "failed" and status ~= "expired" and #ARGV > 5 + n then
  local pairs_ = {}
  for i = 6 + n, #ARGV do
    pairs_[#pairs_ + 1] = ARGV[i]
  end
  redis.call("HSET", key, unpack(pairs_))
  local ttl = tonumber(redis.call("HGET", key, "result_ttl_s") or "600") or 600
  redis.call("PEXPIRE", key, math.max(ttl, 1) * 1000)
  ended = 1
  if n > 0 then
    local letter = {}
    for i = 6, 5 + n do
      letter[#letter + 1] = ARGV[i]
    end
    redis.call("XADD", KEYS[4], "*", unpack(letter))
  end
end
redis.call("XACK", KEYS[2], ARGV[2], ARGV[1])
local removed = redis.call("XDEL", KEYS[2], ARGV[1])
if removed == 1 then
  local depth = tonumber(redis.call("GET", KEYS[3]) or "0") or 0
  if depth > 0 then
    redis.call("DECR", KEYS[3])
  end
end
if ended == 1 then
  redis.call("PUBLISH", ARGV[4], ARGV[3])
end
return {ended, removed}
