package caddytest_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// End-to-end tests of concurrency zones (`concurrent`) in the in-process
// Caddy: the slots of real HTTP requests proxied to an upstream that holds
// them, counted by the upstream itself, by the admin API and by the
// metrics.

func init() {
	caddy.RegisterModule(panicHandler{})
	httpcaddyfile.RegisterHandlerDirective("sluice_test_panic", func(httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
		return panicHandler{}, nil
	})
}

// panicHandler is a handler that panics: "a panic in a later handler".
type panicHandler struct{}

func (panicHandler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.handlers.sluice_test_panic", New: func() caddy.Module { return panicHandler{} }}
}

func (panicHandler) ServeHTTP(http.ResponseWriter, *http.Request, caddyhttp.Handler) error {
	panic("sluice_test_panic: a later handler panics")
}

// holdUpstream is an upstream that counts the requests in flight in it
// (and their peak) and holds each request whose path starts with one of
// holds (default /hold) until released; /stream streams a chunk per signal
// on next; anything else answers at once.
type holdUpstream struct {
	srv            *httptest.Server
	inFlight, peak atomic.Int64
	arrived        chan struct{} // one per request held or streamed
	mu             sync.Mutex
	release        chan struct{}
	next           chan struct{} // /stream: one chunk per value, the end when closed
	endStream      sync.Once
}

func newHoldUpstream(t *testing.T, holds ...string) *holdUpstream {
	if len(holds) == 0 {
		holds = []string{"/hold"}
	}
	u := &holdUpstream{arrived: make(chan struct{}, 1024), release: make(chan struct{}), next: make(chan struct{})}
	held := func(path string) bool {
		for _, h := range holds {
			if strings.HasPrefix(path, h) {
				return true
			}
		}
		return false
	}
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cur := u.inFlight.Add(1)
		defer u.inFlight.Add(-1)
		for p := u.peak.Load(); cur > p && !u.peak.CompareAndSwap(p, cur); p = u.peak.Load() {
		}
		switch {
		case held(r.URL.Path):
			u.arrived <- struct{}{}
			u.mu.Lock()
			release := u.release
			u.mu.Unlock()
			select {
			case <-release:
				_, _ = w.Write([]byte("held"))
			case <-r.Context().Done():
			}
		case strings.HasPrefix(r.URL.Path, "/stream"):
			u.arrived <- struct{}{}
			w.Header().Set("Content-Type", "text/plain")
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			for range u.next {
				_, _ = w.Write([]byte("chunk\n"))
				w.(http.Flusher).Flush()
			}
		default:
			_, _ = w.Write([]byte("app"))
		}
	}))
	t.Cleanup(func() {
		u.releaseAll()
		u.closeStream()
		u.srv.Close()
	})
	return u
}

// closeStream ends /stream responses.
func (u *holdUpstream) closeStream() { u.endStream.Do(func() { close(u.next) }) }

func (u *holdUpstream) addr() string { return u.srv.Listener.Addr().String() }

// releaseAll lets every held request go (and later ones go at once until
// hold is called).
func (u *holdUpstream) releaseAll() {
	u.mu.Lock()
	defer u.mu.Unlock()
	select {
	case <-u.release:
	default:
		close(u.release)
	}
}

// hold makes later /hold requests wait again.
func (u *holdUpstream) hold() {
	u.mu.Lock()
	u.release = make(chan struct{})
	u.mu.Unlock()
	u.peak.Store(u.inFlight.Load())
}

// waitArrived waits for n requests to reach the upstream.
func (u *holdUpstream) waitArrived(t *testing.T, n int) {
	t.Helper()
	for i := range n {
		select {
		case <-u.arrived:
		case <-time.After(10 * time.Second):
			t.Fatalf("only %d of %d requests reached the upstream", i, n)
		}
	}
}

