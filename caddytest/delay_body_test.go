package caddytest_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"
)

// bodyArrival is what the stand-in application got of one request.
type bodyArrival struct {
	leaver bool // sent by a client that hung up while it waited
	size   int
	sum    [32]byte
	wait   int       // X-Delay-Ms
	err    error     // reading the body
	at     time.Time // when the body was read
}

// bodyApp is a stand-in application that reads every request's body whole
// and records its size and SHA-256, by X-User.
type bodyApp struct {
	*httptest.Server
	mu  sync.Mutex
	got map[string][]bodyArrival
}

func newBodyApp(t *testing.T) *bodyApp {
	a := &bodyApp{got: map[string][]bodyArrival{}}
	a.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := sha256.New()
		n, err := io.Copy(h, r.Body)
		ar := bodyArrival{leaver: r.Header.Get("X-Leaver") != "", size: int(n), err: err}
		h.Sum(ar.sum[:0])
		ar.wait, _ = strconv.Atoi(r.Header.Get("X-Delay-Ms"))
		ar.at = time.Now()
		a.mu.Lock()
		a.got[r.Header.Get("X-User")] = append(a.got[r.Header.Get("X-User")], ar)
		a.mu.Unlock()
		_, _ = w.Write([]byte("ok"))
	}))
	t.Cleanup(a.Close)
	return a
}

func (a *bodyApp) arrivals(user string) []bodyArrival {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]bodyArrival(nil), a.got[user]...)
}

// stalledBody gives part, then blocks until ctx ends: a client that hangs
// up in the middle of its upload.
type stalledBody struct {
	part []byte
	ctx  context.Context
}

func (s *stalledBody) Read(p []byte) (int, error) {
	if len(s.part) > 0 {
		n := copy(p, s.part)
		s.part = s.part[n:]
		return n, nil
	}
	<-s.ctx.Done()
	return 0, s.ctx.Err()
}

// dribbledBody gives b in eight pieces, pausing before each: an upload
// still going on when its wait for its turn ends.
type dribbledBody struct {
	b     []byte
	piece int
	left  int // of the current piece
}

func (d *dribbledBody) Read(p []byte) (int, error) {
	if len(d.b) == 0 {
		return 0, io.EOF
	}
	if d.left == 0 {
		time.Sleep(100 * time.Millisecond)
		d.left = d.piece
	}
	n := copy(p[:min(len(p), d.left)], d.b)
	d.b, d.left = d.b[n:], d.left-n
	return n, nil
}

