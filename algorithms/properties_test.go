package algorithms

// The contract every algorithm obeys (see Step and the package comment),
// one test per property, each run for every algorithm it holds for, as
// subtests TestProperty/<algorithm>/<limit>. What one algorithm alone
// promises is in its own file.

import (
	"errors"
	"math"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"
)

// checkRetryAfterExact checks a refusal d of cost at now from (st, fresh)
// under l: its RetryAfter is a positive whole number of milliseconds, the
// same request 1ms sooner is refused, and exactly then it passes.
func checkRetryAfterExact(t *testing.T, st State, fresh bool, l Limit, now, cost int64, d Decision) {
	t.Helper()
	ra := d.RetryAfter.Milliseconds()
	if ra <= 0 || d.RetryAfter != msDur(ra) {
		t.Fatalf("%s at %d cost %d: RetryAfter %v is not a positive whole ms", name(l), now-t0, cost, d.RetryAfter)
	}
	if d2, _, _ := Step(st, fresh, l, now+ra-1, cost); d2.Allowed {
		t.Fatalf("%s at %d cost %d: passed at RetryAfter-1ms (RetryAfter %dms)", name(l), now-t0, cost, ra)
	}
	if d2, _, _ := Step(st, fresh, l, now+ra, cost); !d2.Allowed {
		t.Fatalf("%s at %d cost %d: refused at exactly RetryAfter (%dms): %+v", name(l), now-t0, cost, ra, d2)
	}
}

// After waiting exactly RetryAfter the same request passes (nobody else
// spending), and one millisecond sooner it does not. The one exception, by
// design: a cost above the capacity never passes, and its RetryAfter (one
// window) is only a back-off hint (TestCostAboveCapacityIsRefusedWithoutConsuming).
func TestRetryAfterIsExact(t *testing.T) {
	forEachLimit(t, allLimits, func(t *testing.T, li int, l Limit) {
		// Random traffic (bursts, partial windows, long idles); the limit
		// changes now and then (events, window): the property holds
		// across it.
		t.Run("random traffic, changing limit", func(t *testing.T) {
			rng := rand.New(rand.NewPCG(7, uint64(li)))
			var st State
			fresh := true
			now := t0
			cur := l
			refusals := 0
			for range 3000 {
				now += gap(rng, cur)
				if rng.IntN(50) == 0 {
					// A changed limit of the same algorithm.
					cur = l
					cur.Events = max(1, l.Events+rng.Int64N(5)-2)
					if rng.IntN(2) == 0 {
						cur.Window = max(1, l.Window/2+rng.Int64N(l.Window))
					}
					if cur.Validate() != nil {
						cur = l
					}
				}
				cost := 1 + rng.Int64N(cur.Capacity())
				d, next, _ := Step(st, fresh, cur, now, cost)
				if d.Allowed {
					st, fresh = next, false
					continue
				}
				refusals++
				checkRetryAfterExact(t, st, fresh, cur, now, cost, d)
			}
			if refusals < 100 {
				t.Fatalf("only %d refusals checked", refusals)
			}
		})
		// Dense traffic: a request about every event's worth of time.
		t.Run("dense traffic", func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, uint64(li)))
			var st State
			fresh := true
			now := t0
			refusals := 0
			for range 3000 {
				now += rng.Int64N(l.Window/l.Events + 2)
				cost := 1 + rng.Int64N(l.Capacity())
				d, next, _ := Step(st, fresh, l, now, cost)
				if d.Allowed {
					st, fresh = next, false
					continue
				}
				refusals++
				checkRetryAfterExact(t, st, fresh, l, now, cost, d)
			}
			if refusals == 0 {
				t.Fatalf("the sequence never refused; the test checked nothing")
			}
		})
		// A key drained at one instant, for every cost.
		t.Run("drained at once", func(t *testing.T) {
			for _, cost := range costsFor(l) {
				st, fresh := State{}, true
				for {
					d, next, _ := Step(st, fresh, l, t0, cost)
					if !d.Allowed {
						checkRetryAfterExact(t, st, fresh, l, t0, cost, d)
						break
					}
					st, fresh = next, false
				}
			}
		})
	})
}

