package redisstore

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// TestSyncChunksWhileRequested: syncs of more keys than one round of lanes
// (syncLanes pipelines of syncChunk keys) run while goroutines keep
// requesting those keys; a key waits, touched, in the list a sync took
// until its chunk gathers it, and a request meanwhile adds to what that
// chunk sends. After a last sync, Redis holds exactly what was admitted,
// key by key: no charge lost between the lists, none sent twice.
func TestSyncChunksWhileRequested(t *testing.T) {
	srv := redistest.Start(t)
	l := syncLimit(t, algorithms.FixedWindow, 1_000_000, time.Hour)
	const keys, workers, passes = syncLanes*syncChunk + 1500, 4, 3
	s := syncStore(t, srv.URL(), "lanes", l, 2*keys)
	// (An earlier test's Redis may have had this port: the series is
	// the target's, so count from here.)
	n0, sum0 := syncDurations(t, s.opts.Target)
	y := s.async.Load()
	key := func(i int) algorithms.Key {
		return algorithms.Key{1, byte(algorithms.KeyHash), byte(i >> 16), byte(i >> 8), byte(i), 0x33}
	}
	var admitted [keys]atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			reqs := []algorithms.Request{{Zone: "lanes", Limit: l, Cost: 1}}
			out := make([]algorithms.Decision, 1)
			for p := range passes {
				for i := range keys {
					k := (i*7919 + w*1237 + p*31) % keys
					reqs[0].Key = key(k)
					if err := s.Take(context.Background(), reqs, out); err != nil {
						t.Error(err)
						return
					}
					if out[0].Allowed {
						admitted[k].Add(1)
					}
				}
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	syncs := 0
	for running := true; running; syncs++ {
		select {
		case <-done:
			running = false
		default:
		}
		y.syncNow()
	}
	y.syncNow()
	if st, _ := s.SyncStatus("lanes"); st.Error != "" || st.Held != 0 {
		t.Fatalf("status %+v: want every charge landed", st)
	}
	counts := windowCounts(t, srv, s, "lanes", keys, key, l)
	var total, want int64
	for i, got := range counts {
		if a := admitted[i].Load(); got != a {
			t.Fatalf("key %d: Redis counts %d, %d admitted", i, got, a)
		}
		total += got
		want += workers * passes
	}
	if total != want {
		t.Fatalf("Redis counts %d in all, want %d (every request admitted)", total, want)
	}
	t.Logf("%d keys, %d requests, %d syncs while they ran", keys, total, syncs)
	// Each sync that sent keys is timed: caddy_rate_limit_sync_duration_seconds.
	n, sum := syncDurations(t, s.opts.Target)
	n, sum = n-n0, sum-sum0
	if runs := y.runs.Load(); n != uint64(runs) || runs < 1 || sum <= 0 {
		t.Fatalf("sync_duration_seconds counts %d syncs taking %gs, want the %d that sent keys", n, sum, runs)
	}
}

// windowCounts is what Redis counts for each of n keys of zone (key(i)
// the i-th), in the current window and the one before (in case the test
// crossed a window's end).
func windowCounts(t *testing.T, srv *redistest.Server, s *Store, zone string, n int, key func(int) algorithms.Key, l algorithms.Limit) []int64 {
	t.Helper()
	ctx := context.Background()
	start := algorithms.WindowStart(time.Now().UnixMilli(), l.Window)
	pipe := srv.Client().Pipeline()
	cmds := make([][2]*redis.StringCmd, n)
	for i := range n {
		name := s.Key(zone, key(i))
		cmds[i] = [2]*redis.StringCmd{pipe.Get(ctx, countKey(name, start)), pipe.Get(ctx, countKey(name, start-l.Window))}
	}
	if _, err := pipe.Exec(ctx); err != nil && err != redis.Nil {
		t.Fatal(err)
	}
	counts := make([]int64, n)
	for i := range n {
		for _, c := range cmds[i] {
			v, err := c.Int64()
			if err != nil && err != redis.Nil {
				t.Fatal(err)
			}
			counts[i] += v
		}
	}
	return counts
}

// syncDurations is what sync_duration_seconds holds for target's stores:
// the syncs timed and their seconds in all (none: zero).
func syncDurations(t *testing.T, target string) (uint64, float64) {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(storeMetrics.syncDuration)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "target" && lp.GetValue() == target {
					return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
				}
			}
		}
	}
	return 0, 0 // none yet
}

// TestSyncLanesLeaveWorkersTheirConnections: with a pool_size set, a sync
// runs only as many pipelines at once as the pool holds beside the
// decisions' workers (at least one); unset, the full syncLanes (go-redis
// spills a pipeline beyond its pipeline pool to the main pool, 10
// connections per CPU, at once).
func TestSyncLanesLeaveWorkersTheirConnections(t *testing.T) {
	for _, tc := range []struct {
		pool, pipelines, want int
	}{
		{0, 0, syncLanes},
		{0, 8, syncLanes},
		{100, 0, syncLanes},
		{5, 0, 3},
		{4, 0, 2},
		{4, 3, 1},
		{2, 0, 1},
		{1, 0, 1},
	} {
		c := connConfig{PoolSize: tc.pool, Pipelines: tc.pipelines}
		if got := c.syncLanes(); got != tc.want {
			t.Errorf("pool_size %d, pipelines %d: %d lanes, want %d", tc.pool, tc.pipelines, got, tc.want)
		}
	}
}
