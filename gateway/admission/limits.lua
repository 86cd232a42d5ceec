-- limits.lua: sliding-window rate limits, as functions acquire.lua and release.lua call.
-- (Prepended to them at load time, like common.lua; not a script of its own.)
--
-- Each limit is a sliding window made of two fixed windows: the estimate at `now` is
-- prev * (1 - elapsed / W) + cur, where elapsed is the time since the current window began.
-- Counters are "<stem>:<window-index>", window-index = floor(now_ms / W), where the stem is
-- the limit's key in its slot, e.g. "sy:{sy/@acme}:rl:uc:12:rpm" (gateway/slots.py: the
-- caller places each limit; the scripts do not add a prefix).
--
-- A limit comes as five ARGV values: stem, kind ("req" | "tok"), window_ms, limit, cost.
-- A reconciliation comes as four: stem, window_ms, window index at admission, delta
-- (actual - estimated tokens; negative refunds).

-- Reads every counter the limits at argv[first ..] need (one MGET) and judges them, writing
-- nothing. Returns (nil, state) when every limit has room for its cost, where state is what
-- limits_commit needs; or ({i, retry_after_ms}) for the first limit i (1-based) that would
-- overflow: retry_after_ms is the time until its estimate leaves room for the cost if no one
-- else arrives meanwhile, or -1 when the cost exceeds the limit itself (it never fits).
local function limits_check(now, argv, first)
  local count = math.floor((#argv - first + 1) / 5)
  local state = {names = {}, limits = {}}
  if count == 0 then
    return nil, state
  end
  local names, limits = state.names, state.limits
  for i = 1, count do
    local base = first + (i - 1) * 5
    local window = tonumber(argv[base + 2])
    local index = math.floor(now / window)
    local stem = argv[base] .. ":"
    names[2 * i - 1] = stem .. string.format("%d", index)
    names[2 * i] = stem .. string.format("%d", index - 1)
    limits[i] = {window = window, limit = tonumber(argv[base + 3]),
      cost = tonumber(argv[base + 4]), cost_text = argv[base + 4], elapsed = now - index * window}
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
      return {i, retry}, state
    end
  end
  return nil, state
end

-- Counts the request on every current window limits_check judged (all of them, or, by not
-- being called, none). A window's first count creates it; its TTL (2 W) is set once.
local function limits_commit(state)
  for i, l in ipairs(state.limits) do
    if l.cost > 0 and redis.call("INCRBY", state.names[2 * i - 1], l.cost) == l.cost then
      redis.call("PEXPIRE", state.names[2 * i - 1], 2 * l.window)
    end
  end
end

-- What limits_commit counted, as one string to keep with the request ("" for nothing):
-- window key, cost, window key, cost ... one a line; limits_uncount gives it back. One
-- concat of strings that exist already (the keys, ARGV's costs): this runs on every
-- admission, and building a string per limit cost several µs a call.
local function limits_spec(state)
  local parts = {}
  for i, l in ipairs(state.limits) do
    if l.cost > 0 then
      parts[#parts + 1] = state.names[2 * i - 1]
      parts[#parts + 1] = l.cost_text
    end
  end
  return table.concat(parts, "\n")
end

-- Takes a limits_spec charge back (sign -1: a request that ended without a replica
-- answering) or puts it back (sign 1: one that turned out to be served after all). Windows
-- that expired are left alone (a key INCRBY creates has no TTL, and is removed again), and
-- no counter goes below zero.
local function limits_uncount(spec, sign)
  if not spec or spec == "" then
    return
  end
  for key, cost in string.gmatch(spec, "([^\n]+)\n([^\n]+)") do
    local delta = sign * tonumber(cost)
    local value = redis.call("INCRBY", key, delta)
    if value == delta and redis.call("PTTL", key) == -1 then
      redis.call("DEL", key)
    elseif value < 0 then
      redis.call("SET", key, 0, "KEEPTTL")
    end
  end
end

-- Corrects the token windows a request was admitted into by what it really used. A window
-- that no longer exists (expired) or no longer counts (older than the previous window) is
-- left alone, no counter goes below zero, the TTL set at admission is kept. Returns how many
-- windows were adjusted.
--
-- One INCRBY a window: the window a request was counted in still exists while it counts
-- (its TTL is 2 W from its first count), so the common case needs no read first. A result
-- equal to the delta may mean INCRBY created the key (it was gone: flushed or evicted):
-- such a key has no TTL, and is removed again.
local function limits_reconcile(now, argv, first)
  local adjusted = 0
  for base = first, #argv - 3, 4 do
    local window = tonumber(argv[base + 1])
    local index = tonumber(argv[base + 2])
    local delta = tonumber(argv[base + 3])
    if delta ~= 0 and index >= math.floor(now / window) - 1 then
      local key = argv[base] .. ":" .. string.format("%d", index)
      local value = redis.call("INCRBY", key, delta)
      if value == delta and redis.call("PTTL", key) == -1 then
        redis.call("DEL", key)
      else
        if value < 0 then
          redis.call("SET", key, 0, "KEEPTTL")
        end
        adjusted = adjusted + 1
      end
    end
  end
  return adjusted
end
