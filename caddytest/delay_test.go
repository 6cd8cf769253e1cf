package caddytest_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// arrivalLog is a stand-in application that records the wait of every
// request it gets (X-Delay-Ms, passed by header_up from
// {http.rate_limit.delay}).
type arrivalLog struct {
	*httptest.Server
	mu    sync.Mutex
	waits []int
	ats   []time.Time
}

// scheduleSlack is how much sooner than its turn an arrival may come: the
// waits are whole milliseconds.
const scheduleSlack = 2 * time.Millisecond

func newArrivalLog(t *testing.T) *arrivalLog {
	a := &arrivalLog{}
	a.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d, _ := strconv.Atoi(r.Header.Get("X-Delay-Ms"))
		a.mu.Lock()
		a.waits = append(a.waits, d)
		a.ats = append(a.ats, time.Now())
		a.mu.Unlock()
		_, _ = w.Write([]byte("ok"))
	}))
	t.Cleanup(a.Close)
	return a
}

func (a *arrivalLog) snapshot() ([]int, []time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.waits), slices.Clone(a.ats)
}

// checkShaped checks the shaping outcome on the waits and arrival
// instants the application saw: n admitted, one at once and then one
// every step, in order. Arrival k comes no sooner than k steps after sent
// (an instant before the burst was sent, so before the first decision,
// which the schedule counts from: no allowance needed for the first
// request's own latency) and not much later.
func checkShaped(t *testing.T, waits []int, ats []time.Time, sent time.Time, n int, step time.Duration) {
	t.Helper()
	if len(waits) != n {
		t.Fatalf("the application got %d requests, want %d", len(waits), n)
	}
	for k := range waits {
		turn := time.Duration(k) * step
		if k > 0 && waits[k] <= waits[k-1] {
			t.Errorf("arrival %d waited %d ms, after one that waited %d: out of order", k, waits[k], waits[k-1])
		}
		if w := time.Duration(waits[k]) * time.Millisecond; w > turn || w < turn-500*time.Millisecond {
			t.Errorf("arrival %d waited %v, want its turn %v after the first decision", k, w, turn)
		}
		if since := ats[k].Sub(sent); since < turn-scheduleSlack || since > turn+time.Second {
			t.Errorf("arrival %d came %v after the burst was sent, its turn is %v", k, since, turn)
		}
	}
}

// The shaping test with the memory store, through a real Caddy:
// events 10, window 1s, burst 1, delay 3s, 40 concurrent requests on one
// key: 31 admitted (the one at once and 30 within 3 s, 100 ms apart, in
// order), 9 refused with Retry-After. And delay_after: the first 4 of a
// burst at once, the rest spaced.
func TestDelayShapingMemory(t *testing.T) {
	app := newArrivalLog(t)
	zone, after := zoneName("shape"), zoneName("shape_after")
	load(t, newTester(t), config("", `
http://localhost:@A@ {
	route /shape {
		rate_limit {
			zone @ZONE@ {
				key {http.request.header.X-User}
				events 10
				window 1s
				burst 1
				delay 3s
			}
		}
		reverse_proxy @APP@ {
			header_up X-Delay-Ms {http.rate_limit.delay}
		}
	}
	route /after {
		rate_limit {
			zone @AFTER@ {
				key {http.request.header.X-User}
				events 20
				window 1s
				burst 10
				delay 300ms
				delay_after 4
			}
		}
		reverse_proxy @APP@ {
			header_up X-Delay-Ms {http.rate_limit.delay}
		}
	}
}`, "ZONE", zone, "AFTER", after, "APP", app.Listener.Addr().String()))
	c := loopbackClient(64)
	sent := time.Now()
	out, _ := burstDo(t, c, http.MethodGet, siteA+"/shape", 40, 40, "X-User: shaped-"+nonce)
	ok, refused := countBurst(t, out, "40 at once")
	for i, o := range out {
		if o.code == http.StatusTooManyRequests {
			expectRetryAfter(t, result{code: o.code, header: o.header}, 1, 1, "refusal "+strconv.Itoa(i))
		}
	}
	if ok != 31 || refused != 9 {
		t.Fatalf("40 at once: %d admitted, %d refused; want 31 and 9", ok, refused)
	}
	waits, ats := app.snapshot()
	checkShaped(t, waits, ats, sent, 31, 100*time.Millisecond)
	t.Logf("31 admitted over %v, waits %v", ats[30].Sub(ats[0]).Round(time.Millisecond), waits)

	app.mu.Lock()
	app.waits, app.ats = nil, nil
	app.mu.Unlock()
	out, _ = burstDo(t, c, http.MethodGet, siteA+"/after", 20, 20, "X-User: after-"+nonce)
	if ok, refused := countBurst(t, out, "delay_after"); ok != 10 || refused != 10 {
		t.Fatalf("delay_after: %d admitted, %d refused; want 10 and 10", ok, refused)
	}
	waits, _ = app.snapshot()
	if !slices.Equal(waits[:4], []int{0, 0, 0, 0}) {
		t.Fatalf("delay_after 4: the first waits %v, want 4 at once", waits)
	}
	for k := 4; k < 10; k++ {
		if turn := 50 * (k - 3); waits[k] > turn || waits[k] < turn-200 || waits[k] <= waits[k-1] {
			t.Fatalf("delay_after 4: waits %v; want 4 at once, then 50 ms apart", waits)
		}
	}
}

