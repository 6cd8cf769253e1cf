package sluice

// standing is what ranks one zone's decision against another's, to show the
// most constrained: the refusal, the rate limit headers and the admin API's
// peek all rank with tighter. retry and reset may be in any unit (or reset
// an instant) as long as both sides use the same.
type standing struct {
	refused          bool  // an enforced refusal
	retry            int64 // its Retry-After
	remaining, reset int64
}

// tighter reports whether a is more constrained than b: a refusal beats an
// allowed zone, and between refusals the longer Retry-After; between
// allowed zones the least remaining wins, then the later reset. Equals are
// not tighter, so the first ranked of them stands.
func (a standing) tighter(b standing) bool {
	switch {
	case a.refused != b.refused:
		return a.refused
	case a.refused:
		return a.retry > b.retry
	}
	return a.remaining < b.remaining || a.remaining == b.remaining && a.reset > b.reset
}
