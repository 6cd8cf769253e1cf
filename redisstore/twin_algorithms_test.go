package redisstore

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/algorithms/vectortest"
	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// limitOf builds a checked Limit of any algorithm.
func limitOf(t testing.TB, alg algorithms.Algorithm, events int64, window time.Duration, burst int64) algorithms.Limit {
	t.Helper()
	l, err := algorithms.NewLimit(alg, events, window, burst)
	if err != nil {
		t.Fatalf("NewLimit(%s, %d, %v, %d): %v", alg, events, window, burst, err)
	}
	return l
}

// Every shared vector (algorithms/testdata/*.json) through the Lua twin: the
// test entry point of the production script, against a real Redis, with the
// time of each step in ARGV[1]. Step (algorithms) and the memory store
// (memstore) run the very same files.
func TestVectorsLua(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	ctx := testCtx(t)
	for vi, v := range vectortest.Load(t) {
		t.Run(v.File+"/"+v.Name, func(t *testing.T) {
			key := "vector:" + v.File + ":" + string(rune('a'+vi))
			srv.Do(t, "DEL", key)
			for i, s := range v.Compile(t) {
				if s.Refund || s.Settle {
					// The refund (or settle), then the key's view (a take
					// of cost 0).
					rf := algorithms.Refund{Limit: s.Limit, Cost: s.Cost, At: s.At, Settle: s.Settle, Settled: s.Settled}
					if _, err := runTwin(ctx, c, []string{key}, refundArgs([]any{s.Now}, rf)...); err != nil {
						t.Fatalf("step %d: refund: %v", i, err)
					}
				}
				args := []any{s.Now}
				r := *s.Request()
				if s.Refund || s.Settle {
					r.Cost = 0
				}
				args = luaArgs(args, false, r)
				res, err := runTwin(ctx, c, []string{key}, args...)
				if err != nil || len(res) != 4 {
					t.Fatalf("step %d: script: %v %v", i, res, err)
				}
				got := vectortest.Want{Allowed: res[0] == 1, Remaining: res[1], RetryAfterMs: res[2], ResetAfterMs: res[3]}
				if got.Allowed {
					got.RetryAfterMs, got.DelayMs = 0, res[2] // an admission's retry-after is its wait
				}
				if got != s.Want {
					t.Fatalf("step %d (at %d, cost %d; %s):\n got  %+v\n want %+v", i, s.Step.AtMs, s.Cost, s.Step.Note, got, s.Want)
				}
			}
		})
	}
}

