package algorithms

import (
	"math/rand/v2"
	"testing"
)

// TestAddChargesOneInstanceIsExact: one instance deciding a key from its
// state as last synced plus its charges since (AddCharges, then Step),
// and syncing them now and then, decides every request as Step on the
// key's own state does: the asynchronous mode is exact for a key one
// instance uses, whatever the windows the syncs fall in.
func TestAddChargesOneInstanceIsExact(t *testing.T) {
	rng := rand.New(rand.NewPCG(38, 1))
	for _, alg := range []Algorithm{FixedWindow, SlidingWindow} {
		for round := range 300 {
			l := Limit{Algorithm: alg, Events: 1 + rng.Int64N(20), Window: []int64{1000, 7, 60000}[round%3]}
			var direct, synced State
			freshD, freshS := true, true
			var unsent []WindowCharge
			now := int64(1_700_000_000_000) + rng.Int64N(l.Window)
			for step := range 200 {
				now += rng.Int64N(l.Window/3 + 1)
				cost := 1 + rng.Int64N(3)
				want, next, _ := Step(direct, freshD, l, now, cost)
				if want.Allowed {
					direct, freshD = next, false
				}
				view, _, _ := AddCharges(synced, freshS, l, now, unsent)
				got, _, _ := Step(view, false, l, now, cost)
				if got != want {
					t.Fatalf("%s %+v step %d at %d cost %d: got %+v, want %+v (synced %+v, unsent %+v)", alg, l, step, now, cost, got, want, synced, unsent)
				}
				if got.Allowed {
					unsent = append(unsent, WindowCharge{Start: WindowStart(now, l.Window), Units: cost})
				}
				if rng.IntN(4) == 0 { // a sync
					synced, _, _ = AddCharges(synced, freshS, l, now, unsent)
					freshS, unsent = false, unsent[:0]
				}
			}
		}
	}
}
