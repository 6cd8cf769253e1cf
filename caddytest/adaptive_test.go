package caddytest_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"

	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// End-to-end tests of adaptive concurrency zones (`concurrent adaptive`)
// in the in-process Caddy, proxying to an upstream that holds requests
// (holdUpstream, slots_test.go) and counts them.

// adaptiveZone lists an adaptive zone through the admin API.
func adaptiveListing(t *testing.T, zone string) map[string]any {
	t.Helper()
	z := listedZones(t)[zone]
	if z == nil {
		t.Fatalf("GET /rate_limit/zones does not list %s", zone)
	}
	a, ok := z["adaptive"].(map[string]any)
	if !ok {
		t.Fatalf("zone %s listed without its adaptive part: %v", zone, z)
	}
	return a
}

// fixedAdaptive loads a site on port A whose rate_limit has an adaptive
// zone keyed on X-User with its limit fixed at n (minimum = maximum), the
// zone's other lines extra, the directive's other zones others, in front
// of upstream.
func fixedAdaptive(t *testing.T, tc *caddytest.Tester, zone string, n int, extra, others, upstream string) {
	t.Helper()
	load(t, tc, config("", `
http://localhost:@A@ {
	rate_limit {
		zone @ZONE@ {
			key {http.request.header.X-User}
			concurrent adaptive {
				minimum @N@
				maximum @N@
			}
@EXTRA@
		}
@OTHERS@
	}
	reverse_proxy @UP@ {
		flush_interval -1
	}
}
`, "ZONE", zone, "N", strconv.Itoa(n), "EXTRA", extra, "OTHERS", others, "UP", upstream))
}

// waitAdaptiveIdle waits for an adaptive zone to have nothing in flight:
// a client has its answer a moment before the handler exits.
func waitAdaptiveIdle(t *testing.T, zone string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for jsonInt(t, adaptiveListing(t, zone), "in_flight") != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("zone %s: %v in flight 5 s after every request ended, want 0", zone, adaptiveListing(t, zone)["in_flight"])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// expectAllOK waits for fire's requests and fails the test unless every
// answer left on codes is 200.
func expectAllOK(t *testing.T, codes chan int, wg *sync.WaitGroup, what string) {
	t.Helper()
	wg.Wait()
	close(codes)
	for c := range codes {
		if c != http.StatusOK {
			t.Fatalf("%s answered %d, want 200", what, c)
		}
	}
}

// fire sends n GET requests to path with header X-User user at once and
// returns their statuses on codes (0: failed) and the Retry-After of the
// refusals.
func fire(t *testing.T, client *http.Client, n int, path, user string) (codes chan int, wg *sync.WaitGroup) {
	codes = make(chan int, n)
	wg = new(sync.WaitGroup)
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest(http.MethodGet, siteA+path, nil)
			req.Header.Set("X-User", user)
			<-start
			resp, err := doRetry(t, client, req)
			if err != nil {
				t.Errorf("request %d: %v", i, err)
				codes <- 0
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusTooManyRequests && resp.Header.Get("Retry-After") == "" {
				t.Errorf("a refusal without Retry-After")
			}
			codes <- resp.StatusCode
		}()
	}
	close(start)
	return codes, wg
}

