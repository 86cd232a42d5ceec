-- common.lua: the functions acquire, release, pump, cancel, reap and renew share.
--
-- Not a script of its own: scheduler.py prepends it to each of them when it loads them, so
-- every script is still one atomic call. KEYS[1] is the prefix of the model pool's slot,
-- "sy:{sy/<model>}:", in all of them (gateway/slots.py); acquire's KEYS[2] is the tenant's
-- slot, "sy:{sy/@<tenant>}:", where the use cases' max-concurrent counts live.
--
-- Keys (KEYS[1] .. name unless said; docs/gateway-scheduling.md has the table):
--   q:<model>            zset   waiters; score = rank * 2^40 + virtual start
--   qi:<id>              hash   a waiter (tenant, class, cost, rank, deadline, ...)
--   qdl:<model>          zset   waiters by deadline, so reap finds the expired ones at once
--   qlen:<model>:<class> int    waiters per class (the class's max queue length)
--   vt:<model>           hash   "_clock" = pool virtual time; "t:<tenant>" = virtual finish
--   inflight:<model>     hash   replica -> granted and not released
--   cif:<model>          hash   class -> granted and not released, for classes that may
--                               hold only a share of the pool (class_full)
--   lease:<model>        zset   request id -> lease expiry (ms)
--   li:<id>              hash   a lease (replica, model, tenant, use case, gateway, conc key)
--   conc:<use-case>      int    (KEYS[2] .. name, the tenant's slot; its full name is kept
--                               in qi/li as "ck") the use case's requests waiting or in flight (only with a
--                               max set): a waiter is counted when it enqueues, so one at
--                               the head can always be granted and never blocks the pump
--   grant:<id>           string replica granted to a waiter (the waiter's fallback poll)
--   fleet:<model>        hash   replica -> "waiting|running|kv_usage|scraped_at_ms" and,
--                               optionally, "|in_flight_at_scrape|max_running" (the watcher)
--   pool:<model>         hash   replica -> cap, "_stale_ms", "_threshold", "_sig" (acquire)
--   svc:<model>          hash   "hold_ms" = moving average of how long a grant is held
--   pools                set    the pool's own model, once it has a pool hash (what reap
--                               walks; the shared slot's registry is the Python side's)
--   aff:<model>:<hash>   string replica that last served this prompt prefix
--   gone:<id>            string a cancel that found nothing: a late acquire must not enqueue
--   rf:<id>              string what acquire counted on the rate limits (limits_spec), while
--                               the request waits or runs: given back if it ends without a
--                               replica answering; after a reap kept a while, so that a
--                               release arriving after all puts it back (a key of its own: in
--                               qi/li its length would turn those hashes from listpacks into
--                               hash tables, several µs a call)
--   gws                  zset   gateway id -> heartbeat expiry (ms), written by each gateway
--                               into the pools it uses; missing or past: dead
--   arr:<model>:<window> hash   rank -> requests enqueued in that window (ARRIVAL_WINDOW_MS)
--   lng:<model>          hash   replica -> long prompts granted and not released (lanes only)
--   drn:<model>          string the replica being drained of interactive requests so that a
--                               waiting long prompt can prefill without them (lanes only)
--   bgi:<model>          hash   replica -> background requests (classes with a pool share)
--                               granted and not released (lanes only)

local P = KEYS[1]
local ACCOUNT = KEYS[2] or P      -- the tenant's slot: max-concurrent counts (acquire only)
local RANK_SCALE = 1099511627776  -- 2^40
local REBASE_AT = 549755813888    -- 2^39: rebase virtual time long before it reaches 2^40
local AFFINITY_TTL_MS = 600000
local GONE_TTL_MS = 60000
local REFUNDED_TTL_MS = 3600000   -- how long a reaped lease's refund can be taken back
local CHANNEL = "sy:gw:"
local GATEWAYS = P .. "gws"       -- gateway id -> heartbeat expiry (ms)
local ARRIVAL_WINDOW_MS = 10000   -- the windows enqueued arrivals are counted in, per rank
local DRAIN_TTL_MS = 10000        -- a drain nobody renews (its long waiter left) lapses
local PUMP_SKIPS = 16             -- waiters a pump passes over that no replica can take now

