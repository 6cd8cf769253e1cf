package fleet_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// Concurrency zones across a fleet: Caddy processes sharing one Redis, in
// front of an upstream (a Go server of the test) that holds each request
// until the test releases it, and counts the requests in flight in it.

// slotUpstream holds every request until released (or until its client
// goes away), counting those in flight and their peak; /ok answers at
// once.
type slotUpstream struct {
	srv            *httptest.Server
	inFlight, peak atomic.Int64
	arrived        chan struct{}
	mu             sync.Mutex
	release        chan struct{}
}

func newSlotUpstream(t *testing.T) *slotUpstream {
	u := &slotUpstream{arrived: make(chan struct{}, 4096), release: make(chan struct{})}
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/ok") {
			_, _ = w.Write([]byte("app"))
			return
		}
		cur := u.inFlight.Add(1)
		defer u.inFlight.Add(-1)
		for p := u.peak.Load(); cur > p && !u.peak.CompareAndSwap(p, cur); p = u.peak.Load() {
		}
		u.arrived <- struct{}{}
		u.mu.Lock()
		release := u.release
		u.mu.Unlock()
		select {
		case <-release:
			_, _ = w.Write([]byte("done"))
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(func() {
		u.releaseAll()
		u.srv.Close()
	})
	return u
}

func (u *slotUpstream) addr() string { return u.srv.Listener.Addr().String() }

func (u *slotUpstream) releaseAll() {
	u.mu.Lock()
	defer u.mu.Unlock()
	select {
	case <-u.release:
	default:
		close(u.release)
	}
}

// hold makes the next /hold requests wait, and restarts the peak.
func (u *slotUpstream) hold() {
	u.mu.Lock()
	u.release = make(chan struct{})
	u.mu.Unlock()
	u.peak.Store(u.inFlight.Load())
}

func (u *slotUpstream) waitArrived(t *testing.T, n int, within time.Duration) {
	t.Helper()
	deadline := time.After(within)
	for i := range n {
		select {
		case <-u.arrived:
		case <-deadline:
			t.Fatalf("only %d of %d requests reached the upstream within %v", i, n, within)
		}
	}
}

// held is a request sent in the background; done receives its result.
type held struct {
	done chan result
}

// sendHeld sends GET path to p for user in the background.
func sendHeld(c *http.Client, p *caddyProc, path, user string) held {
	h := held{done: make(chan result, 1)}
	go func() { h.done <- send(c, p.url(path), "X-User: "+user) }()
	return h
}

// liveSlots counts the leases of a slots key that have not expired, at
// Redis's time.
func liveSlots(t *testing.T, r *redistest.Server, key string) int64 {
	t.Helper()
	now, ok := r.Do(t, "TIME").([]any)
	if !ok || len(now) != 2 {
		t.Fatalf("TIME: %v", now)
	}
	sec, _ := strconv.ParseInt(fmt.Sprint(now[0]), 10, 64)
	us, _ := strconv.ParseInt(fmt.Sprint(now[1]), 10, 64)
	ms := sec*1000 + us/1000
	n, ok := r.Do(t, "ZCOUNT", key, "("+strconv.FormatInt(ms, 10), "+inf").(int64)
	if !ok {
		t.Fatalf("ZCOUNT %s: unexpected reply", key)
	}
	return n
}

func waitSlots(t *testing.T, r *redistest.Server, key string, want int64, within time.Duration) time.Duration {
	t.Helper()
	took, ok := waitFor(within, func() bool { return liveSlots(t, r, key) == want })
	if !ok {
		t.Fatalf("%s: %d live leases after %v, want %d", key, liveSlots(t, r, key), within, want)
	}
	return took
}

func slotsRoutes(zone, upstream, extra, store string) string {
	return fmt.Sprintf(`rate_limit {
	zone %s {
		key {http.request.header.X-User}
		concurrent 10
%s	}
	%s
}
reverse_proxy %s`, zone, extra, store, upstream)
}

