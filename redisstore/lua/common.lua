-- Sluice: helpers shared by the algorithms' Lua twins. Every number here is
-- an integer below 2^53 (Validate sees to it), so Lua's doubles compute
-- exactly what the Go twins compute.

local margin = 1000 -- ms a key outlives its return to full, so expired == full

-- Cost. Redis runs this on every request, so the code avoids what costs
-- its CPU most: a table per call, calls through globals (string.byte looks
-- up two tables first), converting a decimal string (strtod), math.floor
-- (x - x % 1 floors without a call). The library functions used on every
-- call are upvalues, set by bind() on the first call: a Redis Function
-- library sees no standard library while it loads.
local byte, char, tonum, call, min, max, fmt, spk, sunpk
local function bind()
  byte, char, tonum, call = string.byte, string.char, tonumber, redis.call
  min, max, fmt, spk, sunpk = math.min, math.max, string.format, struct.pack, struct.unpack
end

-- memo returns a cache of f's results, read on the hot path as
-- `c[k] or miss(k)`: miss(k, ...) computes f(k, ...) and keeps it (unless
-- nil). The cache is emptied when it reaches 1000 entries, so keys that
-- vary cannot grow it without bound.
local function memo(f)
  local c, n = {}, 0
  local function miss(k, ...)
    local v = f(k, ...)
    if v ~= nil then
      if n >= 1000 then
        for key in pairs(c) do c[key] = nil end
        n = 0
      end
      c[k], n = v, n + 1
    end
    return v
  end
  return c, miss
end

-- nums memoizes tonumber for ARGV: a zone's cost arrives as the same few
-- strings on every call, and a lookup costs far less than strtod.
local nums, num = memo(function(s) return tonum(s) end)

-- idiv is floor(a/b) for |a| < 2^53, 0 < b, corrected for the rounding of
-- the double division.
local function idiv(a, b)
  local q = a / b
  q = q - q % 1
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

-- ceildiv is ceil(a/b) for a >= 0: idiv(a + b - 1, b), inlined (a call
-- costs more than the division).
local function ceildiv(a, b)
  if a <= 0 then
    return 0
  end
  a = a + b - 1
  local q = a / b
  q = q - q % 1
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

local function gcd(a, b)
  while b ~= 0 do
    a, b = b, a - idiv(a, b) * b
  end
  return a
end

-- The stored state. The constant-size states (token bucket, gcra, sliding
-- and fixed window) are stored in binary: 7 to 12 bytes for common limits,
-- which fit Redis's smallest string object (docs/performance.md gives the
-- memory per key). The layout, mirrored by codec.go:
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
-- [EPOCH, EPOCH + 2^40) is written in a text form (each algorithm's file
-- gives it): a window of years whose aligned start precedes EPOCH, a gcra
-- arrival time past 2055. Both forms are read; a value in neither is no
-- state (a full allowance).

-- The constants are written out below, not named: each local of this
-- chunk that a function uses costs every EVAL call an upvalue (an EVAL
-- script creates its functions on every call; the library, once).
--   EPOCH   1600000000000 (2020-09-13T12:26:40Z; EPOCH + 2^40 ms is in 2055)
--   2^40    1099511627776
--   2^53    9007199254740992
--   unit    0: 1 ms, 1: 1000 (a second), 2: 60000 (a minute), 3: 3600000 (an
--           hour), the largest that divides the last field

-- nbytes returns the count of bytes of v >= 0, big-endian without leading
-- zeros (0 for 0).
local function nbytes(v)
  if v < 1 then
    return 0
  elseif v < 256 then
    return 1
  elseif v < 65536 then
    return 2
  elseif v < 16777216 then
    return 3
  elseif v < 4294967296 then
    return 4
  elseif v < 1099511627776 then
    return 5
  elseif v < 281474976710656 then
    return 6
  end
  return 7
end

-- packfmt memoizes struct.pack's formats of the binary states, by their
-- fields' lengths (in a Redis Function library it outlives the call).
local packfmt = {}

