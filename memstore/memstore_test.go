package memstore

import (
	"context"
	"encoding/binary"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/caddy-sluice/algorithms"
)

const (
	t0   = int64(1_780_000_000_000) // a realistic Unix ms
	hour = int64(3_600_000)
)

// fakeClock is a settable clock in Unix ms, safe to read from the sweeper.
type fakeClock struct{ ms atomic.Int64 }

func newClock() *fakeClock {
	c := new(fakeClock)
	c.ms.Store(t0)
	return c
}
func (c *fakeClock) Now() int64         { return c.ms.Load() }
func (c *fakeClock) Advance(d int64)    { c.ms.Add(d) }
func (c *fakeClock) Since0() (ms int64) { return c.ms.Load() - t0 }
func msDur(n int64) time.Duration       { return time.Duration(n) * time.Millisecond }
func keyOf(i int) (k algorithms.Key)    { binary.BigEndian.PutUint64(k[:], uint64(i)); return k }
func keyOf2(i, j int) (k algorithms.Key) {
	k = keyOf(i)
	binary.BigEndian.PutUint64(k[8:], uint64(j))
	return k
}

// newTestStore returns a store with no sweeper on a fake clock.
func newTestStore(t testing.TB, maxKeys int) (*Store, *fakeClock) {
	t.Helper()
	c := newClock()
	s := New(Config{MaxKeys: maxKeys, SweepInterval: -1, Now: c.Now})
	t.Cleanup(s.Close)
	return s, c
}

func req(zone string, key algorithms.Key, l algorithms.Limit, cost int64) algorithms.Request {
	return algorithms.Request{Zone: zone, Key: key, Limit: l, Cost: cost}
}

func take1(t testing.TB, s *Store, r algorithms.Request) algorithms.Decision {
	t.Helper()
	var out [1]algorithms.Decision
	if err := s.Take(context.Background(), []algorithms.Request{r}, out[:]); err != nil {
		t.Fatalf("Take: %v", err)
	}
	return out[0]
}

// peek reports a key's decision for a zero-cost request without storing
// anything, and whether the key is held.
func peek(s *Store, zone string, key algorithms.Key, l algorithms.Limit) (algorithms.Decision, bool) {
	id, known := s.zones.lookup(zone)
	k := mapKey{zone: id, key: key}
	sh := s.shardOf(&k)
	sh.mu.Lock()
	st, ok := sh.get(k)
	now := s.now()
	sh.mu.Unlock()
	ok = ok && known
	d, _, _ := algorithms.Step(st, !ok, l, now, 0)
	return d, ok
}

func held(s *Store, zone string, key algorithms.Key) bool {
	_, ok := peek(s, zone, key, algorithms.Limit{Events: 1, Window: 1})
	return ok
}

var (
	perHour20 = algorithms.Limit{Events: 20, Window: hour}
	perSec10  = algorithms.Limit{Events: 10, Window: 1000}
)

// 50 goroutines released together against one key of capacity 20 and a
// one-hour window get exactly 20 allowed; the allowed ones saw every
// remaining count from 19 down to 0 exactly once.
func TestConcurrentOneKeyExact(t *testing.T) {
	const rounds, workers, capacity = 200, 50, 20
	for round := range rounds {
		s, _ := newTestStore(t, 0)
		key := keyOf(round)
		var (
			ready, done sync.WaitGroup
			start       = make(chan struct{})
			allowed     atomic.Int64
			mu          sync.Mutex
			remaining   []int64
			badRefusals atomic.Int64
		)
		ready.Add(workers)
		done.Add(workers)
		for range workers {
			go func() {
				defer done.Done()
				reqs := []algorithms.Request{req("login", key, perHour20, 1)}
				out := make([]algorithms.Decision, 1)
				ready.Done()
				<-start
				if err := s.Take(context.Background(), reqs, out); err != nil {
					panic(err)
				}
				if out[0].Allowed {
					allowed.Add(1)
					mu.Lock()
					remaining = append(remaining, out[0].Remaining)
					mu.Unlock()
				} else if out[0].Remaining != 0 || out[0].RetryAfter != 3*time.Minute {
					badRefusals.Add(1)
				}
			}()
		}
		ready.Wait()
		close(start)
		done.Wait()
		if got := allowed.Load(); got != capacity {
			t.Fatalf("round %d: %d allowed, want exactly %d", round, got, capacity)
		}
		if n := badRefusals.Load(); n != 0 {
			t.Fatalf("round %d: %d refusals without Remaining 0 / RetryAfter 3m", round, n)
		}
		slices.Sort(remaining)
		for i, r := range remaining {
			if r != int64(i) {
				t.Fatalf("round %d: allowed requests saw remaining %v, want each of 0..19 once", round, remaining)
			}
		}
		if d, ok := peek(s, "login", key, perHour20); !ok || d.Remaining != 0 {
			t.Fatalf("round %d: key left with %+v (held %v)", round, d, ok)
		}
	}
}

