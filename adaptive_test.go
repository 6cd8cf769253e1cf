package sluice

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/sluicehq/caddy-sluice/algorithms"
)

// TestAdaptiveConfigChecks: an adaptive zone's bad settings, and the
// fields that do not apply to it, are refused naming the zone and the
// field; good ones load.
func TestAdaptiveConfigChecks(t *testing.T) {
	for _, c := range []struct{ zone, want string }{
		{"concurrent adaptive {\n controller pid\n}", `zone "a": adaptive: controller: unknown "pid"`},
		{"concurrent adaptive {\n minimum 10\n maximum 5\n}", `zone "a": adaptive: maximum must be between minimum`},
		{"concurrent adaptive {\n initial 0\n}", `initial must be at least 1`},
		{"concurrent adaptive {\n speed 3\n}", `unknown setting "speed"`},
		{"concurrent adaptive extra", `concurrent adaptive takes a block of settings`},
		{"concurrent adaptive\n events 5", `zone "a": events (max_events) does not apply to an adaptive concurrency zone`},
		{"concurrent adaptive\n fail closed", `zone "a": fail does not apply to an adaptive concurrency zone`},
		{"concurrent adaptive\n penalty 1s", `zone "a": penalty does not apply`},
	} {
		err := validateCaddyfile(t, site("", "\t\tzone a {\n"+c.zone+"\n\t\t}\n"))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v, want one containing %q", c.zone, err, c.want)
		}
	}
	ok := "\t\tzone a {\n concurrent adaptive {\n controller gradient2\n minimum 2\n maximum 50\n initial 10\n tolerance 1.2\n smoothing 0.5\n window 50ms\n}\n delay 2s\n report_only\n}\n" + zoneZ
	if err := validateCaddyfile(t, site("", ok)); err != nil {
		t.Fatalf("a full adaptive zone beside a rate zone: %v", err)
	}
}

// TestAdaptiveAllocations: an allowed request through an adaptive zone
// allocates what a rate zone's does (1: X-RateLimit-*), and its refusal
// what a rate zone's refusal does (3).
func TestAdaptiveAllocations(t *testing.T) {
	if raceBuild() {
		t.Skip("under -race, sync.Pool drops some of what it is given: the counts are not the program's")
	}
	l := newLoop(t, `rate_limit {
		zone allocs_adaptive {
			key static
			concurrent adaptive {
				minimum 1
				maximum 1
			}
		}
	}`, okHandler)
	count := func(want int) float64 {
		t.Helper()
		return testing.AllocsPerRun(1000, func() {
			if err := l.serve(t); err != nil || l.w.status != want {
				t.Fatalf("status %d, err %v; want %d", l.w.status, err, want)
			}
		})
	}
	allowed := count(http.StatusOK)
	var held int
	l.h.zones[0].adapt.each(func(ak *adaptiveKey) { ak.lim.Force(); held++ }) // the one place taken
	if held != 1 {
		t.Fatalf("%d keys in the zone, want 1", held)
	}
	refused := count(http.StatusTooManyRequests)
	t.Logf("allocations per request: allowed %v, refused %v", allowed, refused)
	if allowed != 1 || refused != 3 {
		t.Errorf("allocations: allowed %v, refused %v; want 1 and 3 (as a rate zone)", allowed, refused)
	}
}

