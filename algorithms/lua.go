package algorithms

import (
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
	"strconv"
)

// The Lua twins, one file per algorithm, and the script's main body.
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

// luaDefs are the helpers and every algorithm; luaBody is the script after
// its entry point: luaDefs, then the main body that dispatches on each
// zone's algorithm.
var (
	luaDefs = luaCommon + luaTokenBucket + luaGCRA + luaSlidingWindow + luaFixedWindow + luaSlidingLog
	luaBody = luaDefs + luaTake
)

// The script's entry points define `now` (Unix milliseconds), `argbase`
// (how many ARGV entries precede the zones') and `compact` (whether states
// are written in the binary form of lua/common.lua, or in the text form of
// the Sluice versions before it; both forms are always read).
const (
	luaClock    = "local t = redis.call('TIME')\nlocal now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\nlocal argbase = 0\n"
	luaTestTime = "local now = tonumber(ARGV[1])\nlocal argbase = 1\n"
	luaCompact  = "local compact = true\n"
	luaText     = "local compact = false\n"
)

// LuaScript is the production decision script: the Lua twin of Step for a
// whole request (see lua/take.lua for its KEYS/ARGV layout). It reads the
// time from redis.call('TIME') and accepts none from the caller. It stores
// states in the compact binary form (see EncodeLua) and reads that form and
// the text form older Sluice versions wrote.
var LuaScript = luaClock + luaCompact + luaBody

// LuaScriptText is LuaScript writing the text form of the Sluice versions
// before the binary one (see EncodeLuaText), which those versions can read:
// the first phase of a rolling upgrade from such a version, while instances
// running it may still read keys this one writes (an older version takes a
// binary value for no state: a full allowance). It reads both forms.
var LuaScriptText = luaClock + luaText + luaBody

// LuaTestScript is LuaScript for tests: ARGV[1] is the current time in Unix
// milliseconds, so the Lua twin runs the same vectors as Step.
var LuaTestScript = luaTestTime + luaCompact + luaBody

// LuaTestScriptText is LuaScriptText for tests, with the time in ARGV[1].
var LuaTestScriptText = luaTestTime + luaText + luaBody

// LuaFunction names the function of LuaLibrary: FCALL LuaFunction runs
// exactly what LuaScript runs (same KEYS, ARGV and reply). The name carries
// a digest of the library's code, so instances running different Sluice
// versions against one Redis each call their own.
var LuaFunction, LuaLibrary = luaLibrary()

// luaLibrary builds LuaScript as a Redis Function library (Redis 7): the
// helpers and the algorithms are defined once, when the library loads, not
// on every call as an EVAL script's body must (about 2 µs of Redis's CPU
// per call); the function sets the clock the helpers share as upvalues and
// runs the main body.
func luaLibrary() (name, code string) {
	sum := sha1.Sum([]byte(luaCompact + luaBody))
	tag := hex.EncodeToString(sum[:6])
	name = "sluice_take_" + tag
	code = "#!lua name=sluice_" + tag + "\n" +
		"local now, argbase\n" + luaCompact + luaDefs +
		"\nredis.register_function('" + name + "', function(KEYS, ARGV)\n" +
		"local t = redis.call('TIME')\nnow = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\nargbase = 0\n" +
		luaTake + "\nend)\n"
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
