package adaptive

import (
	"strings"
	"sync"
	"testing"
	"time"
)

func TestResolveDefaultsAndErrors(t *testing.T) {
	s, err := Settings{}.Resolve()
	if err != nil || s.Controller != DefaultController || s.Minimum != DefaultMinimum || s.Maximum != DefaultMaximum ||
		s.Initial != DefaultInitial || s.Tolerance != DefaultTolerance || s.Window != DefaultWindow {
		t.Fatalf("defaults: %+v, %v", s, err)
	}
	if s, _ := (Settings{Controller: Gradient2}).Resolve(); s.Tolerance != DefaultGradient2Tolerance {
		t.Errorf("gradient2's tolerance %g, want %g", s.Tolerance, DefaultGradient2Tolerance)
	}
	if s, _ := (Settings{Maximum: 5}).Resolve(); s.Initial != 5 {
		t.Errorf("initial with maximum 5: %d, want 5 (the default clamped)", s.Initial)
	}
	for _, c := range []struct {
		s    Settings
		want string
	}{
		{Settings{Controller: "pid"}, "controller"},
		{Settings{Minimum: -1}, "minimum"},
		{Settings{Minimum: 10, Maximum: 5}, "maximum"},
		{Settings{Minimum: 2, Maximum: 5, Initial: 6}, "initial"},
		{Settings{Tolerance: 0.5}, "tolerance"},
		{Settings{Smoothing: 2}, "smoothing"},
		{Settings{Window: time.Hour}, "window"},
	} {
		if _, err := c.s.Resolve(); err == nil || !strings.HasPrefix(err.Error(), c.want) {
			t.Errorf("%+v: error %v, want one naming %s", c.s, err, c.want)
		}
	}
}

