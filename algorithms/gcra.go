package algorithms

// gcra is the GCRA (generic cell rate algorithm) step function: the token
// bucket's decisions exactly, with one instant of state, the theoretical
// arrival time (TAT). A request costing c passes when TAT + c emission
// intervals (Window/Events) lies at most capacity intervals after now.
// Time is counted in units of 1/u ms, u = Events / gcd(Events, Window), so
// that the emission interval is a whole number of units; the TAT is stored
// as At + Debt/Scale ms, Scale = u (bounded by MaxGCRAUnit). A changed
// limit keeps the TAT, its fraction rescaled to the new unit, rounded up;
// owed time is never forgiven. The rest: docs/algorithms.md.
func gcra(st State, fresh bool, l Limit, now, cost int64, mayWait bool) (Decision, State, int64) {
	capacity := l.Capacity()
	g := gcd(l.Events, l.Window)
	u := l.Events / g    // units per ms
	ei := l.Window / g   // emission interval, in units
	tau := capacity * ei // the bucket, in units
	// The furthest the TAT may lie ahead: the bucket, plus the slots
	// reserved by waiting requests (delay.go).
	room := tau + l.Delay*u

	// The TAT is now + ahead ms + r units; ahead < 0: it has passed.
	ahead, r := int64(-1), int64(0)
	if !fresh && st.Scale > 0 {
		q := st.At
		r = min(max(st.Debt, 0), st.Scale-1)
		if st.Scale != u {
			// ⌈r × u / old⌉ ≤ u, and r × u < 2^52 (MaxGCRAUnit²).
			r = ceilDiv(r*u, st.Scale)
			if r >= u {
				q, r = q+1, r-u
			}
		}
		ahead = q - now
	}
	if ahead < 0 {
		ahead, r = -1, 0
	}
	// d is how far the TAT lies ahead of now, in units (the debt); beyond
	// the capacity (after a changed limit) it is not computed: over.
	over := ahead > room/u+1
	d := int64(0)
	if ahead >= 0 && !over {
		d = ahead*u + r
	}

	dec := Decision{Limit: capacity}
	need := cost * ei
	switch {
	case cost > capacity:
		dec.RetryAfter = ms(l.Window)
	case over:
		// ⌈(d + need − a) / u⌉ ms, computed without d, to the threshold
		// the request waits for (delay.go; a = tau without waiting), less
		// the longest wait.
		wait := int64(0)
		if l.Delay > 0 && mayWait {
			wait = l.Delay
		}
		dec.RetryAfter = ms(ahead - floorDiv(max(threshold(l, tau, ei), need)-need-r, u) - wait)
	default:
		wait, retry, ok := admit(l, mayWait, d, need, tau, ei, u, 0)
		if !ok {
			dec.RetryAfter = ms(retry)
			break
		}
		d += need
		dec.Allowed = true
		dec.Delay = ms(wait)
		ahead, r = d/u, d%u
	}
	if a := threshold(l, tau, ei); !over && d < a {
		dec.Remaining = (a - d) / ei // what fits at once
	}
	reset := int64(0)
	if ahead >= 0 {
		reset = ahead
		if r > 0 {
			reset++
		}
	}
	dec.ResetAfter = ms(reset)
	next := State{Alg: GCRA, At: now, Scale: u}
	if ahead >= 0 {
		next.At, next.Debt = now+ahead, r
	}
	return dec, next, now + reset
}
