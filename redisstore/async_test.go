package redisstore

import (
	"context"
	"math/rand/v2"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// syncStore is a store with zone in the asynchronous mode (limit l); the
// loop's own interval is an hour, so a test syncs when it says (syncNow).
func syncStore(t *testing.T, url, zone string, l algorithms.Limit, maxKeys int) *Store {
	t.Helper()
	s := newTestStore(t, url, "", testTimeout, 0)
	release, err := s.SyncZone(zone, l, time.Hour, maxKeys)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(release)
	return s
}

func syncLimit(t *testing.T, alg algorithms.Algorithm, n int64, w time.Duration) algorithms.Limit {
	t.Helper()
	l, err := algorithms.NewLimit(alg, n, w, 0)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func testKey(i int) algorithms.Key {
	return algorithms.Key{1, byte(algorithms.KeyHash), byte(i >> 8), byte(i)}
}

// takeOne decides one request of zone for key k on s.
func takeOne(t *testing.T, s *Store, zone string, k algorithms.Key, l algorithms.Limit) algorithms.Decision {
	t.Helper()
	out := make([]algorithms.Decision, 1)
	if err := s.Take(context.Background(), []algorithms.Request{{Zone: zone, Key: k, Limit: l, Cost: 1}}, out); err != nil {
		t.Fatal(err)
	}
	return out[0]
}

// redisCount is what Redis holds for the key at this instant, each count
// capped at the limit as a decision reads it: the window's count
// (fixed_window) or the current plus the previous window's (sliding).
func redisCount(t *testing.T, srv *redistest.Server, s *Store, zone string, k algorithms.Key, l algorithms.Limit) int64 {
	t.Helper()
	ctx := context.Background()
	start := algorithms.WindowStart(time.Now().UnixMilli(), l.Window)
	count := func(start int64) int64 {
		v, err := srv.Client().Get(ctx, countKey(s.Key(zone, k), start)).Int64()
		if err == redis.Nil {
			return 0
		}
		if err != nil {
			t.Fatal(err)
		}
		return min(v, l.Events)
	}
	n := count(start)
	if l.Algorithm == algorithms.SlidingWindow {
		n += count(start - l.Window)
	}
	return n
}

// TestSyncExchangeCounts: a sync keeps one count per key and window in
// Redis, against a model of them in Go, on random sequences against a real
// Redis: a charge counts in its own window while that window still counts,
// the reply is the counts of the sync's windows (the previous one read
// unless the entry holds it final), and each count lives for as long as it
// can decide: its TTL set by the instance's first charge to it, and again
// after a count it believed made turned out gone.
func TestSyncExchangeCounts(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	ctx := testCtx(t)
	s := newTestStore(t, srv.URL(), "", testTimeout, 0)
	rng := rand.New(rand.NewPCG(twinSeed, 38))
	counted, lost, bare := 0, 0, 0
	for _, alg := range []algorithms.Algorithm{algorithms.FixedWindow, algorithms.SlidingWindow} {
		for round := range 60 {
			w := []int64{1000, 60000, 7}[round%3]
			l := algorithms.Limit{Algorithm: alg, Events: 1 + rng.Int64N(50), Window: w}
			zone := "twin-" + alg.String() + "-" + strconv.Itoa(round)
			release, err := s.SyncZone(zone, l, time.Hour, 10)
			if err != nil {
				t.Fatal(err)
			}
			y := s.async.Load()
			id := (*y.zones.Load())[zone].id
			keys := []algorithms.Key{testKey(1), testKey(2)}
			model := [2]map[int64]int64{{}, {}}
			var made [2]int64 // the window whose count the instance gave its TTL
			now := time.Now().UnixMilli()
			for range 20 {
				now += rng.Int64N(w)
				ws := algorithms.WindowStart(now, w)
				items := make([]syncItem, len(keys))
				for i := range items {
					items[i] = syncItem{k: syncKey{zone: id, key: keys[i]}, limit: l, l: ws,
						sent: [2]algorithms.WindowCharge{
							{Start: ws - w*rng.Int64N(3), Units: rng.Int64N(4)},
							{Start: ws + w*(rng.Int64N(2)-1), Units: rng.Int64N(4)},
						},
						known: rng.IntN(2) == 0, made: made[i] == ws}
					if rng.IntN(8) == 0 && made[i] == ws {
						// Gone from Redis (a reset, a restart without persistence).
						c.Del(ctx, countKey(s.Key(zone, keys[i]), ws))
						delete(model[i], ws)
					}
					if _, ok := model[i][ws-w]; ok && rng.IntN(8) == 0 {
						// A count left without its TTL by a sync that failed
						// to set it (the entry's bare).
						c.Persist(ctx, countKey(s.Key(zone, keys[i]), ws-w))
						items[i].bare = ws - w
						bare++
					}
				}
				if err := y.exchange(items, now); err != nil {
					t.Fatal(err)
				}
				from := ws
				if alg == algorithms.SlidingWindow {
					from = ws - w
				}
				for i, it := range items {
					_, existed := model[i][ws]
					charged := [2]bool{}
					for _, ch := range it.sent {
						if ch.Units > 0 && ch.Start >= from && ch.Start <= ws {
							model[i][ch.Start] += ch.Units
							charged[(ws-ch.Start)/w] = true
							counted++
						}
					}
					wantPrev := int64(-1)
					if alg == algorithms.SlidingWindow && (!it.known || charged[1]) {
						wantPrev = model[i][ws-w]
					}
					if it.err != nil || it.cur != model[i][ws] || it.prev != wantPrev {
						t.Fatalf("%s %+v at %d, key %d, charges %+v, known %v: reply cur %d prev %d (%v), want %d and %d",
							alg, l, now, i, it.sent, it.known, it.cur, it.prev, it.err, model[i][ws], wantPrev)
					}
					// A count believed made but gone is made again by the
					// INCRBY, and given its TTL at once.
					wantLost := it.made && charged[0] && !existed
					if it.lost || it.created != (!it.made || wantLost) {
						t.Fatalf("%s: made %v, charged %v, existed %v: lost %v created %v", alg, it.made, charged[0], existed, it.lost, it.created)
					}
					if wantLost {
						lost++
					}
					if it.created {
						made[i] = ws
					}
					checkCounts(t, c, s.Key(zone, keys[i]), model[i], l, now)
				}
			}
			release()
		}
	}
	if counted < 500 || lost < 5 || bare < 5 {
		t.Fatalf("only %d charges counted, %d counts lost, %d bare: the sequences test too little", counted, lost, bare)
	}
}

// checkCounts: every count of name in Redis is model's, with its TTL; the
// counts expired (they could decide no more) leave model.
func checkCounts(t *testing.T, c *redis.Client, name string, model map[int64]int64, l algorithms.Limit, now int64) {
	t.Helper()
	ctx := context.Background()
	keep := keepFor(l)
	// A count may be gone up to slack ms before its end by this clock,
	// which runs ahead of Redis's (a TTL is set at an earlier step), and
	// a TTL that short may end between two commands of the check.
	const slack = 5000
	for start, n := range model {
		ck := countKey(name, start)
		got, err := c.Get(ctx, ck).Int64()
		if err == redis.Nil && start+keep-now < slack {
			delete(model, start)
			continue
		}
		if err != nil || got != n {
			t.Fatalf("%s: %s holds %d (%v), want %d", l.Algorithm, ck, got, err, n)
		}
		ttl, err := c.PTTL(ctx, ck).Result()
		switch {
		case err != nil:
			t.Fatal(err)
		case ttl == -2 && start+keep-now < slack:
			delete(model, start) // expired meanwhile
		case ttl < 0 || ttl.Milliseconds() > keep || ttl.Milliseconds() < start+keep-now-slack:
			t.Fatalf("%s: %s has a TTL of %v, want at least %d ms, at most %d", l.Algorithm, ck, ttl, start+keep-now, keep)
		}
	}
}

// TestSyncOneInstanceExact: a key only one instance uses admits exactly
// its limit, concurrently, without a Redis call on the request path; the
// sync brings Redis's count to what was admitted.
func TestSyncOneInstanceExact(t *testing.T) {
	srv := redistest.Start(t)
	for _, alg := range []algorithms.Algorithm{algorithms.FixedWindow, algorithms.SlidingWindow} {
		t.Run(alg.String(), func(t *testing.T) {
			const n, c, per = 40, 8, 25
			l := syncLimit(t, alg, n, time.Hour)
			zone := "exact-" + alg.String()
			s := syncStore(t, srv.URL(), zone, l, 1000)
			calls := srv.CommandCount(t, "evalsha") + srv.CommandCount(t, "fcall")
			var admitted atomic.Int64
			var wg sync.WaitGroup
			for g := range c {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range per {
						if takeOne(t, s, zone, testKey(1), l).Allowed {
							admitted.Add(1)
						}
						if g == 0 && i%5 == 0 {
							s.async.Load().syncNow() // syncs interleaved with the decisions
						}
					}
				}()
			}
			wg.Wait()
			if got := admitted.Load(); got != n {
				t.Fatalf("admitted %d of %d requests, want exactly %d", got, c*per, n)
			}
			s.async.Load().syncNow()
			if got := redisCount(t, srv, s, zone, testKey(1), l); got != n {
				t.Fatalf("Redis counts %d, want %d", got, n)
			}
			// The calls: the syncs only (5 interleaved + 1, one sent again
			// after loading the script), none per request.
			if got := srv.CommandCount(t, "evalsha") + srv.CommandCount(t, "fcall") - calls; got > 7 {
				t.Fatalf("%d script calls for %d requests and 6 syncs: the request path called Redis", got, c*per)
			}
			if takeOne(t, s, zone, testKey(1), l).Allowed {
				t.Fatal("allowed past the limit after the sync")
			}
		})
	}
}

// TestSyncThreeInstancesBound: three stores (three instances) on one
// Redis. Once every instance has read a key's count G, the key admits at
// most N + (I-1)(N-G) in its window (docs/redis.md), here 30 + 2x10: the
// instances hit it concurrently, 20 requests each. Without the sync each
// would admit up to its own 30.
func TestSyncThreeInstancesBound(t *testing.T) {
	srv := redistest.Start(t)
	const n, instances = 30, 3
	l := syncLimit(t, algorithms.FixedWindow, n, time.Hour)
	zone := "fleet"
	var fleet [instances]*Store
	for i := range fleet {
		fleet[i] = syncStore(t, srv.URL(), zone, l, 1000)
	}
	k := testKey(7)
	// Phase 1: instance 0 alone admits 20 (G = 20), then every instance
	// reads it.
	for range 20 {
		if !takeOne(t, fleet[0], zone, k, l).Allowed {
			t.Fatal("refused within the limit on one instance")
		}
	}
	fleet[0].async.Load().syncNow()
	for _, s := range fleet[1:] {
		takeOne(t, s, zone, testKey(99), l) // a request so that the key below is read: none for k
		s.async.Load().syncNow()
	}
	// Each other instance reads k's count with its first request's sync:
	// one request of k each, then a sync, before the burst.
	var admitted atomic.Int64
	admitted.Store(20)
	for _, s := range fleet[1:] {
		if takeOne(t, s, zone, k, l).Allowed {
			admitted.Add(1)
		}
		s.async.Load().syncNow()
	}
	fleet[0].async.Load().syncNow()
	before := admitted.Load()
	if got := redisCount(t, srv, fleet[0], zone, k, l); got != before {
		t.Fatalf("Redis counts %d, want the %d admitted", got, before)
	}
	// What each instance read: at most what was admitted.
	var room int64
	for _, s := range fleet {
		room += n - readCount(t, s, zone, k, l)
	}
	// Phase 2: all three at once.
	var wg sync.WaitGroup
	for _, s := range fleet {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 20 {
				if takeOne(t, s, zone, k, l).Allowed {
					admitted.Add(1)
				}
				if i%4 == 0 {
					s.async.Load().syncNow()
				}
			}
		}()
	}
	wg.Wait()
	bound := before + room // N + (I-1)(N-G) when every instance read G = before
	if got := admitted.Load(); got > bound || got < n {
		t.Fatalf("admitted %d; want at least the limit %d and at most the bound %d", got, n, bound)
	}
	if bound >= instances*n-before {
		t.Fatalf("the bound %d would not catch instances deciding alone", bound)
	}
	for _, s := range fleet {
		s.async.Load().syncNow()
	}
	if got := redisCount(t, srv, fleet[0], zone, k, l); got != n {
		t.Fatalf("Redis counts %d once synced, want the limit %d (capped)", got, n)
	}
}