// A fresh key admits exactly ⌊Capacity/cost⌋ requests at one instant, each
// with Remaining counting down and no RetryAfter, then refuses (with the
// capacity as Limit).
func TestFreshKeyAdmitsItsCapacityAtOnce(t *testing.T) {
	forEachLimit(t, allLimits, func(t *testing.T, _ int, l Limit) {
		capacity := l.Capacity()
		for _, cost := range costsFor(l) {
			var st State
			fresh := true
			n := int64(0)
			var refusal Decision
			for i := int64(0); i < capacity+5; i++ {
				d, next, _ := Step(st, fresh, l, t0, cost)
				if !d.Allowed {
					refusal = d
					break
				}
				n++
				st, fresh = next, false
				if d.RetryAfter != 0 {
					t.Fatalf("cost %d: allowed decision has RetryAfter %v", cost, d.RetryAfter)
				}
				if want := capacity - n*cost; d.Remaining != want {
					t.Fatalf("cost %d, request %d: Remaining = %d, want %d", cost, n, d.Remaining, want)
				}
			}
			if want := capacity / cost; n != want {
				t.Fatalf("cost %d: admitted %d at one instant, want exactly %d", cost, n, want)
			}
			if refusal.Allowed || refusal.RetryAfter <= 0 || refusal.Limit != capacity {
				t.Fatalf("cost %d: want a refusal with a positive RetryAfter and Limit %d, got %+v", cost, capacity, refusal)
			}
		}
	})
}

// A refusal never consumes: the state it returns is the state given,
// advanced to now (what a cost-0 look returns), and a later request decides
// the same whether or not that state was stored.
func TestRefusalNeverConsumes(t *testing.T) {
	forEachLimit(t, allLimits, func(t *testing.T, li int, l Limit) {
		// The same traffic with refused requests sprinkled in decides every
		// other request the same.
		t.Run("refusals sprinkled in", func(t *testing.T) {
			rng := rand.New(rand.NewPCG(11, uint64(li)))
			var a, b State
			freshA, freshB := true, true
			now := t0
			for i := range 3000 {
				now += gap(rng, l)
				cost := 1 + rng.Int64N(l.Capacity())
				da, na, fa := Step(a, freshA, l, now, cost)
				// b also sees a request that is refused (too costly, or
				// refused now), before the same one.
				extra := l.Capacity() + 1 + rng.Int64N(3)
				if rng.IntN(2) == 0 {
					extra = 1 + rng.Int64N(l.Capacity())
				}
				dx, _, _ := Step(b, freshB, l, now, extra)
				if extra > l.Capacity() && (dx.Allowed || dx.RetryAfter != msDur(l.Window)) {
					t.Fatalf("step %d: cost %d above capacity: %+v", i, extra, dx)
				}
				if dx.Allowed {
					continue // not a refusal: b would diverge; try another step
				}
				db, nb, fb := Step(b, freshB, l, now, cost)
				if da != db || fa != fb {
					t.Fatalf("step %d: after a refusal %+v: %+v (fullAt %d), without it %+v (fullAt %d)", i, dx, db, fb, da, fa)
				}
				if da.Allowed {
					a, freshA = na, false
					b, freshB = nb, false
				}
			}
		})
		// A drained key, partly refilled: every refused cost returns the
		// state a cost-0 look returns, refusing twice changes nothing, and
		// later requests cannot tell whether the refusal was stored.
		t.Run("drained, partly refilled", func(t *testing.T) {
			capacity := l.Capacity()
			st := drain(l, t0)
			now := t0 + l.Window/(2*l.Events) + 1
			_, looked, _ := Step(st, false, l, now, 0)
			for cost := int64(1); cost <= capacity; cost++ {
				d, next, _ := Step(st, false, l, now, cost)
				if d.Allowed {
					continue
				}
				if !reflect.DeepEqual(next, looked) {
					t.Fatalf("cost %d: refusal returned %+v, want the unchanged %+v", cost, next, looked)
				}
				d2, next2, _ := Step(next, false, l, now, cost)
				if d2 != d || !reflect.DeepEqual(next2, next) {
					t.Fatalf("cost %d: refusing twice changed the answer: %+v/%+v then %+v/%+v", cost, d, next, d2, next2)
				}
				for _, later := range []int64{0, 1, 17, l.Window / 3, l.Window} {
					for _, c2 := range []int64{1, capacity} {
						a, an, af := Step(st, false, l, now+later, c2)
						b, bn, bf := Step(next, false, l, now+later, c2)
						if a != b || !reflect.DeepEqual(an, bn) || af != bf {
							t.Fatalf("after a refusal, request at +%d cost %d differs: %+v vs %+v", later, c2, a, b)
						}
					}
				}
			}
		})
	})
}

