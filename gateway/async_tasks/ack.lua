-- ack.lua: before a WAIT that stands for submitted tasks (gateway/async_tasks/acks.py): are the
-- tasks on this server, and a write that every task submitted before it precedes.
--
-- WAIT counts the replicas that have the last write of the connection it is sent on, and
-- this connection (not the hot path's, which a WAIT would block) wrote nothing of the tasks:
-- so it writes now. Replication is in order, so a replica that has this write has every
-- task submit.lua wrote before it. And a connection sent to another server (a failover
-- between the submit and this call) must not vouch for tasks it never saw: they are checked.
--
-- KEYS[1]  the barrier key, in the streams' slot ("sy:{sy}:atq-ack"); then one task hash
--          key per submission (submit.lua writes a call's tasks together: one stands for all)
-- ARGV[1]  a value for the barrier (the writer's id), ARGV[2] its TTL in ms
-- Returns  the 1-based indexes (into KEYS[2..]) of the tasks this server does not have

local missing = {}
for i = 2, #KEYS do
  if redis.call("EXISTS", KEYS[i]) == 0 then
    missing[#missing + 1] = i - 1
  end
end
redis.call("SET", KEYS[1], ARGV[1], "PX", ARGV[2])
return missing
