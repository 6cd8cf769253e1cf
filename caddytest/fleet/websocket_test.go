package fleet_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// wsEcho is a WebSocket application (coder/websocket) that echoes messages,
// closes on "close", and counts the connections open in it and their peak.
type wsEcho struct {
	srv        *httptest.Server
	open, peak atomic.Int64
}

func newWSEcho(t *testing.T) *wsEcho {
	a := &wsEcho{}
	a.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		cur := a.open.Add(1)
		defer a.open.Add(-1)
		for p := a.peak.Load(); cur > p && !a.peak.CompareAndSwap(p, cur); p = a.peak.Load() {
		}
		for {
			typ, msg, err := c.Read(context.Background())
			if err != nil {
				c.CloseNow()
				return
			}
			if string(msg) == "close" {
				c.Close(websocket.StatusNormalClosure, "")
				return
			}
			_ = c.Write(context.Background(), typ, msg)
		}
	}))
	t.Cleanup(a.srv.Close)
	return a
}

type fleetWS struct {
	c   *websocket.Conn
	tcp net.Conn
}

// dialFleetWS opens a WebSocket to p as user: the connection, or the
// refused upgrade's status.
func dialFleetWS(t *testing.T, p *caddyProc, user string) (*fleetWS, int) {
	t.Helper()
	var mu sync.Mutex
	var tcp net.Conn
	tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, "tcp4", addr)
		mu.Lock()
		tcp = c
		mu.Unlock()
		return c, err
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, "ws://127.0.0.1:"+strconv.Itoa(p.httpPort)+"/ws", &websocket.DialOptions{
		HTTPClient: &http.Client{Transport: tr},
		HTTPHeader: http.Header{"X-User": {user}},
	})
	if err != nil {
		if resp != nil {
			return nil, resp.StatusCode
		}
		t.Fatalf("dial %s: %v", p.name, err)
	}
	t.Cleanup(func() { c.CloseNow() })
	mu.Lock()
	defer mu.Unlock()
	return &fleetWS{c: c, tcp: tcp}, http.StatusSwitchingProtocols
}

// TestWebSocketFleetExact: 3 Caddy processes sharing one Redis, a WebSocket
// route with `concurrent 3` per user. 12 upgrades at once, 4 per process,
// open exactly 3 connections (9 refused with 429), and Redis holds exactly
// 3 live slots; then, one at a time, a connection ends on one process (the
// client's close, the server's close, a dropped TCP connection) and a new
// one gets in on another, the fourth always refused, the app never holding
// more than 3; and connections that outlive their lease keep their slots.
func TestWebSocketFleetExact(t *testing.T) {
	r := redistest.Start(t)
	app := newWSEcho(t)
	const zone = "ws_fleet"
	routes := fmt.Sprintf(`rate_limit {
	zone %s {
		key {http.request.header.X-User}
		concurrent 3
		lease 2s
	}
	store redis %s {
		timeout 250ms
	}
}
reverse_proxy %s`, zone, r.URL(), app.srv.Listener.Addr().String())
	procs := make([]*caddyProc, 3)
	for i := range procs {
		procs[i] = startCaddy(t, fmt.Sprintf("%s-%d", zone, i), "", routes)
	}
	user := "ws-" + nonce

	type dialed struct {
		c    *fleetWS
		code int
		proc int
	}
	out := make(chan dialed, 12)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			c, code := dialFleetWS(t, procs[i%3], user)
			out <- dialed{c, code, i % 3}
		}()
	}
	close(start)
	wg.Wait()
	close(out)
	var open []dialed
	refused := 0
	for d := range out {
		switch d.code {
		case http.StatusSwitchingProtocols:
			open = append(open, d)
		case http.StatusTooManyRequests:
			refused++
		default:
			t.Errorf("upgrade on process %d: status %d", d.proc, d.code)
		}
	}
	keys := scanKeys(t, r, "sluice:v1:"+zone+":{*}:slots")
	if len(keys) != 1 {
		t.Fatalf("slots keys in Redis: %v, want one", keys)
	}
	live := liveSlots(t, r, keys[0])
	t.Logf("12 upgrades at once on 3 processes: %d open, %d refused; Redis holds %d live slots", len(open), refused, live)
	if len(open) != 3 || refused != 9 || live != 3 {
		t.Fatalf("%d open, %d refused, %d live slots; want 3, 9, 3", len(open), refused, live)
	}

	fourthRefused := func(what string) {
		t.Helper()
		for i, p := range procs {
			if _, code := dialFleetWS(t, p, user); code != http.StatusTooManyRequests {
				t.Errorf("%s: a fourth connection on process %d: %d, want 429", what, i, code)
			}
		}
	}
	fourthRefused("3 open")
	// admit dials process p until a slot freed elsewhere lets it in.
	admit := func(p int, what string) *fleetWS {
		t.Helper()
		began := time.Now()
		for {
			c, code := dialFleetWS(t, procs[p], user)
			if code == http.StatusSwitchingProtocols {
				t.Logf("%s: a new connection on process %d after %v", what, p, time.Since(began).Round(time.Millisecond))
				return c
			}
			if time.Since(began) > 5*time.Second {
				t.Fatalf("%s: no slot freed within 5s (last status %d)", what, code)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	ends := []struct {
		what string
		end  func(c *fleetWS)
	}{
		{"client close", func(c *fleetWS) { _ = c.c.Close(websocket.StatusNormalClosure, "") }},
		{"server close", func(c *fleetWS) {
			_ = c.c.Write(context.Background(), websocket.MessageText, []byte("close"))
			_, _, _ = c.c.Read(context.Background())
		}},
		{"dropped TCP", func(c *fleetWS) { _ = c.tcp.Close() }},
	}
	for i, e := range ends {
		e.end(open[i].c)
		// Caddy gives the slot back when its tunnel ends, and closes its
		// connection to the app a moment later (reverse_proxy closes the
		// backend in a goroutine); the app sees the end later still. So
		// the next connection is let in once the app saw this one end:
		// then the app's peak says whether it ever held more than 3.
		if _, ok := waitFor(5*time.Second, func() bool { return app.open.Load() == 2 }); !ok {
			t.Fatalf("after the %s: the app still holds %d connections", e.what, app.open.Load())
		}
		next := (open[i].proc + 1) % 3
		open[i] = dialed{c: admit(next, e.what), proc: next}
		fourthRefused("after the " + e.what)
		if n := liveSlots(t, r, keys[0]); n != 3 {
			t.Errorf("after the %s: %d live slots, want 3", e.what, n)
		}
	}
	// Connections outlive their 2s lease: the slot keeper renews it.
	time.Sleep(3 * time.Second)
	if n := liveSlots(t, r, keys[0]); n != 3 {
		t.Errorf("3s after, past the 2s lease: %d live slots, want 3", n)
	}
	fourthRefused("past the lease")
	if p := app.peak.Load(); p > 3 {
		t.Errorf("the app held %d connections at once, want at most 3", p)
	}
}
