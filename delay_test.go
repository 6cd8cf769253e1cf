package sluice

import (
	"context"
	"errors"
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

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// arrival is what the application saw of a request that reached it.
type arrival struct {
	at    time.Time
	delay string // {http.rate_limit.delay}
	id    int
}

// recordingApp records every request's arrival and delay placeholder.
type recordingApp struct {
	mu  sync.Mutex
	got []arrival
}

func (a *recordingApp) ServeHTTP(w http.ResponseWriter, r *http.Request) error {
	repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	id, _ := strconv.Atoi(r.Header.Get("X-Id"))
	a.mu.Lock()
	a.got = append(a.got, arrival{at: time.Now(), delay: repl.ReplaceAll("{http.rate_limit.delay}", ""), id: id})
	a.mu.Unlock()
	w.WriteHeader(200)
	return nil
}

// burst sends n concurrent requests for one key through h to next and
// returns their responses by id.
func burst(t *testing.T, h *Handler, next caddyhttp.Handler, n int) []*httptest.ResponseRecorder {
	t.Helper()
	out := make([]*httptest.ResponseRecorder, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			w, err := serveNext(t, h, next, map[string]string{"X-User": "bursty", "X-Id": strconv.Itoa(i)})
			if err != nil {
				t.Errorf("request %d: %v", i, err)
			}
			out[i] = w
		}()
	}
	close(start)
	wg.Wait()
	return out
}

// The shaping test, with the memory store on a clock that stands
// still (so every wait is exact): events 10, window 1s, burst 1, delay 3s;
// 40 concurrent requests of one key: 31 admitted (the one at once, then 30
// spaced 100 ms apart, the last after 3 s), reaching the application in
// that order, and 9 refused with Retry-After.
func TestDelayShapesABurst(t *testing.T) {
	clock := &fakeClock{ms: 1_800_000_000_000}
	h := newHandler(t, `rate_limit {
		zone shape {
			key {http.request.header.X-User}
			events 10
			window 1s
			burst 1
			delay 3s
		}
	}`, clock)
	app := &recordingApp{}
	t0 := time.Now()
	out := burst(t, h, app, 40)
	refused := 0
	for i, w := range out {
		switch w.Code {
		case 200:
		case 429:
			refused++
			if ra, _ := strconv.Atoi(w.Header().Get("Retry-After")); ra < 1 {
				t.Errorf("request %d refused without Retry-After: %v", i, w.Header())
			}
		default:
			t.Errorf("request %d: status %d", i, w.Code)
		}
	}
	if len(app.got) != 31 || refused != 9 {
		t.Fatalf("40 concurrent requests: %d admitted, %d refused; want 31 and 9", len(app.got), refused)
	}
	var delays []int
	swapped := 0
	for i, a := range app.got {
		d := 0
		if a.delay != "" {
			d, _ = strconv.Atoi(a.delay)
		}
		delays = append(delays, d)
		if i > 0 && d < delays[i-1] {
			swapped++
		}
		// Each arrives no sooner than its wait (and, loosely, not much
		// later: the machine may be loaded).
		if el := a.at.Sub(t0); el < time.Duration(d)*time.Millisecond {
			t.Errorf("arrival %d after %v, before its wait of %d ms", i, el, d)
		}
	}
	// The waits are exact (the store's clock stands still); the order in
	// which the timers wake the waiters is the scheduler's, and a loaded
	// machine may wake two waiters 100 ms apart out of order: at most a few.
	if swapped > 3 {
		t.Errorf("the waits, in arrival order: %v; %d out of order", delays, swapped)
	}
	slices.Sort(delays)
	want := make([]int, 31)
	for k := range want {
		want[k] = 100 * k
	}
	if !slices.Equal(delays, want) {
		t.Fatalf("the waits: %v; want 0, 100, …, 3000", delays)
	}
	if n := h.room.n.Load(); n != 0 {
		t.Errorf("%d places still held in the waiting room", n)
	}
}

