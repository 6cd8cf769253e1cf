package redisstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// refundAndWait gives back refunds through the pipeline workers' async
// path (as Store.Refund does) and waits until the worker has run them.
func refundAndWait(t testing.TB, s *Store, refunds []algorithms.Refund) {
	t.Helper()
	done := make(chan error, 1)
	c := s.refundCall(refunds)
	c.onDone = func(c *call) {
		if c.cmd == nil {
			done <- fmt.Errorf("not sent")
			return
		}
		done <- c.replyErr()
	}
	if !s.batch.post(c) {
		t.Fatal("queue full")
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("refund: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("refund never ran")
	}
}

// Refund exactness in Redis, per algorithm: one client's requests, each
// matching (its response counts) or not at random, charged before and
// given back after when not matching; another key of the same zone gets
// only the matching requests, in the same script call as the first key's
// (so at the same Redis instant). After every request both keys must show
// the same (peeked in one pipeline, at one Redis instant).
func TestRefundsExactInRedis(t *testing.T) {
	srv := redistest.Start(t)
	s := newTestStore(t, srv.URL(), "", testTimeout, 0)
	for ai, alg := range []algorithms.Algorithm{algorithms.TokenBucket, algorithms.GCRA, algorithms.SlidingWindow, algorithms.FixedWindow, algorithms.SlidingLog} {
		t.Run(alg.String(), func(t *testing.T) {
			burst := int64(0)
			if alg.AllowsBurst() {
				burst = 6
			}
			l := limitOf(t, alg, 20, 500*time.Millisecond, burst)
			zone := "exact_" + alg.String()
			all, matching := freshKey(t), freshKey(t)
			rng := rand.New(rand.NewPCG(11, uint64(ai)))
			var refunds, refused int
			for i := range 250 {
				time.Sleep(time.Duration(rng.IntN(12)) * time.Millisecond)
				cost := 1 + rng.Int64N(2)
				match := rng.IntN(2) == 0
				reqs := []algorithms.Request{{Zone: zone, Key: all, Limit: l, Cost: cost, Refundable: true}}
				if match {
					reqs = append(reqs, algorithms.Request{Zone: zone, Key: matching, Limit: l, Cost: cost, Refundable: true})
				}
				out := take(t, s, reqs...)
				if out[0].At == 0 {
					t.Fatalf("request %d: a refundable decision without its instant: %+v", i, out[0])
				}
				if match && out[0] != out[1] {
					t.Fatalf("request %d: the two keys decided %+v and %+v", i, out[0], out[1])
				}
				if !out[0].Allowed {
					refused++
				}
				if out[0].Allowed && !match {
					time.Sleep(time.Duration(rng.IntN(8)) * time.Millisecond) // the response takes a while
					refundAndWait(t, s, []algorithms.Refund{{Zone: zone, Key: all, Limit: l, Cost: cost, At: out[0].At}})
					refunds++
				}
				got := make([]algorithms.Decision, 2)
				found := make([]bool, 2)
				if err := s.PeekKeys(context.Background(), zone, []algorithms.Key{all, matching}, l, got, found); err != nil {
					t.Fatal(err)
				}
				if got[0] != got[1] {
					t.Fatalf("after request %d (cost %d, matching %v, allowed %v): the key shows %+v, the matching-only key %+v", i, cost, match, out[0].Allowed, got[0], got[1])
				}
			}
			t.Logf("250 requests, %d refunds, %d refused: both keys alike throughout", refunds, refused)
			if refunds == 0 || refused == 0 {
				t.Fatal("the sequence exercised too little")
			}
		})
	}
}

// Store.Refund does not wait for Redis and lands; on a Cluster, refunds of
// keys in different slots go to each key's node. Redis is made to stall
// (DEBUG SLEEP on every node) as Refund is called: a Refund that waited for
// its reply would take the stall; it must return in a fraction of it.
func TestStoreRefundLands(t *testing.T) {
	l := limitOf(t, algorithms.TokenBucket, 5, time.Hour, 0)
	const stall = 400 * time.Millisecond
	check := func(t *testing.T, s *Store, nodes ...*redistest.Server) {
		a, b := freshKey(t), freshKey(t)
		out := take(t, s, algorithms.Request{Zone: "ra", Key: a, Limit: l, Cost: 2, Refundable: true},
			algorithms.Request{Zone: "rb", Key: b, Limit: l, Cost: 3, Refundable: true})
		if !out[0].Allowed || !out[1].Allowed || out[0].At == 0 || out[1].At == 0 {
			t.Fatalf("charges: %+v", out)
		}
		var stalls sync.WaitGroup
		for _, n := range nodes {
			stalls.Add(1)
			go func() {
				defer stalls.Done()
				if _, err := n.DoErr("DEBUG", "SLEEP", stall.Seconds()); err != nil {
					t.Errorf("DEBUG SLEEP: %v", err)
				}
			}()
		}
		time.Sleep(50 * time.Millisecond) // the stalls have begun (were they late, Refund would only look faster)
		start := time.Now()
		if err := s.Refund(context.Background(), []algorithms.Refund{
			{Zone: "ra", Key: a, Limit: l, Cost: 2, At: out[0].At},
			{Zone: "rb", Key: b, Limit: l, Cost: 3, At: out[1].At},
		}); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d > stall/4 {
			t.Errorf("Refund took %v while Redis stalled for %v: it must not wait for Redis", d, stall)
		}
		stalls.Wait()
		deadline := time.Now().Add(5 * time.Second)
		for {
			ga, gb := make([]algorithms.Decision, 1), make([]algorithms.Decision, 1)
			f := make([]bool, 1)
			_ = s.PeekKeys(context.Background(), "ra", []algorithms.Key{a}, l, ga, f)
			_ = s.PeekKeys(context.Background(), "rb", []algorithms.Key{b}, l, gb, f)
			if ga[0].Remaining == 5 && gb[0].Remaining == 5 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("after the refunds: %+v and %+v, want both full", ga[0], gb[0])
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	t.Run("standalone", func(t *testing.T) {
		srv := redistest.Start(t)
		check(t, newTestStore(t, srv.URL(), "", testTimeout, 0), srv)
	})
	t.Run("cluster", func(t *testing.T) {
		c := redistest.StartCluster(t, 3)
		s := newClusterStore(t, c.Addrs(), testTimeout)
		// Two keys in different slots, in one Refund call.
		check(t, s, c.Nodes...)
	})
}

// BenchmarkTakeCount compares, side by side in one run, 50 goroutines
// deciding one zone each against a local Redis: "plain" Takes; "kept",
// refundable Takes (the reply carries Redis's time) whose charge stays;
// "refunded", the same followed by a Refund of every charge (one more
// script call, pipelined, not waited for: it costs the pipelines and
// Redis, not the caller's wait).
//
//	go test -run XXX -bench TakeCount -benchmem ./redisstore/
func BenchmarkTakeCount(b *testing.B) {
	srv := redistest.Start(b)
	s := newTestStore(b, srv.URL(), "", DefaultTimeout, 0)
	for _, mode := range []string{"plain", "kept", "refunded"} {
		b.Run(mode, func(b *testing.B) {
			var seq, failed atomic.Int64
			take(b, s, benchZones(b, keyOf(b, "warm"), 1)...)
			b.SetParallelism((50 + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				reqs := benchZones(b, keyOf(b, "bench-count-"+strconv.FormatInt(seq.Add(1), 10)+time.Now().String()), 1)
				reqs[0].Refundable = mode != "plain"
				out := make([]algorithms.Decision, 1)
				refund := make([]algorithms.Refund, 1)
				ctx := context.Background()
				for pb.Next() {
					if err := s.Take(ctx, reqs, out); err != nil || !out[0].Allowed {
						failed.Add(1)
						continue
					}
					if mode == "refunded" {
						r := &reqs[0]
						refund[0] = algorithms.Refund{Zone: r.Zone, Key: r.Key, Limit: r.Limit, Cost: r.Cost, At: out[0].At}
						_ = s.Refund(ctx, refund)
					}
				}
			})
			b.StopTimer()
			if n := failed.Load(); n > 0 {
				b.Fatalf("%d of %d Takes failed or were refused", n, b.N)
			}
		})
	}
}

// A delay zone through the Redis store: a refundable Take reports the wait
// (Decision.Delay) and its instant; NoDelay refuses instead of reserving;
// a departed request's reservation, given back, is exact.
func TestStoreDelay(t *testing.T) {
	srv := redistest.Start(t)
	s := newTestStore(t, srv.URL(), "", testTimeout, 0)
	l := limitOf(t, algorithms.TokenBucket, 10, time.Hour, 1) // one token per 6 minutes
	l.Delay = int64(13 * time.Minute / time.Millisecond)
	k := freshKey(t)
	r := algorithms.Request{Zone: "dz", Key: k, Limit: l, Cost: 1, Refundable: true}
	first := take(t, s, r)[0]
	if !first.Allowed || first.Delay != 0 {
		t.Fatalf("first: %+v", first)
	}
	second := take(t, s, r)[0]
	if !second.Allowed || second.Delay < 6*time.Minute-time.Second || second.Delay > 6*time.Minute || second.At == 0 {
		t.Fatalf("second: %+v; want admitted with a wait of 6 minutes", second)
	}
	third := take(t, s, r)[0]
	if !third.Allowed || third.Delay < 12*time.Minute-time.Second || third.Delay > 12*time.Minute {
		t.Fatalf("third: %+v; want a wait of 12 minutes", third)
	}
	noWait := r
	noWait.NoDelay = true
	if d := take(t, s, noWait)[0]; d.Allowed || d.RetryAfter < 18*time.Minute-time.Second {
		t.Fatalf("a request that may not wait: %+v; want refused until it passes at once", d)
	}
	if d := take(t, s, r)[0]; d.Allowed || d.RetryAfter > 5*time.Minute+time.Second {
		t.Fatalf("a fourth (a wait of 18 minutes): %+v; want refused, Retry-After 5 minutes", d)
	}
	// The second goes away: its slot goes to the next request.
	refundAndWait(t, s, []algorithms.Refund{{Zone: "dz", Key: k, Limit: l, Cost: 1, At: second.At}})
	if d := take(t, s, r)[0]; !d.Allowed || d.Delay > 12*time.Minute || d.Delay < 12*time.Minute-2*time.Second {
		t.Fatalf("after the departure: %+v; want the freed turn (12 minutes)", d)
	}
}
