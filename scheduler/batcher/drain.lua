-- drain.lua: fold tasks ended by one batcher into the model's drain rate, an EWMA of tasks
-- ended per second shared by every batcher (what the gateway's Retry-After is made from).
--
-- KEYS[1]  layout.drain_rate(model): a hash {tasks_per_s, at_ms}
-- ARGV     now_ms, tasks ended, the EWMA's time constant in ms
-- Returns  the new rate, as a string.
--
-- Each report counts its tasks over the time since the last report of any batcher, weighted
-- by 1 - exp(-dt / tau): reports from several batchers add up to their total rate.

local now = tonumber(ARGV[1])
local ended = tonumber(ARGV[2])
local tau = tonumber(ARGV[3])
local found = redis.call("HMGET", KEYS[1], "tasks_per_s", "at_ms")
local rate = tonumber(found[1] or "0") or 0
local at = tonumber(found[2] or "")
if at == nil then
  at = now - tau
end
local dt = math.max(now - at, 1)
local weight = 1 - math.exp(-dt / tau)
rate = rate + weight * (ended * 1000 / dt - rate)
local text = string.format("%.3f", rate)
redis.call("HSET", KEYS[1], "tasks_per_s", text, "at_ms", now)
return text
