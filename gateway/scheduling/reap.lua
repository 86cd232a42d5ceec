-- reap.lua: crash recovery. Releases the leases and drops the waiters of gateways whose
-- heartbeat expired (a gateway that died: its requests are gone with it, and its capacity
-- comes back within the heartbeat instead of the lease), releases leases past their expiry
-- (whatever is left of a gateway that died mid-request), drops waiters past their deadline,
-- then pumps every pool. Whatever it releases or drops gets its rate-limit charge back
-- (a release arriving after all for a reaped lease puts it back: release.lua).
-- Idempotent; every gateway runs it every second.
-- (common.lua is prepended at load time.)
--
-- KEYS[1]  the model pool's slot prefix "sy:{sy/<model>}:" (gateway/slots.py)
-- ARGV     now_ms
-- Returns  {leases released, waiters dropped, waiters granted}

local now = tonumber(ARGV[1])
local released, dropped, granted = 0, 0, 0
local models = redis.call("SMEMBERS", P .. "pools")

-- Gateways whose heartbeat expired since the last pass: normally none, one command. A death
-- is rare, so walking every lease and waiter of every pool once for it is affordable; the
-- gateway then leaves the registry (a waiter of an unknown gateway counts as dead too).
local dead_ids = redis.call("ZRANGEBYSCORE", GATEWAYS, "-inf", "(" .. ARGV[1], "LIMIT", 0, 100)
if #dead_ids > 0 then
  local dead = {}
  for _, gw in ipairs(dead_ids) do
    dead[gw] = true
  end
  for _, model in ipairs(models) do
    for _, id in ipairs(redis.call("ZRANGE", P .. "lease:" .. model, 0, -1)) do
      local gw = redis.call("HGET", P .. "li:" .. id, "gw")
      if gw and dead[gw] then
        release_lease(model, id, now, false, "reaped")
        released = released + 1
      end
    end
    for _, id in ipairs(redis.call("ZRANGE", P .. "q:" .. model, 0, -1)) do
      local gw = redis.call("HGET", P .. "qi:" .. id, "gw")
      if gw and dead[gw] then
        drop_waiter(model, id)
        dropped = dropped + 1
      end
    end
  end
  redis.call("ZREM", GATEWAYS, unpack(dead_ids))
end

for _, model in ipairs(models) do
  for _, id in ipairs(redis.call("ZRANGEBYSCORE", P .. "lease:" .. model, "-inf", now,
    "LIMIT", 0, 1000)) do
    release_lease(model, id, now, false, "reaped")
    released = released + 1
  end
  for _, id in ipairs(redis.call("ZRANGEBYSCORE", P .. "qdl:" .. model, "-inf", now,
    "LIMIT", 0, 1000)) do
    drop_waiter(model, id)
    dropped = dropped + 1
  end
  local g, d = pump(model, now)
  granted = granted + g
  dropped = dropped + d
end
return {released, dropped, granted}