// readCount is the count of k that s read last.
func readCount(t *testing.T, s *Store, zone string, k algorithms.Key, l algorithms.Limit) int64 {
	t.Helper()
	y := s.async.Load()
	sk := syncKey{zone: (*y.zones.Load())[zone].id, key: k}
	sh := y.shard(&sk)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	j, ok := sh.entry(sk)
	if !ok || !sh.slab[j].read {
		t.Fatalf("%s: the key was never read", zone)
	}
	return sh.slab[j].debt
}

// TestSyncRedisStoppedAndStarted: while Redis is down the zone decides
// here, the charges held; when it is back, the sync reconciles them: Redis
// counts what was admitted.
func TestSyncRedisStoppedAndStarted(t *testing.T) {
	srv := redistest.Start(t)
	const n = 50
	l := syncLimit(t, algorithms.FixedWindow, n, time.Hour)
	s := syncStore(t, srv.URL(), "outage", l, 1000)
	y := s.async.Load()
	for range 10 {
		takeOne(t, s, "outage", testKey(1), l)
	}
	y.syncNow()
	srv.Stop()
	admitted := int64(10)
	for range 30 {
		if takeOne(t, s, "outage", testKey(1), l).Allowed {
			admitted++
		}
		takeOne(t, s, "outage", testKey(2), l)
	}
	y.syncNow()
	st, _ := s.SyncStatus("outage")
	if st.Failures == 0 || st.Error == "" {
		t.Fatalf("status %+v: want the failed sync shown", st)
	}
	if st.Held != 60 {
		t.Fatalf("held %d units, want the 60 charged during the outage", st.Held)
	}
	if admitted != 40 {
		t.Fatalf("admitted %d during the outage, want every one of 40 (decided here)", admitted)
	}
	srv.Restart(t)
	if _, ok := waitFor(10*time.Second, func() bool {
		y.syncNow()
		st, _ := s.SyncStatus("outage")
		return st.Failures == 0
	}); !ok {
		t.Fatal("the sync never succeeded after Redis came back")
	}
	// A restart without persistence lost the 10 synced before; the 30 and
	// 30 held are in.
	if got := redisCount(t, srv, s, "outage", testKey(1), l); got != 30 && got != 40 {
		t.Fatalf("Redis counts %d for key 1, want the 30 held (or 40 if the restart kept its data)", got)
	}
	if got := redisCount(t, srv, s, "outage", testKey(2), l); got != 30 {
		t.Fatalf("Redis counts %d for key 2, want the 30 held", got)
	}
	if st, _ := s.SyncStatus("outage"); st.Held != 0 || st.Dropped != 0 {
		t.Fatalf("status %+v: want nothing held or dropped", st)
	}
}

