-- Sluice: the decision for a whole request, shared by every entry point
-- (see script.go): the EVAL scripts define `now` (Unix milliseconds),
-- include common.lua and every algorithm's file, then this, and return
-- take(KEYS, ARGV, base); the Redis Function library defines all of it
-- once, when it loads, and its function sets `now` and calls take.
--
-- KEYS[i] is zone i's state key and ARGV[base + i] its one argument (the
-- layout is written by script.go's argCache): four fields joined by SEP,
-- the zone's spec, cost, mode and, for a refund, the instant of the charge
-- to give back (Unix ms; 0: unknown; UNKNOWN_INSTANT for a take). The spec
-- is the limit's static part,
-- "<algorithm id>:<events>:<window ms>:<capacity>:<options>" (common.lua,
-- opts: '0' for none; a penalty, a delay). A take's argument repeats call
-- after call, so take parses each distinct one once and keeps its parse
-- (zargs); one that varies by call (a refund's instant, a concurrency
-- zone's lease id) is parsed on every call and kept by nothing. The
-- modes: 0 take, 1 refund, 2 take for a report-only
-- zone, 3 take whose charge may be refunded (a zone counting only some
-- response statuses, a request that may wait), 4 the same for a
-- report-only zone, 5 renew a concurrency zone's lease, 6 take whose charge
-- stays in flight until its status settles it (a zone counting only some
-- statuses: refundable too), 7 the same for a report-only zone, 8 refund a
-- charge taken in flight, 9 settle one and keep it, 10 settle one to the
-- amount its response reported (lua/settle.lua; its instant argument is
-- then '<instant>:<amount>').
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
-- and reset-after (ms), as an array of integers. A request that is allowed
-- gets the four integers per zone, and then, when a zone's mode is 3, 4, 6
-- or 7, the time it decided at (what a refund of its charges names). A
-- request of one zone that allowed with no wait, and no time to add, gets
-- one integer instead (no table for Redis to read), its remaining and
-- reset-after packed: (remaining x 2^k + reset-after) x 4 + s, where k is
-- 16, 24 or 32 for s 0, 1 or 2, the first whose bounds they fit (the whole
-- below 2^53; script.go's packedAdmission reads it), or the array when none
-- fits. When an enforcing zone refused, the array goes on with what the
-- deny cache needs to answer the same client's next requests as this
-- script would (package denycache): the time it decided at (now, ms), then
-- each zone's stored value as it stands after the call (a refusal writes
-- nothing but a penalty that starts, so it is the value read, or the
-- penalty written): "" for none, 0 for a value longer than 1024 bytes (a
-- long sliding log, not worth the bandwidth).
--
-- Every algorithm's step returns allowed, remaining, retry-after,
-- reset-after and the value to store (nil: delete the key); its refund
-- returns the last two, or nothing when there is nothing to write. They
-- return values, not tables: a table per call costs Redis more CPU than
-- the arithmetic of a decision.

-- The layout's numbers, defined by script.go and checked against it
-- (TestLuaLayoutMatchesGo): the separator of a zone's argument's fields,
-- the modes, a take's instant, the concurrency algorithm's id as sent, and
-- REPLY numbers per zone in the reply.
local SEP = ','
local MODE_TAKE, MODE_REFUND, MODE_REPORT_ONLY = '0', '1', '2'
local MODE_REFUNDABLE, MODE_REPORT_ONLY_REFUNDABLE = '3', '4'
local MODE_RENEW = '5'
local MODE_INFLIGHT, MODE_REPORT_ONLY_INFLIGHT = '6', '7'
local MODE_REFUND_INFLIGHT, MODE_SETTLE_INFLIGHT = '8', '9'
local MODE_SETTLE = '10'
local UNKNOWN_INSTANT = '0'
local ALG_CONCURRENCY = 5
local REPLY = 4

local steps = {[0] = token_bucket, [1] = gcra, [2] = sliding_window,
  [3] = fixed_window, [4] = sliding_log, [5] = concurrency}
local refunds = {[0] = token_bucket_refund, [1] = gcra_refund,
  [2] = sliding_window_refund, [3] = fixed_window_refund,
  [4] = sliding_log_refund, [5] = concurrency_release}

-- specs maps a spec (a zone argument's first field) to its parse (memo):
-- {algorithm id, events, window, capacity, options (nil: none)}; nil for a
-- malformed spec or an unknown algorithm.
local specs, spec = memo(function(s)
  local a, e, w, c, o = string.match(s, '^(%d+):(%d+):(%d+):(%d+):(.*)$')
  a = tonum(a)
  if not a or not steps[a] then
    return nil
  end
  return {a, tonum(e), tonum(w), tonum(c), opts(o)}
end)

-- zonepat matches a zone's argument, capturing its four fields (the last
-- takes the rest: '.' costs string.match less than a set).
local zonepat
do
  local f = '([^' .. SEP .. ']+)'
  zonepat = '^' .. f .. SEP .. f .. SEP .. f .. SEP .. '(.+)$'
end

-- zargs maps a take's argument to its parse (memo): its spec's five fields
-- as specs has them, then its cost, mode, instant and cost as sent.
-- keep(s, t) keeps t as the parse of s.
local zargs, keep = memo(function(_, t) return t end)

-- zone parses a zone's argument s: it returns its spec's parse (specs),
-- cost (a concurrency zone's: its lease id, a string), mode, instant and
-- cost as sent; nil for a malformed argument or an unknown algorithm. The
-- parse of a take's argument (its instant UNKNOWN_INSTANT, not a
-- concurrency zone's) it keeps in zargs and returns in place of the
-- spec's; the others vary by call (a refund's instant, a lease id), so
-- nothing keeps them and no table is made for them.
local function zone(s)
  local sp, c, m, at = string.match(s, zonepat)
  local z = sp and (specs[sp] or spec(sp))
  if not z then
    return nil
  end
  local alg, cost = z[1], c
  if alg ~= ALG_CONCURRENCY then
    cost = nums[c] or num(c)
    if not cost then
      return nil
    end
    if at == UNKNOWN_INSTANT then
      z = keep(s, {alg, z[2], z[3], z[4], z[5], cost, m, at, c})
    end
  end
  return z, cost, m, at, c
end

-- ttls memoizes a TTL's decimal digits: a number argument of redis.call
-- is formatted by Redis with snprintf (%.17g), which costs more than the
-- rest of the SET (an integer's %d costs little). store rounds a TTL up to
-- a grid, so the TTLs of many keys repeat.
local ttls, ttl = memo(function(px) return fmt('%d', px) end)

-- store writes a state with a TTL of its time to full (reset, ms) plus the
-- margin, rounded up to a multiple of the power of 16 that is at most a
-- sixteenth of it (KeyTTL in script.go mirrors it), deletes the key when
-- there is no state (val nil), or writes nothing (val false: a concurrency
-- zone, whose lease is written by concurrency_commit).
local function store(key, val, reset)
  if val then
    if reset < 0 then reset = 0 end
    local px, q = reset + margin, 16
    while px >= q * 256 do q = q * 16 end
    local r = px % q
    if r > 0 then px = px + q - r end
    call('SET', key, val, 'PX', ttls[px] or ttl(px))
  elseif val == nil then
    call('DEL', key)
  end
end

-- What the second pass needs of zone i < #KEYS: its value and reset-after
-- (false: refunded, nothing to write), the algorithm's value it was decided
-- against and the stored value after the call (for the deny cache); and of
-- every zone, its spec's parse (zs). out holds the reply's numbers.
-- Overwritten by every call: in a Redis Function library they outlive the
-- call (holding a value each until the next), so a decision allocates no
-- table. The last zone needs none of the first four: when it decides,
-- every zone has.
local vals, resets, raws, fulls, zs, out = {}, {}, {}, {}, {}, {}
-- leases[i]: a concurrency zone's lease id to record if every zone allows
-- (false: a release or a renewal); read for concurrency zones only.
local leases = {}

local inflightTTL = '300000' -- ms

-- Overrides (redisstore/override.go): KEYS[i] .. ':o' holds zone i's key's
-- override, 29 bytes (OVFMT): its kind, l (another limit: the algorithm,
-- penalty and delay kept), b (block) or u (unlimited), then its expiry
-- (Unix ms), events, window (ms) and capacity; its TTL, set by the admin API, ends it, and so does its
-- expiry read here. A take reads it with the key's state; a refund does
-- not. A zone it decided has 4 x (capacity + 1) added to its allowed
-- number in the reply (MAXOCAP keeps the sum exact; block: capacity 0) and
-- sends no value for the deny cache (0). ovf[i] is that number (0: none);
-- oes, ows, ocs the limit a zone was decided under, for a veto's view.
local MAXOCAP = 1125899906842623
local OVFMT, OVLEN = '>c1I7I7I7I7', 29
local ovf, oes, ows, ocs = {}, {}, {}, {}

-- settle takes cost off the units of key charged in flight.
local function settle(key, cost)
  local fk = key .. ':f'
  if call('DECRBY', fk, cost) <= 0 then call('DEL', fk) end
end

local function take(keys, argv, base)
  if not byte then bind() end
  local n = #keys
  local all = true
  local wantnow = false
  local lastval, lastreset -- the last zone's state, when it is written
  local lastraw, lastfull -- the last zone's values, as raws and fulls
  local conc = false -- a concurrency zone takes a slot
  local flying = false -- a zone takes a charge in flight
  local anyov = false -- an override decided a zone
  for i = 1, n do
    local s = argv[base + i]
    local z = zargs[s]
    local cost, mode, at, s5
    if z then
      cost, mode, at, s5 = z[6], z[7], z[8], z[9]
    else
      z, cost, mode, at, s5 = zone(s)
      if not z then
        return redis.error_reply('sluice: unknown algorithm or malformed zone argument ' .. tostring(s))
      end
    end
    zs[i] = z
    ovf[i] = 0
    local alg, events, w, capacity, ot = z[1], z[2], z[3], z[4], z[5]
    local step = steps[alg]
    local full, raw, pen = nil, nil, 0
    if alg == ALG_CONCURRENCY then
      -- a concurrency zone: its key as its value, its lease id as its cost
      conc, raw = true, keys[i]
      leases[i] = mode ~= MODE_REFUND and mode ~= MODE_RENEW and cost
    else
      full = call('GET', keys[i])
      if full == false then
        full = nil
      else
        raw, pen = unpen(full)
      end
    end
    local allowed, rem, retry, reset, val = 1, 0, 0, 0, nil
    if mode == MODE_RENEW then
      if alg == ALG_CONCURRENCY then concurrency_renew(raw, events, w, capacity, cost) end
      if i < n then resets[i] = false end
    elseif mode == MODE_SETTLE then
      -- settled to an amount: a charge on top may outlive the key's TTL
      local t, amount = string.match(at, '^(%d+):(%d+)$')
      settle(keys[i], s5)
      reset, val = settle_to(alg, raw, events, w, capacity, cost, tonum(amount) or cost, tonum(t) or 0, ot)
      if reset then
        if pen ~= 0 then
          val = penalized(pen, val)
          if ot and ot.p > 0 and reset < pen + ot.p - now then reset = pen + ot.p - now end
        end
        store(keys[i], val, reset)
      end
      reset = 0
      if i < n then resets[i] = false end
    elseif mode == MODE_REFUND or mode == MODE_REFUND_INFLIGHT or mode == MODE_SETTLE_INFLIGHT then
      at = tonum(at) or 0
      if mode ~= MODE_REFUND and alg ~= ALG_CONCURRENCY then settle(keys[i], s5) end
      if mode == MODE_SETTLE_INFLIGHT then
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
      local inflight = mode == MODE_INFLIGHT or mode == MODE_REPORT_ONLY_INFLIGHT
      if inflight then flying = true end
      if inflight or mode == MODE_REFUNDABLE or mode == MODE_REPORT_ONLY_REFUNDABLE then wantnow = true end
      local p = 0
      if ot then p = ot.p end
      local pending = 0
      if inflight then pending = tonum(call('GET', keys[i] .. ':f')) or 0 end
      local okind, oexp = nil, 0
      if alg ~= ALG_CONCURRENCY then
        local ov = call('GET', keys[i] .. ':o')
        if ov and #ov == OVLEN then
          local k, e, oe, ow, oc = sunpk(OVFMT, ov)
          if now < e and (k == 'b' or k == 'u' or k == 'l' and oe > 0 and ow > 0 and oc > 0) then
            okind, oexp, anyov = k, e, true
            if k == 'l' then events, w, capacity = oe, ow, oc end
          end
        end
      end
      if okind == 'l' then
        oes[i], ows[i], ocs[i] = events, w, capacity
        ovf[i] = 4 * (capacity + 1)
      end
      if okind == 'b' then
        -- blocked until the override ends: nothing written
        allowed, rem, retry, reset = 0, 0, oexp - now, oexp - now
        ovf[i] = 4
      elseif okind == 'u' then
        -- unlimited: allowed, nothing charged
        rem = min(capacity, MAXOCAP)
        ovf[i] = 4 * (rem + 1)
      elseif p > 0 and pen ~= 0 and now < pen + p then
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
      if allowed ~= 1 and mode ~= MODE_REPORT_ONLY and mode ~= MODE_REPORT_ONLY_REFUNDABLE and mode ~= MODE_REPORT_ONLY_INFLIGHT then all = false end
      local nowrite = okind == 'b' or okind == 'u' -- nothing to write
      if i < n then
        vals[i], resets[i], raws[i], fulls[i] = val, not nowrite and reset, raw, full
      else
        lastraw, lastfull = raw, full
        if allowed == 1 and not nowrite then
          if all then
            lastval, lastreset = val, reset
          else
            -- vetoed: nothing is charged; show this zone as it stands
            allowed, rem, retry, reset = step(raw, events, w, capacity, 0, ot)
          end
        end
      end
    end
    local o = REPLY * (i - 1)
    out[o + 1] = allowed
    out[o + 2] = rem
    out[o + 3] = retry
    out[o + 4] = reset
  end
  -- every zone has decided: write the zones that allowed, if all did
  for i = 1, n - 1 do
    local o = REPLY * (i - 1)
    if resets[i] and out[o + 1] == 1 then
      if all then
        store(keys[i], vals[i], resets[i])
      else
        -- vetoed, as above
        local z = zs[i]
        if ovf[i] == 0 then
          out[o + 1], out[o + 2], out[o + 3], out[o + 4] =
            steps[z[1]](raws[i], z[2], z[3], z[4], 0, z[5])
        else
          out[o + 1], out[o + 2], out[o + 3], out[o + 4] =
            steps[z[1]](raws[i], oes[i], ows[i], ocs[i], 0, z[5])
        end
      end
    end
  end
  if lastreset then store(keys[n], lastval, lastreset) end
  -- the charges taken in flight, if every zone allowed (a take's, whose
  -- parse zs[i] has its mode and cost)
  if all and flying then
    for i = 1, n do
      local mode = zs[i][7]
      if (mode == MODE_INFLIGHT or mode == MODE_REPORT_ONLY_INFLIGHT) and out[REPLY * (i - 1) + 1] == 1 then
        local fk = keys[i] .. ':f'
        call('INCRBY', fk, zs[i][9])
        call('PEXPIRE', fk, inflightTTL)
      end
    end
  end
  -- the concurrency zones' leases, if every zone allowed (a take's, not a
  -- refund's or a renewal's, whose zones report allowed)
  if all and conc then
    for i = 1, n do
      if zs[i][1] == ALG_CONCURRENCY and leases[i] and out[REPLY * (i - 1) + 1] == 1 then
        concurrency_commit(keys[i], zs[i][3], leases[i])
      end
    end
  end
  if anyov then
    for i = 1, n do
      local o = REPLY * (i - 1) + 1
      out[o] = out[o] + ovf[i]
    end
  end
  if not all then
    local o = REPLY * n + 1
    out[o] = now
    out[o + n + 1] = nil -- the array ends here (out outlives the call)
    for i = 1, n do
      local r = fulls[i]
      if i == n then r = lastfull end
      if zs[i][1] == ALG_CONCURRENCY or ovf[i] ~= 0 then
        r = 0 -- a concurrency zone's key, an overridden one: the deny cache keeps no entry
      elseif not r then
        r = ''
      elseif #r > 1024 then
        r = 0
      end
      out[o + i] = r
    end
    return out
  end
  if n == 1 and not wantnow and anyov and out[1] % 4 == 1 and out[3] == 0 then
    -- one zone allowed under an override, with no wait: one negative
    -- integer, -((capacity x 2^16 + remaining) x 2^20 + reset-after) - 1,
    -- when they fit (script.go's packedAdmission reads it)
    local cap, rem, reset = (out[1] - 1) / 4 - 1, out[2], out[4]
    if cap < 65536 and rem >= 0 and rem < 65536 and reset >= 0 and reset < 1048576 then
      return -((cap * 65536 + rem) * 1048576 + reset) - 1
    end
  end
  if n == 1 and not wantnow and not anyov and out[1] == 1 and out[3] == 0 then
    -- one zone allowed with no wait: one packed integer (see atop)
    local rem, reset = out[2], out[4]
    if rem >= 0 and reset >= 0 then
      if reset < 65536 and rem < 34359738368 then
        return (rem * 65536 + reset) * 4
      elseif reset < 16777216 and rem < 134217728 then
        return (rem * 16777216 + reset) * 4 + 1
      elseif reset < 4294967296 and rem < 524288 then
        return (rem * 4294967296 + reset) * 4 + 2
      end
    end
  end
  local k = REPLY * n
  if wantnow then
    k = k + 1
    out[k] = now
  end
  out[k + 1] = nil -- the array ends here (out outlives the call)
  return out
end
