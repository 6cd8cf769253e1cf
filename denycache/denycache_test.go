package denycache

import (
	"testing"
	"time"

	"github.com/sluicehq/caddy-sluice/algorithms"
)

func key(i int) algorithms.Key {
	var k algorithms.Key
	k[0], k[1], k[2], k[3] = 'h', byte(i), byte(i>>8), byte(i>>16)
	return k
}

var lim = algorithms.Limit{Algorithm: algorithms.TokenBucket, Events: 5, Window: 60000}

// t0 is a store time (Unix ms) for the tests.
const t0 = 1_700_000_000_000

// spent is a token bucket state of lim with n tokens spent at t0.
func spent(n int64) algorithms.State {
	return algorithms.State{Alg: algorithms.TokenBucket, Debt: n * lim.Window, At: t0, Scale: lim.Window}
}

// storeAnswer is what the store answers to reqs against states at store
// time now (the script's rule: Step per zone, zones that allow shown as
// they stand when an enforcing zone refuses).
func storeAnswer(reqs []algorithms.Request, states []algorithms.State, now int64) []algorithms.Decision {
	out := make([]algorithms.Decision, len(reqs))
	refused := false
	for i := range reqs {
		out[i], _, _ = algorithms.Step(states[i], false, reqs[i].Limit, now, reqs[i].Cost)
		refused = refused || (!out[i].Allowed && !reqs[i].ReportOnly)
	}
	for i := range reqs {
		if refused && out[i].Allowed {
			out[i], _, _ = algorithms.Step(states[i], false, reqs[i].Limit, now, 0)
		}
		out[i].Limit = reqs[i].Limit.Capacity()
	}
	return out
}

// remember records the store's answer to reqs against states at store
// time t0, the call having started at local instant start.
func remember(c *Cache, tok Token, start int64, reqs []algorithms.Request, states []algorithms.State) []algorithms.Decision {
	out := storeAnswer(reqs, states, t0)
	snaps := make([]Snapshot, len(reqs))
	for i := range reqs {
		snaps[i] = Snapshot{State: states[i], Known: true}
	}
	c.Remember(tok, start, t0, reqs, out, snaps)
	return out
}

func armed(size int) *Cache {
	c := New(size)
	c.Arm()
	return c
}

// TestDecideIsTheStoresAnswer: a request refused by the store is answered
// locally exactly as the store answers it, for any cost, at any later
// time, as long as it refuses; otherwise the cache misses.
func TestDecideIsTheStoresAnswer(t *testing.T) {
	c := armed(100)
	start := Now()
	r := algorithms.Request{Zone: "z", Key: key(1), Limit: lim, Cost: 2}
	st := []algorithms.State{spent(4)} // 1 token left: cost 2 refused for 12 s
	first := remember(c, c.Token(), start, []algorithms.Request{r}, st)
	if first[0].Allowed || first[0].RetryAfter != 12*time.Second {
		t.Fatalf("the store's refusal: %+v", first[0])
	}
	for _, tc := range []struct {
		cost  int64
		after time.Duration
		hit   bool
	}{
		{2, 0, true},
		{5, 0, true},                // needs 5: 48 s
		{6, 0, true},                // above the capacity: a window
		{1, 0, false},               // payable: the store decides
		{2, 6 * time.Second, true},  // halfway
		{2, 11 * time.Second, true}, // 1 s left
		{2, 12 * time.Second, false},
		{2, 12*time.Second - 12*time.Millisecond, false}, // within the conservative margin (1ms + 0.1%)
		{2, 12*time.Second - 13*time.Millisecond, true},
	} {
		c := armed(100)
		remember(c, c.Token(), start, []algorithms.Request{r}, st)
		q := r
		q.Cost = tc.cost
		out := make([]algorithms.Decision, 1)
		hit := c.Decide([]algorithms.Request{q}, start+int64(tc.after), out)
		if hit != tc.hit {
			t.Errorf("cost %d after %v: hit %v, want %v", tc.cost, tc.after, hit, tc.hit)
			continue
		}
		if !hit {
			if c.Len() != 0 {
				t.Errorf("cost %d after %v: a miss kept the entry", tc.cost, tc.after)
			}
			continue
		}
		want := storeAnswer([]algorithms.Request{q}, st, t0+tc.after.Milliseconds())
		if out[0] != want[0] {
			t.Errorf("cost %d after %v: %+v, want the store's %+v", tc.cost, tc.after, out[0], want[0])
		}
	}
}

