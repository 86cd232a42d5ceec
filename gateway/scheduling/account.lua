-- account.lua: a request's limits and max-concurrent count that live outside its pool's slot
-- (the tenant's slot, or the shared one for the global limit), for a Valkey Cluster, where a
-- script may touch one slot only (docs/gateway-scheduling.md, "Scale-out"). On one Valkey
-- acquire.lua does all of this itself, in the same atomic call. (limits.lua is prepended at
-- load time.)
--
-- KEYS[1]  the slot's prefix, e.g. "sy:{sy/@acme}:" (gateway/slots.py)
-- ARGV[1]  the operation:
--   charge  now_ms, request id, concurrency key ("" for none), max concurrent, expiry_ms,
--           then the rate limits, five values each (limits.lua)
--           -> {1}                                  counted (limits, and the request in the
--                                                   use case's set until expiry_ms)
--              {-4, "rate_limited", i, retry_ms}    limit i would overflow; nothing written
--              {-1, "max_concurrent", count}        the use case is at its maximum; nothing
--                                                   written
--   refund  now_ms, request id, concurrency key
--           -> {1} the charge was given back; {0} there was none (refunded, or expired)
--   settle  now_ms, request id, concurrency key, then token reconciliations, four values each
--           -> {windows adjusted}                   the request was served: its tokens
--                                                   corrected, its place in the set freed
--   renew   now_ms, expiry_ms, then concurrency key / request id pairs
--           -> {renewed}                            the requests still in their sets
--
-- The use case's set: request id -> expiry (ms). Entries past their expiry no longer count,
-- so a gateway that dies with requests in flight blocks its use case only until then (the
-- owner renews its entries with its leases). What a charge counted is kept in rf:<id> until
-- the request ends, for its refund; a dead gateway's charge stays counted until its windows
-- pass (on a Cluster, the only cost of not reaping across slots: limits stay upper bounds).

local op = ARGV[1]
local now = tonumber(ARGV[2])
local P = KEYS[1]

local KEEP_MS = 3600000  -- how long a charge's record and a set outlive their last expiry

local function conc_count(key)
  redis.call("ZREMRANGEBYSCORE", key, "-inf", now)
  return redis.call("ZCARD", key)
end

-- The set outlives its latest entry (never shortened by an earlier one's).
local function keep_set(key, expiry)
  local at = redis.call("PEXPIRETIME", key)
  if at >= 0 and at < expiry + KEEP_MS or at == -1 then
    redis.call("PEXPIREAT", key, expiry + KEEP_MS)
  end
end

if op == "charge" then
  local id, conc_key, max_concurrent = ARGV[3], ARGV[4], tonumber(ARGV[5])
  local expiry = tonumber(ARGV[6])
  if conc_key ~= "" then
    local count = conc_count(conc_key)
    if count >= max_concurrent then
      return {-1, "max_concurrent", count}
    end
  end
  local refused, state = limits_check(now, ARGV, 7)
  if refused then
    return {-4, "rate_limited", refused[1], refused[2]}
  end
  limits_commit(state)
  local spec = limits_spec(state)
  if spec ~= "" then
    -- Kept an hour past the request's own expiry: a refund or settle after that finds nothing.
    redis.call("SET", P .. "rf:" .. id, spec, "PX", math.max(1, expiry - now) + KEEP_MS)
  end
  if conc_key ~= "" then
    redis.call("ZADD", conc_key, expiry, id)
    keep_set(conc_key, expiry)
  end
  return {1}
end

if op == "refund" or op == "settle" then
  local id, conc_key = ARGV[3], ARGV[4]
  local charged = P .. "rf:" .. id
  local spec = redis.call("GET", charged)
  if conc_key ~= "" then
    redis.call("ZREM", conc_key, id)
  end
  redis.call("DEL", charged)
  if op == "refund" then
    if spec then
      limits_uncount(spec, -1)
      return {1}
    end
    return {0}
  end
  return {limits_reconcile(now, ARGV, 5)}
end

if op == "renew" then
  local expiry = tonumber(ARGV[3])
  local renewed = 0
  for i = 4, #ARGV - 1, 2 do
    if redis.call("ZSCORE", ARGV[i], ARGV[i + 1]) then
      redis.call("ZADD", ARGV[i], "XX", expiry, ARGV[i + 1])
      keep_set(ARGV[i], expiry)
      renewed = renewed + 1
    end
  end
  return {renewed}
end

return redis.error_reply("account.lua: unknown operation " .. tostring(op))
