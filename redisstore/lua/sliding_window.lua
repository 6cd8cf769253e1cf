-- sliding_window mirrors algorithms/sliding_window.go.
-- State: cur counted in [start, start+w), prev in the window before.
-- Stored in binary (see common.lua: the instant start, f1 = prev, f2 =
-- cur, last = w), or, out of the binary range, "s<prev>:<cur>:<start>:<w>".

-- sw_load returns the state rolled forward to max(now, start).
local function sw_load(raw, n, w)
  local s, prev, cur
  local p, c, a, sc
  if raw then
    a, p, c, sc = load_state(raw, 2, '^s(%d+):(%d+):(%-?%d+):(%d+)$', 3)
  end
  if p and sc > 0 then
    -- comparisons, not math.min and math.max: a call from Lua to C costs
    -- more than the comparison
    prev, cur, s = p, c, a
    if prev > n then prev = n end
    if cur > n then cur = n end
    if sc ~= w then
      s = idiv(s, w) * w
      cur = cur + min(prev, n - cur)
      prev = 0
    end
  else
    s, prev, cur = idiv(now, w) * w, 0, 0
  end
  local vnow = now
  if s > vnow then vnow = s end
  if vnow >= s + 2 * w then
    prev, cur, s = 0, 0, idiv(vnow, w) * w
  elseif vnow >= s + w then
    prev, cur, s = cur, 0, s + w
  end
  return s, prev, cur, vnow
end

-- sw_result returns a decision: allowed and retry as given, then the
-- remaining, the reset-after (ms) and the value that stores the state.
local function sw_result(allowed, retry, s, prev, cur, vnow, n, w)
  local full_at = now
  if cur > 0 then
    full_at = s + 2 * w
  elseif prev > 0 then
    full_at = s + w
  end
  local rem = n - cur
  if prev > 0 then rem = rem - ceildiv(prev * (w - (vnow - s)), w) end
  if rem < 0 then rem = 0 end
  return allowed, rem, retry, full_at - now,
    pack(2, s, prev, cur, w) or string.format('s%.0f:%.0f:%.0f:%.0f', prev, cur, s, w)
end

-- sliding_window returns allowed (1/0), remaining, retry-after,
-- reset-after (ms) and the value to store.
local function sliding_window(raw, n, w, capacity, cost)
  local s, prev, cur, vnow = sw_load(raw, n, w)
  local weighted = prev * (w - (vnow - s))
  if cost > n then
    return sw_result(0, w, s, prev, cur, vnow, n, w)
  elseif cost <= n - cur and weighted <= (n - cur - cost) * w then
    return sw_result(1, 0, s, prev, cur + cost, vnow, n, w)
  end
  local t
  local a = n - cur - cost
  if a >= 0 and prev > 0 then
    t = s + w - idiv(a * w, prev)
  else
    t = s + w
    if cur > 0 then
      t = t + max(w - idiv((n - cost) * w, cur), 0)
    end
  end
  return sw_result(0, t - now, s, prev, cur, vnow, n, w)
end

-- sliding_window_refund takes cost off the count of the aligned window the
-- charge made at `at` (Unix ms) was counted in, the current or the previous
-- one (an older charge counts no more: nothing to give back); at 0
-- (unknown): off the current count, then the previous. It returns the
-- reset-after and the value, or nothing when there is nothing to write.
local function sliding_window_refund(raw, n, w, capacity, cost, at)
  if not raw then return nil end
  local s, prev, cur, vnow = sw_load(raw, n, w)
  if at <= 0 then
    local c = min(cost, cur)
    prev, cur = max(prev - (cost - c), 0), cur - c
  else
    local c = idiv(at, w) * w
    if c == s then
      cur = max(cur - cost, 0)
    elseif c == s - w then
      prev = max(prev - cost, 0)
    else
      return nil
    end
  end
  local _, _, _, reset, val = sw_result(1, 0, s, prev, cur, vnow, n, w)
  return reset, val
end
