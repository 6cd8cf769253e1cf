package caddytest_test

import (
	"context"
	"crypto/tls"
	"io"
	"maps"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"

	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// h3Site answers {client_ip} behind the rate_limit block @LIMIT@.
const h3Site = `
https://localhost:@B@ {
	tls internal
	rate_limit {
		@LIMIT@
	}
	respond "{client_ip}"
}
`

// h3Config renders tlsGlobal (h1, h2, h3; HTTP/3 needs TLS) and h3Site,
// the limit's @NAME@ variables replaced by vars.
func h3Config(limit string, vars ...string) string {
	for i := 0; i+1 < len(vars); i += 2 {
		limit = strings.ReplaceAll(limit, "@"+vars[i]+"@", vars[i+1])
	}
	r := strings.NewReplacer("@STORAGE@", storageDir, "@ADMIN@", strconv.Itoa(adminPort), "@A@", strconv.Itoa(portA), "@B@", strconv.Itoa(portB), "@LIMIT@", limit, "@PROTOCOLS@", "h1 h2 h3")
	out := r.Replace(tlsGlobal + h3Site)
	if v := unreplaced.FindString(out); v != "" {
		panic("h3Config: unreplaced variable " + v + " in:\n" + out)
	}
	return out
}

// h3Client is quic-go's HTTP/3 client, its QUIC connections sent from the
// loopback address from (so {client_ip} shows the QUIC peer, not a
// default), certificates not verified (Caddy's internal CA).
func h3Client(t *testing.T, from string) *http.Client {
	t.Helper()
	var mu sync.Mutex
	var conns []net.PacketConn
	tr := &http3.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true, ServerName: "localhost"},
		Dial: func(ctx context.Context, addr string, tlsCfg *tls.Config, cfg *quic.Config) (*quic.Conn, error) {
			raddr, err := net.ResolveUDPAddr("udp4", "127.0.0.1:"+strconv.Itoa(portB))
			if err != nil {
				return nil, err
			}
			pc, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.ParseIP(from)})
			if err != nil {
				return nil, err
			}
			mu.Lock()
			conns = append(conns, pc)
			mu.Unlock()
			return quic.DialEarly(ctx, pc, raddr, tlsCfg, cfg)
		},
	}
	t.Cleanup(func() {
		tr.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

// tlsClients are HTTP/1.1 and HTTP/2 over TLS to port B, from the loopback
// address from.
func tlsClients(t *testing.T, from string) (h1, h2 *http.Client) {
	t.Helper()
	mk := func(h2 bool) *http.Client {
		d := &net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
		tr := &http.Transport{
			DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				return d.DialContext(ctx, "tcp4", "127.0.0.1:"+strconv.Itoa(portB))
			},
			TLSClientConfig:   &tls.Config{InsecureSkipVerify: true, ServerName: "localhost"},
			ForceAttemptHTTP2: h2,
		}
		if !h2 {
			tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
		}
		t.Cleanup(tr.CloseIdleConnections)
		return &http.Client{Transport: tr, Timeout: 10 * time.Second}
	}
	return mk(false), mk(true)
}

// h3Get sends GET / to the site with the extra header pairs.
func h3Get(t *testing.T, c *http.Client, headers ...string) (result, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, "https://localhost:"+strconv.Itoa(portB)+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET over %T: %v", c.Transport, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return result{code: resp.StatusCode, header: resp.Header, body: string(b)}, resp.Proto
}

// TestHTTP3: quic-go's HTTP/3 client against Caddy serving h3, with the
// memory store and with Redis. {client_ip} is the QUIC peer (the client's
// UDP source, 127.0.0.7); 20 requests at once from it against events 5
// per hour keyed by {client_ip} admit exactly 5; the same sequence of
// requests over HTTP/1.1, HTTP/2 and HTTP/3 gets the same statuses and the
// same rate limit headers (legacy and draft), the refusal the same body.
func TestHTTP3(t *testing.T) {
	srv := redistest.Start(t)
	for _, store := range []struct{ name, block string }{
		{"memory", ""},
		{"redis", "store redis " + srv.URL() + " {\n\t\t\ttimeout 2s\n\t\t}"},
	} {
		t.Run(store.name, func(t *testing.T) {
			zip, zuser := zoneName("h3_ip_"+store.name), zoneName("h3_user_"+store.name)
			load(t, newTester(t), h3Config(`zone @ZIP@ {
			key {client_ip}
			match {
				header X-Zone ip
			}
			events 5
			window 1h
		}
		zone @ZUSER@ {
			key {http.request.header.X-User}
			match {
				not header X-Zone ip
			}
			events 3
			window 1h
		}
		headers both
		@STORE@`, "ZIP", zip, "ZUSER", zuser, "STORE", store.block))
			waitTLS(t)
			h3 := h3Client(t, "127.0.0.7")

			// {client_ip} is the QUIC peer.
			r, proto := h3Get(t, h3, "X-User", "ip-"+nonce)
			if proto != "HTTP/3.0" || r.code != 200 || r.body != "127.0.0.7" {
				t.Fatalf("over %s: %d %q, want HTTP/3.0 200 \"127.0.0.7\"", proto, r.code, r.body)
			}

			// Exactness keyed by the QUIC peer.
			codes := make([]int, 20)
			var wg sync.WaitGroup
			for i := range codes {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r, _ := h3Get(t, h3, "X-Zone", "ip")
					codes[i] = r.code
				}()
			}
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
			t.Logf("%s: 20 HTTP/3 requests at once from 127.0.0.7, events 5 keyed by {client_ip}: %d 200, %d 429", store.name, ok, refused)
			if ok != 5 || refused != 15 {
				t.Errorf("%d 200 and %d 429, want 5 and 15", ok, refused)
			}

			// The same sequence per protocol, each with a user of its own.
			h1, h2 := tlsClients(t, "127.0.0.7")
			type step struct {
				code    int
				headers map[string]string
				body    string
			}
			var seqs [][]step
			for _, c := range []struct {
				name   string
				client *http.Client
				proto  string
			}{{"h1", h1, "HTTP/1.1"}, {"h2", h2, "HTTP/2.0"}, {"h3", h3, "HTTP/3.0"}} {
				user := c.name + "-" + store.name + "-" + nonce
				var seq []step
				for range 5 {
					r, proto := h3Get(t, c.client, "X-User", user)
					if proto != c.proto {
						t.Errorf("%s: answered over %s", c.name, proto)
					}
					s := step{code: r.code, headers: map[string]string{}, body: strings.ReplaceAll(r.body, user, "USER")}
					if r.code == 200 {
						s.body = ""
					}
					for _, name := range []string{"X-Ratelimit-Limit", "X-Ratelimit-Remaining", "Retry-After", "Ratelimit-Policy", "Ratelimit", "Cache-Control", "Content-Type"} {
						s.headers[name] = strings.ReplaceAll(r.header.Get(name), zuser, "ZONE")
					}
					seq = append(seq, s)
				}
				seqs = append(seqs, seq)
			}
			for i, s := range seqs[0] {
				want := 200
				if i >= 3 {
					want = 429
				}
				if s.code != want {
					t.Errorf("HTTP/1.1 request %d: %d, want %d", i+1, s.code, want)
				}
			}
			t.Logf("HTTP/1.1 sequence: %v", seqs[0])
			for p, name := range []string{"HTTP/2", "HTTP/3"} {
				for i := range seqs[0] {
					a, b := seqs[0][i], seqs[p+1][i]
					if a.code != b.code || a.body != b.body || !maps.Equal(a.headers, b.headers) {
						t.Errorf("request %d: HTTP/1.1 %v, %s %v", i+1, a, name, b)
					}
				}
			}
		})
	}
}

