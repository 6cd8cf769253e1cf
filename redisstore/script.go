package redisstore

import (
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

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
	//go:embed lua/settle.lua
	luaSettle string
	//go:embed lua/take.lua
	luaTake string
)

// luaDefs are the helpers, every algorithm and take (lua/take.lua), which
// decides a request. They read the upvalue `now` (Unix milliseconds),
// which each entry point defines first.
var luaDefs = luaCommon + luaTokenBucket + luaGCRA + luaSlidingWindow + luaFixedWindow + luaSlidingLog + luaConcurrency + luaSettle + luaTake

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

// LuaFunctionRO is LuaFunction registered with the no-writes flag: Redis
// runs it (FCALL_RO) while it refuses writes for memory (OOM), where it
// refuses LuaFunction outright. A decision that writes nothing (a refusal
// that starts no penalty) is decided by it; one that would write fails
// (function.go, readOnly).
var LuaFunctionRO = LuaFunction + "_ro"

// luaLibrary builds LuaScript as a Redis Function library (Redis 7): the
// helpers, the algorithms and take are defined once, when the library
// loads, not on every call as an EVAL script's body must; the function
// sets the clock they share as an upvalue and calls take.
func luaLibrary() (name, code string) {
	defs := "local now\n" + luaDefs
	call := luaTime + "now = " + luaNow + "\nreturn take(keys, args, 0)\n"
	sum := sha1.Sum([]byte(defs + call))
	tag := hex.EncodeToString(sum[:6])
	name = "sluice_take_" + tag
	code = "#!lua name=sluice_" + tag + "\n" + defs +
		"\nlocal function run(keys, args)\n" + call + "end\n" +
		"redis.register_function('" + name + "', run)\n" +
		"redis.register_function{function_name='" + name + "_ro', callback=run, flags={'no-writes'}}\n"
	return name, code
}

// The script's argument per zone (ARGV, lua/take.lua): one string, its
// fields joined by argSep (a byte none of them holds):
//
//	spec     "<algorithm id>:<events>:<window ms>:<capacity>:<options>",
//	         the options "0" or letter-and-digits fields (zoneOptions)
//	cost     for a concurrency zone, its holder id (a uint64's digits,
//	         kept a string in Lua: ids exceed 2^53)
//	mode     the mode values below
//	instant  a refund's charge instant (Unix ms; "0": unknown), a settle's
//	         "<instant>:<amount>", "0" for a take or a renewal
//
// The script keeps the parse of a take's argument, which repeats call after
// call, and parses the others on every call. lua/take.lua names argSep and
// the modes (TestLuaLayoutMatchesGo); appendTake, appendRefund and
// appendRenewal are the one place that writes the argument.
const argSep = ','

// replyPerZone is the count of numbers per zone that open the script's
// reply: allowed, remaining, retry-after and reset-after (zoneDecision).
const replyPerZone = 4

// argEntries is the size of the argument cache: more than the distinct limits
// of any sane configuration. Dynamic limits resolved per request that
// collide only cost a format on a miss.
const argEntries = 256

// limitArgs is one limit's formatted spec.
type limitArgs struct {
	limit algorithms.Limit
	// the spec, and the spec of a request that may not wait
	head [2]string
}

// argCache maps limits to their formatted specs. Safe for concurrent use;
// a miss replaces the entry.
type argCache struct {
	entries [argEntries]atomic.Pointer[limitArgs]
}

