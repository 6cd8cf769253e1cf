package redisstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

var leaseSeq atomic.Uint64

// nextLease returns a lease id never used before in this test binary, as
// large as the handler's (random 64-bit ids): the script must keep them as
// strings.
func nextLease() uint64 { return 1<<63 + leaseSeq.Add(1)*7919 }

func concLimit(t testing.TB, n int64, lease time.Duration) algorithms.Limit {
	t.Helper()
	l, err := algorithms.NewConcurrencyLimit(n, lease)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func concReq(zone string, key algorithms.Key, l algorithms.Limit) algorithms.Request {
	return algorithms.Request{Zone: zone, Key: key, Limit: l, Cost: 1, Holder: nextLease()}
}

// members returns the leases of a slots key whose expiry is after now
// (Redis's clock): member → score.
func heldIn(t testing.TB, c redis.Cmdable, key string) map[string]float64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	now, err := c.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	zs, err := c.ZRangeWithScores(ctx, key, 0, -1).Result()
	if err != nil {
		t.Fatalf("ZRANGE %s: %v", key, err)
	}
	out := map[string]float64{}
	for _, z := range zs {
		if z.Score > float64(now.UnixMilli()) {
			out[z.Member.(string)] = z.Score
		}
	}
	return out
}

// waitLeases polls the slots key until it holds want live leases (the
// releases are asynchronous), and fails the test after within.
func waitLeases(t testing.TB, c redis.Cmdable, key string, want int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		got := len(heldIn(t, c, key))
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d live leases after %v, want %d", key, got, within, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// The twin test of a concurrency zone: random takes, releases, renewals
// and time steps on one key (beside a token bucket, in one script call),
// decided by the Lua twin at a given time and by algorithms.Step over a Go
// model of the leases (id → expiry); every decision and the set of live
// leases, with their expiries, must agree.
func TestConcurrencyTwin(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	ctx := testCtx(t)
	rng := rand.New(rand.NewPCG(twinSeed, 16))
	const lease = 5_000
	now := int64(1_700_000_000_000)
	key, rkey := "twin:conc:"+t.Name(), "twin:rate:"+t.Name()
	srv.Do(t, "DEL", key, rkey)
	// The model holds what the set holds: a decision drops the expired
	// leases first (prune), nothing else does, and a renewal extends a
	// lease still in the set, even one past its expiry that no decision
	// has dropped yet (nobody could have taken its slot: a decision would
	// have dropped it).
	model := map[uint64]int64{} // lease → expiry
	prune := func() int64 {
		for id, exp := range model {
			if exp <= now {
				delete(model, id)
			}
		}
		return int64(len(model))
	}
	var rate algorithms.State
	rateFresh := true
	for step := range 3000 {
		n := int64(1 + rng.IntN(4))
		cl := algorithms.Limit{Algorithm: algorithms.Concurrency, Events: n, Window: lease}
		rl := algorithms.Limit{Events: 3, Window: 2_000}
		now += []int64{0, 1, 100, 999, 2_499, 5_000, 7_000}[rng.IntN(7)]
		args := []any{strconv.FormatInt(now, 10)}
		what := ""
		var keys []string
		switch op := rng.IntN(10); {
		case op < 5: // take, with the rate zone on even steps
			id := nextLease()
			r := algorithms.Request{Limit: cl, Cost: 1, Holder: id}
			keys = []string{key}
			reqs := []algorithms.Request{r}
			withRate := step%2 == 0
			if withRate {
				keys = append(keys, rkey)
				reqs = append(reqs, algorithms.Request{Limit: rl, Cost: 1})
			}
			args = luaArgs(args, false, reqs...)
			res, err := runTwin(ctx, c, keys, args...)
			if err != nil {
				t.Fatalf("step %d: %v", step, err)
			}
			used := prune()
			cd, _, _ := algorithms.Step(algorithms.State{Alg: algorithms.Concurrency, Debt: used}, false, cl, now, 1)
			all := cd.Allowed
			var rd algorithms.Decision
			var rnext algorithms.State
			if withRate {
				rd, rnext, _ = algorithms.Step(rate, rateFresh, rl, now, 1)
				all = all && rd.Allowed
			}
			if !all && cd.Allowed {
				cd, _, _ = algorithms.Step(algorithms.State{Alg: algorithms.Concurrency, Debt: used}, false, cl, now, 0)
			}
			got := luaDecision{Allowed: res[0] == 1, Remaining: res[1], RetryMs: res[2], ResetMs: res[3]}
			if want := goView(cd); got != want {
				t.Fatalf("step %d (take, %d in use of %d, rate zone %v): Lua %+v, Go %+v", step, used, n, withRate, got, want)
			}
			if all {
				model[id] = now + lease
				if withRate {
					rate, rateFresh = rnext, false
				}
			}
			what = fmt.Sprintf("take (all %v)", all)
		case op < 8: // release one held lease, or one never granted
			id := nextLease()
			if len(model) > 0 && rng.IntN(4) > 0 {
				ids := make([]uint64, 0, len(model))
				for id := range model {
					ids = append(ids, id)
				}
				slices.Sort(ids)
				id = ids[rng.IntN(len(ids))]
			}
			keys = []string{key}
			args = luaArgs(args, true, algorithms.Request{Limit: cl, Cost: 1, Holder: id})
			if _, err := runTwin(ctx, c, keys, args...); err != nil {
				t.Fatalf("step %d (release): %v", step, err)
			}
			delete(model, id)
			what = "release"
		default: // renew one held lease (or one expired: XX adds nothing)
			if len(model) == 0 {
				continue
			}
			ids := make([]uint64, 0, len(model))
			for id := range model {
				ids = append(ids, id)
			}
			slices.Sort(ids)
			id := ids[rng.IntN(len(ids))]
			keys = []string{key}
			args = append(args, string(testArgs.appendRenewal(nil, &algorithms.Request{Limit: cl, Cost: 1, Holder: id})))
			if _, err := runTwin(ctx, c, keys, args...); err != nil {
				t.Fatalf("step %d (renew): %v", step, err)
			}
			model[id] = now + lease
			what = "renew"
		}
		// The set: exactly the model's leases with their expiries (expired
		// ones are dropped lazily, by the next decision).
		zs, err := c.ZRangeWithScores(ctx, key, 0, -1).Result()
		if err != nil {
			t.Fatalf("step %d: ZRANGE: %v", step, err)
		}
		got := map[uint64]int64{}
		for _, z := range zs {
			id, _ := strconv.ParseUint(z.Member.(string), 10, 64)
			if int64(z.Score) > now {
				got[id] = int64(z.Score)
			}
		}
		want := map[uint64]int64{}
		for id, exp := range model {
			if exp > now {
				want[id] = exp
			}
		}
		if len(got) != len(want) {
			t.Fatalf("step %d (%s): Redis holds %d live leases %v, Go %d %v", step, what, len(got), got, len(want), want)
		}
		for id, exp := range want {
			if got[id] != exp {
				t.Fatalf("step %d (%s): lease %d expires at %d in Redis, %d in Go", step, what, id, got[id], exp)
			}
		}
		if len(zs) > 0 {
			if ttl := srv.Do(t, "PTTL", key).(int64); ttl < 0 || ttl > lease+1000 {
				t.Fatalf("step %d: PTTL %d, want the latest lease plus the margin at most", step, ttl)
			}
		}
	}
}

// 200 goroutines on one key of `concurrent 5`, released together: exactly
// 5 take a slot, 195 are refused; each gives its slot back once every
// request has been decided, and the key is empty again. Ten rounds on one
// key: the slots come back every time.
func TestConcurrencyRedisExact(t *testing.T) {
	srv := redistest.Start(t)
	s := newTestStore(t, srv.URL(), "", testTimeout, 0)
	l := concLimit(t, 5, time.Minute)
	key := freshKey(t)
	for round := range 10 {
		var allowed, refused, failed atomic.Int64
		var ready, decided, done sync.WaitGroup
		start := make(chan struct{})
		ready.Add(200)
		decided.Add(200)
		for range 200 {
			done.Add(1)
			go func() {
				defer done.Done()
				reqs := []algorithms.Request{concReq("conc", key, l)}
				out := make([]algorithms.Decision, 1)
				ready.Done()
				<-start
				err := s.Take(context.Background(), reqs, out)
				switch {
				case err != nil:
					failed.Add(1)
				case out[0].Allowed:
					allowed.Add(1)
				default:
					refused.Add(1)
				}
				decided.Done()
				if err == nil && out[0].Allowed {
					decided.Wait()
					_ = s.Release(context.Background(), reqs)
				}
			}()
		}
		ready.Wait()
		close(start)
		done.Wait()
		if allowed.Load() != 5 || refused.Load() != 195 || failed.Load() != 0 {
			t.Fatalf("round %d: %d allowed, %d refused, %d failed; want exactly 5 and 195", round, allowed.Load(), refused.Load(), failed.Load())
		}
		waitLeases(t, s.Client(), s.SlotsKey("conc", key), 0, 5*time.Second)
	}
	if n := s.HeldSlots(); n != 0 {
		t.Fatalf("%d leases still registered for renewal", n)
	}
}

// A request refused by a rate zone takes no slot; one refused by the
// concurrency zone spends no token (one script call decides both).
func TestConcurrencyRedisAllOrNothing(t *testing.T) {
	srv := redistest.Start(t)
	s := newTestStore(t, srv.URL(), "", testTimeout, 0)
	key := freshKey(t)
	rate := limit(t, 3, time.Hour, 0)
	conc := concLimit(t, 2, time.Minute)
	both := func() []algorithms.Request {
		return []algorithms.Request{{Zone: "aon_rate", Key: key, Limit: rate, Cost: 1}, concReq("aon_conc", key, conc)}
	}
	var held [][]algorithms.Request
	for i := range 2 {
		r := both()
		if d := take(t, s, r...); !d[0].Allowed || !d[1].Allowed {
			t.Fatalf("request %d: %+v", i+1, d)
		}
		held = append(held, r)
	}
	d := take(t, s, both()...)
	if !d[0].Allowed || d[1].Allowed || d[0].Remaining != 1 || d[1].RetryAfter != algorithms.ConcurrencyRetry {
		t.Fatalf("third: %+v; want refused by the concurrency zone, the rate zone uncharged (1 left)", d)
	}
	// (A token is 3600000 units of debt; 3 units refill per ms.)
	if st, _ := DecodeState(getRaw(t, s.Client(), s.Key("aon_rate", key))); st.Debt > 2*3_600_000 || st.Debt < 2*3_600_000-30_000 {
		t.Fatalf("rate zone debt %d after a concurrency refusal, want 2 tokens (7200000, less what refilled)", st.Debt)
	}
	for _, r := range held {
		_ = s.Release(context.Background(), r)
	}
	slots := s.SlotsKey("aon_conc", key)
	waitLeases(t, s.Client(), slots, 0, 5*time.Second)
	last := both()
	if d := take(t, s, last...); !d[0].Allowed || !d[1].Allowed || d[0].Remaining != 0 {
		t.Fatalf("fourth: %+v", d)
	}
	d = take(t, s, both()...)
	if d[0].Allowed || !d[1].Allowed || d[1].Remaining != 1 {
		t.Fatalf("fifth: %+v; want refused by the rate zone, the concurrency zone uncharged (1 free)", d)
	}
	if n := len(heldIn(t, s.Client(), slots)); n != 1 {
		t.Fatalf("%d slots in use, want 1 (the fourth's): the rate refusal took one", n)
	}
	_ = s.Release(context.Background(), last)
	waitLeases(t, s.Client(), slots, 0, 5*time.Second)
}

// A lease lives `lease` from its admission unless renewed; a running
// request's lease is renewed at half its length, so it outlives its first
// expiry for as long as the request runs; once released, it is gone. A
// store that stops renewing (its instance crashed) leaves its leases to
// expire: not before `lease`, and by then they are gone.
func TestConcurrencyRedisLeaseRenewalAndExpiry(t *testing.T) {
	srv := redistest.Start(t)
	s := newTestStore(t, srv.URL(), "", testTimeout, 0)
	l := concLimit(t, 1, time.Second)
	key := freshKey(t)
	slots := s.SlotsKey("lease", key)
	r := concReq("lease", key, l)
	if d := take(t, s, r); !d[0].Allowed {
		t.Fatal("refused")
	}
	first := heldIn(t, s.Client(), slots)[strconv.FormatUint(r.Holder, 10)]
	// Three lease lengths: renewed all along, so never free.
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if d := take(t, s, concReq("lease", key, l)); d[0].Allowed {
			t.Fatal("a second request got the slot of a running request (its lease was not renewed)")
		}
	}
	if got := heldIn(t, s.Client(), slots)[strconv.FormatUint(r.Holder, 10)]; got < first+2000 {
		t.Fatalf("lease expiry %v, first %v: not renewed", got, first)
	}
	_ = s.Release(context.Background(), []algorithms.Request{r})
	waitLeases(t, s.Client(), slots, 0, 2*time.Second)

	// The crash: a store that took a slot is closed without releasing it.
	dead := newStoreWith(redis.NewClient(&redis.Options{Addr: srv.Addr}), false, DefaultKeyPrefix, testTimeout, redisPathOptions())
	r = concReq("lease", key, l)
	t0 := time.Now()
	if d := take(t, dead, r); !d[0].Allowed {
		t.Fatal("refused")
	}
	_ = dead.Destruct()
	time.Sleep(time.Until(t0.Add(800 * time.Millisecond)))
	if d := take(t, s, concReq("lease", key, l)); d[0].Allowed {
		t.Fatal("a crashed store's slot came back before its lease expired")
	}
	time.Sleep(time.Until(t0.Add(1100 * time.Millisecond)))
	r2 := concReq("lease", key, l)
	if d := take(t, s, r2); !d[0].Allowed {
		t.Fatalf("a crashed store's slot did not come back after its lease: %+v", d[0])
	}
	_ = s.Release(context.Background(), []algorithms.Request{r2})
	waitLeases(t, s.Client(), slots, 0, 2*time.Second)
}

