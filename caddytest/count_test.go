package caddytest_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// loginApp is a stand-in login application: 401 unless X-Password is
// "right"; it counts the attempts it sees per account (X-User) and takes
// delay to answer.
type loginApp struct {
	*httptest.Server
	mu    sync.Mutex
	seen  map[string]int
	delay time.Duration
}

func newLoginApp(t *testing.T, delay time.Duration) *loginApp {
	a := &loginApp{seen: map[string]int{}, delay: delay}
	a.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.mu.Lock()
		a.seen[r.Header.Get("X-User")]++
		a.mu.Unlock()
		time.Sleep(a.delay)
		if r.Header.Get("X-Password") != "right" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		_, _ = w.Write([]byte("welcome"))
	}))
	t.Cleanup(a.Close)
	return a
}

// countLoginSite is a site of one count zone keyed on the account (events
// 5, count 401) in front of a login application.
const countLoginSite = `
http://localhost:@A@ {
	rate_limit {
		zone @ZONE@ {
			key {http.request.header.X-User}
			events 5
			window 1h
			count 401
		}
	}
	reverse_proxy @APP@
}`

func (a *loginApp) saw(user string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.seen[user]
}

// The concurrency test, in one Caddy with the memory store, behind
// reverse_proxy (the status is the upstream's): 50 concurrent
// wrong-password logins for one account against events 5, count 401: the
// upstream sees exactly 5 and the other 45 are refused; 1,000
// right-password logins for another account all pass and leave its zone
// untouched.
func TestCountConcurrentLoginsMemory(t *testing.T) {
	app := newLoginApp(t, 50*time.Millisecond)
	zone := zoneName("count_login")
	load(t, newTester(t), config("", countLoginSite, "ZONE", zone, "APP", app.Listener.Addr().String()))
	c := loopbackClient(64)
	victim, owner := "victim-"+nonce, "owner-"+nonce
	out, _ := burstDo(t, c, http.MethodPost, siteA+"/login", 50, 50, "X-User: "+victim, "X-Password: wrong")
	unauthorized, refused := 0, 0
	for i, o := range out {
		switch {
		case o.err != nil:
			t.Errorf("request %d: %v", i, o.err)
		case o.code == http.StatusUnauthorized:
			unauthorized++
		case o.code == http.StatusTooManyRequests:
			refused++
		default:
			t.Errorf("request %d: status %d", i, o.code)
		}
	}
	if got := app.saw(victim); got != 5 || unauthorized != 5 || refused != 45 {
		t.Fatalf("50 concurrent wrong passwords: the upstream saw %d (%d answered 401), %d refused; want exactly 5 and 45", got, unauthorized, refused)
	}
	app.delay = 0
	// Four at a time: a charge is taken before the response, so more
	// logins of one account in flight at once than its capacity (5) wait
	// for the charges in flight (TestCountInFlightWaits).
	out, _ = burstDo(t, c, http.MethodPost, siteA+"/login", 1000, 4, "X-User: "+owner, "X-Password: right")
	if ok, refused := countBurst(t, out, "1,000 right-password logins"); ok != 1000 || refused != 0 {
		t.Fatalf("1,000 right-password logins: %d passed, %d refused; want all", ok, refused)
	}
	if got := app.saw(owner); got != 1000 {
		t.Fatalf("the upstream saw %d right-password logins, want 1000", got)
	}
	expectZoneUntouched(t, zone, owner, 5)
}

