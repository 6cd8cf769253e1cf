package memstore

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/sluicehq/caddy-sluice/algorithms"
)

var conc3 = algorithms.Limit{Algorithm: algorithms.Concurrency, Events: 3, Window: 60_000}

// TestHandOverSlots: the slots an old store holds count in its heir; the
// old store's later grants and releases reach the heir; zones not handed
// over stay where they are.
func TestHandOverSlots(t *testing.T) {
	old, _ := newTestStore(t, 0)
	heir, _ := newTestStore(t, 0)
	key := keyOf(1)
	held := []algorithms.Request{creq("c", key, conc3, 1), creq("c", key, conc3, 2)}
	for _, r := range held {
		if !take1(t, old, r).Allowed {
			t.Fatal("a slot refused in the old store")
		}
	}
	take1(t, old, creq("other", key, conc3, 9))
	old.handOver(heir, []string{"c"})
	if got := heir.InUse("c", key); got != 2 {
		t.Fatalf("heir: %d slots in use after the handover, want 2", got)
	}
	if got := heir.InUse("other", key); got != 0 {
		t.Fatalf("heir: %d slots of a zone not handed over, want 0", got)
	}
	// The old configuration admits one more before it stops serving.
	late := creq("c", key, conc3, 3)
	if !take1(t, old, late).Allowed {
		t.Fatal("the old store refused its third slot")
	}
	if take1(t, heir, creq("c", key, conc3, 10)).Allowed {
		t.Fatal("the heir admitted a fourth request: the old store's three were not counted")
	}
	release(t, old, held[0])
	if got := heir.InUse("c", key); got != 2 {
		t.Fatalf("heir: %d slots in use after one old request ended, want 2", got)
	}
	if !take1(t, heir, creq("c", key, conc3, 11)).Allowed {
		t.Fatal("the heir refused the slot an old request gave back")
	}
	release(t, old, held[0]) // twice: nothing more
	release(t, old, held[1], late)
	if got := heir.InUse("c", key); got != 1 {
		t.Fatalf("heir: %d slots in use once the old requests ended, want 1 (its own)", got)
	}
}

// TestHandOverCycle: two stores heirs of each other (a reload there and
// back while old requests run) forward a slot once and do not deadlock.
func TestHandOverCycle(t *testing.T) {
	a, _ := newTestStore(t, 0)
	b, _ := newTestStore(t, 0)
	a.handOver(b, []string{"c"})
	b.handOver(a, []string{"c"})
	key := keyOf(2)
	r := creq("c", key, conc3, 7)
	take1(t, a, r)
	if a.InUse("c", key) != 1 || b.InUse("c", key) != 1 {
		t.Fatalf("in use %d and %d, want 1 and 1", a.InUse("c", key), b.InUse("c", key))
	}
	release(t, b, r)
	if a.InUse("c", key) != 0 || b.InUse("c", key) != 0 {
		t.Fatalf("in use %d and %d after the release, want 0 and 0", a.InUse("c", key), b.InUse("c", key))
	}
}

// TestHandOverRace: requests take and give back slots in the old store
// while the handover runs: once they have all ended, neither store holds a
// slot (none copied after its release, none lost), and the heir counted
// every slot the old store held at the end of the handover.
func TestHandOverRace(t *testing.T) {
	for round := range 20 {
		old, _ := newTestStore(t, 0)
		heir, _ := newTestStore(t, 0)
		lim := algorithms.Limit{Algorithm: algorithms.Concurrency, Events: 1000, Window: 60_000}
		var lease atomic.Uint64
		var wg sync.WaitGroup
		start := make(chan struct{})
		keep := make(chan algorithms.Request, 64)
		for g := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				for i := range 200 {
					r := creq("c", keyOf(g%3), lim, lease.Add(1))
					multi := []algorithms.Request{r, req("r", keyOf(g%3), algorithms.Limit{Events: 1 << 40, Window: hour}, 1)}
					out := make([]algorithms.Decision, 2)
					_ = old.Take(context.Background(), multi[:1+i%2], out)
					if i%25 == 0 {
						keep <- r // held until the handover is done
						continue
					}
					_ = old.Release(context.Background(), []algorithms.Request{r})
				}
			}()
		}
		close(start)
		old.handOver(heir, []string{"c"})
		wg.Wait()
		close(keep)
		var kept []algorithms.Request
		for r := range keep {
			kept = append(kept, r)
		}
		total := 0
		for k := range 3 {
			if o, h := old.InUse("c", keyOf(k)), heir.InUse("c", keyOf(k)); o != h {
				t.Fatalf("round %d key %d: old store %d in use, heir %d", round, k, o, h)
			} else {
				total += h
			}
		}
		if total != len(kept) {
			t.Fatalf("round %d: %d slots in use, %d held", round, total, len(kept))
		}
		_ = old.Release(context.Background(), kept)
		for k := range 3 {
			if o, h := old.InUse("c", keyOf(k)), heir.InUse("c", keyOf(k)); o != 0 || h != 0 {
				t.Fatalf("round %d key %d: %d and %d in use once every request ended, want 0", round, k, o, h)
			}
		}
	}
}