// TestSyncMaxKeys: a zone keeps at most max_keys keys; a key dropped with
// unsent charges counts them dropped.
func TestSyncMaxKeys(t *testing.T) {
	srv := redistest.Start(t)
	l := syncLimit(t, algorithms.FixedWindow, 5, time.Hour)
	s := syncStore(t, srv.URL(), "bounded", l, 10)
	for i := range 25 {
		takeOne(t, s, "bounded", testKey(i), l)
	}
	st, _ := s.SyncStatus("bounded")
	if st.Keys > 10 {
		t.Fatalf("%d keys kept, want at most 10", st.Keys)
	}
	if st.Dropped+st.Held != 25 {
		t.Fatalf("held %d + dropped %d, want the 25 charged", st.Held, st.Dropped)
	}
	if st.Dropped < 15 {
		t.Fatalf("dropped %d, want at least 15", st.Dropped)
	}
}

// TestSyncBesideExactZone: a request with a zone in the mode and an exact
// zone: one Redis call (the exact zone's), all-or-nothing; the exact
// zone's refusal takes the async charge back.
func TestSyncBesideExactZone(t *testing.T) {
	srv := redistest.Start(t)
	la := syncLimit(t, algorithms.FixedWindow, 10, time.Hour)
	le := syncLimit(t, algorithms.FixedWindow, 3, time.Hour)
	s := syncStore(t, srv.URL(), "async", la, 100)
	k := testKey(3)
	reqs := []algorithms.Request{{Zone: "async", Key: k, Limit: la, Cost: 1}, {Zone: "exact", Key: k, Limit: le, Cost: 1}}
	out := make([]algorithms.Decision, 2)
	admitted := 0
	for range 6 {
		if err := s.Take(context.Background(), reqs, out); err != nil {
			t.Fatal(err)
		}
		if out[0].Allowed && out[1].Allowed {
			admitted++
		}
	}
	if admitted != 3 {
		t.Fatalf("admitted %d, want the exact zone's 3", admitted)
	}
	s.async.Load().syncNow()
	if st, _ := s.SyncStatus("async"); st.Error != "" {
		t.Fatalf("the sync failed: %s", st.Error)
	}
	if got := redisCount(t, srv, s, "async", k, la); got != 3 {
		t.Fatalf("the async zone counts %d, want 3: the refused requests' charges taken back", got)
	}
}

