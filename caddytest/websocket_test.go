package caddytest_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// wsApp is the WebSocket application behind Caddy (coder/websocket): it
// echoes every message, closes the connection itself on the message
// "close", and counts the connections open in it, their peak and every
// upgrade that reached it.
type wsApp struct {
	srv                  *httptest.Server
	open, peak, accepted atomic.Int64
	plain                atomic.Int64 // plain (not upgrade) requests answered
}

func newWSApp(t *testing.T) *wsApp {
	a := &wsApp{}
	a.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") == "" {
			a.plain.Add(1)
			_, _ = w.Write([]byte("plain"))
			return
		}
		// Counted on arrival, before the 101 is written: a client that
		// sees its 101 finds its connection counted.
		a.accepted.Add(1)
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		cur := a.open.Add(1)
		defer a.open.Add(-1)
		for p := a.peak.Load(); cur > p && !a.peak.CompareAndSwap(p, cur); p = a.peak.Load() {
		}
		ctx := context.Background()
		for {
			typ, msg, err := c.Read(ctx)
			if err != nil {
				c.CloseNow()
				return
			}
			if string(msg) == "close" {
				c.Close(websocket.StatusNormalClosure, "closed by the server")
				return
			}
			if err := c.Write(ctx, typ, msg); err != nil {
				c.CloseNow()
				return
			}
		}
	}))
	t.Cleanup(a.srv.Close)
	return a
}

// wsConn is one client connection, with its TCP connection (to drop it
// without a close handshake).
type wsConn struct {
	c   *websocket.Conn
	tcp net.Conn
}

// dialWS opens a WebSocket to url as user; it returns the connection, or
// the HTTP status of the refused upgrade.
func dialWS(t *testing.T, url, user string) (*wsConn, int) {
	t.Helper()
	var tcp net.Conn
	var mu sync.Mutex
	tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, "tcp4", addr)
		mu.Lock()
		tcp = c
		mu.Unlock()
		return c, err
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{
		HTTPClient: &http.Client{Transport: tr},
		HTTPHeader: http.Header{"X-User": {user}},
	})
	if err != nil {
		if resp != nil {
			return nil, resp.StatusCode
		}
		t.Fatalf("dial %s: %v", url, err)
	}
	mu.Lock()
	defer mu.Unlock()
	t.Cleanup(func() { c.CloseNow() })
	return &wsConn{c: c, tcp: tcp}, http.StatusSwitchingProtocols
}

