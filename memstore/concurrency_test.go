package memstore

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/sluicehq/caddy-sluice/algorithms"
)

var conc5 = algorithms.Limit{Algorithm: algorithms.Concurrency, Events: 5, Window: 60_000}

func creq(zone string, key algorithms.Key, l algorithms.Limit, lease uint64) algorithms.Request {
	return algorithms.Request{Zone: zone, Key: key, Limit: l, Cost: 1, Holder: lease}
}

func release(t testing.TB, s *Store, reqs ...algorithms.Request) {
	t.Helper()
	if err := s.Release(context.Background(), reqs); err != nil {
		t.Fatalf("Release: %v", err)
	}
}

// 200 goroutines released together against `concurrent 5`, each holding
// its slot until every goroutine has been decided: exactly 5 hold a slot at
// the peak and 195 are refused; once they give their slots back, the key
// holds none. Repeated with the slots taken beside a rate zone (the
// multi-zone path) and on the same key (its slots come back every round).
func TestConcurrencyMemoryExact(t *testing.T) {
	s, _ := newTestStore(t, 0)
	rate := algorithms.Limit{Events: 1 << 40, Window: hour}
	key := keyOf(1)
	var lease atomic.Uint64
	for round := range 20 {
		const n = 200
		multi := round%2 == 1
		var inFlight, peak, allowed, refused atomic.Int64
		var decided, ready sync.WaitGroup
		start := make(chan struct{})
		decided.Add(n)
		ready.Add(n)
		var done sync.WaitGroup
		for range n {
			done.Add(1)
			go func() {
				defer done.Done()
				reqs := []algorithms.Request{creq("c", key, conc5, lease.Add(1))}
				if multi {
					reqs = append(reqs, req("r", key, rate, 1))
				}
				out := make([]algorithms.Decision, len(reqs))
				ready.Done()
				<-start
				_ = s.Take(context.Background(), reqs, out)
				if !out[0].Allowed {
					refused.Add(1)
					decided.Done()
					return
				}
				allowed.Add(1)
				cur := inFlight.Add(1)
				for p := peak.Load(); cur > p && !peak.CompareAndSwap(p, cur); p = peak.Load() {
				}
				decided.Done()
				decided.Wait() // hold the slot until every request is decided
				inFlight.Add(-1)
				_ = s.Release(context.Background(), reqs)
			}()
		}
		ready.Wait()
		close(start)
		done.Wait()
		if allowed.Load() != 5 || refused.Load() != 195 || peak.Load() != 5 {
			t.Fatalf("round %d (multi-zone %v): %d allowed, %d refused, peak %d in flight; want exactly 5, 195 and 5",
				round, multi, allowed.Load(), refused.Load(), peak.Load())
		}
		if got := s.InUse("c", key); got != 0 {
			t.Fatalf("round %d: %d slots in use after every release, want 0", round, got)
		}
	}
}

// A request refused by a rate zone takes no slot; one refused by the
// concurrency zone spends no token.
func TestConcurrencyMemoryAllOrNothing(t *testing.T) {
	s, _ := newTestStore(t, 0)
	conc2 := algorithms.Limit{Algorithm: algorithms.Concurrency, Events: 2, Window: 60_000}
	rate3 := algorithms.Limit{Events: 3, Window: hour}
	key := keyOf(7)
	both := func(lease uint64) []algorithms.Request {
		return []algorithms.Request{req("rate", key, rate3, 1), creq("conc", key, conc2, lease)}
	}
	out := make([]algorithms.Decision, 2)
	take := func(lease uint64) []algorithms.Decision {
		if err := s.Take(context.Background(), both(lease), out); err != nil {
			t.Fatal(err)
		}
		return out
	}
	// Two in flight: the slots are full.
	for lease := uint64(1); lease <= 2; lease++ {
		if d := take(lease); !d[0].Allowed || !d[1].Allowed {
			t.Fatalf("request %d: %+v", lease, d)
		}
	}
	// The third is refused by the concurrency zone: no token spent.
	d := take(3)
	if d[1].Allowed || !d[0].Allowed || d[0].Remaining != 1 || d[1].RetryAfter != algorithms.ConcurrencyRetry {
		t.Fatalf("third: %+v, want refused by conc (RetryAfter %v), rate showing 1 left uncharged", d, algorithms.ConcurrencyRetry)
	}
	if r, _ := peek(s, "rate", key, rate3); r.Remaining != 1 {
		t.Fatalf("rate zone: %d left after a concurrency refusal, want 1", r.Remaining)
	}
	// Both end; one more takes the last token, and the next is refused by
	// the rate zone: it takes no slot.
	release(t, s, both(1)...)
	release(t, s, both(2)...)
	if d := take(4); !d[0].Allowed || !d[1].Allowed || d[0].Remaining != 0 || d[1].Remaining != 1 {
		t.Fatalf("fourth: %+v", d)
	}
	d = take(5)
	if d[0].Allowed || !d[1].Allowed || d[1].Remaining != 1 {
		t.Fatalf("fifth: %+v, want refused by rate, conc showing 1 free uncharged", d)
	}
	if got := s.InUse("conc", key); got != 1 {
		t.Fatalf("%d slots in use, want 1 (the fourth's): the rate refusal took one", got)
	}
	// Releasing a lease the store never granted (the fifth), or twice, frees
	// nothing.
	release(t, s, both(5)...)
	release(t, s, both(1)...)
	if got := s.InUse("conc", key); got != 1 {
		t.Fatalf("%d slots in use after releasing unknown leases, want 1", got)
	}
	release(t, s, both(4)...)
	if got := s.InUse("conc", key); got != 0 {
		t.Fatalf("%d slots in use, want 0", got)
	}
}

