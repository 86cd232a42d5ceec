-- dead_letter_replay.lua: put one dead-lettered async task back in its stream, in one atomic
-- call, so that two officers (or one double click) cannot queue it twice: the dead letter is
-- read and deleted in the same call that re-adds it (gateway/async_tasks/layout.py).
--
-- KEYS[1]  the dead-letter stream (layout.dead_letters())
-- KEYS[2]  the partition stream the entry's "stream" field names (checked against it here)
-- KEYS[3]  the task's hash (layout.task(id))
-- KEYS[4]  the model's depth counter (layout.depth(model))
-- ARGV     entry id, now_ms, queue TTL in ms, the result TTL in seconds (written only when
--          the hash is gone and must be rebuilt), then the stream entry's field names
--          (layout.ENTRY_FIELDS), in order
-- Returns  {"ok", new stream entry id}
--          {"gone"}                   no such dead letter (discarded or already replayed)
--          {"conflict", reason}       the entry cannot run again: "status:<s>" (the task did
--                                     not end failed: another copy ran or is queued),
--                                     "deadline" (its deadline has passed), "stream" (the
--                                     entry names another stream than KEYS[2])

local found = redis.call("XRANGE", KEYS[1], ARGV[1], ARGV[1])
if #found == 0 then
  return {"gone"}
end
local flat = found[1][2]
local entry = {}
for i = 1, #flat, 2 do
  entry[flat[i]] = flat[i + 1]
end
if entry["stream"] ~= KEYS[2] then
  return {"conflict", "stream"}
end

local now = tonumber(ARGV[2])
local queue_ttl_ms = tonumber(ARGV[3])
local status = redis.call("HGET", KEYS[3], "status")
if status and status ~= "failed" then
  return {"conflict", "status:" .. status}
end
local deadline = tonumber(entry["deadline_ms"] or "0") or 0
if deadline > 0 and deadline <= now then
  return {"conflict", "deadline"}
end

-- A fresh queue lifetime: the old one may have run out while the task sat dead-lettered, and
-- the batcher ends a task past expires_ms without running it.
entry["expires_ms"] = tostring(now + queue_ttl_ms)
local fields = {}
for i = 5, #ARGV do
  fields[#fields + 1] = ARGV[i]
  fields[#fields + 1] = entry[ARGV[i]] or ""
end
local added = redis.call("XADD", KEYS[2], "*", unpack(fields))

if status then
  redis.call("HDEL", KEYS[3], "dead_lettered", "error", "result", "status_code", "started_ms",
    "finished_ms", "collapsed")
  redis.call("HSET", KEYS[3], "status", "queued", "attempts", "0", "expires_ms",
    entry["expires_ms"])
else
  -- The failed task's hash outlived its result TTL: rebuild what submit writes, so that the
  -- batcher runs the task and its owner can poll it again.
  redis.call("HSET", KEYS[3],
    "status", "queued",
    "use_case_id", entry["use_case_id"] or "",
    "tenant", entry["tenant"] or "",
    "model", entry["model"] or "",
    "endpoint", entry["endpoint"] or "",
    "created_ms", entry["created_ms"] or "0",
    "deadline_ms", entry["deadline_ms"] or "0",
    "expires_ms", entry["expires_ms"],
    "attempts", "0",
    "result_ttl_s", ARGV[4])
end
redis.call("PEXPIRE", KEYS[3], queue_ttl_ms)
redis.call("INCR", KEYS[4])
redis.call("XDEL", KEYS[1], ARGV[1])
return {"ok", added}
