-- sync: the asynchronous mode's call (redisstore/async.go), the Lua twin of
-- algorithms.AddCharges. It adds an instance's charges to its keys and
-- returns their states. KEYS[i] is a key, ARGV[base + i] its argument
-- "<algorithm id>:<events>:<window ms>:<start>:<units>:<start>:<units>":
-- two charges, each tagged with its aligned window's start (units 0:
-- none). The reply: four integers per key, the state's window start, its
-- length, the previous window's count (sliding_window; 0 else) and the
-- current one's. A key is written only when a charge counted; a penalty
-- it held (a zone configured otherwise before) is dropped, as the Go twin
-- drops it.

local SYNC_ARG = '^(%d+):(%d+):(%d+):(%-?%d+):(%d+):(%-?%d+):(%d+)$'

local function sync(keys, argv, base)
  if not byte then bind() end
  local out = {}
  for i = 1, #keys do
    local s = argv[base + i]
    local a, e, w, s1, u1, s2, u2 = string.match(s, SYNC_ARG)
    a, e, w = tonum(a), tonum(e), tonum(w)
    if a ~= 2 and a ~= 3 then
      return redis.error_reply('sluice: sync: malformed argument ' .. tostring(s))
    end
    s1, u1, s2, u2 = tonum(s1), tonum(u1), tonum(s2), tonum(u2)
    local full = call('GET', keys[i])
    local raw = nil
    if full then raw = unpen(full) end
    local counted = false
    local at, len, prev, cur, reset, val
    if a == 3 then
      local count, start, length = fw_load(raw, w)
      if count > e then count = e end
      if u1 > 0 and s1 + w > start then count, counted = min(count + u1, e), true end
      if u2 > 0 and s2 + w > start then count, counted = min(count + u2, e), true end
      reset, val = fw_result(count, start, length)
      at, len, prev, cur = start, length, 0, count
    else
      local st, p, c, vnow = sw_load(raw, e, w)
      if u1 > 0 then
        if s1 >= st then c, counted = min(c + u1, e), true
        elseif s1 >= st - w then p, counted = min(p + u1, e), true end
      end
      if u2 > 0 then
        if s2 >= st then c, counted = min(c + u2, e), true
        elseif s2 >= st - w then p, counted = min(p + u2, e), true end
      end
      local _
      _, _, _, reset, val = sw_result(1, 0, st, p, c, vnow, e, w)
      at, len, prev, cur = st, w, p, c
    end
    if counted then store(keys[i], val, reset) end
    local o = 4 * (i - 1)
    out[o + 1], out[o + 2], out[o + 3], out[o + 4] = at, len, prev, cur
  end
  return out
end
