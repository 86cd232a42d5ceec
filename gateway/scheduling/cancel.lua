-- cancel.lua: a waiter gives up (queue timeout, client gone, task cancelled).
-- (common.lua is prepended at load time.)
--
-- KEYS[1]  the model pool's slot prefix "sy:{sy/<model>}:" (gateway/slots.py)
-- ARGV     now_ms, request id, model, keep ("1": if it was granted meanwhile, keep the grant;
--          "0": release it)
-- Returns  {1, ahead, hold_ms, in_flight, higher_rate}  it was still waiting; removed,
--                                           its rate-limit charge, use case count and
--                                           fair-share position given back (higher_rate:
--                                           as acquire.lua's queue_full)
--          {2, replica}                     it had been granted and keeps it (keep = "1")
--          {0, replica}                     it had been granted; released, refunded (no
--                                           replica served it: a waiter that gave up, or a
--                                           grant whose replica could not be reached), and
--                                           waiters pumped; its hold is not a service time,
--                                           so the hold estimate is left alone
--          {-1}                             nothing to cancel: dropped past its deadline,
--                                           already released, or acquire has not run yet (a
--                                           "gone" marker makes a late acquire refuse)

local now = tonumber(ARGV[1])
local id = ARGV[2]
local model = ARGV[3]
local q = P .. "q:" .. model

local ahead = redis.call("ZRANK", q, id)
if ahead then
  local _, rank = drop_waiter(model, id)
  local in_flight = 0
  for _, n in ipairs(redis.call("HVALS", P .. "inflight:" .. model)) do
    in_flight = in_flight + tonumber(n)
  end
  return {1, ahead, hold_ms(model), in_flight, higher_rate(model, rank or 0, now)}
end

local replica = redis.call("HGET", P .. "li:" .. id, "replica")
if replica then
  if ARGV[4] == "1" then
    return {2, replica}
  end
  release_lease(model, id, now, false, "cancelled")
  pump(model, now)
  return {0, replica}
end

redis.call("SET", P .. "gone:" .. id, 1, "PX", GONE_TTL_MS)
return {-1}
