-- renew.lua: extend a running request's lease (every lease_ms / 3 while it runs).
-- (common.lua is prepended at load time.)
--
-- KEYS[1]  the key prefix "sy:{sy}:"
-- ARGV     now_ms, request id, model, lease_ms
-- Returns  1 when renewed; 0 when the lease is gone (reaped, or released).

local id = ARGV[2]
local leases = P .. "lease:" .. ARGV[3]
if redis.call("ZSCORE", leases, id) == false then
  return 0
end
local lease_ms = tonumber(ARGV[4])
redis.call("ZADD", leases, "XX", tonumber(ARGV[1]) + lease_ms, id)
redis.call("PEXPIRE", P .. "grant:" .. id, lease_ms)
return 1
