package algorithms

// fixedWindow is the fixed window step function.
//
// Semantics: time is cut into windows aligned to multiples of Window since
// the Unix epoch (a 1-minute window starts at every whole UTC minute, a
// 1-day window at UTC midnight); a request costing c passes when the
// window's count plus c is at most Events. There is no burst (Validate
// refuses one). Remaining is Events minus the count; a refusal's RetryAfter
// is the time to the window's end; ResetAfter is the time to the window's
// end when anything was counted, else 0.
//
// The boundary burst: a client may spend Events at the very end of one
// window and Events again at the start of the next, so up to 2×Events pass
// within any span of Window (in as little as 1ms, across a boundary). This
// is the price of one counter and calendar-aligned quotas; use
// sliding_window or sliding_log when "at most N in any window" matters.
//
// Precision: integer-exact (counts and millisecond times). Retry-After is
// exact: after waiting exactly RetryAfter the same request passes (a new
// window has begun) and one millisecond sooner it does not.
//
// A changed limit: a changed Events applies at once to the current count
// (raised: the key may spend more at once; lowered below the count: the key
// is refused until the window ends). A changed Window takes effect at the
// end of the key's current window: the state keeps its own window, [At,
// At+Scale), until it ends, so nothing counted is forgotten early. A clock
// stepping back stays in the stored window.
func fixedWindow(st State, fresh bool, l Limit, now, cost int64) (Decision, State, int64) {
	n := l.Events
	count, start, length := int64(0), now-now%l.Window, l.Window
	if now < 0 {
		start = -ceilDiv(-now, l.Window) * l.Window
	}
	if !fresh && st.Scale > 0 && now < st.At+st.Scale {
		count, start, length = max(st.Debt, 0), st.At, st.Scale
	}
	end := start + length

	d := Decision{Limit: n}
	switch {
	case cost > n:
		d.RetryAfter = ms(l.Window)
	case cost <= n-count:
		count += cost
		d.Allowed = true
	default:
		d.RetryAfter = ms(end - now)
	}
	d.Remaining = max(n-count, 0)
	fullAt := now
	if count > 0 {
		fullAt = end
	}
	d.ResetAfter = ms(fullAt - now)
	return d, State{Alg: FixedWindow, Debt: count, At: start, Scale: length}, fullAt
}
