-- start.lua: mark a batch's tasks running, in one call; a task already ended (a duplicate
-- delivery after a reclaim) or gone (its hash expired) is reported, not touched. A task
-- found running was started by a batcher that never ended it (it died, or its batch
-- crashed): that attempt failed, and is counted here, so that a task that kills its
-- batchers ends on the dead-letter stream instead of going round for ever.
--
-- KEYS     the tasks' hashes (layout.task)
-- ARGV[1]  now_ms (started_ms)
-- Returns  per task, in KEYS order: its status before this call ("gone" when the hash does
--          not exist), then its attempts (including one just counted).

local out = {}
for i, key in ipairs(KEYS) do
  local found = redis.call("HMGET", key, "status", "attempts")
  local status = found[1]
  if not status then
    if redis.call("EXISTS", key) == 0 then
      status = "gone"
    else
      status = "queued"
    end
  end
  local attempts = found[2] or "0"
  if status == "running" then
    attempts = tostring(redis.call("HINCRBY", key, "attempts", 1))
  end
  if status ~= "gone" and status ~= "done" and status ~= "failed" and status ~= "expired" then
    redis.call("HSET", key, "status", "running", "started_ms", ARGV[1])
  end
  out[#out + 1] = status
  out[#out + 1] = attempts
end
return out
