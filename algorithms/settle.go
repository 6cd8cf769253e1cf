package algorithms

// Settles: a zone that charges what the response reports (Sluice's
// `settle`) takes an estimate, the request's Cost, before it runs, and
// settles the charge to the actual amount once the response tells: the
// difference is given back (GiveBack) or charged on top. A charge on top is
// forced: it may leave the key owing more than its capacity (in debt), and
// the key's next requests are refused until the refill has repaid it. How
// each algorithm carries a debt, mirrored by the Lua twins' *_settle:
//
//   - token_bucket: the debt beyond the bucket is kept as time the key must
//     wait before it refills (its instant moved ahead), rounded up to the
//     millisecond;
//   - gcra: the TAT moves ahead by the extra emission intervals, exactly;
//   - fixed_window and sliding_window: the extra is counted in the current
//     window; the count beyond the limit ends with its window (a debt is
//     forgiven when the window turns; sliding_window caps it at the limit);
//   - sliding_log: the charge's event takes the actual amount, exactly.
//
// A debt is bounded by 2^53 scaled units and by MaxRefill: a key owes at
// most 100 years of refill (docs/reference.md, settle).

// MaxSettled is the largest amount a settle takes: 2^53, so that every
// quantity stays exact in the Lua twins' doubles.
const MaxSettled = MaxScaled

// Settle settles a charge of cost made at at (0: unknown) to actual units on
// a key's state at now. It returns the state to store and its fullAt, and ok
// false when nothing is to be written.
func Settle(st State, fresh bool, l Limit, now, cost, actual, at int64) (next State, fullAt int64, ok bool) {
	actual = min(max(actual, 0), MaxSettled)
	switch {
	case actual == cost:
		return State{}, 0, false
	case l.Algorithm == SlidingLog:
		// An event costing more than the limit keeps the key refused until
		// it leaves the window, as one costing the limit does.
		next, fullAt, ok = slidingLogSettle(st, fresh, l, now, cost, min(actual, max(l.Events, cost)), at)
	case actual < cost:
		return GiveBack(st, fresh, l, now, cost-actual, at)
	default:
		if fresh || st.Alg != l.Algorithm || st.Scale == 0 {
			fresh = true
		}
		extra := actual - cost
		switch l.Algorithm {
		case GCRA:
			next, fullAt = gcraOwe(st, fresh, l, now, extra)
		case FixedWindow:
			_, next, fullAt = fixedWindow(st, fresh, l, now, 0)
			next.Debt += min(extra, MaxScaled-next.Debt)
			fullAt = next.At + next.Scale
		case SlidingWindow:
			_, next, _ = slidingWindow(st, fresh, l, now, 0)
			next.Debt = min(next.Debt+extra, l.Events)
			fullAt = next.At + 2*l.Window
		default:
			next, fullAt = tokenBucketOwe(st, fresh, l, now, extra)
		}
		ok = true
	}
	if !ok {
		return State{}, 0, false
	}
	if !fresh && st.Penalized != 0 {
		next.Penalized = st.Penalized
		if l.Penalty > 0 {
			fullAt = max(fullAt, st.Penalized+l.Penalty)
		}
	}
	return next, fullAt, true
}

// tokenBucketOwe charges extra tokens on top at now: the debt, refilled to
// now, plus extra; what lies beyond the bucket (and the waiting room's
// slots) is kept as the milliseconds its refill takes, the state's instant
// moved ahead by them (the refill starts then), rounded up.
func tokenBucketOwe(st State, fresh bool, l Limit, now, extra int64) (State, int64) {
	_, cur, _ := tokenBucket(st, fresh, l, now, 0, false)
	w, rate := l.Window, l.Events
	room := l.Capacity()*w + l.Delay*rate
	owed := cur.Debt + min(extra, (MaxScaled-cur.Debt)/w)*w
	at := cur.At
	if owed > room {
		at = min(at+ceilDiv(owed-room, rate), max(at, now+MaxRefill))
		owed = room
	}
	return State{Debt: owed, At: at, Scale: w}, at + ceilDiv(owed, rate)
}

// gcraOwe moves the TAT ahead by extra emission intervals.
func gcraOwe(st State, fresh bool, l Limit, now, extra int64) (State, int64) {
	g := gcd(l.Events, l.Window)
	u, ei := l.Events/g, l.Window/g
	_, cur, _ := gcra(st, fresh, l, now, 0, false)
	d := max((cur.At-now)*u+cur.Debt, 0)
	most := int64(MaxScaled) // 100 years ahead at most, in units
	if u <= MaxScaled/MaxRefill {
		most = MaxRefill * u
	}
	d = min(d+min(extra, (MaxScaled-d)/ei)*ei, max(d, most))
	ahead, r := d/u, d%u
	reset := ahead
	if r > 0 {
		reset++
	}
	return State{Alg: GCRA, At: now + ahead, Debt: r, Scale: u}, now + reset
}

// slidingLogSettle gives the event of the charge made at at (found as
// slidingLogRefund finds it) the actual amount; an event gone from the
// window settles nothing, but an extra charge is then recorded at now.
func slidingLogSettle(st State, fresh bool, l Limit, now, cost, actual, at int64) (State, int64, bool) {
	var live []LogEntry
	if !fresh && st.Alg == SlidingLog && st.Log != nil {
		live = st.Log.Entries
	}
	i := 0
	for i < len(live) && live[i].At+l.Window <= now {
		i++
	}
	live = live[i:]
	found := -1
	for j := range live {
		if live[j].Cost == cost && (at <= 0 || live[j].At >= at) {
			found = j
			if at > 0 {
				break
			}
		}
	}
	// A new array: the given entries may be shared (see Log).
	kept := make([]LogEntry, 0, len(live)+1)
	switch {
	case found >= 0 && actual > 0:
		kept = append(kept, live...)
		kept[found].Cost = actual
	case found >= 0:
		kept = append(append(kept, live[:found]...), live[found+1:]...)
	case actual > cost:
		kept = append(kept, live...)
		when := now
		if k := len(kept); k > 0 && kept[k-1].At > now {
			when = kept[k-1].At
		}
		kept = append(kept, LogEntry{At: when, Cost: actual - cost})
	default:
		return State{}, 0, false
	}
	fullAt := now
	if k := len(kept); k > 0 {
		fullAt = kept[k-1].At + l.Window
	}
	return State{Alg: SlidingLog, Log: &Log{Entries: kept}}, fullAt, true
}
