package algorithms

// Refunds: a zone that counts only some responses (Sluice's `count`) charges
// a request before it runs, so that it can be refused atomically with the
// request's other zones, and gives the charge back when the response's
// status does not match. Refund is that give-back, per algorithm, mirrored
// by each Lua twin's *_refund. The window algorithms take the cost off the
// window (or the event) of the charge's instant At: exact in any order. The
// buckets give it back at the refund's instant, never below an empty debt:
// exact when no other charge lands in between, else in the client's favour
// by at most the refill a full bucket would have wasted, never more than the
// cost. A refund keeps the key's penalty. The bounds: docs/algorithms.md.

// Refund asks a store to give back a charge a Take made.
type Refund struct {
	// Zone, Key, Limit and Cost are the charged Request's.
	Zone  string
	Key   Key
	Limit Limit
	Cost  int64
	// At is the instant of the charge: its Decision's At (Unix ms, the
	// store's clock); 0 when unknown (taken as a charge made just now).
	At int64
	// InFlight settles a charge taken in flight (Request.InFlight): the
	// store takes it off the key's charges in flight. Keep then leaves the
	// charge as it is (its status counts, or is unknown): nothing is given
	// back.
	InFlight, Keep bool
	// Settle settles the charge to Settled units (algorithms.Settle): the
	// difference to Cost is given back, or charged on top; Keep is then
	// ignored.
	Settle  bool
	Settled int64
}

// GiveBack runs one refund of cost, charged at at (0: unknown), on a key's
// state at now. It returns the state to store and its fullAt, and ok false
// when there is nothing to give back (no state, or the charge has already
// left the window): nothing is to be written. A next state that
// holds nothing (a sliding log emptied, without a penalty) may be deleted
// instead. It mirrors the Lua twins' *_refund exactly.
func GiveBack(st State, fresh bool, l Limit, now, cost, at int64) (next State, fullAt int64, ok bool) {
	if fresh || st.Scale == 0 && st.Log == nil {
		return State{}, 0, false // no state of the algorithm's: nothing charged to give back
	}
	if st.Alg != l.Algorithm {
		fresh = true // another algorithm's state: the twins start afresh, as step does
	}
	switch l.Algorithm {
	case GCRA:
		next, fullAt = gcraRefund(st, fresh, l, now, cost)
	case SlidingWindow:
		next, fullAt, ok = slidingWindowRefund(st, fresh, l, now, cost, at)
	case FixedWindow:
		next, fullAt, ok = fixedWindowRefund(st, fresh, l, now, cost, at)
	case SlidingLog:
		next, fullAt, ok = slidingLogRefund(st, fresh, l, now, cost, at)
	default:
		next, fullAt = tokenBucketRefund(st, fresh, l, now, cost)
	}
	if l.Algorithm == TokenBucket || l.Algorithm == GCRA {
		ok = true
	}
	if !ok {
		return State{}, 0, false
	}
	if st.Penalized != 0 {
		next.Penalized = st.Penalized
		if l.Penalty > 0 {
			fullAt = max(fullAt, st.Penalized+l.Penalty)
		}
	}
	return next, fullAt, true
}

// tokenBucketRefund gives cost back at now: the debt, refilled to now, less
// cost tokens, never below zero.
func tokenBucketRefund(st State, fresh bool, l Limit, now, cost int64) (State, int64) {
	_, cur, _ := tokenBucket(st, fresh, l, now, 0, false) // the debt, refilled to now
	w := l.Window
	debt := max(cur.Debt-cost*w, 0)
	return State{Debt: debt, At: cur.At, Scale: w}, cur.At + ceilDiv(debt, l.Events)
}

// gcraRefund moves the TAT back by cost emission intervals, never before
// now.
func gcraRefund(st State, fresh bool, l Limit, now, cost int64) (State, int64) {
	g := gcd(l.Events, l.Window)
	u, ei := l.Events/g, l.Window/g
	_, cur, _ := gcra(st, fresh, l, now, 0, false) // the TAT: cur.At + cur.Debt/u, or now when passed
	d := max((cur.At-now)*u+cur.Debt-cost*ei, 0)
	if d == 0 {
		return State{Alg: GCRA, At: now, Scale: u}, now
	}
	ahead, r := d/u, d%u
	reset := ahead
	if r > 0 {
		reset++
	}
	return State{Alg: GCRA, At: now + ahead, Debt: r, Scale: u}, now + reset
}

// fixedWindowRefund takes cost off the window that counted the charge made
// at at, if it is still the key's window.
func fixedWindowRefund(st State, fresh bool, l Limit, now, cost, at int64) (State, int64, bool) {
	_, cur, _ := fixedWindow(st, fresh, l, now, 0)
	start, end := cur.At, cur.At+cur.Scale
	if at > 0 && (at < start || at >= end) {
		return State{}, 0, false // counted in a window that has ended
	}
	cur.Debt = max(cur.Debt-cost, 0)
	fullAt := now
	if cur.Debt > 0 {
		fullAt = end
	}
	return cur, fullAt, true
}

// slidingWindowRefund takes cost off the count of the aligned window the
// charge made at at was counted in: the current one, or the previous one;
// a charge older than that counts no more. Without at, it takes cost off
// the current count, then the previous one.
func slidingWindowRefund(st State, fresh bool, l Limit, now, cost, at int64) (State, int64, bool) {
	_, cur, _ := slidingWindow(st, fresh, l, now, 0) // rolled to max(now, start)
	w, s := l.Window, cur.At
	switch c := floorDiv(at, w) * w; {
	case at <= 0:
		take := min(cost, cur.Debt)
		cur.Debt -= take
		cur.Prev = max(cur.Prev-(cost-take), 0)
	case c == s:
		cur.Debt = max(cur.Debt-cost, 0)
	case c == s-w:
		cur.Prev = max(cur.Prev-cost, 0)
	default:
		return State{}, 0, false
	}
	fullAt := now
	switch {
	case cur.Debt > 0:
		fullAt = s + 2*w
	case cur.Prev > 0:
		fullAt = s + w
	}
	return cur, fullAt, true
}

// slidingLogRefund removes the event of the charge made at at: the oldest
// event of this cost recorded at or after at (the event a charge appends is
// recorded at its instant, or at the newest event's if the clock stepped
// back; events of the same instant and cost are interchangeable). Without
// at, the newest event of this cost. An event already out of the window
// gives nothing back.
func slidingLogRefund(st State, fresh bool, l Limit, now, cost, at int64) (State, int64, bool) {
	if fresh || st.Log == nil {
		return State{}, 0, false
	}
	live := st.Log.Entries
	i := 0
	for i < len(live) && live[i].At+l.Window <= now {
		i++
	}
	live = live[i:]
	found := -1
	if at > 0 {
		for j := range live {
			if live[j].Cost == cost && live[j].At >= at {
				found = j
				break
			}
		}
	} else {
		for j := len(live) - 1; j >= 0; j-- {
			if live[j].Cost == cost {
				found = j
				break
			}
		}
	}
	if found < 0 {
		return State{}, 0, false
	}
	// A new array: the given entries may be shared (see Log).
	kept := make([]LogEntry, 0, len(live)-1)
	kept = append(append(kept, live[:found]...), live[found+1:]...)
	next := State{Alg: SlidingLog, Log: &Log{Entries: kept}}
	fullAt := now
	if k := len(kept); k > 0 {
		fullAt = kept[k-1].At + l.Window
	}
	return next, fullAt, true
}