// A cost above the capacity can never pass: it is refused with RetryAfter =
// Window (a back-off hint), on a fresh key and on a spent one, and consumes
// nothing.
func TestCostAboveCapacityIsRefusedWithoutConsuming(t *testing.T) {
	forEachLimit(t, allLimits, func(t *testing.T, _ int, l Limit) {
		capacity := l.Capacity()
		for _, cost := range []int64{capacity + 1, 2 * capacity, math.MaxInt64 / (l.Window + 1)} {
			// A fresh key: refused, and left as fresh as a look leaves it.
			d, next, _ := Step(State{}, true, l, t0, cost)
			_, looked, _ := Step(State{}, true, l, t0, 0)
			if d.Allowed || d.RetryAfter != msDur(l.Window) || d.Remaining != capacity || d.ResetAfter != 0 {
				t.Fatalf("cost %d, fresh key: %+v", cost, d)
			}
			if !reflect.DeepEqual(next, looked) {
				t.Fatalf("cost %d: consumed from a fresh key: %+v, a look gives %+v", cost, next, looked)
			}
			// A key that spent 1: its state and its reset are unchanged.
			spentD, spent, _ := Step(State{}, true, l, t0, 1)
			d, next, _ = Step(spent, false, l, t0, cost)
			if d.Allowed || d.RetryAfter != msDur(l.Window) || d.Remaining != capacity-1 {
				t.Fatalf("cost %d, spent key: %+v", cost, d)
			}
			if !reflect.DeepEqual(next, spent) {
				t.Fatalf("cost %d: state changed from %+v to %+v", cost, spent, next)
			}
			if d.ResetAfter != spentD.ResetAfter {
				t.Fatalf("cost %d: ResetAfter %v, want the spent key's %v", cost, d.ResetAfter, spentD.ResetAfter)
			}
		}
	})
}

// fullRefill bounds how long a drained key takes to be full again: a full
// refill of the bucket, or two windows (the sliding window's previous
// window weighs on the next).
func fullRefill(l Limit) int64 {
	return max(2*l.Window, ceilDivTest(l.Capacity()*l.Window, l.Events))
}

// However long a key idles, it is back to its capacity and never more: a
// drained key after any gap, up to 2^61 ms, has at most Capacity − 1 left
// after one more request (exactly that after a full refill), times in range
// and no overflow; a full key stays exactly full.
func TestIdleKeyNeverExceedsItsCapacity(t *testing.T) {
	gaps := []int64{1, 999, second, minute, hour, day, year, 10 * year, 1000 * year, 1 << 50, 1 << 61}
	forEachLimit(t, allLimits, func(t *testing.T, _ int, l Limit) {
		capacity := l.Capacity()
		st := drain(l, t0)
		for _, gap := range gaps {
			now := t0 + gap
			d, _, fullAt := Step(st, false, l, now, 1)
			if !d.Allowed {
				if gap >= fullRefill(l) {
					t.Fatalf("gap %d: refused: %+v", gap, d)
				}
				if d.Remaining != 0 {
					t.Fatalf("gap %d: refused with Remaining %d, want 0", gap, d.Remaining)
				}
				continue
			}
			if d.Remaining > capacity-1 || d.Remaining < 0 {
				t.Fatalf("gap %d: Remaining %d out of [0, %d]", gap, d.Remaining, capacity-1)
			}
			if gap >= fullRefill(l) && d.Remaining != capacity-1 {
				t.Fatalf("gap %d: Remaining %d, want %d: not back to full", gap, d.Remaining, capacity-1)
			}
			if d.ResetAfter < 0 || d.ResetAfter > msDur(fullRefill(l)) {
				t.Fatalf("gap %d: ResetAfter %v", gap, d.ResetAfter)
			}
			if fullAt < now {
				t.Fatalf("gap %d: fullAt %d before now %d (overflow?)", gap, fullAt, now)
			}
		}
		// A full key (nothing spent) stays exactly full however long it idles.
		_, full, _ := Step(State{}, true, l, t0, 0)
		for _, gap := range gaps {
			if d, _, _ := Step(full, false, l, t0+gap, 0); d.Remaining != capacity || d.ResetAfter != 0 {
				t.Fatalf("idle %d: a full key became %+v", gap, d)
			}
		}
	})
}

