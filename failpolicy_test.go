package sluice

import (
	"net/http/httptest"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/sluicehq/caddy-sluice/internal/redistest"
	"github.com/sluicehq/caddy-sluice/memstore"
	"github.com/sluicehq/caddy-sluice/telemetry"
)

// TestFailPolicyLayer runs the decide stage's fail policy alone, over a real
// Redis store and a real memory store as the fail-local fallback: while
// Redis answers, it decides; once Redis is stopped, a fail-open zone passes
// unmetered, fail-local zones are decided by the memory store (and refused
// by it past their capacity), and a fail-closed zone refuses with 503.
func TestFailPolicyLayer(t *testing.T) {
	srv := redistest.Start(t)
	h := newHandler(t, `rate_limit {
		zone fp_open {
			key {http.request.header.X-User}
			match {
				header X-Zone open
			}
			events 5
			window 1h
		}
		zone fp_local {
			key {http.request.header.X-User}
			match {
				header X-Zone local
			}
			events 2
			window 1h
			fail local
		}
		zone fp_closed {
			key {http.request.header.X-User}
			match {
				header X-Zone closed
			}
			events 5
			window 1h
			fail closed
		}
		store redis `+srv.URL()+` {
			timeout 200ms
			breaker {
				failures 5
				cooldown 3s
			}
		}
	}`, nil)
	local := memstore.New(memstore.Config{SweepInterval: -1})
	t.Cleanup(local.Close)
	layer := &failPolicy{next: storeCall{store: h.store}, local: local, errs: telemetry.NewSampledLog(1, telemetry.StoreErrorInterval), logger: zap.NewNop()}

	// take plans a request to the zones named and runs it through the layer.
	take := func(zones ...string) (outcome, *admission) {
		t.Helper()
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set("X-User", "fp")
		for _, z := range zones {
			r.Header.Add("X-Zone", z)
		}
		caddyhttp.NewTestReplacer(r)
		a := h.admit(r)
		t.Cleanup(a.exit)
		if err := a.plan(); err != nil || len(a.reqs) != len(zones) {
			t.Fatalf("plan %v: %d zones, %v", zones, len(a.reqs), err)
		}
		a.sizeDecs()
		if err := layer.decide(a); err != nil {
			t.Fatalf("take %v: %v", zones, err)
		}
		return a.out, a
	}

	// (The zones are planned in name order: fp_local, then fp_open.)
	if out, a := take("open", "local"); out != decided || a.store != h.store || a.decs[0].Remaining != 1 || a.decs[1].Remaining != 4 {
		t.Fatalf("Redis up: outcome %d, store %T, decisions %+v; want decided by Redis", out, a.store, a.decs)
	}

	srv.Stop()
	if out, _ := take("open"); out != unmetered {
		t.Errorf("Redis down, fail open: outcome %d, want unmetered", out)
	}
	for i, want := range []bool{true, true, false} {
		out, a := take("open", "local")
		if out != decided || a.store != local || len(a.reqs) != 1 || a.zones[0].name != "fp_local" {
			t.Fatalf("Redis down, fail local %d: outcome %d, store %T, %d zones; want the local zone decided by the memory store", i, out, a.store, len(a.reqs))
		}
		if a.decs[0].Allowed != want {
			t.Errorf("Redis down, fail local %d: allowed %v, want %v (capacity 2, counted afresh in memory)", i, a.decs[0].Allowed, want)
		}
	}
	// The fifth failure in a row: the error is Redis's, which cannot say
	// when it will answer.
	out, a := take("closed", "local")
	if out != failClosed || a.v.zone.name != "fp_closed" || a.v.RetryAfter != failClosedRetry {
		t.Errorf("Redis down, fail closed: outcome %d, verdict %+v; want a 503 of fp_closed", out, a.v)
	}
	// Now the breaker is open: the 503 asks for what is left of its cool-down.
	out, a = take("closed")
	if ra := a.v.RetryAfter; out != failClosed || ra <= 2*time.Second || ra > 3*time.Second {
		t.Errorf("breaker open, fail closed: outcome %d, Retry-After %v; want a 503 asking for the rest of the 3s cool-down", out, ra)
	}
}

// TestFailApartFromPlan: a zone is decided apart (a Cluster shard down)
// when it fails open, or fails local and its planned request leaves nothing
// with the store: a plain rate zone. A fail local zone that counts, settles,
// holds a slot, or is in a directive with a delay, is not (each control sets
// what its request leaves at Provision; no list of controls is kept here).
func TestFailApartFromPlan(t *testing.T) {
	for _, c := range []struct {
		name, fields string
		fail         string
		apart        bool
	}{
		{"plain", "", "local", true},
		{"plain_open", "", "open", true},
		{"plain_closed", "", "closed", false},
		{"count", "count 5xx", "local", false},
		{"count_open", "count 5xx", "open", true},
		{"settle", "settle header X-Used", "local", false},
		{"delay", "delay 1s", "local", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newHandler(t, `rate_limit {
				zone apart_`+c.name+` {
					events 10
					window 1m
					fail `+c.fail+`
					`+c.fields+`
				}
			}`, nil)
			if got := h.planned[0].FailApart; got != c.apart {
				t.Errorf("FailApart %v, want %v", got, c.apart)
			}
		})
	}
	h := newHandler(t, `rate_limit {
		zone apart_conc {
			concurrent 2
			fail local
		}
	}`, nil)
	if h.planned[0].FailApart {
		t.Error("concurrency zone, fail local: FailApart, want not (its slot is released in the store that took it)")
	}
}
