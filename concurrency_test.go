package sluice

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/memstore"
)

// concHandler provisions a handler whose store is a private memory store
// (returned), so its slots can be counted.
func concHandler(t testing.TB, block string) (*Handler, *memstore.Store) {
	t.Helper()
	h := newHandler(t, block, nil)
	st := memstore.New(memstore.Config{SweepInterval: -1})
	t.Cleanup(st.Close)
	useStores(h, st, nil)
	return h, st
}

// keyToken derives the token a zone gives the raw key value (for the
// store's counts).
func keyToken(t *testing.T, h *Handler, zone, value string) algorithms.Key {
	t.Helper()
	for _, z := range h.zones {
		if z.name == zone {
			tok, ok := z.deriver.TokenFor(0, value)
			if !ok {
				t.Fatalf("zone %s: no token for %q", zone, value)
			}
			return tok
		}
	}
	t.Fatalf("no zone %s", zone)
	return algorithms.Key{}
}

func serveWith(h *Handler, next caddyhttp.Handler, user string) (*httptest.ResponseRecorder, error) {
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("X-User", user)
	caddyhttp.NewTestReplacer(r)
	w := httptest.NewRecorder()
	return w, h.ServeHTTP(w, r, next)
}

const conc5Block = `rate_limit {
	zone c5 {
		key {http.request.header.X-User}
		concurrent 5
	}
	headers both
}`

// Memory, through the handler: 200 goroutines released together against
// `concurrent 5`, with a next handler (the upstream) that holds each
// request until every one has been decided: the upstream never sees more
// than 5 at once, exactly 5 at the peak (its own atomic counter), and 195
// are refused with 429. Then every slot is back. Twenty rounds, one key.
func TestConcurrencyHandlerExact(t *testing.T) {
	h, st := concHandler(t, conc5Block)
	tok := keyToken(t, h, "c5", "alice")
	var inFlight, peak atomic.Int64
	for round := range 20 {
		const n = 200
		var decided, ready, done sync.WaitGroup
		decided.Add(n)
		ready.Add(n)
		var upstream = caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
			cur := inFlight.Add(1)
			for p := peak.Load(); cur > p && !peak.CompareAndSwap(p, cur); p = peak.Load() {
			}
			decided.Done()
			decided.Wait() // the barrier: hold until all 200 are decided
			inFlight.Add(-1)
			w.WriteHeader(http.StatusOK)
			return nil
		})
		start := make(chan struct{})
		codes := make([]int, n)
		for i := range n {
			done.Add(1)
			go func() {
				defer done.Done()
				ready.Done()
				<-start
				w, err := serveWith(h, upstream, "alice")
				if err != nil {
					t.Errorf("ServeHTTP: %v", err)
				}
				codes[i] = w.Code
				if w.Code != http.StatusOK {
					decided.Done()
				}
			}()
		}
		peak.Store(0)
		ready.Wait()
		close(start)
		done.Wait()
		var ok, refused int
		for _, c := range codes {
			switch c {
			case 200:
				ok++
			case 429:
				refused++
			}
		}
		if ok != 5 || refused != 195 || peak.Load() != 5 {
			t.Fatalf("round %d: %d passed, %d refused, peak %d in flight at the upstream; want exactly 5, 195 and 5", round, ok, refused, peak.Load())
		}
		if got := st.InUse("c5", tok); got != 0 {
			t.Fatalf("round %d: %d slots in use after every request ended, want 0", round, got)
		}
	}
}