// Releases that cannot reach Redis (killed) are sent again once it is
// back, until their lease would have expired anyway; the store never
// blocks on them.
func TestConcurrencyRedisReleaseRetried(t *testing.T) {
	srv := redistest.Start(t, "appendonly yes", "appendfsync always")
	s := newTestStore(t, srv.URL(), "", 200*time.Millisecond, 0)
	l := concLimit(t, 3, time.Minute)
	key := freshKey(t)
	slots := s.SlotsKey("retry", key)
	var held []algorithms.Request
	for range 3 {
		r := concReq("retry", key, l)
		if d := take(t, s, r); !d[0].Allowed {
			t.Fatal("refused")
		}
		held = append(held, r)
	}
	srv.Stop()
	t0 := time.Now()
	for _, r := range held {
		_ = s.Release(context.Background(), []algorithms.Request{r})
	}
	if d := time.Since(t0); d > 100*time.Millisecond {
		t.Fatalf("Release took %v with Redis down: it must not wait (the store's timeout is 200 ms)", d)
	}
	time.Sleep(600 * time.Millisecond) // a few failed attempts
	srv.Restart(t)
	waitLeases(t, srv.Client(), slots, 0, 10*time.Second)
}

// The admin API reads a concurrency zone's slots in use and resets them; a
// reset key takes slots afresh, and the releases of the requests that held
// the reset slots free nothing.
func TestConcurrencyRedisPeekReset(t *testing.T) {
	srv := redistest.Start(t)
	s := newTestStore(t, srv.URL(), "", testTimeout, 0)
	l := concLimit(t, 2, time.Minute)
	key := freshKey(t)
	r1 := concReq("peek", key, l)
	take(t, s, r1)
	out, found := make([]algorithms.Decision, 1), make([]bool, 1)
	if err := s.PeekKeys(context.Background(), "peek", []algorithms.Key{key}, l, out, found); err != nil {
		t.Fatal(err)
	}
	if !found[0] || out[0].Remaining != 1 || out[0].Limit != 2 || !out[0].Allowed {
		t.Fatalf("peek: %+v found=%v; want 1 of 2 slots in use", out[0], found[0])
	}
	if n, err := s.ResetKeys(context.Background(), "peek", []algorithms.Key{key}); err != nil || n != 1 {
		t.Fatalf("ResetKeys: %d, %v; want 1", n, err)
	}
	r2, r3 := concReq("peek", key, l), concReq("peek", key, l)
	if d := take(t, s, r2); !d[0].Allowed {
		t.Fatal("refused after reset")
	}
	_ = s.Release(context.Background(), []algorithms.Request{r1})
	if d := take(t, s, r3); !d[0].Allowed {
		t.Fatal("refused")
	}
	time.Sleep(100 * time.Millisecond) // r1's release has landed
	if d := take(t, s, concReq("peek", key, l)); d[0].Allowed {
		t.Fatal("the release of a reset lease freed a slot taken after the reset")
	}
	if err := s.PeekKeys(context.Background(), "peek", []algorithms.Key{key}, l, out, found); err != nil || out[0].Remaining != 0 {
		t.Fatalf("peek: %+v %v; want both slots in use", out[0], err)
	}
}

