package algorithms

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// refundLimits are the limits the refund properties run on: every
// algorithm, small and odd numbers (so that refills and windows roll over
// within a sequence).
func refundLimits() []Limit {
	return []Limit{
		{Algorithm: TokenBucket, Events: 5, Window: 1000},
		{Algorithm: TokenBucket, Events: 3, Window: 7000, Burst: 8},
		{Algorithm: GCRA, Events: 5, Window: 1000},
		{Algorithm: GCRA, Events: 7, Window: 3000, Burst: 2},
		{Algorithm: FixedWindow, Events: 5, Window: 1000},
		{Algorithm: FixedWindow, Events: 13, Window: 7000},
		{Algorithm: SlidingWindow, Events: 5, Window: 1000},
		{Algorithm: SlidingWindow, Events: 13, Window: 7000},
		{Algorithm: SlidingLog, Events: 5, Window: 1000},
		{Algorithm: SlidingLog, Events: 13, Window: 7000},
	}
}

// canonical is a state as a request of cost 0 sees it at now: two states
// with the same canonical form decide every later request alike. (A
// sliding log keeps only its events still in the window; events of one
// instant in any order decide alike.)
func canonical(st State, fresh bool, l Limit, now int64) string {
	_, next, _ := Step(st, fresh, l, now, 0)
	if fresh && next.Log == nil && l.Algorithm == SlidingLog {
		return "log[]"
	}
	if next.Log != nil {
		var live []LogEntry
		for _, e := range next.Log.Entries {
			if e.At+l.Window > now {
				live = append(live, e)
			}
		}
		slices.SortStableFunc(live, func(x, y LogEntry) int {
			if x.At != y.At {
				return int(x.At - y.At)
			}
			return int(x.Cost - y.Cost)
		})
		return fmt.Sprintf("log%v", live)
	}
	return fmt.Sprintf("%+v", next)
}

// One client's requests, one at a time: each is charged before it runs and,
// when its response does not match, refunded when the response ends (before
// the next request). The key must then be, after every request and at the
// end, exactly as in a run that only ever sent the matching requests, and
// decide those alike: for every algorithm.
func TestRefundSequentialIsExact(t *testing.T) {
	for li, l := range refundLimits() {
		t.Run(fmt.Sprintf("%s %d per %dms burst %d", l.Algorithm, l.Events, l.Window, l.Burst), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(0x5e0, uint64(li)))
			var a, b State // a: charge + refund; b: the matching requests only
			freshA, freshB := true, true
			now := int64(1_780_000_000_000)
			refunds, matched := 0, 0
			for i := range 5000 {
				now += requestGap(rng, l)
				cost := 1 + rng.Int64N(min(l.Capacity(), 3))
				match := rng.IntN(3) == 0
				d, next, _ := Step(a, freshA, l, now, cost)
				if d.Allowed {
					a, freshA = next, false
				}
				if match {
					matched++
					db, nextB, _ := Step(b, freshB, l, now, cost)
					if db.Allowed {
						b, freshB = nextB, false
					}
					if db != d {
						t.Fatalf("request %d at %d (matching, cost %d): decided %+v, the matching-only run %+v", i, now, cost, d, db)
					}
				}
				// The response takes a while; a refund when it does not
				// match, before the client's next request.
				done := now + rng.Int64N(l.Window/2+1)
				if d.Allowed && !match {
					refunds++
					if next, _, ok := GiveBack(a, freshA, l, done, cost, now); ok {
						a, freshA = next, false
					}
				}
				if ca, cb := canonical(a, freshA, l, done), canonical(b, freshB, l, done); ca != cb {
					t.Fatalf("after request %d (cost %d, matching %v, allowed %v) at %d: state %s, the matching-only run %s", i, cost, match, d.Allowed, done, ca, cb)
				}
				now = done
			}
			t.Logf("%d requests, %d matching, %d refunds: the same state throughout", 5000, matched, refunds)
		})
	}
}

// requestGap draws the time to a client's next request: bursts, gaps of a few
// tokens, partial and whole windows.
func requestGap(rng *rand.Rand, l Limit) int64 {
	per := max(l.Window/l.Events, 1)
	switch r := rng.IntN(10); {
	case r < 4:
		return rng.Int64N(3)
	case r < 8:
		return rng.Int64N(2*per + 1)
	default:
		return rng.Int64N(2*l.Window + 1)
	}
}

