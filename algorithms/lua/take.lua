-- Sluice: the main body of the decision script, shared by the production
-- entry point (time from redis.call('TIME')) and the test entry point (time
-- from ARGV[1]). The entry point defines `now` (Unix milliseconds),
-- `argbase` (how many ARGV entries precede the zones') and `compact` (write
-- states in binary); then common.lua and every algorithm's file are
-- included (see algorithms/lua.go), then this.
--
-- KEYS[i] is zone i's state key. For zone i, ARGV[argbase + 6(i-1) + 1..6]
-- are: algorithm id, events, window (ms), capacity, cost, mode (0 take,
-- 1 refund). It decides every zone, whatever its algorithm, against the
-- state as it is, and writes only if every zone allows (all-or-nothing; a
-- refusal never consumes). Refund mode gives back cost (for a veto in
-- another Cluster slot).
--
-- It returns, per zone, four integers: allowed (1/0), remaining, retry-after
-- (ms) and reset-after (ms).

local steps = {[0] = token_bucket, [1] = gcra, [2] = sliding_window,
  [3] = fixed_window, [4] = sliding_log}
local refunds = {[0] = token_bucket_refund, [1] = gcra_refund,
  [2] = sliding_window_refund, [3] = fixed_window_refund,
  [4] = sliding_log_refund}

-- store writes r's state with a TTL of its time to full plus the margin,
-- or deletes the key when the state is empty.
local function store(key, r)
  if r.val then
    redis.call('SET', key, r.val, 'PX', fmt(math.max(r.reset, 0) + margin))
  else
    redis.call('DEL', key)
  end
end

local n = #KEYS
local zones = {}
local all = true
for i = 1, n do
  local b = argbase + 6 * (i - 1)
  local z = {
    alg = tonumber(ARGV[b + 1]),
    events = tonumber(ARGV[b + 2]),
    w = tonumber(ARGV[b + 3]),
    capacity = tonumber(ARGV[b + 4]),
    cost = tonumber(ARGV[b + 5]),
    raw = redis.call('GET', KEYS[i]),
  }
  if not steps[z.alg] then
    return redis.error_reply('sluice: unknown algorithm id ' .. tostring(ARGV[b + 1]))
  end
  if z.raw == false then z.raw = nil end
  if ARGV[b + 6] == '1' then
    local r = refunds[z.alg](z.raw, z.events, z.w, z.capacity, z.cost)
    if r then store(KEYS[i], r) end
    z.r = {allowed = 1, rem = 0, retry = 0, reset = 0}
  else
    z.r = steps[z.alg](z.raw, z.events, z.w, z.capacity, z.cost)
    z.report = ARGV[b + 6] == '2'
    -- a report-only zone never vetoes
    if z.r.allowed == 0 and not z.report then all = false end
    z.take = true
  end
  zones[i] = z
end

local out = {}
for i = 1, n do
  local z = zones[i]
  local r = z.r
  if z.take and all and r.allowed == 1 then
    store(KEYS[i], r)
  elseif z.take and not all and r.allowed == 1 then
    -- vetoed: nothing is charged; show this zone as it stands
    r = steps[z.alg](z.raw, z.events, z.w, z.capacity, 0)
  end
  out[#out + 1] = r.allowed
  out[#out + 1] = r.rem
  out[#out + 1] = r.retry
  out[#out + 1] = r.reset
end
return out