// Three zones per request, all-or-nothing under contention: zone A (one
// shared key, capacity 20) is the bottleneck; zone B gives every goroutine
// its own key of capacity 1; zone C is one shared key of capacity 30. Exactly
// 20 requests pass; exactly the 20 winners' B keys are charged; C holds 10.
func TestConcurrentThreeZonesAllOrNothing(t *testing.T) {
	const rounds, workers = 200, 50
	limA := algorithms.Limit{Events: 20, Window: hour}
	limB := algorithms.Limit{Events: 1, Window: hour}
	limC := algorithms.Limit{Events: 30, Window: hour}
	for round := range rounds {
		s, _ := newTestStore(t, 0)
		shared := keyOf(round)
		var (
			ready, done sync.WaitGroup
			start       = make(chan struct{})
			winners     [workers]atomic.Bool
		)
		ready.Add(workers)
		done.Add(workers)
		for w := range workers {
			go func() {
				defer done.Done()
				reqs := []algorithms.Request{
					req("a", shared, limA, 1),
					req("b", keyOf2(round, w), limB, 1),
					req("c", shared, limC, 1),
				}
				// Vary the order of zones across goroutines: the lock order
				// must not depend on it.
				if w%2 == 1 {
					reqs[0], reqs[2] = reqs[2], reqs[0]
				}
				out := make([]algorithms.Decision, 3)
				ready.Done()
				<-start
				_ = s.Take(context.Background(), reqs, out)
				all := out[0].Allowed && out[1].Allowed && out[2].Allowed
				winners[w].Store(all)
			}()
		}
		ready.Wait()
		close(start)
		done.Wait()
		won := 0
		for w := range workers {
			d, _ := peek(s, "b", keyOf2(round, w), limB)
			if winners[w].Load() {
				won++
				if d.Remaining != 0 {
					t.Fatalf("round %d: winner %d's zone-b key not charged: %+v", round, w, d)
				}
			} else if d.Remaining != 1 {
				t.Fatalf("round %d: loser %d's zone-b key charged: %+v", round, w, d)
			}
		}
		if won != 20 {
			t.Fatalf("round %d: %d requests passed, want exactly 20", round, won)
		}
		if d, _ := peek(s, "a", shared, limA); d.Remaining != 0 {
			t.Fatalf("round %d: zone a remaining %d, want 0", round, d.Remaining)
		}
		if d, _ := peek(s, "c", shared, limC); d.Remaining != 10 {
			t.Fatalf("round %d: zone c remaining %d, want exactly 10", round, d.Remaining)
		}
	}
}