// Every way the handler chain can end gives the slot back: a response, an
// error, a panic, and the end of a streamed response (the slot is held
// while it streams).
func TestConcurrencyHandlerReleaseOnEveryExit(t *testing.T) {
	h, st := concHandler(t, `rate_limit {
		zone exits {
			key {http.request.header.X-User}
			concurrent 1
		}
	}`)
	tok := keyToken(t, h, "exits", "bob")
	inUse := func() int { return st.InUse("exits", tok) }
	check := func(what string) {
		t.Helper()
		if n := inUse(); n != 0 {
			t.Fatalf("%s: %d slots in use afterwards, want 0", what, n)
		}
		// And the slot is usable again.
		if w, _ := serveWith(h, okHandler, "bob"); w.Code != 200 {
			t.Fatalf("%s: the next request got %d", what, w.Code)
		}
	}
	// An error.
	boom := errors.New("upstream failed")
	if _, err := serveWith(h, caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error {
		if inUse() != 1 {
			t.Error("no slot held while the chain runs")
		}
		return boom
	}), "bob"); !errors.Is(err, boom) {
		t.Fatalf("error: %v", err)
	}
	check("an error")
	// A panic, which goes on up (net/http recovers it).
	func() {
		defer func() {
			if p := recover(); p != "later handler" {
				t.Fatalf("recovered %v", p)
			}
		}()
		_, _ = serveWith(h, caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error {
			panic("later handler")
		}), "bob")
	}()
	check("a panic")
	// A streamed response: the slot is held until the stream ends.
	chunks := make(chan struct{})
	streamed := make(chan error)
	go func() {
		_, err := serveWith(h, caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
			for range chunks {
				_, _ = w.Write([]byte("chunk\n"))
				w.(http.Flusher).Flush()
			}
			return nil
		}), "bob")
		streamed <- err
	}()
	chunks <- struct{}{}
	chunks <- struct{}{}
	if n := inUse(); n != 1 {
		t.Fatalf("while streaming: %d slots in use, want 1", n)
	}
	if w, _ := serveWith(h, okHandler, "bob"); w.Code != 429 {
		t.Fatalf("a second request while the first streams: %d, want 429", w.Code)
	}
	close(chunks)
	if err := <-streamed; err != nil {
		t.Fatal(err)
	}
	check("a streamed response")
	// The client gone: the chain returns (here with the context's error).
	ctx, cancel := context.WithCancel(context.Background())
	go func() { time.Sleep(20 * time.Millisecond); cancel() }()
	r := httptest.NewRequest("GET", "/", nil).WithContext(ctx)
	r.Header.Set("X-User", "bob")
	caddyhttp.NewTestReplacer(r)
	_ = h.ServeHTTP(httptest.NewRecorder(), r, caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		<-r.Context().Done()
		return r.Context().Err()
	}))
	check("the client gone")
}

// A request refused by a rate zone takes no slot; one refused by the
// concurrency zone spends no token; the concurrency refusal is a 429 with
// the usual body, Retry-After, and the draft's qu="concurrent-requests".
func TestConcurrencyHandlerAllOrNothing(t *testing.T) {
	h, st := concHandler(t, `rate_limit {
		zone aon_rate {
			key {http.request.header.X-User}
			events 3
			window 1h
		}
		zone aon_conc {
			key {http.request.header.X-User}
			concurrent 1
		}
		headers both
	}`)
	tok := keyToken(t, h, "aon_conc", "carol")
	rateTok := keyToken(t, h, "aon_rate", "carol")
	hold, release, ended := make(chan struct{}), make(chan struct{}), make(chan struct{})
	go func() {
		defer close(ended)
		_, _ = serveWith(h, caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error {
			close(hold)
			<-release
			return nil
		}), "carol")
	}()
	<-hold
	w, _ := serveWith(h, okHandler, "carol")
	if w.Code != 429 || w.Header().Get("Retry-After") != "1" || !strings.Contains(w.Body.String(), `"zone":"aon_conc"`) {
		t.Fatalf("second: %d %v %s; want 429 from aon_conc with Retry-After 1", w.Code, w.Header(), w.Body)
	}
	policy, state := parseDraft11(t, w.Header())
	expectMember(t, "RateLimit-Policy aon_conc", policy["aon_conc"], draftMember{"q": int64(1), "qu": "concurrent-requests"})
	expectMember(t, "RateLimit aon_conc", state["aon_conc"], draftMember{"r": int64(0)})
	if d, _ := st.Peek("aon_rate", rateTok, h.zones[1].limit); d.Remaining != 2 {
		t.Fatalf("rate zone: %d left after a concurrency refusal, want 2 (only the first spent)", d.Remaining)
	}
	close(release)
	<-ended
	for range 2 {
		if w, _ := serveWith(h, okHandler, "carol"); w.Code != 200 {
			t.Fatalf("%d, want 200", w.Code)
		}
	}
	if w, _ := serveWith(h, okHandler, "carol"); w.Code != 429 || !strings.Contains(w.Body.String(), `"zone":"aon_rate"`) {
		t.Fatalf("fourth: %d %s; want 429 from aon_rate", w.Code, w.Body)
	}
	if n := st.InUse("aon_conc", tok); n != 0 {
		t.Fatalf("%d slots in use after a rate refusal, want 0", n)
	}
}

