package algorithms

// slidingWindow is the sliding window counter step function.
//
// Semantics: time is cut into windows aligned to multiples of Window since
// the Unix epoch, and the key counts the current window's events (cur) and
// the previous window's (prev). At elapsed ms into the current window the
// sliding window [now-Window, now) is estimated as
//
//	estimate = prev × (Window − elapsed) / Window + cur
//
// (the previous window's events assumed spread evenly), and a request
// costing c passes when estimate + c ≤ Events. Computed exactly, in
// integers: prev × (Window − elapsed) ≤ (Events − cur − c) × Window. There
// is no burst (Validate refuses one). Remaining is ⌊Events − estimate⌋;
// ResetAfter is when the estimate is back to 0 (the end of the current
// window if only prev counts, of the next one if cur does).
//
// Error bound. The estimate is exact when each window's events are spread
// evenly; otherwise it errs either way:
//
//   - Over-admission: any span of Window meets at most two aligned windows,
//     each admitting at most Events, so at most 2×Events − 1 unit-cost
//     requests pass in any span of Window (the previous window's share of
//     the span is its full count only if that window was full at its very
//     end, and then its weight keeps the next one below Events until the
//     span has moved on). This bound is reached by an adversary that fills
//     a window in its last millisecond and then spends as fast as the
//     estimate allows. The excess over a true sliding count is at most
//     prev × elapsed / Window (the part of prev the estimate discounts).
//   - Under-admission: when the previous window's events came early, the
//     estimate still counts events that already left the sliding window.
//
// TestSlidingWindowErrorBound measures it (100 per 10s, the most admitted in
// any span of 10s): steady Poisson traffic at 3× the limit, 104 (+4%);
// traffic bunched in the last 5% of each window, 114 (+14%); the adversary
// above, 199 (2×Events − 1, the bound).
//
// Precision: integer-exact (every product ≤ Events × Window ≤ 2^53).
// Retry-After is exact for the estimate: the estimate never grows while
// nobody spends (prev's weight falls within a window, and at a boundary
// prev×1/Window + cur drops to cur), so the first instant the request
// passes is well defined; it is computed in closed form, and 1ms sooner the
// request is refused.
//
// A changed limit: a changed Events applies at once, with both counts
// capped at the new Events (a lowered limit thus counts at most one full
// window of old traffic twice over, never more). A changed Window re-bins
// the counts, independent of now: prev + cur (capped at Events) become the
// count of the new aligned window containing the old current window's
// start, and roll on from there; nothing counted is forgotten early unless
// the new window is shorter. A clock stepping back stays at the stored
// window's start (the lag is added to the times reported).
func slidingWindow(st State, fresh bool, l Limit, now, cost int64) (Decision, State, int64) {
	n, w := l.Events, l.Window
	var s, prev, cur int64
	if !fresh && st.Scale > 0 {
		s, prev, cur = st.At, min(max(st.Prev, 0), n), min(max(st.Debt, 0), n)
		if st.Scale != w {
			s = floorDiv(s, w) * w
			cur += min(prev, n-cur)
			prev = 0
		}
	} else {
		s = floorDiv(now, w) * w
	}
	vnow := max(now, s)
	switch {
	case vnow >= s+2*w:
		prev, cur, s = 0, 0, floorDiv(vnow, w)*w
	case vnow >= s+w:
		prev, cur, s = cur, 0, s+w
	}
	elapsed := vnow - s
	weighted := prev * (w - elapsed) // the estimate's prev part, × w

	d := Decision{Limit: n}
	if cost > n {
		d.RetryAfter = ms(w)
	} else if cost <= n-cur && weighted <= (n-cur-cost)*w {
		cur += cost
		d.Allowed = true
	} else {
		// The first instant t the request passes, nobody else spending.
		var t int64
		if a := n - cur - cost; a >= 0 && prev > 0 {
			// Still in this window: prev × (w − e) ≤ a × w.
			t = s + w - (a*w)/prev
		} else {
			// In the next window: prev' = cur, cur' = 0; when cur = 0 at
			// its start, otherwise when cur × (w − e) ≤ (n − cost) × w.
			t = s + w
			if cur > 0 {
				t += max(w-((n-cost)*w)/cur, 0)
			}
		}
		d.RetryAfter = ms(t - now)
	}
	d.Remaining = max(n-cur-ceilDiv(prev*(w-elapsed), w), 0)
	fullAt := now
	switch {
	case cur > 0:
		fullAt = s + 2*w
	case prev > 0:
		fullAt = s + w
	}
	d.ResetAfter = ms(fullAt - now)
	return d, State{Alg: SlidingWindow, Debt: cur, Prev: prev, At: s, Scale: w}, fullAt
}

// floorDiv returns ⌊a/b⌋ for b > 0.
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}
