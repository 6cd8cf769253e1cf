package memstore

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"unsafe"

	"github.com/sluicehq/caddy-sluice/algorithms"
)

// The layout the memory budget rests on: a 24-byte key, a 40-byte entry,
// neither holding a pointer (so the map is never scanned by the GC).
func TestLayout(t *testing.T) {
	if k, e := unsafe.Sizeof(mapKey{}), unsafe.Sizeof(entry{}); k != 24 || e != 40 {
		t.Fatalf("mapKey %d bytes, entry %d bytes; want 24 and 40", k, e)
	}
}

// An entry gives back exactly the state it was given, for every algorithm,
// at the extremes of every field a valid limit can produce.
func TestEntryRoundTrip(t *testing.T) {
	log := &algorithms.Log{Entries: []algorithms.LogEntry{{At: 5, Cost: 1}}}
	states := []algorithms.State{
		{Alg: algorithms.TokenBucket, Debt: algorithms.MaxScaled, At: t0, Scale: algorithms.MaxRefill},
		{Alg: algorithms.TokenBucket, Debt: 0, At: -1, Scale: 1},
		{Alg: algorithms.GCRA, Debt: algorithms.MaxGCRAUnit - 1, At: 1<<62 - 1, Scale: algorithms.MaxGCRAUnit},
		{Alg: algorithms.FixedWindow, Debt: algorithms.MaxScaled / 2, At: -algorithms.MaxRefill, Scale: algorithms.MaxRefill},
		{Alg: algorithms.SlidingWindow, Debt: algorithms.MaxScaled, Prev: algorithms.MaxScaled, At: t0, Scale: algorithms.MaxRefill},
		{Alg: algorithms.SlidingLog, Log: log},
	}
	for _, st := range states {
		var sh shard
		sh.m = map[mapKey]entry{}
		k := mapKey{zone: 7, key: keyOf(1)}
		sh.set(k, &st, -3)
		got, ok := sh.get(k)
		if !ok || got != st || sh.m[k].fullAt != -3 {
			t.Errorf("%s: stored %+v, got back %+v (held %v, fullAt %d)", st.Alg, st, got, ok, sh.m[k].fullAt)
		}
	}
	// A Scale no valid limit produces is stored as no state, never as
	// another algorithm's.
	var sh shard
	sh.m = map[mapKey]entry{}
	sh.set(mapKey{}, &algorithms.State{Alg: algorithms.GCRA, Scale: 1 << 60, Debt: 3}, 0)
	if got, _ := sh.get(mapKey{}); got.Alg != algorithms.GCRA || got.Scale != 0 {
		t.Fatalf("out-of-range scale: got %+v, want GCRA with Scale 0", got)
	}
}

// logsConsistent checks that every shard's side table holds exactly the
// logs of its sliding_log keys.
func logsConsistent(t *testing.T, s *Store) (logs int) {
	t.Helper()
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n := 0
		for k, e := range sh.m {
			if e.alg() == algorithms.SlidingLog {
				if sh.logs[k] == nil {
					t.Errorf("shard %d: sliding log key without its log", i)
				}
				n++
			}
		}
		if len(sh.logs) != n {
			t.Errorf("shard %d: %d logs for %d sliding log keys", i, len(sh.logs), n)
		}
		logs += n
		sh.mu.Unlock()
	}
	return logs
}