local function pool_from_hash(model)
  local flat = redis.call("HGETALL", P .. "pool:" .. model)
  local pool = {replicas = {}, caps = {}, stale = 1000, threshold = 3, lanes = false}
  for i = 1, #flat, 2 do
    local field, value = flat[i], tonumber(flat[i + 1])
    if field == "_stale_ms" then
      pool.stale = value
    elseif field == "_threshold" then
      pool.threshold = value
    elseif field == "_lanes" then
      pool.lanes = value == 1
    elseif field == "_sig" then
      -- the signature acquire compares, not a replica
    else
      pool.replicas[#pool.replicas + 1] = field
      pool.caps[field] = value
    end
  end
  -- HGETALL's order is not stable; sorting makes ties break the same way in every call.
  table.sort(pool.replicas)
  return pool
end

-- Which replicas have room: a fresh scrape (stale or missing counts as saturated, never
-- idle), vLLM's own queue below the threshold, and fewer in flight than the cap.
--
-- vLLM's queue as it is now, not only as the last scrape saw it: an entry may carry the
-- pool's in-flight count for the replica when the scrape began ("base"). A scrape that saw
-- requests waiting saw every batch slot taken, so each grant since then waits too and each
-- release since then frees a slot: waiting + (in flight now - base) is compared with the
-- threshold. A scrape that saw nobody waiting keeps the plain rule (the cap bounds it).
-- An entry may also carry the replica's batch size as the watcher learned it (the most
-- requests it saw running while others waited); the cap is then at most that plus the
-- threshold, so a cap left at its default cannot pile requests up in vLLM's queue.
local function load_room(model, pool, now)
  local room = {inflight = {}, healthy = {}, total = 0, waiting = {}, base = {}, cap = {}}
  if #pool.replicas == 0 then
    return room
  end
  local metrics = redis.call("HMGET", P .. "fleet:" .. model, unpack(pool.replicas))
  local counts = redis.call("HMGET", P .. "inflight:" .. model, unpack(pool.replicas))
  for i, replica in ipairs(pool.replicas) do
    local n = tonumber(counts[i] or "0")
    room.inflight[replica] = n
    room.total = room.total + n
    local cap = pool.caps[replica]
    local healthy = false
    if metrics[i] then
      -- Four fields, or six; any further ones are ignored (a newer watcher's).
      local waiting, at, base, batch = string.match(metrics[i],
        "^([^|]*)|[^|]*|[^|]*|([^|]*)|?([^|]*)|?([^|]*)")
      waiting, at, base, batch = tonumber(waiting), tonumber(at), tonumber(base), tonumber(batch)
      if waiting ~= nil and at ~= nil and now - at <= pool.stale then
        if base ~= nil and waiting > 0 then
          room.waiting[replica] = waiting
          room.base[replica] = base
          healthy = true  -- judged by has_room, as grants and releases move it
        else
          healthy = waiting < pool.threshold
        end
      end
      if batch ~= nil and batch > 0 then
        cap = math.min(cap, batch + pool.threshold)
      end
    end
    room.healthy[replica] = healthy
    room.cap[replica] = cap
  end
  if pool.lanes then
    -- Long-prompt lanes (pick): where long prompts run, and the replica being drained for one.
    room.lng = {}
    local longs = redis.call("HMGET", P .. "lng:" .. model, unpack(pool.replicas))
    for i, replica in ipairs(pool.replicas) do
      room.lng[replica] = tonumber(longs[i] or "0")
    end
    room.drain = redis.call("GET", P .. "drn:" .. model) or nil
    room.bg = {}
    local background = redis.call("HMGET", P .. "bgi:" .. model, unpack(pool.replicas))
    for i, replica in ipairs(pool.replicas) do
      room.bg[replica] = tonumber(background[i] or "0")
    end
  end
  return room
end

local function has_room(pool, room, replica)
  if not room.healthy[replica] then
    return false
  end
  local n = room.inflight[replica]
  local base = room.base[replica]
  if base ~= nil and room.waiting[replica] + n - base >= pool.threshold then
    return false
  end
  return n < room.cap[replica]
end

local function any_room(pool, room)
  for _, replica in ipairs(pool.replicas) do
    if has_room(pool, room, replica) then
      return true
    end
  end
  return false
end

-- The replica that holds this prompt prefix if it has room, else the least in flight.
local function pick_any(model, pool, room, prefix_hash)
  if prefix_hash ~= "" then
    local replica = redis.call("GET", P .. "aff:" .. model .. ":" .. prefix_hash)
    if replica and pool.caps[replica] and has_room(pool, room, replica) then
      return replica
    end
  end
  local best = nil
  for _, replica in ipairs(pool.replicas) do
    if has_room(pool, room, replica)
      and (best == nil or room.inflight[replica] < room.inflight[best]) then
      best = replica
    end
  end
  return best
end

-- Long-prompt lanes (docs/gateway-scheduling.md, "Long prompts"): a long prompt's prefill
-- stalls every request running beside it, so interactive requests and long prompts never
-- share a replica. Background work (a class with a pool share: async, files, batch) does not
-- mind a stall: it may run anywhere, beside long prompts first.
local function interactive_on(room, replica)
  return room.inflight[replica] - room.lng[replica] - room.bg[replica]
end

-- A long prompt: a replica with room and no interactive request in flight, one already
-- running long prompts first (the others stay free for interactive traffic). None: it waits,
-- and one replica is drained for it (drn:<model>, renewed while it waits): one running long
-- prompts, else the one with the fewest interactive requests; no interactive request is
-- given that replica meanwhile.
local function pick_long(model, pool, room)
  local best = nil
  for _, replica in ipairs(pool.replicas) do
    if has_room(pool, room, replica) and interactive_on(room, replica) == 0
      and (best == nil or room.lng[replica] > room.lng[best]
        or (room.lng[replica] == room.lng[best]
          and room.inflight[replica] < room.inflight[best])) then
      best = replica
    end
  end
  if best then
    return best
  end
  local drain = room.drain
  if not (drain and pool.caps[drain] and room.healthy[drain]) then
    drain = nil
    for _, replica in ipairs(pool.replicas) do
      if room.healthy[replica] and (drain == nil or room.lng[replica] > room.lng[drain]
        or (room.lng[replica] == room.lng[drain]
          and interactive_on(room, replica) < interactive_on(room, drain))) then
        drain = replica
      end
    end
  end
  if drain then
    room.drain = drain
    redis.call("SET", P .. "drn:" .. model, drain, "PX", DRAIN_TTL_MS)
  end
  return nil
end

-- An interactive request: the prefix's replica or the least in flight among those with room,
-- no long prompt in flight and not being drained; none: it waits (a prefill in progress
-- would add its whole length to the request, a wait in the queue one short request's hold).
-- Background work: the least in flight among the replicas with room that run long prompts
-- or are being drained, else among the others; it leaves the lane-free replicas to
-- interactive traffic and keeps the long prompts' replica busy.
local function pick_short(model, pool, room, prefix_hash, background)
  local function lane_free(replica)
    return room.lng[replica] == 0 and replica ~= room.drain and has_room(pool, room, replica)
  end
  if not background and prefix_hash ~= "" then
    local replica = redis.call("GET", P .. "aff:" .. model .. ":" .. prefix_hash)
    if replica and pool.caps[replica] and lane_free(replica) then
      return replica
    end
  end
  local best, beside = nil, nil
  for _, replica in ipairs(pool.replicas) do
    if lane_free(replica) then
      if best == nil or room.inflight[replica] < room.inflight[best] then
        best = replica
      end
    elseif background and has_room(pool, room, replica)
      and (beside == nil or room.inflight[replica] < room.inflight[beside]) then
      beside = replica
    end
  end
  return beside or best
end

-- Where a request goes now, or nil: it waits. Only with lanes can that happen while some
-- replica has room (a long prompt waiting for a drained replica; a short one whose only
-- room is beside long prompts or on the replica being drained).
local function pick(model, pool, room, prefix_hash, long, background)
  if not pool.lanes then
    return pick_any(model, pool, room, prefix_hash)
  end
  if long then
    return pick_long(model, pool, room)
  end
  return pick_short(model, pool, room, prefix_hash, background)
end

-- Whether a class that may hold only `share` thousandths of the pool holds that many
-- already: the share of the replicas' effective caps (room.cap: the cap, or the batch size
-- the watcher learned plus the threshold), at least one. File and async work run in such a
-- class, so interactive classes always find slots free (docs/gateway-scheduling.md).
local function class_full(model, room, class, share)
  local slots = 0
  for _, cap in pairs(room.cap) do
    slots = slots + cap
  end
  local allowed = math.max(1, math.floor(slots * share / 1000))
  local held = tonumber(redis.call("HGET", P .. "cif:" .. model, class) or "0")
  return held >= allowed
end

local function hold_ms(model)
  return tonumber(redis.call("HGET", P .. "svc:" .. model, "hold_ms") or "-1")
end

-- Demand by rank, for Retry-After: every enqueued request is counted in its window. (Only
-- the enqueued: a request granted at once found room, so it held up nobody waiting.)
local function count_arrival(model, rank, now)
  local key = P .. "arr:" .. model .. ":" .. math.floor(now / ARRIVAL_WINDOW_MS)
  if redis.call("HINCRBY", key, rank, 1) == 1 then
    redis.call("PEXPIRE", key, 3 * ARRIVAL_WINDOW_MS)
  end
end

-- Requests per 1000 s enqueued at ranks better than `rank` lately: the sliding-window
-- estimate over the last ARRIVAL_WINDOW_MS (previous window weighted by the part of it
-- still inside, as limits.lua does), as an integer (replies truncate Lua numbers).
local function higher_rate(model, rank, now)
  if rank <= 0 then
    return 0
  end
  local index = math.floor(now / ARRIVAL_WINDOW_MS)
  local inside = 1 - (now - index * ARRIVAL_WINDOW_MS) / ARRIVAL_WINDOW_MS
  local total = 0
  for offset, weight in ipairs({1, inside}) do
    local flat = redis.call("HGETALL", P .. "arr:" .. model .. ":" .. (index + 1 - offset))
    for i = 1, #flat, 2 do
      if tonumber(flat[i]) < rank then
        total = total + weight * tonumber(flat[i + 1])
      end
    end
  end
  return math.floor(total * 1000000 / ARRIVAL_WINDOW_MS)
end

-- Whether a waiter's gateway is alive: its heartbeat (gws, refreshed every second by each
-- Scheduler) has not expired. Cached per call: a pump meets few gateways.
local alive_cache = {}
local function gateway_alive(gw, now)
  local alive = alive_cache[gw]
  if alive == nil then
    local expiry = redis.call("ZSCORE", GATEWAYS, gw)
    alive = expiry ~= false and tonumber(expiry) >= now
    alive_cache[gw] = alive
  end
  return alive
