package algorithms

// Charges in flight: a zone that counts only some statuses (Sluice's
// `count`) charges a request before it runs and settles the charge when
// the status is known (Refund: given back, or kept). Until then the charge
// is in flight, and the store counts the key's charges in flight
// (Request.InFlight; memory: a counter per key; Redis: a counter key
// beside the state, written by the same script). A request that the
// algorithm refuses but that the key's charges in flight, once given
// back, would admit is refused with Decision.InFlight set, and its refusal
// starts no penalty: the caller may wait for the charges to settle and ask
// again.

// Settles reports whether a refusal d of a request costing cost, in a key
// with pending units in flight, rests on those charges: given back, they
// would leave room for it (d.Remaining + pending ≥ cost, within the
// capacity). A key in its penalty has Remaining 0 and is never asked.
func Settles(d *Decision, l Limit, cost, pending int64) bool {
	return !d.Allowed && pending > 0 && cost > 0 && cost <= l.Capacity() && d.Remaining+pending >= cost
}

// StepPending is StepRequest for a key with pending units charged in
// flight (Request.InFlight): a refusal that Settles is marked InFlight and
// starts no penalty (next is then the refused state, not to be written).
func StepPending(st State, fresh bool, r *Request, now, pending int64) (d Decision, next State, fullAt int64) {
	return stepAll(st, fresh, r.Limit, now, r.Cost, !r.NoDelay, pending)
}
