package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// An admin reset through any store sharing the Redis reaches every store's
// deny cache, and state lost in Redis (FLUSHALL, a node flushed in a
// Cluster) ends the cached refusals (issue 13, items 2 and 4).

// untilAllowed sends r through s until it is allowed (then it is charged)
// or timeout passes, and returns how long that took.
func untilAllowed(t *testing.T, s *Store, timeout time.Duration, r algorithms.Request) (time.Duration, bool) {
	t.Helper()
	start := time.Now()
	for time.Since(start) < timeout {
		if take(t, s, r)[0].Allowed {
			return time.Since(start), true
		}
		time.Sleep(10 * time.Millisecond)
	}
	return time.Since(start), false
}

// refusedLocally exhausts r's key through s and checks that the next
// request is refused by the deny cache (no script call).
func refusedLocally(t *testing.T, srv *redistest.Server, s *Store, r algorithms.Request) {
	t.Helper()
	for i := 0; i < 100 && take(t, s, r)[0].Allowed; i++ {
	}
	// The cache remembers refusals once it has seen the store's control
	// keys (its first poll, at start): give it that.
	deadline := time.Now().Add(2 * time.Second)
	for {
		calls := scriptCalls(t, srv)
		d := take(t, s, r)[0]
		if d.Allowed {
			t.Fatalf("an exhausted key was allowed: %+v", d)
		}
		if scriptCalls(t, srv) == calls {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the refusals of an exhausted key still go to Redis after 2 s: not cached")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestDenyCacheResetReachesEveryStore (item 2): three stores share one
// Redis, as three Caddy instances do; each caches a refusal of one key;
// an admin reset through one of them unblocks the key on all three within
// about a second.
func TestDenyCacheResetReachesEveryStore(t *testing.T) {
	srv := redistest.Start(t)
	stores := []*Store{denyStore(t, srv, 1000), denyStore(t, srv, 1000), denyStore(t, srv, 1000)}
	l := limitOf(t, algorithms.FixedWindow, 3, 24*time.Hour, 0)
	r := algorithms.Request{Zone: "reach", Key: freshKey(t), Limit: l, Cost: 1}
	for _, s := range stores {
		refusedLocally(t, srv, s, r)
	}
	if _, err := stores[0].ResetKeys(context.Background(), r.Zone, []algorithms.Key{r.Key}); err != nil {
		t.Fatal(err)
	}
	for i, s := range stores {
		took, ok := untilAllowed(t, s, 3*time.Second, r)
		if !ok {
			t.Fatalf("store %d: still refused %v after the reset through store 0", i, took)
		}
		t.Logf("store %d: allowed %v after the reset", i, took.Round(time.Millisecond))
		if took > 1500*time.Millisecond {
			t.Errorf("store %d: allowed only %v after the reset, want about a second at most", i, took)
		}
	}
}

// TestDenyCacheFlushAll (item 4): a FLUSHALL ends the cached refusals
// within about a second, and Redis then admits the client.
func TestDenyCacheFlushAll(t *testing.T) {
	srv := redistest.Start(t)
	s := denyStore(t, srv, 1000)
	r := algorithms.Request{Zone: "flush", Key: freshKey(t), Limit: limit(t, 2, time.Hour, 0), Cost: 1}
	refusedLocally(t, srv, s, r)
	srv.Do(t, "FLUSHALL")
	took, ok := untilAllowed(t, s, 3*time.Second, r)
	if !ok || took > 1500*time.Millisecond {
		t.Fatalf("after FLUSHALL: allowed %v (after %v), want allowed within about a second", ok, took)
	}
	t.Logf("allowed %v after FLUSHALL", took.Round(time.Millisecond))
}

// TestDenyCacheCluster (items 2 and 4, Cluster): two stores share a
// 3-master Cluster. FLUSHALL on one master (not the one holding the
// resets counter) ends the cached refusals of keys on that master within
// about a second; so does a reset through the other store.
func TestDenyCacheCluster(t *testing.T) {
	c := redistest.StartCluster(t, 3)
	store := func() *Store {
		cfg := connConfig{Cluster: c.Addrs(), Timeout: testTimeout, Prefix: DefaultKeyPrefix}
		cl, _, err := cfg.newClient()
		if err != nil {
			t.Fatal(err)
		}
		o := defaultOptions()
		o.Target = "test " + t.Name()
		s := newStoreWith(cl, true, DefaultKeyPrefix, testTimeout, o)
		t.Cleanup(func() { _ = s.Destruct() })
		waitArmed(t, s)
		return s
	}
	a, b := store(), store()
	ctl := nodeOf(c, hashSlot([]byte("sluice")))
	node := (ctl + 1) % len(c.Nodes)
	calls := func() int64 {
		var n int64
		for _, nd := range c.Nodes {
			n += scriptCalls(t, nd)
		}
		return n
	}
	// cached exhausts r's key through s, until s refuses it from its
	// cache (a poll may clear the cache meanwhile: the other store's
	// after the FLUSHALL, seeing it late).
	cached := func(t *testing.T, s *Store, r algorithms.Request) {
		t.Helper()
		for i := 0; i < 10 && take(t, s, r)[0].Allowed; i++ {
		}
		deadline := time.Now().Add(2 * time.Second)
		for {
			n := calls()
			d := take(t, s, r)[0]
			if d.Allowed {
				t.Fatalf("an exhausted key was allowed: %+v", d)
			}
			if calls() == n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatal("the refusals of an exhausted key still go to Redis after 2 s: not cached")
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	t.Run("flushall", func(t *testing.T) {
		r := algorithms.Request{Zone: "z", Key: keyOnNode(t, a, c, node), Limit: limit(t, 2, time.Hour, 0), Cost: 1}
		cached(t, a, r)
		c.Nodes[node].Do(t, "FLUSHALL")
		took, ok := untilAllowed(t, a, 3*time.Second, r)
		if !ok || took > 1500*time.Millisecond {
			t.Fatalf("after FLUSHALL on node %d: allowed %v (after %v), want allowed within about a second", node, ok, took)
		}
		t.Logf("allowed %v after FLUSHALL on node %d (the resets counter on node %d)", took.Round(time.Millisecond), node, ctl)
	})
	t.Run("cross-slot", func(t *testing.T) {
		// Zones keyed on identities in two slots: Redis decides every
		// time (slot by slot, with refunds), never the cache.
		x := algorithms.Request{Zone: "z", Key: keyOnNode(t, a, c, node), Limit: limit(t, 1, time.Hour, 0), Cost: 1}
		y := algorithms.Request{Zone: "y", Key: keyOnNode(t, a, c, ctl), Limit: limit(t, 100, time.Hour, 0), Cost: 1}
		if inOneHashSlot([]algorithms.Request{x, y}) || !inOneHashSlot([]algorithms.Request{x, x}) {
			t.Fatal("inOneHashSlot is wrong")
		}
		cached(t, a, x) // x alone: cached
		for i := range 5 {
			n := calls()
			out := take(t, a, y, x)
			if out[1].Allowed || calls() == n {
				t.Fatalf("cross-slot request %d: %+v, %d script calls; want refused by Redis", i, out, calls()-n)
			}
		}
	})
	t.Run("reset", func(t *testing.T) {
		r := algorithms.Request{Zone: "z", Key: keyOnNode(t, a, c, node), Limit: limit(t, 3, time.Hour, 0), Cost: 1}
		cached(t, a, r)
		cached(t, b, r)
		if _, err := b.ResetKeys(context.Background(), r.Zone, []algorithms.Key{r.Key}); err != nil {
			t.Fatal(err)
		}
		for i, s := range []*Store{a, b} {
			took, ok := untilAllowed(t, s, 3*time.Second, r)
			if !ok || took > 1500*time.Millisecond {
				t.Fatalf("store %d after the reset: allowed %v (after %v), want allowed within about a second", i, ok, took)
			}
			t.Logf("store %d: allowed %v after the reset", i, took.Round(time.Millisecond))
		}
	})
}
