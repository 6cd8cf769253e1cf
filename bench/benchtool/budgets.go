package main

// The budgets, as data (issue 8's part 3, and issue 15's Caddy CPU per
// request and Redis calls per request), and their verdicts on a run.

import (
	"fmt"
	"math"
	"strings"
)

// budgetKind says what a budget measures.
type budgetKind int

const (
	// ratioToBare: the target's median req/s is at least bound × bare Caddy's.
	ratioToBare budgetKind = iota
	// ratioTo: the target's median req/s is at least bound × the other's.
	ratioTo
	// fasterThan: the target (refusing) serves more req/s than the other
	// (allowing): refusals are cheaper than allowing.
	fasterThan
	// allocsPerOp: the Go benchmark of the root package whose name starts
	// with bench allocates at most bound times per operation.
	allocsPerOp
	// bytesPerKey: the store's token bucket key takes at most bound bytes.
	bytesPerKey
	// cpuDelta: the target's Caddy CPU per request exceeds bare Caddy's by
	// at most bound µs (issue 15: the measure steadier than req/s).
	cpuDelta
	// cpuNotAbove: the target's Caddy CPU per request is at most the
	// other's (a refusal costs no more than letting a request through).
	cpuNotAbove
	// callsAtMost: Redis ran at most bound decision scripts per request.
	callsAtMost
	// redisUsAtMost: the target decide's decision of a case spends at most
	// bound µs inside Redis (usec_per_call; issue 29).
	redisUsAtMost
	// redisCPUAtMost: Redis's CPU per request of an HTTP target is at most
	// bound µs (issue 38).
	redisCPUAtMost
)

// budget is one budget: what it measures and its bound.
type budget struct {
	kind          budgetKind
	what          string  // the name's subject
	target, other string  // targets, for the req/s budgets
	versus        string  // ratioTo: what other is, "one zone" if empty
	bench         string  // the Go benchmark, for allocsPerOp
	store         string  // memstore or redis, for bytesPerKey
	kase          string  // the target decide's case (100,000 keys), for redisUsAtMost
	bound         float64 // unused by fasterThan (its bound is 1, exclusive)
}

var budgets = []budget{
	{kind: ratioToBare, what: "memstore, 1 zone", target: "mem1", bound: 0.95},
	{kind: ratioToBare, what: "memstore, 3 zones", target: "mem3", bound: 0.90},
	{kind: ratioToBare, what: "Redis, 1 zone", target: "redis1", bound: 0.65},
	{kind: ratioTo, what: "Redis, 3 zones ≈ 1 zone", target: "redis3", other: "redis1", bound: 0.95},
	// Issue 16: a concurrency zone beside a rate zone. With Redis its slot
	// is taken in the same call and given back by a pipelined ZREM.
	{kind: ratioTo, what: "memstore, a concurrency zone beside a rate zone", target: "memconc", other: "mem1", bound: 0.95},
	{kind: ratioTo, what: "Redis, a concurrency zone beside a rate zone", target: "redisconc", other: "redis1", bound: 0.75},
	{kind: fasterThan, what: "memstore", target: "memdeny", other: "mem1"},
	{kind: fasterThan, what: "Redis", target: "redisdeny", other: "redis1"},
	{kind: allocsPerOp, what: "memstore", bench: "BenchmarkServeHTTPAllowed", bound: 3},
	{kind: bytesPerKey, store: "memstore", bound: 128},
	{kind: bytesPerKey, store: "redis", bound: 100},
	{kind: cpuDelta, what: "Redis, 1 zone", target: "redis1", bound: 15},
	{kind: cpuDelta, what: "Redis, 3 zones", target: "redis3", bound: 20},
	{kind: cpuDelta, what: "Redis, 1 zone, many keys", target: "redis1k", bound: 15},
	{kind: cpuDelta, what: "Redis, 3 zones, many keys", target: "redis3k", bound: 20},
	{kind: cpuDelta, what: "memstore, 1 zone", target: "mem1", bound: 2},
	{kind: cpuNotAbove, what: "memstore", target: "memdeny", other: "mem1"},
	{kind: callsAtMost, what: "a hot key with `local_allowance`", target: "redislocal", bound: 0.05},
	// Issue 38: the asynchronous mode, a key per client over many clients.
	{kind: ratioToBare, what: "Redis, 1 zone, many keys, `sync`", target: "redis1ka", bound: 0.85},
	{kind: ratioToBare, what: "Redis, 3 zones, many keys, `sync`", target: "redis3ka", bound: 0.85},
	// The same against bare Caddy under the same keyed requests (barek):
	// wrk's own cost of them is not Sluice's.
	{kind: ratioTo, what: "Redis, 1 zone, many keys, `sync`", target: "redis1ka", other: "barek", versus: "bare under the same keyed requests", bound: 0.85},
	{kind: ratioTo, what: "Redis, 3 zones, many keys, `sync`", target: "redis3ka", other: "barek", versus: "bare under the same keyed requests", bound: 0.85},
	{kind: cpuDelta, what: "Redis, 1 zone, many keys, `sync`", target: "redis1ka", bound: 4},
	{kind: cpuDelta, what: "Redis, 3 zones, many keys, `sync`", target: "redis3ka", bound: 4},
	{kind: callsAtMost, what: "many keys with `sync`", target: "redis1ka", bound: 0.05},
	{kind: callsAtMost, what: "3 zones, many keys with `sync`", target: "redis3ka", bound: 0.05},
	{kind: redisCPUAtMost, what: "Redis, 1 zone, many keys, `sync`", target: "redis1ka", bound: 2},
	{kind: redisCPUAtMost, what: "Redis, 3 zones, many keys, `sync`", target: "redis3ka", bound: 2},
	{kind: redisUsAtMost, what: "1 zone token bucket", kase: "tb1", bound: 5},
	{kind: redisUsAtMost, what: "1 zone GCRA", kase: "gcra1", bound: 5},
	{kind: redisUsAtMost, what: "3 zones", kase: "z3", bound: 10},
}

