package algorithms

// The penalty box: a limit with a Penalty refuses a key for that long once
// the algorithm itself has refused it, whatever the algorithm would allow
// sooner. The refusal that starts it stores the refused state with
// Penalized = now; during the penalty every request is refused, nothing is
// written (so it is not extended), and RetryAfter is the time to its end
// or the algorithm's own RetryAfter if later. The algorithm's state keeps
// evolving underneath; its next admission clears Penalized. Storing the
// start, not the end, makes a changed Penalty apply at once to running
// penalties. The rules in full: docs/algorithms.md.

// Step runs one decision of the limit's algorithm and its penalty (see
// above and step). It returns the decision, the state to store, and the
// Unix millisecond at which the state is back to full (its penalty over)
// and may be forgotten. A store writes the state when the decision is
// allowed, or when it starts a penalty (StartsPenalty). Step never
// allocates, except for the sliding log (a new Log header, and its
// entries' growth).
func Step(st State, fresh bool, l Limit, now, cost int64) (d Decision, next State, fullAt int64) {
	return stepAll(st, fresh, l, now, cost, true, 0)
}

// StepRequest is Step for r (its Limit and Cost), honouring r.NoDelay: a
// request that may not wait for its turn (delay.go).
func StepRequest(st State, fresh bool, r *Request, now int64) (d Decision, next State, fullAt int64) {
	return stepAll(st, fresh, r.Limit, now, r.Cost, !r.NoDelay, 0)
}

// stepAll is Step, the penalty and the algorithm's step with its waiting;
// pending is the key's units charged in flight (inflight.go).
func stepAll(st State, fresh bool, l Limit, now, cost int64, mayWait bool, pending int64) (d Decision, next State, fullAt int64) {
	if l.Penalty <= 0 {
		d, next, fullAt = step(st, fresh, l, now, cost, mayWait)
		d.InFlight = Settles(&d, l, cost, pending)
		return d, next, fullAt
	}
	if !fresh && st.Penalized != 0 && now < st.Penalized+l.Penalty {
		return inPenalty(st, fresh, l, now, cost, mayWait)
	}
	d, next, fullAt = step(st, fresh, l, now, cost, mayWait)
	if d.Allowed || cost == 0 {
		return d, next, fullAt
	}
	if Settles(&d, l, cost, pending) {
		d.InFlight = true // no penalty: the charges in flight may come back
		return d, next, fullAt
	}
	// Refused: the penalty starts.
	next.Penalized = now
	if lg := next.Log; lg != nil && len(lg.Entries) > 0 && lg.Entries[0].At+l.Window <= now {
		// The refused sliding log is written: without the events that
		// left the window, as the Lua twin writes it.
		i := 0
		for i < len(lg.Entries) && lg.Entries[i].At+l.Window <= now {
			i++
		}
		next.Log = &Log{Entries: lg.Entries[i:]}
	}
	d.Remaining = 0
	d.RetryAfter = max(d.RetryAfter, ms(l.Penalty))
	d.ResetAfter = max(d.ResetAfter, ms(l.Penalty))
	return d, next, max(fullAt, now+l.Penalty)
}

// inPenalty decides a request of a key in its penalty: refused, nothing
// written (the state returned is the given one, advanced to now, with its
// Penalized unchanged).
func inPenalty(st State, fresh bool, l Limit, now, cost int64, mayWait bool) (Decision, State, int64) {
	end := st.Penalized + l.Penalty
	d, next, fullAt := step(st, fresh, l, now, 0, mayWait)
	retry := end - now
	if cost > 0 {
		// The algorithm's own answer to this request (its state is
		// discarded: a sliding log's may share the given entries).
		if c, _, _ := step(st, fresh, l, now, cost, mayWait); !c.Allowed {
			retry = max(retry, c.RetryAfter.Milliseconds())
		}
	}
	d.Allowed = false
	d.Remaining = 0
	d.RetryAfter = ms(retry)
	d.ResetAfter = max(d.ResetAfter, ms(end-now))
	next.Penalized = st.Penalized
	return d, next, max(fullAt, end)
}

// StartsPenalty reports whether a decision of Step, given the state st
// (fresh: none) and returning next, started a penalty: the store must then
// write next although the request is refused.
func StartsPenalty(st State, fresh bool, next State) bool {
	return next.Penalized != 0 && (fresh || next.Penalized != st.Penalized)
}