func TestRefillWithInjectedClock(t *testing.T) {
	for _, l := range []algorithms.Limit{
		perSec10,
		{Events: 7, Window: 1000},
		{Events: 20, Window: 1000, Burst: 3},
		{Events: 3, Window: 7, Burst: 11},
		perHour20,
	} {
		for _, cost := range []int64{1, 2} {
			t.Run(fmt.Sprintf("%d_per_%dms_burst%d_cost%d", l.Events, l.Window, l.Burst, cost), func(t *testing.T) {
				s, clock := newTestStore(t, 0)
				k := keyOf(1)
				n := 0
				var d algorithms.Decision
				for d = take1(t, s, req("z", k, l, cost)); d.Allowed; d = take1(t, s, req("z", k, l, cost)) {
					n++
				}
				if want := int(l.Capacity() / cost); n != want {
					t.Fatalf("admitted %d, want %d", n, want)
				}
				ra := d.RetryAfter.Milliseconds()
				if ra <= 0 || d.RetryAfter != msDur(ra) {
					t.Fatalf("RetryAfter %v", d.RetryAfter)
				}
				clock.Advance(ra - 1)
				if d2 := take1(t, s, req("z", k, l, cost)); d2.Allowed || d2.RetryAfter != time.Millisecond {
					t.Fatalf("1ms before Retry-After: %+v, want refused with RetryAfter 1ms", d2)
				}
				clock.Advance(1)
				if d2 := take1(t, s, req("z", k, l, cost)); !d2.Allowed {
					t.Fatalf("at Retry-After (%dms): refused: %+v", ra, d2)
				}
				// And right after, refused again (only one request's worth refilled
				// when cost divides the capacity).
				if l.Capacity()%cost == 0 {
					if d2 := take1(t, s, req("z", k, l, cost)); d2.Allowed {
						t.Fatalf("second request at Retry-After passed: %+v", d2)
					}
				}
			})
		}
	}
}

// When zone B refuses, zone A is not charged, and A's decision shows A's
// uncharged state.
func TestAllOrNothingVeto(t *testing.T) {
	s, clock := newTestStore(t, 0)
	ka, kb := keyOf(1), keyOf(2)
	limB := algorithms.Limit{Events: 1, Window: hour}
	reqs := []algorithms.Request{req("a", ka, perSec10, 1), req("b", kb, limB, 1)}
	out := make([]algorithms.Decision, 2)

	if err := s.Take(context.Background(), reqs, out); err != nil {
		t.Fatal(err)
	}
	if !out[0].Allowed || !out[1].Allowed || out[0].Remaining != 9 || out[1].Remaining != 0 {
		t.Fatalf("first take: %+v", out)
	}
	for i := range 5 {
		clock.Advance(10) // 0.1 token of A refills each time
		_ = s.Take(context.Background(), reqs, out)
		if out[1].Allowed || out[1].RetryAfter <= 0 {
			t.Fatalf("veto %d: zone b %+v, want refused", i, out[1])
		}
		// A would have allowed; it shows its uncharged state: 9 tokens and a
		// growing fraction, so Remaining 9 and a reset that shrinks by 10ms.
		wantReset := msDur(100 - 10*int64(i+1))
		if out[0].Remaining != 9 || out[0].ResetAfter != wantReset || out[0].Limit != 10 || out[0].RetryAfter != 0 {
			t.Fatalf("veto %d: zone a decision %+v, want remaining 9 reset %v", i, out[0], wantReset)
		}
	}
	// A later peek and a later charge of A alone see A untouched by the vetoes.
	if d, _ := peek(s, "a", ka, perSec10); d.Remaining != 9 || d.ResetAfter != 50*time.Millisecond {
		t.Fatalf("peek a: %+v", d)
	}
	if d := take1(t, s, req("a", ka, perSec10, 1)); !d.Allowed || d.Remaining != 8 || d.ResetAfter != 150*time.Millisecond {
		t.Fatalf("take a after vetoes: %+v, want remaining 8 reset 150ms", d)
	}

	// The vetoing zone first, and a zone A key never seen: A is reported
	// fresh and not stored at all.
	fresh := keyOf(3)
	reqs = []algorithms.Request{req("b", kb, limB, 1), req("a", fresh, perSec10, 3)}
	before := s.Len()
	_ = s.Take(context.Background(), reqs, out)
	if out[0].Allowed || out[1].Remaining != 10 || out[1].ResetAfter != 0 {
		t.Fatalf("veto of a fresh key: %+v", out)
	}
	if held(s, "a", fresh) || s.Len() != before {
		t.Fatalf("a vetoed fresh key was stored (len %d -> %d)", before, s.Len())
	}

	// Both refuse: neither charged.
	limTiny := algorithms.Limit{Events: 1, Window: hour}
	kc := keyOf(4)
	take1(t, s, req("c", kc, limTiny, 1))
	reqs = []algorithms.Request{req("b", kb, limB, 1), req("c", kc, limTiny, 1)}
	_ = s.Take(context.Background(), reqs, out)
	if out[0].Allowed || out[1].Allowed {
		t.Fatalf("both exhausted: %+v", out)
	}

	// Many zones (more than the store's on-stack buffers): one veto charges none.
	var many []algorithms.Request
	for i := range 12 {
		many = append(many, req(fmt.Sprintf("m%d", i), keyOf(100+i), perSec10, 1))
	}
	many = append(many, req("b", kb, limB, 1))
	manyOut := make([]algorithms.Decision, len(many))
	_ = s.Take(context.Background(), many, manyOut)
	for i := range 12 {
		if held(s, fmt.Sprintf("m%d", i), keyOf(100+i)) || manyOut[i].Remaining != 10 {
			t.Fatalf("zone m%d charged despite the veto: %+v", i, manyOut[i])
		}
	}
	// ... and without the veto all are charged.
	many = many[:12]
	_ = s.Take(context.Background(), many, manyOut)
	for i := range 12 {
		if !manyOut[i].Allowed || manyOut[i].Remaining != 9 {
			t.Fatalf("zone m%d: %+v", i, manyOut[i])
		}
		if d, ok := peek(s, fmt.Sprintf("m%d", i), keyOf(100+i), perSec10); !ok || d.Remaining != 9 {
			t.Fatalf("zone m%d not charged: %+v", i, d)
		}
	}
}

