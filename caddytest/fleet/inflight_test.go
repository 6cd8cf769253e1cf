package fleet_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// countFleet starts 3 Caddy processes sharing one Redis, each with a zone
// of events 5 counting 401 only, keyed on the account, in front of app; a
// request refused only for charges in flight waits for them up to 5 s.
func countFleet(t *testing.T, name, zone string, app *loginUpstream) []*caddyProc {
	r := redistest.Start(t)
	routes := fmt.Sprintf(`rate_limit {
	zone %s {
		key {http.request.header.X-User}
		events 5
		window 1h
		count 401
	}
	settle_wait 5s
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

// Charges in flight across a fleet: 10 concurrent right-password logins of
// one account (events 5, count 401) over 3 processes, four times, all pass:
// those
// refused only because of the charges in flight (on any process) wait for
// them. (Wrong passwords still reach the application exactly 5 times:
// TestCountFleetConcurrentLogins.)
func TestCountFleetInFlightWaits(t *testing.T) {
	app := newLoginUpstream(t, 300*time.Millisecond)
	procs := countFleet(t, "inflight", "inflight_fleet", app)
	client := newClient(10)
	defer client.CloseIdleConnections()
	for round := range 4 {
		if tl := tally(burst(t, client, procs, "/login", 10, "owner-"+nonce, "X-Password: right")); tl["200"] != 10 {
			t.Fatalf("round %d: 10 concurrent right-password logins over 3 processes: %v; want 10 × 200", round, tl)
		}
	}
}

// Hanging up keeps the charge across a fleet: ten guesses whose clients
// leave (1.5 s) before the application answers (2 s). Five reach it and
// keep their charges; the key is spent. (Every guess must arrive before the
// first five hang up, else it is refused at once, rightly: 1.5 s leaves a
// loaded machine room; 0.8 s did not, once in CI.)
func TestCountFleetHangUpKeepsCharge(t *testing.T) {
	app := newLoginUpstream(t, 2*time.Second)
	procs := countFleet(t, "hangup", "hangup_fleet", app)
	user := "hangup-" + nonce
	client := newClient(10)
	client.Timeout = 1500 * time.Millisecond
	defer client.CloseIdleConnections()
	for i, res := range burst(t, client, procs, "/login", 10, user, "X-Password: wrong") {
		if res.err == nil {
			t.Errorf("guess %d: answered %d before the client left", i, res.code)
		}
	}
	time.Sleep(2500 * time.Millisecond) // the application answers after 2 s
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
