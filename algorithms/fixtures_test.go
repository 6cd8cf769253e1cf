package algorithms

// Fixtures shared by this package's tests: instants, the limits the
// properties run over, traffic generators and the contract check. The
// properties every algorithm obeys live in properties_test.go, those of
// one algorithm in its own file (token_bucket_test.go, gcra_test.go,
// windows_test.go), and the shared vectors in vectors_test.go.

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// t0 is an arbitrary, realistic Unix millisecond (2026-ish).
const t0 = int64(1_780_000_000_000)

const (
	second = int64(1000)
	minute = 60 * second
	hour   = 60 * minute
	day    = 24 * hour
	year   = 365 * day
)

// testLimits are token bucket limits of every shape: burst == events,
// burst > events, burst < events, odd windows and rates that do not divide
// the window.
var testLimits = []Limit{
	{Events: 1, Window: 1000},
	{Events: 10, Window: minute},
	{Events: 7, Window: 1000},
	{Events: 20, Window: hour},
	{Events: 5, Window: 1000, Burst: 20},
	{Events: 20, Window: 1000, Burst: 3},
	{Events: 3, Window: 7, Burst: 11},
	{Events: 13, Window: 997, Burst: 13},
	{Events: 1000, Window: 3_600_000},
	{Events: 1, Window: day, Burst: 2},
}

// allLimits covers every algorithm with limits of different shapes: the
// token bucket's testLimits, the same for GCRA, and limits without a burst
// for the three window algorithms.
var allLimits = func() []Limit {
	var out []Limit
	for _, l := range testLimits {
		g := l
		g.Algorithm = GCRA
		out = append(out, l, g)
	}
	for _, alg := range []Algorithm{SlidingWindow, FixedWindow, SlidingLog} {
		for _, l := range []Limit{
			{Events: 1, Window: 1000}, {Events: 10, Window: minute}, {Events: 7, Window: 1000},
			{Events: 3, Window: 7}, {Events: 13, Window: 997}, {Events: 1000, Window: hour},
			{Events: 5, Window: day},
		} {
			l.Algorithm = alg
			out = append(out, l)
		}
	}
	return out
}()

// everyAlgorithm lists the algorithms, in their numeric order.
var everyAlgorithm = []Algorithm{TokenBucket, GCRA, SlidingWindow, FixedWindow, SlidingLog}

// name names a limit in messages: its algorithm and its shape.
func name(l Limit) string { return l.Algorithm.String() + "_" + shape(l) }

// shape names a limit without its algorithm.
func shape(l Limit) string {
	return fmt.Sprintf("%d_per_%dms_burst%d", l.Events, l.Window, l.Burst)
}

// forEachLimit runs f as a subtest per algorithm and, within it, per limit
// of limits of that algorithm (TestX/gcra/10_per_60000ms_burst0). i is the
// limit's index in limits, for seeding.
func forEachLimit(t *testing.T, limits []Limit, f func(t *testing.T, i int, l Limit)) {
	t.Helper()
	for _, alg := range everyAlgorithm {
		t.Run(alg.String(), func(t *testing.T) {
			ran := false
			for i, l := range limits {
				if l.Algorithm == alg {
					ran = true
					t.Run(shape(l), func(t *testing.T) { f(t, i, l) })
				}
			}
			if !ran {
				t.Fatalf("no limit of %s to check", alg)
			}
		})
	}
}

// gap draws a time step: bursts, gaps near the time one event takes, partial
// windows, long idles.
func gap(rng *rand.Rand, l Limit) int64 {
	per := max(l.Window/l.Events, 1)
	switch r := rng.IntN(100); {
	case r < 25:
		return rng.Int64N(3)
	case r < 65:
		return rng.Int64N(2*per + 1)
	case r < 92:
		return rng.Int64N(l.Window + 1)
	default:
		return l.Window + rng.Int64N(5*l.Window)
	}
}

// costsFor returns a few costs the limit's capacity admits.
func costsFor(l Limit) []int64 {
	var out []int64
	for _, c := range []int64{1, 2, 3, 5, 7} {
		if c <= l.Capacity() {
			out = append(out, c)
		}
	}
	return out
}

// drain spends cost 1 at now until the key refuses, and returns its state.
func drain(l Limit, now int64) State {
	var st State
	fresh := true
	for {
		d, next, _ := Step(st, fresh, l, now, 1)
		if !d.Allowed {
			return st
		}
		st, fresh = next, false
	}
}

func msDur(n int64) time.Duration { return time.Duration(n) * time.Millisecond }

// ceilDivTest is an independent ⌈a/b⌉ for the expectations.
func ceilDivTest(a, b int64) int64 {
	if a <= 0 {
		return 0
	}
	return (a + b - 1) / b
}

// admitted is one admitted request, for the window properties.
type admitted struct{ at, cost int64 }

// maxInAnyWindow returns the most cost admitted within any span of w
// milliseconds, [t, t+w), over a time-ordered list.
func maxInAnyWindow(ev []admitted, w int64) int64 {
	best, sum, j := int64(0), int64(0), 0
	for i := range ev {
		sum += ev[i].cost
		for ev[j].at+w <= ev[i].at {
			sum -= ev[j].cost
			j++
		}
		best = max(best, sum)
	}
	return best
}

// run drives one key with traffic and returns what was admitted.
func run(l Limit, steps int, next func() (dt, cost int64)) []admitted {
	var st State
	fresh := true
	now := t0
	var ev []admitted
	for range steps {
		dt, cost := next()
		now += dt
		d, n, _ := Step(st, fresh, l, now, cost)
		if d.Allowed {
			st, fresh = n, false
			ev = append(ev, admitted{now, cost})
		}
	}
	return ev
}

// checkSane runs a short sequence (times cumulative) and fails on any
// decision outside its contract: Remaining in [0, Capacity], non-negative
// durations, a positive RetryAfter on refusal, a full-at instant not before
// now, and ResetAfter consistent with it.
func checkSane(t *testing.T, l Limit) {
	t.Helper()
	if err := l.Validate(); err != nil {
		t.Fatalf("%+v: Validate: %v (the test expects it accepted)", l, err)
	}
	capacity := l.Capacity()
	var st State
	fresh := true
	now := t0
	for i, step := range []struct{ dt, cost int64 }{
		{0, capacity}, {0, 1}, {1, 1}, {0, capacity}, {l.Window, capacity}, {0, 1}, {year, 1},
	} {
		now += step.dt
		d, next, fullAt := Step(st, fresh, l, now, step.cost)
		if d.Remaining < 0 || d.Remaining > capacity || d.ResetAfter < 0 || d.RetryAfter < 0 ||
			(!d.Allowed && d.RetryAfter <= 0) || fullAt < now || d.ResetAfter != msDur(fullAt-now) {
			t.Errorf("%+v step %d (cost %d): decision out of contract %+v, fullAt = now%+dms", l, i, step.cost, d, fullAt-now)
			return
		}
		if d.Allowed {
			st, fresh = next, false
		}
	}
}

// The fixtures themselves: every limit the tests run over is valid, and
// every token bucket limit is among allLimits.
func TestFixturesAreValid(t *testing.T) {
	tb := 0
	for _, l := range allLimits {
		if err := l.Validate(); err != nil {
			t.Errorf("%s: %v", name(l), err)
		}
		if l.Algorithm == TokenBucket {
			tb++
		}
	}
	if tb != len(testLimits) {
		t.Errorf("allLimits holds %d token bucket limits, want the %d testLimits", tb, len(testLimits))
	}
}
