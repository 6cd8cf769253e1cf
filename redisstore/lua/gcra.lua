-- gcra mirrors algorithms/gcra.go. Time in units of 1/u ms, u = events /
-- gcd(events, window); the emission interval is window / gcd units.
-- State: the theoretical arrival time (TAT) q + r/u ms. Stored in binary
-- (see common.lua: the instant q, f1 = r, last = u), or, out of the binary
-- range, "g<q>:<r>:<u>".

-- gunits memoizes u by events, then window: a zone sends the same pair on
-- every call, and their gcd costs several divisions. Emptied when it holds
-- 1000 pairs, like memo.
local gunits, ngunits = {}, 0

-- gcra_units returns u, the emission interval ei (units) and tau, the
-- bucket (capacity x ei units).
local function gcra_units(events, w, capacity)
  local t = gunits[events]
  local u = t and t[w]
  if not u then
    if ngunits >= 1000 then
      gunits, ngunits = {}, 0
    end
    t = gunits[events]
    if not t then
      t = {}
      gunits[events] = t
    end
    u = idiv(events, gcd(events, w))
    t[w], ngunits = u, ngunits + 1
  end
  -- both quotients are integers, so the divisions are exact
  local ei = w / (events / u)
  return u, ei, capacity * ei
end

-- gcra_load returns the TAT as now + ahead ms + r units (ahead = -1: past).
local function gcra_load(raw, u)
  local q, r, sc, _
  if raw then
    q, r, _, sc = load_state(raw, 1, '^g(%-?%d+):(%d+):(%d+)$', 1)
  end
  if not q or sc <= 0 then
    return -1, 0
  end
  if r > sc - 1 then r = sc - 1 end
  if sc ~= u then
    r = ceildiv(r * u, sc)
    if r >= u then
      q, r = q + 1, r - u
    end
  end
  if q - now < 0 then
    return -1, 0
  end
  return q - now, r
end

-- gcra_result returns a decision: allowed and retry as given, then the
-- remaining (what fits under thr, the units that may be spent at once),
-- the reset-after (ms) and the value that stores the TAT.
local function gcra_result(allowed, retry, ahead, rest, d, over, u, ei, thr)
  local rem = 0
  if not over and d < thr then
    rem = idiv(thr - d, ei)
  end
  local reset, at = 0, now
  if ahead >= 0 then
    reset = ahead
    if rest > 0 then reset = ahead + 1 end
    at = now + ahead
  end
  return allowed, rem, retry, reset,
    pack(1, at, rest, nil, u) or string.format('g%.0f:%.0f:%.0f', at, rest, u)
end

-- gcra returns allowed (1/0), remaining, retry-after (for an admission,
-- its wait: algorithms/delay.go), reset-after (ms) and the value to store.
-- o is the zone's options (common.lua), nil for none.
local function gcra(raw, events, w, capacity, cost, o)
  local u, ei, tau = gcra_units(events, w, capacity)
  local room = tau
  if o then room = tau + o.d * u end
  local ahead, rest = gcra_load(raw, u)
  -- ahead > floor(room / u) + 1, without a division: a product of 2^53 or
  -- more, rounded, still exceeds room
  local over = (ahead - 1) * u > room
  local d = 0
  if ahead >= 0 and not over then
    d = ahead * u + rest
  end
  local need = cost * ei
  local thr = tau
  if o then thr = threshold(o, tau, ei) end
  if cost > capacity then
    return gcra_result(0, w, ahead, rest, d, over, u, ei, thr)
  elseif over then
    -- ceil((d + need - a) / u) ms, computed without d, less the longest wait
    local a = thr
    if need > a then a = need end
    local retry = ahead - idiv(a - need - rest, u)
    if o and o.d > 0 and o.n == 0 then retry = retry - o.d end
    return gcra_result(0, retry, ahead, rest, d, over, u, ei, thr)
  end
  local wait, retry, ok = 0, 0, true
  if o then
    wait, retry, ok = admit(o, d, need, tau, ei, u, 0)
  elseif d + need > tau and need > 0 then
    -- no options: admit's answer, without its calls
    ok, retry = false, ceildiv(d + need - tau, u)
  end
  if ok then
    d = d + need
    ahead = idiv(d, u)
    return gcra_result(1, wait, ahead, d - ahead * u, d, over, u, ei, thr)
  end
  return gcra_result(0, retry, ahead, rest, d, over, u, ei, thr)
end

-- gcra_refund moves the TAT back by cost emission intervals, never before
-- now; it returns the reset-after and the value, or nothing without a state.
local function gcra_refund(raw, events, w, capacity, cost)
  if not raw then return nil end
  local u, ei, tau = gcra_units(events, w, capacity)
  local ahead, rest = gcra_load(raw, u)
  local _, reset, val
  if ahead < 0 then
    _, _, _, reset, val = gcra_result(1, 0, -1, 0, 0, false, u, ei, tau)
    return reset, val
  end
  -- the TAT in units from now, less the refund; ahead is at most the
  -- capacity plus the time of one request here (the refund follows a charge)
  local d = max(ahead * u + rest - cost * ei, 0)
  local a = idiv(d, u)
  if d == 0 then a = -1 end
  _, _, _, reset, val = gcra_result(1, 0, a, d - max(a, 0) * u, d, false, u, ei, tau)
  return reset, val
end
