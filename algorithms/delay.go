package algorithms

// Smoothing instead of refusing: a token_bucket or gcra limit with a Delay
// admits a request it would refuse, later, when its turn comes within the
// Delay: the request reserves its slot now (it is charged now, the key's
// debt going beyond the bucket) and the decision says how long to wait
// (Decision.Delay). nginx's limit_req burst/delay, with a waiting room
// bounded in time rather than in requests.
//
// Semantics, for a request of cost c against a key owing x (the token
// bucket's debt, or how far gcra's TAT lies ahead; both in the
// algorithm's units):
//
//   - A request passes at once when x + c fits in the first DelayAfter
//     tokens of the bucket (default: the whole capacity), as it would fit
//     the bucket without a Delay. Remaining counts what still fits there.
//   - Otherwise its wait is the time until the key has refilled enough
//     for it to fit there: x + c − DelayAfter at the limit's rate, rounded
//     up to the millisecond. A wait within Delay admits it: charged now,
//     Decision.Delay the wait. So the requests of one key are spaced at the
//     rate (10 per second: 100 ms apart), in the order the store decides
//     them, and the requests a key runs never exceed a bucket of
//     DelayAfter tokens refilled at the rate (a test runs them through
//     one).
//   - A wait beyond Delay refuses it, charging nothing; its RetryAfter is
//     the time until it would be admitted (its wait less Delay): exact, as
//     every RetryAfter is (after waiting exactly RetryAfter the same
//     request is admitted, with the longest wait; one millisecond sooner it
//     is not).
//   - A request that may not wait (Request.NoDelay: its directive's
//     waiting room is full) passes at once or is refused, with the
//     RetryAfter of passing at once.
//   - The key's debt may reach the bucket plus Delay × rate (the
//     reservations); every later request counts them. A changed Delay
//     applies at once: shortened, it forgives the reservations beyond the
//     new room (as a lowered capacity forgives a debt beyond it).
//   - Cost 0 (a view) never waits.
//
// With a Delay, DelayAfter below the burst caps what a burst spends at
// once, as a smaller burst would: nginx's limit_req delay=. A request
// costing more than DelayAfter (at most the capacity) fits at once when
// the key owes nothing, and waits for that.
//
// Cost 0 aside, every quantity is an integer and the twins (Go, Lua)
// compute the same.
//
// A reservation given back (the waiting client went away: GiveBack) is
// exact for the requests that come after it: the key owes what it would
// have owed had the request never come; the requests already waiting keep
// their turns (a freed slot goes to the next request, never to one
// already scheduled). It is exact, not merely bounded (refund.go), because
// the debt cannot touch zero while the reservation is still in the future.

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
// may be spent at once: with a Delay and DelayAfter, DelayAfter tokens;
// else all of it.
func threshold(l Limit, full, tok int64) int64 {
	if l.Delay > 0 && l.DelayAfter > 0 {
		return l.DelayAfter * tok
	}
	return full
}
