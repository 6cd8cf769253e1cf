package algorithms

import (
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
	"strconv"
)

// The Lua twins, one file per algorithm, and the decision for a request.
var (
	//go:embed lua/common.lua
	luaCommon string
	//go:embed lua/token_bucket.lua
	luaTokenBucket string
	//go:embed lua/gcra.lua
	luaGCRA string
	//go:embed lua/sliding_window.lua
	luaSlidingWindow string
	//go:embed lua/fixed_window.lua
	luaFixedWindow string
	//go:embed lua/sliding_log.lua
	luaSlidingLog string
	//go:embed lua/take.lua
	luaTake string
)

// luaDefs are the helpers, every algorithm and take (lua/take.lua), which
// decides a request. They read the upvalues `now` (Unix milliseconds) and
// `compact` (whether states are written in the binary form of
// lua/common.lua, or in the text form of the Sluice versions before it;
// both forms are always read), which each entry point defines first.
var luaDefs = luaCommon + luaTokenBucket + luaGCRA + luaSlidingWindow + luaFixedWindow + luaSlidingLog + luaTake

// The entry points' pieces: the clock (from Redis's TIME, or from ARGV[1]
// in tests, which then pass the zones' arguments after it) and the form
// states are written in. TIME's fields are decimal strings, which Lua's
// arithmetic converts as tonumber does (each conversion is a strtod: us
// holds the microseconds' once); now is seconds x 1000 plus
// floor(microseconds / 1000).
const (
	luaTime     = "local t = redis.call('TIME')\nlocal us = t[2] + 0\n"
	luaNow      = "t[1] * 1000 + (us - us % 1000) / 1000"
	luaClock    = luaTime + "local now = " + luaNow + "\n"
	luaTestTime = "local now = tonumber(ARGV[1])\n"
	luaCompact  = "local compact = true\n"
	luaText     = "local compact = false\n"
	luaRun      = "\nreturn take(KEYS, ARGV, 0, true)\n"
	luaTestRun  = "\nreturn take(KEYS, ARGV, 1)\n"
)

// LuaScript is the production decision script: the Lua twin of Step for a
// whole request (see lua/take.lua for its KEYS/ARGV layout). It reads the
// time from redis.call('TIME') and accepts none from the caller. It stores
// states in the compact binary form (see EncodeLua) and reads that form and
// the text form older Sluice versions wrote.
var LuaScript = luaClock + luaCompact + luaDefs + luaRun

// LuaScriptText is LuaScript writing the text form of the Sluice versions
// before the binary one (see EncodeLuaText), which those versions can read:
// the first phase of a rolling upgrade from such a version, while instances
// running it may still read keys this one writes (an older version takes a
// binary value for no state: a full allowance). It reads both forms.
var LuaScriptText = luaClock + luaText + luaDefs + luaRun

// LuaTestScript is LuaScript for tests: ARGV[1] is the current time in Unix
// milliseconds, so the Lua twin runs the same vectors as Step.
var LuaTestScript = luaTestTime + luaCompact + luaDefs + luaTestRun

// LuaTestScriptText is LuaScriptText for tests, with the time in ARGV[1].
var LuaTestScriptText = luaTestTime + luaText + luaDefs + luaTestRun

// LuaTestScriptStates is LuaTestScript with the whole reply of LuaScript:
// LuaTestScript and LuaTestScriptText answer a refusal with the four
// integers per zone only, without what LuaScript adds to a refusal for the
// deny cache (see lua/take.lua).
var LuaTestScriptStates = luaTestTime + luaCompact + luaDefs + "\nreturn take(KEYS, ARGV, 1, true)\n"

// LuaFunction names the function of LuaLibrary: FCALL LuaFunction runs
// exactly what LuaScript runs (same KEYS, ARGV and reply). The name carries
// a digest of the library's code, so instances running different Sluice
// versions against one Redis each call their own.
var LuaFunction, LuaLibrary = luaLibrary()

// luaLibrary builds LuaScript as a Redis Function library (Redis 7): the
// helpers, the algorithms and take are defined once, when the library
// loads, not on every call as an EVAL script's body must (about 2 µs of
// Redis's CPU per call); the function sets the clock they share as an
// upvalue and calls take.
func luaLibrary() (name, code string) {
	defs := "local now\n" + luaCompact + luaDefs
	call := luaTime + "now = " + luaNow + "\nreturn take(keys, args, 0, true)\n"
	sum := sha1.Sum([]byte(defs + call))
	tag := hex.EncodeToString(sum[:6])
	name = "sluice_take_" + tag
	code = "#!lua name=sluice_" + tag + "\n" + defs +
		"\nredis.register_function('" + name + "', function(keys, args)\n" + call + "end)\n"
	return name, code
}

// LuaArgsPerZone is the number of ARGV entries per zone.
const LuaArgsPerZone = 6

// AppendLuaArgs appends zone r's ARGV entries: mode 0 takes, 1 refunds
// (refund), 2 takes for a report-only zone (never vetoes).
func AppendLuaArgs(args []any, r *Request, refund bool) []any {
	mode := "0"
	switch {
	case refund:
		mode = "1"
	case r.ReportOnly:
		mode = "2"
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