// gauge reads an unlabelled gauge of the admin endpoint's /metrics.
func gauge(t *testing.T, name string) float64 {
	t.Helper()
	resp, err := http.Get(adminURL + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%q: %v", line, err)
			}
			return f
		}
	}
	return 0
}

// max_waiting through a real Caddy: a flood of 1,000 concurrent requests
// on one key holds at most max_waiting waiting at once (the
// caddy_rate_limit_waiting gauge, sampled throughout); the others that
// cannot pass at once are refused; the process's goroutines go back to
// their baseline afterwards.
func TestMaxWaitingFlood(t *testing.T) {
	zone := zoneName("flood")
	load(t, newTester(t), config("", `
http://localhost:@A@ {
	rate_limit {
		zone @ZONE@ {
			key {http.request.header.X-User}
			events 20
			window 1s
			burst 1
			delay 10s
		}
		max_waiting 50
	}
	respond "ok"
}`, "ZONE", zone))
	c := loopbackClient(1000)
	_ = get(t, c, siteA+"/", "X-User: warm-"+nonce)
	c.CloseIdleConnections()
	time.Sleep(200 * time.Millisecond)
	baseline := runtime.NumGoroutine()
	var most atomic.Int64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			if n := int64(gauge(t, "caddy_rate_limit_waiting")); n > most.Load() {
				most.Store(n)
			}
		}
	}()
	out, took := burstDo(t, c, http.MethodGet, siteA+"/", 1000, 1000, "X-User: flood-"+nonce)
	close(stop)
	<-sampled
	ok, refused := countBurst(t, out, "1,000 at once")
	if m := most.Load(); m > 50 || m < 10 {
		t.Fatalf("the gauge showed at most %d waiting; max_waiting is 50 (and the flood should reach it)", m)
	}
	if ok+refused != 1000 || refused < 800 {
		t.Fatalf("1,000 at once: %d admitted, %d refused", ok, refused)
	}
	t.Logf("1,000 at once: %d admitted, %d refused in %v; the gauge peaked at %d waiting", ok, refused, took.Round(time.Millisecond), most.Load())
	c.CloseIdleConnections()
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > baseline+5 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if g := runtime.NumGoroutine(); g > baseline+5 {
		t.Fatalf("%d goroutines, %d before the flood", g, baseline)
	}
	if g := gauge(t, "caddy_rate_limit_waiting"); g != 0 {
		t.Fatalf("%v still waiting", g)
	}
}

// turnsSite is a site whose requests of one X-User wait their turns a
// second apart (up to 5 s), then go to the application @APP@.
const turnsSite = `
http://localhost:@A@ {
	rate_limit {
		zone @ZONE@ {
			key {http.request.header.X-User}
			events 1
			window 1s
			burst 1
			delay 5s
		}
	}
	reverse_proxy @APP@ {
		header_up X-Delay-Ms {http.rate_limit.delay}
	}
}`

