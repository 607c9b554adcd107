"""The Lua scripts of the cross-replica thread queue (``cluster.py``): a ticket pushed
(and granted at once on an idle thread), a grant at the head, a dead head popped, a
release. Each runs atomically in Redis."""

# KEYS: queue, fence, holder, run; ARGV: ticket, replica id, run-key ttl ms, fence ttl
# ms → fencing token if the ticket is head (the session is then marked running on this
# replica), 0 if not, -1 if the ticket is no longer queued. The fence and its holder
# expire after the fence ttl (the records they guard do by then), refreshed by each grant
ACQUIRE = """
local head = redis.call('LINDEX', KEYS[1], 0)
if head == ARGV[1] then
  local token = redis.call('INCR', KEYS[2])
  redis.call('PEXPIRE', KEYS[2], ARGV[4])
  redis.call('SET', KEYS[3], token, 'PX', ARGV[4])
  redis.call('SET', KEYS[4], ARGV[2], 'PX', ARGV[3])
  return token
end
if redis.call('LPOS', KEYS[1], ARGV[1]) == false then return -1 end
return 0
"""
# KEYS: queue, fence, holder, run; ARGV: ticket, replica id, ttl ms, fence ttl ms → push
# the ticket; granted at once (fencing token, as ACQUIRE) when it is the head, else 0
ENQUEUE = """
redis.call('RPUSH', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
if redis.call('LINDEX', KEYS[1], 0) == ARGV[1] then
  local token = redis.call('INCR', KEYS[2])
  redis.call('PEXPIRE', KEYS[2], ARGV[4])
  redis.call('SET', KEYS[3], token, 'PX', ARGV[4])
  redis.call('SET', KEYS[4], ARGV[2], 'PX', ARGV[3])
  return token
end
return 0
"""
# KEYS: queue; ARGV: expected head → 1 if popped
POP_IF_HEAD = """
if redis.call('LINDEX', KEYS[1], 0) == ARGV[1] then redis.call('LPOP', KEYS[1]); return 1 end
return 0
"""
# KEYS: queue, run; ARGV: ticket, replica id → remove the ticket wherever it is, and the
# session's running mark if it is still this replica's
RELEASE = """
if redis.call('GET', KEYS[2]) == ARGV[2] then redis.call('DEL', KEYS[2]) end
if redis.call('LINDEX', KEYS[1], 0) == ARGV[1] then redis.call('LPOP', KEYS[1]); return 1 end
return redis.call('LREM', KEYS[1], 1, ARGV[1])
"""