// TestSlotsFleetExact: 3 Caddy processes, one Redis, `concurrent 10`: 60
// clients at once on one key (20 per process) put exactly 10 requests in
// flight at the upstream and get exactly 50 refusals, in each of 10 rounds
// on the same key: released, the 10 answer 200, their slots come back, and
// the next round's 10 get in.
func TestSlotsFleetExact(t *testing.T) {
	r := redistest.Start(t)
	up := newSlotUpstream(t)
	const zone = "slots_fleet"
	routes := slotsRoutes(zone, up.addr(), "", "store redis "+r.URL()+" {\n\t\ttimeout 250ms\n\t}")
	procs := make([]*caddyProc, 3)
	for i := range procs {
		procs[i] = startCaddy(t, fmt.Sprintf("%s-%d", zone, i), "", routes)
	}
	c := newClient(64)
	defer c.CloseIdleConnections()
	user := "fleet-" + nonce
	key := ""
	var releases []time.Duration
	for round := range 10 {
		up.hold()
		start := make(chan struct{})
		var ready sync.WaitGroup
		out := make(chan result, 60)
		for i := range 60 {
			ready.Add(1)
			go func() {
				ready.Done()
				<-start
				out <- send(c, procs[i%3].url("/hold"), "X-User: "+user)
			}()
		}
		ready.Wait()
		close(start)
		up.waitArrived(t, 10, 10*time.Second)
		if key == "" {
			keys := scanKeys(t, r, "sluice:v1:"+zone+":{*}:slots")
			if len(keys) != 1 {
				t.Fatalf("slots keys in Redis: %v, want one", keys)
			}
			key = keys[0]
		}
		var refused, other int
		for i := range 50 {
			select {
			case res := <-out:
				switch {
				case res.err == nil && res.code == http.StatusTooManyRequests && res.decided():
					refused++
					if ra := retryAfter(res); ra < 1 || ra > 60 {
						t.Errorf("round %d: Retry-After %q, want 1..60", round, res.header.Get("Retry-After"))
					}
					if got := res.header.Get("X-Ratelimit-Limit"); got != "10" {
						t.Errorf("round %d: X-RateLimit-Limit %q, want 10", round, got)
					}
				default:
					other++
					t.Errorf("round %d: %s while 10 were held, want 429 decided by Redis", round, res)
				}
			case <-time.After(20 * time.Second):
				t.Fatalf("round %d: %d answers of 50 while 10 were held", round, i)
			}
		}
		inFlight, peak, inRedis := up.inFlight.Load(), up.peak.Load(), liveSlots(t, r, key)
		if inFlight != 10 || peak != 10 || refused != 50 || inRedis != 10 {
			t.Fatalf("round %d: %d in flight at the upstream (peak %d), %d refused, %d other, %d leases in Redis; want exactly 10, 10, 50, 0, 10",
				round, inFlight, peak, refused, other, inRedis)
		}
		up.releaseAll()
		released := time.Now()
		for range 10 {
			if res := <-out; res.err != nil || res.code != 200 || !res.decided() {
				t.Fatalf("round %d: a held request ended with %s, want 200", round, res)
			}
		}
		waitSlots(t, r, key, 0, 5*time.Second)
		releases = append(releases, time.Since(released))
	}
	t.Logf("10 rounds of 60 clients on 3 processes against concurrent 10: exactly 10 in flight and 50 refused each time; slots back in Redis at most %v after the release (its 10 responses included)", longest(releases))
	for _, p := range procs {
		if got := metricSum(t, p, "caddy_rate_limit_concurrent_slots", `zone="`+zone+`"`); got != 0 {
			t.Errorf("caddy %s: concurrent_slots %v after every request ended, want 0", p.name, got)
		}
	}
}