end

-- The pool's virtual time V, read once per call and written only when it moves.
local clocks = {}
local function advance_clock(model, start)
  local clock = clocks[model]
  if clock == nil then
    clock = tonumber(redis.call("HGET", P .. "vt:" .. model, "_clock") or "0")
  end
  if start > clock then
    redis.call("HSET", P .. "vt:" .. model, "_clock", start)
    clock = start
  end
  clocks[model] = clock
end

-- Start-time fair queueing: S = max(V, F_tenant); F_tenant = S + cost. `granting`: the
-- request is granted at once, so V moves to S in the same write (grant's advance_clock then
-- finds nothing to do).
local function start_tag(model, tenant, cost, granting)
  local vt = P .. "vt:" .. model
  local got = redis.call("HMGET", vt, "_clock", "t:" .. tenant)
  local clock = tonumber(got[1] or "0")
  if clock > REBASE_AT and redis.call("ZCARD", P .. "q:" .. model) == 0 then
    -- No waiter holds a score, so every tag can move down by V at once.
    local flat = redis.call("HGETALL", vt)
    for i = 1, #flat, 2 do
      redis.call("HSET", vt, flat[i], math.max(0, tonumber(flat[i + 1]) - clock))
    end
    got = redis.call("HMGET", vt, "_clock", "t:" .. tenant)
    clock = tonumber(got[1] or "0")
  end
  local start = math.max(clock, tonumber(got[2] or "0"))
  if granting and start > clock then
    redis.call("HSET", vt, "t:" .. tenant, start + cost, "_clock", start)
    clock = start
  else
    redis.call("HSET", vt, "t:" .. tenant, start + cost)
  end
  clocks[model] = clock
  return start