// The script's modes, and the instant of a take. A concurrency zone's take
// (modeTake or modeReportOnly; it is never refundable: its slot goes back
// by a release, not a refund) records its lease; modeRefund releases it (a
// Cluster veto in another slot); modeRenew extends it (concurrency.go's
// lease worker). The modes are one numbering for every kind of zone:
// take.lua reads no mode two ways.
const (
	// 0 take, 1 refund (a concurrency zone: release its slot), 2 take for
	// a report-only zone
	modeTake, modeRefund, modeReportOnly = "0", "1", "2"
	// a take whose charge may be refunded (Request.Refundable: the reply
	// carries the time of the decision); the same for a report-only zone
	modeRefundable, modeReportOnlyRefundable = "3", "4"
	// renew a concurrency zone's slot (nothing for a rate zone)
	modeRenew = "5"
	// a take whose charge stays in flight until settled (Request.InFlight;
	// refundable too); the same for a report-only zone
	modeInFlight, modeReportOnlyInFlight = "6", "7"
	// refund a charge taken in flight; settle one and keep it (Refund.Keep)
	modeRefundInFlight, modeSettleInFlight = "8", "9"
	// settle one to the amount its response reported (Refund.Settle:
	// lua/settle.lua)
	modeSettle     = "10"
	unknownInstant = "0"
)

// appendTake appends the script argument of r to b: a take, or (refund)
// the refund of a cross-slot veto, whose instant is unknown.
func (a *argCache) appendTake(b []byte, r *algorithms.Request, refund bool) []byte {
	h := a.head(r.Limit)
	mode, spec := modeTake, h[0]
	if r.NoDelay {
		spec = h[1]
	}
	switch {
	case refund && r.InFlight:
		mode = modeRefundInFlight
	case refund:
		mode = modeRefund
	case r.ReportOnly && r.InFlight:
		mode = modeReportOnlyInFlight
	case r.InFlight:
		mode = modeInFlight
	case r.ReportOnly && r.Refundable:
		mode = modeReportOnlyRefundable
	case r.ReportOnly:
		mode = modeReportOnly
	case r.Refundable:
		mode = modeRefundable
	}
	b = append(append(b, spec...), argSep)
	if r.Limit.Algorithm == algorithms.Concurrency {
		// the one place the layout differs by kind (lua/concurrency.lua)
		b = strconv.AppendUint(b, r.Holder, 10)
	} else {
		b = strconv.AppendInt(b, r.Cost, 10)
	}
	return appendTail(b, mode, unknownInstant)
}

// appendRefund appends the script argument of r to b. A concurrency zone
// has no charge to refund (its slot is released: Store.Release);
// Store.Refund leaves such refunds out.
func (a *argCache) appendRefund(b []byte, r *algorithms.Refund) []byte {
	mode := modeRefund
	switch {
	case r.Settle:
		mode = modeSettle
	case r.Keep:
		mode = modeSettleInFlight
	case r.InFlight:
		mode = modeRefundInFlight
	}
	b = append(append(b, a.head(r.Limit)[0]...), argSep)
	b = append(append(append(strconv.AppendInt(b, r.Cost, 10), argSep), mode...), argSep)
	b = strconv.AppendInt(b, r.At, 10)
	if r.Settle {
		// The instant and the amount in one field: settles are rare beside
		// takes, and the layout stays one for all.
		b = strconv.AppendInt(append(b, ':'), max(r.Settled, 0), 10)
	}
	return b
}

// appendRenewal appends the script argument of the renewal of r's lease (a
// concurrency zone's request still running) to b.
func (a *argCache) appendRenewal(b []byte, r *algorithms.Request) []byte {
	b = append(append(b, a.head(r.Limit)[0]...), argSep)
	return appendTail(strconv.AppendUint(b, r.Holder, 10), modeRenew, unknownInstant)
}

// appendTail appends the last two fields of an argument, mode and instant.
func appendTail(b []byte, mode, instant string) []byte {
	return append(append(append(append(b, argSep), mode...), argSep), instant...)
}

