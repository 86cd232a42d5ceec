-- release.lua: give a grant's capacity back and grant the next waiters.
-- (common.lua is prepended at load time.)
--
-- KEYS[1]  the key prefix "sy:{sy}:"
-- ARGV     now_ms, request id, model
-- Returns  {released, granted}: released is 1 when the lease existed (0: already released
--          or reaped; releasing twice is harmless), granted the waiters granted after it.

local now = tonumber(ARGV[1])
local replica = release_lease(ARGV[3], ARGV[2], now, true)
return {replica and 1 or 0, pump(ARGV[3], now)}
