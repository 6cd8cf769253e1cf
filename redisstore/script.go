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
		"\nredis.register_function('" + name + "', function(keys, args)\n" + call + "end)\n"
	return name, code
}

// The script's arguments per zone (ARGV, lua/take.lua), argsPerZone of
// them, in this order:
//
//	1  the zone's spec, the static part of its limit:
//	   "<algorithm id>:<events>:<window ms>:<capacity>:<options>" (for a
//	   concurrency zone, algorithm id 5, its slots, its lease, its slots,
//	   and "0"). The options are "0" for none, else fields of a letter and
//	   digits (zoneOptions: "p900000" a penalty of 900000 ms, "d3000" a
//	   delay of 3000 ms, "a2" delay_after 2, "n1" this request may not
//	   wait). The script parses a spec once and keeps its parse.
//	2  cost; for a concurrency zone, its request's holder id instead (the
//	   decimal digits of a uint64, kept a string in Lua: ids exceed 2^53;
//	   costArg)
//	3  mode (the mode values below)
//	4  for a refund, the instant of the charge (Unix ms; "0": unknown);
//	   for a settle (mode 10), "<instant>:<amount>"; "0" for a take or a
//	   renewal
//
// lua/take.lua names each number (TestLuaLayoutMatchesGo); appendArgs,
// appendRefunds and appendRenewal are the one place that writes them.

// The positions of a zone's arguments past its base (1-based, as Lua
// indexes ARGV), and argsPerZone, their number.
const (
	argSpec = iota + 1
	argCost
	argMode
	argInstant
	argsPerZone = iota
)

// replyPerZone is the count of numbers per zone that open the script's
// reply: allowed, remaining, retry-after and reset-after (zoneDecision).
const replyPerZone = 4

// argEntries is the size of the argument cache: more than the distinct limits
// of any sane configuration. Dynamic limits resolved per request that
// collide only cost a format on a miss.
const argEntries = 256

// limitArgs is one limit's formatted arguments.
type limitArgs struct {
	limit algorithms.Limit
	// the spec, and the spec of a request that may not wait
	head [2]any
}

// argCache maps limits to their formatted arguments. Safe for concurrent
// use; a miss replaces the entry.
type argCache struct {
	entries [argEntries]atomic.Pointer[limitArgs]
}

// The script's modes (argMode), and argInstant of a take. A
// concurrency zone's take (modeTake or modeReportOnly; it is never
// refundable: its slot goes back by a release, not a refund) records its
// lease; modeRefund releases it (a Cluster veto in another slot); modeRenew
// extends it (concurrency.go's lease worker). The modes are one numbering
// for every kind of zone: take.lua reads no mode two ways.
var (
	// 0 take, 1 refund (a concurrency zone: release its slot), 2 take for
	// a report-only zone
	modeTake, modeRefund, modeReportOnly any = "0", "1", "2"
	// a take whose charge may be refunded (Request.Refundable: the reply
	// carries the time of the decision); the same for a report-only zone
	modeRefundable, modeReportOnlyRefundable any = "3", "4"
	// renew a concurrency zone's slot (nothing for a rate zone)
	modeRenew any = "5"
	// a take whose charge stays in flight until settled (Request.InFlight;
	// refundable too); the same for a report-only zone
	modeInFlight, modeReportOnlyInFlight any = "6", "7"
	// refund a charge taken in flight; settle one and keep it (Refund.Keep)
	modeRefundInFlight, modeSettleInFlight any = "8", "9"
	// settle one to the amount its response reported (Refund.Settle:
	// lua/settle.lua)
	modeSettle     any = "10"
	unknownInstant any = "0"
)

// appendArgs appends the script arguments of reqs, argsPerZone per zone, in
// order: takes, or (refund) the refunds of a cross-slot veto, whose
// instants are unknown.
func (a *argCache) appendArgs(args []any, reqs []algorithms.Request, refund bool) []any {
	for i := range reqs {
		r := &reqs[i]
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
		args = append(args, spec, costArg(r), mode, unknownInstant)
	}
	return args
}

// appendRefunds appends the script arguments of refunds, argsPerZone per
// zone, in order. A concurrency zone has no charge to refund (its slot is
// released: Store.Release); Store.Refund leaves such refunds out.
func (a *argCache) appendRefunds(args []any, refunds []algorithms.Refund) []any {
	for i := range refunds {
		r := &refunds[i]
		h := a.head(r.Limit)
		mode, at := modeRefund, any(r.At)
		switch {
		case r.Settle:
			// The instant and the amount in one argument: settles are
			// rare beside takes, and the layout stays one for all.
			mode, at = modeSettle, strconv.FormatInt(r.At, 10)+":"+strconv.FormatInt(max(r.Settled, 0), 10)
		case r.Keep:
			mode = modeSettleInFlight
		case r.InFlight:
			mode = modeRefundInFlight
		}
		args = append(args, h[0], r.Cost, mode, at)
	}
	return args
}

// appendRenewal appends the script arguments, argsPerZone of them, of the
// renewal of r's lease (a concurrency zone's request still running).
func (a *argCache) appendRenewal(args []any, r *algorithms.Request) []any {
	h := a.head(r.Limit)
	return append(args, h[0], r.Holder, modeRenew, unknownInstant)
}

// costArg is argCost of a take: its cost, or a concurrency
// zone's holder id (lua/concurrency.lua). The one place the layout differs
// by kind.
func costArg(r *algorithms.Request) any {
	if r.Limit.Algorithm == algorithms.Concurrency {
		return r.Holder
	}
	return r.Cost
}

// head returns l's formatted arguments, formatting them on a miss. The
// algorithms' numeric values travel here: they must not change.
func (a *argCache) head(l algorithms.Limit) *[2]any {
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
	e := &limitArgs{limit: l, head: [2]any{string(b), noWait}}
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
func packedAdmission(v int64) ([replyPerZone]int64, bool) {
	s := v & 3
	if v < 0 || s == 3 {
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
