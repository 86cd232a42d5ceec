-- acquire.lua: admission in one atomic call: the rate limits, then dispatch now, or enqueue
-- in the model pool's priority queue. (limits.lua and common.lua are prepended at load time.)
--
-- KEYS[1]  the model pool's slot prefix "sy:{sy/<model>}:"; KEYS[2] the tenant's,
--          "sy:{sy/@<tenant>}:" (the use case's max concurrent; gateway/slots.py)
-- ARGV     now_ms, request id, model, rank, class, max queue length, tenant, use case id,
--          max concurrent (0 = none), the class's pool share in thousandths (1000 = all of
--          the pool; common.lua class_full), cost (tokens), prefix hash (or ""), long
--          ("1": a long prompt, for the pool's lanes; "0"), lease_ms, gateway id, queue
--          deadline (ms), stale_ms, waiting threshold, lanes ("1": the pool keeps long
--          prompts apart, common.lua pick; "0"), n, then n replica/cap pairs (the pool,
--          recorded in pool:<model> for the other scripts), then the rate limits, five
--          values each (limits.lua); none is fine.
--          The limits are counted only when the request is granted or enqueued: a refusal,
--          whichever its reason, costs no budget; a waiter that leaves without a grant, and
--          a lease that is reaped, get the charge back (common.lua drop_waiter,
--          release_lease). A use case's max concurrent counts its waiters too.
-- Returns  {1, replica}                                granted now
--          {0, ahead, hold_ms, in_flight}               enqueued; `ahead` waiters before it
--          {-1, "max_concurrent", waiting_or_in_flight_of_use_case, hold_ms}
--          {-2, "queue_full", ahead, hold_ms, in_flight, higher_rate}  the class's queue
--                                                       is full
--          {-3, "cancelled"}                            cancel.lua ran first for this id
--          {-4, "rate_limited", i, retry_after_ms}      limit i would overflow (limits.lua)
--          hold_ms: the pool's moving average time a grant is held (-1: none yet);
--          in_flight: the pool's requests in flight; higher_rate: requests enqueued per
--          1000 s lately at better ranks (common.lua higher_rate); together, for a
--          Retry-After estimate (errors.py retry_after_s).

local now = tonumber(ARGV[1])
local id = ARGV[2]
local model = ARGV[3]
local rank = tonumber(ARGV[4])
local class = ARGV[5]
local max_queue = tonumber(ARGV[6])
local share = tonumber(ARGV[10])
local w = {tenant = ARGV[7], uc = ARGV[8], maxc = tonumber(ARGV[9]), lease = tonumber(ARGV[14]),
  gw = ARGV[15], prefix = ARGV[12], long = ARGV[13] == "1" and ARGV[19] == "1"}
if share < 1000 then
  w.cls = class  -- counted in cif:<model> while granted (common.lua grant, release_lease)
  w.share = share
end
local cost = tonumber(ARGV[11])
local deadline = tonumber(ARGV[16])

if redis.call("EXISTS", P .. "gone:" .. id) == 1 then
  return {-3, "cancelled"}
end

-- Rate limits first: a refused request writes nothing at all.
local replica_count = tonumber(ARGV[20])
local refused, limits = limits_check(now, ARGV, 21 + 2 * replica_count)
if refused then
  return {-4, "rate_limited", refused[1], refused[2]}
end

-- The pool as this gateway knows it from policy; recorded when it changed, so that release,
-- pump and reap (which are not given it) see the same replicas and caps.
local pool = {replicas = {}, caps = {}, stale = tonumber(ARGV[17]), threshold = tonumber(ARGV[18]),
  lanes = ARGV[19] == "1"}
for i = 21, 20 + 2 * replica_count, 2 do
  pool.replicas[#pool.replicas + 1] = ARGV[i]
  pool.caps[ARGV[i]] = tonumber(ARGV[i + 1])
end
table.sort(pool.replicas)
local signature = {ARGV[17], ARGV[18], ARGV[19]}
for _, replica in ipairs(pool.replicas) do
  signature[#signature + 1] = replica .. "=" .. pool.caps[replica]
end
signature = table.concat(signature, " ")
if redis.call("HGET", P .. "pool:" .. model, "_sig") ~= signature then
  local key = P .. "pool:" .. model
  redis.call("DEL", key)
  redis.call("HSET", key, "_stale_ms", pool.stale, "_threshold", pool.threshold,
    "_lanes", pool.lanes and 1 or 0, "_sig", signature)
  for _, replica in ipairs(pool.replicas) do
    redis.call("HSET", key, replica, pool.caps[replica])
  end
  redis.call("SADD", P .. "pools", model)
end

-- Waiting or in flight: a waiter counts from the moment it enqueues, so that once at the
-- head of the queue it can always be granted (a capped use case never blocks the pump).
if w.maxc > 0 then
  local admitted = tonumber(redis.call("GET", ACCOUNT .. "conc:" .. w.uc) or "0")
  if admitted >= w.maxc then
    return {-1, "max_concurrent", admitted, hold_ms(model)}
  end
end

-- What the limits were charged, kept until the request ends: given back if no replica
-- answers it (common.lua drop_waiter, release_lease). No key for a request without limits.
local function keep_charge(request_id, state)
  local spec = limits_spec(state)
  if spec ~= "" then
    redis.call("SET", P .. "rf:" .. request_id, spec)
  end
end

local q = P .. "q:" .. model
local bound = "(" .. string.format("%.0f", (rank + 1) * RANK_SCALE)
local room = load_room(model, pool, now)
if #redis.call("ZRANGEBYSCORE", q, "-inf", bound, "LIMIT", 0, 1) == 0
  and not (w.cls and class_full(model, room, class, share)) then
  local replica = pick(model, pool, room, w.prefix, w.long, w.cls ~= nil)
  if replica then
    limits_commit(limits)
    keep_charge(id, limits)
    w.start = start_tag(model, w.tenant, cost, true)
    grant(model, pool, room, id, replica, w, now)
    return {1, replica}
  end
end

local qlen = P .. "qlen:" .. model .. ":" .. class
if tonumber(redis.call("GET", qlen) or "0") >= max_queue then
  return {-2, "queue_full", redis.call("ZCOUNT", q, "-inf", bound), hold_ms(model), room.total,
    higher_rate(model, rank, now)}
end
limits_commit(limits)
keep_charge(id, limits)
local conc_key = ""
if w.maxc > 0 then
  conc_key = ACCOUNT .. "conc:" .. w.uc
  redis.call("INCR", conc_key)
end
w.start = start_tag(model, w.tenant, cost)
count_arrival(model, rank, now)
redis.call("ZADD", q, rank * RANK_SCALE + w.start, id)
redis.call("ZADD", P .. "qdl:" .. model, deadline, id)
redis.call("HSET", P .. "qi:" .. id, "tenant", w.tenant, "class", class, "rank", rank,
  "cost", cost, "uc", w.uc, "maxc", w.maxc, "lease", w.lease, "gw", w.gw, "prefix", w.prefix,
  "deadline", deadline, "start", w.start, "enqueued_at", now, "ck", conc_key)
if w.cls then
  redis.call("HSET", P .. "qi:" .. id, "share", share)
end
if w.long then
  redis.call("HSET", P .. "qi:" .. id, "lp", 1)
end
redis.call("INCR", qlen)

-- Room and waiters together means nobody pumped since the room appeared (a watcher that
-- does not pump): pump now, this one included.
if any_room(pool, room) then
  pump(model, now, pool, room, id)
  if redis.call("ZSCORE", q, id) == false then
    local replica = redis.call("HGET", P .. "li:" .. id, "replica")
    if replica then
      return {1, replica}
    end
  end
  -- Not in the queue and not granted: its deadline had already passed (dropped and
  -- refunded). Its caller's timer will find that out through cancel.lua.
end
return {0, redis.call("ZRANK", q, id) or 0, hold_ms(model), room.total}