// expectZoneUntouched checks through the admin API that key holds no
// charge in zone: remaining = capacity, back to full.
func expectZoneUntouched(t *testing.T, zone, key string, capacity int64) {
	t.Helper()
	// A refund is given back as the response's header is written: it may
	// land a moment after the client has its answer.
	deadline := time.Now().Add(2 * time.Second)
	for {
		code, body := adminAPI(t, http.MethodGet, "/rate_limit/zones/"+zone+"/keys/"+key)
		if code != http.StatusOK {
			t.Fatalf("peek: %d %v", code, body)
		}
		if jsonInt(t, body, "remaining") == capacity && jsonInt(t, body, "reset_after_ms") == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("zone %s, key %s: %v; want it untouched (remaining %d, full)", zone, key, body, capacity)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// count with basic_auth and handle_errors: rate_limit runs before
// basic_auth (its default order), so a wrong password is basic_auth's 401
// error, which the site's handle_errors renders: it counts. A right one
// does not.
func TestCountWithBasicAuthAndHandleErrors(t *testing.T) {
	zone := zoneName("count_basic")
	load(t, newTester(t), config("", `
http://localhost:@A@ {
	rate_limit {
		zone @ZONE@ {
			key {client_ip}
			events 3
			window 1h
			count 401
		}
	}
	basic_auth {
		alice $2a$04$xxYDoGSASAtMnSGV1SP7nOJt7YYEVvhJ9nWL0nugD7EUeXb6CjTdy
	}
	respond "hello alice"
	handle_errors 401 {
		respond "who are you?" 401
	}
}`, "ZONE", zone))
	good, bad := clientFrom(t, "127.0.3.1"), clientFrom(t, "127.0.3.2")
	auth := func(c *http.Client, password string) result {
		req, _ := http.NewRequest(http.MethodGet, siteA+"/", nil)
		req.SetBasicAuth("alice", password)
		resp, err := doRetry(t, c, req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b := new(strings.Builder)
		_, _ = io.Copy(b, resp.Body)
		return result{code: resp.StatusCode, header: resp.Header, body: b.String()}
	}
	for i := range 30 {
		if r := auth(good, "right"); r.code != 200 {
			t.Fatalf("right password #%d: %d %q", i, r.code, r.body)
		}
	}
	expectZoneUntouched(t, zone, "127.0.3.1", 3)
	for i := range 3 {
		if r := auth(bad, "wrong"); r.code != 401 || r.body != "who are you?" {
			t.Fatalf("wrong password #%d: %d %q, want handle_errors' 401", i, r.code, r.body)
		}
	}
	if r := auth(bad, "wrong"); r.code != 429 {
		t.Fatalf("4th wrong password: %d %q, want 429", r.code, r.body)
	}
	if r := auth(bad, "right"); r.code != 429 {
		t.Fatalf("the right password after 3 failures: %d, want 429 (refused requests are not forwarded)", r.code)
	}
}

// A streamed response is settled at its first write: with events 1 and
// count 5xx, a second request passes while the first stream still runs.
func TestCountStreamedResponse(t *testing.T) {
	release := make(chan struct{})
	var started atomic.Int64
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		started.Add(1) // before the first event: the client may read it before a later line runs
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte("data: hello\n\n"))
		http.NewResponseController(w).Flush()
		<-release
		_, _ = w.Write([]byte("data: bye\n\n"))
	}))
	defer upstream.Close()
	defer close(release)
	zone := zoneName("count_stream")
	load(t, newTester(t), config("", `
http://localhost:@A@ {
	rate_limit {
		zone @ZONE@ {
			key {http.request.header.X-User}
			events 1
			window 1h
			count 5xx
		}
	}
	reverse_proxy @UP@ {
		flush_interval -1
	}
}`, "ZONE", zone, "UP", upstream.Listener.Addr().String()))
	c := loopbackClient(4)
	req, _ := http.NewRequest(http.MethodGet, siteA+"/events", nil)
	req.Header.Set("X-User", "streamer")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	buf := make([]byte, 64)
	if n, err := resp.Body.Read(buf); err != nil || !strings.Contains(string(buf[:n]), "hello") {
		t.Fatalf("first event: %q %v", buf[:n], err)
	}
	// The first stream is still open; its charge was given back at its
	// header (200 is not counted).
	expectZoneUntouched(t, zone, "streamer", 1)
	req2, _ := http.NewRequest(http.MethodGet, siteA+"/events", nil)
	req2.Header.Set("X-User", "streamer")
	resp2, err := c.Do(req2)
	if err != nil {
		t.Fatal(err)
	}
	defer resp2.Body.Close()
	if resp2.StatusCode != http.StatusOK {
		t.Fatalf("a second stream while the first runs: %d, want 200", resp2.StatusCode)
	}
	if n, err := resp2.Body.Read(buf); err != nil || !strings.Contains(string(buf[:n]), "hello") {
		t.Fatalf("the second stream's first event: %q %v", buf[:n], err)
	}
	if started.Load() != 2 {
		t.Fatalf("the upstream started %d streams, want 2", started.Load())
	}
}

// on_exceed pass behind reverse_proxy: the upstream receives the
// placeholder header (true) on exactly the would-be refusals (false on
// the others), and every request.
func TestSoftModeHeaderUp(t *testing.T) {
	var mu sync.Mutex
	var marks []string
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		marks = append(marks, r.Header.Get("X-Quota-Exceeded")+"|"+r.Header.Get("X-Quota-Zone"))
		mu.Unlock()
		_, _ = w.Write([]byte("ok"))
	}))
	defer upstream.Close()
	zone := zoneName("soft")
	load(t, newTester(t), config("", `
http://localhost:@A@ {
	rate_limit {
		zone @ZONE@ {
			key {http.request.header.X-User}
			events 3
			window 1h
			on_exceed pass
		}
	}
	reverse_proxy @UP@ {
		header_up X-Quota-Exceeded {http.rate_limit.exceeded}
		header_up X-Quota-Zone {http.rate_limit.zone}
	}
}`, "ZONE", zone, "UP", upstream.Listener.Addr().String()))
	c := loopbackClient(2)
	for i := range 10 {
		expect(t, get(t, c, siteA+"/", "X-User: soft-"+nonce), 200, "request "+strconv.Itoa(i+1))
	}
	if len(marks) != 10 {
		t.Fatalf("the upstream saw %d requests, want 10", len(marks))
	}
	for i, m := range marks {
		want := "false|"
		if i >= 3 {
			want = "true|" + zone
		}
		if m != want {
			t.Errorf("request %d reached the upstream with %q (exceeded|zone), want %q", i+1, m, want)
		}
	}
}