// A refused request stores nothing and consumes nothing.
func TestRefusalStoresNothing(t *testing.T) {
	s, _ := newTestStore(t, 0)
	d := take1(t, s, req("z", keyOf(1), perSec10, 11))
	if d.Allowed || d.RetryAfter != time.Second || d.Remaining != 10 {
		t.Fatalf("cost > capacity: %+v", d)
	}
	if s.Len() != 0 {
		t.Fatalf("a refused fresh key was stored: len %d", s.Len())
	}
	take1(t, s, req("z", keyOf(1), perSec10, 4))
	for range 3 {
		if d := take1(t, s, req("z", keyOf(1), perSec10, 7)); d.Allowed || d.Remaining != 6 {
			t.Fatalf("refusal: %+v", d)
		}
	}
	if d := take1(t, s, req("z", keyOf(1), perSec10, 6)); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("after refusals: %+v, want the 6 left intact", d)
	}
}

// Zones are separate: the same key in two zones is two states.
func TestZonesAreSeparate(t *testing.T) {
	s, _ := newTestStore(t, 0)
	k := keyOf(1)
	take1(t, s, req("a", k, perSec10, 10))
	if d := take1(t, s, req("b", k, perSec10, 1)); !d.Allowed || d.Remaining != 9 {
		t.Fatalf("zone b saw zone a's spend: %+v", d)
	}
	if d := take1(t, s, req("a", k, perSec10, 1)); d.Allowed {
		t.Fatalf("zone a not exhausted: %+v", d)
	}
	got := map[string]int{}
	s.Keys(func(zone string, key algorithms.Key) {
		if key != k {
			t.Errorf("unexpected key %x", key)
		}
		got[zone]++
	})
	if len(got) != 2 || got["a"] != 1 || got["b"] != 1 || s.Len() != 2 {
		t.Fatalf("Keys: %v, Len %d", got, s.Len())
	}
}

