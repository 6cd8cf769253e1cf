package algorithms

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
)

// allLimits covers every algorithm with limits of different shapes.
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

func name(l Limit) string {
	return fmt.Sprintf("%s_%d_per_%dms_burst%d", l.Algorithm, l.Events, l.Window, l.Burst)
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

func TestAllLimitsValid(t *testing.T) {
	for _, l := range allLimits {
		if err := l.Validate(); err != nil {
			t.Errorf("%s: %v", name(l), err)
		}
	}
}

// For every algorithm: after waiting exactly RetryAfter the same request
// passes (nobody else spending), and one millisecond sooner it does not.
// The one exception, by design: a cost above the capacity never passes, and
// its RetryAfter (one window) is only a back-off hint. The limit also
// changes now and then (events, window): the property holds across it.
func TestRetryAfterExactEveryAlgorithm(t *testing.T) {
	for li, l := range allLimits {
		t.Run(name(l), func(t *testing.T) {
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
				ra := d.RetryAfter.Milliseconds()
				if ra <= 0 || d.RetryAfter != msDur(ra) {
					t.Fatalf("at %d cost %d: RetryAfter %v is not a positive whole ms", now-t0, cost, d.RetryAfter)
				}
				if d2, _, _ := Step(st, fresh, cur, now+ra-1, cost); d2.Allowed {
					t.Fatalf("%s at %d cost %d: passed at RetryAfter-1ms (RetryAfter %dms)", name(cur), now-t0, cost, ra)
				}
				if d2, _, _ := Step(st, fresh, cur, now+ra, cost); !d2.Allowed {
					t.Fatalf("%s at %d cost %d: refused at exactly RetryAfter (%dms): %+v", name(cur), now-t0, cost, ra, d2)
				}
			}
			if refusals < 100 {
				t.Fatalf("only %d refusals checked", refusals)
			}
		})
	}
}