// TestLimiterAdmitsExactlyTheLimit: with 50 goroutines acquiring at once
// against a fixed limit of 7, exactly 7 are admitted.
func TestLimiterAdmitsExactlyTheLimit(t *testing.T) {
	s, _ := Settings{Minimum: 7, Maximum: 7, Initial: 7}.Resolve()
	l := NewLimiter(s)
	var wg sync.WaitGroup
	var mu sync.Mutex
	admitted := 0
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if l.Acquire() > 0 {
				mu.Lock()
				admitted++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if admitted != 7 || l.InFlight() != 7 {
		t.Fatalf("admitted %d, in flight %d; want 7 and 7", admitted, l.InFlight())
	}
	l.Release()
	if l.Acquire() != 7 {
		t.Fatal("a released place was not taken again")
	}
	for range 100 { // a fixed limit never moves
		l.Observe(time.Duration(time.Now().UnixNano()), time.Second, 7)
	}
	if l.Limit() != 7 {
		t.Fatalf("a fixed limit moved to %d", l.Limit())
	}
}

// feed closes one window of n samples of rtt with inFlight in flight.
func feed(l *Limiter, now *time.Duration, rtt time.Duration, inFlight int64) {
	for range minWindowSamples {
		*now += DefaultWindow/(minWindowSamples-1) + time.Millisecond
		l.Observe(*now, rtt, inFlight)
	}
}

func TestAIMD(t *testing.T) {
	s, _ := Settings{Initial: 10}.Resolve()
	l := NewLimiter(s)
	var now time.Duration
	feed(l, &now, 50*time.Millisecond, 10) // the baseline
	if l.Limit() != 11 || l.Baseline() != 50*time.Millisecond {
		t.Fatalf("after a loaded window at the baseline: limit %d baseline %s, want 11 and 50ms", l.Limit(), l.Baseline())
	}
	feed(l, &now, 50*time.Millisecond, 2) // app-limited: nothing learnt
	if l.Limit() != 11 {
		t.Fatalf("an app-limited window moved the limit to %d", l.Limit())
	}
	feed(l, &now, 150*time.Millisecond, 11) // past tolerance×baseline: back off
	if l.Limit() != 9 {                     // 11×0.8 rounded
		t.Fatalf("after a slow window: limit %d, want 9", l.Limit())
	}
	if l.Latency() != 150*time.Millisecond {
		t.Fatalf("latency %s, want the last window's 150ms", l.Latency())
	}
	// The upstream turns slower for good: the limit falls to within one of
	// the minimum, where the windows are unloaded ones and the baseline
	// follows the latency up until the limit grows again.
	least := l.Limit()
	for range 200 {
		feed(l, &now, time.Second, 100)
		least = min(least, l.Limit())
	}
	if least > s.Minimum+1 || l.Baseline() < time.Second*10/11 || l.Limit() <= s.Minimum+1 {
		t.Fatalf("sustained slowness: least limit %d, then limit %d, baseline %s; want within one of the minimum %d, then above it with a baseline past 1s/tolerance",
			least, l.Limit(), l.Baseline(), s.Minimum)
	}
}

// TestAIMDBaselineIsTheUnloadedAverage: the baseline is the average of the
// app-limited windows' latency, not the least of them, and a loaded window
// does not move it.
func TestAIMDBaselineIsTheUnloadedAverage(t *testing.T) {
	s, _ := Settings{Initial: 20}.Resolve()
	l := NewLimiter(s)
	var now time.Duration
	for i := range 400 {
		feed(l, &now, time.Duration(40+20*(i%2))*time.Millisecond, 2)
	}
	if b := l.Baseline(); b < 49*time.Millisecond || b > 51*time.Millisecond {
		t.Fatalf("baseline %s after app-limited windows of 40ms and 60ms, want their average 50ms", b)
	}
	// Loaded windows cut the limit towards its minimum; until it is within
	// one of it (where the windows count as unloaded), they leave the
	// baseline alone.
	before, windows := l.Baseline(), 0
	for ; windows < 100 && l.Limit() > s.Minimum+1; windows++ {
		feed(l, &now, 500*time.Millisecond, 20)
	}
	if l.Baseline() != before || windows < 20 {
		t.Fatalf("%d loaded windows moved the baseline from %s to %s", windows, before, l.Baseline())
	}
}

func TestGradient2AndVegasShrinkUnderQueueing(t *testing.T) {
	for _, c := range []string{Gradient2, Vegas} {
		s, _ := Settings{Controller: c, Initial: 50}.Resolve()
		l := NewLimiter(s)
		var now time.Duration
		for range 20 {
			feed(l, &now, 50*time.Millisecond, 50)
		}
		grown := l.Limit()
		if grown <= 50 {
			t.Errorf("%s: limit %d after fast loaded windows, want it grown past 50", c, grown)
		}
		for range 50 {
			feed(l, &now, 500*time.Millisecond, grown)
		}
		if l.Limit() >= grown {
			t.Errorf("%s: limit %d after slow windows, want it below %d", c, l.Limit(), grown)
		}
	}
}

// TestLimiterFallsOnlyWhenBoundOncePerRoundTrip: a slow window lowers the
// limit only if the limit bound in it (a request took its last place or
// was refused), and a window of requests all admitted before the last fall
// does not lower it again.
func TestLimiterFallsOnlyWhenBoundOncePerRoundTrip(t *testing.T) {
	s, _ := Settings{Initial: 10}.Resolve()
	l := NewLimiter(s)
	var now time.Duration
	feed(l, &now, 50*time.Millisecond, 10) // the baseline: 11
	feed(l, &now, 150*time.Millisecond, 9)
	if l.Limit() != 11 {
		t.Fatalf("a slow window that never reached the limit moved it to %d, want 11", l.Limit())
	}
	feed(l, &now, 150*time.Millisecond, 11)
	if l.Limit() != 9 { // 11×0.8 rounded
		t.Fatalf("a slow window at the limit: limit %d, want 9", l.Limit())
	}
	feed(l, &now, 150*time.Millisecond, 9) // every request admitted before the fall
	if l.Limit() != 9 {
		t.Fatalf("a window of requests admitted before the last fall moved the limit to %d, want 9", l.Limit())
	}
	feed(l, &now, 150*time.Millisecond, 9) // most admitted since
	if l.Limit() != 7 {                    // 8.8×0.8 rounded
		t.Fatalf("a slow window of requests admitted since the fall: limit %d, want 7", l.Limit())
	}
	feed(l, &now, 50*time.Millisecond, 2) // app-limited: no change, a round trip passes

	for l.Acquire() > 0 {
	}
	for range l.InFlight() {
		l.Release()
	}
	feed(l, &now, 150*time.Millisecond, 5) // below the limit, but one was refused
	if l.Limit() != 6 {                    // 7.04×0.8 rounded
		t.Fatalf("a slow window with a refusal: limit %d, want 6", l.Limit())
	}
}