// The random twin comparison of TestLuaTwinMatchesGo, for every algorithm:
// fixed limits, changing limits (events and window, and the algorithm
// itself), and requests over several zones of different algorithms.
func TestLuaTwinMatchesGoAllAlgorithms(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	const steps = 400
	type lim = algorithms.Limit
	L := func(alg algorithms.Algorithm, events int64, window time.Duration, burst int64) lim {
		return limitOf(t, alg, events, window, burst)
	}
	G, SW, FW, SL := algorithms.GCRA, algorithms.SlidingWindow, algorithms.FixedWindow, algorithms.SlidingLog
	TB := algorithms.TokenBucket

	single := map[algorithms.Algorithm][]lim{
		G: {L(G, 7, time.Second, 0), L(G, 10, time.Minute, 25), L(G, 3, 7*time.Millisecond, 5), L(G, 5, time.Second, 2),
			L(G, 1, 24*time.Hour, 3), L(G, 1000, time.Millisecond, 0), L(G, 983, time.Second, 0),
			L(G, 100000, time.Hour, 150000), L(G, 13, 7*time.Second, 20), L(G, 9973, 997*time.Millisecond, 0)},
		SW: {L(SW, 7, time.Second, 0), L(SW, 10, time.Minute, 0), L(SW, 3, 7*time.Millisecond, 0), L(SW, 1, 24*time.Hour, 0),
			L(SW, 1000, time.Millisecond, 0), L(SW, 983, time.Second, 0), L(SW, 100000, time.Hour, 0), L(SW, 13, 7*time.Second, 0)},
		FW: {L(FW, 7, time.Second, 0), L(FW, 10, time.Minute, 0), L(FW, 3, 7*time.Millisecond, 0), L(FW, 1, 24*time.Hour, 0),
			L(FW, 1000, time.Millisecond, 0), L(FW, 983, time.Second, 0), L(FW, 13, 7*time.Second, 0), L(FW, 5, 13*time.Second, 0)},
		SL: {L(SL, 7, time.Second, 0), L(SL, 10, time.Minute, 0), L(SL, 3, 7*time.Millisecond, 0), L(SL, 1, 24*time.Hour, 0),
			L(SL, 983, time.Second, 0), L(SL, 13, 7*time.Second, 0), L(SL, 5, 24*time.Hour, 0), L(SL, 200, 200*time.Millisecond, 0)},
	}
	total := 0
	for alg, ls := range single {
		for li, l := range ls {
			t.Run("single/"+limitString(l), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(twinSeed, uint64(1000*int(alg)+li)))
				tw := newTwin(t, srv, c, 1)
				for range steps {
					tw.step([]lim{l}, []int64{cost(rng, l)}, advance(rng, l))
				}
				total += tw.steps
			})
		}
	}

	// A changed limit on every few steps, among different events and
	// windows of one algorithm; and a zone whose algorithm changes.
	changing := []struct {
		name string
		set  []lim
	}{
		{"gcra", []lim{L(G, 7, time.Second, 0), L(G, 13, 7*time.Second, 20), L(G, 2, 300*time.Millisecond, 0),
			L(G, 60, time.Minute, 0), L(G, 983, time.Second, 5)}},
		{"sliding_window", []lim{L(SW, 7, time.Second, 0), L(SW, 13, 7*time.Second, 0), L(SW, 2, 300*time.Millisecond, 0),
			L(SW, 60, time.Minute, 0), L(SW, 3, time.Second, 0)}},
		{"fixed_window", []lim{L(FW, 7, time.Second, 0), L(FW, 13, 7*time.Second, 0), L(FW, 2, 300*time.Millisecond, 0),
			L(FW, 60, time.Minute, 0), L(FW, 3, time.Second, 0)}},
		{"sliding_log", []lim{L(SL, 7, time.Second, 0), L(SL, 13, 7*time.Second, 0), L(SL, 2, 300*time.Millisecond, 0),
			L(SL, 60, time.Minute, 0), L(SL, 3, time.Second, 0)}},
		{"algorithm", []lim{L(TB, 7, time.Second, 0), L(G, 7, time.Second, 0), L(SW, 7, time.Second, 0),
			L(FW, 7, time.Second, 0), L(SL, 7, time.Second, 0)}},
	}
	for ci, tc := range changing {
		set := tc.set
		t.Run("changed limit/"+tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(twinSeed, uint64(5000+ci)))
			tw := newTwin(t, srv, c, 1)
			l := set[0]
			for range steps {
				if rng.IntN(8) == 0 {
					l = set[rng.IntN(len(set))]
				}
				tw.step([]lim{l}, []int64{cost(rng, l)}, advance(rng, l))
			}
			total += tw.steps
		})
	}

	// Several zones of different algorithms in one call: all-or-nothing
	// across algorithms, and a vetoed zone reports its uncharged view.
	multi := []struct {
		name   string
		limits []lim
	}{
		{"all five", []lim{L(TB, 10, time.Minute, 25), L(G, 7, time.Second, 3), L(SW, 5, time.Second, 0), L(FW, 20, time.Minute, 0), L(SL, 4, 3*time.Second, 0)}},
		{"burst and day", []lim{L(SL, 3, time.Second, 0), L(FW, 50, time.Hour, 0)}},
		{"window and bucket", []lim{L(SW, 3, 700*time.Millisecond, 0), L(G, 10, time.Minute, 0), L(TB, 2, time.Second, 0)}},
	}
	for mi, tc := range multi {
		t.Run("multi/"+tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(twinSeed, uint64(6000+mi)))
			tw := newTwin(t, srv, c, len(tc.limits))
			for range steps {
				costs := make([]int64, len(tc.limits))
				for i, l := range tc.limits {
					costs[i] = cost(rng, l)
					if rng.IntN(3) > 0 {
						costs[i] = 1
					}
				}
				tw.step(tc.limits, costs, advance(rng, tc.limits[rng.IntN(len(tc.limits))]))
			}
			total += tw.steps
		})
	}
	t.Logf("%d steps compared", total)
	if total < 10000 && !t.Failed() {
		t.Fatalf("only %d steps compared", total)
	}
}