// TestAdaptiveExact: with the learnt limit fixed at 5 (minimum = maximum),
// 100 requests of one key at once, proxied to an upstream that holds them:
// exactly 5 reach the upstream, the 95 others are refused with 429 and a
// Retry-After meanwhile; the admin API shows the limit and the 5 in
// flight, and the zone beside a rate zone in one directive. Released, the
// 5 answer 200; two rounds.
func TestAdaptiveExact(t *testing.T) {
	tc := newTester(t)
	up := newHoldUpstream(t)
	zone, rate := zoneName("adaptive_exact"), zoneName("adaptive_rate")
	fixedAdaptive(t, tc, zone, 5, "", `		zone `+rate+` {
			key {http.request.header.X-User}
			events 100000
			window 87600h
			algorithm fixed_window
		}`, up.addr())
	const n = 100
	client := loopbackClient(n)
	defer client.CloseIdleConnections()
	user := "a-" + nonce
	for round := range 2 {
		up.hold()
		up.peak.Store(0)
		codes, wg := fire(t, client, n, "/hold", user)
		up.waitArrived(t, 5)
		for i := range n - 5 {
			select {
			case c := <-codes:
				if c != http.StatusTooManyRequests {
					t.Fatalf("round %d: a request answered %d while 5 were held", round, c)
				}
			case <-time.After(20 * time.Second):
				t.Fatalf("round %d: only %d refusals came back", round, i)
			}
		}
		if got, peak := up.inFlight.Load(), up.peak.Load(); got != 5 || peak != 5 {
			t.Fatalf("round %d: %d in flight at the upstream, peak %d; want exactly 5 and 5", round, got, peak)
		}
		a := adaptiveListing(t, zone)
		if jsonInt(t, a, "limit") != 5 || jsonInt(t, a, "in_flight") != 5 || a["controller"] != "aimd" || jsonInt(t, a, "keys") != 1 {
			t.Fatalf("round %d: admin listing %v, want limit 5, in_flight 5, controller aimd, 1 key", round, a)
		}
		up.releaseAll()
		wg.Wait()
		close(codes)
		ok := 0
		for c := range codes {
			if c == http.StatusOK {
				ok++
			}
		}
		if ok != 5 {
			t.Fatalf("round %d: %d answered 200, want 5", round, ok)
		}
		waitAdaptiveIdle(t, zone)
	}
	waitAdaptiveIdle(t, zone)
	// The rate zone was charged only for the admitted requests: all or
	// nothing across the two.
	code, body := adminAPI(t, "GET", "/rate_limit/zones/"+rate+"/keys/"+user)
	if code != 200 || jsonInt(t, body, "remaining") != 100000-10 {
		t.Fatalf("rate zone peek: %d %v, want remaining %d (10 admitted)", code, body, 100000-10)
	}
}

// TestAdaptiveReportOnly: a report-only adaptive zone fixed at 2 learns
// and reports but refuses nothing: 10 held requests all reach the upstream.
func TestAdaptiveReportOnly(t *testing.T) {
	tc := newTester(t)
	up := newHoldUpstream(t)
	zone := zoneName("adaptive_report")
	fixedAdaptive(t, tc, zone, 2, "\t\t\treport_only", "", up.addr())
	client := loopbackClient(10)
	defer client.CloseIdleConnections()
	up.hold()
	codes, wg := fire(t, client, 10, "/hold", "r-"+nonce)
	up.waitArrived(t, 10)
	if got := jsonInt(t, adaptiveListing(t, zone), "in_flight"); got != 10 {
		t.Errorf("in flight %d, want all 10 counted", got)
	}
	up.releaseAll()
	expectAllOK(t, codes, wg, "a report-only adaptive zone's request")
}

// TestAdaptiveDelay: limit fixed at 1 with delay 10s: of 3 requests at
// once, one reaches the upstream and the two others wait (none refused);
// each release lets exactly one more through, never two at once.
func TestAdaptiveDelay(t *testing.T) {
	tc := newTester(t)
	up := newHoldUpstream(t)
	zone := zoneName("adaptive_delay")
	fixedAdaptive(t, tc, zone, 1, "\t\t\tdelay 10s", "", up.addr())
	client := loopbackClient(3)
	defer client.CloseIdleConnections()
	up.hold()
	codes, wg := fire(t, client, 3, "/hold", "d-"+nonce)
	up.waitArrived(t, 1)
	select {
	case c := <-codes:
		t.Fatalf("a request answered %d while it should wait", c)
	case <-time.After(300 * time.Millisecond):
	}
	if up.inFlight.Load() != 1 {
		t.Fatalf("%d at the upstream, want 1", up.inFlight.Load())
	}
	up.releaseAll()
	expectAllOK(t, codes, wg, "a waiting request (once a place freed)")
	if up.peak.Load() != 1 {
		t.Fatalf("upstream peak %d, want 1", up.peak.Load())
	}
}

