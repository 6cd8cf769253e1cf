-- Sluice: the body of the decision script, shared by the production entry
-- point (time from redis.call('TIME')) and the test entry point (time from
-- ARGV[1]). The entry point defines `now` (Unix milliseconds) and `argbase`
-- (how many ARGV entries precede the zones'), then this body runs.
--
-- KEYS[i] is zone i's state key. For zone i, ARGV[argbase + 6(i-1) + 1..6]
-- are: algorithm, events, window (ms), capacity, cost, mode (0 take,
-- 1 refund). It decides every zone against the state as it is and writes
-- only if every zone allows (all-or-nothing; a refusal never consumes).
-- Refund mode gives back cost (for a veto in another Cluster slot).
--
-- It returns, per zone, four integers: allowed (1/0), remaining, retry-after
-- (ms) and reset-after (ms). Every number here is an integer below 2^53, so
-- Lua's doubles compute exactly what the Go twin computes.

local margin = 1000 -- ms a key outlives its refill, so expired == full

-- idiv is floor(a/b) for 0 <= a < 2^53, 0 < b, corrected for the rounding
-- of the double division.
local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

local function ceildiv(a, b)
  if a <= 0 then
    return 0
  end
  return idiv(a + b - 1, b)
end

-- rescale converts a debt of x units of scale `from` into units of scale
-- `to`, rounded up (in the limiter's favour) and capped at limit, exactly
-- as the Go twin does while x * to stays below 2^53. (Only a changed window
-- gets here; beyond 2^53 the product is approximated, and the twins may
-- differ by a unit.)
local function rescale(x, from, to, limit)
  if x <= 0 then
    return 0
  end
  local v
  if x * to < 9007199254740992 then
    v = ceildiv(x * to, from)
  else
    v = math.ceil(x / from * to)
  end
  if v > limit then
    v = limit
  end
  return v
end

local function fmt(x)
  return string.format('%.0f', x)
end

-- load returns the stored state {debt, at, scale}, or nil.
local function load(key)
  local raw = redis.call('GET', key)
  if not raw then
    return nil
  end
  local d, a, s = string.match(raw, '^(%-?%d+):(%-?%d+):(%d+)$')
  if not d then
    return nil -- unreadable state counts as none (a full bucket)
  end
  return {tonumber(d), tonumber(a), tonumber(s)}
end

-- token_bucket mirrors algorithms/token_bucket.go. It returns the charged
-- and uncharged views and the state to store.
local function token_bucket(st, events, w, capacity, cost)
  local full = capacity * w
  local rate = events
  local debt, at = 0, now
  if st and st[3] > 0 then
    debt = st[1]
    if st[3] ~= w then
      debt = rescale(debt, st[3], w, full)
    end
    if debt < 0 then debt = 0 end
    if debt > full then debt = full end
    at = st[2]
    local elapsed = now - at
    if elapsed > 0 then
      if elapsed >= ceildiv(debt, rate) then
        debt = 0
      else
        debt = debt - elapsed * rate
      end
      at = now
    end
  end
  local lag = at - now
  local t = full - debt
  local r = {allowed = 0, retry = 0, at = at, w = w,
    rem0 = idiv(t, w), reset0 = lag + ceildiv(debt, rate), debt0 = debt}
  if cost > capacity then
    r.rem, r.reset, r.retry, r.debt = r.rem0, r.reset0, w, debt
    return r
  end
  local need = cost * w
  if t >= need then
    t = t - need
    debt = debt + need
    r.allowed = 1
  else
    r.retry = lag + ceildiv(need - t, rate)
  end
  r.debt = debt
  r.refill = ceildiv(debt, rate)
  r.rem = idiv(t, w)
  r.reset = lag + r.refill
  return r
end

local function store(key, r)
  redis.call('SET', key, fmt(r.debt) .. ':' .. fmt(r.at) .. ':' .. fmt(r.w),
    'PX', fmt(math.max(r.reset, 0) + margin))
end

local n = #KEYS
local results = {}
local all = true
for i = 1, n do
  local b = argbase + 6 * (i - 1)
  local events = tonumber(ARGV[b + 2])
  local w = tonumber(ARGV[b + 3])
  local capacity = tonumber(ARGV[b + 4])
  local cost = tonumber(ARGV[b + 5])
  local mode = ARGV[b + 6]
  local st = load(KEYS[i])
  if mode == '1' then
    -- refund: give back cost, never below zero debt
    if st then
      local r = token_bucket(st, events, w, capacity, 0)
      r.debt = math.max(r.debt - cost * w, 0)
      r.reset = (r.at - now) + ceildiv(r.debt, events)
      store(KEYS[i], r)
    end
    results[i] = {allowed = 1, rem = 0, retry = 0, reset = 0}
  else
    local r = token_bucket(st, events, w, capacity, cost)
    results[i] = r
    if r.allowed == 0 then all = false end
  end
end

local out = {}
for i = 1, n do
  local r = results[i]
  if all then
    if r.debt then store(KEYS[i], r) end
    out[#out + 1] = r.allowed
    out[#out + 1] = r.rem
    out[#out + 1] = r.retry
    out[#out + 1] = r.reset
  else
    -- vetoed: nothing is charged; show each zone as it stands
    out[#out + 1] = r.allowed
    if r.allowed == 1 then
      out[#out + 1] = r.rem0
      out[#out + 1] = 0
      out[#out + 1] = r.reset0
    else
      out[#out + 1] = r.rem
      out[#out + 1] = r.retry
      out[#out + 1] = r.reset
    end
  end
end
return out