// A sliding log lives as long as its key: sweeping, evicting and resetting
// the key, or switching its zone to another algorithm, drops the log too,
// and switching back starts a fresh one.
func TestSlidingLogsFollowTheirKeys(t *testing.T) {
	s, clock := newTestStore(t, evictionSample*numShards) // each insertion into a full shard looks at all its keys
	logL := algorithms.Limit{Algorithm: algorithms.SlidingLog, Events: 2, Window: 1000}
	tb := algorithms.Limit{Algorithm: algorithms.TokenBucket, Events: 2, Window: 1000}
	for i := range 60 {
		take1(t, s, req("log", keyOf(i), logL, 1))
	}
	if n := logsConsistent(t, s); n != 60 || s.Len() != 60 {
		t.Fatalf("%d logs, %d keys for 60 keys", n, s.Len())
	}
	// Switch half the keys to the token bucket, and back one of them.
	for i := range 30 {
		if d := take1(t, s, req("log", keyOf(i), tb, 1)); !d.Allowed || d.Remaining != 1 {
			t.Fatalf("switched key %d: %+v, want a fresh bucket", i, d)
		}
	}
	if d := take1(t, s, req("log", keyOf(0), logL, 1)); !d.Allowed || d.Remaining != 1 {
		t.Fatalf("switched back: %+v, want a fresh log", d)
	}
	if n := logsConsistent(t, s); n != 31 {
		t.Fatalf("%d logs after switching 29 keys away, want 31", n)
	}
	// Reset 10 token buckets and 10 logs.
	for i := 20; i < 40; i++ {
		if !s.Reset("log", keyOf(i)) {
			t.Fatalf("Reset of key %d found no state", i)
		}
	}
	if n := logsConsistent(t, s); n != 21 || s.Len() != 40 {
		t.Fatalf("%d logs, %d keys after Reset, want 21 and 40", n, s.Len())
	}
	// Eviction: a flood of new token bucket keys fills every shard and
	// displaces the logs (the logs are closest to full).
	clock.Advance(500)
	for i := 1000; i < 1000+evictionSample*numShards*4; i++ {
		take1(t, s, req("flood", keyOf(i), algorithms.Limit{Events: 1, Window: hour}, 1))
	}
	if n := logsConsistent(t, s); n != 0 || !held(s, "flood", keyOf(999+evictionSample*numShards*4)) {
		t.Fatalf("%d logs survive a flood of longer-lived keys", n)
	}
	// Sweep.
	s2, clock2 := newTestStore(t, 0)
	for i := range 100 {
		take1(t, s2, req("log", keyOf(i), logL, 1))
	}
	clock2.Advance(1000)
	s2.Sweep()
	if n := logsConsistent(t, s2); n != 0 || s2.Len() != 0 {
		t.Fatalf("after the sweep: %d logs, %d keys", n, s2.Len())
	}
}

// Zones get their numbers concurrently, from single- and multi-zone
// requests at once, while Keys lists them: every (zone, key) is stored
// once, under its own zone's name, and reading an unknown zone numbers
// nothing.
func TestZoneIndexConcurrent(t *testing.T) {
	s, _ := newTestStore(t, 0)
	const workers, zones, keys = 8, 40, 50
	l := algorithms.Limit{Events: 1000, Window: hour}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var listers sync.WaitGroup
	listers.Add(1)
	go func() { // Keys while zones are being numbered
		defer listers.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			s.Keys(func(zone string, _ algorithms.Key) {
				if zone == "" {
					t.Error("Keys reported a key without its zone's name")
				}
			})
		}
	}()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out := make([]algorithms.Decision, 2)
			for z := range zones {
				for k := range keys {
					// Every worker charges every (zone, key) once; odd
					// workers two zones at once.
					reqs := []algorithms.Request{req(fmt.Sprintf("z%d", z), keyOf(k), l, 1)}
					if w%2 == 1 {
						reqs = append(reqs, req(fmt.Sprintf("w%d", w), keyOf(z*keys+k), l, 1))
					}
					_ = s.Take(context.Background(), reqs, out)
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	listers.Wait()

	want := zones*keys + (workers/2)*zones*keys
	if s.Len() != want {
		t.Fatalf("Len %d, want %d", s.Len(), want)
	}
	if n := len(s.zones.names()); n != zones+workers/2 {
		t.Fatalf("%d zones numbered, want %d", n, zones+workers/2)
	}
	perZone := map[string]int{}
	s.Keys(func(zone string, _ algorithms.Key) { perZone[zone]++ })
	for z := range zones {
		if n := perZone[fmt.Sprintf("z%d", z)]; n != keys {
			t.Fatalf("zone z%d holds %d keys, want %d", z, n, keys)
		}
	}
	for w := 1; w < workers; w += 2 {
		if n := perZone[fmt.Sprintf("w%d", w)]; n != zones*keys {
			t.Fatalf("zone w%d holds %d keys, want %d", w, n, zones*keys)
		}
	}
	// Each key was charged exactly once per worker that named it.
	for z := range zones {
		if d, found := s.Peek(fmt.Sprintf("z%d", z), keyOf(3), l); !found || d.Remaining != 1000-workers {
			t.Fatalf("zone z%d: %+v found %v, want %d remaining", z, d, found, 1000-workers)
		}
	}

	// Reading or resetting an unknown zone gives it no number.
	if _, found := s.Peek("nope", keyOf(1), l); found {
		t.Fatal("Peek found state in an unknown zone")
	}
	if s.Reset("nope", keyOf(1)) {
		t.Fatal("Reset found state in an unknown zone")
	}
	if n, _ := s.ResetKeys(context.Background(), "nope", []algorithms.Key{keyOf(1)}); n != 0 {
		t.Fatalf("ResetKeys of an unknown zone: %d", n)
	}
	if _, ok := s.zones.lookup("nope"); ok {
		t.Fatal("reading an unknown zone numbered it")
	}
}
