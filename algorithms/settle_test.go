package algorithms_test

import (
	"testing"
	"time"

	"github.com/sluicehq/caddy-sluice/algorithms"
)

// TestSettleDebtBounded: a settle to the largest amount, on every algorithm
// and on limits from the smallest to the widest, leaves a key full again
// within 100 years of refill (MaxRefill) plus the limit's own, without an
// overflow; the next request is refused with a Retry-After to match.
func TestSettleDebtBounded(t *testing.T) {
	const now = int64(1_779_926_400_000)
	for _, alg := range []algorithms.Algorithm{algorithms.TokenBucket, algorithms.GCRA, algorithms.SlidingWindow, algorithms.FixedWindow, algorithms.SlidingLog} {
		for _, lw := range []struct {
			events int64
			window time.Duration
		}{{1, time.Millisecond}, {7, 3 * time.Second}, {1000, time.Hour}, {10_000, 24 * time.Hour}, {1 << 20, time.Millisecond}} {
			if alg == algorithms.SlidingLog && lw.events > algorithms.MaxLogEvents {
				continue
			}
			l, err := algorithms.NewLimit(alg, lw.events, lw.window, 0)
			if err != nil {
				continue // a limit the algorithm cannot hold
			}
			d, st, _ := algorithms.Step(algorithms.State{}, true, l, now, 1)
			if !d.Allowed {
				t.Fatalf("%s: the first request refused", alg)
			}
			for _, actual := range []int64{algorithms.MaxSettled, algorithms.MaxSettled + 1, 1 << 62} {
				next, fullAt, ok := algorithms.Settle(st, false, l, now, 1, actual, now)
				if !ok {
					t.Fatalf("%s %d/%v: settling to %d wrote nothing", alg, lw.events, lw.window, actual)
				}
				if lim := 2 * algorithms.MaxRefill; fullAt <= now || fullAt-now > lim {
					t.Fatalf("%s %d/%v: settled to %d, full again in %dms, want (0, %d]", alg, lw.events, lw.window, actual, fullAt-now, lim)
				}
				d, _, _ := algorithms.Step(next, false, l, now, 1)
				if d.Allowed || d.RetryAfter <= 0 || d.RetryAfter.Milliseconds() > fullAt-now {
					t.Fatalf("%s %d/%v: after a settle to %d, the next request: %+v (full in %dms)", alg, lw.events, lw.window, actual, d, fullAt-now)
				}
			}
		}
	}
}
