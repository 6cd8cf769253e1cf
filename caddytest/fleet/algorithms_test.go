package fleet_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// The exactness test for each algorithm other than the token bucket (which
// TestExactFleetStandalone and TestExactFleetCluster cover): 3 Caddy
// processes sharing one Redis (standalone, then a 3-master Cluster), one
// zone per algorithm (events 20, window 1h, `algorithm <name>`), each
// served at its own path by the same processes, and 60 concurrent requests
// for one key spread evenly over the 3 processes, released together:
// exactly 20 allowed, exactly 40 refused, each admitted request seeing its
// own step of the countdown (X-RateLimit-Remaining 0..19 once each), every
// refusal carrying the Retry-After its algorithm implies. Repeated with
// fresh keys.
//
// The store pins `timeout 250ms`, as in exact_test.go: a decision that
// times out follows the zone's fail policy (open by default) and lets the
// request through unmetered, and on a two-core machine shared by three
// Caddy processes, Redis, the load and (under make test) other test
// packages, scheduling alone can push a healthy decision past the default.
// A request let through so is counted and fails the test (exactSeries).

// algRounds is the number of rounds per algorithm and store (as many as
// the token bucket gets: a round takes some 30-80 ms).
const algRounds = exactRounds

// exactAlgs are the algorithms tested here (token_bucket: exact_test.go).
var exactAlgs = []string{"gcra", "fixed_window", "sliding_window", "sliding_log"}

func TestExactFleetAlgorithmsStandalone(t *testing.T) {
	r := redistest.Start(t)
	keys := func(t *testing.T, pattern string) int { return len(scanKeys(t, r, pattern)) }
	runExactAlgorithms(t, "xa_std", "store redis "+r.URL()+" {\n\ttimeout 250ms\n}", keys)
}

func TestExactFleetAlgorithmsCluster(t *testing.T) {
	c := redistest.StartCluster(t, 3)
	keys := func(t *testing.T, pattern string) int {
		n := 0
		for _, node := range c.Nodes {
			n += len(scanKeys(t, node, pattern))
		}
		return n
	}
	store := "store redis {\n\tcluster " + strings.Join(c.Addrs(), " ") + "\n\ttimeout 250ms\n}"
	runExactAlgorithms(t, "xa_cl", store, keys)
}

// runExactAlgorithms starts 3 processes serving one zone per algorithm of
// exactAlgs at /<algorithm>, all on store, and runs algRounds exactness
// rounds against each.
func runExactAlgorithms(t *testing.T, prefix, store string, countKeys func(t *testing.T, pattern string) int) {
	var routes strings.Builder
	for _, alg := range exactAlgs {
		fmt.Fprintf(&routes, `handle /%s {
	rate_limit {
		zone %s_%s {
			key {http.request.header.X-User}
			events %d
			window 1h
			algorithm %s
		}
		%s
	}
	respond "ok"
}
`, alg, prefix, alg, exactCapacity, alg, strings.ReplaceAll(store, "\n", "\n\t\t"))
	}
	routes.WriteString(`respond "no such algorithm" 404`)

	procs := make([]*caddyProc, exactProcs)
	for i := range procs {
		procs[i] = startCaddy(t, fmt.Sprintf("%s-%d", prefix, i), "", routes.String())
	}
	client := newClient(exactWorkers)
	defer client.CloseIdleConnections()

	for _, alg := range exactAlgs {
		t.Run(alg, func(t *testing.T) {
			t0 := time.Now()
			zone := prefix + "_" + alg
			var before func(int)
			if alg == "fixed_window" || alg == "sliding_window" {
				// Their windows are aligned to the Unix epoch: a round
				// must not straddle a whole UTC hour, or the Retry-After
				// expected below (and, for fixed_window, the count: a new
				// window admits 20 more) would not hold.
				before = func(int) { avoidBoundary(t, time.Hour, 5*time.Second) }
			}
			exactSeries(t, client, procs, zone, "/"+alg, algRounds, before,
				func(int) retryWant { return exactRetryWant(alg, time.Now()) }, countKeys)
			t.Logf("%s: %d rounds in %v", alg, algRounds, time.Since(t0).Round(time.Millisecond))
		})
	}
}

// retrySlack is how far below its upper bound a refusal's Retry-After may
// fall: the time a round may take on a loaded machine, from the moment the
// bound was computed (before the round) to the decision.
const retrySlack = 10

// exactRetryWant is the Retry-After (seconds, rounded up, no jitter) of
// the refusals of a round of 20-per-hour started at now: 60 concurrent
// requests for a fresh key, 20 admitted.
func exactRetryWant(alg string, now time.Time) retryWant {
	const hour = 3600
	// toEnd is the time to the end of the current UTC hour, rounded up
	// from now in whole milliseconds (as the script reads Redis's TIME): an
	// upper bound of what remains of it at any later instant of the round.
	const hourMs = hour * 1000
	toEnd := int((hourMs - now.UnixMilli()%hourMs + 999) / 1000)
	switch alg {
	case "gcra":
		// The token bucket's numbers: one event per 180 s, and the bucket
		// was full a moment ago.
		return retryWant{180 - retrySlack, 180, "one event per 180 s, bucket just emptied"}
	case "fixed_window":
		return retryWant{toEnd - retrySlack, toEnd, "the time to the end of the UTC hour"}
	case "sliding_window":
		// prev 0, cur 20: the estimate allows one more 1/20 of a window
		// into the next window, when prev' = 20 weighs (1 - e/w) ≤ 19/20.
		return retryWant{toEnd + hour/20 - retrySlack, toEnd + hour/20, "the end of the UTC hour plus 180 s"}
	case "sliding_log":
		// The oldest of the 20 entries, just logged, leaves in an hour.
		return retryWant{hour - retrySlack, hour, "the oldest entry, just logged, leaves in an hour"}
	}
	panic("unknown algorithm " + alg)
}

// avoidBoundary waits out the start of the next window of length w aligned
// to the Unix epoch when it is less than margin away, so that what follows
// (lasting well under margin) stays inside one window. Redis's clock, which
// the store reads, is this machine's.
func avoidBoundary(t *testing.T, w, margin time.Duration) {
	t.Helper()
	now := time.Now()
	left := w - time.Duration(now.UnixNano())%w
	if left < margin {
		t.Logf("%v to the next %v boundary (UTC); waiting it out", left.Round(time.Millisecond), w)
		time.Sleep(left + 50*time.Millisecond)
	}
}
