-- gcra mirrors algorithms/gcra.go. Time in units of 1/u ms, u = events /
-- gcd(events, window); the emission interval is window / gcd units.
-- State: the theoretical arrival time (TAT) q + r/u ms. Stored in binary
-- (see common.lua: the instant q, f1 = r, last = u), or, out of the binary
-- range, "g<q>:<r>:<u>".

local function gcra_units(events, w, capacity)
  local g = gcd(events, w)
  local u = idiv(events, g)
  local ei = idiv(w, g)
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
-- remaining, the reset-after (ms) and the value that stores the TAT.
local function gcra_result(allowed, retry, ahead, rest, d, over, u, ei, tau)
  local rem = 0
  if not over and d < tau then
    rem = idiv(tau - d, ei)
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

-- gcra returns allowed (1/0), remaining, retry-after, reset-after (ms) and
-- the value to store.
local function gcra(raw, events, w, capacity, cost)
  local u, ei, tau = gcra_units(events, w, capacity)
  local ahead, rest = gcra_load(raw, u)
  local over = ahead > idiv(tau, u) + 1
  local d = 0
  if ahead >= 0 and not over then
    d = ahead * u + rest
  end
  local need = cost * ei
  if cost > capacity then
    return gcra_result(0, w, ahead, rest, d, over, u, ei, tau)
  elseif not over and need <= tau - d then
    d = d + need
    ahead = idiv(d, u)
    return gcra_result(1, 0, ahead, d - ahead * u, d, over, u, ei, tau)
  end
  return gcra_result(0, ahead - idiv(tau - need - rest, u), ahead, rest, d, over, u, ei, tau)
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
