package algorithms

import (
	"math/rand/v2"
	"reflect"
	"testing"
)

// Peek charges nothing: the state it is given is left as it was, Remaining
// and ResetAfter are Step's at cost 0, and Allowed and RetryAfter are
// Step's for a request of cost 1.
func TestPeekIsStepWithoutCharge(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	for _, l := range allLimits {
		t.Run(name(l), func(t *testing.T) {
			var st State
			fresh := true
			now := int64(1_700_000_000_000)
			for i := 0; i < 300; i++ {
				now += gap(rng, l)
				var snapshot []LogEntry
				if st.Log != nil {
					snapshot = append(snapshot, st.Log.Entries...)
				}
				before := st
				got := Peek(st, fresh, l, now)
				if st != before || st.Log != nil && !reflect.DeepEqual(st.Log.Entries, snapshot) {
					t.Fatalf("step %d: Peek changed the state", i)
				}
				zero, _, _ := Step(st, fresh, l, now, 0)
				one, _, _ := Step(st, fresh, l, now, 1)
				want := Decision{Allowed: one.Allowed, Limit: zero.Limit, Remaining: zero.Remaining,
					RetryAfter: one.RetryAfter, ResetAfter: zero.ResetAfter}
				if got != want {
					t.Fatalf("step %d: Peek %+v, want %+v", i, got, want)
				}
				if got.Allowed != (got.Remaining >= 1) {
					t.Fatalf("step %d: Allowed %v with Remaining %d", i, got.Allowed, got.Remaining)
				}
				// Spend a random cost, as traffic would.
				c := 1 + rng.Int64N(min(l.Capacity(), 3))
				d, next, _ := Step(st, fresh, l, now, c)
				if d.Allowed {
					st, fresh = next, false
				}
			}
		})
	}
}
