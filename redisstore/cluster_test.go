package redisstore

import (
	"context"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// nodeOf returns the index of the cluster node owning slot sl.
func nodeOf(c *redistest.Cluster, sl uint16) int {
	for i, r := range c.Slots {
		if r[0] <= int(sl) && int(sl) <= r[1] {
			return i
		}
	}
	return -1
}

// keyOnNode returns a fresh identity whose keys live on node i.
func keyOnNode(t *testing.T, s *Store, c *redistest.Cluster, i int) algorithms.Key {
	t.Helper()
	for range 1000 {
		k := freshKey(t)
		if nodeOf(c, hashSlot(hashTag(s.Key("z", k)))) == i {
			return k
		}
	}
	t.Fatalf("no identity on node %d in 1000 tries", i)
	return algorithms.Key{}
}

// TestCluster shares one 3-master cluster between its subtests.
func TestCluster(t *testing.T) {
	c := redistest.StartCluster(t, 3)
	s := newClusterStore(t, c.Addrs(), testTimeout)
	cc := c.Client()
	// Load the script on every node (the first call of each is EVALSHA
	// answered NOSCRIPT, then EVAL).
	for i := range c.Nodes {
		take(t, s, algorithms.Request{Zone: "warm", Key: keyOnNode(t, s, c, i), Limit: limit(t, 1, time.Hour, 0), Cost: 1})
	}

	t.Run("keyslot", func(t *testing.T) {
		n := c.Nodes[0]
		for tag, want := range map[string]int64{"123456789": 12739, "foo": 12182, "bar": 5061, "": 0} {
			if got := hashSlot([]byte(tag)); int64(got) != want {
				t.Errorf("hashSlot(%q) = %d, want %d", tag, got, want)
			}
		}
		rng := rand.New(rand.NewPCG(7, 11))
		for i := range 200 {
			b := make([]byte, 1+rng.IntN(40))
			for j := range b {
				for {
					b[j] = byte(rng.IntN(256))
					if b[j] != '{' && b[j] != '}' {
						break
					}
				}
			}
			want := n.Do(t, "CLUSTER", "KEYSLOT", string(b)).(int64)
			if got := hashSlot(b); int64(got) != want {
				t.Fatalf("tag %d %q: hashSlot() = %d, CLUSTER KEYSLOT = %d", i, b, got, want)
			}
		}
		// Our keys: the slot Redis computes from the whole key is the slot
		// of the hash tag, and hashSlotOf's, whatever the zone's name.
		for i := range 50 {
			id := freshKey(t)
			if i%5 == 0 {
				id = keyOf(t, "10.0.0."+string(rune('0'+i%10)))
			}
			k := s.Key([]string{"zone.x", "a{b}c", "api/v1", "z"}[i%4], id)
			want := n.Do(t, "CLUSTER", "KEYSLOT", k).(int64)
			if got := hashSlot(hashTag(k)); int64(got) != want {
				t.Fatalf("key %q: hashSlot(hashTag) = %d, CLUSTER KEYSLOT = %d", k, got, want)
			}
			if got := hashSlotOf(id); int64(got) != want {
				t.Fatalf("key %q: hashSlotOf = %d, CLUSTER KEYSLOT = %d", k, got, want)
			}
		}
	})

	t.Run("exact under concurrency", func(t *testing.T) {
		l := limit(t, 20, time.Hour, 0)
		nodes := map[int]bool{}
		for round := range 20 {
			key := keyOnNode(t, s, c, round%len(c.Nodes))
			nodes[nodeOf(c, hashSlot(hashTag(s.Key("exact", key))))] = true
			allowed, refused, errs := concurrentRound(s, l, key, 50)
			if errs != 0 || allowed != 20 || refused != 30 {
				t.Fatalf("round %d: %d allowed, %d refused, %d errors; want exactly 20, 30, 0", round, allowed, refused, errs)
			}
		}
		if len(nodes) != len(c.Nodes) {
			t.Fatalf("rounds covered nodes %v only", nodes)
		}
	})

	t.Run("one script per slot", func(t *testing.T) {
		l := limit(t, 100, time.Hour, 0)
		x, y := keyOnNode(t, s, c, 0), keyOnNode(t, s, c, 1)
		for _, tc := range []struct {
			name string
			reqs []algorithms.Request
			want []int64 // script calls per node
		}{
			{"3 zones one identity", []algorithms.Request{{Zone: "a", Key: x}, {Zone: "b", Key: x}, {Zone: "c", Key: x}}, []int64{1, 0, 0}},
			{"2 identities 2 nodes", []algorithms.Request{{Zone: "a", Key: x}, {Zone: "a", Key: y}}, []int64{1, 1, 0}},
			{"3+1 zones 2 nodes", []algorithms.Request{{Zone: "a", Key: x}, {Zone: "b", Key: y}, {Zone: "c", Key: x}, {Zone: "d", Key: x}}, []int64{1, 1, 0}},
		} {
			for i := range tc.reqs {
				tc.reqs[i].Limit, tc.reqs[i].Cost = l, 1
			}
			before := make([]int64, len(c.Nodes))
			for i, n := range c.Nodes {
				before[i] = scriptCalls(t, n)
			}
			out := take(t, s, tc.reqs...)
			for i, d := range out {
				if !d.Allowed {
					t.Fatalf("%s: zone %d refused: %+v", tc.name, i, d)
				}
			}
			got := make([]int64, len(c.Nodes))
			for i, n := range c.Nodes {
				got[i] = scriptCalls(t, n) - before[i]
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("%s: script calls per node %v, want %v", tc.name, got, tc.want)
			}
		}
	})

	t.Run("cross-slot all-or-nothing", func(t *testing.T) {
		x, y := keyOnNode(t, s, c, 0), keyOnNode(t, s, c, 1)
		a := algorithms.Request{Zone: "a", Key: x, Limit: limit(t, 10, time.Hour, 0), Cost: 1}
		b := algorithms.Request{Zone: "b", Key: y, Limit: limit(t, 1, time.Hour, 0), Cost: 1}
		keyA, keyB := s.Key("a", x), s.Key("b", y)
		if hashSlot(hashTag(keyA)) == hashSlot(hashTag(keyB)) {
			t.Fatal("identities in one slot")
		}
		tA := time.Now() // before every charge below: bounds the refill Redis's clock saw
		take(t, s, b)    // b is empty now
		if d := take(t, s, a)[0]; !d.Allowed || d.Remaining != 9 {
			t.Fatalf("a alone: %+v", d)
		}
		rawA := getRaw(t, cc, keyA)
		stA := parseState(t, rawA)

		// a's slot first: a is charged, b refuses, a is refunded.
		c0, c1 := scriptCalls(t, c.Nodes[0]), scriptCalls(t, c.Nodes[1])
		out := take(t, s, a, b)
		e := time.Since(tA).Milliseconds() + 2
		if !out[0].Allowed || out[0].Remaining != 9 || out[0].Limit != 10 {
			t.Errorf("a (charged then refunded): %+v; want allowed, remaining 9", out[0])
		}
		if out[1].Allowed || !msBetween(out[1].RetryAfter, 3600000-e, 3600000) {
			t.Errorf("b: %+v; want refused, retry ≈ 1h", out[1])
		}
		after := parseState(t, getRaw(t, cc, keyA))
		// The refund leaves a's debt as it was, minus only what refilled
		// since (10 units per ms at 10 per hour).
		if after.scale != stA.scale || after.debt > stA.debt || stA.debt-after.debt > e*10 || after.at < stA.at || after.at > stA.at+e {
			t.Errorf("a's state %+v after the refund, %+v before (%dms elapsed at most): not refunded", after, stA, e)
		}
		n0, n1 := scriptCalls(t, c.Nodes[0])-c0, scriptCalls(t, c.Nodes[1])-c1
		t.Logf("a's slot first: script calls node0 (a) %d, node1 (b) %d; a's debt %d → %d (refilled %d units in ≤%dms)",
			n0, n1, stA.debt, after.debt, stA.debt-after.debt, e)
		if n0 != 2 || n1 != 1 {
			t.Errorf("script calls: a's node %d (want 2: charge, refund), b's node %d (want 1)", n0, n1)
		}
		if d := take(t, s, a)[0]; !d.Allowed || d.Remaining != 8 {
			t.Errorf("a alone afterwards: %+v; want allowed, remaining 8 (charged once in all)", d)
		}

		// b's slot first: the slots run at once, whatever their order; a is
		// charged and refunded as before.
		c0, c1 = scriptCalls(t, c.Nodes[0]), scriptCalls(t, c.Nodes[1])
		out = take(t, s, b, a)
		if out[0].Allowed || !out[1].Allowed || out[1].Limit != 10 || out[1].Remaining != 8 {
			t.Errorf("b then a: %+v; want b refused, a allowed with 8 remaining (refunded)", out)
		}
		if n0, n1 := scriptCalls(t, c.Nodes[0])-c0, scriptCalls(t, c.Nodes[1])-c1; n0 != 2 || n1 != 1 {
			t.Errorf("b then a: script calls a's node %d (want 2: charge, refund), b's node %d (want 1)", n0, n1)
		}
		if d := take(t, s, a)[0]; !d.Allowed || d.Remaining != 7 {
			t.Errorf("a alone afterwards: %+v; want allowed, remaining 7 (nothing left of the refunded charge)", d)
		}
	})

	// The handler hands Take a pooled decision slice that still holds the
	// previous request's decisions (handler.go: scratch.sizeDecs reslices
	// without zeroing). A zone charged and refunded reports its own
	// decision, not a stale one.
	t.Run("cross-slot refunded zone with a reused out slice", func(t *testing.T) {
		x, y := keyOnNode(t, s, c, 0), keyOnNode(t, s, c, 1)
		a := algorithms.Request{Zone: "a", Key: x, Limit: limit(t, 10, time.Hour, 0), Cost: 1}
		b := algorithms.Request{Zone: "b", Key: y, Limit: limit(t, 1, time.Hour, 0), Cost: 1}
		take(t, s, b) // b is empty now
		stale := algorithms.Decision{Allowed: false, Limit: 3, Remaining: 0, RetryAfter: 5 * time.Hour, ResetAfter: 9 * time.Hour}
		out := []algorithms.Decision{stale, stale}
		if err := s.Take(context.Background(), []algorithms.Request{b, a}, out); err != nil {
			t.Fatal(err)
		}
		if out[0].Allowed {
			t.Fatalf("b: %+v, want refused", out[0])
		}
		if d := out[1]; !d.Allowed || d.Limit != 10 || d.Remaining != 10 || d.RetryAfter != 0 {
			t.Errorf("a (charged and refunded): %+v; want allowed, limit 10, 10 remaining, not the previous request's decision", d)
		}
	})

	// The refund window: while a cross-slot request charges a's slot, runs
	// b's and refunds a, a concurrent reader of a sees the charge.
	t.Run("refund window", func(t *testing.T) {
		x, y := keyOnNode(t, s, c, 0), keyOnNode(t, s, c, 1)
		one := limit(t, 1, time.Hour, 0)
		a := algorithms.Request{Zone: "w", Key: x, Limit: one, Cost: 1}
		b := algorithms.Request{Zone: "wb", Key: y, Limit: one, Cost: 1}
		peek := algorithms.Request{Zone: "w", Key: x, Limit: one, Cost: 2} // cost > capacity: reads, never charges
		take(t, s, b)                                                      // b is empty now

		var stop atomic.Bool
		var seen, charged, peekErrs int
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			out := make([]algorithms.Decision, 1)
			for !stop.Load() {
				if err := s.Take(context.Background(), []algorithms.Request{peek}, out); err != nil {
					peekErrs++
					continue
				}
				seen++
				if out[0].Remaining == 0 {
					charged++
				}
			}
		}()
		const n = 300
		durs := make([]time.Duration, 0, n)
		for i := range n {
			out := make([]algorithms.Decision, 2)
			start := time.Now()
			if err := s.Take(context.Background(), []algorithms.Request{a, b}, out); err != nil {
				t.Fatalf("cross-slot take %d: %v", i, err)
			}
			durs = append(durs, time.Since(start))
			if !out[0].Allowed || out[0].Remaining != 1 || out[1].Allowed {
				t.Fatalf("cross-slot take %d: %+v", i, out)
			}
		}
		stop.Store(true)
		wg.Wait()
		slices.Sort(durs)
		t.Logf("refund window: %d of %d concurrent reads of a (%.1f%%) saw the transient charge during %d refused cross-slot Takes; "+
			"a cross-slot refusal takes p50 %v, p99 %v (charge a, run b, refund a: 3 sequential round trips; the window is about 2 of them)",
			charged, seen, 100*float64(charged)/float64(max(seen, 1)), n, durs[n/2], durs[n*99/100])
		if peekErrs != 0 || seen == 0 {
			t.Fatalf("reader: %d errors, %d reads", peekErrs, seen)
		}
		// Nothing leaked: a is full again.
		if d := take(t, s, peek)[0]; d.Remaining != 1 {
			t.Fatalf("a after the refunds: %+v; want remaining 1 (full)", d)
		}
		if d := take(t, s, a)[0]; !d.Allowed {
			t.Fatalf("a after the refunds: %+v; want allowed", d)
		}
	})

	// When a later slot's node fails (here: frozen, so it times out), the
	// slots already charged are refunded and the Take returns an error
	// within its timeout. (Last: it freezes a node.)
	t.Run("cross-slot error refunds", func(t *testing.T) {
		const timeout = 100 * time.Millisecond
		fast := newClusterStore(t, c.Addrs(), timeout)
		x, y := keyOnNode(t, s, c, 0), keyOnNode(t, s, c, 1)
		a := algorithms.Request{Zone: "ea", Key: x, Limit: limit(t, 10, time.Hour, 0), Cost: 1}
		b := algorithms.Request{Zone: "eb", Key: y, Limit: limit(t, 10, time.Hour, 0), Cost: 1}
		tA := time.Now()
		take(t, fast, a, b) // both slots known and warm
		keyA := s.Key(a.Zone, a.Key)
		before := parseState(t, getRaw(t, cc, keyA))
		c.Nodes[1].Freeze(t)
		el, err := timedTake(t, context.Background(), fast, []algorithms.Request{a, b}, make([]algorithms.Decision, 2))
		c.Nodes[1].Thaw(t)
		if err == nil || el > 2*timeout+failMargin {
			t.Fatalf("Take with b's node frozen: error %v after %v; want an error within the timeout (+ the refund's)", err, el)
		}
		// The timeout is b's node's failure, counted by its breaker alone.
		for _, ns := range fast.Nodes() {
			if want := int64(0); ns.Node == c.Nodes[1].Addr && ns.Failures != 1 || ns.Node != c.Nodes[1].Addr && ns.Failures != want {
				t.Errorf("node %s: %d failures counted; want 1 for the frozen node, 0 for the others", ns.Node, ns.Failures)
			}
		}
		after := parseState(t, getRaw(t, cc, keyA))
		e := time.Since(tA).Milliseconds() + 2
		if after.debt > before.debt || before.debt-after.debt > e*10 {
			t.Fatalf("a's state %+v after the failed Take, %+v before: the charge of a was not refunded", after, before)
		}
		c.WaitHealthy(t)
	})
}