// inUse reads a key's slots in use through the admin API.
func inUse(t *testing.T, zone, key string) int64 {
	t.Helper()
	code, body := adminAPI(t, "GET", "/rate_limit/zones/"+url.PathEscape(zone)+"/keys/"+url.PathEscape(key))
	if code != 200 {
		t.Fatalf("admin peek %s/%s: %d %v", zone, key, code, body)
	}
	if _, ok := body["in_use"]; !ok {
		t.Fatalf("admin peek %s/%s: no in_use in %v", zone, key, body)
	}
	return jsonInt(t, body, "in_use")
}

// waitInUse polls a key's slots in use until it is want (releases follow
// the response, and Redis's are sent after it).
func waitInUse(t *testing.T, zone, key string, want int64, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		got := inUse(t, zone, key)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("zone %s key %s: %d slots in use after %v, want %d", zone, key, got, within, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// slotsGauge reads caddy_rate_limit_concurrent_slots{zone}.
func slotsGauge(t *testing.T, zone string) float64 {
	t.Helper()
	return scrapeMetric(t, "caddy_rate_limit_concurrent_slots", `zone="`+zone+`"`)
}

// TestSlotsMemoryExact: 200 clients at once on one key against
// `concurrent 5` (memory store), each request proxied to an upstream that
// holds it: the upstream sees exactly 5 at the peak and never more, the
// other 195 are refused with 429 while the 5 are held; released, the 5
// answer 200 and the key's slots are back to 0. Three rounds on one key.
func TestSlotsMemoryExact(t *testing.T) {
	tc := newTester(t)
	up := newHoldUpstream(t)
	zone := zoneName("slots_mem")
	load(t, tc, config("", `
http://localhost:@A@ {
	rate_limit {
		zone @ZONE@ {
			key {http.request.header.X-User}
			concurrent 5
		}
	}
	reverse_proxy @UP@
}
`, "ZONE", zone, "UP", up.addr()))
	const n = 200
	client := loopbackClient(n)
	defer client.CloseIdleConnections()
	user := "m-" + nonce
	for round := range 3 {
		up.hold()
		up.peak.Store(0)
		codes := make([]int, n)
		refusedDone := make(chan int, n)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				req, _ := http.NewRequest(http.MethodGet, siteA+"/hold", nil)
				req.Header.Set("X-User", user)
				<-start
				resp, err := doRetry(t, client, req)
				if err != nil {
					t.Errorf("request %d: %v", i, err)
					refusedDone <- 0
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				codes[i] = resp.StatusCode
				if resp.StatusCode != http.StatusOK {
					refusedDone <- resp.StatusCode
				}
			}()
		}
		close(start)
		// The 5 admitted reach the upstream and stay; the 195 others come
		// back refused meanwhile.
		up.waitArrived(t, 5)
		for i := range n - 5 {
			select {
			case code := <-refusedDone:
				if code != http.StatusTooManyRequests {
					t.Fatalf("round %d: a request answered %d while 5 were held", round, code)
				}
			case <-time.After(20 * time.Second):
				t.Fatalf("round %d: only %d refusals came back", round, i)
			}
		}
		if got, peak := up.inFlight.Load(), up.peak.Load(); got != 5 || peak != 5 {
			t.Fatalf("round %d: %d in flight at the upstream, peak %d; want exactly 5 and 5", round, got, peak)
		}
		if got := inUse(t, zone, user); got != 5 {
			t.Fatalf("round %d: admin API in_use %d, want 5", round, got)
		}
		if got := slotsGauge(t, zone); got != 5 {
			t.Fatalf("round %d: caddy_rate_limit_concurrent_slots %v, want 5", round, got)
		}
		up.releaseAll()
		wg.Wait()
		ok, refused := 0, 0
		for _, c := range codes {
			switch c {
			case 200:
				ok++
			case 429:
				refused++
			}
		}
		if ok != 5 || refused != 195 || up.peak.Load() != 5 {
			t.Fatalf("round %d: %d passed, %d refused, upstream peak %d; want exactly 5, 195, 5", round, ok, refused, up.peak.Load())
		}
		waitInUse(t, zone, user, 0, 2*time.Second)
	}
	if got := slotsGauge(t, zone); got != 0 {
		t.Fatalf("caddy_rate_limit_concurrent_slots %v after every request ended, want 0", got)
	}
}

// TestSlotsReleaseOnEveryExit: with the memory store and with Redis, the
// slot of `concurrent 1` comes back whatever way the request ends: a
// response, an upstream error (502), a panic in a later handler, the
// client going away, a streamed response (held while it streams).
func TestSlotsReleaseOnEveryExit(t *testing.T) {
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			storeBlock := ""
			if store == "redis" {
				srv := redistest.Start(t)
				storeBlock = "store redis " + srv.URL() + " {\n\t\t\ttimeout 500ms\n\t\t}"
			}
			releaseOnEveryExit(t, storeBlock)
		})
	}
}