// longest returns the largest of ds.
func longest(ds []time.Duration) time.Duration {
	var m time.Duration
	for _, d := range ds {
		m = max(m, d)
	}
	return m.Round(time.Millisecond)
}

// TestSlotsFleetCrash: `kill -9` of an instance holding 4 of 10 slots.
// Its leases are not renewed: the slots come back when they expire
// (`lease 4s` after their admission), not before; meanwhile the other
// instances, whose own 3 requests' leases are renewed, keep exact counts.
func TestSlotsFleetCrash(t *testing.T) {
	r := redistest.Start(t)
	up := newSlotUpstream(t)
	const zone = "slots_crash"
	const lease = 4 * time.Second
	routes := slotsRoutes(zone, up.addr(), "\t\tlease 4s\n", "store redis "+r.URL()+" {\n\t\ttimeout 250ms\n\t}")
	procs := make([]*caddyProc, 3)
	for i := range procs {
		procs[i] = startCaddy(t, fmt.Sprintf("%s-%d", zone, i), "", routes)
	}
	c := newClient(64)
	defer c.CloseIdleConnections()
	user := "crash-" + nonce
	slotsKey := func() string {
		keys := scanKeys(t, r, "sluice:v1:"+zone+":{*}:slots")
		if len(keys) != 1 {
			t.Fatalf("slots keys %v, want one", keys)
		}
		return keys[0]
	}
	// burstOf sends n requests at once through ps and returns how many
	// the upstream holds (admitted) and how many were refused, once the
	// refusals have had 700ms to come back.
	burstOf := func(n int, ps ...*caddyProc) (admitted, refused int) {
		t.Helper()
		answers := make(chan result, n)
		for i := range n {
			go func() { answers <- send(c, ps[i%len(ps)].url("/hold"), "X-User: "+user) }()
		}
		deadline := time.After(700 * time.Millisecond)
	collect:
		for refused < n {
			select {
			case res := <-answers:
				if res.err != nil || res.code != http.StatusTooManyRequests || !res.decided() {
					t.Fatalf("a request answered %s, want 429 decided by Redis (or held)", res)
				}
				refused++
			case <-deadline:
				break collect
			}
		}
		for {
			select {
			case <-up.arrived:
				admitted++
				continue
			default:
			}
			break
		}
		if admitted+refused != n {
			t.Fatalf("of %d requests %d reached the upstream and %d were refused; the others neither", n, admitted, refused)
		}
		return admitted, refused
	}

	up.hold()
	sent := time.Now()
	for range 4 {
		sendHeld(c, procs[0], "/hold", user)
	}
	up.waitArrived(t, 4, 5*time.Second)
	arrived := time.Now()
	for range 3 {
		sendHeld(c, procs[1], "/hold", user)
	}
	up.waitArrived(t, 3, 5*time.Second)
	key := slotsKey()
	if n := liveSlots(t, r, key); n != 7 {
		t.Fatalf("%d leases in Redis, want 7", n)
	}
	// kill -9, well before the leases' first renewal (at half the lease).
	if err := procs[0].cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-procs[0].done
	killed := time.Now()
	t.Logf("killed %s %v after its requests were sent", procs[0].name, killed.Sub(sent).Round(time.Millisecond))
	if killed.Sub(sent) > lease/2 {
		t.Skipf("the machine took %v to get here: the dead instance may have renewed its leases", killed.Sub(sent))
	}

	// Meanwhile: 7 slots taken (4 of them the dead instance's), so exactly
	// 3 of 20 get in through the living instances.
	admitted, refused := burstOf(20, procs[1], procs[2])
	if admitted != 3 || refused != 17 {
		t.Fatalf("after the crash: %d admitted, %d refused; want exactly 3 and 17 (4 slots still the dead instance's)", admitted, refused)
	}
	// Not before the lease: all 10 slots stay taken until then.
	time.Sleep(time.Until(sent.Add(lease - 500*time.Millisecond)))
	if n := liveSlots(t, r, key); n != 10 {
		t.Fatalf("%v after the crash: %d live leases, want 10", time.Since(killed).Round(time.Millisecond), n)
	}
	burstAt := time.Since(sent)
	if admitted, refused := burstOf(10, procs[1], procs[2]); admitted != 0 || refused != 10 {
		t.Fatalf("%v after the dead instance's admissions (before their lease of %v): %d admitted, %d refused; want 0 and 10",
			burstAt.Round(time.Millisecond), lease, admitted, refused)
	}
	// After the lease: the dead instance's 4 slots come back, and only
	// they (the living instances' 6 were renewed).
	time.Sleep(time.Until(arrived.Add(lease + 300*time.Millisecond)))
	if n := liveSlots(t, r, key); n != 6 {
		t.Fatalf("%v after the dead instance's admissions: %d live leases, want 6 (its 4 expired, the others renewed)", time.Since(sent).Round(time.Millisecond), n)
	}
	backAt := time.Since(sent)
	admitted, refused = burstOf(20, procs[1], procs[2])
	if admitted != 4 || refused != 16 {
		t.Fatalf("after the lease: %d admitted, %d refused; want exactly 4 and 16", admitted, refused)
	}
	t.Logf("the dead instance's 4 slots: still taken %v after their admission, back at %v (lease %v); the living instances' 6 leases renewed throughout",
		burstAt.Round(time.Millisecond), backAt.Round(time.Millisecond), lease)
	up.releaseAll()
	waitSlots(t, r, key, 0, 5*time.Second)
}

