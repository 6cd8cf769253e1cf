package reply

import (
	"net/http"
	"net/http/httptest"
	"runtime/debug"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// recorder is a reusable http.ResponseWriter, so that a loop measures the
// answer and not the recorder.
type recorder struct {
	hdr    http.Header
	status int
	body   []byte
}

func (w *recorder) Header() http.Header { return w.hdr }
func (w *recorder) WriteHeader(s int)   { w.status = s }
func (w *recorder) Write(p []byte) (int, error) {
	w.body = append(w.body, p...)
	return len(p), nil
}

func (w *recorder) reset() {
	clear(w.hdr)
	w.status, w.body = 0, w.body[:0]
}

// TestAnswerAllocations: package reply's share of the allocation budget
// (the root's TestRefusalAllocations counts the whole request): a refusal
// with the default body makes two (the headers' values and their array),
// the headers of an allowed request one (headerBlock). The answers are
// what a client must see.
func TestAnswerAllocations(t *testing.T) {
	if raceBuild() {
		t.Skip("-race allocates")
	}
	s := (*Response)(nil).Compile(Settings{Legacy: true})
	r := httptest.NewRequest("GET", "/", nil)
	repl := caddyhttp.NewTestReplacer(r)
	w := &recorder{hdr: http.Header{}}
	f := Refusal{Zone: "login", JSONZone: "login", Limit: 5, RetryAfter: 30 * time.Second, Retry: 30,
		Limits: Limits{LimitText: "5", Remaining: 0, Reset: 1764650000}}
	refuse := testing.AllocsPerRun(1000, func() {
		w.reset()
		if err := s.Refuse(w, r, repl, &f); err != nil {
			t.Fatal(err)
		}
	})
	if want := `{"status":429,"error":"rate limit exceeded","zone":"login","retry_after":30}`; w.status != 429 || string(w.body) != want ||
		w.hdr.Get(HeaderLimit) != "5" || w.hdr.Get(HeaderRemaining) != "0" || w.hdr.Get(HeaderReset) != "1764650000" ||
		w.hdr.Get(HeaderRetryAfter) != "30" || w.hdr.Get(HeaderCacheControl) != "no-store" || w.hdr.Get(HeaderContentType) != "application/json" {
		t.Errorf("refusal %d %v %s", w.status, w.hdr, w.body)
	}
	l := Limits{LimitText: "1000", Remaining: 999, Reset: 1764650000}
	allow := testing.AllocsPerRun(1000, func() {
		w.reset()
		s.SetLimitHeaders(w.hdr, &l)
	})
	if w.hdr.Get(HeaderLimit) != "1000" || w.hdr.Get(HeaderRemaining) != "999" || w.hdr.Get(HeaderReset) != "1764650000" || len(w.hdr) != 3 {
		t.Errorf("allowed headers %v", w.hdr)
	}
	if refuse != 2 || allow != 1 {
		t.Errorf("allocations: refusal %v, want 2; allowed headers %v, want 1", refuse, allow)
	}
}

// raceBuild reports whether this test binary was built with -race.
func raceBuild() bool {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, s := range bi.Settings {
		if s.Key == "-race" {
			return s.Value == "true"
		}
	}
	return false
}

// BenchmarkRefuse prices package reply's share of a refusal (the root's
// BenchmarkServeHTTPSideBySide prices the whole request): the default
// body, the problem details and a gRPC call's answer.
func BenchmarkRefuse(b *testing.B) {
	f := Refusal{Zone: "login", JSONZone: "login", Limit: 5, RetryAfter: 30 * time.Second, Retry: 30,
		Limits: Limits{LimitText: "5", Remaining: 0, Reset: 1764650000}, Violated: `"login"`}
	for _, c := range []struct {
		name string
		resp *Response
		ct   string
	}{
		{"default", nil, ""},
		{"problem", &Response{Problem: true}, ""},
		{"grpc", nil, "application/grpc"},
	} {
		b.Run(c.name, func(b *testing.B) {
			s := c.resp.Compile(Settings{Legacy: true})
			r := httptest.NewRequest("POST", "/", nil)
			if c.ct != "" {
				r.Header.Set("Content-Type", c.ct)
			}
			repl := caddyhttp.NewTestReplacer(r)
			w := &recorder{hdr: http.Header{}}
			b.ReportAllocs()
			for b.Loop() {
				w.reset()
				_ = s.Refuse(w, r, repl, &f)
			}
		})
	}
}
