package sluice

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/sluicehq/caddy-sluice/reply"
)

// BenchmarkServeHTTPWire serves requests through net/http's own server
// over an in-memory connection (net.Pipe), side by side: bare `respond`,
// Sluice with the memory store and each header mode, and a refusal. Unlike
// BenchmarkServeHTTPSideBySide (a recorder, no wire), it includes what
// net/http does with the headers a response carries (cloning the header
// map at WriteHeader, sorting and writing each field), which is most of
// what the X-RateLimit-* headers cost. The client reads each response
// without allocating; the difference between two rows is the difference
// between the two responses' costs in a real server. cpu-ns/op is the
// process's CPU time per request (server, client and runtime), which the
// other processes of a shared machine disturb less than ns/op. bare_fields
// is bare with three static X-RateLimit-* fields: what net/http alone
// spends on the default headers. The caddy_* rows
// prepare each request as Caddy's server does (caddyhttp.PrepareRequest:
// the replacer with its HTTP placeholders, the variables, client_ip) and
// key on {client_ip}, as `make bench` does.
//
//	go test -run XXX -bench ServeHTTPWire -benchmem .
func BenchmarkServeHTTPWire(b *testing.B) {
	keyed := func(key, name, extra string) string {
		return `rate_limit {
		zone ` + name + ` {
			key ` + key + `
			events 1000000000
			window 1s
		}
		` + extra + `
	}`
	}
	zone := func(name, extra string) string { return keyed("{http.request.header.X-User}", name, extra) }
	clientIP := func(name, extra string) string { return keyed("{http.vars.client_ip}", name, extra) }
	deny := `rate_limit {
		zone wire_deny {
			key {http.request.header.X-User}
			events 1
			window 1h
		}
	}`
	for _, c := range []struct {
		name, block string
		caddy       bool
	}{
		{"bare", "", false},
		{"bare_fields", "", false},
		{"headers_off", zone("wire_off", "headers off"), false},
		{"legacy", zone("wire_legacy", ""), false},
		{"draft", zone("wire_draft", "headers draft"), false},
		{"refuse", deny, false},
		{"caddy_bare", "", true},
		{"caddy_headers_off", clientIP("wire_caddy_off", "headers off"), true},
		{"caddy_legacy", clientIP("wire_caddy_legacy", ""), true},
	} {
		b.Run(c.name, func(b *testing.B) {
			var h *Handler
			if c.block != "" {
				h = newHandler(b, c.block, nil)
				h.logger = zap.NewNop() // as in BenchmarkServeHTTPSideBySide
			}
			wireBench(b, h, c.caddy, c.name == "bare_fields")
		})
	}
}

// staticFields are three X-RateLimit-* fields as Sluice writes them, set by
// the bare_fields row to price what net/http does with them alone.
var staticFields = [...][2]string{
	{reply.HeaderLimit, "1000000000"}, {reply.HeaderRemaining, "999999999"}, {reply.HeaderReset, "1764650000"},
}

// wireBench serves b.N requests, one at a time over one keep-alive
// connection, through h (nil: none) in front of Caddy's `respond "ok"`;
// with prepare, each request prepared as Caddy's server prepares it; with
// fields, the three staticFields set before the handlers run.
func wireBench(b *testing.B, h *Handler, prepare, fields bool) {
	srvCaddy := &caddyhttp.Server{}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		repl := caddy.NewReplacer()
		if prepare {
			r.RemoteAddr = "192.0.2.1:40000" // net.Pipe has no address
			r = caddyhttp.PrepareRequest(r, repl, w, srvCaddy)
		} else {
			r = r.WithContext(context.WithValue(r.Context(), caddy.ReplacerCtxKey, repl))
		}
		w.Header().Set("Server", "Caddy") // as Caddy's server does
		if fields {
			for i := range staticFields {
				w.Header()[staticFields[i][0]] = staticFields[i][1:2:2]
			}
		}
		var err error
		if h == nil {
			err = respondOK.ServeHTTP(w, r)
		} else {
			err = h.ServeHTTP(w, r, respondOK)
		}
		if err != nil {
			b.Error(err)
		}
	})
	srvConn, cliConn := net.Pipe()
	srv := &http.Server{Handler: handler}
	l := &oneConnListener{c: srvConn, done: make(chan struct{})}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = srv.Serve(l)
	}()
	defer func() {
		_ = cliConn.Close()
		_ = srv.Close()
		wg.Wait()
	}()
	req := []byte("GET / HTTP/1.1\r\nHost: bench\r\nX-User: bench\r\n\r\n")
	rd := bufio.NewReaderSize(cliConn, 4096)
	roundTrip := func() int {
		if _, err := cliConn.Write(req); err != nil {
			b.Fatal(err)
		}
		return readResponse(b, rd)
	}
	roundTrip() // a refusing zone's one event
	b.ReportAllocs()
	b.ResetTimer()
	cpu0, cpuOK := processCPU()
	for b.Loop() {
		if st := roundTrip(); st != http.StatusOK && st != http.StatusTooManyRequests {
			b.Fatalf("status %d", st)
		}
	}
	if cpu1, ok := processCPU(); cpuOK && ok {
		b.ReportMetric(float64(cpu1-cpu0)/float64(b.N), "cpu-ns/op")
	}
}

