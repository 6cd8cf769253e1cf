package algorithms

// slidingWindow is the sliding window counter step function. The key
// counts the current aligned window's events (cur) and the previous one's
// (prev); at elapsed ms into the current window the sliding window is
// estimated as
//
//	estimate = prev × (Window − elapsed) / Window + cur
//
// and a request costing c passes when estimate + c ≤ Events, computed in
// integers: prev × (Window − elapsed) ≤ (Events − cur − c) × Window. No
// burst (Validate refuses one). Remaining is ⌊Events − estimate⌋;
// ResetAfter is when the estimate is back to 0. RetryAfter is computed in
// closed form, exact for the estimate. Its error bound (at most
// 2×Events − 1 in any span of Window) and changed limits:
// docs/algorithms.md.
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