func releaseOnEveryExit(t *testing.T, storeBlock string) {
	tc := newTester(t)
	up := newHoldUpstream(t)
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := dead.Addr().String()
	dead.Close() // connections to it are refused: the upstream error
	zone := zoneName("slots_exit")
	load(t, tc, config("", `
http://localhost:@A@ {
	rate_limit {
		zone @ZONE@ {
			key {http.request.header.X-User}
			concurrent 1
		}
		@STORE@
	}
	route /panic {
		sluice_test_panic
	}
	reverse_proxy /down @DEAD@
	reverse_proxy @UP@ {
		flush_interval -1
	}
}
`, "ZONE", zone, "UP", up.addr(), "DEAD", deadAddr, "STORE", storeBlock))
	client := loopbackClient(4)
	defer client.CloseIdleConnections()
	user := "x-" + nonce
	hdr := "X-User: " + user
	back := func(what string) {
		t.Helper()
		waitInUse(t, zone, user, 0, 3*time.Second)
		expect(t, get(t, client, siteA+"/ok", hdr), 200, what+": the next request")
		waitInUse(t, zone, user, 0, 3*time.Second)
	}

	// A response.
	expect(t, get(t, client, siteA+"/ok", hdr), 200, "a response")
	back("a response")

	// An upstream error: reverse_proxy returns it, Caddy answers 502.
	expect(t, get(t, client, siteA+"/down", hdr), http.StatusBadGateway, "an upstream error")
	back("an upstream error")

	// A panic in a later handler (net/http recovers it and drops the
	// connection). Sent on a connection of its own: Go's transport sends a
	// GET again, at once, when a reused connection drops before any
	// answer, and that second request would race the first's release
	// (with Redis, posted after the handler returns) and could be refused.
	req, _ := http.NewRequest(http.MethodGet, siteA+"/panic", nil)
	req.Header.Set("X-User", user)
	once := loopbackClient(1)
	once.Transport.(*http.Transport).DisableKeepAlives = true
	if resp, err := once.Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("a panicking handler answered %d", resp.StatusCode)
	}
	back("a panic")

	// The client goes away while the upstream holds the request.
	up.hold()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ = http.NewRequestWithContext(ctx, http.MethodGet, siteA+"/hold", nil)
	req.Header.Set("X-User", user)
	gone := make(chan error, 1)
	go func() {
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		gone <- err
	}()
	up.waitArrived(t, 1)
	if got := inUse(t, zone, user); got != 1 {
		t.Fatalf("while held: in_use %d, want 1", got)
	}
	expect(t, get(t, client, siteA+"/ok", hdr), 429, "a second request while the first is held")
	cancel()
	if err := <-gone; err == nil {
		t.Fatal("the cancelled request got an answer")
	}
	back("the client gone")
	up.releaseAll()

	// A streamed response: the slot is held until its end.
	req, _ = http.NewRequest(http.MethodGet, siteA+"/stream", nil)
	req.Header.Set("X-User", user)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	up.waitArrived(t, 1)
	buf := make([]byte, 6)
	for i := range 3 {
		up.next <- struct{}{}
		if _, err := io.ReadFull(resp.Body, buf); err != nil || string(buf) != "chunk\n" {
			t.Fatalf("chunk %d: %q %v", i, buf, err)
		}
		if got := inUse(t, zone, user); got != 1 {
			t.Fatalf("while streaming (chunk %d): in_use %d, want 1", i, got)
		}
	}
	expect(t, get(t, client, siteA+"/ok", hdr), 429, "a second request while the first streams")
	up.closeStream()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	back("a streamed response")
	if got := slotsGauge(t, zone); got != 0 {
		t.Fatalf("caddy_rate_limit_concurrent_slots %v, want 0", got)
	}
}

