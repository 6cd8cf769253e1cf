package main

import (
	"io"
	"os"
	"strings"

	"github.com/sluicehq/caddy-sluice/redisstore"
)

// The probe library (benchtool probelib, bench/redis-probe.sh): the
// production library's code with functions added that each do a prefix of
// what the decision does, for the table of where its time goes inside Redis
// (docs/performance.md). They sit in the same chunk, so they call the
// library's own helpers; their arguments are the production layout's.
//
//	p_empty   nothing (Redis's cost of an FCALL with these arguments)
//	p_time    + TIME
//	p_args    + every zone's arguments read as take reads them
//	p_floor   TIME, GET and SET PX of a constant per key (no Lua work:
//	          floorFn, the floor bench/run.sh measures beside the decision)
//	p_decode  p_args + GET and the stored state decoded
//	p_codec   p_decode + the state encoded again and SET PX
//	p_step    p_decode + the algorithm (which encodes) and SET PX
//	take      the production function (p_step + take's bookkeeping and reply)
const probeLua = `
local function probe_now()
  if not byte then bind() end
  local t = redis.call('TIME')
  local us = t[2] + 0
  now = t[1] * 1000 + (us - us % 1000) / 1000
end
local patterns = {[0] = '^(%-?%d+):(%-?%d+):(%d+)$', [1] = '^g(%-?%d+):(%d+):(%d+)$',
  [2] = '^s(%d+):(%d+):(%-?%d+):(%d+)$', [3] = '^f(%d+):(%-?%d+):(%d+)$'}
local atis = {[0] = 2, [1] = 1, [2] = 3, [3] = 2}
local function probe_args(argv, i)
  local s = argv[i]
  local z = zargs[s]
  local cost
  if z then
    cost = z[6]
  else
    z, cost = zone(s)
  end
  return z[1], z[2], z[3], z[4], cost, z[5]
end
redis.register_function('p_empty', function(keys, args) return 1 end)
redis.register_function('p_time', function(keys, args) probe_now() return 1 end)
redis.register_function('p_args', function(keys, args)
  probe_now()
  for i = 1, #keys do probe_args(args, i) end
  return 1
end)
redis.register_function('p_floor', ` + floorFn + `)
local function probe_decode(key, alg)
  local full = call('GET', key)
  local raw
  if full then raw = unpen(full) end
  if raw then return load_state(raw, alg, patterns[alg], atis[alg]) end
end
redis.register_function('p_decode', function(keys, args)
  probe_now()
  for i = 1, #keys do
    local alg = probe_args(args, i)
    probe_decode(keys[i], alg)
  end
  return 1
end)
redis.register_function('p_codec', function(keys, args)
  probe_now()
  for i = 1, #keys do
    local alg, events, w = probe_args(args, i)
    local at, f1, f2, last = probe_decode(keys[i], alg)
    if not at then at, f1, f2, last = now, 1, nil, w end
    if alg ~= 2 then f2 = nil end
    call('SET', keys[i], pack(alg, at, f1, f2, last), 'PX', 61000)
  end
  return 1
end)
redis.register_function('p_step', function(keys, args)
  probe_now()
  for i = 1, #keys do
    local alg, events, w, capacity, cost, ot = probe_args(args, i)
    local full = call('GET', keys[i])
    local raw
    if full then raw = unpen(full) end
    local _, _, _, reset, val = steps[alg](raw, events, w, capacity, cost, ot)
    store(keys[i], val, reset)
  end
  return 1
end)
`

// floorFn is the floor of a decision: the commands it cannot do without
// (TIME, and per zone GET and SET PX, the TTL as digits as take sends it),
// on a constant of a state's size, and no Lua work. Its keys should be its
// own: it overwrites what it finds.
const floorFn = `function(keys, args)
  local t = redis.call('TIME')
  for i = 1, #keys do
    redis.call('GET', keys[i])
    redis.call('SET', keys[i], 'abcdefghij', 'PX', '61000')
  end
  return 1
end`

// floorFunction names the function of floorLib.
const floorFunction = "sluice_floor"

// floorLib prints a library of the floor alone (bench/run.sh loads it
// beside the production library, whose function names it must not reuse).
func floorLib() error {
	_, err := io.WriteString(os.Stdout, "#!lua name=sluice_bench_floor\nredis.register_function('"+floorFunction+"', "+floorFn+")\n")
	return err
}

// probeLib prints the probe library.
func probeLib() error {
	lib := redisstore.LuaLibrary
	lib = strings.Replace(lib, "#!lua name=", "#!lua name=probe_", 1)
	_, err := io.WriteString(os.Stdout, lib+probeLua)
	return err
}