// TestSyncBacklog: a sync of many keys (a backlog: here 8,500 keys in one
// interval) runs as several bounded pipelines and lands every charge.
func TestSyncBacklog(t *testing.T) {
	srv := redistest.Start(t)
	l := syncLimit(t, algorithms.FixedWindow, 5, time.Hour)
	s := syncStore(t, srv.URL(), "backlog", l, 10000)
	const n = 2*syncLanes*syncChunk + 500 // three rounds of lanes, the last one partial
	for i := range n {
		takeOne(t, s, "backlog", algorithms.Key{1, byte(algorithms.KeyHash), byte(i >> 16), byte(i >> 8), byte(i)}, l)
	}
	incr, expire := srv.CommandCount(t, "incrby"), srv.CommandCount(t, "pexpire")
	s.async.Load().syncNow()
	st, _ := s.SyncStatus("backlog")
	if st.Error != "" || st.Held != 0 {
		t.Fatalf("status %+v: want every charge landed", st)
	}
	if got := srv.Do(t, "DBSIZE").(int64); got < n {
		t.Fatalf("Redis holds %d keys, want the %d synced", got, n)
	}
	// One INCRBY per key, and its count's TTL (the instance's first charge
	// to it); no script.
	if got := srv.CommandCount(t, "incrby") - incr; got != n {
		t.Fatalf("%d INCRBY for %d keys", got, n)
	}
	if got := srv.CommandCount(t, "pexpire") - expire; got != n {
		t.Fatalf("%d PEXPIRE for %d new counts", got, n)
	}
	// The next charges of the same keys: an INCRBY each, nothing else.
	for i := range n {
		takeOne(t, s, "backlog", algorithms.Key{1, byte(algorithms.KeyHash), byte(i >> 16), byte(i >> 8), byte(i)}, l)
	}
	incr, expire = srv.CommandCount(t, "incrby"), srv.CommandCount(t, "pexpire")
	gets := srv.CommandCount(t, "get")
	s.async.Load().syncNow()
	if got := srv.CommandCount(t, "incrby") - incr; got != n {
		t.Fatalf("%d INCRBY for %d keys", got, n)
	}
	if e, g := srv.CommandCount(t, "pexpire")-expire, srv.CommandCount(t, "get")-gets; e != 0 || g != 0 {
		t.Fatalf("%d PEXPIRE and %d GET for %d keys whose counts exist: want none", e, g, n)
	}
}

