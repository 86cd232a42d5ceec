-- release.lua: give a grant's capacity back, correct the token windows the request was
-- counted in by what it really used, and grant the next waiters: the end of a request in one
-- atomic call. (limits.lua and common.lua are prepended at load time.)
--
-- KEYS[1]  the model pool's slot prefix "sy:{sy/<model>}:" (gateway/slots.py)
-- ARGV     now_ms, request id, model, then token reconciliations, four values each
--          (limits.lua); none is fine.
-- Returns  {released, granted, adjusted}: released is 1 when the lease existed (0: already
--          released or reaped; releasing twice is harmless), granted the waiters granted
--          after it, adjusted the token windows corrected.
--
-- A lease the reaper took (its gateway stopped renewing it) was refunded; this release
-- says it was served after all, so the charge is put back before the reconciliation.

local now = tonumber(ARGV[1])
local replica = release_lease(ARGV[3], ARGV[2], now, true)
if not replica then
  local charged = P .. "rf:" .. ARGV[2]
  local spec = redis.call("GET", charged)
  if spec then
    limits_uncount(spec, 1)
    redis.call("DEL", charged)
  end
end
local adjusted = limits_reconcile(now, ARGV, 4)
return {replica and 1 or 0, pump(ARGV[3], now), adjusted}
