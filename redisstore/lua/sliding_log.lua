-- sliding_log mirrors algorithms/sliding_log.go.
-- State: "l<base>" then, per admitted event oldest first, ",<t-base>" or
-- ",<t-base>*<cost>" (cost 1 is implied); base is the oldest event's time.

-- sl_load returns the events still in the window: times, costs, their sum.
-- (The captures are decimal digits: arithmetic converts them as tonumber
-- would.)
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
  local k = 0
  for d, c in string.gmatch(raw, ',(%d+)%*?(%d*)') do
    local t = base + d
    if t + w > now then
      local cost = 1
      if c ~= '' then cost = c + 0 end
      k = k + 1
      ts[k] = t
      cs[k] = cost
      sum = sum + cost
    end
  end
  return ts, cs, sum
end

-- sl_result returns the reset-after (ms) and the value that stores the
-- events (nil: nothing to keep, the key is deleted).
local function sl_result(ts, cs, w)
  local k = #ts
  if k == 0 then
    return 0, nil
  end
  local base = ts[1]
  local parts = {string.format('l%.0f', base)}
  for i = 1, k do
    if cs[i] ~= 1 then
      parts[i + 1] = string.format(',%.0f*%.0f', ts[i] - base, cs[i])
    else
      parts[i + 1] = string.format(',%.0f', ts[i] - base)
    end
  end
  return ts[k] + w - now, table.concat(parts)
end

-- sliding_log returns allowed (1/0), remaining, retry-after, then
-- sl_result's reset-after and value.
local function sliding_log(raw, n, w, capacity, cost)
  local ts, cs, sum = sl_load(raw, w)
  local allowed, retry = 0, 0
  if cost > n then
    retry = w
  elseif cost <= n - sum then
    allowed = 1
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
        retry = ts[i] + w - now
        break
      end
    end
  end
  return allowed, max(n - sum, 0), retry, sl_result(ts, cs, w)
end

-- sliding_log_refund removes the event of the charge made at `at` (Unix
-- ms): the oldest event of this cost recorded at or after it; at 0
-- (unknown): the newest event of this cost. It returns sl_result's
-- reset-after and value, or nothing when there is nothing to write (no
-- such event in the window).
local function sliding_log_refund(raw, n, w, capacity, cost, at)
  if not raw then return nil end
  local ts, cs = sl_load(raw, w)
  local k
  if at > 0 then
    for i = 1, #ts do
      if cs[i] == cost and ts[i] >= at then
        k = i
        break
      end
    end
  else
    for i = #ts, 1, -1 do
      if cs[i] == cost then
        k = i
        break
      end
    end
  end
  if not k then return nil end
  table.remove(ts, k)
  table.remove(cs, k)
  return sl_result(ts, cs, w)
end
