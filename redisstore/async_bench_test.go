package redisstore

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// BenchmarkSyncManyKeys is the asynchronous mode under bench/run.sh's
// redis1ka and redis3ka load, in one process: 100,000 keys requested in
// turn, one request per key between two syncs (each key cold: the mode's
// worst case), a sync per 2,500 requests (50 ms at 50,000 req/s) besides
// the loop's own every 50 ms (the interval, which makes the previous
// window's count final 450 ms into a window: at 4 intervals of an hour, the
// syncs read it for 4 hours after midnight UTC, twice the commands). An op
// is one request of every zone; redis-µs/req is Redis's main thread CPU
// per op (INFO cpu), cpu-ns/op this process's (the decisions and the
// syncs' client side: what Caddy spends on them).
func BenchmarkSyncManyKeys(b *testing.B) {
	for _, zones := range []int{1, 3} {
		b.Run(strconv.Itoa(zones)+"zone", func(b *testing.B) {
			srv := redistest.Start(b)
			s := newTestStore(b, srv.URL(), "", testTimeout, 0)
			l := limit(b, 1000, 24*time.Hour, 0)
			l.Algorithm = algorithms.SlidingWindow
			reqs := make([]algorithms.Request, zones)
			for z := range reqs {
				name := "many" + strconv.Itoa(z)
				release, err := s.SyncZone(name, l, 50*time.Millisecond, 100_000)
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(release)
				reqs[z] = algorithms.Request{Zone: name, Limit: l, Cost: 1}
			}
			const keys, perSync = 100_000, 2_500
			key := func(i int) algorithms.Key {
				i = i * 7919 % keys
				return algorithms.Key{1, byte(algorithms.KeyHash), byte(i >> 16), byte(i >> 8), byte(i), 0x5a}
			}
			y := s.async.Load()
			out := make([]algorithms.Decision, zones)
			ctx := context.Background()
			run := func(from, n int) {
				for i := from; i < from+n; i++ {
					for z := range reqs {
						reqs[z].Key = key(i)
					}
					if err := s.Take(ctx, reqs, out); err != nil || !out[0].Allowed {
						b.Fatalf("take: %v %+v", err, out[0])
					}
					if i%perSync == perSync-1 {
						y.syncNow()
					}
				}
			}
			run(0, keys) // every key read once: the steady state
			y.syncNow()
			cpu0 := redisMainCPU(b, srv)
			own0, _, ok := procUsage()
			b.ResetTimer()
			run(keys, b.N)
			y.syncNow()
			b.StopTimer()
			b.ReportMetric((redisMainCPU(b, srv)-cpu0)*1e6/float64(b.N), "redis-µs/req")
			if own1, _, ok1 := procUsage(); ok && ok1 {
				b.ReportMetric(float64(own1-own0)/float64(b.N), "cpu-ns/op")
			}
			if st, _ := s.SyncStatus(reqs[0].Zone); st.Error != "" {
				b.Fatalf("sync failed: %s", st.Error)
			}
		})
	}
}

// redisMainCPU is the CPU seconds srv's main thread has used.
func redisMainCPU(b *testing.B, srv *redistest.Server) float64 {
	info, err := srv.Client().Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var sum float64
	for _, line := range strings.Split(info, "\r\n") {
		if name, v, ok := strings.Cut(line, ":"); ok && strings.HasSuffix(name, "_main_thread") {
			f, _ := strconv.ParseFloat(v, 64)
			sum += f
		}
	}
	return sum
}

// BenchmarkSyncFloor is BenchmarkSyncManyKeys's floor inside Redis: the
// same keys' counts (names as the mode makes them, one per zone and
// client, each with a TTL), each request one plain INCRBY per zone,
// pipelined 1,000 at a time, nothing else (no GET, no PEXPIRE, no
// instance). redis-µs/req is
// Redis's main thread CPU per request: what any design that sends each
// cold key's charge as a command of its own costs Redis at least.
func BenchmarkSyncFloor(b *testing.B) {
	for _, zones := range []int{1, 3} {
		b.Run(strconv.Itoa(zones)+"zone", func(b *testing.B) {
			srv := redistest.Start(b)
			s := newTestStore(b, srv.URL(), "", testTimeout, 0)
			const keys = 100_000
			start := algorithms.WindowStart(time.Now().UnixMilli(), (24 * time.Hour).Milliseconds())
			names := make([]string, keys*zones)
			for i := range keys {
				j := i * 7919 % keys
				k := algorithms.Key{1, byte(algorithms.KeyHash), byte(j >> 16), byte(j >> 8), byte(j), 0x5a}
				for z := range zones {
					names[i*zones+z] = countKey(s.Key("many"+strconv.Itoa(z), k), start)
				}
			}
			ctx := context.Background()
			c := srv.Client()
			run := func(from, n int) {
				pipe := c.Pipeline()
				for i := from; i < from+n; i++ {
					for z := range zones {
						pipe.IncrBy(ctx, names[(i%keys)*zones+z], 1)
					}
					if pipe.Len() >= 1000 || i == from+n-1 {
						if _, err := pipe.Exec(ctx); err != nil {
							b.Fatal(err)
						}
					}
				}
			}
			run(0, keys) // every count made once, with its TTL (as the mode's): the steady state
			pipe := c.Pipeline()
			for i, name := range names {
				pipe.PExpire(ctx, name, 48*time.Hour)
				if pipe.Len() == 1000 || i == len(names)-1 {
					if _, err := pipe.Exec(ctx); err != nil {
						b.Fatal(err)
					}
				}
			}
			cpu0 := redisMainCPU(b, srv)
			b.ResetTimer()
			run(keys, b.N)
			b.StopTimer()
			b.ReportMetric((redisMainCPU(b, srv)-cpu0)*1e6/float64(b.N), "redis-µs/req")
		})
	}
}
