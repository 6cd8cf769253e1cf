package redisstore

import (
	"sync/atomic"

	"github.com/sluicehq/caddy-sluice/algorithms"
)

// The script's arguments per zone are the limit's four numbers, the cost and
// the mode (see algorithms.AppendLuaArgs). A zone's limit rarely changes, so
// its four arguments are formatted once and kept, already boxed, in a small
// direct-mapped cache: a request then formats nothing (its cost travels as
// an int64, which go-redis writes itself; the mode is a constant).

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

// modeArgs are the script's mode argument: take, refund, report-only.
var modeArgs = [3]any{"0", "1", "2"}

// appendArgs appends the script arguments of reqs (the six of
// algorithms.AppendLuaArgs per zone, in order).
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
		args = append(args, h[0], h[1], h[2], h[3], r.Cost, mode)
	}
	return args
}

// head returns l's formatted arguments, formatting them on a miss.
func (a *argCache) head(l algorithms.Limit) *[4]any {
	x := uint64(l.Events)*0x9e3779b97f4a7c15 ^ uint64(l.Window)*0xbf58476d1ce4e5b9 ^ uint64(l.Burst)*0x94d049bb133111eb ^ uint64(l.Algorithm)
	slot := &a.slots[(x^x>>29)%argSlots]
	if e := slot.Load(); e != nil && e.limit == l {
		return &e.head
	}
	e := &limitArgs{limit: l}
	full := algorithms.AppendLuaArgs(make([]any, 0, algorithms.LuaArgsPerZone), &algorithms.Request{Limit: l, Cost: 1}, false)
	copy(e.head[:], full[:4])
	slot.Store(e)
	return &e.head
}