// A clock stepping back (another instance's clock, an NTP step) never
// refills: a drained key is refused at any earlier instant, even negative
// ones, without panic and with its state unchanged; its RetryAfter counts
// the lag and stays exact; a key with some left never gains any.
func TestClockSteppingBackwardsNeverRefills(t *testing.T) {
	forEachLimit(t, allLimits, func(t *testing.T, _ int, l Limit) {
		at := t0 + 1000
		st := drain(l, at)
		for _, now := range []int64{at - 1, at - 500, at - year, 0, -1, -year} {
			d, next, _ := Step(st, false, l, now, 1)
			if d.Allowed || d.Remaining != 0 {
				t.Fatalf("now=at%+d: a backwards clock refilled: %+v", now-at, d)
			}
			if d.RetryAfter <= 0 || d.ResetAfter <= 0 {
				t.Fatalf("now=at%+d: non-positive times %+v", now-at, d)
			}
			if !reflect.DeepEqual(next, st) {
				t.Fatalf("now=at%+d: the state moved from %+v to %+v", now-at, st, next)
			}
		}
		d, _, _ := Step(st, false, l, at-500, 1)
		checkRetryAfterExact(t, st, false, l, at-500, 1, d)

		// With some left, a backwards clock may spend (or refuse) but never
		// adds any.
		_, half, _ := Step(State{}, true, l, at, l.Capacity()/2)
		before, _, _ := Step(half, false, l, at, 0)
		d, _, _ = Step(half, false, l, at-10_000, 1)
		want := before.Remaining
		if d.Allowed {
			want--
		}
		if d.Remaining > want {
			t.Fatalf("10s back with %d left: %+v, want Remaining at most %d", before.Remaining, d, want)
		}
	})
}

// A changed limit applies at once. A state written by another algorithm
// (the zone's algorithm was changed) counts as none; a changed capacity at
// the same rate applies to what the key has spent: the capacity minus the
// spent, and none left when the spent exceeds the new capacity. (Retry-After
// stays exact across changes: TestRetryAfterIsExact; each algorithm's own
// rules for a changed window or rate: its file.)
func TestChangedLimitAppliesAtOnce(t *testing.T) {
	t.Run("another algorithm's state is none", func(t *testing.T) {
		for _, from := range allLimits {
			_, st, _ := Step(State{}, true, from, t0, from.Capacity())
			for _, to := range allLimits {
				if to.Algorithm == from.Algorithm {
					continue
				}
				d, _, _ := Step(st, false, to, t0, 1)
				want, _, _ := Step(State{}, true, to, t0, 1)
				if d != want {
					t.Fatalf("%s state read by %s: %+v, fresh gives %+v", name(from), name(to), d, want)
				}
			}
		}
	})
	// withCapacity returns the limit of algorithm alg with capacity c and
	// the rate of 10 per second: the burst for the token bucket and GCRA
	// (whose rate is events), events for the window algorithms.
	withCapacity := func(alg Algorithm, c int64) Limit {
		if alg.AllowsBurst() {
			return Limit{Algorithm: alg, Events: 10, Window: 1000, Burst: c}
		}
		return Limit{Algorithm: alg, Events: c, Window: 1000}
	}
	for _, alg := range everyAlgorithm {
		t.Run(alg.String()+"/capacity changed", func(t *testing.T) {
			for _, c := range []struct{ from, spent, to, left int64 }{
				{3, 3, 10, 7}, // raised: the unspent are there at once
				{10, 4, 3, 0}, // lowered below the spent: none left
				{10, 2, 3, 1},
				{10, 3, 3, 0},
			} {
				d, st, _ := Step(State{}, true, withCapacity(alg, c.from), t0, c.spent)
				if !d.Allowed {
					t.Fatalf("spending %d of %d refused: %+v", c.spent, c.from, d)
				}
				to := withCapacity(alg, c.to)
				if d, _, _ := Step(st, false, to, t0, 0); d.Remaining != c.left || d.Limit != c.to {
					t.Errorf("%d of %d spent, capacity changed to %d: %+v, want Remaining %d", c.spent, c.from, c.to, d, c.left)
				}
				if d, _, _ := Step(st, false, to, t0, c.left+1); d.Allowed {
					t.Errorf("%d of %d spent, capacity changed to %d: cost %d passed: %+v", c.spent, c.from, c.to, c.left+1, d)
				}
				if c.left > 0 {
					if d, _, _ := Step(st, false, to, t0, c.left); !d.Allowed {
						t.Errorf("%d of %d spent, capacity changed to %d: cost %d refused: %+v", c.spent, c.from, c.to, c.left, d)
					}
				}
			}
		})
	}
}

