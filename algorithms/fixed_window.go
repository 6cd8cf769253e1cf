package algorithms

// fixedWindow is the fixed window step function: windows aligned to
// multiples of Window since the Unix epoch; a request costing c passes when
// the window's count plus c is at most Events. There is no burst (Validate
// refuses one). Remaining is Events minus the count; a refusal's RetryAfter
// is the time to the window's end; ResetAfter is the time to the window's
// end when anything was counted, else 0. The state keeps its own window,
// [At, At+Scale), until it ends, so a changed Window takes effect then. The
// boundary burst, precision and changed limits: docs/algorithms.md.
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