// TestAdaptiveStreamLeavesItsPlace: limit fixed at 1: a long response of
// each shape (an event stream, NDJSON, a download, a gRPC-typed stream)
// gives its place back at its first byte, so another request passes while
// it is still open.
func TestAdaptiveStreamLeavesItsPlace(t *testing.T) {
	tc := newTester(t)
	stop := make(chan struct{})
	types := map[string]string{"/events": "text/event-stream", "/ndjson": "application/x-ndjson",
		"/download": "application/octet-stream", "/grpc": "application/grpc"}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ct, ok := types[r.URL.Path]
		if !ok {
			_, _ = w.Write([]byte("app"))
			return
		}
		w.Header().Set("Content-Type", ct)
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte("data: hello\n\n"))
		w.(http.Flusher).Flush()
		select {
		case <-stop:
		case <-r.Context().Done():
		}
	}))
	defer up.Close()
	defer close(stop)
	zone := zoneName("adaptive_sse")
	fixedAdaptive(t, tc, zone, 1, "", "", up.Listener.Addr().String())
	client := loopbackClient(2)
	defer client.CloseIdleConnections()
	for path := range types {
		req, _ := http.NewRequest(http.MethodGet, siteA+path, nil)
		req.Header.Set("X-User", "s-"+nonce)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 5)
		if _, err := io.ReadFull(resp.Body, buf); err != nil || resp.StatusCode != 200 {
			t.Fatalf("%s: %d, %v", path, resp.StatusCode, err)
		}
		r := get(t, client, siteA+"/app", "X-User: s-"+nonce)
		resp.Body.Close()
		if r.code != http.StatusOK {
			t.Errorf("a request beside an open %s answered %d, want 200 (the long response gave its place back)", path, r.code)
		}
		waitAdaptiveIdle(t, zone)
	}
}

// TestAdaptiveReloadKeepsLimit: the limit learnt (grown from 2 to its
// maximum 5 by four clients in a loop) survives a reload that keeps the
// zone's settings, and starts over at initial when they change. The
// caddy_rate_limit_adaptive_limit gauge shows it.
func TestAdaptiveReloadKeepsLimit(t *testing.T) {
	tc := newTester(t)
	up := newHoldUpstream(t)
	zone := zoneName("adaptive_reload")
	site := func(initial, body string) string {
		return config("", `
http://localhost:@A@ {
	rate_limit {
		zone @ZONE@ {
			key {http.request.header.X-User}
			concurrent adaptive {
				minimum 1
				maximum 5
				initial @INITIAL@
				tolerance 10
				window 10ms
			}
		}
	}
	route {
		reverse_proxy /app* @UP@
		respond "@BODY@"
	}
}
`, "ZONE", zone, "UP", up.addr(), "INITIAL", initial, "BODY", body)
	}
	load(t, tc, site("2", "one"))
	client := loopbackClient(4)
	defer client.CloseIdleConnections()
	deadline := time.Now().Add(20 * time.Second)
	for jsonInt(t, adaptiveListing(t, zone), "limit") < 5 {
		if time.Now().After(deadline) {
			t.Fatalf("the limit did not grow to 5: %v", adaptiveListing(t, zone))
		}
		var wg sync.WaitGroup
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 20 {
					get(t, client, siteA+"/app", "X-User: l-"+nonce)
				}
			}()
		}
		wg.Wait()
	}
	if g := scrapeMetric(t, "caddy_rate_limit_adaptive_limit", `zone="`+zone+`"`); g != 5 {
		t.Errorf("caddy_rate_limit_adaptive_limit %v, want 5", g)
	}
	load(t, tc, site("2", "two")) // the zone's settings unchanged
	if got := jsonInt(t, adaptiveListing(t, zone), "limit"); got != 5 {
		t.Fatalf("after a reload that keeps the zone: limit %d, want the learnt 5", got)
	}
	load(t, tc, site("3", "three")) // changed: learnt afresh
	if got := jsonInt(t, adaptiveListing(t, zone), "limit"); got != 3 {
		t.Fatalf("after a reload that changes the zone: limit %d, want its initial 3", got)
	}
}

