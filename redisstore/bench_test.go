package redisstore

import (
	"context"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// benchZones returns n requests of one identity (one script call), with a
// limit no benchmark exhausts.
func benchZones(b testing.TB, key algorithms.Key, n int) []algorithms.Request {
	l := limit(b, 1_000_000_000, time.Hour, 0)
	zones := []string{"api", "login", "search"}
	reqs := make([]algorithms.Request, n)
	for i := range reqs {
		reqs[i] = algorithms.Request{Zone: zones[i], Key: key, Limit: l, Cost: 1}
	}
	return reqs
}

func benchmarkTake(b *testing.B, zones int) {
	runParallelTakes(b, newTestStore(b, benchRedisURL(b), "", testTimeout, 0), zones, 50)
}

// benchRedisURL is the Redis of a benchmark: SLUICE_BENCH_REDIS (a URL),
// or a server of its own. (Under valgrind, a child process's signal can
// crash the tool: give it a server started beside it.)
func benchRedisURL(b *testing.B) string {
	if u := os.Getenv("SLUICE_BENCH_REDIS"); u != "" {
		return u
	}
	return redistest.Start(b).URL()
}

func BenchmarkTakeOneZone(b *testing.B)    { benchmarkTake(b, 1) }
func BenchmarkTakeThreeZones(b *testing.B) { benchmarkTake(b, 3) }

// TestReportTakeLatency measures the decision latency of sequential Takes of
// one zone against a local Redis, with the production default timeout, and
// prints p50/p99.
func TestReportTakeLatency(t *testing.T) {
	srv := redistest.Start(t)
	s := newTestStore(t, srv.URL(), "", DefaultTimeout, 0)
	for _, zones := range []int{1, 3} {
		reqs := benchZones(t, freshKey(t), zones)
		out := make([]algorithms.Decision, zones)
		ctx := context.Background()
		for range 100 { // warm: script loaded, connection pooled
			_ = s.Take(ctx, reqs, out)
		}
		const n = 2000
		durs := make([]time.Duration, 0, n)
		errs := 0
		for range n {
			start := time.Now()
			err := s.Take(ctx, reqs, out)
			durs = append(durs, time.Since(start))
			if err != nil || !out[0].Allowed {
				errs++
			}
		}
		slices.Sort(durs)
		p50, p99, p999, worst := durs[n/2], durs[n*99/100], durs[n*999/1000], durs[n-1]
		t.Logf("Take, %d zone(s), %d sequential, timeout %v: p50 %v, p99 %v, p99.9 %v, max %v, %d errors",
			zones, n, DefaultTimeout, p50, p99, p999, worst, errs)
		if errs != 0 {
			t.Errorf("%d of %d Takes failed with the default timeout %v on a healthy local Redis", errs, n, DefaultTimeout)
		}
		if p50 >= DefaultTimeout {
			t.Errorf("p50 %v is not below the timeout %v", p50, DefaultTimeout)
		}
	}
}

// BenchmarkTakeModes compares, side by side in one run, how many pipeline
// workers concurrent decisions travel through ("batch-N": N pipelines in
// flight; batch-1 sends one pipeline at a time, the nearest to one round
// trip per call). 50 goroutines per run, one zone, distinct keys, the
// production timeout.
//
//	go test -run XXX -bench TakeModes -benchmem ./redisstore/
func BenchmarkTakeModes(b *testing.B) {
	srv := redistest.Start(b)
	for _, workers := range []int{1, 2, 4, 8} {
		b.Run("batch-"+strconv.Itoa(workers), func(b *testing.B) {
			cfg := connConfig{URL: srv.URL(), Timeout: DefaultTimeout, Prefix: DefaultKeyPrefix}
			c, cluster, err := cfg.newClient()
			if err != nil {
				b.Fatal(err)
			}
			o := redisPathOptions()
			o.Workers = workers
			s := newStoreWith(c, cluster, DefaultKeyPrefix, DefaultTimeout, o)
			defer s.Destruct()
			runParallelTakes(b, s, 1, 50)
		})
	}
}

// runParallelTakes runs b.N Takes of zones zones from goroutines goroutines
// (at least), each with an identity of its own, and fails on any error or
// refusal.
func runParallelTakes(b *testing.B, s *Store, zones, goroutines int) {
	var seq, failed atomic.Int64
	take(b, s, benchZones(b, keyOf(b, "warm"), zones)...) // loads the script
	b.SetParallelism((goroutines + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
	b.ReportAllocs()
	b.ResetTimer()
	cpu0, sw0, ok := procUsage()
	b.RunParallel(func(pb *testing.PB) {
		reqs := benchZones(b, keyOf(b, "bench-"+strconv.FormatInt(seq.Add(1), 10)+time.Now().String()), zones)
		out := make([]algorithms.Decision, zones)
		ctx := context.Background()
		for pb.Next() {
			if err := s.Take(ctx, reqs, out); err != nil || !out[0].Allowed {
				failed.Add(1)
			}
		}
	})
	b.StopTimer()
	if cpu1, sw1, ok1 := procUsage(); ok && ok1 && b.N > 0 {
		// The client's own CPU per decision (Redis runs in another
		// process): what a decision costs Caddy.
		b.ReportMetric(float64(cpu1-cpu0)/float64(time.Microsecond)/float64(b.N), "cpu-µs/op")
		b.ReportMetric(float64(sw1-sw0)/float64(b.N), "ctxsw/op")
	}
	if n := failed.Load(); n > 0 {
		b.Fatalf("%d of %d Takes failed or were refused", n, b.N)
	}
}

// BenchmarkTakeHotKeyLocalAllowance: 50 goroutines on one hot key of a
// zone with a local allowance (most decisions from the lease, a batch
// drawn now and then), against BenchmarkTakeOneZone's key per goroutine
// through Redis.
func BenchmarkTakeHotKeyLocalAllowance(b *testing.B) {
	l := limit(b, 1_000_000_000, time.Minute, 0)
	s := newTestStore(b, benchRedisURL(b), "", testTimeout, 0)
	release, err := s.LocalAllowance("hot", l, 0, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer release()
	reqs := []algorithms.Request{{Zone: "hot", Key: keyOf(b, "hot"), Limit: l, Cost: 1}}
	var failed atomic.Int64
	b.SetParallelism((50 + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
	b.ReportAllocs()
	b.ResetTimer()
	cpu0, sw0, ok := procUsage()
	b.RunParallel(func(pb *testing.PB) {
		out := make([]algorithms.Decision, 1)
		ctx := context.Background()
		for pb.Next() {
			if err := s.Take(ctx, reqs, out); err != nil || !out[0].Allowed {
				failed.Add(1)
			}
		}
	})
	b.StopTimer()
	if cpu1, sw1, ok1 := procUsage(); ok && ok1 && b.N > 0 {
		b.ReportMetric(float64(cpu1-cpu0)/float64(time.Microsecond)/float64(b.N), "cpu-µs/op")
		b.ReportMetric(float64(sw1-sw0)/float64(b.N), "ctxsw/op")
	}
	if n := failed.Load(); n > 0 {
		b.Fatalf("%d of %d Takes failed or were refused", n, b.N)
	}
}

// BenchmarkNodeFor: what finding a Cluster key's node (go-redis's slot map,
// then the node's breaker and workers) adds to a decision.
func BenchmarkNodeFor(b *testing.B) {
	c := redistest.StartCluster(b, 3)
	s := newClusterStore(b, c.Addrs(), testTimeout)
	key := s.Key("z", freshKey(b))
	ctx := context.Background()
	_ = s.nodeFor(ctx, key)
	b.ReportAllocs()
	for b.Loop() {
		_ = s.nodeFor(ctx, key)
	}
}
