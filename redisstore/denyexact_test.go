package redisstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// A refusal answered from the deny cache reports what Redis would have
// reported for that very request (issue 13, item 3).

// TestDenyCacheCostSequences (item 3): the two sequences, 5 per
// minute with per-request costs: the last request of each is answered
// exactly as Redis answers it without the cache.
func TestDenyCacheCostSequences(t *testing.T) {
	srv := redistest.Start(t)
	l := limit(t, 5, time.Minute, 0)
	for _, tc := range []struct {
		costs     []int64
		retry     time.Duration
		remaining int64
	}{
		{[]int64{5, 1, 5}, 60 * time.Second, 0},
		{[]int64{4, 2, 1, 3}, 36 * time.Second, 0},
	} {
		t.Run(fmt.Sprint(tc.costs), func(t *testing.T) {
			for _, size := range []int{0, 1000} {
				s := denyStore(t, srv, size)
				key := freshKey(t)
				var last algorithms.Decision
				for _, c := range tc.costs {
					last = take(t, s, algorithms.Request{Zone: "seq", Key: key, Limit: l, Cost: c})[0]
				}
				if last.Allowed || last.Remaining != tc.remaining || last.RetryAfter > tc.retry || last.RetryAfter < tc.retry-time.Second {
					t.Errorf("deny cache size %d: the last request got %+v, want refused, remaining %d, Retry-After just under %v",
						size, last, tc.remaining, tc.retry)
				}
			}
		})
	}
}

// redisView asks Redis what it would answer to reqs now, without charging
// anything: in one MULTI, each zone's key is copied to a scratch key, the
// production function runs on the copies, and they are deleted. It also
// returns Redis's time and the zones' stored values, read in the same
// transaction.
func redisView(t *testing.T, s *Store, reqs []algorithms.Request) ([]algorithms.Decision, int64, []string) {
	t.Helper()
	ctx := testCtx(t)
	keys := make([]string, len(reqs))
	scratch := make([]string, len(reqs))
	var args []any
	for i := range reqs {
		keys[i] = s.Key(reqs[i].Zone, reqs[i].Key)
		scratch[i] = "oracle:" + keys[i]
		args = luaArgs(args, false, reqs[i])
	}
	var fcall *redis.Cmd
	var tm *redis.TimeCmd
	gets := make([]*redis.StringCmd, len(reqs))
	_, err := s.Client().TxPipelined(ctx, func(p redis.Pipeliner) error {
		for i := range reqs {
			p.Del(ctx, scratch[i])
			p.Copy(ctx, keys[i], scratch[i], 0, true)
			gets[i] = p.Get(ctx, keys[i])
		}
		tm = p.Time(ctx)
		fcall = p.FCall(ctx, LuaFunction, scratch, args...)
		for i := range reqs {
			p.Del(ctx, scratch[i])
		}
		return nil
	})
	if err != nil && err != redis.Nil {
		t.Fatalf("the oracle's transaction: %v", err)
	}
	res, err := scriptValues(fcall)
	if err != nil || len(res) < 4*len(reqs) {
		t.Fatalf("the oracle's FCALL: %v %v", res, err)
	}
	out := make([]algorithms.Decision, len(reqs))
	for i := range reqs {
		n := func(j int) int64 { return res[4*i+j].(int64) }
		out[i] = algorithms.Decision{Allowed: n(0) == 1, Limit: reqs[i].Limit.Capacity(), Remaining: n(1),
			RetryAfter: time.Duration(n(2)) * time.Millisecond, ResetAfter: time.Duration(n(3)) * time.Millisecond}
	}
	raws := make([]string, len(reqs))
	for i, g := range gets {
		raws[i], _ = g.Result()
	}
	return out, tm.Val().UnixMilli(), raws
}

// twinAnswer is what the script answers to reqs against the stored values
// raws at Redis time now: Step per zone; when an enforcing zone refuses,
// the zones that allowed are shown as they stand (cost 0).
func twinAnswer(reqs []algorithms.Request, raws []string, now int64) []algorithms.Decision {
	out := make([]algorithms.Decision, len(reqs))
	refused := false
	for i := range reqs {
		st, ok := DecodeState(raws[i])
		out[i], _, _ = algorithms.Step(st, !ok, reqs[i].Limit, now, reqs[i].Cost)
		refused = refused || (!out[i].Allowed && !reqs[i].ReportOnly)
	}
	for i := range reqs {
		if refused && out[i].Allowed {
			st, ok := DecodeState(raws[i])
			out[i], _, _ = algorithms.Step(st, !ok, reqs[i].Limit, now, 0)
		}
		out[i].Limit = reqs[i].Limit.Capacity()
	}
	return out
}