// against is what a ratioTo budget's other target is.
func (b budget) against() string {
	if b.versus == "" {
		return "one zone"
	}
	return b.versus
}

// name is the budget as the report's table names it.
func (b budget) name() string {
	switch b.kind {
	case ratioToBare:
		return fmt.Sprintf("%s ≥ %.2f × bare", b.what, b.bound)
	case ratioTo:
		return fmt.Sprintf("%s (≥ %.2f × %s)", b.what, b.bound, b.against())
	case fasterThan:
		return fmt.Sprintf("refusals cheaper than allowing (%s)", b.what)
	case allocsPerOp:
		return fmt.Sprintf("hot path ≤ %.0f allocs/request (%s, %s)", b.bound, b.what, b.bench)
	case cpuDelta:
		return fmt.Sprintf("Caddy CPU per request, %s ≤ bare + %.0f µs", b.what, b.bound)
	case cpuNotAbove:
		return fmt.Sprintf("a refusal costs no more Caddy CPU than allowing (%s)", b.what)
	case callsAtMost:
		return fmt.Sprintf("Redis calls per request, %s ≤ %.2f", b.what, b.bound)
	case redisUsAtMost:
		return fmt.Sprintf("Redis µs per decision, %s, 100,000 keys ≤ %.0f µs", b.what, b.bound)
	case redisCPUAtMost:
		return fmt.Sprintf("Redis CPU per request, %s ≤ %.0f µs", b.what, b.bound)
	default: // bytesPerKey
		return fmt.Sprintf("memory per key ≤ %.0f B (%s, token bucket)", b.bound, b.store)
	}
}

// verdictKind is a budget's outcome on a run.
type verdictKind int

const (
	notMeasured verdictKind = iota
	met
	missed
)

// verdict is one row of the budgets table.
type verdict struct {
	budget   string
	measured string // what was measured, "–" if nothing
	kind     verdictKind
}

func judged(b budget, measured string, ok bool) verdict {
	v := verdict{budget: b.name(), measured: measured, kind: missed}
	if ok {
		v.kind = met
	}
	return v
}

