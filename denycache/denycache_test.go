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

func refusal(r time.Duration) algorithms.Decision {
	return algorithms.Decision{Limit: 5, RetryAfter: r, ResetAfter: 2 * r}
}

func TestLookupRules(t *testing.T) {
	c := New(100)
	now := Now()
	c.Remember("z", key(1), lim, 2, now, refusal(time.Second))
	until := now + int64(time.Second-Margin(time.Second))
	if _, ok := c.Lookup("z", key(1), lim, 2, now); !ok {
		t.Fatal("same cost: miss")
	}
	if d, ok := c.Lookup("z", key(1), lim, 3, now+int64(500*time.Millisecond)); !ok || d.Allowed || d.RetryAfter != 500*time.Millisecond {
		t.Fatalf("higher cost halfway: %+v %v, want refused with 500ms", d, ok)
	}
	if _, ok := c.Lookup("z", key(1), lim, 1, now); ok {
		t.Fatal("lower cost: hit (the store may admit it)")
	}
	if _, ok := c.Lookup("y", key(1), lim, 2, now); ok {
		t.Fatal("other zone: hit")
	}
	if _, ok := c.Lookup("z", key(1), lim, 2, until-1); !ok {
		t.Fatal("just before until: miss")
	}
	if _, ok := c.Lookup("z", key(1), lim, 2, until); ok {
		t.Fatal("at until: hit")
	}
	if c.Len() != 0 {
		t.Fatalf("expired entry kept: %d", c.Len())
	}
	// Another limit drops the entry.
	c.Remember("z", key(2), lim, 1, now, refusal(time.Second))
	other := lim
	other.Events = 10
	if _, ok := c.Lookup("z", key(2), other, 1, now); ok {
		t.Fatal("changed limit: hit")
	}
	if _, ok := c.Lookup("z", key(2), lim, 1, now); ok {
		t.Fatal("changed limit did not drop the entry")
	}
	// Forget, Clear, short refusals, nil.
	c.Remember("z", key(3), lim, 1, now, refusal(time.Second))
	c.Forget("z", key(3))
	if _, ok := c.Lookup("z", key(3), lim, 1, now); ok || c.Len() != 0 {
		t.Fatal("Forget kept the entry")
	}
	c.Remember("z", key(4), lim, 1, now, refusal(time.Millisecond))
	if c.Len() != 0 {
		t.Fatal("a 1ms refusal was remembered")
	}
	c.Remember("z", key(5), lim, 1, now, refusal(time.Second))
	c.Clear()
	if c.Active() || c.Len() != 0 {
		t.Fatal("Clear kept entries")
	}
	var off *Cache = New(0)
	off.Remember("z", key(1), lim, 1, now, refusal(time.Second))
	if _, ok := off.Lookup("z", key(1), lim, 1, now); ok || off.Active() {
		t.Fatal("a disabled cache answered")
	}
}

// TestBounded: the cache never holds more than its size; a full shard drops
// its expired entries first, then the one expiring soonest.
func TestBounded(t *testing.T) {
	c := New(64)
	now := Now()
	for i := range 10000 {
		c.Remember("z", key(i), lim, 1, now, refusal(time.Duration(1+i%50)*time.Second))
		if c.Len() > c.Cap() {
			t.Fatalf("after %d entries: %d held, cap %d", i+1, c.Len(), c.Cap())
		}
	}
	held := 0
	for i := range 10000 {
		if _, ok := c.Lookup("z", key(i), lim, 1, now); ok {
			held++
		}
	}
	if held != c.Len() || held > 64 || held < 32 {
		t.Fatalf("%d entries answer, Len %d, cap %d", held, c.Len(), c.Cap())
	}
	// Expired entries go first: fill with short ones, then later long ones
	// all fit.
	c = New(320) // 10 a shard
	for i := range 320 {
		c.Remember("z", key(i), lim, 1, now, refusal(10*time.Millisecond))
	}
	later := now + int64(time.Second)
	for i := 1000; i < 1064; i++ { // 64 over 32 shards: no shard gets 10
		c.Remember("z", key(i), lim, 1, later, refusal(time.Minute))
	}
	kept := 0
	for i := 1000; i < 1064; i++ {
		if _, ok := c.Lookup("z", key(i), lim, 1, later); ok {
			kept++
		}
	}
	if kept != 64 {
		t.Fatalf("only %d of 64 live entries kept: expired entries were not evicted first", kept)
	}
}

func BenchmarkLookupMiss(b *testing.B) {
	c := New(DefaultSize)
	now := Now()
	c.Remember("z", key(1), lim, 1, now, refusal(time.Hour))
	b.ReportAllocs()
	for b.Loop() {
		c.Lookup("zone", key(2), lim, 1, now)
	}
}

func BenchmarkLookupHit(b *testing.B) {
	c := New(DefaultSize)
	now := Now()
	c.Remember("z", key(1), lim, 1, now, refusal(time.Hour))
	b.ReportAllocs()
	for b.Loop() {
		c.Lookup("z", key(1), lim, 1, now)
	}
}