// A reset (the admin API) forgets a key's slots; the requests that held
// them release nothing afterwards, so they cannot free a slot taken after
// the reset.
func TestConcurrencyMemoryReset(t *testing.T) {
	s, _ := newTestStore(t, 0)
	one := algorithms.Limit{Algorithm: algorithms.Concurrency, Events: 1, Window: 60_000}
	key := keyOf(9)
	if d := take1(t, s, creq("c", key, one, 1)); !d.Allowed {
		t.Fatal("first refused")
	}
	if d, found := s.Peek("c", key, one); !found || d.Remaining != 0 {
		t.Fatalf("Peek: %+v found=%v, want a key with its slot in use", d, found)
	}
	if !s.Reset("c", key) {
		t.Fatal("Reset found nothing")
	}
	if d := take1(t, s, creq("c", key, one, 2)); !d.Allowed {
		t.Fatal("after the reset: refused")
	}
	release(t, s, creq("c", key, one, 1)) // the request of before the reset ends
	if d := take1(t, s, creq("c", key, one, 3)); d.Allowed {
		t.Fatal("the release of a lease from before the reset freed the slot taken after it")
	}
	release(t, s, creq("c", key, one, 2))
	if _, found := s.Peek("c", key, one); found {
		t.Fatal("Peek: found after every slot was given back")
	}
}

// A key with slots in use is never swept nor evicted, however full its
// shard; once its slots are back it is forgotten like any key back to full.
func TestConcurrencyMemoryNeverEvicted(t *testing.T) {
	s, clock := newTestStore(t, 4*numShards) // 4 keys per shard
	ks := sameShardKeys(s, "z", 40)
	one := algorithms.Limit{Algorithm: algorithms.Concurrency, Events: 1, Window: 60_000}
	if d := take1(t, s, creq("c", ks[0], one, 1)); !d.Allowed {
		t.Fatal("refused")
	}
	// Fill the shard with rate keys over and over, past the sweeps.
	long := algorithms.Limit{Events: 1, Window: hour}
	for i, k := range ks[1:] {
		take1(t, s, req("c", k, long, 1))
		clock.Advance(int64(i) * 500)
		s.Sweep()
	}
	if got := s.InUse("c", ks[0]); got != 1 {
		t.Fatalf("the key's slot was swept or evicted (%d in use)", got)
	}
	if d := take1(t, s, creq("c", ks[0], one, 2)); d.Allowed {
		t.Fatal("a second request got the key's only slot")
	}
	release(t, s, creq("c", ks[0], one, 1))
	s.Sweep()
	if held(s, "c", ks[0]) {
		t.Fatal("a key with no slot in use survived a sweep")
	}
}

// A config reload that keeps the store's settings keeps its slots: a
// request admitted under the old configuration (its Memory module) gives
// its slot back into the same count the new one decides against.
func TestConcurrencyMemoryAcrossReload(t *testing.T) {
	cfg := func() *Memory { return &Memory{MaxKeys: 5151, SweepInterval: caddy.Duration(3 * time.Second)} }
	old := provision(t, cfg())
	key := keyOf(3)
	two := algorithms.Limit{Algorithm: algorithms.Concurrency, Events: 2, Window: 60_000}
	out := make([]algorithms.Decision, 1)
	for lease := uint64(1); lease <= 2; lease++ {
		if err := old.Take(context.Background(), []algorithms.Request{creq("reload_c", key, two, lease)}, out); err != nil || !out[0].Allowed {
			t.Fatalf("old config, request %d: %+v %v", lease, out[0], err)
		}
	}
	// The reload: the new configuration's module, then the old one cleaned
	// up; the new one raises the limit to 3.
	cur := provision(t, cfg())
	if err := old.Cleanup(); err != nil {
		t.Fatal(err)
	}
	three := two
	three.Events = 3
	try := func(lease uint64) bool {
		if err := cur.Take(context.Background(), []algorithms.Request{creq("reload_c", key, three, lease)}, out); err != nil {
			t.Fatal(err)
		}
		return out[0].Allowed
	}
	if !try(3) || try(4) {
		t.Fatal("new config: want exactly one more slot (2 in flight from before the reload, limit 3)")
	}
	if err := old.Release(context.Background(), []algorithms.Request{creq("reload_c", key, two, 1)}); err != nil {
		t.Fatal(err)
	}
	if !try(5) || try(6) {
		t.Fatal("after a request of the old config ended: want exactly one more slot")
	}
	if got := cur.Store.InUse("reload_c", key); got != 3 {
		t.Fatalf("%d slots in use, want 3", got)
	}
	t.Cleanup(func() { _ = cur.Cleanup() })
}

func BenchmarkTakeReleaseConcurrency(b *testing.B) {
	s := New(Config{SweepInterval: -1})
	defer s.Close()
	l := algorithms.Limit{Algorithm: algorithms.Concurrency, Events: 1000, Window: 60_000}
	rate := algorithms.Limit{Events: 1 << 40, Window: hour}
	var leases atomic.Uint64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		out := make([]algorithms.Decision, 2)
		for pb.Next() {
			lease := leases.Add(1)
			reqs := []algorithms.Request{req("rb", keyOf(1), rate, 1), creq("cb", keyOf(1), l, lease)}
			_ = s.Take(context.Background(), reqs, out)
			_ = s.Release(context.Background(), reqs)
		}
	})
}
