-- upload_release.lua: give back a registration's upload marker, only if it still names the
-- upload being given up (never a newer upload's marker, nor a finished upload's "done").
--
-- KEYS[1]  the registration's upload marker   KEYS[2]  its multipart upload's parts hash
-- ARGV[1]  the marker value expected (e.g. "mp:<upload id>")
-- Returns  1 when the marker was ours and is gone (with the parts), 0 otherwise.

if redis.call("GET", KEYS[1]) == ARGV[1] then
  redis.call("DEL", KEYS[1], KEYS[2])
  return 1
end
return 0