// A zone that changes kind under the same name (a reload) starts afresh:
// the concurrency zone's slots and the rate zone's state live in distinct
// keys, so neither reads the other's.
func TestConcurrencyRedisKindChange(t *testing.T) {
	srv := redistest.Start(t)
	s := newTestStore(t, srv.URL(), "", testTimeout, 0)
	key := freshKey(t)
	rate := limit(t, 1, time.Hour, 0)
	take(t, s, algorithms.Request{Zone: "kind", Key: key, Limit: rate, Cost: 1})
	c := concReq("kind", key, concLimit(t, 1, time.Minute))
	if d := take(t, s, c); !d[0].Allowed {
		t.Fatalf("concurrency zone over a rate zone's key: %+v", d[0])
	}
	if d := take(t, s, algorithms.Request{Zone: "kind", Key: key, Limit: rate, Cost: 1}); d[0].Allowed {
		t.Fatal("the rate zone forgot its state")
	}
	_ = s.Release(context.Background(), []algorithms.Request{c})
}

// In a Cluster, a request whose zones key on different identities is
// decided slot by slot; a refusal in a later slot gives back the lease
// taken in an earlier one (refund mode releases it).
func TestConcurrencyClusterCrossSlotRefund(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	s := newClusterStore(t, cl.Addrs(), testTimeout)
	conc := concLimit(t, 5, time.Minute)
	rate := limit(t, 1, time.Hour, 0)
	// Two identities in different slots.
	var a, b algorithms.Key
	for {
		a, b = freshKey(t), freshKey(t)
		if hashSlotOf(a) != hashSlotOf(b) {
			break
		}
	}
	if d := take(t, s, algorithms.Request{Zone: "xs_rate", Key: b, Limit: rate, Cost: 1}); !d[0].Allowed {
		t.Fatal("refused")
	}
	reqs := []algorithms.Request{concReq("xs_conc", a, conc), {Zone: "xs_rate", Key: b, Limit: rate, Cost: 1}}
	d := take(t, s, reqs...)
	if !d[0].Allowed || d[1].Allowed || d[0].Remaining != 5 {
		t.Fatalf("cross-slot: %+v; want the concurrency zone uncharged (5 free), the rate zone refusing", d)
	}
	slots := s.SlotsKey("xs_conc", a)
	if n := len(heldIn(t, s.Client(), slots)); n != 0 {
		t.Fatalf("%d leases after a cross-slot veto, want 0 (refunded)", n)
	}
	if n := s.HeldSlots(); n != 0 {
		t.Fatalf("%d leases registered after a refusal", n)
	}
}

