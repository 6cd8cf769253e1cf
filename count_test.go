package sluice

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/memstore"
)

// statusHandler answers with the status the request's X-Status header asks
// for (200 without one).
var statusHandler = caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
	code := 200
	if v := r.Header.Get("X-Status"); v != "" {
		fmt.Sscan(v, &code)
	}
	w.WriteHeader(code)
	return nil
})

// serveNext sends one request through h to next.
func serveNext(t testing.TB, h *Handler, next caddyhttp.Handler, hdr map[string]string) (*httptest.ResponseRecorder, error) {
	t.Helper()
	r := httptest.NewRequest("POST", "/login", nil)
	for k, v := range hdr {
		r.Header.Set(k, v)
	}
	caddyhttp.NewTestReplacer(r)
	w := httptest.NewRecorder()
	err := h.ServeHTTP(w, r, next)
	return w, err
}

// peekZone is the key's view in the handler's memory store (cost 1).
func peekZone(t testing.TB, h *Handler, zone, user string) algorithms.Decision {
	t.Helper()
	for _, z := range h.zones {
		if z.name != zone {
			continue
		}
		tok, _ := z.deriver.Derive(mapResolver{"http.request.header.X-User": user}, nil)
		d, _ := h.store.(*memstore.Store).Peek(zone, tok, z.limit)
		return d
	}
	t.Fatalf("no zone %s", zone)
	return algorithms.Decision{}
}

type mapResolver map[string]any

func (m mapResolver) Get(k string) (any, bool) { v, ok := m[k]; return v, ok }

// A count zone is charged only by the responses whose status it counts:
// the other requests' charges are given back, whatever gave the status
// (WriteHeader, a first Write, an error for handle_errors, a panic).
func TestCountChargesMatchingStatusesOnly(t *testing.T) {
	clock := &fakeClock{ms: 1_800_000_000_000}
	h := newHandler(t, `rate_limit {
		zone login {
			key {http.request.header.X-User}
			events 3
			window 1h
			count 401 403
		}
	}`, clock)
	good := map[string]string{"X-User": "good"}
	for i := range 100 {
		if w, err := serveNext(t, h, statusHandler, good); err != nil || w.Code != 200 {
			t.Fatalf("right password #%d: %d %v", i, w.Code, err)
		}
	}
	if d := peekZone(t, h, "login", "good"); d.Remaining != 3 || d.ResetAfter != 0 {
		t.Fatalf("after 100 successful logins the zone shows %+v; want it untouched (remaining 3, full)", d)
	}

	bad := map[string]string{"X-User": "bad", "X-Status": "401"}
	for i := range 3 {
		if w, _ := serveNext(t, h, statusHandler, bad); w.Code != 401 {
			t.Fatalf("wrong password #%d: %d, want 401 from the application", i, w.Code)
		}
	}
	if w, _ := serveNext(t, h, statusHandler, bad); w.Code != 429 {
		t.Fatalf("4th wrong password: %d, want 429", w.Code)
	}

	// Every way a status is known.
	ways := map[string]caddyhttp.Handler{
		"write without WriteHeader": caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
			_, err := w.Write([]byte("ok"))
			return err
		}),
		"nothing written": caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error { return nil }),
		"error 500 (not counted)": caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
			return errors.New("boom")
		}),
		"informational then 200": caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
			w.WriteHeader(http.StatusEarlyHints)
			w.WriteHeader(http.StatusOK)
			return nil
		}),
	}
	for name, next := range ways {
		user := map[string]string{"X-User": "ways-" + name}
		for range 5 {
			_, _ = serveNext(t, h, next, user)
		}
		if d := peekZone(t, h, "login", "ways-"+name); d.Remaining != 3 {
			t.Errorf("%s: the zone shows remaining %d after 5 requests; want 3 (none counts)", name, d.Remaining)
		}
	}
	counted := map[string]caddyhttp.Handler{
		"handle_errors 401 (basic_auth's error)": caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
			return caddyhttp.Error(http.StatusUnauthorized, errors.New("not authenticated"))
		}),
		"403 after an early hint": caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
			w.WriteHeader(http.StatusEarlyHints)
			w.WriteHeader(http.StatusForbidden)
			return nil
		}),
		"401 written, then an error": caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
			w.WriteHeader(http.StatusUnauthorized)
			return caddyhttp.Error(http.StatusBadGateway, errors.New("stream broke"))
		}),
	}
	for name, next := range counted {
		user := map[string]string{"X-User": "counted-" + name}
		for range 3 {
			_, _ = serveNext(t, h, next, user)
		}
		if d := peekZone(t, h, "login", "counted-"+name); d.Remaining != 0 {
			t.Errorf("%s: the zone shows remaining %d after 3 requests; want 0 (each counts)", name, d.Remaining)
		}
	}

	// A panic (abort) counts as 500, and goes on up.
	user := map[string]string{"X-User": "panics"}
	panicky := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error { panic(http.ErrAbortHandler) })
	func() {
		defer func() {
			if p := recover(); p != http.ErrAbortHandler {
				t.Errorf("the panic did not go on up: %v", p)
			}
		}()
		_, _ = serveNext(t, h, panicky, user)
	}()
	if d := peekZone(t, h, "login", "panics"); d.Remaining != 3 {
		t.Errorf("a panic: remaining %d, want 3 (500 is not counted)", d.Remaining)
	}
}