// sameAnswer compares two answers to one request: Allowed and Remaining
// equal, Retry-After and Reset-After within tol.
func sameAnswer(a, b []algorithms.Decision, tol time.Duration) bool {
	for i := range a {
		x, y := a[i], b[i]
		if x.Allowed != y.Allowed || x.Remaining != y.Remaining || x.Limit != y.Limit ||
			(x.RetryAfter-y.RetryAfter).Abs() > tol || (x.ResetAfter-y.ResetAfter).Abs() > tol {
			return false
		}
	}
	return true
}

// TestDenyCacheMatchesRedis (item 3): random requests with random costs
// (up to one more than the capacity), over one or two zones (the second
// sometimes report-only), for every algorithm; every answer served from
// the deny cache is compared at once with what Redis answers to the same
// request without charging it (redisView): Allowed and Remaining equal,
// Retry-After and Reset-After within a few milliseconds. When that fails
// (a boundary, a token refilled or a log entry aged out, fell between the
// two; or the comparison came late on a loaded machine), the cached answer
// must instead equal exactly the script's answer, computed by its Go twin
// from the same stored values, zone by zone at an instant between the start
// of the cached Take and the comparison (5 ms either side, and as much later
// as the slowest call to Redis took: the cache's estimate of Redis's time
// counts from the start of the call that stored the state).
func TestDenyCacheMatchesRedis(t *testing.T) {
	algs := []algorithms.Algorithm{algorithms.TokenBucket, algorithms.GCRA, algorithms.FixedWindow, algorithms.SlidingWindow, algorithms.SlidingLog}
	srv := redistest.Start(t)
	for _, alg := range algs {
		t.Run(alg.String(), func(t *testing.T) {
			s := denyStore(t, srv, 1000)
			l := limitOf(t, alg, 5, 2*time.Second, 0)
			second := limitOf(t, algs[(int(alg)+1)%len(algs)], 8, 3*time.Second, 0)
			keys := []algorithms.Key{freshKey(t), freshKey(t)}
			rng := rand.New(rand.NewPCG(uint64(alg)+101, 13))
			var hits, direct, boundary, requests int
			var slowest int64 // ms, the longest Take that called Redis
			deadline := time.Now().Add(20 * time.Second)
			for hits < 80 && requests < 3000 && time.Now().Before(deadline) {
				requests++
				k := keys[rng.IntN(len(keys))]
				reqs := []algorithms.Request{{Zone: "mx", Key: k, Limit: l, Cost: 1 + rng.Int64N(l.Capacity()+1)}}
				if rng.IntN(3) == 0 {
					reqs = append(reqs, algorithms.Request{Zone: "my", Key: k, Limit: second, Cost: 1 + rng.Int64N(3), ReportOnly: rng.IntN(2) == 0})
				}
				calls := scriptCalls(t, srv)
				out := make([]algorithms.Decision, len(reqs))
				began := time.Now()
				if err := s.Take(context.Background(), reqs, out); err != nil {
					t.Fatal(err)
				}
				if scriptCalls(t, srv) != calls {
					// The cache's estimate of Redis's time may run ahead
					// by the time such a call took to reach the script.
					slowest = max(slowest, time.Since(began).Milliseconds())
					time.Sleep(time.Duration(rng.IntN(40)) * time.Millisecond)
					continue
				}
				hits++
				view, now, raws := redisView(t, s, reqs)
				took := time.Since(began).Milliseconds()
				if sameAnswer(out, view, 5*time.Millisecond) {
					direct++
					continue
				}
				// Zone by zone: the cache estimates Redis's time from each
				// zone's entry, which may come from different refusals
				// (rounded to the millisecond each).
				match := true
				for i := range reqs {
					zone := false
					for at := now - took - 5; at <= now+slowest+5 && !zone; at++ {
						zone = sameAnswer(out[i:i+1], twinAnswer(reqs, raws, at)[i:i+1], 0)
					}
					match = match && zone
				}
				if !match {
					t.Fatalf("request %d %+v: the deny cache answered\n  %+v\nRedis answers, %d ms after the cached Take began,\n  %+v\n(stored %q at %d)",
						requests, reqs, out, took, view, raws, now)
				}
				boundary++
				time.Sleep(time.Duration(rng.IntN(40)) * time.Millisecond)
			}
			t.Logf("%s: %d requests, %d answered by the deny cache: %d as Redis answers right after, %d at a boundary crossed in between",
				alg, requests, hits, direct, boundary)
			if hits < 30 {
				t.Fatalf("only %d answers from the deny cache: the comparison was barely exercised", hits)
			}
		})
	}
}
