-- reconcile.lua: correct the token windows a request was admitted into by what it really used.
--
-- KEYS[1]  the key prefix "sy:{sy}:"; counters are KEYS[1] .. "rl:<limit-id>:<window-index>"
-- ARGV[1]  now_ms
-- ARGV[2..] four values per window: id, window_ms, window index at admission, delta
--          (actual - estimated tokens; negative refunds)
-- Returns  the number of windows adjusted. A window that no longer exists (expired) or no
--          longer counts (older than the previous window) is left alone, and no counter is
--          taken below zero; the TTL set at admission is kept.

local prefix = KEYS[1]
local now = tonumber(ARGV[1])
local adjusted = 0

for base = 2, #ARGV, 4 do
  local window = tonumber(ARGV[base + 1])
  local index = tonumber(ARGV[base + 2])
  local delta = tonumber(ARGV[base + 3])
  if delta ~= 0 and index >= math.floor(now / window) - 1 then
    local key = prefix .. "rl:" .. ARGV[base] .. ":" .. string.format("%d", index)
    local value = redis.call("GET", key)
    if value then
      redis.call("SET", key, math.max(0, tonumber(value) + delta), "KEEPTTL")
      adjusted = adjusted + 1
    end
  end
end
return adjusted
