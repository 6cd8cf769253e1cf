package memstore

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/caddy-sluice/algorithms"
)

// A settle takes the charge off the key's charges in flight, whether it
// gives back, charges on top or keeps the estimate, and charges on top a
// key forgotten meanwhile (swept or reset): nothing is left in flight and
// no debt is lost.
func TestSettleInFlight(t *testing.T) {
	l, err := algorithms.NewLimit(algorithms.TokenBucket, 1000, time.Hour, 0)
	if err != nil {
		t.Fatal(err)
	}
	s, clock := newTestStore(t, 0)
	clock.ms.Store(1_000_000)
	for i, c := range []struct {
		settle       bool
		settled      int64
		remaining    int64
		forgetBefore bool
	}{
		{true, 300, 700, false},
		{true, 30, 970, false},
		{false, 0, 900, false}, // no amount: the estimate stays
		{true, 300, 700, true},
	} {
		k := keyOf(100 + i)
		r := req("z", k, l, 100)
		r.Refundable, r.InFlight = true, true
		d := take1(t, s, r)
		if !d.Allowed {
			t.Fatalf("case %d: refused", i)
		}
		if c.forgetBefore {
			if _, err := s.ResetKeys(context.Background(), "z", []algorithms.Key{k}); err != nil {
				t.Fatal(err)
			}
		}
		rf := algorithms.Refund{Zone: "z", Key: k, Limit: l, Cost: 100, At: d.At, InFlight: true, Keep: !c.settle, Settle: c.settle, Settled: c.settled}
		if err := s.Settle(context.Background(), []algorithms.Refund{rf}); err != nil {
			t.Fatal(err)
		}
		id, _ := s.zones.lookup("z")
		mk := mapKey{zone: id, key: k}
		sh := s.shardOf(&mk)
		sh.mu.Lock()
		pending := sh.pending[mk]
		sh.mu.Unlock()
		if pending != 0 {
			t.Errorf("case %d: %d units still in flight after the settle", i, pending)
		}
		want := c.remaining
		if c.forgetBefore {
			want = 1000 - (c.settled - 100) // the extra on a fresh key
		}
		if got := view(s, "z", k, l).Remaining; got != want {
			t.Errorf("case %d: remaining %d, want %d", i, got, want)
		}
	}
}
