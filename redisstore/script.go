package redisstore

import (
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
	"strconv"
	"sync/atomic"

	"github.com/sluicehq/caddy-sluice/algorithms"
)

// The decision script: the Lua twins of the algorithms' step functions
// (lua/*.lua, one file per algorithm, each mirroring its Go twin in package
// algorithms), and lua/take.lua, which decides a whole request. The twin
// tests (twin*_test.go) run it against the vectors the Go twins run
// (algorithms/testdata).
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
	//go:embed lua/concurrency.lua
	luaConcurrency string
	//go:embed lua/take.lua
	luaTake string
)

// luaDefs are the helpers, every algorithm and take (lua/take.lua), which
// decides a request. They read the upvalue `now` (Unix milliseconds),
// which each entry point defines first.
var luaDefs = luaCommon + luaTokenBucket + luaGCRA + luaSlidingWindow + luaFixedWindow + luaSlidingLog + luaConcurrency + luaTake

// The entry points' pieces: the clock (from Redis's TIME, or from ARGV[1]
// in tests, which then pass the zones' arguments after it), and the call of
// take. TIME's fields are decimal strings, which Lua's arithmetic converts
// as tonumber does (each conversion is a strtod: us holds the
// microseconds' once); now is seconds x 1000 plus floor(microseconds /
// 1000).
const (
	luaTime     = "local t = redis.call('TIME')\nlocal us = t[2] + 0\n"
	luaNow      = "t[1] * 1000 + (us - us % 1000) / 1000"
	luaClock    = luaTime + "local now = " + luaNow + "\n"
	luaTestTime = "local now = tonumber(ARGV[1])\n"
	luaRun      = "\nreturn take(KEYS, ARGV, 0)\n"
	luaTestRun  = "\nreturn take(KEYS, ARGV, 1)\n"
)

// LuaScript is the decision as an EVAL script (the fallback of servers
// without Functions): the Lua twin of algorithms.Step for a whole request
// (see lua/take.lua for its KEYS/ARGV layout, written by argCache). It
// reads the time from redis.call('TIME') and accepts none from the caller.
// The tests' entry point (twin_test.go) is the same code with the time in
// ARGV[1].
var LuaScript = luaClock + luaDefs + luaRun

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
	defs := "local now\n" + luaDefs
	call := luaTime + "now = " + luaNow + "\nreturn take(keys, args, 0)\n"
	sum := sha1.Sum([]byte(defs + call))
	tag := hex.EncodeToString(sum[:6])
	name = "sluice_take_" + tag
	code = "#!lua name=sluice_" + tag + "\n" + defs +
		"\nredis.register_function('" + name + "', function(keys, args)\n" + call + "end)\n"
	return name, code
}

// The script's arguments per zone (ARGV, lua/take.lua) are the limit's four
// numbers (algorithm id, events, window in ms, capacity), the cost and the
// mode (take, refund, or take for a report-only zone). A zone's limit
// rarely changes, so its four arguments are formatted once and kept,
// already boxed, in a small direct-mapped cache: a request then formats
// nothing (its cost travels as an int64, which go-redis writes itself; the
// mode is a constant).

// argSlots is the size of the argument cache: more than the distinct limits
// of any sane configuration. Dynamic limits resolved per request that
// collide only cost a format on a miss.
const argSlots = 256

// limitArgs is one limit's formatted arguments.
type limitArgs struct {
	limit algorithms.Limit
	head  [4]any // algorithm id, events, window (ms), capacity
}

// argCache maps limits to their formatted arguments. Safe for concurrent
// use; a miss replaces the slot.
type argCache struct {
	slots [argSlots]atomic.Pointer[limitArgs]
}

// A concurrency zone (algorithms.Concurrency) sends its lease id in the
// cost's place (costSlot): its cost is always 1, and its lease is what the
// script records; its renewal is mode 3 (concurrency.go).

// modeArgs are the script's mode argument: take, refund, report-only.
var modeArgs = [3]any{"0", "1", "2"}

// appendArgs appends the script arguments of reqs, six per zone, in order.
func (a *argCache) appendArgs(args []any, reqs []algorithms.Request, refund bool) []any {
	for i := range reqs {
		r := &reqs[i]
		h := a.head(r.Limit)
		mode := modeArgs[0]
		switch {
		case refund:
			mode = modeArgs[1]
		case r.ReportOnly:
			mode = modeArgs[2]
		}
		args = append(args, h[0], h[1], h[2], h[3], costSlot(r), mode)
	}
	return args
}

// costSlot is the fifth argument of a zone: its cost, or a concurrency
// zone's lease id (lua/concurrency.lua). The one place the layout differs
// by kind.
func costSlot(r *algorithms.Request) any {
	if r.Limit.Algorithm == algorithms.Concurrency {
		return r.Lease
	}
	return r.Cost
}

// head returns l's formatted arguments, formatting them on a miss. The
// algorithms' numeric values travel here: they must not change.
func (a *argCache) head(l algorithms.Limit) *[4]any {
	x := uint64(l.Events)*0x9e3779b97f4a7c15 ^ uint64(l.Window)*0xbf58476d1ce4e5b9 ^ uint64(l.Burst)*0x94d049bb133111eb ^ uint64(l.Algorithm)
	slot := &a.slots[(x^x>>29)%argSlots]
	if e := slot.Load(); e != nil && e.limit == l {
		return &e.head
	}
	e := &limitArgs{limit: l, head: [4]any{strconv.Itoa(int(l.Algorithm)),
		strconv.FormatInt(l.Events, 10), strconv.FormatInt(l.Window, 10), strconv.FormatInt(l.Capacity(), 10)}}
	slot.Store(e)
	return &e.head
}