// Several requests of one key in flight at once, responses in any order:
// for the window algorithms, whose refunds name their charge's window or
// event, the key ends exactly as a run that only sent the matching
// requests (every request allowed: the capacity is ample, so that in-flight
// charges refuse nothing the other run admits). For the token bucket and
// gcra the refund forgives at most min(cost, refill over the time between
// the charge and its refund) more than that run, never more than it
// charged: the refunded run's debt lies between the matching-only run's
// and that, minus the bound.
func TestRefundInterleaved(t *testing.T) {
	type flight struct {
		at, cost, done int64
		match          bool
	}
	for li, l := range refundLimits() {
		if l.Algorithm.AllowsBurst() {
			l.Burst = 1000 * l.Capacity() // the same refill rate, an ample bucket: debts stay positive
		} else {
			l.Events *= 1000
		}
		t.Run(fmt.Sprintf("%s %d per %dms burst %d", l.Algorithm, l.Events, l.Window, l.Burst), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(0x5e1, uint64(li)))
			var a, b State
			freshA, freshB := true, true
			now := int64(1_780_000_000_000)
			var inFlight []flight
			forgiven := int64(0) // the bound so far, in tokens × window
			checks := 0
			check := func(at int64, what string) {
				t.Helper()
				checks++
				switch l.Algorithm {
				case FixedWindow, SlidingWindow, SlidingLog:
					if ca, cb := canonical(a, freshA, l, at), canonical(b, freshB, l, at); ca != cb {
						t.Fatalf("%s at %d: state %s, the matching-only run %s", what, at, ca, cb)
					}
				default:
					// What the refunded run owes is at most the matching-only
					// run's, and at least that less the bound.
					da, db := debt(a, freshA, l, at), debt(b, freshB, l, at)
					if da > db || da < db-forgiven {
						t.Fatalf("%s at %d: debt %d, the matching-only run's %d: outside [%d, %d]", what, at, da, db, db-forgiven, db)
					}
				}
			}
			// settle ends the responses due by upTo, in the order they end.
			settle := func(upTo int64) {
				slices.SortStableFunc(inFlight, func(x, y flight) int { return int(x.done - y.done) })
				for len(inFlight) > 0 && inFlight[0].done <= upTo {
					f := inFlight[0]
					inFlight = inFlight[1:]
					if f.match {
						continue
					}
					if next, _, ok := GiveBack(a, freshA, l, f.done, f.cost, f.at); ok {
						a, freshA = next, false
					}
					forgiven += min(f.cost*l.Window, (f.done-f.at)*l.Events)
				}
			}
			// Rounds of requests that overlap: each sent while the earlier
			// ones of its round are still in flight, their responses ending
			// in any order; the key is compared once every response of the
			// round has ended (no refund pending, as in the other run).
			for round := range 300 {
				for i := range 1 + rng.IntN(12) {
					now += rng.Int64N(l.Window/max(l.Events/50, 1) + 1)
					settle(now)
					cost := 1 + rng.Int64N(3)
					match := rng.IntN(3) == 0
					d, next, _ := Step(a, freshA, l, now, cost)
					if !d.Allowed {
						t.Fatalf("round %d request %d refused with an ample capacity: %+v", round, i, d)
					}
					a, freshA = next, false
					if match {
						if db, nb, _ := Step(b, freshB, l, now, cost); db.Allowed {
							b, freshB = nb, false
						} else {
							t.Fatalf("round %d request %d refused in the matching-only run", round, i)
						}
					}
					inFlight = append(inFlight, flight{at: now, cost: cost, match: match, done: now + rng.Int64N(l.Window/2+1)})
				}
				for _, f := range inFlight {
					now = max(now, f.done)
				}
				settle(now)
				check(now, fmt.Sprintf("after round %d", round))
			}
			t.Logf("%d rounds compared", checks)
		})
	}
}

// debt is what a token bucket or gcra key owes at now, in tokens × window.
func debt(st State, fresh bool, l Limit, now int64) int64 {
	_, next, _ := Step(st, fresh, l, now, 0)
	if l.Algorithm == TokenBucket {
		return next.Debt
	}
	// gcra: the TAT ahead of now, in units of 1/u ms; a token is ei units.
	g := gcd(l.Events, l.Window)
	u, ei := l.Events/g, l.Window/g
	units := (next.At-now)*u + next.Debt
	return units * l.Window / ei
}