// Validate refuses, with the error naming the field at fault, every limit
// it cannot enforce exactly (Lua's doubles hold integers up to 2^53; a
// time.Duration about 292 years), and accepts the largest it can.
func TestValidate(t *testing.T) {
	type row struct {
		algs []Algorithm // the algorithms the row holds for; nil: l.Algorithm's
		l    Limit
		want error
	}
	every, burst := everyAlgorithm, []Algorithm{TokenBucket, GCRA}
	rows := []row{
		// Fields out of range, whatever the algorithm.
		{every, Limit{Events: 1, Window: 1}, nil},
		{every, Limit{Events: 0, Window: 1000}, ErrEvents},
		{every, Limit{Events: -1, Window: 1000}, ErrEvents},
		{every, Limit{Events: math.MinInt64, Window: 1000}, ErrEvents},
		{every, Limit{Events: 1, Window: 0}, ErrWindow},
		{every, Limit{Events: 1, Window: -1000}, ErrWindow},
		{every, Limit{Events: 1, Window: 1000, Burst: -1}, ErrBurst},
		{every, Limit{Events: 1<<53 + 1, Window: 1}, ErrTooMany},
		{every, Limit{Events: math.MaxInt64, Window: math.MaxInt64}, ErrTooMany},
		{every, Limit{Events: math.MaxInt64, Window: 1000}, ErrTooMany},
		{burst, Limit{Events: 10, Window: 1000, Burst: 0}, nil},
		{burst, Limit{Events: 1, Window: 1000, Burst: math.MaxInt64}, ErrTooMany},
		{burst, Limit{Events: math.MaxInt64, Window: 1, Burst: 2}, ErrTooMany},
		{burst, Limit{Events: math.MaxInt64, Window: 1000, Burst: 1000}, ErrTooMany},
		// Only the token bucket and GCRA have a burst.
		{nil, Limit{Algorithm: GCRA, Events: 10, Window: 1000, Burst: 20}, nil},
		{nil, Limit{Algorithm: FixedWindow, Events: 10, Window: 1000, Burst: 20}, ErrBurstNotAllowed},
		{nil, Limit{Algorithm: SlidingWindow, Events: 10, Window: 1000, Burst: 20}, ErrBurstNotAllowed},
		{nil, Limit{Algorithm: SlidingLog, Events: 10, Window: 1000, Burst: 20}, ErrBurstNotAllowed},
		// Token bucket: capacity × window + events == 2^53 is the largest allowed.
		{nil, Limit{Events: 1 << 20, Window: 1<<33 - 1, Burst: 1 << 20}, nil},
		{nil, Limit{Events: 1<<20 + 1, Window: 1<<33 - 1, Burst: 1 << 20}, ErrTooWide},
		{nil, Limit{Events: 1 << 33, Window: 1 << 20}, ErrTooWide}, // capacity × window alone is 2^53
		{nil, Limit{Events: 1 << 13, Window: 1 << 20, Burst: 1<<33 - 1}, nil},
		{nil, Limit{Events: 1 << 13, Window: 1 << 20, Burst: 1 << 33}, ErrTooWide},
		{nil, Limit{Events: 1, Window: 1 << 20, Burst: 1<<33 + 1}, ErrTooWide},
		{nil, Limit{Events: 1, Window: 1<<53 + 1}, ErrTooWide},
		{nil, Limit{Events: 3, Window: (1<<53)/3 + 1}, ErrTooWide}, // 3×w = 2^53+2 (not divisible)
		{nil, Limit{Events: 3 << 20, Window: (1<<53)/(3<<20) - 1}, nil},
		{nil, Limit{Events: 1 << 52, Window: 1}, nil},
		{nil, Limit{Events: 1 << 53, Window: 1}, ErrTooWide},
		{nil, Limit{Algorithm: GCRA, Events: 1 << 33, Window: 1 << 20}, ErrTooWide},
		{nil, Limit{Algorithm: SlidingWindow, Events: 1 << 33, Window: 1 << 20}, ErrTooWide},
		{nil, Limit{Algorithm: FixedWindow, Events: 1 << 33, Window: 1 << 20}, nil}, // no products
		// Fixed window: count + cost ≤ 2 × events stays exact.
		{nil, Limit{Algorithm: FixedWindow, Events: 1 << 52, Window: 1}, nil},
		{nil, Limit{Algorithm: FixedWindow, Events: 1<<52 + 1, Window: 1}, ErrTooMany},
		// A window, or a full refill, longer than MaxRefill (100 years).
		{every, Limit{Events: 1, Window: MaxRefill}, nil},
		{every, Limit{Events: 1, Window: MaxRefill + 1}, ErrTooSlow},
		{nil, Limit{Events: 1, Window: 1 << 20, Burst: 1<<33 - 1}, ErrTooSlow},
		// The sliding log stores every admitted event.
		{nil, Limit{Algorithm: SlidingLog, Events: MaxLogEvents, Window: day}, nil},
		{nil, Limit{Algorithm: SlidingLog, Events: MaxLogEvents + 1, Window: day}, ErrLogTooLong},
		// GCRA's time unit.
		{nil, Limit{Algorithm: GCRA, Events: MaxGCRAUnit, Window: 1}, nil},
		{nil, Limit{Algorithm: GCRA, Events: MaxGCRAUnit + 1, Window: 1}, ErrGCRAUnit},
		{nil, Limit{Algorithm: GCRA, Events: 2 * MaxGCRAUnit, Window: 2}, nil}, // unit 2^26
		// (numAlgorithms is Concurrency: the first unknown id is after it.)
		{nil, Limit{Algorithm: Concurrency + 1, Events: 1, Window: 1}, ErrAlgorithm},
	}
	for _, r := range rows {
		algs := r.algs
		if algs == nil {
			algs = []Algorithm{r.l.Algorithm}
		}
		for _, alg := range algs {
			l := r.l
			l.Algorithm = alg
			err := l.Validate()
			if !errors.Is(err, r.want) || (r.want == nil) != (err == nil) {
				t.Errorf("%s: Validate() = %v, want %v", name(l), err, r.want)
			}
		}
	}
	err := Limit{Algorithm: FixedWindow, Events: 10, Window: 1000, Burst: 20}.Validate()
	if err == nil || !strings.HasPrefix(err.Error(), "fixed_window: burst") {
		t.Errorf("the burst error names neither the algorithm nor the field: %v", err)
	}

	// NewLimit takes a time.Duration: whole milliseconds, and the same bounds.
	for _, c := range []struct {
		events int64
		window time.Duration
		burst  int64
		want   error
	}{
		{10, 999 * time.Microsecond, 0, ErrWindow},
		{1, 24 * time.Hour, 200_000, ErrTooSlow},          // 200000 days to refill fully
		{1, 8760 * time.Hour, 1000, ErrTooSlow},           // 1000 years to refill fully
		{10, time.Duration(math.MaxInt64), 1, ErrTooSlow}, // the longest window a Duration holds
		{1, 101 * 365 * 24 * time.Hour, 0, ErrTooSlow},    // a window over 100 years
	} {
		if _, err := NewLimit(TokenBucket, c.events, c.window, c.burst); !errors.Is(err, c.want) {
			t.Errorf("NewLimit(%d, %v, %d) = %v, want %v", c.events, c.window, c.burst, err, c.want)
		}
	}
	l, err := NewLimit(TokenBucket, 10, 1500*time.Microsecond, 3)
	if err != nil || l.Window != 1 || l.Events != 10 || l.Burst != 3 || l.Capacity() != 3 {
		t.Errorf("NewLimit 1.5ms: %+v %v", l, err)
	}
	l, err = NewLimit(TokenBucket, 10, time.Minute, 0)
	if err != nil || l.Window != 60_000 || l.Capacity() != 10 {
		t.Errorf("NewLimit 1m: %+v %v", l, err)
	}
}