// echo sends msg and reads it back.
// waitOpen waits until the app holds n connections.
func (a *wsApp) waitOpen(t *testing.T, n int64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for a.open.Load() != n {
		if time.Now().After(deadline) {
			t.Fatalf("the app holds %d connections, want %d", a.open.Load(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (w *wsConn) echo(t *testing.T, msg string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := w.c.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
		t.Fatalf("write: %v", err)
	}
	_, got, err := w.c.Read(ctx)
	if err != nil || string(got) != msg {
		t.Fatalf("read: %q %v, want %q", got, err, msg)
	}
}

// waitClosed waits until the connection reports its closing (a server
// close reaches the client as a close frame).
func (w *wsConn) waitClosed(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, _, err := w.c.Read(ctx)
	var ce websocket.CloseError
	if !errors.As(err, &ce) {
		t.Fatalf("after the server's close: %v, want a close frame", err)
	}
}

// admitWithin dials until the upgrade is let in (a refused upgrade spends
// nothing), for the slot a connection's end frees once Caddy has seen it.
func admitWithin(t *testing.T, url, user string, d time.Duration) (*wsConn, time.Duration) {
	t.Helper()
	start := time.Now()
	for {
		c, code := dialWS(t, url, user)
		if code == http.StatusSwitchingProtocols {
			return c, time.Since(start)
		}
		if code != http.StatusTooManyRequests {
			t.Fatalf("upgrade: status %d, want 101 or 429", code)
		}
		if time.Since(start) > d {
			t.Fatalf("no slot freed within %v", d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// wsSite is a site in front of the WebSocket app with the rate_limit block
// @LIMIT@.
const wsSite = `http://localhost:@A@ {
	rate_limit {
		@LIMIT@
	}
	reverse_proxy @APP@
}
`

// wsConfig renders wsSite with the limit block (whose @NAME@ variables
// are replaced by vars first) in front of app.
func wsConfig(app *wsApp, limit string, vars ...string) string {
	for i := 0; i+1 < len(vars); i += 2 {
		limit = strings.ReplaceAll(limit, "@"+vars[i]+"@", vars[i+1])
	}
	return config("", wsSite, "LIMIT", limit, "APP", app.srv.Listener.Addr().String())
}

// TestWebSocketConcurrent: a concurrency zone (concurrent 3 per user) on a
// WebSocket route, with coder/websocket's client: three connections open,
// the fourth is refused with 429 before the upgrade (the app never sees
// it); the end of a connection frees its slot whichever way it ends (the
// client's close, the server's close, the TCP connection dropped), so the
// next one gets in, and the app never holds more than 3 of the user's.
func TestWebSocketConcurrent(t *testing.T) {
	app := newWSApp(t)
	z := zoneName("ws_conc")
	load(t, newTester(t), wsConfig(app, `zone @ZONE@ {
			key {http.request.header.X-User}
			concurrent 3
		}`, "ZONE", z))
	url := "ws://localhost:" + strconv.Itoa(portA) + "/chat"
	user := "ws-" + nonce

	conns := make([]*wsConn, 3)
	for i := range conns {
		c, code := dialWS(t, url, user)
		if code != http.StatusSwitchingProtocols {
			t.Fatalf("connection %d: status %d, want 101", i+1, code)
		}
		c.echo(t, "hello "+strconv.Itoa(i))
		conns[i] = c
	}
	refused := func(what string) {
		t.Helper()
		before := app.accepted.Load()
		if _, code := dialWS(t, url, user); code != http.StatusTooManyRequests {
			t.Errorf("%s: status %d, want 429", what, code)
		}
		if app.accepted.Load() != before {
			t.Errorf("%s: the refused upgrade reached the app", what)
		}
	}
	refused("a fourth connection")
	if _, code := dialWS(t, url, "other-"+nonce); code != http.StatusSwitchingProtocols {
		t.Errorf("another user: status %d, want 101", code)
	}

	// The client closes connection 1.
	if err := conns[0].c.Close(websocket.StatusNormalClosure, "bye"); err != nil {
		t.Fatal(err)
	}
	app.waitOpen(t, 3)
	c, waited := admitWithin(t, url, user, 3*time.Second)
	t.Logf("client close: the next connection got in after %v", waited)
	conns[0] = c
	refused("a fourth connection after the client's close")

	// The server closes connection 2.
	if err := conns[1].c.Write(context.Background(), websocket.MessageText, []byte("close")); err != nil {
		t.Fatal(err)
	}
	conns[1].waitClosed(t)
	app.waitOpen(t, 3)
	c, waited = admitWithin(t, url, user, 3*time.Second)
	t.Logf("server close: the next connection got in after %v", waited)
	conns[1] = c
	refused("a fourth connection after the server's close")

	// Connection 3's TCP connection is dropped: no close frame.
	if err := conns[2].tcp.Close(); err != nil {
		t.Fatal(err)
	}
	app.waitOpen(t, 3)
	c, waited = admitWithin(t, url, user, 5*time.Second)
	t.Logf("dropped TCP: the next connection got in after %v", waited)
	conns[2] = c
	refused("a fourth connection after the dropped one")
	for _, c := range conns {
		c.echo(t, "still open")
	}
	// The app's peak counts the other user's connection too. (The next
	// connection is let in once the app saw the last one end: Caddy gives
	// the slot back as its tunnel ends and closes its connection to the app
	// a moment later, so the app may briefly overlap two.)
	if p := app.peak.Load(); p > 4 {
		t.Errorf("the app held %d connections at once, want at most 4 (3 of the user, 1 of another)", p)
	}
	if n := app.accepted.Load(); n != 7 {
		t.Errorf("the app accepted %d connections, want 7 (3, 1 of another user, and 3 replacements)", n)
	}
}

// TestWebSocketRateAndCount: a rate zone charges the upgrade, not the
// frames (2 connections per hour: 100 messages on them spend nothing, the
// third upgrade is refused); a count zone that counts only 101 sees the
// upgrade's status: plain requests on the same route are given back,
// upgrades are kept, also once their connections have ended.
func TestWebSocketRateAndCount(t *testing.T) {
	app := newWSApp(t)
	zr, zc := zoneName("ws_rate"), zoneName("ws_count")
	load(t, newTester(t), wsConfig(app, `zone @ZR@ {
			key {http.request.header.X-User}
			match {
				header X-Zone rate
			}
			events 2
			window 1h
		}
		zone @ZC@ {
			key {http.request.header.X-User}
			match {
				header X-Zone count
			}
			events 2
			window 1h
			count 101
		}`, "ZR", zr, "ZC", zc))
	url := "ws://localhost:" + strconv.Itoa(portA) + "/chat"
	c := loopbackClient(2)
	defer c.CloseIdleConnections()

	dial := func(user, zone string) (*wsConn, int) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		conn, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPHeader: http.Header{"X-User": {user}, "X-Zone": {zone}}})
		if err != nil {
			if resp != nil {
				return nil, resp.StatusCode
			}
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.CloseNow() })
		return &wsConn{c: conn}, http.StatusSwitchingProtocols
	}

	user := "wr-" + nonce
	for i := range 2 {
		conn, code := dial(user, "rate")
		if code != http.StatusSwitchingProtocols {
			t.Fatalf("rate zone, upgrade %d: %d, want 101", i+1, code)
		}
		for j := range 50 {
			conn.echo(t, "m"+strconv.Itoa(j))
		}
	}
	if _, code := dial(user, "rate"); code != http.StatusTooManyRequests {
		t.Errorf("rate zone, third upgrade after 100 messages: %d, want 429", code)
	}

	user = "wc-" + nonce
	for i := range 5 {
		expect(t, get(t, c, siteA+"/page", "X-User: "+user, "X-Zone: count"), 200, "count zone, plain request "+strconv.Itoa(i+1))
	}
	for i := range 2 {
		conn, code := dial(user, "count")
		if code != http.StatusSwitchingProtocols {
			t.Fatalf("count zone, upgrade %d: %d, want 101", i+1, code)
		}
		conn.echo(t, "x")
		_ = conn.c.Close(websocket.StatusNormalClosure, "")
	}
	time.Sleep(100 * time.Millisecond) // let the closed connections' ends reach Caddy
	if _, code := dial(user, "count"); code != http.StatusTooManyRequests {
		t.Errorf("count zone, third upgrade (two 101s counted, five 200s not): %d, want 429", code)
	}
	if n := app.plain.Load(); n != 5 {
		t.Errorf("the app answered %d plain requests, want 5", n)
	}
}
