package fleet_test

import (
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// countFleet starts 3 Caddy processes sharing one Redis, each with a zone
// of events 5 counting 401 only, keyed on the account, in front of app.
func countFleet(t *testing.T, name, zone string, app *loginUpstream) []*caddyProc {
	r := redistest.Start(t)
	routes := fmt.Sprintf(`rate_limit {
	zone %s {
		key {http.request.header.X-User}
		events 5
		window 1h
		count 401
	}
	store redis %s {
		timeout 250ms
	}
}
reverse_proxy %s`, zone, r.URL(), app.Listener.Addr().String())
	procs := make([]*caddyProc, 3)
	for i := range procs {
		procs[i] = startCaddy(t, fmt.Sprintf("%s-%d", name, i), "", routes)
	}
	return procs
}

// loginBurst sends n logins at once, spread over procs, with a client
// timeout.
func loginBurst(procs []*caddyProc, n int, timeout time.Duration, headers ...string) []result {
	client := newClient(n)
	client.Timeout = timeout
	defer client.CloseIdleConnections()
	results := make([]result, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			results[i] = send(client, procs[i%len(procs)].url("/login"), headers...)
		}()
	}
	close(start)
	wg.Wait()
	return results
}

// Charges in flight across a fleet: 10 concurrent right-password logins of
// one account (events 5, count 401) over 3 processes all pass: those
// refused only because of the charges in flight (on any process) wait for
// them. 50 concurrent wrong passwords still reach the application exactly
// 5 times.
func TestCountFleetInFlightWaits(t *testing.T) {
	app := newLoginUpstream(t, 300*time.Millisecond)
	procs := countFleet(t, "inflight", "inflight_fleet", app)
	owner := "owner-" + nonce
	if tl := tally(loginBurst(procs, 10, 10*time.Second, "X-User: "+owner, "X-Password: right")); tl["200"] != 10 {
		t.Fatalf("10 concurrent right-password logins over 3 processes: %v; want 10 × 200", tl)
	}
	victim := "victim-" + nonce
	tl := tally(loginBurst(procs, 50, 10*time.Second, "X-User: "+victim, "X-Password: wrong"))
	if app.saw(victim) != 5 || tl["401"] != 5 || tl["429"] != 45 {
		t.Fatalf("50 concurrent wrong passwords: the upstream saw %d; outcomes %v; want exactly 5 (401) and 45 (429)", app.saw(victim), tl)
	}
}

// Hanging up keeps the charge across a fleet: ten guesses whose clients
// leave (0.8 s) before the application answers (1 s). Five reach it and
// keep their charges; the key is spent.
func TestCountFleetHangUpKeepsCharge(t *testing.T) {
	app := newLoginUpstream(t, time.Second)
	procs := countFleet(t, "hangup", "hangup_fleet", app)
	user := "hangup-" + nonce
	for i, res := range loginBurst(procs, 10, 800*time.Millisecond, "X-User: "+user, "X-Password: wrong") {
		if res.err == nil {
			t.Errorf("guess %d: answered %d before the client left", i, res.code)
		}
	}
	time.Sleep(1500 * time.Millisecond) // the application answers after 1 s
	if got := app.saw(user); got != 5 {
		t.Fatalf("the application saw %d guesses, want exactly 5", got)
	}
	for _, p := range procs {
		if m := peekKey(t, p, "hangup_fleet", user); m["remaining"] != float64(0) {
			t.Fatalf("%s: the key after ten guesses that hung up: %v; want remaining 0 (five charges kept)", p.name, m)
		}
	}
	if res := send(newClient(1), procs[1].url("/login"), "X-User: "+user, "X-Password: right"); res.code != http.StatusTooManyRequests {
		t.Fatalf("the next login: %v, want 429", res)
	}
}
