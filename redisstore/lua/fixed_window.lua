-- fixed_window mirrors algorithms/fixed_window.go.
-- State: the count of window [start, start+length). Stored in binary (see
-- common.lua: the instant start, f1 = count, last = length), or, out of the
-- binary range, "f<count>:<start>:<length>".

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

-- fw_result returns the reset-after (ms) and the value that stores the
-- state.
local function fw_result(count, start, length)
  local full_at = now
  if count > 0 then full_at = start + length end
  return full_at - now,
    pack(3, start, count, nil, length) or string.format('f%.0f:%.0f:%.0f', count, start, length)
end

-- fixed_window returns allowed (1/0), remaining, retry-after, then
-- fw_result's reset-after and value.
local function fixed_window(raw, events, w, capacity, cost)
  local count, start, length = fw_load(raw, w)
  local allowed, retry = 0, w -- more than the limit: never admitted
  if cost <= events then
    if cost <= events - count then
      allowed, retry, count = 1, 0, count + cost
    else
      retry = start + length - now
    end
  end
  -- a comparison, not math.max: a call from Lua to C costs more
  local rem = events - count
  if rem < 0 then rem = 0 end
  return allowed, rem, retry, fw_result(count, start, length)
end

-- fixed_window_refund takes cost off the window that counted the charge
-- made at `at` (Unix ms; 0: unknown, the current window), if it is still
-- the key's; it returns fw_result's reset-after and value, or nothing when
-- there is nothing to write.
local function fixed_window_refund(raw, events, w, capacity, cost, at)
  if not raw then return nil end
  local count, start, length = fw_load(raw, w)
  if at > 0 and (at < start or at >= start + length) then
    return nil
  end
  return fw_result(max(count - cost, 0), start, length)
end