end

local function grant(model, pool, room, id, replica, w, now)
  redis.call("HINCRBY", P .. "inflight:" .. model, replica, 1)
  room.inflight[replica] = room.inflight[replica] + 1
  room.total = room.total + 1
  local conc_key = w.ck or ""
  if w.ck == nil and w.maxc > 0 then
    -- Granted at once (a waiter was counted when it enqueued).
    conc_key = ACCOUNT .. "conc:" .. w.uc
    redis.call("INCR", conc_key)
  end
  redis.call("ZADD", P .. "lease:" .. model, now + w.lease, id)
  redis.call("HSET", P .. "li:" .. id, "replica", replica, "model", model, "tenant", w.tenant,
    "uc", w.uc, "gw", w.gw, "ck", conc_key, "granted_at", now)
  if w.cls then
    redis.call("HINCRBY", P .. "cif:" .. model, w.cls, 1)
    redis.call("HSET", P .. "li:" .. id, "cls", w.cls)
  end
  if w.prefix ~= "" then
    redis.call("SET", P .. "aff:" .. model .. ":" .. w.prefix, replica, "PX", AFFINITY_TTL_MS)
  end
  if w.cls and room.bg then
    redis.call("HINCRBY", P .. "bgi:" .. model, replica, 1)
    redis.call("HSET", P .. "li:" .. id, "bg", 1)
    room.bg[replica] = room.bg[replica] + 1
  end
  if w.long then
    redis.call("HINCRBY", P .. "lng:" .. model, replica, 1)
    redis.call("HSET", P .. "li:" .. id, "lp", 1)
    if room.lng then
      room.lng[replica] = room.lng[replica] + 1
      if room.drain then
        -- Placed (there or on a replica that emptied first): the drain ends; another long
        -- waiter's pick starts its own.
        redis.call("DEL", P .. "drn:" .. model)
        room.drain = nil
      end
    end
  end
  advance_clock(model, w.start)