// The bound the code keeps: each of the numShards shards holds at most
// ⌈MaxKeys/numShards⌉ keys, so Len() ≤ numShards×⌈MaxKeys/numShards⌉, which
// is at most MaxKeys + numShards - 1 (and exactly MaxKeys when it divides).
func TestMaxKeysBound(t *testing.T) {
	for _, tc := range []struct{ maxKeys, n int }{
		{1000, 100_000},
		{64_000, 200_000},
		{10, 10_000},
		{1, 1000},
	} {
		t.Run(fmt.Sprint(tc.maxKeys), func(t *testing.T) {
			s, clock := newTestStore(t, tc.maxKeys)
			perShard := (tc.maxKeys + numShards - 1) / numShards
			bound := numShards * perShard
			if bound > tc.maxKeys+numShards-1 {
				t.Fatalf("bound arithmetic: %d", bound)
			}
			for i := range tc.n {
				if i%1000 == 0 {
					clock.Advance(1) // keys stay far from full (1h window)
				}
				d := take1(t, s, req("z", keyOf(i), perHour20, 1))
				if !d.Allowed {
					t.Fatalf("key %d refused", i)
				}
				if i%997 == 0 && s.Len() > bound {
					t.Fatalf("after %d keys Len %d > %d", i+1, s.Len(), bound)
				}
			}
			for i := range s.shards {
				if n := len(s.shards[i].m); n > perShard {
					t.Fatalf("shard %d holds %d > %d", i, n, perShard)
				}
			}
			// With far more keys than room, every shard is full: the bound is
			// reached exactly.
			if got := s.Len(); got != bound {
				t.Fatalf("Len %d, want exactly %d (MaxKeys %d)", got, bound, tc.maxKeys)
			}
			n := 0
			s.Keys(func(string, algorithms.Key) { n++ })
			if n != bound {
				t.Fatalf("Keys visited %d, want %d", n, bound)
			}
			// The most recent key is always kept (it displaced another).
			if !held(s, "z", keyOf(tc.n-1)) {
				t.Fatalf("the newest key was not stored")
			}
		})
	}
	// Rotation through the multi-zone path is bounded too.
	s, _ := newTestStore(t, 1000)
	out := make([]algorithms.Decision, 3)
	for i := range 30_000 {
		reqs := []algorithms.Request{
			req("a", keyOf(i), perHour20, 1),
			req("b", keyOf(i), perHour20, 1),
			req("c", keyOf(i), perHour20, 1),
		}
		_ = s.Take(context.Background(), reqs, out)
	}
	if got := s.Len(); got != 1024 {
		t.Fatalf("multi-zone rotation: Len %d, want exactly 1024", got)
	}
}

// sameShardKeys returns n keys of zone that all land in one shard.
func sameShardKeys(s *Store, zone string, n int) []algorithms.Key {
	byShard := map[*shard][]algorithms.Key{}
	for i := 0; ; i++ {
		k := mapKey{zone: s.zones.id(zone), key: keyOf(i)}
		sh := s.shardOf(&k)
		byShard[sh] = append(byShard[sh], k.key)
		if len(byShard[sh]) == n {
			return byShard[sh]
		}
	}
}

func TestEvictionPrefersKeysBackToFull(t *testing.T) {
	s, clock := newTestStore(t, 4*numShards) // 4 keys per shard
	ks := sameShardKeys(s, "z", 6)
	short := perSec10                                 // 1 token back in 100ms
	long := algorithms.Limit{Events: 1, Window: hour} // 1 token back in 1h
	take1(t, s, req("z", ks[0], long, 1))
	take1(t, s, req("z", ks[1], long, 1))
	take1(t, s, req("z", ks[2], short, 1)) // back to full at +100ms
	take1(t, s, req("z", ks[3], long, 1))
	clock.Advance(100)
	// Updating a held key never evicts.
	take1(t, s, req("z", ks[0], long, 0))
	for _, k := range ks[:4] {
		if !held(s, "z", k) {
			t.Fatalf("key %x evicted by an update", k)
		}
	}
	// A new key displaces the one key already back to full, and only it.
	take1(t, s, req("z", ks[4], long, 1))
	for i, want := range []bool{true, true, false, true, true} {
		if held(s, "z", ks[i]) != want {
			t.Fatalf("after insert: key %d held=%v, want %v", i, !want, want)
		}
	}
	// No key back to full: the one closest to full goes (the sample of 8
	// covers the whole shard of 4).
	s2, clock2 := newTestStore(t, 4*numShards)
	ks2 := sameShardKeys(s2, "z", 5)
	slow := algorithms.Limit{Events: 10, Window: 10_000} // 1 token per second
	for i, cost := range []int64{3, 1, 4, 2} {
		take1(t, s2, req("z", ks2[i], slow, cost)) // full again after cost seconds
	}
	clock2.Advance(500)
	take1(t, s2, req("z", ks2[4], slow, 1))
	for i, want := range []bool{true, false, true, true, true} {
		if held(s2, "z", ks2[i]) != want {
			t.Fatalf("closest-to-full eviction: key %d held=%v, want %v", i, !want, want)
		}
	}
}