// A streamed response is settled at its first write: the charge is given
// back while the stream still runs.
func TestCountSettlesAtTheFirstWrite(t *testing.T) {
	clock := &fakeClock{ms: 1_800_000_000_000}
	h := newHandler(t, `rate_limit {
		zone stream {
			key {http.request.header.X-User}
			events 2
			window 1h
			count 5xx
		}
	}`, clock)
	var during algorithms.Decision
	stream := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		w.WriteHeader(http.StatusOK)
		http.NewResponseController(w).Flush()
		during = peekZone(t, h, "stream", "s")
		_, _ = w.Write([]byte("data: 1\n\n"))
		return nil
	})
	if _, err := serveNext(t, h, stream, map[string]string{"X-User": "s"}); err != nil {
		t.Fatal(err)
	}
	if during.Remaining != 2 {
		t.Fatalf("during the stream, after its header: remaining %d, want 2 (already given back)", during.Remaining)
	}
}

// The test, in one process: 50 concurrent wrong-password logins for
// one account against events 5 with count 401: the application sees exactly
// 5, the other 45 are refused; meanwhile 1,000 right-password logins for
// another account all pass and leave its zone untouched.
func TestCountConcurrentWrongPasswords(t *testing.T) {
	h := newHandler(t, `rate_limit {
		zone login_conc {
			key {http.request.header.X-User}
			events 5
			window 1h
			count 401
		}
	}`, nil)
	var reached atomic.Int64
	release := make(chan struct{})
	app := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		if r.Header.Get("X-User") == "victim" {
			reached.Add(1)
			<-release // every guess in flight at once
			w.WriteHeader(http.StatusUnauthorized)
			return nil
		}
		w.WriteHeader(http.StatusOK)
		return nil
	})
	var wg sync.WaitGroup
	var refused, other atomic.Int64
	start := make(chan struct{})
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			w, _ := serveNext(t, h, app, map[string]string{"X-User": "victim"})
			switch w.Code {
			case 429:
				refused.Add(1)
			case 401:
			default:
				other.Add(1)
			}
		}()
	}
	var okLogins atomic.Int64
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for range 250 {
				if w, _ := serveNext(t, h, app, map[string]string{"X-User": fmt.Sprint("owner-", g%1)}); w.Code == 200 {
					okLogins.Add(1)
				}
			}
		}()
	}
	close(start)
	deadline := time.Now().Add(10 * time.Second)
	for refused.Load()+reached.Load() < 50 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	close(release)
	wg.Wait()
	if reached.Load() != 5 || refused.Load() != 45 || other.Load() != 0 {
		t.Fatalf("50 concurrent wrong passwords: the application saw %d, %d refused, %d other; want exactly 5 and 45", reached.Load(), refused.Load(), other.Load())
	}
	if okLogins.Load() != 1000 {
		t.Fatalf("right-password logins: %d of 1000 passed", okLogins.Load())
	}
	d := peekZoneReal(t, h, "login_conc", "owner-0")
	if d.Remaining != 5 || d.ResetAfter != 0 {
		t.Fatalf("the other account's zone after 1,000 right-password logins: %+v; want untouched", d)
	}
}

// peekZoneReal is peekZone on the handler's own (pooled) memory store.
func peekZoneReal(t testing.TB, h *Handler, zone, user string) algorithms.Decision {
	t.Helper()
	m, ok := h.store.(*memstore.Memory)
	if !ok {
		t.Fatalf("store %T", h.store)
	}
	for _, z := range h.zones {
		if z.name == zone {
			tok, _ := z.deriver.Derive(mapResolver{"http.request.header.X-User": user}, nil)
			out, found := make([]algorithms.Decision, 1), make([]bool, 1)
			_ = m.PeekKeys(context.Background(), zone, []algorithms.Key{tok}, z.limit, out, found)
			return out[0]
		}
	}
	t.Fatalf("no zone %s", zone)
	return algorithms.Decision{}
}