// TestDecideSeveralZones: a refusal is answered only when every zone of
// the request is known, with each zone's own numbers (a zone that would
// allow shown as it stands; a report-only zone never refusing for the
// others).
func TestDecideSeveralZones(t *testing.T) {
	c := armed(100)
	start := Now()
	other := algorithms.Limit{Algorithm: algorithms.FixedWindow, Events: 10, Window: 3_600_000}
	a := algorithms.Request{Zone: "a", Key: key(1), Limit: lim, Cost: 1}
	b := algorithms.Request{Zone: "b", Key: key(1), Limit: other, Cost: 3}
	fw := algorithms.State{Alg: algorithms.FixedWindow, Debt: 4, At: t0 - t0%3_600_000, Scale: 3_600_000}
	reqs := []algorithms.Request{a, b}
	states := []algorithms.State{spent(5), fw}
	remember(c, c.Token(), start, reqs, states)
	out := make([]algorithms.Decision, 2)
	if !c.Decide(reqs, start, out) {
		t.Fatal("the same request: miss")
	}
	want := storeAnswer(reqs, states, t0)
	if out[0] != want[0] || out[1] != want[1] || !out[1].Allowed || out[1].Remaining != 6 {
		t.Fatalf("got %+v, want %+v (b shown with 6 left, nothing charged)", out, want)
	}
	// b alone is allowed: the store decides (and may charge it: b's entry
	// goes, a's stays).
	if c.Decide([]algorithms.Request{b}, start, out) || c.Len() != 1 {
		t.Fatalf("b alone: answered, or entries %d (want 1)", c.Len())
	}
	// Now b is unknown: the pair misses (and drops a's entry).
	if c.Decide(reqs, start, out) || c.Len() != 0 {
		t.Fatalf("a with an unknown b: answered, or entries %d (want 0)", c.Len())
	}
	// A report-only zone that refuses vetoes nothing: miss.
	ro := a
	ro.ReportOnly = true
	remember(c, c.Token(), start, []algorithms.Request{ro, b}, states)
	if c.Len() != 0 {
		t.Fatal("an allowed request (its only refusal report-only) was remembered")
	}
}

// TestGeneration: a refusal read before a Clear or a Forget is not stored
// after it, nor one read before the cache was armed; a changed limit
// misses and drops the entry.
func TestGeneration(t *testing.T) {
	c := New(100)
	r := []algorithms.Request{{Zone: "z", Key: key(1), Limit: lim, Cost: 1}}
	st := []algorithms.State{spent(5)}
	out := make([]algorithms.Decision, 1)
	remember(c, c.Token(), Now(), r, st)
	if c.Len() != 0 || c.Armed() {
		t.Fatal("an unarmed cache stored a refusal")
	}
	c.Arm()
	tok := c.Token()
	c.Clear()
	remember(c, tok, Now(), r, st)
	if c.Len() != 0 {
		t.Fatal("a refusal read before a Clear was stored after it")
	}
	tok = c.Token()
	c.Forget("other", key(9))
	remember(c, tok, Now(), r, st)
	if c.Len() != 0 {
		t.Fatal("a refusal read before a Forget was stored after it")
	}
	remember(c, c.Token(), Now(), r, st)
	if !c.Decide(r, Now(), out) {
		t.Fatal("a current refusal: miss")
	}
	c.Forget("z", key(1))
	if c.Decide(r, Now(), out) || c.Len() != 0 {
		t.Fatal("Forget kept the entry")
	}
	remember(c, c.Token(), Now(), r, st)
	raised := []algorithms.Request{r[0]}
	raised[0].Limit.Events = 10
	if c.Decide(raised, Now(), out) || c.Len() != 0 {
		t.Fatal("a changed limit: answered, or kept the entry")
	}
	remember(c, c.Token(), Now(), r, st)
	c.Clear()
	if c.Active() || c.Len() != 0 {
		t.Fatal("Clear kept entries")
	}
	var off *Cache = New(0)
	off.Arm()
	remember(off, off.Token(), Now(), r, st)
	if off.Decide(r, Now(), out) || off.Active() {
		t.Fatal("a disabled cache answered")
	}
}

