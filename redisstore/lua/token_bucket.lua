-- token_bucket mirrors algorithms/token_bucket.go.
-- State: the debt (in tokens x scale), its instant (Unix ms) and the scale
-- (the window it was counted in). Stored in binary (see common.lua): f1 is
-- the debt, last the scale, so 100 per minute takes 7 to 10 bytes; or, out
-- of the binary range, "<debt>:<at>:<scale>".

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

-- tb_advance returns the debt and its instant, refilled up to now; the
-- debt is at most the bucket plus the slots reserved by waiting requests
-- (o.d, the zone's delay: algorithms/delay.go).
local function tb_advance(raw, events, w, capacity, o)
  local full = capacity * w
  local room = full
  if o then room = full + o.d * events end
  local debt, at = 0, now
  local d, a, s, _
  if raw then
    a, d, _, s = load_state(raw, 0, '^(%-?%d+):(%-?%d+):(%d+)$', 2)
  end
  if d and s > 0 then
    debt, at = d, a
    if s ~= w then
      debt = rescale(debt, s, w, full)
    end
    if debt < 0 then debt = 0 end
    if debt > room then debt = room end
    local elapsed = now - at
    if elapsed > 0 then
      -- elapsed >= ceil(debt / events), without a division: a product of
      -- 2^53 or more, rounded, still exceeds the debt
      if elapsed * events >= debt then
        debt = 0
      else
        debt = debt - elapsed * events
      end
      at = now
    end
  end
  return debt, at
end

-- tb_state returns the reset-after (ms) of a debt counted at `at`, and the
-- value that stores it.
local function tb_state(debt, at, events, w)
  return (at - now) + ceildiv(debt, events),
    pack(0, at, debt, nil, w) or string.format('%.0f:%.0f:%.0f', debt, at, w)
end

-- token_bucket returns allowed (1/0), remaining, retry-after (ms; for an
-- admission, its wait: algorithms/delay.go), then tb_state's reset-after
-- and value. o is the zone's options (common.lua), nil for none.
local function token_bucket(raw, events, w, capacity, cost, o)
  local debt, at = tb_advance(raw, events, w, capacity, o)
  local full = capacity * w
  local thr = full
  if o then thr = threshold(o, full, w) end
  local allowed, retry = 0, w -- more than the capacity: never admitted
  if cost <= capacity then
    local need, wait, ok = cost * w, 0, true
    if o then
      wait, retry, ok = admit(o, debt, need, full, w, events, at - now)
    elseif debt + need > full and need > 0 then
      -- no options: admit's answer, without its calls
      ok, retry = false, ceildiv(debt + need - full, events) + (at - now)
    end
    if ok then
      allowed, retry, debt = 1, wait, debt + need
    end
  end
  local rem = 0
  if debt < thr then rem = idiv(thr - debt, w) end
  return allowed, rem, retry, tb_state(debt, at, events, w)
end

-- token_bucket_refund gives back cost, never below zero debt; it returns
-- tb_state's reset-after and value, or nothing without a state.
local function token_bucket_refund(raw, events, w, capacity, cost, at, o)
  if not raw then return nil end
  local debt, at = tb_advance(raw, events, w, capacity, o)
  return tb_state(max(debt - cost * w, 0), at, events, w)
end
