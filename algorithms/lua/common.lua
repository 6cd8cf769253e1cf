-- Sluice: helpers shared by the algorithms' Lua twins. Every number here is
-- an integer below 2^53 (Validate sees to it), so Lua's doubles compute
-- exactly what the Go twins compute.

local margin = 1000 -- ms a key outlives its return to full, so expired == full

-- idiv is floor(a/b) for |a| < 2^53, 0 < b, corrected for the rounding of
-- the double division.
local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

local function ceildiv(a, b)
  if a <= 0 then
    return 0
  end
  return idiv(a + b - 1, b)
end

local function gcd(a, b)
  while b ~= 0 do
    a, b = b, a - idiv(a, b) * b
  end
  return a
end

local function fmt(x)
  return string.format('%.0f', x)
end

-- The stored state. The constant-size states (token bucket, gcra, sliding
-- and fixed window) are stored in binary: 7 to 12 bytes for common limits,
-- which fit Redis's smallest string object (on Redis 7.0, MEMORY USAGE of
-- sluice:v1:api0:{41-cb007107} is 88 bytes with a value of at most 12
-- bytes, 104 with the text form's 18 to 25). The layout, mirrored by
-- algorithms/decode.go:
--
--   1 byte    128 + 32 x algorithm id (0..3) + 4 x n1 + unit (0..3)
--   1 byte    n2 (0..7), the second count's length: sliding window only
--   5 bytes   the state's instant in ms since EPOCH, big-endian
--   n1 bytes  the first count, big-endian without leading zeros (0: none)
--   n2 bytes  the second count, likewise (sliding window only)
--   1-7 bytes the last field (a window, a scale) divided by the unit,
--             big-endian: whatever bytes are left
--
-- Every field is below 2^53 (a value holding more is malformed, so both
-- twins read exactly the same numbers). A state whose instant lies outside
-- [EPOCH, EPOCH + 2^40), or every state when `compact` is false (see
-- algorithms/lua.go), is written in the text form of the Sluice versions
-- before this encoding; both forms are read, so a key written by an older
-- Sluice during a rolling upgrade keeps its state. A value in neither form
-- is no state (a full allowance), as before. The reverse does not hold: an
-- older Sluice reads a binary value as no state, so while instances of
-- both versions share keys, the new ones must write text (LuaScriptText)
-- until no old one remains.

-- The constants are written out below, not named: each local of this
-- chunk that a function uses costs every script call an upvalue.
--   EPOCH   1600000000000 (2020-09-13T12:26:40Z; EPOCH + 2^40 ms is in 2055)
--   2^40    1099511627776
--   2^53    9007199254740992
--   unit    0: 1 ms, 1: 1000 (a second), 2: 60000 (a minute), 3: 3600000 (an
--           hour), the largest that divides the last field

-- be returns bytes i..j of s as a big-endian unsigned integer (0 if j < i).
-- A value of 2^53 or more may be rounded, but never below 2^53.
local function be(s, i, j)
  local v = 0
  for k = i, j do
    v = v * 256 + string.byte(s, k)
  end
  return v
end

-- put appends the big-endian bytes of x >= 0 (none for 0) to the byte list
-- b, whose length is n; it returns the new length.
local function put(b, n, x)
  local first = n + 1
  while x > 0 do
    local d = x % 256
    n = n + 1
    b[n] = d
    x = (x - d) / 256
  end
  local i, j = first, n -- least significant first so far: reverse
  while i < j do
    b[i], b[j] = b[j], b[i]
    i, j = i + 1, j - 1
  end
  return n
end

-- pack returns the binary state of algorithm alg: its instant at, counts f1
-- and (sliding window only) f2, and last > 0; nil when the text form is to
-- be written instead.
local function pack(alg, at, f1, f2, last)
  local x = at - 1600000000000
  if not compact or x < 0 or x >= 1099511627776 then
    return nil
  end
  local b, n = {0}, 1
  if f2 then
    b[2], n = 0, 2
  end
  for i = n + 5, n + 1, -1 do
    local d = x % 256
    b[i] = d
    x = (x - d) / 256
  end
  n = n + 5
  local e1 = put(b, n, f1)
  local n1 = e1 - n
  n = e1
  if f2 then
    n = put(b, n, f2)
    b[2] = n - e1
  end
  local k, u = 0, 1
  if last % 3600000 == 0 then
    k, u = 3, 3600000
  elseif last % 60000 == 0 then
    k, u = 2, 60000
  elseif last % 1000 == 0 then
    k, u = 1, 1000
  end
  n = put(b, n, last / u)
  b[1] = 128 + 32 * alg + 4 * n1 + k
  return string.char(unpack(b, 1, n))
end

-- load_state reads a stored state of algorithm alg: the binary form, or
-- the text form matching pattern, whose capture number ati is the instant
-- and the others are, in order, the first count, the second (the sliding
-- window's) and the last field. It returns at, f1, f2 (0 without), last;
-- nil when raw is another algorithm's or malformed.
local function load_state(raw, alg, pattern, ati)
  local h = (string.byte(raw) or 0) - 128
  if h < 0 then
    local c1, c2, c3, c4 = string.match(raw, pattern)
    if not c1 then
      return nil
    end
    c1, c2, c3 = tonumber(c1), tonumber(c2), tonumber(c3)
    if ati == 1 then
      return c1, c2, 0, c3
    elseif ati == 2 then
      return c2, c1, 0, c3
    end
    return c3, c1, c2, tonumber(c4)
  end
  h = h - 32 * alg
  if h < 0 or h >= 32 then
    return nil
  end
  local k = h % 4
  local n1 = (h - k) / 4
  local p, n2 = 2, 0
  if alg == 2 then -- the sliding window: two counts
    n2 = string.byte(raw, 2)
    if not n2 or n2 > 7 then
      return nil
    end
    p = 3
  end
  local e1 = p + 4 + n1
  local e2 = e1 + n2
  local rest = #raw - e2
  if rest < 1 or rest > 7 then
    return nil
  end
  local f1, f2 = be(raw, p + 5, e1), be(raw, e1 + 1, e2)
  local last = be(raw, e2 + 1, #raw)
  if k == 1 then
    last = last * 1000
  elseif k == 2 then
    last = last * 60000
  elseif k == 3 then
    last = last * 3600000
  end
  if f1 >= 9007199254740992 or f2 >= 9007199254740992 or last >= 9007199254740992 then
    return nil
  end
  return 1600000000000 + be(raw, p, p + 4), f1, f2, last
end
