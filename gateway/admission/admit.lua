-- admit.lua: check every rate limit that applies to one request; commit all of them or none.
--
-- Each limit is a sliding window made of two fixed windows: the estimate at `now` is
-- prev * (1 - elapsed / W) + cur, where elapsed is the time since the current window began.
--
-- KEYS[1]  the key prefix "sy:{sy}:" (routes the call to the hash tag's slot); the counters
--          are KEYS[1] .. "rl:<limit-id>:<window-index>", window-index = floor(now_ms / W)
-- ARGV[1]  now_ms (the caller's clock)
-- ARGV[2..] five values per limit: id, kind ("req" | "tok"), window_ms, limit, cost
-- Returns  {1}: admitted; every current window was incremented by its cost (PEXPIRE 2 W).
--          {0, i, retry_after_ms}: limit i (1-based, in ARGV order) would overflow; nothing
--          was written. retry_after_ms is the time until its estimate leaves room for the
--          cost if no one else arrives meanwhile, or -1 when the cost exceeds the limit
--          itself (it never fits).

local prefix = KEYS[1]
local now = tonumber(ARGV[1])
local count = (#ARGV - 1) / 5
local names = {}
local limits = {}

-- Every counter in one MGET: the current and the previous window of each limit.
for i = 1, count do
  local base = 1 + (i - 1) * 5
  local window = tonumber(ARGV[base + 3])
  local index = math.floor(now / window)
  local stem = prefix .. "rl:" .. ARGV[base + 1] .. ":"
  names[2 * i - 1] = stem .. string.format("%d", index)
  names[2 * i] = stem .. string.format("%d", index - 1)
  limits[i] = {window = window, limit = tonumber(ARGV[base + 4]), cost = tonumber(ARGV[base + 5]),
    elapsed = now - index * window}
end
local counts = redis.call("MGET", unpack(names))

for i = 1, count do
  local l = limits[i]
  local window, limit, cost, elapsed = l.window, l.limit, l.cost, l.elapsed
  local cur = tonumber(counts[2 * i - 1] or "0")
  local prev = tonumber(counts[2 * i] or "0")
  local estimate = prev * (1 - elapsed / window) + cur
  -- The epsilon keeps float rounding from refusing a request at exactly the retry time.
  if estimate + cost > limit + 1e-9 then
    local retry
    if cost > limit then
      retry = -1
    elseif cur + cost <= limit then
      -- Room comes in this window, as the previous window's weight fades.
      retry = window * (1 - (limit - cur - cost) / prev) - elapsed
    else
      -- Not before the next window, where this window's count becomes the fading one.
      retry = (window - elapsed) + window * (1 - (limit - cost) / cur)
    end
    if retry ~= -1 then
      retry = math.max(1, math.ceil(retry))
    end
    return {0, i, retry}
  end
end

for i = 1, count do
  local cost = limits[i].cost
  if cost > 0 and redis.call("INCRBY", names[2 * i - 1], cost) == cost then
    -- A window's first count creates it; its TTL is set once, then left alone.
    redis.call("PEXPIRE", names[2 * i - 1], 2 * limits[i].window)
  end
end
return {1}
