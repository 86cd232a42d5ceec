-- pump.lua: grant waiters while a replica has room; release.lua's loop without a release.
-- Called by the fleet watcher when a replica drains, by the reaper, and by anyone who knows
-- room appeared. (common.lua is prepended at load time.)
--
-- KEYS[1]  the model pool's slot prefix "sy:{sy/<model>}:" (gateway/slots.py)
-- ARGV     now_ms, model
-- Returns  the number of waiters granted (each told on its gateway's channel); waiters
--          dropped on the way (deadline passed, gateway dead) are not counted.

local granted = pump(ARGV[2], tonumber(ARGV[1]))
return granted
