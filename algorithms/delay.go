package algorithms

// Smoothing instead of refusing: a token_bucket or gcra limit with a Delay
// admits a request it would refuse, later, when its turn comes within the
// Delay: the request is charged now (the key's debt going beyond the
// bucket) and Decision.Delay says how long to wait. A request fits at once
// in the first DelayAfter tokens of the bucket (default: the capacity); past
// them its wait is the time to refill the excess, rounded up to the
// millisecond, and a wait beyond Delay refuses it, charging nothing.
// GiveBack undoes a reservation exactly (the client went away). The rules
// in full, Remaining and RetryAfter included: docs/algorithms.md, "How a
// wait is computed".

// admit decides a request needing need units against a debt of x units,
// for a bucket of full units whose token is tok units, refilled rate units
// a millisecond, lag ms ahead of now (a clock that stepped back; 0 for
// gcra). It returns whether the request is admitted and, if so, its wait
// (ms), else its RetryAfter (ms).
func admit(l Limit, mayWait bool, x, need, full, tok, rate, lag int64) (wait, retry int64, ok bool) {
	a := max(threshold(l, full, tok), need)
	if x+need <= a || need == 0 {
		return 0, 0, true
	}
	after := lag + ceilDiv(x+need-a, rate) // when it would fit at once
	if l.Delay > 0 && mayWait {
		if after <= l.Delay {
			return after, 0, true
		}
		return 0, after - l.Delay, false
	}
	return 0, after, false
}

// threshold is how much of a bucket of full units (a token: tok units)
// may be spent at once: with a Delay and DelayAfter, DelayAfter tokens (at
// most the bucket: an override may lower the capacity below it); else all
// of it.
func threshold(l Limit, full, tok int64) int64 {
	if l.Delay > 0 && l.DelayAfter > 0 {
		return min(l.DelayAfter*tok, full)
	}
	return full
}