-- lasts memoizes, by the last field (a zone's window or scale: the same on
-- every call), {its unit's id k, the field in that unit, its length}.
local lasts, lastUnit = memo(function(last)
  local k, u = 0, 1
  if last % 3600000 == 0 then
    k, u = 3, 3600000
  elseif last % 60000 == 0 then
    k, u = 2, 60000
  elseif last % 1000 == 0 then
    k, u = 1, 1000
  end
  return {k, last / u, nbytes(last / u)}
end)

-- pack returns the binary state of algorithm alg: its instant at, counts f1
-- and (sliding window only) f2, and last > 0; nil when the text form is to
-- be written instead. One struct.pack writes it ('I0' writes nothing).
local function pack(alg, at, f1, f2, last)
  local x = at - 1600000000000
  if x < 0 or x >= 1099511627776 then
    return nil
  end
  local l = lasts[last] or lastUnit(last)
  local n1, nl = nbytes(f1), l[3]
  local h = 128 + 32 * alg + 4 * n1 + l[1]
  if f2 then
    local n2 = nbytes(f2)
    local key = 512 + 64 * n1 + 8 * n2 + nl
    local f = packfmt[key]
    if not f then
      f = '>BBI5I' .. n1 .. 'I' .. n2 .. 'I' .. nl
      packfmt[key] = f
    end
    return spk(f, h, n2, x, f1, f2, l[2])
  end
  local key = 8 * n1 + nl
  local f = packfmt[key]
  if not f then
    f = '>BI5I' .. n1 .. 'I' .. nl
    packfmt[key] = f
  end
  return spk(f, h, x, f1, l[2])
end

-- unpackfmt memoizes struct.unpack's formats of the binary states past
-- their header, by the fields' lengths: key 8 x n1 + nl (nl: the last
-- field's), or for the sliding window 512 + 64 x n1 + 8 x n2 + nl.
local unpackfmt, unpackFormat = memo(function(key)
  local nl = key % 8
  if key < 512 then
    return '>I5I' .. (key - nl) / 8 .. 'I' .. nl
  end
  local n2 = (key - nl) / 8 % 8
  local n1 = (key - 512 - 8 * n2 - nl) / 64
  return '>I5I' .. n1 .. 'I' .. n2 .. 'I' .. nl
end)

-- load_state reads a stored state of algorithm alg: the binary form, or
-- the text form matching pattern, whose capture number ati is the instant
-- and the others are, in order, the first count, the second (the sliding
-- window's) and the last field. It returns at, f1, f2 (0 without), last;
-- nil when raw is another algorithm's or malformed.
local function load_state(raw, alg, pattern, ati)
  local h, n2 = byte(raw, 1, 2)
  h = (h or 0) - 128
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
  -- one struct.unpack reads every field (a value of 2^53 or more may be
  -- rounded, but never below 2^53)
  local x, f1, f2, last
  if alg == 2 then -- the sliding window: two counts, n2 the second's length
    if not n2 or n2 > 7 then
      return nil
    end
    local nl = #raw - 7 - n1 - n2
    if nl < 1 or nl > 7 then
      return nil
    end
    local key = 512 + 64 * n1 + 8 * n2 + nl
    x, f1, f2, last = sunpk(unpackfmt[key] or unpackFormat(key), raw, 3)
  else
    local nl = #raw - 6 - n1
    if nl < 1 or nl > 7 then
      return nil
    end
    local key = 8 * n1 + nl
    x, f1, last = sunpk(unpackfmt[key] or unpackFormat(key), raw, 2)
    f2 = 0
  end
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
  return 1600000000000 + x, f1, f2, last
end

-- The penalty (algorithms/penalty.go) prefixes a state: 'p', then the
-- instant the penalty started (Unix ms) in 6 bytes, big-endian, then the
-- algorithm's value as above (empty: none), so a key in its penalty keeps
-- its bucket. Every stored value is read through unpen (take.lua): a value
-- without the prefix is returned as it is.

-- unpen returns the algorithm's value of a stored value (nil: none) and
-- the instant its penalty started (0: none).
local function unpen(full)
  if byte(full) ~= 112 then
    return full, 0
  end
  if #full < 7 then
    return nil, 0
  end
  local rest = string.sub(full, 8)
  if rest == '' then
    rest = nil
  end
  return rest, (sunpk('>I6', full, 2))
end

-- penalized returns the value storing val (nil: none) with a penalty that
-- started at at.
local function penalized(at, val)
  local b6 = at % 256
  at = (at - b6) / 256
  local b5 = at % 256
  at = (at - b5) / 256
  local b4 = at % 256
  at = (at - b4) / 256
  local b3 = at % 256
  at = (at - b3) / 256
  local b2 = at % 256
  local b1 = (at - b2) / 256
  return char(112, b1, b2, b3, b4, b5, b6) .. (val or '')
end

-- A zone's options (the last field of its spec, see take.lua): '0' for
-- none, else fields of a letter and digits: 'p<ms>' the penalty, 'd<ms>'
-- the longest wait (delay), 'a<n>' delay_after (tokens), 'n1' this request
-- may not wait. opts returns them as a table, nil for none; take keeps it
-- with the spec it parsed.
local function opts(o)
  if o == '0' then
    return nil
  end
  local t = {p = 0, d = 0, a = 0, n = 0}
  for k, v in string.gmatch(o, '(%a)(%d+)') do
    t[k] = tonum(v)
  end
  return t
end

-- threshold mirrors algorithms/delay.go: how much of a bucket of full
-- units (a token: tok units) may be spent at once (o: the zone's options,
-- nil for none).
local function threshold(o, full, tok)
  if o and o.d > 0 and o.a > 0 then
    return min(o.a * tok, full)
  end
  return full
end

-- admit mirrors algorithms/delay.go: a request needing need units against
-- a debt of x units, for a bucket of full units (a token: tok units)
-- refilled rate units a ms, lag ms ahead of now. It returns the wait (ms)
-- and the retry-after (ms), and whether it is admitted.
local function admit(o, x, need, full, tok, rate, lag)
  local a = threshold(o, full, tok)
  if need > a then a = need end
  if x + need <= a or need == 0 then
    return 0, 0, true
  end
  local after = lag + ceildiv(x + need - a, rate)
  if o and o.d > 0 and o.n == 0 then
    if after <= o.d then
      return after, 0, true
    end
    return 0, after - o.d, false
  end
  return 0, after, false
end