// head returns l's formatted specs, formatting them on a miss. The
// algorithms' numeric values travel here: they must not change.
func (a *argCache) head(l algorithms.Limit) *[2]string {
	x := uint64(l.Events)*0x9e3779b97f4a7c15 ^ uint64(l.Window)*0xbf58476d1ce4e5b9 ^ uint64(l.Burst)*0x94d049bb133111eb ^ uint64(l.Algorithm)
	entry := &a.entries[(x^x>>29)%argEntries]
	if e := entry.Load(); e != nil && e.limit == l {
		return &e.head
	}
	b := strconv.AppendInt(nil, int64(l.Algorithm), 10)
	b = strconv.AppendInt(append(b, ':'), l.Events, 10)
	b = strconv.AppendInt(append(b, ':'), l.Window, 10)
	b = strconv.AppendInt(append(b, ':'), l.Capacity(), 10)
	b = append(append(b, ':'), zoneOptions(l)...)
	noWait := string(b)
	if l.Delay > 0 {
		noWait += "n1"
	}
	e := &limitArgs{limit: l, head: [2]string{string(b), noWait}}
	entry.Store(e)
	return &e.head
}

// zoneOptions formats a limit's options (the last field of its spec).
func zoneOptions(l algorithms.Limit) string {
	var b []byte
	if l.Penalty > 0 {
		b = strconv.AppendInt(append(b, 'p'), l.Penalty, 10)
	}
	if l.Delay > 0 {
		b = strconv.AppendInt(append(b, 'd'), l.Delay, 10)
		if l.DelayAfter > 0 {
			b = strconv.AppendInt(append(b, 'a'), l.DelayAfter, 10)
		}
	}
	if len(b) == 0 {
		return "0"
	}
	return string(b)
}

// packedAdmission returns the four numbers of a one-zone admission that
// lua/take.lua packed into one integer (a zone allowed with no wait whose
// remaining and reset-after fit): (remaining x 2^k + reset-after) x 4 +
// s, where k is 16, 24 or 32 for s 0, 1 or 2.
//
// One zone allowed under an override (lua/take.lua) comes negative:
// -((capacity × 2^16 + remaining) × 2^20 + reset-after) - 1, the allowed
// number then carrying the capacity as zoneDecision reads it.
func packedAdmission(v int64) ([replyPerZone]int64, bool) {
	if v < 0 {
		w := -(v + 1)
		capacity, rem, reset := w>>36, w>>20&(1<<16-1), w&(1<<20-1)
		if capacity < 1 || capacity >= 1<<16 || rem > capacity {
			return [replyPerZone]int64{}, false
		}
		return [replyPerZone]int64{1 + 4*(capacity+1), rem, 0, reset}, true
	}
	s := v & 3
	if s == 3 {
		return [replyPerZone]int64{}, false
	}
	k := 16 + 8*s
	v >>= 2
	return [replyPerZone]int64{1, v >> k, 0, v & (1<<k - 1)}, true
}

// decodePacked reads a one-zone admission packed into an integer reply
// (packedAdmission).
func decodePacked(b []byte, reqs []algorithms.Request, out []algorithms.Decision) error {
	r := respReader{b: b}
	v, err := r.integer()
	if err != nil {
		return err
	}
	n, ok := packedAdmission(v)
	if !ok || len(reqs) != 1 {
		return fmt.Errorf("redis: the script's admission %d is not one zone's", v)
	}
	out[0] = zoneDecision(&reqs[0], n)
	return nil
}

// KeyTTL is the TTL that a decision's write gives a key whose time back to
// full is resetAfter (lua/take.lua's store, which it mirrors): resetAfter
// plus a second, so that an expired key and a full one mean the same,
// rounded up to a multiple of the power of 16 that is at most a sixteenth
// of it, so that the TTLs of many keys repeat (the script keeps their
// digits). It is less than 17/16 of resetAfter plus a second.
func KeyTTL(resetAfter time.Duration) time.Duration {
	px := max(resetAfter.Milliseconds(), 0) + 1000
	q := int64(16)
	for px >= q*256 {
		q *= 16
	}
	return time.Duration((px+q-1)/q*q) * time.Millisecond
}
