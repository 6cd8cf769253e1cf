package admin

import (
	"math"
	"time"

	"github.com/sluicehq/caddy-sluice/algorithms"
)

// ShowInUse adds the slots in use to a concurrency zone's peek.
func (p *Peek) ShowInUse() {
	inUse := func(s *State) {
		n := max(s.Limit-s.Remaining, 0)
		s.InUse = &n
	}
	inUse(&p.State)
	for i := range p.Keys {
		inUse(&p.Keys[i].State)
	}
}

// ShowDebt adds to a settle zone's peek each key's debt: the units owed
// beyond the capacity, from the time the key takes to be back to full
// (token_bucket and gcra; the windows count no debt beyond their window);
// and for those, whether and when a request of the zone's cost (the
// estimate its requests take) passes, as its refusal's Retry-After says.
func (p *Peek) ShowDebt(l algorithms.Limit, cost int64) {
	debt := func(st *State) {
		var d int64
		if l.Algorithm == algorithms.TokenBucket || l.Algorithm == algorithms.GCRA {
			perMs := float64(l.Events) / float64(l.Window)
			owed := float64(st.ResetAfterMs) * perMs
			d = max(int64(owed)-l.Capacity(), 0)
			wait := time.Duration(math.Ceil((owed-float64(l.Capacity()-cost))/perMs)) * time.Millisecond
			st.Allowed = wait <= 0
			wait = max(wait, 0)
			st.RetryAfter, st.RetryAfterMs = wait.String(), wait.Milliseconds()
		}
		st.Debt = &d
	}
	debt(&p.State)
	for i := range p.Keys {
		debt(&p.Keys[i].State)
	}
}
