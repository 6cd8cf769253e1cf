package algorithms

// What GCRA promises (gcra.go): the token bucket's semantics, exactly, with
// one instant as its state. The properties it shares with every algorithm
// are in properties_test.go.

import (
	"math/rand/v2"
	"testing"
)

// GCRA admits exactly as the token bucket of the same limit does, and
// reports the same numbers, on random traffic with a steady clock.
func TestGCRAMatchesTokenBucket(t *testing.T) {
	for li, l := range testLimits {
		g := l
		g.Algorithm = GCRA
		t.Run(name(g), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(29, uint64(li)))
			var sb, sg State
			fb, fg := true, true
			now := t0
			for i := range 5000 {
				now += gap(rng, l)
				cost := 1 + rng.Int64N(l.Capacity()+1)
				db, nb, ab := Step(sb, fb, l, now, cost)
				dg, ng, ag := Step(sg, fg, g, now, cost)
				if db != dg || ab != ag {
					t.Fatalf("step %d (cost %d): token bucket %+v (full at %d), gcra %+v (full at %d)", i, cost, db, ab, dg, ag)
				}
				if db.Allowed {
					sb, fb, sg, fg = nb, false, ng, false
				}
			}
		})
	}
}