// Refund exactness through the handler, for every algorithm: one client's
// random requests, each answered with a random status, against a zone that
// counts some of them; the key must end exactly as the same zone's key of
// a client that only ever sent the matching requests (every response takes
// some time: the clock moves between the charge and the refund).
func TestCountRefundsAreExactPerAlgorithm(t *testing.T) {
	for _, alg := range []string{"token_bucket", "gcra", "sliding_window", "fixed_window", "sliding_log"} {
		t.Run(alg, func(t *testing.T) {
			clock := &fakeClock{ms: 1_800_000_000_000}
			burst := "" // the windows admit at most 5 per 10s; the buckets, a burst of 2 and 1 per 2s
			if alg == "token_bucket" || alg == "gcra" {
				burst = "burst 2"
			}
			h := newHandler(t, fmt.Sprintf(`rate_limit {
				zone exact_%s {
					key {http.request.header.X-User}
					events 5
					window 10s
					%s
					algorithm %s
					count 4xx 503
				}
			}`, alg, burst, alg), clock)
			rng := rand.New(rand.NewPCG(7, uint64(len(alg))))
			statuses := []int{200, 201, 302, 401, 403, 404, 500, 503}
			var sent, refunded, matched, refused int
			for i := range 3000 {
				clock.add(rng.Int64N(2000))
				code := statuses[rng.IntN(len(statuses))]
				match := code >= 400 && code < 500 || code == 503
				delay := rng.Int64N(1500)
				app := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
					clock.add(delay) // the response takes a while
					w.WriteHeader(code)
					return nil
				})
				wA, _ := serveNext(t, h, app, map[string]string{"X-User": "all"})
				sent++
				if wA.Code == 429 {
					refused++
				}
				if wA.Code == code && !match {
					refunded++
				}
				if match {
					matched++
					// The other client sends only this one, at the same
					// instant its charge was made.
					clock.add(-delay)
					wB, _ := serveNext(t, h, app, map[string]string{"X-User": "matching"})
					if wA.Code != wB.Code {
						t.Fatalf("request %d (status %d): %d for the client of every request, %d for the client of the matching ones", i, code, wA.Code, wB.Code)
					}
				}
				a, b := peekZone(t, h, "exact_"+alg, "all"), peekZone(t, h, "exact_"+alg, "matching")
				if a != b {
					t.Fatalf("after request %d (status %d, matching %v): the key shows %+v, the matching-only key %+v", i, code, match, a, b)
				}
			}
			t.Logf("%d requests, %d matching, %d refunded, %d refused: both keys alike throughout", sent, matched, refunded, refused)
			if refused == 0 || refunded == 0 {
				t.Fatalf("the sequence exercised too little")
			}
		})
	}
}

// Configuration checks of count, on_exceed and penalty.
func TestCountPassPenaltyConfigErrors(t *testing.T) {
	for _, tc := range []struct{ block, want string }{
		{"count 40", `count: "40" is not a status`},
		{"count 6xx", `count: "6xx" is not a status`},
		{"count 500-400", `count: "500-400" is not a range`},
		{"on_exceed drop", `on_exceed: unknown action "drop"`},
		{"penalty 1500us", "penalty must be a whole number of milliseconds"},
		{"report_only\n\t\t\ton_exceed pass", "report_only and on_exceed pass: choose one"},
	} {
		h := new(Handler)
		block := "rate_limit {\n\t\tzone cfg {\n\t\t\tevents 5\n\t\t\twindow 1m\n\t\t\t" + tc.block + "\n\t\t}\n\t}"
		if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(block)); err != nil {
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%q: parse error %v, want %q", tc.block, err, tc.want)
			}
			continue
		}
		err := h.Provision(caddyContext(t))
		if err == nil {
			err = h.Validate()
		}
		_ = h.Cleanup()
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), `zone "cfg"`) {
			t.Errorf("%q: error %v, want one naming the zone and %q", tc.block, err, tc.want)
		}
	}
}

// BenchmarkServeHTTPCount compares, side by side, one zone as it is
// ("plain"), the same zone with count whose responses all count ("kept":
// the charge stays, only the status is watched) and with count whose
// responses never count ("refunded": every charge is given back), through
// the handler with its memory store:
//
//	go test -run XXX -bench ServeHTTPCount -benchmem .
func BenchmarkServeHTTPCount(b *testing.B) {
	for _, tc := range []struct{ name, count string }{{"plain", ""}, {"kept", "count 2xx"}, {"refunded", "count 5xx"}} {
		b.Run(tc.name, func(b *testing.B) {
			h := newHandler(b, `rate_limit {
				zone bench_count_`+tc.name+` {
					key {http.request.header.X-User}
					events 1000000000
					window 1s
					`+tc.count+`
				}
			}`, nil)
			benchServeAllowed(b, h)
		})
	}
}