// TestSyncTakeAlloc: a decision of a key kept in the asynchronous mode
// allocates nothing (no Redis call, the key's entry in its shard's slab).
func TestSyncTakeAlloc(t *testing.T) {
	if raceBuild {
		t.Skip("under -race, allocation counts are not the program's")
	}
	srv := redistest.Start(t)
	l := syncLimit(t, algorithms.SlidingWindow, 1_000_000, time.Hour)
	s := syncStore(t, srv.URL(), "alloc", l, 100)
	reqs := []algorithms.Request{{Zone: "alloc", Key: testKey(1), Limit: l, Cost: 1}}
	out := make([]algorithms.Decision, 1)
	ctx := context.Background()
	_ = s.Take(ctx, reqs, out)
	s.async.Load().syncNow()
	if n := testing.AllocsPerRun(1000, func() {
		if err := s.Take(ctx, reqs, out); err != nil || !out[0].Allowed {
			t.Fatalf("Take: %v %+v", err, out[0])
		}
	}); n != 0 {
		t.Errorf("%.1f allocations per decision, want 0", n)
	}
}

// TestSyncCluster: on a 3-master Cluster, a sync groups its keys by hash
// slot (one script call per slot, which go-redis sends to the slot's
// master) and every key's count lands where its slot lives.
func TestSyncCluster(t *testing.T) {
	c := redistest.StartCluster(t, 3)
	s := newClusterStore(t, c.Addrs(), testTimeout)
	l := syncLimit(t, algorithms.FixedWindow, 10, time.Hour)
	release, err := s.SyncZone("cl", l, time.Hour, 1000)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(release)
	const n = 60
	for i := range n {
		for range 3 {
			takeOne(t, s, "cl", testKey(i), l)
		}
	}
	s.async.Load().syncNow()
	if st, _ := s.SyncStatus("cl"); st.Error != "" || st.Held != 0 {
		t.Fatalf("status %+v: want every charge landed", st)
	}
	cc := c.Client()
	for i := range n {
		ck := countKey(s.Key("cl", testKey(i)), algorithms.WindowStart(time.Now().UnixMilli(), l.Window))
		if got, err := cc.Get(context.Background(), ck).Int64(); err != nil || got != 3 {
			t.Fatalf("key %d: %s holds %d (%v), want a count of 3", i, ck, got, err)
		}
	}
}

