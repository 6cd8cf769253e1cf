-- Sluice: the decision for a whole request, shared by every entry point
-- (see script.go): the EVAL scripts define `now` (Unix milliseconds),
-- include common.lua and every algorithm's file, then this, and return
-- take(KEYS, ARGV, base); the Redis Function library defines all of it
-- once, when it loads, and its function sets `now` and calls take.
--
-- KEYS[i] is zone i's state key. For zone i, ARGV[base + 8(i-1) + 1..8]
-- (the layout is written by script.go's argCache, argsPerZone) are:
-- algorithm id, events, window (ms), capacity, cost, mode, the zone's
-- options (common.lua, opts: '0' for none; a penalty, a delay) and, for a
-- refund, the instant of the charge to give back (Unix ms; 0: unknown;
-- '0' for a take). The modes: 0 take, 1 refund, 2 take for a report-only
-- zone, 3 take whose charge may be refunded (a zone counting only some
-- response statuses, a request that may wait), 4 the same for a
-- report-only zone, 5 renew a concurrency zone's lease, 6 take whose charge
-- stays in flight until its status settles it (a zone counting only some
-- statuses: refundable too), 7 the same for a report-only zone, 8 refund a
-- charge taken in flight, 9 settle one and keep it.
--
-- Charges in flight (algorithms/inflight.go): KEYS[i] .. ':f' counts the
-- units of zone i's key charged by modes 6 and 7 and not yet settled by 8
-- or 9 (its TTL, inflightTTL, refreshed by every charge, bounds what a lost
-- settlement leaves). A take in mode 6 or 7 that the algorithm refuses,
-- but that those units would admit (remaining + in flight >= cost, within
-- the capacity, outside a penalty), reports allowed 2 and starts no
-- penalty.
--
-- A concurrency zone (algorithm id 5, lua/concurrency.lua) has its lease
-- id where the others have their cost (a string, never converted: ids
-- exceed 2^53), its options '0', and a sorted set of leases where they have
-- a stored value: take passes it its key instead of the value (no GET),
-- writes its lease last (concurrency_commit, once every zone allowed), and
-- sends no value for it to the deny cache (0: the cache keeps no entry, so
-- it never answers a request with a concurrency zone). Its refund mode
-- releases its lease (a veto in another Cluster slot), its renew mode
-- extends it; renew means nothing to a rate zone, and a concurrency zone
-- is never taken refundable (its slot goes back by a release).
--
-- It decides every zone, whatever its algorithm, against the state as it
-- is, and writes only if every zone allows (all-or-nothing; a refusal
-- never consumes; a report-only zone never vetoes); except that a zone
-- with a penalty that refuses writes its penalty (algorithms/penalty.go),
-- whatever the other zones decide. A refund gives back cost (a count
-- zone's response did not match, or a veto in another Cluster slot),
-- keeping the key's TTL and penalty.
--
-- It returns, per zone, four integers: allowed (1/0), remaining, retry-after
-- (ms; for an admission, the wait of a delayed one: algorithms/delay.go)
-- and reset-after (ms). When an enforcing zone refused, the reply goes
-- on with what the deny cache needs to answer the same client's next
-- requests as this script would (package denycache): the time it decided
-- at (now, ms), then each zone's stored value as it stands after the call
-- (a refusal writes nothing but a penalty that starts, so it is the value
-- read, or the penalty written): "" for none, 0 for a value longer than
-- 1024 bytes (a long sliding log, not worth the bandwidth). A request that
-- is allowed gets the four integers per zone, and then, when a zone's mode
-- is 3 or 4, the time it decided at (what a refund of its charges names).
--
-- Every algorithm's step returns allowed, remaining, retry-after,
-- reset-after and the value to store (nil: delete the key); its refund
-- returns the last two, or nothing when there is nothing to write. They
-- return values, not tables: a table per call costs Redis more CPU than
-- the arithmetic of a decision.

local steps = {[0] = token_bucket, [1] = gcra, [2] = sliding_window,
  [3] = fixed_window, [4] = sliding_log, [5] = concurrency}
local refunds = {[0] = token_bucket_refund, [1] = gcra_refund,
  [2] = sliding_window_refund, [3] = fixed_window_refund,
  [4] = sliding_log_refund, [5] = concurrency_release}

-- store writes a state with a TTL of its time to full (reset, ms) plus the
-- margin, deletes the key when there is no state (val nil), or writes
-- nothing (val false: a concurrency zone, whose lease is written by
-- concurrency_commit). A number argument reaches Redis as its integer
-- digits (every Redis converts an integral double below 2^53 exactly).
local function store(key, val, reset)
  if val then
    if reset < 0 then reset = 0 end
    call('SET', key, val, 'PX', reset + margin)
  elseif val == nil then
    call('DEL', key)
  end
end

-- What the second pass needs of zone i < #KEYS: its value and reset-after
-- (false: refunded, nothing to write), the algorithm's value it was decided
-- against, the stored value after the call (for the deny cache) and its
-- options.
-- Overwritten by every call: in a Redis Function library they outlive the
-- call (holding a value each until the next), so a decision allocates no
-- table but its reply. The last zone needs none: when it decides, every
-- zone has.
local vals, resets, raws, fulls, ots = {}, {}, {}, {}, {}

local inflightTTL = 300000 -- ms

-- settle takes cost off the units of key charged in flight.
local function settle(key, cost)
  local fk = key .. ':f'
  if call('DECRBY', fk, cost) <= 0 then call('DEL', fk) end
end

local function take(keys, argv, base)
  if not byte then bind() end
  local n = #keys
  local out = {nil, nil, nil, nil} -- room for one zone without a resize
  local all = true
  local wantnow = false
  local lastval, lastreset -- the last zone's state, when it is written
  local lastraw, lastfull -- the last zone's values, as raws and fulls
  local conc = false -- a concurrency zone takes a slot
  for i = 1, n do
    local b = base + 8 * (i - 1)
    local a = argv[b + 1]
    local alg = nums[a] or num(a)
    local step = steps[alg]
    if not step then
      return redis.error_reply('sluice: unknown algorithm id ' .. tostring(a))
    end
    local s2, s3, s4, s5 = argv[b + 2], argv[b + 3], argv[b + 4], argv[b + 5]
    local events, w = nums[s2] or num(s2), nums[s3] or num(s3)
    local capacity, cost = nums[s4] or num(s4), s5
    local full, raw, pen = nil, nil, 0
    if alg == 5 then
      -- a concurrency zone: its key as its value, its lease id as its cost
      conc, raw = true, keys[i]
    else
      cost = nums[s5] or num(s5)
      full = call('GET', keys[i])
      if full == false then
        full = nil
      else
        raw, pen = unpen(full)
      end
    end
    local mode = argv[b + 6]
    local o, ot = argv[b + 7], nil
    if o and o ~= '0' then ot = opts(o) end
    local allowed, rem, retry, reset, val = 1, 0, 0, 0, nil
    if mode == '5' then
      if alg == 5 then concurrency_renew(raw, events, w, capacity, cost) end
      if i < n then resets[i] = false end
    elseif mode == '1' or mode == '8' or mode == '9' then
      local at = tonum(argv[b + 8]) or 0
      if mode ~= '1' and alg ~= 5 then settle(keys[i], cost) end
      if mode == '9' then
        reset = false -- kept: nothing to give back
      else
        reset, val = refunds[alg](raw, events, w, capacity, cost, at, ot)
      end
      if reset then
        if pen ~= 0 then val = penalized(pen, val) end
        if val then
          call('SET', keys[i], val, 'KEEPTTL')
        else
          call('DEL', keys[i])
        end
      end
      reset = 0
      if i < n then resets[i] = false end
    else
      if mode == '3' or mode == '4' or mode == '6' or mode == '7' then wantnow = true end
      local p = 0
      if ot then p = ot.p end
      local pending = 0
      if mode == '6' or mode == '7' then pending = tonum(call('GET', keys[i] .. ':f')) or 0 end
      if p > 0 and pen ~= 0 and now < pen + p then
        -- in its penalty: refused, nothing written
        local e = pen + p
        local _
        _, _, _, reset = step(raw, events, w, capacity, 0, ot)
        retry = e - now
        if cost > 0 then
          local ok, _, r = step(raw, events, w, capacity, cost, ot)
          if ok == 0 and r > retry then retry = r end
        end
        if reset < e - now then reset = e - now end
        allowed, rem = 0, 0
      else
        allowed, rem, retry, reset, val = step(raw, events, w, capacity, cost, ot)
        if allowed == 0 and pending > 0 and cost > 0 and cost <= capacity and rem + pending >= cost then
          allowed = 2 -- refused, resting on charges in flight: no penalty
        elseif allowed == 0 and p > 0 then
          -- the penalty starts, whatever the other zones decide
          rem = 0
          if retry < p then retry = p end
          if reset < p then reset = p end
          full = penalized(now, val)
          store(keys[i], full, reset)
        end
      end
      -- a report-only zone never vetoes
      if allowed ~= 1 and mode ~= '2' and mode ~= '4' and mode ~= '7' then all = false end
      if i < n then
        vals[i], resets[i], raws[i], fulls[i], ots[i] = val, reset, raw, full, ot
      else
        lastraw, lastfull = raw, full
        if allowed == 1 then
          if all then
            lastval, lastreset = val, reset
          else
            -- vetoed: nothing is charged; show this zone as it stands
            allowed, rem, retry, reset = step(raw, events, w, capacity, 0, ot)
          end
        end
      end
    end
    local o = 4 * i - 4
    out[o + 1] = allowed
    out[o + 2] = rem
    out[o + 3] = retry
    out[o + 4] = reset
  end
  -- every zone has decided: write the zones that allowed, if all did
  for i = 1, n - 1 do
    local o = 4 * i - 4
    if resets[i] and out[o + 1] == 1 then
      if all then
        store(keys[i], vals[i], resets[i])
      else
        -- vetoed, as above
        local b = base + 8 * (i - 1)
        out[o + 1], out[o + 2], out[o + 3], out[o + 4] =
          steps[num(argv[b + 1])](raws[i], num(argv[b + 2]), num(argv[b + 3]), num(argv[b + 4]), 0, ots[i])
      end
    end
  end
  if lastreset then store(keys[n], lastval, lastreset) end
  -- the charges taken in flight, if every zone allowed
  if all then
    for i = 1, n do
      local mode = argv[base + 8 * i - 2]
      if (mode == '6' or mode == '7') and out[4 * i - 3] == 1 then
        local fk = keys[i] .. ':f'
        call('INCRBY', fk, argv[base + 8 * i - 3])
        call('PEXPIRE', fk, inflightTTL)
      end
    end
  end
  -- the concurrency zones' leases, if every zone allowed (a take's, not a
  -- refund's or a renewal's, whose zones report allowed)
  if all and conc then
    for i = 1, n do
      local b = base + 8 * (i - 1)
      local mode = argv[b + 6]
      if argv[b + 1] == '5' and out[4 * i - 3] == 1 and mode ~= '1' and mode ~= '5' then
        concurrency_commit(keys[i], num(argv[b + 3]), argv[b + 5])
      end
    end
  end
  if not all then
    local o = 4 * n + 1
    out[o] = now
    for i = 1, n do
      local r = fulls[i]
      if i == n then r = lastfull end
      if argv[base + 8 * i - 7] == '5' then
        r = 0 -- a concurrency zone's key: the deny cache keeps no entry
      elseif not r then
        r = ''
      elseif #r > 1024 then
        r = 0
      end
      out[o + i] = r
    end
  elseif wantnow then
    out[4 * n + 1] = now
  end
  return out
end