// TestAdaptiveSampleAtFirstByte: an admitted request's latency is taken
// at its first byte, not at exit, and every response's shape (plain,
// event stream, NDJSON, a download, gRPC, a 101) gives its place back
// there.
func TestAdaptiveSampleAtFirstByte(t *testing.T) {
	h := newHandler(t, `rate_limit {
		zone first_byte {
			key static
			concurrent adaptive {
				minimum 1
				maximum 1
			}
		}
	}`, nil)
	var inside int64 = -1
	key := func() *adaptiveKey {
		var k *adaptiveKey
		h.zones[0].adapt.each(func(ak *adaptiveKey) { k = ak })
		return k
	}
	for _, c := range []struct {
		name    string
		write   func(w http.ResponseWriter)
		inAfter int64 // in flight after the first byte, before exit
	}{
		{"plain", func(w http.ResponseWriter) { w.WriteHeader(200) }, 0},
		{"plain, first byte by Write", func(w http.ResponseWriter) { _, _ = w.Write([]byte("x")) }, 0},
		{"event stream", func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
			w.WriteHeader(200)
		}, 0},
		{"ndjson", func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/x-ndjson")
			_, _ = w.Write([]byte("{}\n"))
		}, 0},
		{"download", func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/octet-stream")
			w.WriteHeader(200)
		}, 0},
		{"grpc", func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/grpc")
			w.WriteHeader(200)
		}, 0},
		{"websocket", func(w http.ResponseWriter) { w.WriteHeader(http.StatusSwitchingProtocols) }, 0},
	} {
		next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
			c.write(w)
			inside = key().lim.InFlight()
			return nil
		})
		r := httptest.NewRequest("GET", "/", nil)
		caddyhttp.NewTestReplacer(r)
		w := httptest.NewRecorder()
		if err := h.ServeHTTP(w, r, next); err != nil {
			t.Fatal(err)
		}
		if inside != c.inAfter {
			t.Errorf("%s: %d in flight after the first byte, want %d", c.name, inside, c.inAfter)
		}
		if n := key().lim.InFlight(); n != 0 {
			t.Errorf("%s: %d in flight after exit, want 0", c.name, n)
		}
	}
}

// TestAdaptiveRetryAfterHint: a refusal's Retry-After is the key's last
// measured latency (3 s here), at least 1 s before anything is measured.
func TestAdaptiveRetryAfterHint(t *testing.T) {
	h := newHandler(t, `rate_limit {
		zone hint {
			key static
			concurrent adaptive {
				minimum 1
				maximum 1
			}
		}
	}`, nil)
	serve(t, h, "GET", "/", nil) // the key exists
	var ak *adaptiveKey
	h.zones[0].adapt.each(func(k *adaptiveKey) { ak = k })
	ak.lim.Force() // the one place taken
	if w := serve(t, h, "GET", "/", nil); w.Code != 429 || w.Header().Get("Retry-After") != "1" {
		t.Fatalf("before any latency: %d Retry-After %q, want 429 and 1", w.Code, w.Header().Get("Retry-After"))
	}
	for i := range 10 {
		ak.lim.Observe(time.Duration(i)*time.Second, 3*time.Second, 1)
	}
	if w := serve(t, h, "GET", "/", nil); w.Code != 429 || w.Header().Get("Retry-After") != "3" {
		t.Fatalf("after windows of 3 s: %d Retry-After %q, want 429 and 3", w.Code, w.Header().Get("Retry-After"))
	}
}

// TestAdaptiveKeyPinnedAgainstEviction: a key found by a request that has
// not yet taken its place is not forgotten when its shard fills with new
// keys (idle keys are), so the key's next request counts on the same
// limiter; once unpinned and idle, it may be forgotten.
func TestAdaptiveKeyPinnedAgainstEviction(t *testing.T) {
	h := newHandler(t, `rate_limit {
		zone pins {
			key {http.request.header.X-User}
			concurrent adaptive
		}
	}`, nil)
	az := h.zones[0].adapt
	var hot algorithms.Key
	hot[0], hot[len(hot)-1] = 1, 7 // shard 7
	// fill adds keys of shard 7 until one new key forgets the idle ones.
	fill := func(from int) {
		for i := range adaptiveMaxKeys/adaptiveShards + 1 {
			var k algorithms.Key
			k[0], k[1], k[2], k[len(k)-1] = 2, byte(from+i), byte((from+i)>>8), 7
			az.keyOf(k).pins.Add(-1)
		}
	}
	ak := az.keyOf(hot) // found, no place taken yet
	fill(0)
	if again := az.keyOf(hot); again != ak {
		t.Fatal("a pinned key was forgotten: its next request counts on a second limiter")
	}
	ak.pins.Add(-2)
	fill(1 << 15)
	if again := az.keyOf(hot); again == ak {
		t.Error("an idle, unpinned key was kept past the bound")
	}
}
