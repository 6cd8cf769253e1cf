package redisstore

import (
	"context"
	"runtime/debug"
	"testing"
	"time"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// raceBuild is true under -race: sync.Pool drops items there, so
// allocation counts are not the program's (make alloc-test runs these
// tests without it).
var raceBuild = func() bool {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, s := range bi.Settings {
		if s.Key == "-race" && s.Value == "true" {
			return true
		}
	}
	return false
}()

// TestTakeAlloc pins what a decision through Redis allocates, one at a
// time: nothing of its own (the reply is read from its raw bytes, the call
// keeps its command, keys and arguments); what remains is go-redis's per
// pipeline (the Pipeline, its command list, the connection check), shared
// by every call of a batch under load (BenchmarkTakeOneZone: 0 allocs/op).
func TestTakeAlloc(t *testing.T) {
	if raceBuild {
		t.Skip("under -race, sync.Pool drops some of what it is given: the counts are not the program's")
	}
	srv := redistest.Start(t)
	s := newTestStore(t, srv.URL(), "", testTimeout, 0)
	for _, zones := range []int{1, 3} {
		reqs := benchZones(t, freshKey(t), zones)
		out := make([]algorithms.Decision, zones)
		ctx := context.Background()
		for range 10 {
			_ = s.Take(ctx, reqs, out)
		}
		n := testing.AllocsPerRun(200, func() {
			if err := s.Take(ctx, reqs, out); err != nil || !out[0].Allowed {
				t.Fatalf("Take: %v %+v", err, out[0])
			}
		})
		t.Logf("%d zone(s): %.1f allocations per decision, one at a time", zones, n)
		if n > perPipelineAllocs {
			t.Errorf("%d zone(s): %.1f allocations per decision, want at most %d (go-redis's per pipeline)", zones, n, perPipelineAllocs)
		}
	}
}

// perPipelineAllocs is what go-redis v9.23 allocates per pipeline it runs
// (measured: the pipeline's command list, the pool's connection check, the
// error check of its result; a worker reuses its Pipeline).
const perPipelineAllocs = 6

// TestLocalAllowanceAlloc: a request decided from a lease allocates
// nothing.
func TestLocalAllowanceAlloc(t *testing.T) {
	if raceBuild {
		t.Skip("under -race, sync.Pool drops some of what it is given: the counts are not the program's")
	}
	srv := redistest.Start(t)
	l := limit(t, 1_000_000_000, time.Hour, 0)
	s := allowanceStore(t, srv.URL(), "alloc", l, time.Second)
	reqs := []algorithms.Request{{Zone: "alloc", Key: freshKey(t), Limit: l, Cost: 1}}
	out := make([]algorithms.Decision, 1)
	ctx := context.Background()
	for range 200 { // demand, then a lease
		_ = s.Take(ctx, reqs, out)
	}
	before := allowanceUnits(s, "spent")
	n := testing.AllocsPerRun(100, func() {
		if err := s.Take(ctx, reqs, out); err != nil || !out[0].Allowed {
			t.Fatalf("Take: %v %+v", err, out[0])
		}
	})
	if allowanceUnits(s, "spent") == before {
		t.Fatal("no request was decided from the lease")
	}
	if n != 0 {
		t.Errorf("%.1f allocations per decision from a lease, want 0", n)
	}
}

// TestNodeForAlloc: finding a Cluster key's node (its breaker and workers)
// allocates nothing.
func TestNodeForAlloc(t *testing.T) {
	if raceBuild {
		t.Skip("under -race, sync.Pool drops some of what it is given: the counts are not the program's")
	}
	c := redistest.StartCluster(t, 3)
	s := newClusterStore(t, c.Addrs(), testTimeout)
	key := s.Key("z", freshKey(t))
	ctx := context.Background()
	take(t, s, algorithms.Request{Zone: "z", Key: freshKey(t), Limit: limit(t, 10, time.Hour, 0), Cost: 1})
	if n := s.nodeFor(ctx, key); n == s.one {
		t.Fatalf("key %s: the node of last resort, want its master's", key)
	}
	if n := testing.AllocsPerRun(200, func() { _ = s.nodeFor(ctx, key) }); n != 0 {
		t.Errorf("nodeFor: %.1f allocations, want 0", n)
	}
}