// TestAdaptiveRedisPerInstance: with `store redis`, an adaptive zone is
// still decided in this instance's memory: exactly its fixed limit of 3
// of 20 held requests reach the upstream, Redis holds no key of the zone
// (only of the rate zone beside it), and with Redis stopped (the rate
// zone failing open) the adaptive zone still admits exactly 3.
func TestAdaptiveRedisPerInstance(t *testing.T) {
	srv := redistest.Start(t)
	tc := newTester(t)
	up := newHoldUpstream(t)
	zone, rate := zoneName("adaptive_redis"), zoneName("adaptive_redis_rate")
	fixedAdaptive(t, tc, zone, 3, "", `		zone `+rate+` {
			key {http.request.header.X-User}
			events 1000
			window 1h
		}
		store redis `+srv.URL()+` {
			timeout 500ms
		}`, up.addr())
	client := loopbackClient(20)
	defer client.CloseIdleConnections()
	round := func(name string) {
		t.Helper()
		up.hold()
		up.peak.Store(0)
		codes, wg := fire(t, client, 20, "/hold", "rd-"+nonce)
		up.waitArrived(t, 3)
		for i := range 17 {
			select {
			case c := <-codes:
				if c != http.StatusTooManyRequests {
					t.Fatalf("%s: a request answered %d while 3 were held", name, c)
				}
			case <-time.After(20 * time.Second):
				t.Fatalf("%s: only %d refusals came back", name, i)
			}
		}
		if peak := up.peak.Load(); peak != 3 {
			t.Fatalf("%s: upstream peak %d, want exactly 3", name, peak)
		}
		up.releaseAll()
		wg.Wait()
		waitAdaptiveIdle(t, zone)
	}
	round("Redis up")
	keys, err := srv.Client().Keys(context.Background(), "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if strings.Contains(k, zone+":") {
			t.Errorf("Redis holds %q: the adaptive zone's state went to the store", k)
		}
	}
	if !slices.ContainsFunc(keys, func(k string) bool { return strings.Contains(k, rate) }) {
		t.Errorf("Redis holds no key of the rate zone %s: %v", rate, keys)
	}
	srv.Stop()
	round("Redis down")
}

// TestAdaptiveWebSocketLeavesItsPlace: limit fixed at 1: an open WebSocket
// (its 101 is its first byte) gives its place back, so a second WebSocket
// and a plain request pass while the first is still open and echoing, and
// no latency sample is taken of either upgrade.
func TestAdaptiveWebSocketLeavesItsPlace(t *testing.T) {
	app := newWSApp(t)
	zone := zoneName("adaptive_ws")
	load(t, newTester(t), wsConfig(app, `zone @ZONE@ {
			key {http.request.header.X-User}
			concurrent adaptive {
				minimum 1
				maximum 1
				window 1ms
			}
		}`, "ZONE", zone))
	url := "ws://localhost:" + strconv.Itoa(portA) + "/chat"
	user := "aws-" + nonce
	first, code := dialWS(t, url, user)
	if code != http.StatusSwitchingProtocols {
		t.Fatalf("the first WebSocket: %d, want 101", code)
	}
	first.echo(t, "one")
	second, code := dialWS(t, url, user)
	if code != http.StatusSwitchingProtocols {
		t.Fatalf("a second WebSocket beside an open one: %d, want 101 (the first gave its place back at its 101)", code)
	}
	second.echo(t, "two")
	first.echo(t, "still open")
	a := adaptiveListing(t, zone)
	if jsonInt(t, a, "in_flight") != 0 || a["latency_ms"] != 0.0 {
		t.Fatalf("admin listing with two WebSockets open: %v, want nothing in flight and no latency sampled", a)
	}
}

// TestAdaptivePerClientAndMatch: keyed per client, each client has a limit
// of its own (fixed at 2: alice's third held request is refused, bob's two
// pass); with match, the zone leaves other paths alone.
func TestAdaptivePerClientAndMatch(t *testing.T) {
	tc := newTester(t)
	up := newHoldUpstream(t)
	zone := zoneName("adaptive_match")
	fixedAdaptive(t, tc, zone, 2, "\t\t\tmatch {\n\t\t\t\tpath /hold*\n\t\t\t}", "", up.addr())
	client := loopbackClient(8)
	defer client.CloseIdleConnections()
	up.hold()
	alice, aliceWG := fire(t, client, 3, "/hold", "alice-"+nonce)
	up.waitArrived(t, 2)
	if c := <-alice; c != http.StatusTooManyRequests {
		t.Fatalf("alice's third request: %d, want 429", c)
	}
	bob, bobWG := fire(t, client, 2, "/hold", "bob-"+nonce)
	up.waitArrived(t, 2)
	if r := get(t, client, siteA+"/app", "X-User: alice-"+nonce); r.code != http.StatusOK {
		t.Fatalf("a path the zone does not match: %d, want 200", r.code)
	}
	if got := up.inFlight.Load(); got != 4 {
		t.Fatalf("%d held at the upstream, want alice's 2 and bob's 2", got)
	}
	if a := adaptiveListing(t, zone); jsonInt(t, a, "keys") != 2 || jsonInt(t, a, "in_flight") != 4 {
		t.Fatalf("admin listing %v, want 2 keys and 4 in flight", a)
	}
	up.releaseAll()
	aliceWG.Wait()
	expectAllOK(t, bob, bobWG, "bob's request")
}
