-- peek.lua: the rate limits judged without counting anything: what a request with request
-- guardrails asks before its checks run, so that a caller over its limits costs the guardrail
-- workers nothing. acquire.lua still checks and counts the limits atomically afterwards; this
-- is only an early refusal. (limits.lua and common.lua are prepended at load time.)
--
-- KEYS[1]  the model pool's slot prefix "sy:{sy/<model>}:" (gateway/slots.py)
-- ARGV     now_ms, then the rate limits, five values each (limits.lua)
-- Returns  {1}                                  room on every limit
--          {-4, "rate_limited", i, retry_after_ms}   limit i would overflow

local refused = limits_check(tonumber(ARGV[1]), ARGV, 2)
if refused then
  return {-4, "rate_limited", refused[1], refused[2]}
end
return {1}