// delay_after: the first n of a burst pass at once, the rest are spaced.
func TestDelayAfter(t *testing.T) {
	clock := &fakeClock{ms: 1_800_000_000_000}
	h := newHandler(t, `rate_limit {
		zone shape_after {
			key {http.request.header.X-User}
			events 20
			window 1s
			burst 10
			delay 300ms
			delay_after 4
		}
	}`, clock)
	app := &recordingApp{}
	out := burst(t, h, app, 20)
	var delays []string
	for _, a := range app.got {
		delays = append(delays, a.delay)
	}
	want := []string{"0", "0", "0", "0", "50", "100", "150", "200", "250", "300"}
	if !slices.Equal(delays, want) {
		t.Fatalf("the waits, in arrival order: %q; want 4 at once, then 50 ms apart up to 300", delays)
	}
	refused := 0
	for _, w := range out {
		if w.Code == 429 {
			refused++
		}
	}
	if refused != 10 {
		t.Fatalf("%d refused, want 10", refused)
	}
}

// max_waiting: a flood of 1,000 concurrent requests holds at most that
// many waiting; the others that cannot pass at once are refused; the
// goroutines go back to where they were.
func TestMaxWaiting(t *testing.T) {
	h := newHandler(t, `rate_limit {
		zone flood {
			key {http.request.header.X-User}
			events 20
			window 1s
			burst 1
			delay 10s
		}
		max_waiting 50
	}`, nil)
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
			default:
			}
			if n := h.room.n.Load(); n > most.Load() {
				most.Store(n)
			}
			runtime.Gosched()
		}
	}()
	app := &recordingApp{}
	out := burst(t, h, app, 1000)
	close(stop)
	<-sampled
	admitted, refused := 0, 0
	for _, w := range out {
		switch w.Code {
		case 200:
			admitted++
		case 429:
			refused++
		}
	}
	waited := 0
	for _, a := range app.got {
		if a.delay != "0" {
			waited++
		}
	}
	// (Without the cap, 200 would wait: 10 s at 20 per second.)
	if m := most.Load(); m > 50 || m < 40 {
		t.Fatalf("%d places held at once, max_waiting 50", m)
	}
	if admitted+refused != 1000 || waited < 40 || refused < 800 {
		t.Fatalf("admitted %d (%d after a wait), refused %d", admitted, waited, refused)
	}
	t.Logf("1,000 concurrent: %d admitted (%d after a wait), %d refused; at most %d waiting at once", admitted, waited, refused, most.Load())
	if n := h.room.n.Load(); n != 0 {
		t.Fatalf("%d places still held", n)
	}
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > baseline+2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if g := runtime.NumGoroutine(); g > baseline+2 {
		t.Fatalf("%d goroutines, %d before the flood", g, baseline)
	}
}

