package algorithms

// Charges added after their decision: the asynchronous mode (a zone's
// sync) decides a key on each instance from its state as last read plus
// the instance's own charges since, and adds those charges to the shared
// state once per interval. Only the counters add naturally: fixed_window
// and sliding_window count units per aligned window, so a charge tagged
// with its window's start counts where it would have counted had it been
// decided at once. A bucket (token_bucket, gcra) refills between the
// decision and the addition, and the sliding log needs every charge's
// instant: docs/redis.md, "The asynchronous mode".

// Syncable reports whether alg's state can take charges added later.
func Syncable(alg Algorithm) bool { return alg == FixedWindow || alg == SlidingWindow }

// WindowCharge is Units charged in the aligned window of a limit that
// starts at Start (Unix ms, a multiple of the window).
type WindowCharge struct {
	Start, Units int64
}

// WindowStart is the start of the aligned window of length w holding now.
func WindowStart(now, w int64) int64 { return floorDiv(now, w) * w }

// AddCharges adds charges to a fixed_window or sliding_window state at
// now: the state is first run forward to now as its step does; a charge
// counts in the state's current window when its window is that one or a
// later one (an instance whose clock runs ahead), in the previous one
// (sliding_window) when its window is that one, and not at all when its
// window has ended (it can refuse nothing any more). Each count is capped
// at the limit's events, which refuses as much as any larger count. It
// returns the state, when it is back to full (fullAt, Unix ms), and
// whether a charge counted (else the stored state needs no write).
func AddCharges(st State, fresh bool, l Limit, now int64, charges []WindowCharge) (next State, fullAt int64, counted bool) {
	if !fresh && st.Alg != l.Algorithm {
		fresh = true
	}
	n, w := l.Events, l.Window
	if l.Algorithm == FixedWindow {
		count, start, length := int64(0), WindowStart(now, w), w
		if !fresh && st.Scale > 0 && now < st.At+st.Scale {
			count, start, length = min(max(st.Debt, 0), n), st.At, st.Scale
		}
		for _, c := range charges {
			if c.Units > 0 && c.Start+w > start {
				count = min(count+c.Units, n)
				counted = true
			}
		}
		fullAt = now
		if count > 0 {
			fullAt = start + length
		}
		return State{Alg: FixedWindow, Debt: count, At: start, Scale: length}, fullAt, counted
	}
	// The sliding window, rolled forward as slidingWindow rolls it.
	var s, prev, cur int64
	if !fresh && st.Scale > 0 {
		s, prev, cur = st.At, min(max(st.Prev, 0), n), min(max(st.Debt, 0), n)
		if st.Scale != w {
			s = floorDiv(s, w) * w
			cur += min(prev, n-cur)
			prev = 0
		}
	} else {
		s = WindowStart(now, w)
	}
	vnow := max(now, s)
	switch {
	case vnow >= s+2*w:
		prev, cur, s = 0, 0, floorDiv(vnow, w)*w
	case vnow >= s+w:
		prev, cur, s = cur, 0, s+w
	}
	for _, c := range charges {
		switch {
		case c.Units <= 0:
		case c.Start >= s:
			cur = min(cur+c.Units, n)
			counted = true
		case c.Start >= s-w:
			prev = min(prev+c.Units, n)
			counted = true
		}
	}
	fullAt = now
	switch {
	case cur > 0:
		fullAt = s + 2*w
	case prev > 0:
		fullAt = s + w
	}
	return State{Alg: SlidingWindow, Debt: cur, Prev: prev, At: s, Scale: w}, fullAt, counted
}