// outageSlotsRoutes: one concurrency zone per fail policy, by path, on one
// Redis store with its default timeout and grace.
const outageSlotsRoutes = `rate_limit {
	zone slots_out_closed {
		key {http.request.header.X-User}
		concurrent 2
		match {
			path /closed/*
		}
		fail closed
	}
	zone slots_out_local {
		key {http.request.header.X-User}
		concurrent 2
		match {
			path /local/*
		}
		fail local
	}
	zone slots_out_open {
		key {http.request.header.X-User}
		concurrent 2
		match {
			path /open/*
		}
	}
	store redis %s
}
reverse_proxy %s`

// TestSlotsFleetRedisOutage: Redis killed, then stalled, under concurrency
// zones: no 5xx but the fail-closed 503, no decision waiting past the
// timeout plus the late-reply grace, `fail local` counting slots exactly in
// memory, and no slot left held in memory afterwards. A slot taken in
// Redis before the kill and released during it is released once Redis is
// back (the release is retried), long before its lease.
func TestSlotsFleetRedisOutage(t *testing.T) {
	r := redistest.Start(t, "appendonly yes", "appendfsync always")
	up := newSlotUpstream(t)
	p := startCaddy(t, "slots-outage", "", fmt.Sprintf(outageSlotsRoutes, r.URL(), up.addr()))
	c := newClient(32)
	defer c.CloseIdleConnections()
	user := func(k string) string { return k + "-" + nonce }

	// Before: one request held in the fail-local zone, decided by Redis.
	up.hold()
	before := sendHeld(c, p, "/local/x", user("pre"))
	up.waitArrived(t, 1, 5*time.Second)
	preKeys := scanKeys(t, r, "sluice:v1:slots_out_local:{*}:slots")
	if len(preKeys) != 1 || liveSlots(t, r, preKeys[0]) != 1 {
		t.Fatalf("before the outage: slots keys %v, want one with one lease", preKeys)
	}

	phase := func(t *testing.T, what string) {
		// Decisions answered at once: closed 503, open 200 unmetered.
		for i := range 4 {
			res := mustGet(t, c, p.url("/closed/x"), "X-User: "+user(what+"c"+strconv.Itoa(i)))
			expectCode(t, res, http.StatusServiceUnavailable, what+": fail closed")
			if res.dur > decisionBudget {
				t.Errorf("%s: fail closed took %v, want at most %v", what, res.dur, decisionBudget)
			}
		}
		// Fail local: exactly 2 of 5 held at once, in this instance's memory;
		// the others refused.
		up.hold()
		base := up.inFlight.Load()
		t0 := time.Now()
		var hs []held
		for range 5 {
			hs = append(hs, sendHeld(c, p, "/local/y", user(what+"L")))
		}
		up.waitArrived(t, 2, 5*time.Second)
		if d := time.Since(t0); d > decisionBudget {
			t.Errorf("%s: fail local: the admitted requests reached the upstream after %v, want at most %v", what, d, decisionBudget)
		}
		refused := 0
		var pending []held
		for _, h := range hs {
			select {
			case res := <-h.done:
				if res.err != nil || res.code != http.StatusTooManyRequests {
					t.Errorf("%s: fail local: %s, want 429 (or held)", what, res)
					continue
				}
				if res.dur > decisionBudget {
					t.Errorf("%s: fail local refusal took %v, want at most %v", what, res.dur, decisionBudget)
				}
				refused++
			case <-time.After(time.Second):
				pending = append(pending, h)
			}
		}
		if got := up.inFlight.Load() - base; got != 2 || refused != 3 {
			t.Errorf("%s: fail local: %d held at the upstream, %d refused; want exactly 2 and 3", what, got, refused)
		}
		if got := metricSum(t, p, "caddy_rate_limit_concurrent_slots", `zone="slots_out_local"`); got != 2 {
			t.Errorf("%s: concurrent_slots{slots_out_local} %v, want 2", what, got)
		}
		// Fail open: passes, unmetered, held as long as the upstream holds.
		t1 := time.Now()
		for range 3 {
			pending = append(pending, sendHeld(c, p, "/open/z", user(what+"O")))
		}
		up.waitArrived(t, 3, 5*time.Second)
		if d := time.Since(t1); d > decisionBudget {
			t.Errorf("%s: fail open: the requests reached the upstream after %v, want at most %v", what, d, decisionBudget)
		}
		t.Logf("%s: decisions in %v", what, time.Since(t0).Round(time.Millisecond))
		up.releaseAll()
		for _, h := range pending {
			if res := <-h.done; res.err != nil || res.code != 200 {
				t.Errorf("%s: a held request ended with %s, want 200", what, res)
			}
		}
		// The releases follow the responses: poll, within a bound.
		for _, z := range []string{"slots_out_local", "slots_out_open", "slots_out_closed"} {
			var got float64
			waitFor(2*time.Second, func() bool {
				got = metricSum(t, p, "caddy_rate_limit_concurrent_slots", `zone="`+z+`"`)
				return got == 0
			})
			if got != 0 {
				t.Errorf("%s: concurrent_slots{%s} %v 2 s after every request ended, want 0 (a slot left in memory)", what, z, got)
			}
		}
	}

	r.Stop()
	// The request held before the outage ends now: its release fails.
	up.releaseAll()
	if res := <-before.done; res.err != nil || res.code != 200 {
		t.Fatalf("the request held before the outage: %s", res)
	}
	t.Run("killed", func(t *testing.T) { phase(t, "killed") })
	r.Restart(t)
	took := waitSlots(t, r, preKeys[0], 0, 15*time.Second)
	t.Logf("the release that failed during the outage reached Redis %v after its restart (lease 1m)", took.Round(time.Millisecond))

	// Stalled: Redis accepts and never answers.
	waitFor(5*time.Second, func() bool {
		res := send(c, p.url("/local/probe"), "X-User: "+user("probe"))
		return res.err == nil && res.decided()
	})
	r.Freeze(t)
	t.Run("stalled", func(t *testing.T) { phase(t, "stalled") })
	r.Thaw(t)
	if lines, suppressed, _ := p.storeFailures(); lines == 0 {
		t.Errorf("no store failure logged during the outage (%d suppressed)", suppressed)
	}
}
