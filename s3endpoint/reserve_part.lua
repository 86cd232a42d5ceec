-- reserve_part.lua: reserve a multipart upload's part against its registration's size cap,
-- before any byte of the part is stored. One atomic call, so parts sent at the same moment
-- cannot each read the others' total as it was before any of them and together pass the cap.
-- A part sent again (a retry) replaces its own earlier reservation. A reservation is kept if
-- the part's transfer then fails: its retry replaces it, and an abandoned upload is aborted.
--
-- KEYS[1]  the upload's parts hash (part number -> bytes reserved)
-- ARGV[1]  the part number          ARGV[2]  its bytes
-- ARGV[3]  the registration's cap   ARGV[4]  the hash's lifetime (seconds)
-- Returns  1 when the part is reserved; 0 when it would take the upload past the cap (and
--          nothing is changed).

local sizes = redis.call("HGETALL", KEYS[1])
local others = 0
for i = 1, #sizes, 2 do
  if sizes[i] ~= ARGV[1] then
    others = others + tonumber(sizes[i + 1])
  end
end
if others + tonumber(ARGV[2]) > tonumber(ARGV[3]) then
  return 0
end
redis.call("HSET", KEYS[1], ARGV[1], ARGV[2])
redis.call("EXPIRE", KEYS[1], ARGV[4])
return 1
