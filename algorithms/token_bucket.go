package algorithms

import "math/bits"

// tokenBucket is the token bucket step function.
//
// Tokens are counted scaled by the window (tokens × Window ms), so that a
// refill of Events per Window is exactly Events scaled units per millisecond
// and every quantity stays an integer: the bucket holds at most
// Capacity×Window units, a request costs cost×Window units, and the time a
// deficit takes to refill is ceil(deficit / Events) milliseconds. After
// waiting exactly RetryAfter the same request passes; one millisecond sooner
// it does not.
//
// The state is the debt (what was spent and not yet refilled), so a changed
// limit applies at once to existing keys: the tokens left are the new
// capacity minus the debt, a debt above the new capacity counts as an empty
// bucket, and a changed window rescales the debt (the tokens owed carry
// over, not their scaled units).
func tokenBucket(st State, fresh bool, l Limit, now, cost int64, mayWait bool) (Decision, State, int64) {
	capacity := l.Capacity()
	w := l.Window
	full := capacity * w
	rate := l.Events // scaled units refilled per millisecond
	// The most the debt may reach: full, plus the slots reserved by
	// waiting requests (delay.go).
	room := full + l.Delay*rate

	debt, at := int64(0), now
	if !fresh && st.Scale > 0 {
		debt = st.Debt
		if st.Scale != w {
			debt = rescale(debt, st.Scale, w, full)
		}
		debt = min(max(debt, 0), room)
		at = st.At
		if elapsed := now - at; elapsed > 0 {
			if elapsed >= ceilDiv(debt, rate) {
				debt = 0
			} else {
				debt -= elapsed * rate
			}
			at = now
		}
		// A clock that stepped back (at > now) refills nothing until it
		// catches up; the times below are counted from at, plus the lag.
	}
	lag := at - now
	t := full - debt

	d := Decision{Limit: capacity}
	if cost > capacity {
		// Can never pass: refuse without touching the state, and tell the
		// client to come back no sooner than a window from now.
		d.Remaining = max(threshold(l, full, w)-debt, 0) / w
		d.RetryAfter = ms(w)
		d.ResetAfter = ms(lag + ceilDiv(debt, rate))
		return d, State{Debt: debt, At: at, Scale: w}, at + ceilDiv(debt, rate)
	}
	need := cost * w
	if wait, retry, ok := admit(l, mayWait, debt, need, full, w, rate, lag); ok {
		t -= need
		debt += need
		d.Allowed = true
		d.Delay = ms(wait)
	} else {
		d.RetryAfter = ms(retry)
	}
	refill := ceilDiv(debt, rate)
	d.Remaining = max(threshold(l, full, w)-debt, 0) / w // what fits at once
	d.ResetAfter = ms(lag + refill)
	return d, State{Debt: debt, At: at, Scale: w}, at + refill
}

// ceilDiv returns ⌈a/b⌉ for a ≥ 0, b > 0.
func ceilDiv(a, b int64) int64 {
	if a <= 0 {
		return 0
	}
	return (a + b - 1) / b
}

// rescale converts t units of scale from into units of scale to, computing
// ⌈t×to/from⌉ without overflow and capping the result at limit. It rounds up
// because t is a debt: rounding down would hand the client a fraction of a
// token it never got back on every window change.
func rescale(t, from, to, limit int64) int64 {
	if t <= 0 {
		return 0
	}
	hi, lo := bits.Mul64(uint64(t), uint64(to))
	if hi >= uint64(from) {
		return limit // the quotient would not fit in 64 bits
	}
	q, rem := bits.Div64(hi, lo, uint64(from))
	if rem != 0 {
		q++
	}
	if q > uint64(limit) {
		return limit
	}
	return int64(q)
}