// TestSyncAdminPeekAndReset: the admin API's peek of a key kept in the
// asynchronous mode shows this instance's view (its charges not yet sent
// included), and a reset drops it with the key in Redis.
func TestSyncAdminPeekAndReset(t *testing.T) {
	srv := redistest.Start(t)
	l := syncLimit(t, algorithms.FixedWindow, 5, time.Hour)
	s := syncStore(t, srv.URL(), "adm", l, 100)
	k := testKey(4)
	for range 3 {
		takeOne(t, s, "adm", k, l)
	}
	out, found := make([]algorithms.Decision, 1), make([]bool, 1)
	if err := s.PeekKeys(context.Background(), "adm", []algorithms.Key{k}, l, out, found); err != nil {
		t.Fatal(err)
	}
	if !found[0] || out[0].Remaining != 2 {
		t.Fatalf("peek before any sync: found %v, %+v; want 2 left (the 3 unsent charges seen)", found[0], out[0])
	}
	s.async.Load().syncNow()
	if _, err := s.ResetKeys(context.Background(), "adm", []algorithms.Key{k}); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if !takeOne(t, s, "adm", k, l).Allowed {
			t.Fatalf("request %d after the reset refused: the instance kept its view", i)
		}
	}
	if takeOne(t, s, "adm", k, l).Allowed {
		t.Fatal("a sixth request after the reset allowed")
	}
}

