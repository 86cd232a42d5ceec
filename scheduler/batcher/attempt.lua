-- attempt.lua: count a failed attempt on a task that will be tried again (or dead-lettered
-- by finish.lua once it has had its MAX_ATTEMPTS), and show it queued while it waits.
--
-- KEYS[1]  the task's hash
-- ARGV[1]  the error (an OpenAI error object, JSON): the last attempt's, for pollers
-- Returns  the attempts now counted; -1 when the hash is gone or the task already ended.

local status = redis.call("HGET", KEYS[1], "status")
if not status or status == "done" or status == "failed" or status == "expired" then
  return -1
end
local attempts = redis.call("HINCRBY", KEYS[1], "attempts", 1)
redis.call("HSET", KEYS[1], "status", "queued", "error", ARGV[1])
return attempts
