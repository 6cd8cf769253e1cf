package algorithms

// slidingLog is the sliding log step function: the key keeps every
// admitted event of the last Window as (time, cost), oldest first, and an
// event admitted at t counts while now < t + Window. A request costing c
// passes when the costs still counting plus c are at most Events. There is
// no burst (Validate refuses one). Remaining is Events minus the costs
// counting; ResetAfter is when the newest entry leaves the window. At most
// Events entries (every cost is at least 1), bounded by MaxLogEvents. A
// clock stepping back records the new entry at the newest entry's time,
// keeping the log in order. Changed limits: docs/algorithms.md.
func slidingLog(st State, fresh bool, l Limit, now, cost int64) (Decision, State, int64) {
	n, w := l.Events, l.Window
	var live []LogEntry
	if !fresh && st.Log != nil {
		live = st.Log.Entries
		i := 0
		for i < len(live) && live[i].At+w <= now {
			i++
		}
		live = live[i:]
	}
	sum := int64(0)
	for _, e := range live {
		sum += e.Cost
	}

	d := Decision{Limit: n}
	switch {
	case cost > n:
		d.RetryAfter = ms(w)
	case cost <= n-sum:
		d.Allowed = true
		if cost > 0 {
			at := now
			if k := len(live); k > 0 {
				at = max(at, live[k-1].At)
			}
			// Appending never writes within the given entries (see Log).
			live = append(live, LogEntry{At: at, Cost: cost})
			sum += cost
		}
	default:
		freed := int64(0)
		for _, e := range live {
			freed += e.Cost
			if sum-freed <= n-cost {
				d.RetryAfter = ms(e.At + w - now)
				break
			}
		}
	}
	d.Remaining = max(n-sum, 0)
	fullAt := now
	if k := len(live); k > 0 {
		fullAt = live[k-1].At + w
	}
	d.ResetAfter = ms(fullAt - now)
	next := State{Alg: SlidingLog}
	if d.Allowed && cost > 0 {
		next.Log = &Log{Entries: live}
	} else if !fresh {
		// Nothing added: the given log serves (expired entries are skipped
		// on every read), and nothing is allocated.
		next.Log = st.Log
	}
	return d, next, fullAt
}
