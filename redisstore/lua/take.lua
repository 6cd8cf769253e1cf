-- Sluice: the decision for a whole request, shared by every entry point
-- (see script.go): the EVAL scripts define `now` (Unix milliseconds),
-- include common.lua and every algorithm's file, then this, and return
-- take(KEYS, ARGV, base); the Redis Function library defines all of it
-- once, when it loads, and its function sets `now` and calls take.
--
-- KEYS[i] is zone i's state key. For zone i, ARGV[base + 6(i-1) + 1..6]
-- are: algorithm id, events, window (ms), capacity, cost, mode (0 take,
-- 1 refund, 2 take for a report-only zone, 3 renew). It decides every zone,
-- whatever its algorithm, against the state as it is, and writes only if
-- every zone allows (all-or-nothing; a refusal never consumes; a
-- report-only zone never vetoes). Refund mode gives back cost (for a veto
-- in another Cluster slot).
--
-- A concurrency zone (algorithm id 5, lua/concurrency.lua) has its lease
-- id where the others have their cost, and a sorted set of leases where
-- they have a stored value: take passes it its key instead of the value
-- (no GET), writes its lease last (concurrency_commit), and sends no value
-- for it to the deny cache. Its refund mode releases the lease (the request
-- ended), its renew mode extends it; renew means nothing to a rate zone.
--
-- It returns, per zone, four integers: allowed (1/0), remaining, retry-after
-- (ms) and reset-after (ms). When an enforcing zone refused, the reply goes
-- on with what the deny cache needs to answer the same client's next
-- requests as this script would (package denycache): the time it decided
-- at (now, ms), then each zone's stored value as it read it (a refusal
-- writes nothing, so it is also the value now): "" for none, 0 for a value
-- longer than 1024 bytes (a long sliding log, not worth the bandwidth). A
-- request that is allowed gets the four integers per zone only.
--
-- Every algorithm's step returns allowed, remaining, retry-after,
-- reset-after and the value to store (nil: delete the key); its refund
-- returns the last two, or nothing when there is no state to refund. They
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
-- (false: refunded, nothing to write), and the stored value it was
-- decided against. Overwritten by every call: in a Redis Function library
-- they outlive the call (holding a value each until the next), so a
-- decision allocates no table but its reply. The last zone needs none:
-- when it decides, every zone has.
local vals, resets, raws = {}, {}, {}

local function take(keys, argv, base)
  if not byte then bind() end
  local n = #keys
  local out = {nil, nil, nil, nil} -- room for one zone without a resize
  local all = true
  local lastval, lastreset -- the last zone's state, when it is written
  local lastraw -- the last zone's stored value
  local conc = false -- a concurrency zone takes a slot
  for i = 1, n do
    local b = base + 6 * (i - 1)
    local a = argv[b + 1]
    local alg = nums[a] or num(a)
    local step = steps[alg]
    if not step then
      return redis.error_reply('sluice: unknown algorithm id ' .. tostring(a))
    end
    local s2, s3, s4, s5 = argv[b + 2], argv[b + 3], argv[b + 4], argv[b + 5]
    local events, w = nums[s2] or num(s2), nums[s3] or num(s3)
    local capacity, cost = nums[s4] or num(s4), s5
    local raw = keys[i] -- concurrency: its key, and its lease id as cost
    if alg == 5 then
      conc = true
    else
      cost = nums[s5] or num(s5)
      raw = call('GET', keys[i])
      if raw == false then raw = nil end
    end
    local mode = argv[b + 6]
    local allowed, rem, retry, reset, val = 1, 0, 0, 0, nil
    if mode == '3' then
      if alg == 5 then concurrency_renew(raw, events, w, capacity, cost) end
      if i < n then resets[i] = false end
    elseif mode == '1' then
      reset, val = refunds[alg](raw, events, w, capacity, cost)
      if reset then store(keys[i], val, reset) end
      reset = 0
      if i < n then resets[i] = false end
    else
      allowed, rem, retry, reset, val = step(raw, events, w, capacity, cost)
      -- a report-only zone never vetoes
      if allowed == 0 and mode ~= '2' then all = false end
      if i < n then
        vals[i], resets[i], raws[i] = val, reset, raw
      else
        lastraw = raw
        if allowed == 1 then
          if all then
            lastval, lastreset = val, reset
          else
            -- vetoed: nothing is charged; show this zone as it stands
            allowed, rem, retry, reset = step(raw, events, w, capacity, 0)
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
        local b = base + 6 * (i - 1)
        out[o + 1], out[o + 2], out[o + 3], out[o + 4] =
          steps[num(argv[b + 1])](raws[i], num(argv[b + 2]), num(argv[b + 3]), num(argv[b + 4]), 0)
      end
    end
  end
  if lastreset then store(keys[n], lastval, lastreset) end
  -- the concurrency zones' leases, if every zone allowed (not in refund or
  -- renew mode, whose zones report allowed)
  if all and conc then
    for i = 1, n do
      local b = base + 6 * (i - 1)
      local mode = argv[b + 6]
      if argv[b + 1] == '5' and out[4 * i - 3] == 1 and (mode == '0' or mode == '2') then
        concurrency_commit(keys[i], num(argv[b + 3]), argv[b + 5])
      end
    end
  end
  if not all then
    local o = 4 * n + 1
    out[o] = now
    for i = 1, n do
      local r = raws[i]
      if i == n then r = lastraw end
      if argv[base + 6 * i - 5] == '5' then
        r = 0 -- a concurrency zone's key: the deny cache keeps no entry
      elseif not r then
        r = ''
      elseif #r > 1024 then
        r = 0
      end
      out[o + i] = r
    end
  end
  return out
end