// A client that goes away while its request waits: the server stops
// waiting at once (the gauge drops, the abandoned counter counts it), the
// request never reaches the application, and its reservation is given
// back (the next request's turn is within 1 s, not after 5).
func TestDelayClientDisconnect(t *testing.T) {
	app := newArrivalLog(t)
	zone := zoneName("disconnect")
	load(t, newTester(t), config("", turnsSite, "ZONE", zone, "APP", app.Listener.Addr().String()))
	c := loopbackClient(4)
	user := "X-User: gone-" + nonce
	expect(t, get(t, c, siteA+"/", user), 200, "the first")
	// Four wait: their turns are 1, 2, 3 and 4 s away.
	ctx, cancel := context.WithCancel(context.Background())
	errs := make(chan error, 4)
	for range 4 {
		go func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, siteA+"/", nil)
			req.Header.Set("X-User", "gone-"+nonce)
			resp, err := c.Do(req)
			if err == nil {
				resp.Body.Close()
			}
			errs <- err
		}()
	}
	if _, ok := waitForCond(2*time.Second, func() bool { return gauge(t, "caddy_rate_limit_waiting") == 4 }); !ok {
		t.Fatalf("the 4 requests do not wait: gauge %v", gauge(t, "caddy_rate_limit_waiting"))
	}
	abandoned := scrapeMetric(t, "caddy_rate_limit_delay_abandoned_total", `zone="`+zone+`"`)
	cancel()
	for range 4 {
		<-errs
	}
	d, ok := waitForCond(2*time.Second, func() bool { return gauge(t, "caddy_rate_limit_waiting") == 0 })
	if !ok {
		t.Fatalf("the server kept waiting after its clients left")
	}
	t.Logf("the server stopped waiting %v after the clients left", d.Round(time.Millisecond))
	if got := scrapeMetric(t, "caddy_rate_limit_delay_abandoned_total", `zone="`+zone+`"`) - abandoned; got != 4 {
		t.Errorf("delay_abandoned_total counted %v, want 4", got)
	}
	waits, _ := app.snapshot()
	if len(waits) != 1 {
		t.Fatalf("the departed requests reached the application: %v", waits)
	}
	// Their reservations were given back: 4 s of turns freed. The next
	// request waits at most 1 s (what is left of the first's slot).
	r := get(t, c, siteA+"/", user)
	waits, _ = app.snapshot()
	if r.code != 200 || len(waits) != 2 || waits[1] > 1000 {
		t.Fatalf("the next request: %d, waits %v; want a wait of at most 1 s", r.code, waits)
	}
}

// waitForCond polls cond every 20 ms until it holds or timeout passes.
func waitForCond(timeout time.Duration, cond func() bool) (time.Duration, bool) {
	t0 := time.Now()
	for {
		if cond() {
			return time.Since(t0), true
		}
		if time.Since(t0) > timeout {
			return time.Since(t0), false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A reload while requests wait: no hang, no 5xx. The waits end as they
// were scheduled (Caddy lets the old server's requests finish) and the
// requests go on.
func TestDelayReloadWhileWaiting(t *testing.T) {
	zone := zoneName("reload_wait")
	cfg := func(body string) string {
		return config("", `
http://localhost:@A@ {
	rate_limit {
		zone @ZONE@ {
			key {http.request.header.X-User}
			events 10
			window 1s
			burst 1
			delay 2s
		}
	}
	respond "@BODY@"
}`, "ZONE", zone, "BODY", body)
	}
	tc := newTester(t)
	load(t, tc, cfg("before"))
	c := loopbackClient(32)
	var out []burstOut
	done := make(chan struct{})
	t0 := time.Now()
	go func() {
		defer close(done)
		out, _ = burstDo(t, c, http.MethodGet, siteA+"/", 20, 20, "X-User: reload-"+nonce)
	}()
	time.Sleep(300 * time.Millisecond) // most are waiting
	load(t, tc, cfg("after"))
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("requests waiting across a reload never ended")
	}
	took := time.Since(t0)
	ok, refused := countBurst(t, out, "20 at once, reloaded meanwhile")
	if ok != 20 || refused != 0 {
		t.Fatalf("%d admitted, %d refused; want all 20 (19 waits within 2 s)", ok, refused)
	}
	if took > 5*time.Second {
		t.Fatalf("the burst took %v", took)
	}
	t.Logf("20 requests, reloaded after 300 ms: all answered in %v", took.Round(time.Millisecond))
}