// TestSyncPreviousCountReadUntilFinal: a sliding_window key's previous
// count is read with each sync until a sync well into the window (4
// intervals and 250 ms; 4 syncs' time when they are slower) has read it:
// from then on no instance adds to it, and the syncs of the key cost one
// INCRBY, no GET.
func TestSyncPreviousCountReadUntilFinal(t *testing.T) {
	srv := redistest.Start(t)
	l := syncLimit(t, algorithms.SlidingWindow, 100, time.Minute)
	s := newTestStore(t, srv.URL(), "", testTimeout, 0)
	release, err := s.SyncZone("final", l, 10*time.Millisecond, 100)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(release)
	// Well into a window, and far from its end.
	for {
		now := time.Now().UnixMilli()
		if into := now - algorithms.WindowStart(now, l.Window); into >= 400 && into < 50_000 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	k := testKey(5)
	start := algorithms.WindowStart(time.Now().UnixMilli(), l.Window)
	// The previous window's count, as the other instances left it.
	if err := srv.Client().Set(context.Background(), countKey(s.Key("final", k), start-l.Window), 40, time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	y := s.async.Load()
	// reads: the counts a sync after one request of key reads (GETs).
	reads := func(key algorithms.Key) int64 {
		gets := srv.CommandCount(t, "get")
		takeOne(t, s, "final", key, l)
		y.syncNow()
		return srv.CommandCount(t, "get") - gets
	}
	if got := reads(k); got != 1 {
		t.Fatalf("the first sync read %d counts, want the previous window's", got)
	}
	out, found := make([]algorithms.Decision, 1), make([]bool, 1)
	if err := s.PeekKeys(context.Background(), "final", []algorithms.Key{k}, l, out, found); err != nil {
		t.Fatal(err)
	}
	// 100 − 1 − ⌈40 × (the part of the previous window still in view)⌉
	if !found[0] || out[0].Remaining >= 99 || out[0].Remaining < 99-40 {
		t.Fatalf("the view %+v does not count the previous window's 40", out[0])
	}
	for i := range 3 {
		if got := reads(k); got != 0 {
			t.Fatalf("sync %d read %d counts, want none: the previous count is final", i+2, got)
		}
	}
	if got := redisCount(t, srv, s, "final", k, l); got != 44 {
		t.Fatalf("Redis counts %d, want 40 + 4", got)
	}
	// Syncs slower than the interval (a CPU-starved instance) put
	// finality off: 4 of them. After syncs of a minute, a new key's
	// previous count is read by every sync in this window.
	y.slowest.Store(int64(time.Minute))
	k2 := testKey(6)
	for i := range 3 {
		if got := reads(k2); got != 1 {
			t.Fatalf("sync %d after slow syncs read %d counts, want the previous window's", i+1, got)
		}
	}
}

// TestSyncEntryTwoCacheLines: a key's entry is what a request touches of
// it besides its index slot; at 128 bytes in a slab it spans two cache
// lines (a key is cold in the mode's load: each line is a miss).
func TestSyncEntryTwoCacheLines(t *testing.T) {
	if n := unsafe.Sizeof(syncEntry{}); n != 128 {
		t.Fatalf("syncEntry is %d bytes, want 128", n)
	}
}

// TestSyncMemoryPerKey: the local state of a zone in the mode, per key
// kept, measured with the Go heap (runtime.MemStats after a collection),
// 100,000 keys of a sliding_window zone and as many again past its
// max_keys (they replace others: the memory stays bounded by it).
func TestSyncMemoryPerKey(t *testing.T) {
	if raceBuild {
		t.Skip("under -race, the heap is not the program's")
	}
	srv := redistest.Start(t)
	const n = 100_000
	l := syncLimit(t, algorithms.SlidingWindow, 1000, time.Hour)
	s := syncStore(t, srv.URL(), "mem", l, n)
	key := func(i int) algorithms.Key {
		return algorithms.Key{1, byte(algorithms.KeyHash), byte(i >> 16), byte(i >> 8), byte(i), 0x33}
	}
	y := s.async.Load()
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	before := heap()
	for i := range n {
		takeOne(t, s, "mem", key(i), l)
	}
	y.syncNow() // the sync's own buffers counted too
	full := heap()
	perKey := float64(full-before) / n
	t.Logf("%.0f bytes per key kept (%d keys)", perKey, n)
	for i := n; i < 2*n; i++ {
		takeOne(t, s, "mem", key(i), l)
	}
	y.syncNow()
	if st, _ := s.SyncStatus("mem"); st.Keys > n {
		t.Fatalf("%d keys kept, over max_keys %d", st.Keys, n)
	}
	again := heap()
	t.Logf("%.0f bytes per key after as many keys again past max_keys", float64(again-before)/n)
	if perKey > 400 || float64(again-before)/n > 1.5*perKey {
		t.Fatalf("%.0f bytes per key, then %.0f: want at most 400, bounded by max_keys", perKey, float64(again-before)/n)
	}
}

// TestSyncClusterMasterDown: with one master of a Cluster down, a sync's
// keys on the live masters land, each charge once, sync after sync, and
// the dead master's keys hold their charges; when it is back, they land
// too. (A chunk failed whole for one node's keys would send the live keys'
// charges again with each sync: counted several times.)
func TestSyncClusterMasterDown(t *testing.T) {
	c := redistest.StartClusterWith(t, redistest.ClusterConfig{Masters: 3, Partial: true})
	s := newClusterStore(t, c.Addrs(), testTimeout)
	l := syncLimit(t, algorithms.FixedWindow, 1000, time.Hour)
	release, err := s.SyncZone("down", l, time.Hour, 1000)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(release)
	y := s.async.Load()
	const n, rounds = 60, 3
	nodeOf := func(k algorithms.Key) int {
		slot := int(hashSlotOf(k))
		for i, r := range c.Slots {
			if slot >= r[0] && slot <= r[1] {
				return i
			}
		}
		t.Fatalf("slot %d owned by no node", slot)
		return -1
	}
	count := func(k algorithms.Key) int64 {
		ck := countKey(s.Key("down", k), algorithms.WindowStart(time.Now().UnixMilli(), l.Window))
		v, err := c.Nodes[nodeOf(k)].Client().Get(context.Background(), ck).Int64()
		if err != nil && err != redis.Nil {
			t.Fatalf("%s: %v", ck, err)
		}
		return v
	}
	onDead := 0
	for i := range n {
		takeOne(t, s, "down", testKey(i), l)
		if nodeOf(testKey(i)) == 2 {
			onDead++
		}
	}
	y.syncNow()
	if onDead == 0 || onDead == n {
		t.Fatalf("%d of %d keys on the master to stop: the test needs some on each side", onDead, n)
	}
	c.Nodes[2].Stop()
	for range rounds {
		for i := range n {
			takeOne(t, s, "down", testKey(i), l)
		}
		y.syncNow()
	}
	if st, _ := s.SyncStatus("down"); st.Held != int64(onDead*rounds) || st.Error == "" {
		t.Fatalf("status %+v: want the dead master's %d charges held and the failure shown", st, onDead*rounds)
	}
	for i := range n {
		if k := testKey(i); nodeOf(k) != 2 {
			if got := count(k); got != 1+rounds {
				t.Fatalf("key %d on a live master counts %d, want %d: each charge once", i, got, 1+rounds)
			}
		}
	}
	// Back (empty: nothing persisted): the held charges land.
	c.Nodes[2].Restart(t)
	c.WaitHealthy(t)
	for try := 0; ; try++ {
		y.syncNow()
		if st, _ := s.SyncStatus("down"); st.Held == 0 && st.Error == "" {
			break
		} else if try == 50 {
			t.Fatalf("status %+v: the held charges never landed", st)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for i := range n {
		if k := testKey(i); nodeOf(k) == 2 {
			if got := count(k); got != rounds {
				t.Fatalf("key %d on the master back counts %d, want the %d held", i, got, rounds)
			}
		}
	}
}
