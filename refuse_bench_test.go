package sluice

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
)

// benchWriter is a reusable http.ResponseWriter that keeps what a client
// would receive, so a loop measures the handler and not the recorder. Like
// Caddy's own response writer wrappers, it has no WriteString.
type benchWriter struct {
	hdr    http.Header
	status int
	body   []byte
}

func newBenchWriter() *benchWriter { return &benchWriter{hdr: make(http.Header)} }

func (w *benchWriter) Header() http.Header { return w.hdr }

func (w *benchWriter) WriteHeader(status int) {
	if w.status == 0 {
		w.status = status
	}
}

func (w *benchWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	w.body = append(w.body, p...)
	return len(p), nil
}

// reset makes w a fresh response, keeping its memory.
func (w *benchWriter) reset() {
	clear(w.hdr)
	w.status = 0
	w.body = w.body[:0]
}

// respondOK is Caddy's own `respond "ok" 200`, the trivial upstream of an
// allowed request in `make bench`.
var respondOK = caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
	return caddyhttp.StaticResponse{Body: "ok", StatusCode: "200"}.ServeHTTP(w, r, nil)
})

// refusalCase is one rate_limit block whose second request for the same key
// is refused.
type refusalCase struct {
	name  string
	block string
}

var refusalCases = []refusalCase{
	{"refuse", `rate_limit {
		zone bench_refuse {
			key {http.request.header.X-User}
			events 1
			window 1h
		}
	}`},
	{"refuse_custom", `rate_limit {
		zone bench_refuse_custom {
			key {http.request.header.X-User}
			events 1
			window 1h
		}
		response {
			body "{\"zone\":\"{http.rate_limit.zone}\",\"retry\":{http.rate_limit.retry_after},\"limit\":{http.rate_limit.limit}}"
			header X-Quota-Zone {http.rate_limit.zone}
		}
	}`},
	{"refuse_problem", `rate_limit {
		zone bench_refuse_problem {
			key {http.request.header.X-User}
			events 1
			window 1h
		}
		response problem
	}`},
	{"refuse_handle_errors", `rate_limit {
		zone bench_refuse_errors {
			key {http.request.header.X-User}
			events 1
			window 1h
		}
		response handle_errors
	}`},
}

// loop is one request served again and again, as a fresh request each time:
// the same *http.Request, a reset response, and the request's replacer put
// back to what it was before the handler ran (so placeholders or providers
// one iteration adds do not pile up in the next).
type loop struct {
	h    *Handler
	r    *http.Request
	w    *benchWriter
	repl *caddy.Replacer
	orig caddy.Replacer
	next caddyhttp.Handler
}

func newLoop(tb testing.TB, block string, next caddyhttp.Handler) *loop {
	tb.Helper()
	h := newHandler(tb, block, nil)
	// The refusal log line is sampled (10 a second); a no-op logger keeps
	// the loop's output quiet and its allocation count deterministic.
	h.logger = zap.NewNop()
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("X-User", "bench")
	repl := caddyhttp.NewTestReplacer(r)
	l := &loop{h: h, r: r, w: newBenchWriter(), repl: repl, orig: *repl, next: next}
	l.serve(tb) // spends the key's one event: every later request is refused
	return l
}

// serve runs one request and returns its error (a handle_errors refusal).
func (l *loop) serve(tb testing.TB) error {
	*l.repl = l.orig
	l.w.reset()
	return l.h.ServeHTTP(l.w, l.r, l.next)
}

// BenchmarkServeHTTPSideBySide compares, in one run, an allowed request
// (handing over to an empty handler, and to Caddy's `respond`) with refused
// ones (the default body, a custom body and header, handle_errors).
func BenchmarkServeHTTPSideBySide(b *testing.B) {
	allow := `rate_limit {
		zone bench_side_allow {
			key {http.request.header.X-User}
			events 1000000000
			window 1s
		}
	}`
	run := func(b *testing.B, l *loop, wantStatus int) {
		b.ReportAllocs()
		b.ResetTimer()
		for b.Loop() {
			err := l.serve(b)
			if wantStatus == 0 {
				if err == nil {
					b.Fatal("want a handle_errors error")
				}
			} else if err != nil || l.w.status != wantStatus {
				b.Fatalf("status %d, err %v; want %d", l.w.status, err, wantStatus)
			}
		}
	}
	b.Run("allow", func(b *testing.B) { run(b, newLoop(b, allow, okHandler), 200) })
	b.Run("allow_respond", func(b *testing.B) { run(b, newLoop(b, allow, respondOK), 200) })
	for _, c := range refusalCases {
		want := http.StatusTooManyRequests
		if c.name == "refuse_handle_errors" {
			want = 0
		}
		b.Run(c.name, func(b *testing.B) { run(b, newLoop(b, c.block, respondOK), want) })
	}
}
