package fleet_test

import (
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// The exactness test: 3 Caddy processes sharing one Redis (standalone, then
// a 3-master Cluster), a zone of events 20 per hour keyed on X-User, and 60
// concurrent requests for one key spread evenly over the 3 processes,
// released together: exactly 20 are allowed, exactly 40 refused, nothing
// else. Repeated with fresh keys.
//
// The store pins `timeout 250ms`: a decision that times out follows the
// zone's fail policy (open by default) and lets the request through
// unmetered, and on a two-core machine shared by three Caddy processes,
// Redis, the load and (under make test) other test packages, scheduling
// alone can push a healthy decision past the default. BenchmarkTimeoutSweep
// measures how often each timeout trips, by concurrency; the README's
// "Redis store" section has the numbers behind the default.

const (
	exactProcs    = 3
	exactWorkers  = 60
	exactCapacity = 20
	exactRounds   = 10
)

func TestExactFleetStandalone(t *testing.T) {
	r := redistest.Start(t)
	keys := func(t *testing.T, pattern string) int { return len(scanKeys(t, r, pattern)) }
	runExact(t, "exact_std_250", "store redis "+r.URL()+" {\n\ttimeout 250ms\n}", keys)
}

func TestExactFleetCluster(t *testing.T) {
	c := redistest.StartCluster(t, 3)
	keys := func(t *testing.T, pattern string) int {
		n := 0
		for _, node := range c.Nodes {
			n += len(scanKeys(t, node, pattern))
		}
		return n
	}
	store := "store redis {\n\tcluster " + strings.Join(c.Addrs(), " ") + "\n"
	runExact(t, "exact_cl_250", store+"\ttimeout 250ms\n}", keys)
}

// exactOutcome is what one round came to.
type exactOutcome struct {
	allowed, undecided, refused, other int
	durs                               []time.Duration
}

func runExact(t *testing.T, zone, store string, countKeys func(t *testing.T, pattern string) int) {
	routes := fmt.Sprintf(`rate_limit {
	zone %s {
		key {http.request.header.X-User}
		events %d
		window 1h
	}
	%s
}
respond "ok"`, zone, exactCapacity, strings.ReplaceAll(store, "\n", "\n\t"))

	procs := make([]*caddyProc, exactProcs)
	for i := range procs {
		procs[i] = startCaddy(t, fmt.Sprintf("%s-%d", zone, i), "", routes)
	}
	client := newClient(exactWorkers)
	defer client.CloseIdleConnections()
	exactSeries(t, client, procs, zone, "/", exactRounds, nil, func(int) retryWant { return tokenBucketRetry }, countKeys)
}

// retryWant is the Retry-After (seconds) a refusal of an exactness round
// may carry: lo..hi, and why.
type retryWant struct {
	lo, hi int
	why    string
}

// tokenBucketRetry: 20 per hour is one event per 180 s.
var tokenBucketRetry = retryWant{1, 180, "one event per 180 s"}

// exactSeries runs rounds exactness rounds against zone, served at path by
// procs, with a fresh key each; before each round, beforeRound (if any)
// runs and want gives the Retry-After the round's refusals may carry. It
// logs the numbers and checks that the store never failed and that Redis
// holds one key per round.
func exactSeries(t *testing.T, client *http.Client, procs []*caddyProc, zone, path string, rounds int,
	beforeRound func(round int), want func(round int) retryWant, countKeys func(t *testing.T, pattern string) int) {
	t.Helper()
	var all []exactOutcome
	var allDurs []time.Duration
	for round := 0; round < rounds; round++ {
		if beforeRound != nil {
			beforeRound(round)
		}
		user := fmt.Sprintf("%s-%s-%d", zone, nonce, round)
		o := exactRound(t, client, procs, path, user, round, want(round))
		all = append(all, o)
		allDurs = append(allDurs, o.durs...)
	}

	// The numbers, for the report.
	var undecided, failedRounds int
	for i, o := range all {
		undecided += o.undecided
		if o.allowed != exactCapacity || o.refused != exactWorkers-exactCapacity || o.other != 0 {
			failedRounds++
		}
		t.Logf("round %2d: allowed %d (of which %d let through undecided by a store failure), refused %d, other %d; latency p50 %v p99 %v max %v",
			i, o.allowed, o.undecided, o.refused, o.other,
			percentile(o.durs, 50).Round(time.Microsecond), percentile(o.durs, 99).Round(time.Microsecond), percentile(o.durs, 100).Round(time.Microsecond))
	}
	var logLines, logSuppressed int
	var samples []string
	for _, p := range procs {
		l, s, sm := p.storeFailures()
		logLines += l
		logSuppressed += s
		samples = append(samples, sm...)
	}
	t.Logf("%s: %d rounds of %d concurrent requests over %d processes: %d rounds not exact; %d requests let through by a store failure (fail open); store-error log lines %d (+%d reported suppressed); latency over all p50 %v p99 %v max %v",
		zone, rounds, exactWorkers, len(procs), failedRounds, undecided, logLines, logSuppressed,
		percentile(allDurs, 50).Round(time.Microsecond), percentile(allDurs, 99).Round(time.Microsecond), percentile(allDurs, 100).Round(time.Microsecond))
	for _, s := range samples {
		t.Logf("store-error log line: %s", s)
	}
	if undecided > 0 || logLines > 0 {
		t.Errorf("%s: the store failed under this load (%d requests let through undecided, %d store-error log lines + %d suppressed): the decision timeout trips on a healthy local Redis",
			zone, undecided, logLines, logSuppressed)
	}

	// One key per round, with the schema's prefix and zone.
	if got := countKeys(t, "sluice:v1:"+zone+":{*}"); got != rounds {
		t.Errorf("%s: %d keys sluice:v1:%s:{*} in Redis, want %d (one per round)", zone, got, zone, rounds)
	}
}

// exactRound fires exactWorkers concurrent requests for user at path,
// request i to process i%3, released together, and checks the outcome
// exactly; a refusal's Retry-After must be within want.
func exactRound(t *testing.T, client *http.Client, procs []*caddyProc, path, user string, round int, want retryWant) exactOutcome {
	t.Helper()
	out := burst(t, client, procs, path, exactWorkers, user)

	var o exactOutcome
	var remaining []int
	perProc := make([]map[int]int, len(procs))
	for i := range perProc {
		perProc[i] = map[int]int{}
	}
	for i, r := range out {
		o.durs = append(o.durs, r.dur)
		switch {
		case r.err != nil:
			o.other++
			t.Errorf("round %d: request %d: %v", round, i, r.err)
			continue
		case r.code == http.StatusOK && !r.decided():
			// Let through by the fail-open policy: the store did not
			// decide in time.
			o.allowed++
			o.undecided++
		case r.code == http.StatusOK:
			o.allowed++
			n, err := strconv.Atoi(r.header.Get("X-Ratelimit-Remaining"))
			if err != nil {
				t.Errorf("round %d: request %d: 200 with X-RateLimit-Remaining %q", round, i, r.header.Get("X-Ratelimit-Remaining"))
			}
			remaining = append(remaining, n)
		case r.code == http.StatusTooManyRequests:
			o.refused++
			if ra := retryAfter(r); ra < want.lo || ra > want.hi {
				t.Errorf("round %d: request %d: 429 with Retry-After %q, want %d..%d (%s)", round, i, r.header.Get("Retry-After"), want.lo, want.hi, want.why)
			}
			if got := r.header.Get("X-Ratelimit-Remaining"); got != "0" {
				t.Errorf("round %d: request %d: 429 with X-RateLimit-Remaining %q, want 0", round, i, got)
			}
		default:
			o.other++
			t.Errorf("round %d: request %d: %s", round, i, r)
		}
		if r.err == nil {
			perProc[i%len(procs)][r.code]++
		}
	}
	if o.allowed != exactCapacity || o.refused != exactWorkers-exactCapacity || o.other != 0 {
		t.Errorf("round %d: %d allowed (%d undecided), %d refused, %d other; want exactly %d allowed and %d refused (per process: %v)",
			round, o.allowed, o.undecided, o.refused, o.other, exactCapacity, exactWorkers-exactCapacity, perProc)
	}
	// The admitted requests decided by the store each saw their own step of
	// the countdown, across the processes.
	if o.undecided == 0 && o.allowed == exactCapacity {
		slices.Sort(remaining)
		want := make([]int, exactCapacity)
		for i := range want {
			want[i] = i
		}
		if !slices.Equal(remaining, want) {
			t.Errorf("round %d: X-RateLimit-Remaining of the admitted requests %v, want each of 0..%d once", round, remaining, exactCapacity-1)
		}
	}
	return o
}

// TestExactFleetACLWithoutFunctions: the three processes connect as a user
// denied FUNCTION and FCALL (EVALSHA allowed, issue 35): decided through
// EVALSHA, the limit is exact across the fleet.
func TestExactFleetACLWithoutFunctions(t *testing.T) {
	r := redistest.Start(t)
	url := r.User(t, "nofn", "~*", "+@all", "-function", "-fcall", "-fcall_ro")
	keys := func(t *testing.T, pattern string) int { return len(scanKeys(t, r, pattern)) }
	runExact(t, "exact_acl_evalsha", "store redis "+url+" {\n\ttimeout 250ms\n}", keys)
	if n := r.CommandCount(t, "evalsha"); n < exactCapacity*exactRounds {
		t.Fatalf("EVALSHA ran %d times", n)
	}
}