// For every algorithm: a refusal never consumes. The same traffic with
// refused requests sprinkled in decides every other request the same, and
// a cost above the capacity is refused with RetryAfter = Window.
func TestRefusalNeverConsumesEveryAlgorithm(t *testing.T) {
	for li, l := range allLimits {
		t.Run(name(l), func(t *testing.T) {
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
				dx, nx, _ := Step(b, freshB, l, now, extra)
				if extra > l.Capacity() && (dx.Allowed || dx.RetryAfter != msDur(l.Window)) {
					t.Fatalf("step %d: cost %d above capacity: %+v", i, extra, dx)
				}
				if dx.Allowed {
					continue // not a refusal: b would diverge; try another step
				}
				_ = nx
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
	}
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

// The sliding log never admits more than Events in any span of Window:
// random traffic (weighted, bursty, idle), every window checked. Its memory
// stays bounded by Events entries.
func TestSlidingLogNeverExceedsAnyWindow(t *testing.T) {
	for li, l := range allLimits {
		if l.Algorithm != SlidingLog {
			continue
		}
		t.Run(name(l), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(13, uint64(li)))
			var st State
			fresh := true
			now := t0
			var ev []admitted
			for range 20000 {
				per := max(l.Window/l.Events, 1)
				switch r := rng.IntN(100); {
				case r < 50:
					now += rng.Int64N(3) // bursts fill the window
				case r < 97:
					now += rng.Int64N(4*per + 1)
				default:
					now += gap(rng, l)
				}
				cost := 1 + rng.Int64N(min(l.Events, 3))
				d, n, _ := Step(st, fresh, l, now, cost)
				if d.Allowed {
					st, fresh = n, false
					ev = append(ev, admitted{now, cost})
					if k := len(st.Log.Entries); int64(k) > l.Events || cap(st.Log.Entries) > 2*int(l.Events)+8 {
						t.Fatalf("log of %d entries (capacity %d) for events %d", k, cap(st.Log.Entries), l.Events)
					}
				}
			}
			if got := maxInAnyWindow(ev, l.Window); got > l.Events {
				t.Fatalf("%d admitted within one window of %dms, limit %d", got, l.Window, l.Events)
			} else if got < l.Events {
				t.Fatalf("the traffic never filled a window (%d of %d): the test proves nothing", got, l.Events)
			}
		})
	}
}

// The fixed window's boundary burst: Events at the end of one window and
// Events at the start of the next pass within 2ms, so 2×Events within a
// span of Window; random traffic never exceeds that.
func TestFixedWindowBoundaryBurst(t *testing.T) {
	l := Limit{Algorithm: FixedWindow, Events: 10, Window: minute}
	start := t0 - t0%minute + minute // a window boundary
	ev := run(l, 40, func() func() (int64, int64) {
		i := 0
		return func() (int64, int64) {
			i++
			switch i {
			case 1:
				return start - 1 - t0, 1 // the last ms of a window
			case 21:
				return 1, 1 // the first ms of the next
			}
			return 0, 1
		}
	}())
	if got := maxInAnyWindow(ev, 2); got != 2*l.Events {
		t.Fatalf("%d admitted within 2ms across the boundary, want 2×%d", got, l.Events)
	}
	for li, l := range allLimits {
		if l.Algorithm != FixedWindow {
			continue
		}
		rng := rand.New(rand.NewPCG(17, uint64(li)))
		ev := run(l, 20000, func() (int64, int64) { return gap(rng, l), 1 + rng.Int64N(min(l.Events, 3)) })
		if got := maxInAnyWindow(ev, l.Window); got > 2*l.Events {
			t.Fatalf("%s: %d within one window, more than 2×%d", name(l), got, l.Events)
		}
	}
}

// The sliding window counter's error, measured (see sliding_window.go):
// with steady traffic above the limit the most admitted in any span of
// Window stays close to Events; traffic bunched at the end of each window
// exploits the estimate, but never reaches 2×Events.
func TestSlidingWindowErrorBound(t *testing.T) {
	l := Limit{Algorithm: SlidingWindow, Events: 100, Window: 10_000}
	rng := rand.New(rand.NewPCG(19, 23))
	// Steady: Poisson arrivals at 3× the limit.
	steady := run(l, 200_000, func() (int64, int64) {
		return int64(rng.ExpFloat64() * float64(l.Window) / float64(3*l.Events)), 1
	})
	// Bunched: every request in the last 5% of each window, 20× the limit.
	now := t0
	bunched := run(l, 200_000, func() (int64, int64) {
		next := now + 1 + rng.Int64N(2*l.Window/(20*l.Events))
		if off := next % l.Window; off < l.Window*95/100 {
			next += l.Window*95/100 - off
		}
		dt := next - now
		now = next
		return dt, 1
	})
	// Adversarial: the previous window filled at its very end, then the
	// next one spent as fast as the estimate allows.
	adv := []admitted{}
	{
		var st State
		fresh := true
		t1 := t0 - t0%l.Window + 10*l.Window
		for k := -l.Events; k < 3*l.Window; k++ {
			at := t1 - 1 + max(k, 0) // Events at the window's last ms, then one per ms
			d, n, _ := Step(st, fresh, l, at, 1)
			if d.Allowed {
				st, fresh = n, false
				adv = append(adv, admitted{at, 1})
			}
		}
	}
	s, b, a := maxInAnyWindow(steady, l.Window), maxInAnyWindow(bunched, l.Window), maxInAnyWindow(adv, l.Window)
	t.Logf("most admitted in any %dms window, limit %d: steady traffic %d (%.1f%%), bunched at window ends %d (%.1f%%), adversarial %d (%.1f%%)",
		l.Window, l.Events, s, 100*float64(s)/float64(l.Events), b, 100*float64(b)/float64(l.Events), a, 100*float64(a)/float64(l.Events))
	if s > l.Events*110/100 {
		t.Errorf("steady traffic: %d admitted in one window, over 10%% above %d", s, l.Events)
	}
	for _, got := range []int64{s, b, a} {
		if got > 2*l.Events-1 {
			t.Errorf("%d admitted in one window: beyond the 2×%d−1 bound", got, l.Events)
		}
	}
	if a <= l.Events {
		t.Errorf("the adversarial pattern did not show the error (%d)", a)
	}
}

// GCRA admits exactly as the token bucket of the same limit does, and
// reports the same numbers, on random traffic with a steady clock.
func TestGCRAMatchesTokenBucket(t *testing.T) {
	for li, l := range testLimits {
		g := l
		g.Algorithm = GCRA
		t.Run(name(g), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(29, uint64(li)))
			var sb, sg State
			fb, fg := true, true
			now := t0
			for i := range 5000 {
				now += gap(rng, l)
				cost := 1 + rng.Int64N(l.Capacity()+1)
				db, nb, ab := Step(sb, fb, l, now, cost)
				dg, ng, ag := Step(sg, fg, g, now, cost)
				if db != dg || ab != ag {
					t.Fatalf("step %d (cost %d): token bucket %+v (full at %d), gcra %+v (full at %d)", i, cost, db, ab, dg, ag)
				}
				if db.Allowed {
					sb, fb, sg, fg = nb, false, ng, false
				}
			}
		})
	}
}