end

local function remove_waiter(model, id, class)
  redis.call("ZREM", P .. "q:" .. model, id)
  redis.call("ZREM", P .. "qdl:" .. model, id)
  redis.call("DEL", P .. "qi:" .. id)
  if class then
    local qlen = P .. "qlen:" .. model .. ":" .. class
    if redis.call("DECR", qlen) <= 0 then
      redis.call("DEL", qlen)
    end
  end
end

-- A waiter leaves without a grant (cancelled, past its deadline, its gateway dead): it
-- gives back what it took when it enqueued — its rate-limit charge, its place in its use
-- case's max concurrent, and its tenant's fair-share position (the tenant's virtual finish
-- moves back by its cost; a request that starts later starts where it would have).
-- Returns the waiter's class and rank (nil when it was already gone).
local function drop_waiter(model, id)
  local f = redis.call("HMGET", P .. "qi:" .. id, "class", "rank", "tenant", "cost", "ck", "lp")
  remove_waiter(model, id, f[1])
  if not f[1] then
    return nil, nil
  end
  if f[6] then
    -- A long prompt leaves: the drain kept for it ends (the next long waiter's pick renews it).
    redis.call("DEL", P .. "drn:" .. model)
  end
  local charged = P .. "rf:" .. id
  local spec = redis.call("GET", charged)
  if spec then
    limits_uncount(spec, -1)
    redis.call("DEL", charged)
  end
  if f[5] and f[5] ~= "" and redis.call("DECR", f[5]) <= 0 then
    redis.call("DEL", f[5])
  end
  local vt = P .. "vt:" .. model
  local finish = redis.call("HGET", vt, "t:" .. f[3])
  if finish then
    redis.call("HSET", vt, "t:" .. f[3], math.max(0, tonumber(finish) - tonumber(f[4])))
  end
  return f[1], tonumber(f[2])
end

-- Gives a lease's capacity back. Returns its replica, or nil when there was none (already
-- released or reaped: releasing is idempotent). refund: nil for a request a replica
-- answered (release.lua reconciles its tokens), "cancelled" for one that ended before
-- (its rate-limit charge, rf:<id>, is given back), "reaped" for one whose gateway stopped
-- renewing it (given back too, and rf:<id> kept for REFUNDED_TTL_MS, so that a release
-- arriving after all puts it back: release.lua).
local function release_lease(model, id, now, record_hold, refund)
  local li = P .. "li:" .. id
  local charged = P .. "rf:" .. id
  local f = redis.call("HMGET", li, "replica", "model", "ck", "granted_at", "cls", "lp", "bg")
  if not f[1] then
    -- Already released, or reaped: a reaped lease's rf:<id> is release.lua's to read.
    redis.call("DEL", li, P .. "grant:" .. id)
    redis.call("ZREM", P .. "lease:" .. model, id)
    return nil
  end
  if refund then
    redis.call("DEL", li, P .. "grant:" .. id)
    local spec = redis.call("GET", charged)
    if spec then
      limits_uncount(spec, -1)
      if refund == "reaped" then
        redis.call("PEXPIRE", charged, REFUNDED_TTL_MS)
      else
        redis.call("DEL", charged)
      end
    end
  else
    redis.call("DEL", li, P .. "grant:" .. id, charged)
  end
  model = f[2]
  redis.call("ZREM", P .. "lease:" .. model, id)
  if redis.call("HINCRBY", P .. "inflight:" .. model, f[1], -1) <= 0 then
    redis.call("HDEL", P .. "inflight:" .. model, f[1])
  end
  if f[3] ~= "" and redis.call("DECR", f[3]) <= 0 then
    redis.call("DEL", f[3])
  end
  if f[5] and redis.call("HINCRBY", P .. "cif:" .. model, f[5], -1) <= 0 then
    redis.call("HDEL", P .. "cif:" .. model, f[5])
  end
  if f[6] and redis.call("HINCRBY", P .. "lng:" .. model, f[1], -1) <= 0 then
    redis.call("HDEL", P .. "lng:" .. model, f[1])
  end
  if f[7] and redis.call("HINCRBY", P .. "bgi:" .. model, f[1], -1) <= 0 then
    redis.call("HDEL", P .. "bgi:" .. model, f[1])
  end
  if record_hold then
    local held = math.max(0, now - tonumber(f[4]))
    local svc = P .. "svc:" .. model
    local average = tonumber(redis.call("HGET", svc, "hold_ms") or "-1")
    if average >= 0 then
      held = 0.8 * average + 0.2 * held
    end
    redis.call("HSET", svc, "hold_ms", held)
  end
  return f[1]
