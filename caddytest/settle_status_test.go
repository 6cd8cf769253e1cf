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
	"testing"
	"time"

	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// settleStatusSite is a settle zone (events 1000, cost 100, settle
// @SOURCE@) in front of an upstream that answers /status/<code> with that
// status and a body reporting 300 tokens, and /hold by waiting for the
// client to leave; /down goes to an upstream that does not listen, and
// /refused through a second rate_limit whose zone admits one request.
const settleStatusSite = `
http://localhost:@A@ {
	rate_limit {
		zone @ZONE@ {
			key {http.request.header.X-Key}
			events 1000
			window 1h
			cost 100
			settle @SOURCE@
		}
		@STORE@
	}
	handle /down {
		reverse_proxy @DOWN@
	}
	handle /refused {
		rate_limit {
			zone @ZONE@_once {
				key {http.request.uri.path}
				events 1
				window 1h
			}
		}
		reverse_proxy @APP@
	}
	handle {
		reverse_proxy @APP@ {
			flush_interval -1
		}
	}
}`

// statusUpstream answers /status/<code> with code and a JSON body telling
// 300 tokens; /hold signals held and waits for the client to leave.
func statusUpstream(t *testing.T, held chan<- struct{}) *httptest.Server {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hold" {
			held <- struct{}{}
			<-r.Context().Done()
			return
		}
		code, err := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/status/"))
		if err != nil {
			code = http.StatusOK
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		io.WriteString(w, `{"usage":{"total_tokens":300}}`)
	}))
	t.Cleanup(up.Close)
	return up
}

// closedAddr is a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// settledTo waits for the key's charges in flight to settle and checks
// what the zone kept: the admin API reads the key without charging it;
// in_flight says when the settle has landed (a Redis store queues it).
func settledTo(t *testing.T, zone, key string, spent int64, what string) {
	t.Helper()
	path := "/rate_limit/zones/" + zone + "/keys/" + url.PathEscape(key)
	deadline := time.Now().Add(5 * time.Second)
	for {
		code, body := adminAPI(t, "GET", path)
		if code != http.StatusOK {
			t.Fatalf("%s: GET %s: %d %v", what, path, code, body)
		}
		inFlight, ok := body["in_flight"].(float64)
		if !ok {
			t.Fatalf("%s: the key's view has no in_flight: %v", what, body)
		}
		if inFlight == 0 {
			if rem, _ := body["remaining"].(float64); int64(rem) != 1000-spent {
				t.Errorf("%s: the key kept %v of 1000, want %d charged", what, 1000-rem, spent)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v units still in flight after 5s", what, inFlight)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// runStatusCases sends each case's request with a key of its own and
// checks what it was charged.
func runStatusCases(t *testing.T, store, source string, cases []struct {
	path  string
	want  int // the status the client sees
	spent int64
}) {
	t.Helper()
	up := statusUpstream(t, nil)
	zone := zoneName("settle_status")
	load(t, newTester(t), config("", settleStatusSite, "ZONE", zone, "APP", up.Listener.Addr().String(),
		"DOWN", closedAddr(t), "SOURCE", source, "STORE", store))
	c := loopbackClient(8)
	for i, sc := range cases {
		key := "status" + strconv.Itoa(i) + strings.ReplaceAll(sc.path, "/", "_") + nonce
		expect(t, get(t, c, siteA+sc.path, "X-Key: "+key), sc.want, sc.path)
		settledTo(t, zone, key, sc.spent, sc.path)
	}
}

// statusClasses are the cases of the default rule (free 5xx 429): a 2xx
// settles to the amount told, a 4xx other than 429 is charged (its amount:
// the upstream billed the call), 429 and 5xx give the estimate back,
// whatever their body tells; so do the proxy's own 502 for an upstream
// down and a later rate_limit's refusal (the upstream never saw those).
var statusClasses = []struct {
	path  string
	want  int
	spent int64
}{
	{"/status/200", 200, 300},
	{"/status/201", 201, 300},
	{"/status/400", 400, 300},
	{"/status/404", 404, 300},
	{"/status/429", 429, 0},
	{"/status/500", 500, 0},
	{"/status/503", 503, 0},
	{"/down", 502, 0},
	{"/refused", 200, 300},
	{"/refused", 429, 0},
}

// TestSettleStatusMemory: each status class under the default rule,
// memory store.
func TestSettleStatusMemory(t *testing.T) {
	runStatusCases(t, "", "json usage.total_tokens", statusClasses)
}

// TestSettleStatusRedis: each status class under the default rule, Redis
// store.
func TestSettleStatusRedis(t *testing.T) {
	srv := redistest.Start(t)
	runStatusCases(t, "store redis "+srv.URL(), "json usage.total_tokens", statusClasses)
}

// TestSettleStatusChosen: `free none` charges every status (the 500's
// amount, the 429's), `free 4xx` gives 4xx back and charges 5xx (the
// estimate when nothing is told: the proxy's 502).
func TestSettleStatusChosen(t *testing.T) {
	type c = struct {
		path  string
		want  int
		spent int64
	}
	t.Run("none", func(t *testing.T) {
		runStatusCases(t, "", "json usage.total_tokens {\n\t\t\t\tfree none\n\t\t\t}", []c{
			{"/status/200", 200, 300}, {"/status/429", 429, 300}, {"/status/500", 500, 300}, {"/down", 502, 100},
		})
	})
	t.Run("4xx", func(t *testing.T) {
		runStatusCases(t, "", "json usage.total_tokens {\n\t\t\t\tfree 4xx\n\t\t\t}", []c{
			{"/status/200", 200, 300}, {"/status/404", 404, 0}, {"/status/429", 429, 0}, {"/status/500", 500, 300}, {"/down", 502, 100},
		})
	})
}

// TestSettleStatusClientLeft: a client that leaves before the upstream
// answers keeps the estimate (the call was forwarded, and may be billed):
// leaving is never cheaper than a status given back.
func TestSettleStatusClientLeft(t *testing.T) {
	held := make(chan struct{}, 1)
	up := statusUpstream(t, held)
	zone := zoneName("settle_left")
	load(t, newTester(t), config("", settleStatusSite, "ZONE", zone, "APP", up.Listener.Addr().String(),
		"DOWN", closedAddr(t), "SOURCE", "json usage.total_tokens", "STORE", ""))
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, siteA+"/hold", nil)
	key := "left" + nonce
	req.Header.Set("X-Key", key)
	done := make(chan error, 1)
	go func() {
		resp, err := loopbackClient(2).Do(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	<-held
	cancel()
	<-done
	settledTo(t, zone, key, 100, "a client gone before the status")
}