// Step allocates nothing for every algorithm but the sliding log.
func TestStepDoesNotAllocateEveryAlgorithm(t *testing.T) {
	for _, alg := range []Algorithm{TokenBucket, GCRA, SlidingWindow, FixedWindow} {
		l := Limit{Algorithm: alg, Events: 1_000_000, Window: 1000}
		_, st, _ := Step(State{}, true, l, t0, 1)
		now := t0
		allocs := testing.AllocsPerRun(1000, func() {
			now++
			d, next, _ := Step(st, false, l, now, 1)
			if d.Allowed {
				st = next
			}
		})
		if allocs != 0 {
			t.Errorf("%s: Step allocates %v times", alg, allocs)
		}
	}
}

// A state written by one algorithm counts as none for another (a zone whose
// algorithm changed starts afresh), and never panics.
func TestStateOfAnotherAlgorithmIsFresh(t *testing.T) {
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
}

func TestValidatePerAlgorithm(t *testing.T) {
	cases := []struct {
		l    Limit
		want error
	}{
		{Limit{Algorithm: FixedWindow, Events: 10, Window: 1000, Burst: 20}, ErrBurstNotAllowed},
		{Limit{Algorithm: SlidingWindow, Events: 10, Window: 1000, Burst: 20}, ErrBurstNotAllowed},
		{Limit{Algorithm: SlidingLog, Events: 10, Window: 1000, Burst: 20}, ErrBurstNotAllowed},
		{Limit{Algorithm: GCRA, Events: 10, Window: 1000, Burst: 20}, nil},
		{Limit{Algorithm: SlidingLog, Events: MaxLogEvents, Window: day}, nil},
		{Limit{Algorithm: SlidingLog, Events: MaxLogEvents + 1, Window: day}, ErrLogTooLong},
		{Limit{Algorithm: GCRA, Events: MaxGCRAUnit, Window: 1}, nil},
		{Limit{Algorithm: GCRA, Events: MaxGCRAUnit + 1, Window: 1}, ErrGCRAUnit},
		{Limit{Algorithm: GCRA, Events: 2 * MaxGCRAUnit, Window: 2}, nil}, // unit 2^26
		{Limit{Algorithm: GCRA, Events: 1 << 33, Window: 1 << 20}, ErrTooWide},
		{Limit{Algorithm: SlidingWindow, Events: 1 << 33, Window: 1 << 20}, ErrTooWide},
		{Limit{Algorithm: FixedWindow, Events: 1 << 33, Window: 1 << 20}, nil}, // no products
		{Limit{Algorithm: FixedWindow, Events: 1 << 52, Window: 1}, nil},
		{Limit{Algorithm: FixedWindow, Events: 1<<52 + 1, Window: 1}, ErrTooMany},
		{Limit{Algorithm: FixedWindow, Events: 1, Window: MaxRefill + 1}, ErrTooSlow},
		{Limit{Algorithm: SlidingLog, Events: 1, Window: MaxRefill + 1}, ErrTooSlow},
		{Limit{Algorithm: SlidingWindow, Events: 1, Window: MaxRefill + 1}, ErrTooSlow},
		{Limit{Algorithm: numAlgorithms, Events: 1, Window: 1}, ErrAlgorithm},
	}
	for _, c := range cases {
		err := c.l.Validate()
		if !errors.Is(err, c.want) || (c.want == nil) != (err == nil) {
			t.Errorf("%s: Validate() = %v, want %v", name(c.l), err, c.want)
		}
	}
	err := Limit{Algorithm: FixedWindow, Events: 10, Window: 1000, Burst: 20}.Validate()
	if err == nil || err.Error()[:len("fixed_window: burst")] != "fixed_window: burst" {
		t.Errorf("the burst error names neither the algorithm nor the field: %v", err)
	}
	for _, l := range []Limit{
		{Algorithm: GCRA, Events: MaxGCRAUnit, Window: 1},
		{Algorithm: GCRA, Events: 9973, Window: MaxRefill / 20000},
		{Algorithm: SlidingWindow, Events: 1 << 20, Window: 1<<33 - 1},
		{Algorithm: FixedWindow, Events: 1 << 52, Window: 1},
		{Algorithm: FixedWindow, Events: 3, Window: MaxRefill},
		{Algorithm: SlidingLog, Events: MaxLogEvents, Window: MaxRefill},
	} {
		checkSane(t, l)
	}
}

func TestParseAlgorithmEvery(t *testing.T) {
	for a := range numAlgorithms {
		got, err := ParseAlgorithm(a.String())
		if err != nil || got != a {
			t.Errorf("ParseAlgorithm(%q) = %v, %v", a.String(), got, err)
		}
	}
	if _, err := ParseAlgorithm("leaky_bucket"); err == nil {
		t.Errorf("leaky_bucket accepted")
	}
}
