-- reap.lua: crash recovery. Releases leases past their expiry (a gateway that died
-- mid-request), drops waiters past their deadline (a gateway that died while they waited),
-- then pumps every pool. Idempotent; every gateway runs it every second.
-- (common.lua is prepended at load time.)
--
-- KEYS[1]  the key prefix "sy:{sy}:"
-- ARGV     now_ms
-- Returns  {leases released, waiters dropped, waiters granted}

local now = tonumber(ARGV[1])
local released, dropped, granted = 0, 0, 0
for _, model in ipairs(redis.call("SMEMBERS", P .. "pools")) do
  for _, id in ipairs(redis.call("ZRANGEBYSCORE", P .. "lease:" .. model, "-inf", now,
    "LIMIT", 0, 1000)) do
    release_lease(model, id, now, false)
    released = released + 1
  end
  for _, id in ipairs(redis.call("ZRANGEBYSCORE", P .. "qdl:" .. model, "-inf", now,
    "LIMIT", 0, 1000)) do
    remove_waiter(model, id, redis.call("HGET", P .. "qi:" .. id, "class"))
    dropped = dropped + 1
  end
  granted = granted + pump(model, now)
end
return {released, dropped, granted}