// TestSlotsAcrossReload: a reload that keeps the memory store keeps its
// slots: two requests admitted under `concurrent 2` are still counted under
// the new config's `concurrent 3` (one more gets in, the next is refused),
// and when they end their slots go back into that same count.
func TestSlotsAcrossReload(t *testing.T) {
	tc := newTester(t)
	up := newHoldUpstream(t)
	zone := zoneName("slots_reload")
	site := func(n int) string {
		return config("", `
http://localhost:@A@ {
	rate_limit {
		zone @ZONE@ {
			key {http.request.header.X-User}
			concurrent @N@
		}
	}
	reverse_proxy @UP@
}
`, "ZONE", zone, "UP", up.addr(), "N", strconv.Itoa(n))
	}
	load(t, tc, site(2))
	client := loopbackClient(8)
	defer client.CloseIdleConnections()
	user := "r-" + nonce
	hdr := "X-User: " + user
	up.hold()
	oldDone := make(chan int, 2)
	for range 2 {
		go func() {
			req, _ := http.NewRequest(http.MethodGet, siteA+"/hold", nil)
			req.Header.Set("X-User", user)
			resp, err := client.Do(req)
			if err != nil {
				oldDone <- 0
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			oldDone <- resp.StatusCode
		}()
	}
	up.waitArrived(t, 2)
	expect(t, get(t, client, siteA+"/ok", hdr), 429, "a third request under concurrent 2")

	load(t, tc, site(3))
	if got := inUse(t, zone, user); got != 2 {
		t.Fatalf("after the reload: in_use %d, want 2 (the requests of the old config)", got)
	}
	newDone := make(chan int, 1)
	go func() {
		r := get(t, client, siteA+"/hold", hdr)
		newDone <- r.code
	}()
	up.waitArrived(t, 1)
	expect(t, get(t, client, siteA+"/ok", hdr), 429, "a fourth request under concurrent 3")
	up.releaseAll()
	for range 2 {
		if code := <-oldDone; code != 200 {
			t.Fatalf("a request of the old config answered %d", code)
		}
	}
	if code := <-newDone; code != 200 {
		t.Fatalf("the request of the new config answered %d", code)
	}
	waitInUse(t, zone, user, 0, 2*time.Second)
	// The slots are all back: three at once get in.
	up.hold()
	for range 3 {
		go func() { _ = get(t, client, siteA+"/hold", hdr) }()
	}
	up.waitArrived(t, 3)
	expect(t, get(t, client, siteA+"/ok", hdr), 429, "a fourth request")
	up.releaseAll()
	waitInUse(t, zone, user, 0, 2*time.Second)
}

// TestSlotsAdminListing: the zone listing shows a concurrency zone's slots
// and lease.
func TestSlotsAdminListing(t *testing.T) {
	tc := newTester(t)
	zone := zoneName("slots_list")
	load(t, tc, config("", `
http://localhost:@A@ {
	rate_limit {
		zone @ZONE@ {
			key {http.request.header.X-User}
			concurrent 7
			lease 90s
		}
	}
	respond "ok"
}
`, "ZONE", zone))
	z := listedZones(t)[zone]
	if z == nil || z["algorithm"] != "concurrency" || jsonInt(t, z, "concurrent") != 7 || z["lease"] != "1m30s" ||
		jsonInt(t, z, "lease_ms") != 90_000 || jsonInt(t, z, "capacity") != 7 || jsonInt(t, z, "events") != 0 {
		t.Fatalf("listed as %v", z)
	}
	if got := inUse(t, zone, "nobody-"+nonce); got != 0 {
		t.Fatalf("in_use of an unknown key: %d", got)
	}
	r := expect(t, get(t, loopbackClient(1), siteA+"/", "X-User: l-"+nonce), 200, "a request")
	expectLimitHeaders(t, r, 7, 6, "a request of a concurrency zone")
}
