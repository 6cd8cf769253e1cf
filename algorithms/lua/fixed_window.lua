-- fixed_window mirrors algorithms/fixed_window.go.
-- State: "f<count>:<start>:<length>", the count of window [start, start+length).

local function fw_load(raw, w)
  local count, start, length = 0, idiv(now, w) * w, w
  local c, s, l
  if raw then
    c, s, l = string.match(raw, '^f(%d+):(%-?%d+):(%d+)$')
  end
  if c and tonumber(l) > 0 and now < tonumber(s) + tonumber(l) then
    count, start, length = tonumber(c), tonumber(s), tonumber(l)
  end
  return count, start, length
end

local function fw_result(r, count, start, length)
  local full_at = now
  if count > 0 then full_at = start + length end
  r.val = 'f' .. fmt(count) .. ':' .. fmt(start) .. ':' .. fmt(length)
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