// The documented eviction rule (docs/reference.md, and evict's comment): "a new
// key first displaces a key already back to full (which loses nothing);
// failing that, of a small sample of keys, the one closest to full". In a
// shard holding more keys than the eviction sample (8), the one key back to
// full must still be the one displaced, wherever map iteration finds it.
// Repeated because map order is random.
func TestEvictionPrefersFullKeyBeyondSample(t *testing.T) {
	short := perSec10
	long := algorithms.Limit{Events: 1, Window: hour}
	for round := range 20 {
		s3, clock3 := newTestStore(t, 40*numShards) // 40 keys per shard
		ks3 := sameShardKeys(s3, "z", 41)
		fullIdx := (round * 7) % 40
		for i, k := range ks3[:40] {
			l := long
			if i == fullIdx {
				l = short
			}
			take1(t, s3, req("z", k, l, 1))
		}
		clock3.Advance(100)
		take1(t, s3, req("z", ks3[40], long, 1))
		var evicted []int
		for i, k := range ks3 {
			if !held(s3, "z", k) {
				evicted = append(evicted, i)
			}
		}
		if len(evicted) != 1 || evicted[0] != fullIdx {
			t.Fatalf("round %d, shard of 40 keys: evicted key(s) %v, want only key %d (the one back to full; the others are full only in an hour)",
				round, evicted, fullIdx)
		}
	}
}

func TestSweep(t *testing.T) {
	s, clock := newTestStore(t, 0)
	short := perSec10                                 // full 100ms per token spent
	long := algorithms.Limit{Events: 1, Window: hour} // full 1h after a spend
	take1(t, s, req("z", keyOf(1), short, 1))         // full at +100
	take1(t, s, req("z", keyOf(2), short, 5))         // full at +500
	take1(t, s, req("z", keyOf(3), long, 1))          // full at +1h
	take1(t, s, req("y", keyOf(1), short, 10))        // full at +1000
	take1(t, s, req("z", keyOf(4), short, 0))         // already full
	if s.Len() != 5 {
		t.Fatalf("Len %d, want 5", s.Len())
	}
	check := func(want ...bool) {
		t.Helper()
		got := []bool{held(s, "z", keyOf(1)), held(s, "z", keyOf(2)), held(s, "z", keyOf(3)), held(s, "y", keyOf(1)), held(s, "z", keyOf(4))}
		if !slices.Equal(got, want) {
			t.Fatalf("at +%dms held %v, want %v", clock.Since0(), got, want)
		}
	}
	s.Sweep()
	check(true, true, true, true, false)
	clock.Advance(99)
	s.Sweep()
	check(true, true, true, true, false)
	clock.Advance(1) // exactly full: dropped
	s.Sweep()
	check(false, true, true, true, false)
	clock.Advance(900)
	s.Sweep()
	check(false, false, true, false, false)
	if s.Len() != 1 {
		t.Fatalf("Len %d, want 1", s.Len())
	}
	// A swept key comes back full: nothing was lost by forgetting it.
	if d := take1(t, s, req("y", keyOf(1), short, 1)); d.Remaining != 9 {
		t.Fatalf("swept key: %+v", d)
	}
	clock.Advance(hour)
	s.Sweep()
	if s.Len() != 0 {
		t.Fatalf("Len %d after everything is full, want 0", s.Len())
	}
}

// sweepers counts the goroutines running a Store's sweeper, by their stacks.
func sweepers() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Count(string(buf[:n]), "memstore.(*Store).sweeper(")
		}
		buf = make([]byte, 2*len(buf))
	}
}

