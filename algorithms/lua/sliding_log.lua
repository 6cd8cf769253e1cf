-- sliding_log mirrors algorithms/sliding_log.go.
-- State: "l<base>" then, per admitted event oldest first, ",<t-base>" or
-- ",<t-base>*<cost>" (cost 1 is implied); base is the oldest event's time.

-- sl_load returns the events still in the window: times, costs, their sum.
local function sl_load(raw, w)
  local ts, cs, sum = {}, {}, 0
  if not raw then
    return ts, cs, sum
  end
  local base = string.match(raw, '^l(%-?%d+)')
  if not base then
    return ts, cs, sum
  end
  base = tonumber(base)
  for d, c in string.gmatch(raw, ',(%d+)%*?(%d*)') do
    local t = base + tonumber(d)
    if t + w > now then
      local cost = 1
      if c ~= '' then cost = tonumber(c) end
      ts[#ts + 1] = t
      cs[#cs + 1] = cost
      sum = sum + cost
    end
  end
  return ts, cs, sum
end

local function sl_result(r, ts, cs, w)
  local k = #ts
  if k == 0 then
    r.reset = 0
    r.val = nil -- nothing to keep: the key is deleted
    return r
  end
  r.reset = ts[k] + w - now
  local base = ts[1]
  local parts = {'l' .. fmt(base)}
  for i = 1, k do
    local p = ',' .. fmt(ts[i] - base)
    if cs[i] ~= 1 then
      p = p .. '*' .. fmt(cs[i])
    end
    parts[i + 1] = p
  end
  r.val = table.concat(parts)
  return r
end

local function sliding_log(raw, n, w, capacity, cost)
  local ts, cs, sum = sl_load(raw, w)
  local r = {allowed = 0, retry = 0}
  if cost > n then
    r.retry = w
  elseif cost <= n - sum then
    r.allowed = 1
    if cost > 0 then
      local at = now
      local k = #ts
      if k > 0 and ts[k] > at then at = ts[k] end
      ts[k + 1] = at
      cs[k + 1] = cost
      sum = sum + cost
    end
  else
    local freed = 0
    for i = 1, #ts do
      freed = freed + cs[i]
      if sum - freed <= n - cost then
        r.retry = ts[i] + w - now
        break
      end
    end
  end
  r.rem = math.max(n - sum, 0)
  return sl_result(r, ts, cs, w)
end

-- sliding_log_refund removes the newest event of exactly this cost.
local function sliding_log_refund(raw, n, w, capacity, cost)
  if not raw then return nil end
  local ts, cs = sl_load(raw, w)
  for i = #ts, 1, -1 do
    if cs[i] == cost then
      table.remove(ts, i)
      table.remove(cs, i)
      break
    end
  end
  return sl_result({}, ts, cs, w)
end
