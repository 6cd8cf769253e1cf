package fleet_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

const faultRoutes = `rate_limit {
	zone f_open {
		key {http.request.header.X-User}
		events 1000
		window 1h
		match {
			path /open*
		}
		fail open
	}
	zone f_closed {
		key {http.request.header.X-User}
		events 1000
		window 1h
		match {
			path /closed*
		}
		fail closed
	}
	zone f_local {
		key {http.request.header.X-User}
		events 2
		window 1h
		match {
			path /local*
		}
		fail local
	}
	store redis %s
}
respond "ok"`

// scriptErrors sums the failed and rejected calls of the commands the
// decision can fail in (the script, or the write inside it).
func scriptErrors(t *testing.T, s *redistest.Server) int64 {
	t.Helper()
	var n int64
	for _, cmd := range []string{"fcall", "evalsha", "eval", "set"} {
		st := s.CommandStats(t, cmd)
		n += st.Failed + st.Rejected
	}
	return n
}

// TestReadOnlyAndOOM: a READONLY reply (the store's server turned into a
// replica) and an OOM reply (maxmemory 1 with noeviction) go through each
// zone's fail policy: fail closed answers 503, fail open 200, fail local
// enforces the zone in memory; never a 500. Each fault is met by its own
// Caddy process, so each process's first (rate-limited) store-error log
// line names its fault. Decisions resume when the fault is gone.
func TestReadOnlyAndOOM(t *testing.T) {
	a := redistest.Start(t)
	b := redistest.Start(t)
	routes := fmt.Sprintf(faultRoutes, a.URL())
	procs := map[string]*caddyProc{
		"READONLY": startCaddy(t, "readonly", "", routes),
		"OOM":      startCaddy(t, "oom", "", routes),
	}
	c := newClient(4)
	defer c.CloseIdleConnections()
	key := func(k string) string { return "X-User: " + k + "-" + nonce }

	// Both healthy first.
	for name, p := range procs {
		for _, path := range []string{"/open", "/closed", "/local"} {
			res := mustGet(t, c, p.url(path), key("warm-"+name))
			if expectCode(t, res, 200, name+" process, healthy, "+path) && !res.decided() {
				t.Errorf("%s process, healthy, %s: not decided by the store: %s", name, path, res)
			}
		}
	}

	faults := []struct {
		name   string
		inject func()
		clear  func()
	}{
		{"READONLY", func() {
			a.MakeReadOnlyReplicaOf(t, b)
			// Wait for the sync, so that writes meet READONLY and not a
			// replica still loading.
			if _, ok := waitFor(10*time.Second, func() bool {
				return a.Info(t, "replication")["master_link_status"] == "up"
			}); !ok {
				t.Fatalf("%s never synced with %s", a.Addr, b.Addr)
			}
		}, func() { a.MakeMaster(t) }},
		{"OOM", func() { a.SetOOM(t) }, func() { a.ClearOOM(t) }},
	}
	for _, f := range faults {
		t.Run(f.name, func(t *testing.T) {
			p := procs[f.name]
			errsBefore := scriptErrors(t, a)
			f.inject()
			for i := 0; i < 5; i++ {
				res := mustGet(t, c, p.url("/closed"), key(fmt.Sprintf("%s-closed-%d", f.name, i)))
				if expectCode(t, res, http.StatusServiceUnavailable, fmt.Sprintf("%s: fail closed #%d", f.name, i)) {
					if retryAfter(res) < 1 {
						t.Errorf("%s: fail closed #%d: Retry-After %q", f.name, i, res.header.Get("Retry-After"))
					}
					if !strings.Contains(res.body, `"error":"rate limiter unavailable"`) {
						t.Errorf("%s: fail closed #%d: body %q", f.name, i, res.body)
					}
				}
				if res.dur > decisionBudget {
					t.Errorf("%s: fail closed #%d took %v, want at most %v", f.name, i, res.dur, decisionBudget)
				}
				res = mustGet(t, c, p.url("/open"), key(fmt.Sprintf("%s-open-%d", f.name, i)))
				if expectCode(t, res, 200, fmt.Sprintf("%s: fail open #%d", f.name, i)) && res.decided() {
					t.Errorf("%s: fail open #%d: decided although the store fails: %s", f.name, i, res)
				}
				if res.dur > decisionBudget {
					t.Errorf("%s: fail open #%d took %v, want at most %v", f.name, i, res.dur, decisionBudget)
				}
			}
			// fail local: exactly 2 pass (this instance's memory), then 429.
			for i := 0; i < 4; i++ {
				res := mustGet(t, c, p.url("/local"), key(f.name+"-local"))
				want := 200
				if i >= 2 {
					want = 429
				}
				expectCode(t, res, want, fmt.Sprintf("%s: fail local #%d", f.name, i+1))
			}
			if got := scriptErrors(t, a) - errsBefore; got == 0 {
				t.Errorf("%s: Redis counted no failed or rejected script/SET call: the fault was not met", f.name)
			}
			lines, _, samples := p.storeFailures()
			if lines == 0 || !strings.Contains(samples[0], f.name) {
				t.Errorf("%s: the process's first store-error log line does not name the fault: %q", f.name, samples)
			} else {
				t.Logf("%s: %s", f.name, samples[0])
			}

			f.clear()
			var last result
			took, ok := waitFor(5*time.Second, func() bool {
				last = send(c, p.url("/closed"), key(f.name+"-after"))
				return last.err == nil && last.code == 200 && last.decided()
			})
			if !ok {
				t.Fatalf("%s cleared: decisions did not resume within 5 s (last: %s)", f.name, last)
			}
			t.Logf("%s cleared: decisions resumed after %v", f.name, took.Round(time.Millisecond))
		})
	}
}