// readResponse reads one response (status line, headers, a body of
// Content-Length bytes) without allocating and returns its status.
func readResponse(b *testing.B, rd *bufio.Reader) int {
	status, length := 0, 0
	for first := true; ; first = false {
		line, err := rd.ReadSlice('\n')
		if err != nil {
			b.Fatal(err)
		}
		line = bytes.TrimRight(line, "\r\n")
		if len(line) == 0 {
			break
		}
		switch {
		case first && len(line) >= 12:
			status, _ = strconv.Atoi(string(line[9:12]))
		case len(line) > 16 && bytes.EqualFold(line[:16], []byte("Content-Length: ")):
			length, _ = strconv.Atoi(string(line[16:]))
		}
	}
	if _, err := rd.Discard(length); err != nil {
		b.Fatal(err)
	}
	return status
}

// oneConnListener hands out one connection, then blocks until closed.
type oneConnListener struct {
	c    net.Conn
	once sync.Once
	done chan struct{}
}

func (l *oneConnListener) Accept() (net.Conn, error) {
	var c net.Conn
	l.once.Do(func() { c = l.c })
	if c != nil {
		return c, nil
	}
	<-l.done
	return nil, io.EOF
}

func (l *oneConnListener) Close() error {
	select {
	case <-l.done:
	default:
		close(l.done)
	}
	return nil
}

func (l *oneConnListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)} }

var _ caddyhttp.Handler = respondOK

// BenchmarkServeHTTPDecision measures the handler alone, the next handler
// doing nothing: what one allowed request costs Sluice on the memory
// store, its request prepared as Caddy's server prepares it
// (caddyhttp.PrepareRequest), keyed on a header or on {client_ip}, with
// and without the X-RateLimit-* headers.
//
//	go test -run XXX -bench ServeHTTPDecision -benchmem .
func BenchmarkServeHTTPDecision(b *testing.B) {
	for _, c := range []struct{ name, key, extra string }{
		{"header_off", "{http.request.header.X-User}", "headers off"},
		{"client_ip_off", "{http.vars.client_ip}", "headers off"},
		{"client_ip_legacy", "{http.vars.client_ip}", ""},
	} {
		b.Run(c.name, func(b *testing.B) {
			h := newHandler(b, `rate_limit {
		zone decision {
			key `+c.key+`
			events 1000000000
			window 1s
		}
		`+c.extra+`
	}`, nil)
			h.logger = zap.NewNop()
			w := newBenchWriter()
			r := httptest.NewRequest("GET", "/", nil)
			r.Header.Set("X-User", "bench")
			r.RemoteAddr = "192.0.2.1:40000"
			r = caddyhttp.PrepareRequest(r, caddy.NewReplacer(), w, &caddyhttp.Server{})
			b.ReportAllocs()
			cpu0, cpuOK := processCPU()
			for b.Loop() {
				w.reset()
				if err := h.ServeHTTP(w, r, okHandler); err != nil || w.status != http.StatusOK {
					b.Fatalf("status %d, err %v", w.status, err)
				}
			}
			if cpu1, ok := processCPU(); cpuOK && ok {
				b.ReportMetric(float64(cpu1-cpu0)/float64(b.N), "cpu-ns/op")
			}
		})
	}
}