// waitFor polls cond for up to within, letting other goroutines run.
func waitFor(within time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		runtime.Gosched()
		time.Sleep(2 * time.Millisecond)
	}
	return true
}

func TestSweeperStopsOnClose(t *testing.T) {
	if !waitFor(2*time.Second, func() bool { return sweepers() == 0 }) {
		t.Fatalf("%d sweepers running before the test", sweepers())
	}
	// Counted by the sweeper's own stack frames: NumGoroutine also moves with
	// goroutines of earlier tests still winding down.
	clock := newClock()
	s := New(Config{SweepInterval: time.Millisecond, Now: clock.Now})
	if !waitFor(2*time.Second, func() bool { return sweepers() == 1 }) {
		t.Fatalf("%d sweepers after New, want 1", sweepers())
	}
	// The sweeper really sweeps.
	take1(t, s, req("z", keyOf(1), perSec10, 1))
	if s.Len() != 1 {
		t.Fatalf("Len %d", s.Len())
	}
	clock.Advance(100)
	if !waitFor(5*time.Second, func() bool { return s.Len() == 0 }) {
		t.Fatalf("the sweeper did not drop a key back to full")
	}
	s.Close()
	if !waitFor(2*time.Second, func() bool { return sweepers() == 0 }) {
		t.Fatalf("%d sweepers after Close, want 0", sweepers())
	}
	s.Close() // idempotent
	if err := s.Destruct(); err != nil {
		t.Fatal(err)
	}
	// The store still answers after Close.
	if d := take1(t, s, req("z", keyOf(1), perSec10, 1)); !d.Allowed {
		t.Fatalf("Take after Close: %+v", d)
	}
	// A disabled sweeper starts no goroutine, and Close returns at once.
	s2 := New(Config{SweepInterval: -1})
	time.Sleep(20 * time.Millisecond)
	if n := sweepers(); n != 0 {
		t.Fatalf("%d sweepers with the sweeper disabled, want 0", n)
	}
	s2.Close()
	// Many stores, many sweepers, all stopped by Close.
	var many []*Store
	for range 10 {
		many = append(many, New(Config{SweepInterval: time.Hour}))
	}
	if !waitFor(2*time.Second, func() bool { return sweepers() == 10 }) {
		t.Fatalf("%d sweepers for 10 stores", sweepers())
	}
	for _, s := range many {
		s.Close()
	}
	if !waitFor(2*time.Second, func() bool { return sweepers() == 0 }) {
		t.Fatalf("%d sweepers after closing all", sweepers())
	}
}

func TestDefaults(t *testing.T) {
	s := New(Config{SweepInterval: -1})
	defer s.Close()
	if s.perShard != (DefaultMaxKeys+numShards-1)/numShards {
		t.Fatalf("perShard %d", s.perShard)
	}
	// The default clock is the system clock.
	before := time.Now().UnixMilli()
	now := s.now()
	if now < before || now > time.Now().UnixMilli() {
		t.Fatalf("default clock %d", now)
	}
	if err := s.Take(context.Background(), nil, nil); err != nil {
		t.Fatalf("empty Take: %v", err)
	}
}

