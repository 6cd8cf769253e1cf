-- sync: the asynchronous mode's call (redisstore/async.go), the Lua twin of
-- algorithms.AddCharges. It adds an instance's charges to its keys and
-- returns their states. KEYS are the keys; ARGV[base + 1] is one binary
-- string holding, per key in order, 49 bytes (syncArgSize): the algorithm
-- id (one byte), then as big-endian doubles (exact: every value is an
-- integer below 2^53) the events, the window (ms) and two charges, each
-- the start of its aligned window and its units (0: none). The reply is
-- one binary string of four big-endian doubles per key: the state's
-- window start, its length, the previous window's count (sliding_window;
-- 0 else) and the current one's. A key is written only when a charge
-- counted; a penalty it held (a zone configured otherwise before) is
-- dropped, as the Go twin drops it.

local function sync(keys, argv, base)
  if not byte then bind() end
  local blob = argv[base + 1]
  if type(blob) ~= 'string' or #blob ~= 49 * #keys then
    return redis.error_reply('sluice: sync: malformed argument')
  end
  local out = {}
  local pos = 1
  for i = 1, #keys do
    local a, e, w, s1, u1, s2, u2
    a, e, w, s1, u1, s2, u2, pos = sunpk('>Bdddddd', blob, pos)
    if a ~= 2 and a ~= 3 then
      return redis.error_reply('sluice: sync: unknown algorithm ' .. tostring(a))
    end
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
    out[i] = spk('>dddd', at, len, prev, cur)
  end
  return table.concat(out)
end