// The refund mode (a cross-slot veto gives back what one slot charged)
// undoes a charge for every algorithm: after charge + refund, the key
// decides exactly as if the charge never happened.
func TestRefundEveryAlgorithm(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	ctx := testCtx(t)
	const base = int64(1_780_000_020_000) // 20s into a minute
	for alg := range algorithms.Algorithm(5) {
		l := limitOf(t, alg, 10, time.Minute, 0)
		t.Run(alg.String(), func(t *testing.T) {
			key := "refund:" + alg.String()
			srv.Do(t, "DEL", key)
			call := func(now, cost int64, refund bool) []int64 {
				t.Helper()
				r := algorithms.Request{Limit: l, Cost: cost}
				res, err := runTwin(ctx, c, []string{key}, luaArgs([]any{now}, refund, r)...)
				if err != nil {
					t.Fatalf("script: %v", err)
				}
				return res
			}
			call(base, 2, false)
			call(base+1, 3, false)
			call(base+2, 3, true)
			got := call(base+5, 6, false)
			// Go: the same without the charge and its refund.
			_, st, _ := algorithms.Step(algorithms.State{}, true, l, base, 2)
			d, _, _ := algorithms.Step(st, false, l, base+5, 6)
			want := []int64{0, d.Remaining, d.RetryAfter.Milliseconds(), d.ResetAfter.Milliseconds()}
			if d.Allowed {
				want[0] = 1
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("after charge and refund: Lua %v, Go without them %v", got, want)
			}
		})
	}
}

