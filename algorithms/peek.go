package algorithms

// Peek returns what a key shows at now without charging it: Limit,
// Remaining and ResetAfter as the state stands (Step with cost 0), and, for
// a request of cost 1, whether it would pass now (Allowed) and if not, the
// earliest time from now it could (RetryAfter). fresh reports that the key
// has no state. Peek never writes to st.
func Peek(st State, fresh bool, l Limit, now int64) Decision {
	d, _, _ := Step(st, fresh, l, now, 0)
	if d.Remaining >= 1 {
		// Every algorithm admits a cost of 1 exactly when at least 1
		// remains (and a step that admits would append to a sliding log).
		d.Allowed, d.RetryAfter = true, 0
		return d
	}
	one, _, _ := Step(st, fresh, l, now, 1) // refused: a refusal writes nothing
	d.Allowed, d.RetryAfter = one.Allowed, one.RetryAfter
	return d
}
