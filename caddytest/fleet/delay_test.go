package fleet_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// shapeUpstream records the wait of every request it gets (X-Delay-Ms,
// from {http.rate_limit.delay}) and when it came.
type shapeUpstream struct {
	*httptest.Server
	mu    sync.Mutex
	waits []int
	ats   []time.Time
}

func newShapeUpstream(t *testing.T) *shapeUpstream {
	u := &shapeUpstream{}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d, _ := strconv.Atoi(r.Header.Get("X-Delay-Ms"))
		u.mu.Lock()
		u.waits = append(u.waits, d)
		u.ats = append(u.ats, time.Now())
		u.mu.Unlock()
		_, _ = w.Write([]byte("ok"))
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *shapeUpstream) take() ([]int, []time.Time) {
	u.mu.Lock()
	defer u.mu.Unlock()
	w, a := slices.Clone(u.waits), slices.Clone(u.ats)
	u.waits, u.ats = nil, nil
	return w, a
}

func shapeRoutes(zone, redisURL, upstream string) string {
	return fmt.Sprintf(`rate_limit {
	zone %s {
		key {http.request.header.X-User}
		events 10
		window 1s
		burst 1
		delay 3s
	}
	store redis %s {
		timeout 250ms
	}
}
reverse_proxy %s {
	header_up X-Delay-Ms {http.rate_limit.delay}
}`, zone, redisURL, upstream)
}

// shapeRound sends 40 concurrent requests of one key, request i to
// procs[i%len(procs)], and checks the outcome: 31 admitted (one at
// once, 30 within 3 s, 100 ms apart, in order at the upstream: arrival k
// no sooner than k × 100 ms after the burst was sent, which is before the
// first decision the schedule counts from, and not much later), 9 refused
// with Retry-After.
func shapeRound(t *testing.T, client *http.Client, procs []*caddyProc, up *shapeUpstream, user string) {
	t.Helper()
	results := make([]result, 40)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			results[i] = send(client, procs[i%len(procs)].url("/"), "X-User: "+user)
		}()
	}
	sent := time.Now()
	close(start)
	wg.Wait()
	tl := tally(results)
	if tl["200"] != 31 || tl["429"] != 9 || len(tl) != 2 {
		t.Fatalf("40 concurrent over %d process(es): %v; want 31 × 200 and 9 × 429", len(procs), tl)
	}
	for i, r := range results {
		if r.code == 429 && retryAfter(r) != 1 {
			t.Errorf("refusal %d: Retry-After %q, want 1", i, r.header.Get("Retry-After"))
		}
	}
	waits, ats := up.take()
	if len(waits) != 31 {
		t.Fatalf("the upstream got %d, want 31", len(waits))
	}
	for k := range waits {
		turn := time.Duration(k) * 100 * time.Millisecond
		if k > 0 && waits[k] <= waits[k-1] {
			t.Errorf("arrival %d waited %d ms, after one that waited %d: out of order", k, waits[k], waits[k-1])
		}
		if w := time.Duration(waits[k]) * time.Millisecond; w > turn || w < turn-500*time.Millisecond {
			t.Errorf("arrival %d waited %v, want its turn %v after the first decision", k, w, turn)
		}
		// The waits are whole milliseconds, hence the 2 ms.
		if since := ats[k].Sub(sent); since < turn-2*time.Millisecond || since > turn+time.Second {
			t.Errorf("arrival %d came %v after the burst was sent, its turn is %v", k, since, turn)
		}
	}
	t.Logf("%d process(es): 31 admitted over %v, 9 refused; waits %v", len(procs), ats[30].Sub(ats[0]).Round(time.Millisecond), waits)
}

// The shaping test with Redis: events 10, window 1s, burst 1, delay
// 3s, 40 concurrent requests on one key: 31 admitted at 100 ms spacing, in
// order, 9 refused; one Caddy, then 3 Caddy processes sharing the Redis,
// which give the same totals and the same schedule (the reservations are
// made in Redis's one script call).
func TestDelayShapingRedis(t *testing.T) {
	r := redistest.Start(t)
	up := newShapeUpstream(t)
	client := newClient(60)
	defer client.CloseIdleConnections()

	one := startCaddy(t, "shape-1", "", shapeRoutes("shape_one", r.URL(), up.Listener.Addr().String()))
	shapeRound(t, client, []*caddyProc{one}, up, "one-"+nonce)

	procs := make([]*caddyProc, 3)
	for i := range procs {
		procs[i] = startCaddy(t, fmt.Sprintf("shape-3-%d", i), "", shapeRoutes("shape_fleet", r.URL(), up.Listener.Addr().String()))
	}
	for round := range 2 {
		shapeRound(t, client, procs, up, fmt.Sprintf("fleet-%s-%d", nonce, round))
	}
}

// A shutdown while requests wait: Caddy lets them finish (they wait their
// turn, then go on: 200), and the process exits once they have, within
// the longest wait; no 5xx.
//
// The client closes its idle connections once every answer is in, as a
// client that is done does. Without that the stop can take 5 s for a
// reason outside Sluice: Go's transport sometimes dials a connection for a
// request that another, freed connection then serves, and keeps the new
// one idle without ever writing to it; net/http's Shutdown counts a
// connection that has not sent a request as active until it is 5 s old
// (seen on a loaded machine, the goroutine dump showing the server's
// reader waiting for that connection's first bytes).
func TestDelayShutdownWhileWaiting(t *testing.T) {
	r := redistest.Start(t)
	up := newShapeUpstream(t)
	p := startCaddy(t, "shape-stop", "", shapeRoutes("shape_stop", r.URL(), up.Listener.Addr().String()))
	client := newClient(30)
	defer client.CloseIdleConnections()
	results := make([]result, 20)
	var wg sync.WaitGroup
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = send(client, p.url("/"), "X-User: stop-"+nonce)
		}()
	}
	time.Sleep(300 * time.Millisecond) // most are waiting (turns up to 1.9 s)
	t0 := time.Now()
	var stopped time.Duration
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		p.stop()
		stopped = time.Since(t0)
	}()
	wg.Wait()
	client.CloseIdleConnections()
	<-exited
	tl := tally(results)
	for code, n := range tl {
		if c, err := strconv.Atoi(code); err == nil && c >= 500 {
			t.Errorf("%d answers %s while shutting down", n, code)
		}
	}
	if stopped > 4*time.Second {
		dump := ""
		if p.dumped {
			dump = "; its goroutines then:\n" + p.goroutineDump()
		}
		t.Errorf("caddy took %v to stop with requests waiting (the longest wait is under 2 s)%s", stopped, dump)
	}
	t.Logf("shutdown with 20 requests waiting: %v; caddy stopped in %v", tl, stopped.Round(time.Millisecond))
	if tl["200"] != 20 {
		t.Errorf("%v; want every waiting request to finish its wait and be answered", tl)
	}
}