// Limits at the edges of what Validate accepts stay within the contract
// (checkSane): no wrapped or negative durations, Remaining in range.
func TestValidatedExtremesStaySane(t *testing.T) {
	for _, l := range []Limit{
		{Events: 1 << 52, Window: 1},
		{Events: 1 << 20, Window: 1<<33 - 1, Burst: 1 << 20},
		{Events: 1 << 13, Window: 1 << 20, Burst: 1<<33 - 1},
		{Events: 1<<53 - 2, Window: 1, Burst: 2},
		{Events: 1, Window: MaxRefill},
		{Events: 1, Window: 24 * hour, Burst: 1000},
		{Events: 10, Window: 99 * year, Burst: 10},
		{Events: 1, Window: 24 * hour, Burst: 36_000}, // ~98.6 years to refill fully
		{Events: 10, Window: 99 * year, Burst: 1},     // a 99-year window
		{Algorithm: GCRA, Events: MaxGCRAUnit, Window: 1},
		{Algorithm: GCRA, Events: 9973, Window: MaxRefill / 20000},
		{Algorithm: SlidingWindow, Events: 1 << 20, Window: 1<<33 - 1},
		{Algorithm: FixedWindow, Events: 1 << 52, Window: 1},
		{Algorithm: FixedWindow, Events: 3, Window: MaxRefill},
		{Algorithm: SlidingLog, Events: MaxLogEvents, Window: MaxRefill},
	} {
		t.Run(name(l), func(t *testing.T) { checkSane(t, l) })
	}
}