end

-- Grants queue heads while a replica has room: the dispatch loop of release, pump, reap
-- and acquire. Waiters met on the way are dropped (and refunded) when their deadline has
-- passed or their gateway is dead (no heartbeat: nobody would take the grant, and its slot
-- would be held until the lease expired). Every waiter can be granted as far as its use
-- case's max concurrent goes: it was counted against it when it enqueued. quiet_id is the
-- caller's own request (acquire): it learns of its grant from the return value, and its
-- gateway is the caller. Returns the waiters granted, then the waiters dropped.
local function pump(model, now, pool, room, quiet_id)
  local q = P .. "q:" .. model
  if redis.call("EXISTS", q) == 0 then
    return 0, 0  -- the common case after a release: nobody waits, nothing to load
  end
  pool = pool or pool_from_hash(model)
  room = room or load_room(model, pool, now)
  local granted = 0
  local dropped = 0
  -- Waiters below `from` are of classes holding their whole share: skipped, rank by rank
  -- (a class with a share should have a rank of its own, or it holds up its rank-mates).
  local from = "-inf"
  -- Waiters passed over that no replica can take now (lanes: pick): at most PUMP_SKIPS.
  local skipped = 0
  while any_room(pool, room) and skipped < PUMP_SKIPS do
    local head = redis.call("ZRANGEBYSCORE", q, from, "+inf", "LIMIT", skipped, 1)
    if #head == 0 then
      break
    end
    local id = head[1]
    local f = redis.call("HMGET", P .. "qi:" .. id, "tenant", "class", "deadline", "uc", "maxc",
      "lease", "gw", "prefix", "start", "ck", "share", "rank", "lp")
    if f[11] and f[2] and tonumber(f[3]) > now
      and class_full(model, room, f[2], tonumber(f[11])) then
      from = string.format("%.0f", (tonumber(f[12]) + 1) * RANK_SCALE)
      skipped = 0
    elseif not f[2] then
      remove_waiter(model, id, nil)
      redis.call("DEL", P .. "rf:" .. id)
    elseif tonumber(f[3]) <= now or (id ~= quiet_id and not gateway_alive(f[7], now)) then
      drop_waiter(model, id)
      dropped = dropped + 1
    else
      local long = f[13] ~= false
      local replica = pick(model, pool, room, f[8], long, f[11] ~= false)
      if replica == nil then
        skipped = skipped + 1  -- lanes: it waits for its kind of replica; the next may go
      else
        -- ck: the use case's counter the waiter was counted in ("" for none); nil for a
        -- waiter enqueued by an older script, which grant counts as before.
        local w = {tenant = f[1], uc = f[4], maxc = tonumber(f[5]), lease = tonumber(f[6]),
          gw = f[7], prefix = f[8], start = tonumber(f[9]), ck = f[10] or nil, long = long}
        if f[11] then
          w.cls = f[2]
        end
        remove_waiter(model, id, f[2])
        grant(model, pool, room, id, replica, w, now)
        if id ~= quiet_id then
          redis.call("SET", P .. "grant:" .. id, replica, "PX", w.lease)
          redis.call("PUBLISH", CHANNEL .. w.gw, id .. " " .. replica)
        end
        granted = granted + 1
      end
    end
  end
  return granted, dropped
end