// Memory per key in Redis, measured: MEMORY USAGE of one zone's key after
// requests through the production script, with a production key name
// (prefix sluice:v1:, a zone name, an IPv4 identity token). The budget is
// 100 bytes per key for the token bucket, asserted here with one token
// spent and with the bucket emptied (the largest debt).
// Run: go test -run TestRedisMemoryPerKey -v ./redisstore/
func TestRedisMemoryPerKey(t *testing.T) {
	srv := redistest.Start(t)
	s := newTestStore(t, srv.URL(), "", testTimeout, 0)
	ip := keyOf(t, "203.0.113.7")
	const budget = 100 // bytes per key, token bucket
	cases := []struct {
		name  string
		l     algorithms.Limit
		takes int
		max   int64
	}{
		{"token_bucket", limitOf(t, algorithms.TokenBucket, 100, time.Minute, 0), 1, budget},
		{"gcra", limitOf(t, algorithms.GCRA, 100, time.Minute, 0), 1, 600},
		{"sliding_window", limitOf(t, algorithms.SlidingWindow, 100, time.Minute, 0), 1, 600},
		{"fixed_window", limitOf(t, algorithms.FixedWindow, 100, time.Minute, 0), 1, 600},
		{"sliding_log, 1 event", limitOf(t, algorithms.SlidingLog, 5, 24*time.Hour, 0), 1, 600},
		{"sliding_log, 5 events", limitOf(t, algorithms.SlidingLog, 5, 24*time.Hour, 0), 5, 600},
		{"sliding_log, 100 events", limitOf(t, algorithms.SlidingLog, 100, time.Hour, 0), 100, 600},
		{"token_bucket, emptied", limitOf(t, algorithms.TokenBucket, 100, time.Minute, 0), 100, budget},
	}
	for i, c := range cases {
		zone := fmt.Sprintf("api%d", i)
		for range c.takes {
			out := take(t, s, algorithms.Request{Zone: zone, Key: ip, Limit: c.l, Cost: 1})
			if !out[0].Allowed {
				t.Fatalf("%s: refused", c.name)
			}
		}
		key := s.Key(zone, ip)
		n, err := s.Client().MemoryUsage(testCtx(t), key, 0).Result()
		if err != nil {
			t.Fatalf("MEMORY USAGE %s: %v", key, err)
		}
		val := getRaw(t, s.Client(), key)
		t.Logf("%-24s MEMORY USAGE %s SAMPLES 0 = %4d bytes (value %d bytes)", c.name, key, n, len(val))
		if n > c.max {
			t.Errorf("%s: %d bytes per key, want at most %d", c.name, n, c.max)
		}
	}
	// The token bucket's value with the bucket emptied (its largest debt),
	// for common limits: at most 12 bytes keeps a key at 88 bytes (with
	// zone names of 4 characters, as above: the key's length counts too).
	for i, c := range []struct {
		events int64
		window time.Duration
		burst  int64
	}{{10, time.Second, 0}, {100, time.Second, 0}, {100, time.Minute, 0}, {1000, time.Minute, 0}, {10, time.Minute, 50},
		{1000, time.Hour, 0}, {10000, time.Hour, 0}, {100, 24 * time.Hour, 0}, {5, 7 * time.Second, 0}, {3, 1500 * time.Millisecond, 0}} {
		l := limitOf(t, algorithms.TokenBucket, c.events, c.window, c.burst)
		zone := fmt.Sprintf("tb%02d", i)
		if d := take(t, s, algorithms.Request{Zone: zone, Key: ip, Limit: l, Cost: l.Capacity()})[0]; !d.Allowed {
			t.Fatalf("%s: refused", limitString(l))
		}
		key := s.Key(zone, ip)
		n, err := s.Client().MemoryUsage(testCtx(t), key, 0).Result()
		if err != nil {
			t.Fatalf("MEMORY USAGE %s: %v", key, err)
		}
		val := getRaw(t, s.Client(), key)
		t.Logf("%-40s emptied: MEMORY USAGE = %4d bytes (value %d bytes)", limitString(l), n, len(val))
		if len(val) > 12 || n > budget {
			t.Errorf("%s emptied: %d bytes per key (value %d bytes), want at most %d", limitString(l), n, len(val), budget)
		}
	}
	// Logs of events spread in time (longer deltas), through the test entry
	// point (the production one reads the clock).
	for _, c := range []struct {
		events, window, every int64
	}{{5, 86_400_000, 3_600_000 + 1234}, {100, 3_600_000, 35_000 + 17}, {1000, 3_600_000, 3_500 + 7}} {
		l := limitOf(t, algorithms.SlidingLog, c.events, time.Duration(c.window)*time.Millisecond, 0)
		key := s.Key(fmt.Sprintf("log%d", c.events), ip)
		now := int64(1_780_000_000_000)
		for range c.events {
			now += c.every
			r := algorithms.Request{Limit: l, Cost: 1}
			if err := twinScript.Run(testCtx(t), s.Client(), []string{key}, luaArgs([]any{now}, false, r)...).Err(); err != nil {
				t.Fatal(err)
			}
		}
		n, err := s.Client().MemoryUsage(testCtx(t), key, 0).Result()
		if err != nil {
			t.Fatalf("MEMORY USAGE %s: %v", key, err)
		}
		t.Logf("sliding_log, %4d events %dms apart: MEMORY USAGE = %5d bytes (value %d bytes)", c.events, c.every, n, len(getRaw(t, s.Client(), key)))
	}
}