func TestSortedUnique(t *testing.T) {
	for _, tc := range []struct{ in, want []uint8 }{
		{nil, nil},
		{[]uint8{5}, []uint8{5}},
		{[]uint8{3, 1, 2}, []uint8{1, 2, 3}},
		{[]uint8{7, 7, 7}, []uint8{7}},
		{[]uint8{63, 0, 63, 5, 0, 5, 1}, []uint8{0, 1, 5, 63}},
	} {
		got := sortedUnique(slices.Clone(tc.in))
		if !slices.Equal(got, tc.want) && !(len(got) == 0 && len(tc.want) == 0) {
			t.Errorf("sortedUnique(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

func TestTakeOneDoesNotAllocate(t *testing.T) {
	s, clock := newTestStore(t, 0)
	reqs := []algorithms.Request{req("z", keyOf(1), algorithms.Limit{Events: 1_000_000, Window: 1000}, 1)}
	out := make([]algorithms.Decision, 1)
	_ = s.Take(context.Background(), reqs, out) // the key exists from here on
	allocs := testing.AllocsPerRun(1000, func() {
		clock.Advance(1)
		_ = s.Take(context.Background(), reqs, out)
	})
	if allocs != 0 {
		t.Fatalf("Take of one request allocates %v times, want 0", allocs)
	}
	if !out[0].Allowed {
		t.Fatalf("%+v", out[0])
	}
}

func TestTakeThreeZonesDoesNotAllocate(t *testing.T) {
	s, clock := newTestStore(t, 0)
	l := algorithms.Limit{Events: 1_000_000, Window: 1000}
	reqs := []algorithms.Request{req("a", keyOf(1), l, 1), req("b", keyOf(1), l, 1), req("c", keyOf(2), l, 1)}
	out := make([]algorithms.Decision, 3)
	_ = s.Take(context.Background(), reqs, out)
	allocs := testing.AllocsPerRun(1000, func() {
		clock.Advance(1)
		_ = s.Take(context.Background(), reqs, out)
	})
	if allocs != 0 {
		t.Fatalf("Take of three zones allocates %v times, want 0", allocs)
	}
}

const benchKeys = 1 << 16

func BenchmarkTakeOne(b *testing.B) {
	b.ReportAllocs()
	s := New(Config{SweepInterval: -1})
	defer s.Close()
	l := algorithms.Limit{Events: 100, Window: 1000}
	keys := make([]algorithms.Key, benchKeys)
	for i := range keys {
		keys[i] = keyOf(i * 7919)
	}
	var seq atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		i := int(seq.Add(1)) * 104729
		reqs := []algorithms.Request{req("api", keys[0], l, 1)}
		out := make([]algorithms.Decision, 1)
		for pb.Next() {
			i++
			reqs[0].Key = keys[i%benchKeys]
			_ = s.Take(context.Background(), reqs, out)
		}
	})
}

func BenchmarkTakeThreeZones(b *testing.B) {
	b.ReportAllocs()
	s := New(Config{SweepInterval: -1})
	defer s.Close()
	l := algorithms.Limit{Events: 100, Window: 1000}
	keys := make([]algorithms.Key, benchKeys)
	for i := range keys {
		keys[i] = keyOf(i * 7919)
	}
	var seq atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		i := int(seq.Add(1)) * 104729
		reqs := []algorithms.Request{req("login", keys[0], l, 1), req("api", keys[0], l, 1), req("tenant", keys[0], l, 1)}
		out := make([]algorithms.Decision, 3)
		for pb.Next() {
			i++
			k := keys[i%benchKeys]
			reqs[0].Key, reqs[1].Key, reqs[2].Key = k, k, keys[(i/16)%benchKeys]
			_ = s.Take(context.Background(), reqs, out)
		}
	})
}

// Committing a multi-zone request never displaces another zone of the same
// request, even when their keys share a full shard.
func TestCommitKeepsOwnZones(t *testing.T) {
	s, _ := newTestStore(t, numShards) // one key per shard
	var a, b mapKey
	for i := 0; ; i++ {
		a = mapKey{zone: s.zones.id("a"), key: keyOf(i)}
		b = mapKey{zone: s.zones.id("b"), key: keyOf(i)}
		if s.shardOf(&a) == s.shardOf(&b) {
			break
		}
	}
	out := make([]algorithms.Decision, 2)
	reqs := []algorithms.Request{req("a", a.key, perHour20, 1), req("b", b.key, perHour20, 1)}
	if err := s.Take(context.Background(), reqs, out); err != nil || !out[0].Allowed || !out[1].Allowed {
		t.Fatalf("Take: %v %+v", err, out)
	}
	if !held(s, "a", a.key) || !held(s, "b", b.key) {
		t.Fatalf("a request's own zones were displaced: a held=%v b held=%v", held(s, "a", a.key), held(s, "b", b.key))
	}
	// A second request still charges both.
	if err := s.Take(context.Background(), reqs, out); err != nil || out[0].Remaining != 18 || out[1].Remaining != 18 {
		t.Fatalf("second Take: %v %+v", err, out)
	}
}