// The Retry-After of a concurrency refusal: one second until the zone has
// seen hold times, then the average hold time over the slots (a slot frees
// about that often when all are busy), rounded up.
func TestConcurrencyRetryHint(t *testing.T) {
	h, _ := concHandler(t, `rate_limit {
		zone hint {
			key {http.request.header.X-User}
			concurrent 2
		}
	}`)
	z := h.zones[0]
	if got := z.conc.retryHint(2); got != 0 {
		t.Fatalf("hint with no hold seen: %v", got)
	}
	z.conc.observe(9 * time.Second)
	for range 50 {
		z.conc.observe(9 * time.Second)
	}
	hold, release := make(chan struct{}, 2), make(chan struct{})
	for range 2 {
		go func() {
			_, _ = serveWith(h, caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error {
				hold <- struct{}{}
				<-release
				return nil
			}), "dave")
		}()
		<-hold
	}
	w, _ := serveWith(h, okHandler, "dave")
	close(release)
	// 9s held on average, 2 slots: about one frees every 4.5s → 5.
	if w.Code != 429 || w.Header().Get("Retry-After") != "5" {
		t.Fatalf("%d Retry-After %q, want 429 with 5", w.Code, w.Header().Get("Retry-After"))
	}
	z.conc.observe(time.Hour)
	for range 100 {
		z.conc.observe(time.Hour)
	}
	if got := z.conc.retryHint(2); got != maxConcurrencyRetry {
		t.Fatalf("hint %v, want the cap %v", got, maxConcurrencyRetry)
	}
}

// A limit chosen per request counts against one count of slots per key,
// whatever limit it resolves to.
func TestConcurrencyPerRequestLimit(t *testing.T) {
	h, st := concHandler(t, `rate_limit {
		zone plan {
			key {http.request.header.X-User}
			concurrent {http.request.header.X-Plan} 1
		}
	}`)
	tok := keyToken(t, h, "plan", "erin")
	hold, release := make(chan struct{}), make(chan struct{})
	holding := caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error {
		hold <- struct{}{}
		<-release
		return nil
	})
	serve := func(plan string, next caddyhttp.Handler) int {
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set("X-User", "erin")
		r.Header.Set("X-Plan", plan)
		caddyhttp.NewTestReplacer(r)
		w := httptest.NewRecorder()
		_ = h.ServeHTTP(w, r, next)
		return w.Code
	}
	for range 2 {
		go serve("3", holding)
		<-hold
	}
	if code := serve("", okHandler); code != 429 {
		t.Fatalf("the default limit (1) with 2 in flight: %d, want 429", code)
	}
	go serve("3", holding)
	<-hold
	if code := serve("3", okHandler); code != 429 {
		t.Fatalf("a limit of 3 with 3 in flight: %d, want 429", code)
	}
	if n := st.InUse("plan", tok); n != 3 {
		t.Fatalf("%d slots in use in the key's one count, want 3", n)
	}
	close(release)
}

