package algorithms

import (
	_ "embed"
	"strconv"
)

//go:embed lua/take.lua
var luaTake string

// LuaScript is the production decision script: the Lua twin of Step for a
// whole request (see lua/take.lua for its KEYS/ARGV layout). It reads the
// time from redis.call('TIME') and accepts none from the caller.
var LuaScript = `local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local argbase = 0
` + luaTake

// LuaTestScript is the same script for tests: ARGV[1] is the current time
// in Unix milliseconds, so the Lua twin runs the same vectors as Step.
var LuaTestScript = `local now = tonumber(ARGV[1])
local argbase = 1
` + luaTake

// LuaArgsPerZone is the number of ARGV entries per zone.
const LuaArgsPerZone = 6

// AppendLuaArgs appends zone r's ARGV entries (refund selects refund mode).
func AppendLuaArgs(args []any, r *Request, refund bool) []any {
	mode := "0"
	if refund {
		mode = "1"
	}
	return append(args,
		strconv.Itoa(int(r.Limit.Algorithm)),
		strconv.FormatInt(r.Limit.Events, 10),
		strconv.FormatInt(r.Limit.Window, 10),
		strconv.FormatInt(r.Limit.Capacity(), 10),
		strconv.FormatInt(r.Cost, 10),
		mode,
	)
}