// Step allocates nothing, for every algorithm but the sliding log (whose
// log grows), on the allowing and the refusing path.
func TestStepDoesNotAllocate(t *testing.T) {
	for _, c := range []struct {
		what string
		l    Limit
		st   State // the zero State: a key that spent 1 at t0
	}{
		{"token_bucket", Limit{Algorithm: TokenBucket, Events: 1_000_000, Window: 1000}, State{}},
		{"token_bucket, one of 3 left", Limit{Events: 7, Window: 1000, Burst: 3}, State{Debt: 2000, At: t0, Scale: 1000}},
		{"gcra", Limit{Algorithm: GCRA, Events: 1_000_000, Window: 1000}, State{}},
		{"sliding_window", Limit{Algorithm: SlidingWindow, Events: 1_000_000, Window: 1000}, State{}},
		{"fixed_window", Limit{Algorithm: FixedWindow, Events: 1_000_000, Window: 1000}, State{}},
	} {
		t.Run(c.what, func(t *testing.T) {
			st := c.st
			if st.Scale == 0 {
				_, st, _ = Step(State{}, true, c.l, t0, 1)
			}
			now := t0
			var sink Decision
			allocs := testing.AllocsPerRun(1000, func() {
				now++
				d, next, _ := Step(st, false, c.l, now, 1)
				if d.Allowed {
					st = next
				}
				sink = d
			})
			if allocs != 0 {
				t.Errorf("Step allocates %v times per call, want 0", allocs)
			}
			_ = sink
		})
	}
}

// ParseAlgorithm reads every algorithm's configuration name (and "" as the
// default, the token bucket), refuses others, and String writes them.
func TestParseAlgorithm(t *testing.T) {
	for _, c := range []struct {
		in   string
		want Algorithm
		ok   bool
	}{
		{"", TokenBucket, true},
		{"token_bucket", TokenBucket, true},
		{"gcra", GCRA, true},
		{"sliding_window", SlidingWindow, true},
		{"fixed_window", FixedWindow, true},
		{"sliding_log", SlidingLog, true},
		{"leaky", 0, false},
		{"leaky_bucket", 0, false},
		{"Token_Bucket", 0, false},
	} {
		got, err := ParseAlgorithm(c.in)
		if (err == nil) != c.ok || c.ok && got != c.want {
			t.Errorf("ParseAlgorithm(%q) = %v, %v; want %v (ok %v)", c.in, got, err, c.want, c.ok)
		}
	}
	for _, a := range everyAlgorithm {
		if got, err := ParseAlgorithm(a.String()); err != nil || got != a {
			t.Errorf("ParseAlgorithm(%q) = %v, %v", a.String(), got, err)
		}
	}
	if len(everyAlgorithm) != int(numAlgorithms) {
		t.Errorf("everyAlgorithm lists %d algorithms, the package has %d", len(everyAlgorithm), numAlgorithms)
	}
	if got := Algorithm(9).String(); got != "algorithm(9)" {
		t.Errorf("Algorithm(9).String() = %q", got)
	}
}