// A waiter with a request body whose client hangs up (issue 23 item 3),
// through a real Caddy with a delay zone, over HTTP/1.1 and HTTP/2 (h2c),
// with bodies of 0 bytes, 100 bytes, 64 KiB and 1 MiB (beyond what is read
// ahead while waiting). Per case, after a first request that spends the
// burst: three clients send a request that must wait 1, 2 and 3 s, and
// hang up after 0.5 s (the 1 MiB ones in the middle of their upload, the
// others once they sent their whole body). Each one stops waiting (the
// abandoned counter counts exactly 3, none is waiting), none reaches the
// application, and their turns come back: the next request waits at most
// 1 s (3.5 s had they kept them). That request uploads its body slowly,
// across the end of its wait, and the application gets it byte for byte.
func TestDelayBodyClientLeaves(t *testing.T) {
	app := newBodyApp(t)
	zone := zoneName("body_leave")
	load(t, newTester(t), config(`	servers {
		protocols h1 h2c
	}`, turnsSite, "ZONE", zone, "APP", app.Listener.Addr().String()))

	h1 := loopbackClient(8)
	defer h1.CloseIdleConnections()
	h2 := &http.Transport{Protocols: new(http.Protocols)}
	h2.Protocols.SetUnencryptedHTTP2(true)
	defer h2.CloseIdleConnections()
	clients := []struct {
		proto, tag string
		c          *http.Client
	}{{"HTTP/1.1", "h1", h1}, {"HTTP/2", "h2", &http.Client{Transport: h2, Timeout: 10 * time.Second}}}
	sizes := []struct {
		name    string
		size    int
		chunked bool // the waiter that stays sends its body chunked (HTTP/1.1)
	}{{"empty", 0, false}, {"100B", 100, false}, {"64KiB", 64 << 10, true}, {"1MiB", 1 << 20, false}}
	rng := rand.New(rand.NewPCG(23, 3))

	for _, cl := range clients {
		for _, sz := range sizes {
			t.Run(cl.proto+"/"+sz.name, func(t *testing.T) {
				body := make([]byte, sz.size)
				for i := range body {
					body[i] = byte(rng.Uint32())
				}
				user := "body-" + cl.tag + "-" + sz.name + "-" + nonce
				post := func(ctx context.Context, b io.Reader, length int64, leaver bool) (*http.Response, error) {
					req, err := http.NewRequestWithContext(ctx, http.MethodPost, siteA+"/hook", b)
					if err != nil {
						return nil, err
					}
					req.ContentLength = length
					if length == 0 {
						req.Body = http.NoBody
					}
					req.Header.Set("X-User", user)
					if leaver {
						req.Header.Set("X-Leaver", "yes")
					}
					return cl.c.Do(req)
				}
				first, err := post(context.Background(), bytes.NewReader(body), int64(len(body)), false)
				if err != nil {
					t.Fatal(err)
				}
				first.Body.Close()
				if first.StatusCode != 200 {
					t.Fatalf("the first request: %d", first.StatusCode)
				}
				abandoned := scrapeMetric(t, "caddy_rate_limit_delay_abandoned_total", `zone="`+zone+`"`)

				// Three wait (turns 1, 2 and 3 s away) and hang up after 0.5 s.
				var wg sync.WaitGroup
				for range 3 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
						defer cancel()
						var b io.Reader = bytes.NewReader(body)
						if sz.size > 256<<10 {
							b = &stalledBody{part: body[:128<<10], ctx: ctx}
						}
						resp, err := post(ctx, b, int64(len(body)), true)
						if err == nil {
							resp.Body.Close()
							t.Errorf("a client that hung up after 0.5 s got an answer: %d", resp.StatusCode)
						}
					}()
				}
				wg.Wait()
				d, ok := waitForCond(2*time.Second, func() bool {
					return scrapeMetric(t, "caddy_rate_limit_delay_abandoned_total", `zone="`+zone+`"`)-abandoned == 3 &&
						gauge(t, "caddy_rate_limit_waiting") == 0
				})
				if !ok {
					t.Errorf("3 clients hung up while waiting: the abandoned counter counted %v, %v still waiting",
						scrapeMetric(t, "caddy_rate_limit_delay_abandoned_total", `zone="`+zone+`"`)-abandoned, gauge(t, "caddy_rate_limit_waiting"))
				} else {
					t.Logf("the 3 waits ended within %v of the clients hanging up", d.Round(time.Millisecond))
				}

				// The next request: its turn is the first of those given back.
				var b io.Reader = &dribbledBody{b: body, piece: max(1, sz.size/8+1)}
				length := int64(len(body))
				if sz.chunked {
					length = -1
				}
				if sz.size == 0 {
					b = nil
				}
				resp, err := post(context.Background(), b, length, false)
				if err != nil {
					t.Fatalf("the next request: %v", err)
				}
				resp.Body.Close()
				got := app.arrivals(user)
				if resp.StatusCode != 200 || len(got) < 2 {
					t.Fatalf("the next request: %d; the application got %d requests", resp.StatusCode, len(got))
				}
				stayed := got[len(got)-1]
				if stayed.leaver || stayed.err != nil || stayed.size != len(body) || stayed.sum != sha256.Sum256(body) {
					t.Errorf("the next request's body at the application: %d bytes (error %v), checksum equal %v; sent %d bytes",
						stayed.size, stayed.err, stayed.sum == sha256.Sum256(body), len(body))
				}
				// Its turn is 1 s after the first's, the body's last piece
				// comes 0.8 s after it was sent; 4 s had the departed
				// waiters kept their turns.
				if since := stayed.at.Sub(got[0].at); stayed.wait > 1000 || since > 2500*time.Millisecond {
					t.Errorf("the next request waited %d ms and reached the application %v after the first: the departed waiters kept their turns",
						stayed.wait, since.Round(time.Millisecond))
				}
				leavers := 0
				for _, a := range got {
					if a.leaver {
						leavers++
					}
				}
				if leavers != 0 || len(got) != 2 {
					t.Errorf("the application got %d requests (%d of clients that had hung up), want 2 (none of them)", len(got), leavers)
				}
			})
		}
	}
}

// A waiter whose body (chunked) is over request_body's max_size: reading it ahead
// meets the limit, which is no client leaving: the request keeps its turn
// and the next handler meets the limit in its turn (413), as it would
// without the wait.
func TestDelayBodyTooLarge(t *testing.T) {
	app := newBodyApp(t)
	zone := zoneName("body_large")
	load(t, newTester(t), config("", `
http://localhost:@A@ {
	route {
		request_body {
			max_size 1KB
		}
		rate_limit {
			zone @ZONE@ {
				key {http.request.header.X-User}
				events 5
				window 1s
				burst 1
				delay 2s
			}
		}
		reverse_proxy @APP@
	}
}`, "ZONE", zone, "APP", app.Listener.Addr().String()))
	c := loopbackClient(4)
	defer c.CloseIdleConnections()
	user := "large-" + nonce
	post := func(size int) int {
		// Chunked: with a Content-Length over max_size, request_body
		// refuses the request before the limiter.
		req, _ := http.NewRequest(http.MethodPost, siteA+"/", io.NopCloser(bytes.NewReader(make([]byte, size))))
		req.ContentLength = -1
		req.Header.Set("X-User", user)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	abandoned := scrapeMetric(t, "caddy_rate_limit_delay_abandoned_total", `zone="`+zone+`"`)
	// t0 before the first: the second's turn is 200 ms after the first's
	// decision, so a slow machine only makes took longer (a lower bound
	// that load cannot break, unlike one counted from the first's answer).
	t0 := time.Now()
	if code := post(100); code != 200 {
		t.Fatalf("the first, within max_size: %d", code)
	}
	if code := post(4000); code != http.StatusRequestEntityTooLarge {
		t.Errorf("a waiter over max_size: %d, want 413", code)
	}
	if took := time.Since(t0); took < 190*time.Millisecond {
		t.Errorf("a waiter over max_size was answered %v after the first was sent, before its turn (200 ms after the first)", took)
	}
	if got := scrapeMetric(t, "caddy_rate_limit_delay_abandoned_total", `zone="`+zone+`"`) - abandoned; got != 0 {
		t.Errorf("the abandoned counter counted %v, want 0", got)
	}
}