// BenchmarkTakeConcurrency: a rate zone alone (as BenchmarkTakeOneZone),
// and the same with a concurrency zone beside it, its slot taken in the
// same call and given back by Release (queued, sent by the lease worker:
// its allocations and Redis's time count too). 50 goroutines, a key each.
//
//	go test -run XXX -bench TakeConcurrency -benchmem ./redisstore/
func BenchmarkTakeConcurrency(b *testing.B) {
	srv := redistest.Start(b)
	s := newTestStore(b, srv.URL(), "", testTimeout, 0)
	conc := concLimit(b, 1_000_000, time.Minute)
	for _, withConc := range []bool{false, true} {
		name := "rate"
		if withConc {
			name = "rate+concurrency"
		}
		b.Run(name, func(b *testing.B) {
			var seq, failed atomic.Int64
			b.SetParallelism((50 + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				key := keyOf(b, "bench-conc-"+strconv.FormatInt(seq.Add(1), 10)+time.Now().String())
				reqs := benchZones(b, key, 1)
				if withConc {
					reqs = append(reqs, concReq("bench_conc", key, conc))
				}
				out := make([]algorithms.Decision, len(reqs))
				ctx := context.Background()
				for pb.Next() {
					if withConc {
						reqs[1].Holder = nextLease()
					}
					if err := s.Take(ctx, reqs, out); err != nil || !out[0].Allowed {
						failed.Add(1)
						continue
					}
					_ = s.Release(ctx, reqs)
				}
			})
			b.StopTimer()
			if n := failed.Load(); n > 0 {
				b.Fatalf("%d of %d Takes failed or were refused", n, b.N)
			}
		})
	}
}

