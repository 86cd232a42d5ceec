-- submit.lua: 1..N async tasks admitted and queued in one atomic call (docs/async.md; the
-- keys and fields are gateway/async_tasks/layout.py's, named by the caller). limits.lua and
-- common.lua are prepended at load time, as for acquire.lua. Either every task is queued
-- and counted, or nothing is written at all.
--
-- KEYS[1]  the key prefix "sy:{sy}:" (the limits come with their keys: limits.lua)
-- ARGV     now_ms, max_backlog, queue_ttl_ms, result_ttl_s, the partitions registry key,
--          F, then the F names of a stream entry's fields (layout.ENTRY_FIELDS),
--          M, then per model: model, depth key, its task count, partitions, drain-rate key,
--          T, then per task: task hash key, stream key, its F entry values,
--          then the rate limits to the end, five values each (limits.lua), costs already
--          multiplied for the call (requests N, tokens the sum).
-- Returns  {1}                                                  queued
--          {-3, "partitions", model index, registered count}    the registry holds another
--                                                               partition count: retry with it
--          {-4, "rate_limited", limit index, retry_after_ms}    limit i would overflow
--          {-5, "backlog_full", model index, depth, tasks_per_s, at_ms}   over max_backlog
--                                                               (rate and time "" when no
--                                                               batcher wrote them)

local now = tonumber(ARGV[1])
local max_backlog = tonumber(ARGV[2])
local queue_ttl_ms = ARGV[3]
local result_ttl_s = ARGV[4]
local registry = ARGV[5]
local f = tonumber(ARGV[6])
local names = {}
for i = 1, f do
  names[i] = ARGV[6 + i]
end
local at = 7 + f

local models = {}
local m = tonumber(ARGV[at])
at = at + 1
for i = 1, m do
  models[i] = {name = ARGV[at], depth = ARGV[at + 1], count = tonumber(ARGV[at + 2]),
    partitions = ARGV[at + 3], rate = ARGV[at + 4]}
  at = at + 5
end

local tasks = tonumber(ARGV[at])
local tasks_at = at + 1
local limits_at = tasks_at + tasks * (2 + f)

-- The gateway spreads tasks over the partition count it believes in; batchers read the
-- registry's. They must agree, or a task would sit in a stream nobody reads.
for i, model in ipairs(models) do
  local registered = redis.call("HGET", registry, model.name)
  if registered and registered ~= model.partitions then
    return {-3, "partitions", i, registered}
  end
  model.registered = registered
end

local refused, state = limits_check(now, ARGV, limits_at)
if refused then
  return {-4, "rate_limited", refused[1], refused[2]}
end

for i, model in ipairs(models) do
  local depth = tonumber(redis.call("GET", model.depth) or "0")
  if depth + model.count > max_backlog then
    local rate = redis.call("HMGET", model.rate, "tasks_per_s", "at_ms")
    return {-5, "backlog_full", i, depth, rate[1] or "", rate[2] or ""}
  end
end

limits_commit(state)
for _, model in ipairs(models) do
  redis.call("INCRBY", model.depth, model.count)
  if not model.registered then
    redis.call("HSETNX", registry, model.name, model.partitions)
  end
end

local fields = {}
for t = 0, tasks - 1 do
  local base = tasks_at + t * (2 + f)
  local entry = {}
  for j = 1, f do
    local value = ARGV[base + 1 + j]
    entry[names[j]] = value
    fields[2 * j - 1] = names[j]
    fields[2 * j] = value
  end
  redis.call("XADD", ARGV[base + 1], "*", unpack(fields))
  local key = ARGV[base]
  -- layout.TASK_FIELDS as set at submit.
  redis.call("HSET", key, "status", "queued", "use_case_id", entry.use_case_id,
    "tenant", entry.tenant, "model", entry.model, "endpoint", entry.endpoint,
    "created_ms", entry.created_ms, "deadline_ms", entry.deadline_ms,
    "expires_ms", entry.expires_ms, "attempts", "0", "result_ttl_s", result_ttl_s)
  redis.call("PEXPIRE", key, queue_ttl_ms)
end
return {1}
