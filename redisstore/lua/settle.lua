-- settle mirrors algorithms/settle.go: a charge of cost made at `at` (Unix
-- ms; 0: unknown) settled to the actual amount its response reported, the
-- difference given back (the algorithm's refund) or charged on top, which
-- may leave the key in debt. Each *_owe charges extra on top at now and
-- returns the reset-after and the value to store.

local max_settled = 9007199254740992 -- 2^53
local max_refill = 3153600000000 -- 100 years, in ms (algorithms.MaxRefill)

-- tb_owe: the debt, refilled to now, plus extra; beyond the bucket (and
-- the waiting room's slots), kept as the milliseconds its refill takes,
-- the state's instant moved ahead by them, rounded up.
local function tb_owe(raw, events, w, capacity, extra, o)
  local debt, at = tb_advance(raw, events, w, capacity, o)
  local room = capacity * w
  if o then room = room + o.d * events end
  local owed = debt + min(extra, idiv(max_settled - debt, w)) * w
  if owed > room then
    at = min(at + ceildiv(owed - room, events), max(at, now + max_refill))
    owed = room
  end
  return tb_state(owed, at, events, w)
end

-- gcra_owe moves the TAT ahead by extra emission intervals.
local function gcra_owe(raw, events, w, capacity, extra)
  local u, ei, tau = gcra_units(events, w, capacity)
  local ahead, rest = gcra_load(raw, u)
  local d = 0
  if ahead >= 0 then d = ahead * u + rest end
  local most = max_settled -- 100 years ahead at most, in units
  if u <= idiv(max_settled, max_refill) then most = max_refill * u end
  d = min(d + min(extra, idiv(max_settled - d, ei)) * ei, max(d, most))
  local a = idiv(d, u)
  if d == 0 then a = -1 end
  local _, _, _, reset, val = gcra_result(1, 0, a, d - max(a, 0) * u, d, false, u, ei, tau)
  return reset, val
end

-- fw_owe counts extra in the current window (ended with it).
local function fw_owe(raw, events, w, capacity, extra)
  local count, start, length = fw_load(raw, w)
  return fw_result(count + min(extra, max_settled - count), start, length)
end

-- sw_owe counts extra in the current window, at most the limit.
local function sw_owe(raw, n, w, capacity, extra)
  local s, prev, cur, vnow = sw_load(raw, n, w)
  local _, _, _, reset, val = sw_result(1, 0, s, prev, min(cur + extra, n), vnow, n, w)
  return reset, val
end

-- sl_settle gives the event of the charge (found as sliding_log_refund
-- finds it) the actual amount; an event gone from the window settles
-- nothing, but an extra charge is then recorded at now.
local function sl_settle(raw, n, w, cost, actual, at)
  local ts, cs = sl_load(raw, w)
  local k
  for i = 1, #ts do
    if cs[i] == cost and (at <= 0 or ts[i] >= at) then
      k = i
      if at > 0 then break end
    end
  end
  if k and actual > 0 then
    cs[k] = actual
  elseif k then
    table.remove(ts, k)
    table.remove(cs, k)
  elseif actual > cost then
    local t, j = now, #ts
    if j > 0 and ts[j] > t then t = ts[j] end
    ts[j + 1], cs[j + 1] = t, actual - cost
  else
    return nil
  end
  return sl_result(ts, cs, w)
end

local owes = {[0] = tb_owe, [1] = gcra_owe, [2] = sw_owe, [3] = fw_owe}
local gives = {[0] = token_bucket_refund, [1] = gcra_refund,
  [2] = sliding_window_refund, [3] = fixed_window_refund}

-- settle_to settles a charge of cost to actual on a key's state (raw, the
-- algorithm's value; nil for none); it returns the reset-after and the
-- value, or nothing when there is nothing to write.
local function settle_to(alg, raw, events, w, capacity, cost, actual, at, o)
  actual = min(max(actual, 0), max_settled)
  if actual == cost then return nil end
  if alg == 4 then
    return sl_settle(raw, events, w, cost, min(actual, max(events, cost)), at)
  end
  if actual < cost then
    return gives[alg](raw, events, w, capacity, cost - actual, at, o)
  end
  return owes[alg](raw, events, w, capacity, actual - cost, o)
end