func TestConcurrencyConfig(t *testing.T) {
	for _, c := range []struct {
		name, block string
		want        []string
	}{
		{"ok", "\t\tzone c {\n\t\t\tconcurrent 3\n\t\t\tlease 30s\n\t\t}", nil},
		{"ok, per request", "\t\tzone c {\n\t\t\tconcurrent {http.request.header.X-Plan} 3\n\t\t}", nil},
		{"beside a rate zone", zoneZ + "\t\tzone c {\n\t\t\tconcurrent 3\n\t\t\tfail closed\n\t\t\treport_only\n\t\t}", nil},
		{"events", "\t\tzone c {\n\t\t\tconcurrent 3\n\t\t\tevents 5\n\t\t}", []string{`zone "c"`, "events", "does not apply to a concurrency zone"}},
		{"window", "\t\tzone c {\n\t\t\tconcurrent 3\n\t\t\twindow 1m\n\t\t}", []string{`zone "c"`, "window", "does not apply"}},
		{"cost", "\t\tzone c {\n\t\t\tconcurrent 3\n\t\t\tcost 2\n\t\t}", []string{`zone "c"`, "cost", "does not apply"}},
		{"algorithm", "\t\tzone c {\n\t\t\tconcurrent 3\n\t\t\talgorithm gcra\n\t\t}", []string{"algorithm", "does not apply"}},
		{"lease in a rate zone", "\t\tzone c {\n\t\t\tevents 3\n\t\t\twindow 1m\n\t\t\tlease 1m\n\t\t}", []string{`zone "c"`, "lease applies only to a concurrency zone", "a rate zone has no lease"}},
		{"lease only", "\t\tzone c {\n\t\t\tlease 1m\n\t\t}", []string{`zone "c"`, "lease applies only to a concurrency zone"}},
		{"lease short", "\t\tzone c {\n\t\t\tconcurrent 3\n\t\t\tlease 500ms\n\t\t}", []string{`zone "c"`, "lease must be between 1s and 24h0m0s", "500ms"}},
		{"lease sub-ms", "\t\tzone c {\n\t\t\tconcurrent 3\n\t\t\tlease 1500us\n\t\t}", []string{"lease", "whole number of milliseconds"}},
		{"too many", "\t\tzone c {\n\t\t\tconcurrent 1000001\n\t\t}", []string{"concurrent must be between 1 and 1000000"}},
		{"placeholder without default", "\t\tzone c {\n\t\t\tconcurrent {x}\n\t\t}", []string{"concurrent {x} needs a default"}},
		{"zero", "\t\tzone c {\n\t\t\tconcurrent 0\n\t\t}", []string{"concurrent must be at least 1"}},
	} {
		err := validateCaddyfile(t, site("", c.block))
		switch {
		case c.want == nil && err != nil:
			t.Errorf("%s: %v", c.name, err)
		case c.want != nil && err == nil:
			t.Errorf("%s: loaded, want an error with %q", c.name, c.want)
		case c.want != nil:
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%s: %v; want it to mention %q", c.name, err, w)
				}
			}
		}
	}
	// One name in two directives: one limit.
	err := validateCaddyfile(t, "{\n\tadmin off\n}\n:0 {\n\trate_limit /a {\n\t\tzone cc {\n\t\t\tconcurrent 3\n\t\t}\n\t}\n\trate_limit /b {\n\t\tzone cc {\n\t\t\tconcurrent 4\n\t\t}\n\t}\n\trespond ok\n}\n")
	if err == nil || !strings.Contains(err.Error(), "concurrent 4 lease 1m0s") || !strings.Contains(err.Error(), "concurrent 3 lease 1m0s") {
		t.Errorf("one concurrency zone with two limits: %v", err)
	}
}

// A store that cannot hold slots is refused at load.
func TestConcurrencyNeedsAReleaser(t *testing.T) {
	h := newHandler(t, `rate_limit {
		zone c {
			concurrent 1
		}
	}`, nil)
	h.store = failingStore{}
	if _, err := provisionConcurrency(h); err == nil || !strings.Contains(err.Error(), "cannot hold concurrency slots") {
		t.Fatalf("provisionConcurrency with a store without Release: %v", err)
	}
}

// BenchmarkServeHTTPConcurrency is BenchmarkServeHTTPAllowed with a
// concurrency zone beside the rate zone (its slot taken and given back on
// every request).
func BenchmarkServeHTTPConcurrency(b *testing.B) {
	h, _ := concHandler(b, `rate_limit {
		zone bench_rate {
			key {http.request.header.X-User}
			events 1000000000
			window 1m
		}
		zone bench_conc {
			key {http.request.header.X-User}
			concurrent 1000000
		}
	}`)
	benchServeAllowed(b, h)
}

// A report-only concurrency zone never refuses: past its slots a request
// passes, takes none, and is counted and logged as a would-be refusal; the
// requests it admitted give their slots back.
func TestConcurrencyReportOnly(t *testing.T) {
	h, st := concHandler(t, `rate_limit {
		zone ro {
			key {http.request.header.X-User}
			concurrent 1
			report_only
		}
	}`)
	tok := keyToken(t, h, "ro", "frank")
	hold, release, ended := make(chan struct{}), make(chan struct{}), make(chan struct{})
	go func() {
		defer close(ended)
		_, _ = serveWith(h, caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error {
			close(hold)
			<-release
			return nil
		}), "frank")
	}()
	<-hold
	var inside int64
	for range 3 {
		w, _ := serveWith(h, caddyhttp.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) error {
			inside = int64(st.InUse("ro", tok))
			w.WriteHeader(http.StatusOK)
			return nil
		}), "frank")
		if w.Code != 200 || inside != 1 {
			t.Fatalf("past the slot, report only: %d with %d slots in use; want 200 with the one slot (a would-be refusal takes none)", w.Code, inside)
		}
	}
	close(release)
	<-ended
	if n := st.InUse("ro", tok); n != 0 {
		t.Fatalf("%d slots in use, want 0", n)
	}
}
