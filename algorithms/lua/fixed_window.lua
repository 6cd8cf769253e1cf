-- fixed_window mirrors algorithms/fixed_window.go.
-- State: the count of window [start, start+length). Stored in binary (see
-- common.lua: the instant start, f1 = count, last = length), or, out of the
-- binary range or from an older Sluice, "f<count>:<start>:<length>".

local function fw_load(raw, w)
  local count, start, length = 0, idiv(now, w) * w, w
  local c, s, l, _
  if raw then
    s, c, _, l = load_state(raw, 3, '^f(%d+):(%-?%d+):(%d+)$', 2)
  end
  if c and l > 0 and now < s + l then
    count, start, length = c, s, l
  end
  return count, start, length
end

local function fw_result(r, count, start, length)
  local full_at = now
  if count > 0 then full_at = start + length end
  r.val = pack(3, start, count, nil, length) or ('f' .. fmt(count) .. ':' .. fmt(start) .. ':' .. fmt(length))
  r.reset = full_at - now
  return r
end

local function fixed_window(raw, events, w, capacity, cost)
  local count, start, length = fw_load(raw, w)
  local r = {allowed = 0, retry = 0}
  if cost > events then
    r.retry = w
  elseif cost <= events - count then
    count = count + cost
    r.allowed = 1
  else
    r.retry = start + length - now
  end
  r.rem = math.max(events - count, 0)
  return fw_result(r, count, start, length)
end

local function fixed_window_refund(raw, events, w, capacity, cost)
  if not raw then return nil end
  local count, start, length = fw_load(raw, w)
  return fw_result({}, math.max(count - cost, 0), start, length)
end
