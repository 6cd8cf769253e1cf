-- concurrency mirrors algorithms/concurrency.go: a concurrency zone, at
-- most n requests of a key in flight. Its state is a sorted set of leases
-- per key: member a request's lease id (decimal digits, chosen by the
-- instance that admitted it), score the instant (Unix ms, Redis's clock) the
-- lease expires. An expired lease holds no slot, so an instance that
-- crashes holding slots gives them back by itself; a running request's
-- instance renews its lease (mode 5) well before it expires. The key's TTL
-- outlives its latest lease by the margin.
--
-- take.lua calls these with a concurrency zone's arguments (algorithm id 5;
-- see argCache in script.go, the one layout of every zone): events and capacity are n, w is the lease
-- (ms), and where a rate zone has its stored value and its cost, a
-- concurrency zone has its key (concurrency reads its own sorted set) and
-- its lease id (a string, never converted: ids exceed 2^53). The id 0 (a
-- number, as take.lua passes to show a vetoed zone) asks for the key's view.

-- concurrency returns allowed (1/0), remaining, retry-after and
-- reset-after (ms: 1000 on a refusal, 0 else, as the Go twin's
-- ConcurrencyRetry), and false: nothing for take's store to write. The
-- lease is added by concurrency_commit once every zone of the request has
-- allowed. It drops the key's expired leases first (not a charge: they
-- hold no slot).
local function concurrency(key, n, w, capacity, id)
  call('ZREMRANGEBYSCORE', key, '-inf', now)
  local used = call('ZCARD', key)
  if id ~= 0 and used < n then
    return 1, n - used - 1, 0, 0, false
  end
  if id ~= 0 then
    return 0, max(n - used, 0), 1000, 1000, false
  end
  return 1, max(n - used, 0), 0, 0, false
end

-- concurrency_bump makes the key outlive a lease of w ms from now by the
-- margin (never shortening a longer TTL: the limit's lease may differ
-- between instances during a rolling reload).
local function concurrency_bump(key, w)
  if call('PTTL', key) < w + margin then
    call('PEXPIRE', key, w + margin)
  end
end

-- concurrency_commit adds the lease of an admitted request: it expires in
-- w ms.
local function concurrency_commit(key, w, id)
  call('ZADD', key, now + w, id)
  concurrency_bump(key, w)
end

-- concurrency_release (refund mode: the request ended, or a Cluster veto
-- in another slot) removes the lease; it returns nothing, so take's store
-- writes nothing. An empty set is deleted by Redis itself.
local function concurrency_release(key, n, w, capacity, id)
  call('ZREM', key, id)
end

-- concurrency_renew (mode 5) extends a lease still held to w ms from now.
-- XX: a lease already released, or expired and dropped, is not taken again
-- (a renewal that arrives after its release must not leak a slot).
local function concurrency_renew(key, n, w, capacity, id)
  if call('ZADD', key, 'XX', 'CH', now + w, id) == 1 then
    concurrency_bump(key, w)
  end
end
