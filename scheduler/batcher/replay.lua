-- replay.lua: a dead letter back onto its partition stream, as a fresh queued task: attempts
-- reset, its error and end cleared, its queue time limit counted again from now. Atomic, so
-- two officers replaying one letter queue it once.
--
-- KEYS[1]  the dead-letter stream    KEYS[2]  the partition stream
-- KEYS[3]  the task's hash           KEYS[4]  the model's depth
-- ARGV[1]  the dead letter's id      ARGV[2]  now_ms
-- ARGV[3]  the new expires_ms        ARGV[4]  the hash's lifetime while queued (ms)
-- ARGV[5..] the entry's (field, value) pairs, ENTRY_FIELDS, expires_ms already the new one
-- Returns  the new stream entry id, or false when the letter is gone (replayed already).

if #redis.call("XRANGE", KEYS[1], ARGV[1], ARGV[1]) == 0 then
  return false
end
local entry = {}
local fields = {}
for i = 5, #ARGV, 2 do
  entry[#entry + 1] = ARGV[i]
  entry[#entry + 1] = ARGV[i + 1]
  fields[ARGV[i]] = ARGV[i + 1]
end
local id = redis.call("XADD", KEYS[2], "*", unpack(entry))
redis.call("INCR", KEYS[4])
if redis.call("EXISTS", KEYS[3]) == 0 then
  -- The result's lifetime has passed: the task is made again so that its owner can poll it.
  redis.call("HSET", KEYS[3], "use_case_id", fields["use_case_id"] or "",
    "tenant", fields["tenant"] or "", "model", fields["model"] or "",
    "endpoint", fields["endpoint"] or "", "created_ms", fields["created_ms"] or ARGV[2],
    "deadline_ms", fields["deadline_ms"] or "0", "result_ttl_s", "600")
end
redis.call("HDEL", KEYS[3], "started_ms", "finished_ms", "status_code", "result", "error",
  "collapsed", "dead_lettered")
redis.call("HSET", KEYS[3], "status", "queued", "attempts", "0", "expires_ms", ARGV[3])
redis.call("PEXPIRE", KEYS[3], ARGV[4])
redis.call("XDEL", KEYS[1], ARGV[1])
return id