// A client that goes away while its request waits: the handler returns at
// once (a 499 error), the reservation is given back (the next request's
// turn is what it would have been without it), and the waiting room's
// place is freed.
func TestDelayClientGoesAway(t *testing.T) {
	clock := &fakeClock{ms: 1_800_000_000_000}
	h := newHandler(t, `rate_limit {
		zone gone {
			key {http.request.header.X-User}
			events 1
			window 1s
			burst 1
			delay 5s
		}
	}`, clock)
	app := &recordingApp{}
	serveCtx := func(ctx context.Context) (*httptest.ResponseRecorder, error) {
		r := httptest.NewRequest("GET", "/", nil).WithContext(ctx)
		r.Header.Set("X-User", "u")
		caddyhttp.NewTestReplacer(r)
		w := httptest.NewRecorder()
		return w, h.ServeHTTP(w, r, app)
	}
	if w, err := serveCtx(context.Background()); err != nil || w.Code != 200 {
		t.Fatalf("first: %d %v", w.Code, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	baseline := runtime.NumGoroutine()
	go func() {
		_, err := serveCtx(ctx)
		done <- err
	}()
	// Its turn is 1 s away (the clock is held still): cancel once it waits.
	for deadline := time.Now().Add(500 * time.Millisecond); h.room.n.Load() != 1 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	if h.room.n.Load() != 1 {
		t.Fatalf("the second request does not wait: %d waiting", h.room.n.Load())
	}
	t0 := time.Now()
	cancel()
	select {
	case err := <-done:
		var he caddyhttp.HandlerError
		if !errors.As(err, &he) || he.StatusCode != 499 {
			t.Fatalf("the departed request's handler returned %v, want a 499 error", err)
		}
		if d := time.Since(t0); d > 500*time.Millisecond {
			t.Fatalf("the handler returned %v after its client left, its turn was 1 s away", d)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("the handler kept waiting after its client left")
	}
	if len(app.got) != 1 {
		t.Fatalf("the departed request reached the application")
	}
	if h.room.n.Load() != 0 {
		t.Fatalf("its place in the waiting room was not freed")
	}
	// No goroutine is left behind (the one that served the request ends
	// just after it reported; other tests' goroutines come and go: poll).
	g := runtime.NumGoroutine()
	for deadline := time.Now().Add(2 * time.Second); g > baseline && time.Now().Before(deadline); g = runtime.NumGoroutine() {
		time.Sleep(5 * time.Millisecond)
	}
	if g > baseline {
		t.Errorf("%d goroutines 2 s after the request ended, %d before", g, baseline)
	}
	// Its reservation was given back: the next request waits 1 s, not 2 s.
	app.got = nil
	if w, err := serveCtx(context.Background()); err != nil || w.Code != 200 || len(app.got) != 1 || app.got[0].delay != "1000" {
		t.Fatalf("the next request: %d %v %+v; want a wait of 1000 ms", w.Code, err, app.got)
	}
}

// Configuration checks of delay, delay_after and max_waiting.
func TestDelayConfigErrors(t *testing.T) {
	for _, tc := range []struct{ block, want string }{
		{"algorithm sliding_window\n\t\t\tdelay 1s", "delay is only for token_bucket and gcra"},
		{"delay_after 2", "delay_after needs delay"},
		{"delay 1s\n\t\t\tdelay_after 6", "delay_after must be between 1 and the capacity 5"},
		{"delay 1500us", "delay must be a whole number of milliseconds"},
	} {
		h := new(Handler)
		block := "rate_limit {\n\t\tzone dcfg {\n\t\t\tevents 5\n\t\t\twindow 1m\n\t\t\t" + tc.block + "\n\t\t}\n\t}"
		// Refused by the Caddyfile adapter (which runs the load checks).
		err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(block))
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), `zone "dcfg"`) {
			t.Errorf("%q: error %v, want one naming the zone and %q", tc.block, err, tc.want)
		}
	}
	h := new(Handler)
	if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser("rate_limit {\n\tmax_waiting 0\n}")); err == nil || !strings.Contains(err.Error(), "max_waiting must be a positive integer") {
		t.Errorf("max_waiting 0: %v", err)
	}
}

// BenchmarkServeHTTPDelay compares, side by side, one zone as it is and the
// same zone with delay whose requests never need to wait (the cost of the
// waiting room on the requests that pass at once: a place taken and given
// back, the decision's instant, the delay placeholder):
//
//	go test -run XXX -bench ServeHTTPDelay -benchmem .
func BenchmarkServeHTTPDelay(b *testing.B) {
	for _, tc := range []struct{ name, delay string }{{"plain", ""}, {"delay", "delay 1s"}} {
		b.Run(tc.name, func(b *testing.B) {
			h := newHandler(b, `rate_limit {
				zone bench_delay_`+tc.name+` {
					key {http.request.header.X-User}
					events 1000000000
					window 1s
					`+tc.delay+`
				}
			}`, nil)
			benchServeAllowed(b, h)
		})
	}
}

// A report-only zone with delay reserves as enforcing would, and never
// holds a request up.
func TestDelayReportOnlyNeverWaits(t *testing.T) {
	clock := &fakeClock{ms: 1_800_000_000_000}
	h := newHandler(t, `rate_limit {
		zone dry_delay {
			key {http.request.header.X-User}
			events 10
			window 1s
			burst 1
			delay 3s
			report_only
		}
	}`, clock)
	app := &recordingApp{}
	t0 := time.Now()
	out := burst(t, h, app, 10)
	if d := time.Since(t0); d > time.Second {
		t.Fatalf("10 requests took %v: a report-only zone held them up", d)
	}
	for i, w := range out {
		if w.Code != 200 {
			t.Fatalf("request %d: %d", i, w.Code)
		}
	}
	for _, a := range app.got {
		if a.delay != "0" {
			t.Fatalf("a request waited %s ms", a.delay)
		}
	}
	// The zone's state is what enforcing would make it: 9 reservations.
	if d := peekZone(t, h, "dry_delay", "bursty"); d.ResetAfter != time.Second {
		t.Fatalf("the zone shows %+v; want its 10 charges (full in 1 s)", d)
	}
}
