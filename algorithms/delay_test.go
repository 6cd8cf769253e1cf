package algorithms

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// delayLimits are token bucket limits with a waiting room (delay.go).
func delayLimits() []Limit {
	return []Limit{
		{Algorithm: TokenBucket, Events: 10, Window: 1000, Burst: 1, Delay: 3000},
		{Algorithm: TokenBucket, Events: 10, Window: 1000, Burst: 5, Delay: 1000, DelayAfter: 2},
		{Algorithm: TokenBucket, Events: 1, Window: 1000, Burst: 5, Delay: 500, DelayAfter: 1},
		{Algorithm: TokenBucket, Events: 7, Window: 3000, Delay: 2500},
		{Algorithm: TokenBucket, Events: 100, Window: 60000, Burst: 20, Delay: 10000, DelayAfter: 20},
		{Algorithm: TokenBucket, Events: 3, Window: 7, Burst: 4, Delay: 9, DelayAfter: 3},
	}
}

// GCRA with a waiting room decides exactly as the token bucket with the
// same one does, waits included, on random traffic, some of it not
// allowed to wait.
func TestDelayGCRAMatchesTokenBucket(t *testing.T) {
	for li, l := range delayLimits() {
		g := l
		g.Algorithm = GCRA
		t.Run(name(g), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(31, uint64(li)))
			var sb, sg State
			fb, fg := true, true
			now := t0
			waits := 0
			for i := range 5000 {
				now += gap(rng, l)
				cost := 1 + rng.Int64N(l.Capacity()+1)
				noDelay := rng.IntN(5) == 0
				rb := Request{Limit: l, Cost: cost, NoDelay: noDelay}
				rg := Request{Limit: g, Cost: cost, NoDelay: noDelay}
				db, nb, ab := StepRequest(sb, fb, &rb, now)
				dg, ng, ag := StepRequest(sg, fg, &rg, now)
				if db != dg || ab != ag {
					t.Fatalf("step %d (cost %d, no delay %v): token bucket %+v (full at %d), gcra %+v (full at %d)", i, cost, noDelay, db, ab, dg, ag)
				}
				if db.Allowed {
					sb, fb, sg, fg = nb, false, ng, false
				}
				if db.Delay > 0 {
					waits++
				}
			}
			if waits == 0 {
				t.Fatal("no request waited")
			}
		})
	}
}

// Retry-After stays exact with a waiting room: after waiting exactly
// RetryAfter the same request is admitted (it may wait then), one
// millisecond sooner it is not; and an admission never waits longer than
// the Delay.
func TestDelayRetryAfterIsExact(t *testing.T) {
	for li, l := range delayLimits() {
		for _, alg := range []Algorithm{TokenBucket, GCRA} {
			l.Algorithm = alg
			t.Run(name(l), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(37, uint64(li)))
				var st State
				fresh := true
				now := t0
				checked := 0
				for range 3000 {
					if rng.IntN(2) == 0 {
						now += gap(rng, l)
					}
					cost := 1 + rng.Int64N(l.Capacity())
					d, next, _ := Step(st, fresh, l, now, cost)
					if d.Allowed {
						if d.Delay.Milliseconds() > l.Delay {
							t.Fatalf("admitted with a wait of %v, beyond the delay %dms", d.Delay, l.Delay)
						}
						st, fresh = next, false
						continue
					}
					ra := d.RetryAfter.Milliseconds()
					if before, _, _ := Step(st, fresh, l, now+ra-1, cost); before.Allowed {
						t.Fatalf("refused with RetryAfter %dms, admitted 1ms sooner: %+v", ra, before)
					}
					if at, _, _ := Step(st, fresh, l, now+ra, cost); !at.Allowed {
						t.Fatalf("refused with RetryAfter %dms, refused again after it: %+v", ra, at)
					}
					checked++
				}
				if checked == 0 {
					t.Fatal("no refusal checked")
				}
			})
		}
	}
}

// Smoothing never exceeds the limit: requests admitted by a zone with a
// waiting room, run at the instants their waits end (in that order), are
// every one admitted by the same bucket without a waiting room whose
// capacity is delay_after (the part of a burst that passes at once).
func TestDelayNeverExceedsTheRate(t *testing.T) {
	for li, l := range delayLimits() {
		for _, alg := range []Algorithm{TokenBucket, GCRA} {
			l.Algorithm = alg
			t.Run(name(l), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(41, uint64(li)))
				var st State
				fresh := true
				now := t0
				var runs []int64 // the instants the admitted requests run at
				for range 4000 {
					if rng.IntN(3) > 0 {
						now += rng.Int64N(max(l.Window/l.Events, 1))
					} else {
						now += gap(rng, l)
					}
					d, next, _ := Step(st, fresh, l, now, 1)
					if d.Allowed {
						st, fresh = next, false
						runs = append(runs, now+d.Delay.Milliseconds())
					}
				}
				if !slices.IsSorted(runs) {
					t.Fatalf("admitted requests of cost 1 run out of their order of admission")
				}
				plain := l
				plain.Delay, plain.DelayAfter = 0, 0
				if l.DelayAfter > 0 {
					plain.Burst = l.DelayAfter
				}
				var ps State
				pfresh := true
				for i, at := range runs {
					d, next, _ := Step(ps, pfresh, plain, at, 1)
					if !d.Allowed {
						t.Fatalf("request %d runs at %d: a bucket of %d without waiting refuses it (%+v): the waits let more through than the rate", i, at, plain.Capacity(), d)
					}
					ps, pfresh = next, false
				}
				t.Logf("%d admissions run within the rate", len(runs))
			})
		}
	}
}

// A waiting request that goes away gives its reservation back exactly:
// the key then decides every later request as if that request had never
// come (the requests already waiting keep their turns).
func TestDelayGiveBackIsExact(t *testing.T) {
	for li, l := range delayLimits() {
		for _, alg := range []Algorithm{TokenBucket, GCRA} {
			l.Algorithm = alg
			t.Run(name(l), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(43, uint64(li)))
				var a, b State // a: every request, departures given back; b: never the departed ones
				fa, fb := true, true
				now := t0
				given := 0
				for i := range 3000 {
					now += rng.Int64N(max(l.Window/l.Events, 1) + 1)
					cost := 1 + rng.Int64N(min(l.Capacity(), 2))
					d, next, _ := Step(a, fa, l, now, cost)
					departs := d.Allowed && d.Delay > 1 && rng.IntN(3) == 0
					if d.Allowed {
						a, fa = next, false
					}
					if !departs {
						db, nb, _ := Step(b, fb, l, now, cost)
						if db != d {
							t.Fatalf("request %d at %d (cost %d): %+v, the run without the departed ones %+v", i, now, cost, d, db)
						}
						if db.Allowed {
							b, fb = nb, false
						}
						continue
					}
					// It goes away before its turn.
					gone := now + rng.Int64N(d.Delay.Milliseconds())
					nextA, _, ok := GiveBack(a, fa, l, gone, cost, now)
					if !ok {
						t.Fatalf("nothing given back")
					}
					a, fa = nextA, false
					given++
					if ca, cb := canonical(a, fa, l, gone), canonical(b, fb, l, gone); ca != cb {
						t.Fatalf("after request %d went away at %d: %s, the run without it %s", i, gone, ca, cb)
					}
					now = gone
				}
				if given == 0 {
					t.Fatal("no request went away")
				}
				t.Logf("%d reservations given back, exactly", given)
			})
		}
	}
}

func init() { _ = fmt.Sprint }