// TestSlidingLogBounds: a sliding log state is kept only when short, within
// the shard's budget, and a local answer never writes to the kept entries.
func TestSlidingLogBounds(t *testing.T) {
	sl := algorithms.Limit{Algorithm: algorithms.SlidingLog, Events: 100, Window: 3_600_000}
	logOf := func(n int) algorithms.State {
		lg := &algorithms.Log{}
		for i := range n {
			lg.Entries = append(lg.Entries, algorithms.LogEntry{At: t0 - int64(n-i), Cost: 1})
		}
		return algorithms.State{Alg: algorithms.SlidingLog, Log: lg}
	}
	c := armed(1000) // 32 entries a shard: 256 log events
	for _, n := range []int{MaxLogEntries, MaxLogEntries + 1} {
		r := []algorithms.Request{{Zone: "l", Key: key(n), Limit: sl, Cost: int64(100 - n + 1)}}
		remember(c, c.Token(), Now(), r, []algorithms.State{logOf(n)})
		out := make([]algorithms.Decision, 1)
		if hit := c.Decide(r, Now(), out); hit != (n <= MaxLogEntries) {
			t.Errorf("a log of %d entries: hit %v", n, hit)
		}
	}
	// The budget: 8 entries per entry of capacity, per shard (64 entries
	// in a 1-entry-a-shard cache of 8 events a shard fit nowhere).
	small := armed(shards)
	r := []algorithms.Request{{Zone: "l", Key: key(1), Limit: sl, Cost: 100}}
	remember(small, small.Token(), Now(), r, []algorithms.State{logOf(9)})
	if small.Len() != 0 {
		t.Error("a log over the shard's budget was kept")
	}
	// Concurrent local answers admitting on the same kept log (the zone
	// allows, another refuses) under -race.
	c = armed(100)
	two := []algorithms.Request{{Zone: "l", Key: key(1), Limit: sl, Cost: 1}, {Zone: "z", Key: key(1), Limit: lim, Cost: 1}}
	remember(c, c.Token(), Now(), two, []algorithms.State{logOf(10), spent(5)})
	done := make(chan bool)
	for range 4 {
		go func() {
			ok := true
			out := make([]algorithms.Decision, 2)
			for range 200 {
				ok = ok && c.Decide(two, Now(), out) && out[0].Remaining == 90
			}
			done <- ok
		}()
	}
	for range 4 {
		if !<-done {
			t.Fatal("a local answer with a sliding log zone: miss, or wrong")
		}
	}
}

// TestBounded: the cache never holds more than its size; a full shard drops
// its expired entries first, then the one expiring soonest.
func TestBounded(t *testing.T) {
	c := armed(64)
	now := Now()
	out := make([]algorithms.Decision, 1)
	for i := range 10000 {
		remember(c, c.Token(), now, []algorithms.Request{{Zone: "z", Key: key(i), Limit: lim, Cost: 1}}, []algorithms.State{spent(5)})
		if c.Len() > c.Cap() {
			t.Fatalf("after %d entries: %d held, cap %d", i+1, c.Len(), c.Cap())
		}
	}
	held := 0
	for i := range 10000 {
		if c.Decide([]algorithms.Request{{Zone: "z", Key: key(i), Limit: lim, Cost: 1}}, now, out) {
			held++
		}
	}
	if held != c.Len() || held > 64 || held < 32 {
		t.Fatalf("%d entries answer, Len %d, cap %d", held, c.Len(), c.Cap())
	}
	// Expired entries go first: fill with short ones (1 token spent of 1
	// per 10 ms), then later long ones all fit.
	fast := algorithms.Limit{Algorithm: algorithms.TokenBucket, Events: 1, Window: 10}
	c = armed(320) // 10 a shard
	for i := range 320 {
		st := algorithms.State{Alg: algorithms.TokenBucket, Debt: 10, At: t0, Scale: 10}
		remember(c, c.Token(), now, []algorithms.Request{{Zone: "z", Key: key(i), Limit: fast, Cost: 1}}, []algorithms.State{st})
	}
	later := now + int64(time.Second)
	for i := 1000; i < 1064; i++ { // 64 over 32 shards: no shard gets 10
		remember(c, c.Token(), later, []algorithms.Request{{Zone: "z", Key: key(i), Limit: lim, Cost: 1}}, []algorithms.State{spent(5)})
	}
	kept := 0
	for i := 1000; i < 1064; i++ {
		if c.Decide([]algorithms.Request{{Zone: "z", Key: key(i), Limit: lim, Cost: 1}}, later, out) {
			kept++
		}
	}
	if kept != 64 {
		t.Fatalf("only %d of 64 live entries kept: expired entries were not evicted first", kept)
	}
}

func BenchmarkDecideMiss(b *testing.B) {
	c := armed(DefaultSize)
	now := Now()
	remember(c, c.Token(), now, []algorithms.Request{{Zone: "z", Key: key(1), Limit: lim, Cost: 1}}, []algorithms.State{spent(5)})
	reqs := []algorithms.Request{{Zone: "zone", Key: key(2), Limit: lim, Cost: 1}}
	out := make([]algorithms.Decision, 1)
	b.ReportAllocs()
	for b.Loop() {
		c.Decide(reqs, now, out)
	}
}

func BenchmarkDecideHit(b *testing.B) {
	c := armed(DefaultSize)
	now := Now()
	reqs := []algorithms.Request{{Zone: "z", Key: key(1), Limit: lim, Cost: 1}}
	remember(c, c.Token(), now, reqs, []algorithms.State{spent(5)})
	out := make([]algorithms.Decision, 1)
	b.ReportAllocs()
	for b.Loop() {
		if !c.Decide(reqs, now, out) {
			b.Fatal("miss")
		}
	}
}
