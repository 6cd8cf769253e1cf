-- sliding_window mirrors algorithms/sliding_window.go.
-- State: cur counted in [start, start+w), prev in the window before.
-- Stored in binary (see common.lua: the instant start, f1 = prev, f2 =
-- cur, last = w), or, out of the binary range or from an older Sluice,
-- "s<prev>:<cur>:<start>:<w>".

-- sw_load returns the state rolled forward to max(now, start).
local function sw_load(raw, n, w)
  local s, prev, cur
  local p, c, a, sc
  if raw then
    a, p, c, sc = load_state(raw, 2, '^s(%d+):(%d+):(%-?%d+):(%d+)$', 3)
  end
  if p and sc > 0 then
    prev, cur, s = math.min(p, n), math.min(c, n), a
    if sc ~= w then
      s = idiv(s, w) * w
      cur = cur + math.min(prev, n - cur)
      prev = 0
    end
  else
    s, prev, cur = idiv(now, w) * w, 0, 0
  end
  local vnow = math.max(now, s)
  if vnow >= s + 2 * w then
    prev, cur, s = 0, 0, idiv(vnow, w) * w
  elseif vnow >= s + w then
    prev, cur, s = cur, 0, s + w
  end
  return s, prev, cur, vnow
end

local function sw_result(r, s, prev, cur, vnow, n, w)
  r.rem = math.max(n - cur - ceildiv(prev * (w - (vnow - s)), w), 0)
  local full_at = now
  if cur > 0 then
    full_at = s + 2 * w
  elseif prev > 0 then
    full_at = s + w
  end
  r.reset = full_at - now
  r.val = pack(2, s, prev, cur, w) or ('s' .. fmt(prev) .. ':' .. fmt(cur) .. ':' .. fmt(s) .. ':' .. fmt(w))
  return r
end

local function sliding_window(raw, n, w, capacity, cost)
  local s, prev, cur, vnow = sw_load(raw, n, w)
  local weighted = prev * (w - (vnow - s))
  local r = {allowed = 0, retry = 0}
  if cost > n then
    r.retry = w
  elseif cost <= n - cur and weighted <= (n - cur - cost) * w then
    cur = cur + cost
    r.allowed = 1
  else
    local t
    local a = n - cur - cost
    if a >= 0 and prev > 0 then
      t = s + w - idiv(a * w, prev)
    else
      t = s + w
      if cur > 0 then
        t = t + math.max(w - idiv((n - cost) * w, cur), 0)
      end
    end
    r.retry = t - now
  end
  return sw_result(r, s, prev, cur, vnow, n, w)
end

-- sliding_window_refund takes cost off the current count, then the previous.
local function sliding_window_refund(raw, n, w, capacity, cost)
  if not raw then return nil end
  local s, prev, cur, vnow = sw_load(raw, n, w)
  local c = math.min(cost, cur)
  cur = cur - c
  prev = math.max(prev - (cost - c), 0)
  return sw_result({}, s, prev, cur, vnow, n, w)
end
