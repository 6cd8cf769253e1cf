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