// TestHTTP3ClientLeavesWait: over HTTP/3 a request waiting for its turn (a
// delay zone) whose client gives up is noticed at once, body or not, with
// no read-ahead (clientgone.go reads ahead HTTP/1.x bodies only): quic-go
// ends the request's context when the client cancels its stream. Three
// requests that would wait 1, 2 and 3 s, with bodies of 0, 100 and 64 KiB,
// hang up after 0.5 s: the abandoned counter counts 3, none is left
// waiting, and the next request's turn is within 1 s again.
func TestHTTP3ClientLeavesWait(t *testing.T) {
	z := zoneName("h3_leave")
	load(t, newTester(t), h3Config(`zone @ZONE@ {
			key {http.request.header.X-User}
			events 1
			window 1s
			burst 1
			delay 5s
		}`, "ZONE", z))
	waitTLS(t)
	h3 := h3Client(t, "127.0.0.1")
	user := "leave-" + nonce
	post := func(ctx context.Context, size int) (*http.Response, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "https://localhost:"+strconv.Itoa(portB)+"/", strings.NewReader(strings.Repeat("x", size)))
		if err != nil {
			return nil, err
		}
		req.Header.Set("X-User", user)
		return h3.Do(req)
	}
	resp, err := post(context.Background(), 0)
	if err != nil || resp.StatusCode != 200 || resp.Proto != "HTTP/3.0" {
		t.Fatalf("the first request: %v %v", resp, err)
	}
	resp.Body.Close()
	abandoned := scrapeMetric(t, "caddy_rate_limit_delay_abandoned_total", `zone="`+z+`"`)
	var wg sync.WaitGroup
	for _, size := range []int{0, 100, 64 << 10} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			defer cancel()
			if resp, err := post(ctx, size); err == nil {
				resp.Body.Close()
				t.Errorf("a client that hung up after 0.5 s got an answer: %d", resp.StatusCode)
			}
		}()
	}
	wg.Wait()
	d, ok := waitForCond(2*time.Second, func() bool {
		return scrapeMetric(t, "caddy_rate_limit_delay_abandoned_total", `zone="`+z+`"`)-abandoned == 3 && gauge(t, "caddy_rate_limit_waiting") == 0
	})
	if !ok {
		t.Fatalf("3 HTTP/3 clients hung up while waiting: abandoned counted %v, %v still waiting",
			scrapeMetric(t, "caddy_rate_limit_delay_abandoned_total", `zone="`+z+`"`)-abandoned, gauge(t, "caddy_rate_limit_waiting"))
	}
	t.Logf("the 3 HTTP/3 waits ended within %v of the clients hanging up", d.Round(time.Millisecond))
	start := time.Now()
	resp, err = post(context.Background(), 0)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("the next request: %v %v", resp, err)
	}
	resp.Body.Close()
	if w := time.Since(start); w > 1500*time.Millisecond {
		t.Errorf("the next request waited %v: the leavers' turns were not given back", w)
	}
}