// SlotsKey is Key's text and the suffix (one allocation), for any zone
// name, and lives in the identity's Cluster slot.
func TestSlotsKey(t *testing.T) {
	s := &Store{prefix: DefaultKeyPrefix}
	for _, zone := range []string{"exports", "api/v1", "a{b}", "café", "my zone"} {
		k := keyOf(t, "client-"+zone)
		got, want := s.SlotsKey(zone, k), s.Key(zone, k)+":slots"
		if got != want {
			t.Errorf("SlotsKey(%q) = %q, want %q", zone, got, want)
		}
		if hashSlot(hashTag(got)) != hashSlotOf(k) {
			t.Errorf("SlotsKey(%q) = %q is not in the identity's slot", zone, got)
		}
	}
	k := keyOf(t, "allocs")
	if n := testing.AllocsPerRun(100, func() { _ = s.SlotsKey("api/v1", k) }); n != 1 {
		t.Errorf("SlotsKey allocates %v times, want 1", n)
	}
}

// The deny cache never answers a request with a concurrency zone (when a
// slot frees is in no state it could run forward): such a request goes to
// Redis every time, is refused by whichever zone refuses, and its slots
// are counted by Redis alone.
func TestConcurrencyDenyCacheStaysOut(t *testing.T) {
	srv := redistest.Start(t)
	s := denyStore(t, srv, 1000)
	key := freshKey(t)
	rate := limit(t, 1, time.Hour, 0)
	conc := concLimit(t, 1, time.Minute)
	both := func() []algorithms.Request {
		return []algorithms.Request{{Zone: "dc_rate", Key: key, Limit: rate, Cost: 1}, concReq("dc_conc", key, conc)}
	}
	first := both()
	take(t, s, first...)
	_ = s.Release(context.Background(), first)
	waitLeases(t, s.Client(), s.SlotsKey("dc_conc", key), 0, 5*time.Second)
	calls := scriptCalls(t, srv)
	for i := range 5 {
		if d := take(t, s, both()...); d[0].Allowed || !d[1].Allowed || d[1].Remaining != 1 {
			t.Fatalf("refusal %d: %+v; want refused by the rate zone, the slot free and untaken", i, d)
		}
	}
	if got := scriptCalls(t, srv) - calls; got != 5 {
		t.Fatalf("%d script calls for 5 refused requests with a concurrency zone, want 5 (the deny cache must stay out)", got)
	}
	// The rate zone alone is still answered from the cache.
	calls = scriptCalls(t, srv)
	for range 3 {
		if d := take(t, s, algorithms.Request{Zone: "dc_rate", Key: key, Limit: rate, Cost: 1}); d[0].Allowed {
			t.Fatal("allowed")
		}
	}
	if got := scriptCalls(t, srv) - calls; got > 1 {
		t.Fatalf("%d script calls for 3 refusals of the rate zone alone, want at most 1 (the deny cache answers)", got)
	}
}
