-- renew.lua: extend running requests' leases; each gateway renews all of its own in one call
-- every lease_ms / 3. (limits.lua and common.lua are prepended at load time.)
--
-- KEYS[1]  the model pool's slot prefix "sy:{sy/<model>}:" (gateway/slots.py)
-- ARGV     now_ms, lease_ms, then request id/model pairs
-- Returns  one value per pair: 1 when renewed; 0 when that lease is gone (reaped, released).

local expiry = tonumber(ARGV[1]) + tonumber(ARGV[2])
local lease_ms = tonumber(ARGV[2])
local renewed = {}
for i = 3, #ARGV - 1, 2 do
  local id, leases = ARGV[i], P .. "lease:" .. ARGV[i + 1]
  if redis.call("ZSCORE", leases, id) == false then
    renewed[#renewed + 1] = 0
  else
    redis.call("ZADD", leases, "XX", expiry, id)
    redis.call("PEXPIRE", P .. "grant:" .. id, lease_ms)
    renewed[#renewed + 1] = 1
  end
end
return renewed