// judge returns the verdicts of b on a run: one, or for a memory budget
// one per matching measurement.
func (b budget) judge(st *stats, gb []goBench, mk []memKey) []verdict {
	none := []verdict{{budget: b.name(), measured: "–", kind: notMeasured}}
	switch b.kind {
	case ratioToBare:
		v := st.rps[b.target] / st.bare
		if math.IsNaN(v) {
			return none
		}
		return []verdict{judged(b, fmt.Sprintf("%.2f (%s of %s req/s; %+.0f%% vs budget)",
			v, fmtRate(st.rps[b.target]), fmtRate(st.bare), (v/b.bound-1)*100), v >= b.bound)}
	case ratioTo:
		v := st.rps[b.target] / st.rps[b.other]
		if math.IsNaN(v) {
			return none
		}
		return []verdict{judged(b, fmt.Sprintf("%.2f × %s (%s vs %s req/s)",
			v, b.against(), fmtRate(st.rps[b.target]), fmtRate(st.rps[b.other])), v >= b.bound)}
	case fasterThan:
		v := st.rps[b.target] / st.rps[b.other]
		if math.IsNaN(v) {
			return none
		}
		return []verdict{judged(b, fmt.Sprintf("refusing %s req/s = %.2f × allowing %s req/s",
			fmtRate(st.rps[b.target]), v, fmtRate(st.rps[b.other])), v > 1)}
	case cpuDelta:
		r := st.row(b.target)
		if r == nil || math.IsNaN(r.usPerReq) || math.IsNaN(r.usBase) {
			return none
		}
		d := r.usPerReq - r.usBase
		return []verdict{judged(b, fmt.Sprintf("%+.1f µs (%.1f vs bare %.1f µs/req; %+.1f µs vs budget)",
			d, r.usPerReq, r.usBase, d-b.bound), d <= b.bound)}
	case cpuNotAbove:
		r, o := st.row(b.target), st.row(b.other)
		if r == nil || o == nil || math.IsNaN(r.usPerReq) || math.IsNaN(o.usPerReq) {
			return none
		}
		return []verdict{judged(b, fmt.Sprintf("refusing %.1f µs/req vs allowing %.1f (%+.1f µs)",
			r.usPerReq, o.usPerReq, r.usPerReq-o.usPerReq), r.usPerReq <= o.usPerReq)}
	case callsAtMost:
		r := st.row(b.target)
		if r == nil || math.IsNaN(r.calls) {
			return none
		}
		return []verdict{judged(b, fmt.Sprintf("%s calls per request", fmtCalls(r.calls)), r.calls <= b.bound)}
	case redisCPUAtMost:
		r := st.row(b.target)
		if r == nil || math.IsNaN(r.redisReq) {
			return none
		}
		return []verdict{judged(b, fmt.Sprintf("%.2f µs per request", r.redisReq), r.redisReq <= b.bound)}
	case redisUsAtMost:
		d := st.decideRow(b.kase, "many")
		if d == nil || math.IsNaN(d.take) {
			return none
		}
		return []verdict{judged(b, fmt.Sprintf("%.2f µs (floor %.2f µs, %s; CPU %.2f against %.2f µs)",
			d.take, d.floor, fmtRatio(d.ratio), d.takeCPU, d.floorCPU), d.take <= b.bound)}
	case allocsPerOp:
		for _, g := range gb {
			if g.pkg == "." && strings.HasPrefix(g.name, b.bench) && g.hasMem {
				return []verdict{judged(b, fmt.Sprintf("%.0f allocs/op, %.0f B/op, %.0f ns/op",
					g.allocsOp, g.bytesOp, g.ns), g.allocsOp <= b.bound)}
			}
		}
		return none
	default: // bytesPerKey
		var out []verdict
		for _, m := range mk {
			if m.store == b.store && m.alg == "token_bucket" {
				out = append(out, judged(b, fmt.Sprintf("%.0f B (%+.0f B vs budget)", m.bytes, m.bytes-b.bound), m.bytes <= b.bound))
			}
		}
		if out == nil {
			return none
		}
		return out
	}
}

// judgeBudgets returns every budget's verdicts on a run, in order.
func judgeBudgets(st *stats, gb []goBench, mk []memKey) []verdict {
	var out []verdict
	for _, b := range budgets {
		out = append(out, b.judge(st, gb, mk)...)
	}
	return out
}
