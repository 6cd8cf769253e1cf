package algorithms

// What the three window algorithms promise about the most they admit in any
// span of Window: the sliding log at most Events, exactly; the fixed window
// up to 2×Events across a boundary; the sliding window counter close to
// Events on steady traffic and below 2×Events always. The properties they
// share with every algorithm are in properties_test.go.

import (
	"math/rand/v2"
	"testing"
)

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
