package algorithms

import (
	"errors"
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
	"testing"
	"time"
)

// t0 is an arbitrary, realistic Unix millisecond (2026-ish).
const t0 = int64(1_780_000_000_000)

const (
	second = int64(1000)
	minute = 60 * second
	hour   = 60 * minute
	day    = 24 * hour
	year   = 365 * day
)

// testLimits covers burst == events, burst > events, burst < events, odd
// windows and rates that do not divide the window.
var testLimits = []Limit{
	{Events: 1, Window: 1000},
	{Events: 10, Window: minute},
	{Events: 7, Window: 1000},
	{Events: 20, Window: hour},
	{Events: 5, Window: 1000, Burst: 20},
	{Events: 20, Window: 1000, Burst: 3},
	{Events: 3, Window: 7, Burst: 11},
	{Events: 13, Window: 997, Burst: 13},
	{Events: 1000, Window: 3_600_000},
	{Events: 1, Window: day, Burst: 2},
}

func costsFor(l Limit) []int64 {
	var out []int64
	for _, c := range []int64{1, 2, 3, 5, 7} {
		if c <= l.Capacity() {
			out = append(out, c)
		}
	}
	return out
}

func msDur(n int64) time.Duration { return time.Duration(n) * time.Millisecond }

// ceilDivTest is an independent ⌈a/b⌉ for the expectations.
func ceilDivTest(a, b int64) int64 {
	if a <= 0 {
		return 0
	}
	return (a + b - 1) / b
}

func TestLimitsUnderTestAreValid(t *testing.T) {
	for _, l := range testLimits {
		if err := l.Validate(); err != nil {
			t.Fatalf("%+v: %v", l, err)
		}
	}
}

// A fresh bucket admits exactly ⌊Capacity/cost⌋ requests at one instant, then
// refuses; waiting exactly RetryAfter lets the same request pass, one
// millisecond less does not.
func TestFreshBucketAdmitsCapacityThenRetryAfterIsExact(t *testing.T) {
	for _, l := range testLimits {
		for _, cost := range costsFor(l) {
			t.Run(fmt.Sprintf("%d/%dms_burst%d_cost%d", l.Events, l.Window, l.Burst, cost), func(t *testing.T) {
				capacity := l.Capacity()
				var st State
				fresh := true
				admitted := int64(0)
				var refusal Decision
				for i := int64(0); i < capacity+5; i++ {
					d, next, _ := Step(st, fresh, l, t0, cost)
					if !d.Allowed {
						refusal = d
						break
					}
					admitted++
					st, fresh = next, false
					if d.RetryAfter != 0 {
						t.Fatalf("allowed decision has RetryAfter %v", d.RetryAfter)
					}
					if want := capacity - admitted*cost; d.Remaining != want {
						t.Fatalf("request %d: Remaining = %d, want %d", admitted, d.Remaining, want)
					}
				}
				if want := capacity / cost; admitted != want {
					t.Fatalf("admitted %d at one instant, want exactly %d", admitted, want)
				}
				if refusal.Allowed || refusal.RetryAfter <= 0 {
					t.Fatalf("expected a refusal with a positive RetryAfter, got %+v", refusal)
				}
				if refusal.Limit != capacity {
					t.Fatalf("Limit = %d, want %d", refusal.Limit, capacity)
				}
				// Hand formula: the deficit in tokens, times the window, over the rate.
				left := capacity - admitted*cost
				wantRA := ceilDivTest((cost-left)*l.Window, l.Events)
				if refusal.RetryAfter != msDur(wantRA) {
					t.Fatalf("RetryAfter = %v, want %v", refusal.RetryAfter, msDur(wantRA))
				}
				ra := refusal.RetryAfter.Milliseconds()
				if d, _, _ := Step(st, false, l, t0+ra-1, cost); d.Allowed {
					t.Fatalf("passed 1ms before RetryAfter (%dms)", ra)
				}
				d, _, _ := Step(st, false, l, t0+ra, cost)
				if !d.Allowed {
					t.Fatalf("refused exactly RetryAfter (%dms) later: %+v", ra, d)
				}
			})
		}
	}
}

// After any sequence, every refusal's RetryAfter is exact: the same request
// passes exactly RetryAfter later and not 1ms sooner.
func TestRetryAfterExactAtRandomInstants(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, l := range testLimits {
		var st State
		fresh := true
		now := t0
		refusals := 0
		for i := 0; i < 3000; i++ {
			now += rng.Int64N(l.Window/max(l.Events, 1) + 2)
			cost := 1 + rng.Int64N(l.Capacity())
			d, next, _ := Step(st, fresh, l, now, cost)
			if d.Allowed {
				st, fresh = next, false
				continue
			}
			refusals++
			ra := d.RetryAfter.Milliseconds()
			if ra <= 0 || d.RetryAfter != msDur(ra) {
				t.Fatalf("%+v at %d cost %d: RetryAfter %v is not a positive whole ms", l, now, cost, d.RetryAfter)
			}
			if d2, _, _ := Step(st, fresh, l, now+ra-1, cost); d2.Allowed {
				t.Fatalf("%+v: passed at RetryAfter-1ms (%d)", l, ra)
			}
			if d2, _, _ := Step(st, fresh, l, now+ra, cost); !d2.Allowed {
				t.Fatalf("%+v: refused at exactly RetryAfter (%d)", l, ra)
			}
		}
		if refusals == 0 {
			t.Fatalf("%+v: the sequence never refused; the test checked nothing", l)
		}
	}
}

// The integer model agrees exactly with a continuous model in rationals:
// tokens refill at Events/Window per ms, capped at Capacity.
func TestMatchesRationalModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, l := range testLimits {
		capR := new(big.Rat).SetInt64(l.Capacity())
		rate := big.NewRat(l.Events, l.Window) // tokens per ms
		tokens := new(big.Rat).Set(capR)
		last := t0
		var st State
		fresh := true
		now := t0
		for i := 0; i < 2000; i++ {
			now += rng.Int64N(2*l.Window/max(l.Events, 1) + 2)
			cost := 1 + rng.Int64N(l.Capacity())
			// model refill
			el := new(big.Rat).SetInt64(now - last)
			tokens.Add(tokens, el.Mul(el, rate))
			if tokens.Cmp(capR) > 0 {
				tokens.Set(capR)
			}
			last = now
			costR := new(big.Rat).SetInt64(cost)
			wantAllowed := tokens.Cmp(costR) >= 0
			if wantAllowed {
				tokens.Sub(tokens, costR)
			}
			// ceil(x / rate) in ms
			ceilMs := func(x *big.Rat) int64 {
				if x.Sign() <= 0 {
					return 0
				}
				q := new(big.Rat).Quo(x, rate)
				n := new(big.Int).Quo(q.Num(), q.Denom())
				if new(big.Rat).SetInt(n).Cmp(q) < 0 {
					n.Add(n, big.NewInt(1))
				}
				return n.Int64()
			}
			floorTok := new(big.Int).Quo(tokens.Num(), tokens.Denom()).Int64()
			wantReset := ceilMs(new(big.Rat).Sub(capR, tokens))
			var wantRA int64
			if !wantAllowed {
				wantRA = ceilMs(new(big.Rat).Sub(costR, tokens))
			}

			d, next, fullAt := Step(st, fresh, l, now, cost)
			if d.Allowed != wantAllowed || d.Remaining != floorTok ||
				d.RetryAfter != msDur(wantRA) || d.ResetAfter != msDur(wantReset) {
				t.Fatalf("%+v step %d at +%dms cost %d: got %+v, want allowed=%v remaining=%d retry=%dms reset=%dms",
					l, i, now-t0, cost, d, wantAllowed, floorTok, wantRA, wantReset)
			}
			if fullAt != now+wantReset {
				t.Fatalf("fullAt = %d, want %d", fullAt, now+wantReset)
			}
			if d.Allowed {
				st, fresh = next, false
			}
		}
	}
}

func TestNeverExceedsCapacityAfterIdle(t *testing.T) {
	gaps := []int64{1, 999, second, minute, hour, day, year, 10 * year, 1000 * year, 1 << 50, 1 << 61}
	for _, l := range testLimits {
		capacity := l.Capacity()
		// Drain the bucket completely at t0.
		st := State{}
		fresh := true
		for {
			d, next, _ := Step(st, fresh, l, t0, 1)
			if !d.Allowed {
				break
			}
			st, fresh = next, false
		}
		for _, gap := range gaps {
			now := t0 + gap
			d, next, fullAt := Step(st, false, l, now, 1)
			if !d.Allowed {
				// Only possible for gaps shorter than one token's refill.
				if gap*l.Events >= l.Window {
					t.Fatalf("%+v gap %d: refused: %+v", l, gap, d)
				}
				if d.Remaining != 0 {
					t.Fatalf("%+v gap %d: Remaining %d, want 0", l, gap, d.Remaining)
				}
				continue
			}
			wantTok := capacity
			if gap < l.Window*capacity { // else certainly full (and the product could overflow)
				wantTok = min(capacity, gap*l.Events/l.Window)
			}
			if d.Remaining != wantTok-1 {
				t.Fatalf("%+v gap %d: Remaining %d, want %d", l, gap, d.Remaining, wantTok-1)
			}
			if d.Remaining > capacity-1 || d.Remaining < 0 {
				t.Fatalf("%+v gap %d: Remaining %d out of [0, %d]", l, gap, d.Remaining, capacity-1)
			}
			if next.Tokens > capacity*l.Window || next.Tokens < 0 {
				t.Fatalf("%+v gap %d: stored tokens %d out of [0, %d]", l, gap, next.Tokens, capacity*l.Window)
			}
			if d.ResetAfter < 0 || d.ResetAfter > msDur(ceilDivTest(capacity*l.Window, l.Events)) {
				t.Fatalf("%+v gap %d: ResetAfter %v", l, gap, d.ResetAfter)
			}
			if fullAt < now {
				t.Fatalf("%+v gap %d: fullAt %d before now %d (overflow?)", l, gap, fullAt, now)
			}
		}
		// A full bucket stays exactly full however long it idles.
		full := State{Tokens: capacity * l.Window, At: t0, Scale: l.Window}
		for _, gap := range gaps {
			d, next, _ := Step(full, false, l, t0+gap, 0)
			if d.Remaining != capacity || next.Tokens != capacity*l.Window || d.ResetAfter != 0 {
				t.Fatalf("%+v idle %d: full bucket became %+v / %+v", l, gap, d, next)
			}
		}
		// A stored state claiming more than the capacity is capped.
		over := State{Tokens: math.MaxInt64, At: t0, Scale: l.Window}
		if d, _, _ := Step(over, false, l, t0+year, 0); d.Remaining != capacity {
			t.Fatalf("%+v: corrupt state gave Remaining %d, want %d", l, d.Remaining, capacity)
		}
	}
}

// Hand-computed sequences. Store semantics: the state is kept only when the
// request is allowed.
func TestKnownSequences(t *testing.T) {
	type row struct {
		at      int64 // ms after t0
		cost    int64
		allowed bool
		rem     int64
		retry   int64 // ms
		reset   int64 // ms
	}
	cases := []struct {
		limit Limit
		rows  []row
	}{
		{ // 10 per second: one token every 100ms; 10 units per ms on a scale of 1000.
			Limit{Events: 10, Window: 1000},
			[]row{
				{0, 1, true, 9, 0, 100},
				{0, 1, true, 8, 0, 200},
				{50, 1, true, 7, 0, 250},   // +0.5 token -> 8.5, -1 -> 7.5
				{50, 8, false, 7, 50, 250}, // 7.5 < 8; 0.5 token = 50ms
				{100, 8, true, 0, 0, 1000}, // 8.0 - 8 = 0
				{100, 1, false, 0, 100, 1000},
				{1100, 1, true, 9, 0, 100}, // a full window later: full, not more
				{5000, 11, false, 10, 1000, 0},
			},
		},
		{ // 7 per second, burst 3: one token every 142.857ms; 7 units per ms.
			Limit{Events: 7, Window: 1000, Burst: 3},
			[]row{
				{0, 2, true, 1, 0, 286},      // 1000 units; 2000/7 = 285.7
				{0, 2, false, 1, 143, 286},   // deficit 1000/7 = 142.9
				{142, 2, false, 1, 1, 144},   // 1000+994 = 1994; deficit 6 -> 1ms; 1006/7 = 143.7
				{143, 2, true, 0, 0, 429},    // 1000+1001 = 2001 -> 1 unit; 2999/7 = 428.4
				{143, 1, false, 0, 143, 429}, // deficit 999/7 = 142.7
				{1000, 3, true, 0, 0, 429},   // full at 143+429 = 572
			},
		},
		{ // 2 per second, burst 5: one token every 500ms.
			Limit{Events: 2, Window: 1000, Burst: 5},
			[]row{
				{0, 5, true, 0, 0, 2500},
				{499, 1, false, 0, 1, 2001}, // 998 units: 2 units short, at 2 units/ms -> 1ms
				{500, 1, true, 0, 0, 2500},
				{10000, 3, true, 2, 0, 1500},
				{10000, 6, false, 2, 1000, 1500}, // cost > burst: RetryAfter is the window
			},
		},
		{ // 3 per 7ms, burst 11.
			Limit{Events: 3, Window: 7, Burst: 11},
			[]row{
				{0, 11, true, 0, 0, 26}, // 77 units / 3 = 25.67
				{2, 1, false, 0, 1, 24}, // 6 units; need 7 -> 1ms; 71/3 = 23.67
				{3, 1, true, 0, 0, 25},  // 9 - 7 = 2 units; 75/3 = 25
				{3, 2, false, 0, 4, 25}, // need 14, have 2: 12/3 = 4ms
			},
		},
	}
	for _, c := range cases {
		var st State
		fresh := true
		for i, r := range c.rows {
			d, next, fullAt := Step(st, fresh, c.limit, t0+r.at, r.cost)
			want := Decision{Allowed: r.allowed, Limit: c.limit.Capacity(), Remaining: r.rem,
				RetryAfter: msDur(r.retry), ResetAfter: msDur(r.reset)}
			if d != want {
				t.Errorf("%+v row %d (t=%d cost=%d): got %+v, want %+v", c.limit, i, r.at, r.cost, d, want)
			}
			if fullAt != t0+r.at+r.reset {
				t.Errorf("%+v row %d: fullAt %d, want %d", c.limit, i, fullAt-t0, r.at+r.reset)
			}
			if d.Allowed {
				st, fresh = next, false
			}
		}
	}
}

// A refusal consumes nothing: the state it returns holds exactly the tokens
// the key had, and a later request sees the same thing whether or not the
// refusal's state was stored.
func TestRefusalDoesNotChangeState(t *testing.T) {
	for _, l := range testLimits {
		capacity := l.Capacity()
		// Spend all but less than one full request's worth.
		st := State{}
		fresh := true
		for {
			d, next, _ := Step(st, fresh, l, t0, 1)
			if !d.Allowed {
				break
			}
			st, fresh = next, false
		}
		// Partially refill: half a window later (may be full for some limits).
		now := t0 + l.Window/(2*l.Events) + 1
		_, refilled, _ := Step(st, false, l, now, 0)
		for cost := int64(1); cost <= capacity; cost++ {
			d, next, _ := Step(st, false, l, now, cost)
			if d.Allowed {
				continue
			}
			if next.Tokens != refilled.Tokens || next.At != refilled.At || next.Scale != refilled.Scale {
				t.Fatalf("%+v cost %d: refusal returned %+v, want the unchanged %+v", l, cost, next, refilled)
			}
			// Same instant, state already counted at now: bit-for-bit unchanged.
			d2, next2, _ := Step(next, false, l, now, cost)
			if d2 != d || next2 != next {
				t.Fatalf("%+v cost %d: refusing twice changed the answer: %+v/%+v then %+v/%+v", l, cost, d, next, d2, next2)
			}
			// A later request sees the same whether or not the refusal was stored.
			for _, later := range []int64{0, 1, 17, l.Window / 3, l.Window} {
				for _, c2 := range []int64{1, capacity} {
					a, an, af := Step(st, false, l, now+later, c2)
					b, bn, bf := Step(next, false, l, now+later, c2)
					if a != b || an != bn || af != bf {
						t.Fatalf("%+v: after a refusal, request at +%d cost %d differs: %+v vs %+v", l, later, c2, a, b)
					}
				}
			}
		}
	}
}

func TestCostAboveCapacity(t *testing.T) {
	for _, l := range testLimits {
		capacity := l.Capacity()
		for _, cost := range []int64{capacity + 1, 2 * capacity, math.MaxInt64 / (l.Window + 1)} {
			// Fresh key.
			d, next, _ := Step(State{}, true, l, t0, cost)
			if d.Allowed || d.RetryAfter != msDur(l.Window) || d.Remaining != capacity || d.ResetAfter != 0 {
				t.Fatalf("%+v cost %d fresh: %+v", l, cost, d)
			}
			if next.Tokens != capacity*l.Window {
				t.Fatalf("%+v cost %d: consumed from a fresh key: %+v", l, cost, next)
			}
			// Partly spent key.
			_, spent, _ := Step(State{}, true, l, t0, 1)
			d, next, _ = Step(spent, false, l, t0, cost)
			if d.Allowed || d.RetryAfter != msDur(l.Window) || d.Remaining != capacity-1 {
				t.Fatalf("%+v cost %d spent: %+v", l, cost, d)
			}
			if next != spent {
				t.Fatalf("%+v cost %d: state changed from %+v to %+v", l, cost, spent, next)
			}
			if d.ResetAfter != msDur(ceilDivTest(l.Window, l.Events)) {
				t.Fatalf("%+v cost %d: ResetAfter %v", l, cost, d.ResetAfter)
			}
		}
	}
}

func TestClockSteppingBackwards(t *testing.T) {
	l := Limit{Events: 10, Window: 1000}
	// Drain at t0+1000.
	at := t0 + 1000
	var st State
	fresh := true
	for {
		d, next, _ := Step(st, fresh, l, at, 1)
		if !d.Allowed {
			break
		}
		st, fresh = next, false
	}
	if st.Tokens != 0 || st.At != at {
		t.Fatalf("drained state %+v", st)
	}
	// 500ms in the past: nothing refilled, and Retry-After counts the lag.
	d, next, fullAt := Step(st, false, l, at-500, 1)
	if d.Allowed || d.Remaining != 0 {
		t.Fatalf("backwards clock refilled: %+v", d)
	}
	if d.RetryAfter != 600*time.Millisecond || d.ResetAfter != 1500*time.Millisecond {
		t.Fatalf("backwards clock: RetryAfter %v (want 600ms), ResetAfter %v (want 1.5s)", d.RetryAfter, d.ResetAfter)
	}
	if next.At != at || next.Tokens != 0 || fullAt != at+1000 {
		t.Fatalf("backwards clock moved the state: %+v fullAt %d", next, fullAt)
	}
	if d, _, _ := Step(st, false, l, at-500+599, 1); d.Allowed {
		t.Fatalf("allowed 1ms before the lagged Retry-After")
	}
	if d, _, _ := Step(st, false, l, at-500+600, 1); !d.Allowed {
		t.Fatalf("refused at the lagged Retry-After")
	}
	// Far in the past, even negative and extreme instants: no refill, no panic.
	for _, now := range []int64{at - 1, at - year, 0, -1, -year} {
		d, next, _ := Step(st, false, l, now, 1)
		if d.Allowed || d.Remaining != 0 || next.Tokens != 0 || next.At != at {
			t.Fatalf("now=%d: %+v %+v", now, d, next)
		}
		if d.RetryAfter <= 0 || d.ResetAfter <= 0 {
			t.Fatalf("now=%d: non-positive times %+v", now, d)
		}
	}
	// With tokens left, a backwards clock may spend them but never adds any.
	half := State{Tokens: 5000, At: at, Scale: 1000}
	d, next, _ = Step(half, false, l, at-10_000, 1)
	if !d.Allowed || d.Remaining != 4 || next.Tokens != 4000 || next.At != at {
		t.Fatalf("spend under a backwards clock: %+v %+v", d, next)
	}
}

func TestChangedLimitAppliesToExistingState(t *testing.T) {
	base := Limit{Events: 10, Window: 1000}
	// Full bucket of 10, then a lower burst caps it.
	_, st, _ := Step(State{}, true, base, t0, 0)
	lower := Limit{Events: 10, Window: 1000, Burst: 4}
	d, next, _ := Step(st, false, lower, t0, 1)
	if !d.Allowed || d.Remaining != 3 || d.Limit != 4 || next.Tokens != 3000 {
		t.Fatalf("lower burst: %+v %+v", d, next)
	}
	// 2 tokens left; a higher burst does not hand out tokens.
	two := State{Tokens: 2000, At: t0, Scale: 1000}
	higher := Limit{Events: 10, Window: 1000, Burst: 50}
	d, _, _ = Step(two, false, higher, t0, 0)
	if d.Remaining != 2 || d.Limit != 50 {
		t.Fatalf("higher burst: %+v", d)
	}
	// 6 tokens held on a 1000ms scale; a 2000ms window keeps 6 tokens.
	six := State{Tokens: 6000, At: t0, Scale: 1000}
	slower := Limit{Events: 10, Window: 2000}
	d, next, _ = Step(six, false, slower, t0, 1)
	if !d.Allowed || d.Remaining != 5 || next.Scale != 2000 || next.Tokens != 10000 {
		t.Fatalf("longer window: %+v %+v", d, next)
	}
	if d.ResetAfter != time.Second { // 5 tokens at 10 per 2s
		t.Fatalf("longer window ResetAfter %v, want 1s", d.ResetAfter)
	}
	// ... and a 500ms window keeps 6 tokens too.
	faster := Limit{Events: 10, Window: 500}
	d, next, _ = Step(six, false, faster, t0, 1)
	if !d.Allowed || d.Remaining != 5 || next.Scale != 500 || next.Tokens != 2500 {
		t.Fatalf("shorter window: %+v %+v", d, next)
	}
	if d.ResetAfter != 250*time.Millisecond {
		t.Fatalf("shorter window ResetAfter %v, want 250ms", d.ResetAfter)
	}
	// Rescaling to a window whose scaled capacity is smaller than the held
	// units caps at the new capacity.
	big := State{Tokens: 10 * (1 << 40), At: t0, Scale: 1 << 40}
	d, _, _ = Step(big, false, Limit{Events: 3, Window: 1}, t0, 0)
	if d.Remaining != 3 {
		t.Fatalf("rescale cap: %+v", d)
	}
	// Fractional tokens round down, never up.
	frac := State{Tokens: 2500, At: t0, Scale: 1000} // 2.5 tokens
	d, next, _ = Step(frac, false, Limit{Events: 10, Window: 3}, t0, 0)
	if d.Remaining != 2 || next.Tokens != 7 { // 2500*3/1000 = 7.5 -> 7 units = 2.33 tokens
		t.Fatalf("fractional rescale: %+v %+v", d, next)
	}
	// Extreme rescale (would overflow 64 bits) caps rather than wraps.
	huge := State{Tokens: math.MaxInt64 / 2, At: t0, Scale: 1}
	d, _, _ = Step(huge, false, Limit{Events: 1, Window: 1 << 40, Burst: 5}, t0, 0)
	if d.Remaining != 5 {
		t.Fatalf("overflowing rescale: %+v", d)
	}
}

func TestValidate(t *testing.T) {
	cases := []struct {
		l    Limit
		want error
	}{
		{Limit{Events: 1, Window: 1}, nil},
		{Limit{Events: 10, Window: 1000, Burst: 0}, nil},
		{Limit{Events: 0, Window: 1000}, ErrEvents},
		{Limit{Events: -1, Window: 1000}, ErrEvents},
		{Limit{Events: math.MinInt64, Window: 1000}, ErrEvents},
		{Limit{Events: 1, Window: 0}, ErrWindow},
		{Limit{Events: 1, Window: -1000}, ErrWindow},
		{Limit{Events: 1, Window: 1000, Burst: -1}, ErrBurst},
		// capacity × window == 2^53 is the largest allowed.
		{Limit{Events: 1 << 33, Window: 1 << 20}, nil},
		{Limit{Events: 1<<33 + 1, Window: 1 << 20}, ErrTooWide},
		{Limit{Events: 1 << 13, Window: 1 << 20, Burst: 1 << 33}, nil},
		// A full refill longer than MaxRefill (100 years) is refused.
		{Limit{Events: 1, Window: 1 << 20, Burst: 1 << 33}, ErrTooSlow},
		{Limit{Events: 1, Window: 1 << 20, Burst: 1<<33 + 1}, ErrTooWide},
		{Limit{Events: 1, Window: MaxRefill}, nil},
		{Limit{Events: 1, Window: MaxRefill + 1}, ErrTooSlow},
		{Limit{Events: 1, Window: 1<<53 + 1}, ErrTooWide},
		{Limit{Events: 3, Window: (1<<53)/3 + 1}, ErrTooWide}, // 3×w = 2^53+2 (not divisible)
		{Limit{Events: 3 << 20, Window: (1 << 53) / (3 << 20)}, nil},
		{Limit{Events: 1 << 53, Window: 1}, nil},
		{Limit{Events: 1<<53 + 1, Window: 1}, ErrTooMany},
		{Limit{Events: math.MaxInt64, Window: math.MaxInt64}, ErrTooMany},
		{Limit{Events: 1, Window: 1000, Burst: math.MaxInt64}, ErrTooMany},
	}
	for _, c := range cases {
		err := c.l.Validate()
		if !errors.Is(err, c.want) || (c.want == nil) != (err == nil) {
			t.Errorf("%+v: Validate() = %v, want %v", c.l, err, c.want)
		}
	}

	if _, err := NewLimit(TokenBucket, 10, 999*time.Microsecond, 0); !errors.Is(err, ErrWindow) {
		t.Errorf("sub-millisecond window: %v, want ErrWindow", err)
	}
	l, err := NewLimit(TokenBucket, 10, 1500*time.Microsecond, 3)
	if err != nil || l.Window != 1 || l.Events != 10 || l.Burst != 3 || l.Capacity() != 3 {
		t.Errorf("NewLimit 1.5ms: %+v %v", l, err)
	}
	l, err = NewLimit(TokenBucket, 10, time.Minute, 0)
	if err != nil || l.Window != 60_000 || l.Capacity() != 10 {
		t.Errorf("NewLimit 1m: %+v %v", l, err)
	}
}

// checkSane runs a short sequence (times cumulative) and fails on any
// decision outside its contract: Remaining in [0, Capacity], non-negative
// durations, a positive RetryAfter on refusal, a full-at instant not before
// now, and ResetAfter consistent with it.
func checkSane(t *testing.T, l Limit) {
	t.Helper()
	if err := l.Validate(); err != nil {
		t.Fatalf("%+v: Validate: %v (the test expects it accepted)", l, err)
	}
	capacity := l.Capacity()
	var st State
	fresh := true
	now := t0
	for i, step := range []struct{ dt, cost int64 }{
		{0, capacity}, {0, 1}, {1, 1}, {0, capacity}, {l.Window, capacity}, {0, 1}, {year, 1},
	} {
		now += step.dt
		d, next, fullAt := Step(st, fresh, l, now, step.cost)
		if d.Remaining < 0 || d.Remaining > capacity || d.ResetAfter < 0 || d.RetryAfter < 0 ||
			(!d.Allowed && d.RetryAfter <= 0) || fullAt < now || d.ResetAfter != msDur(fullAt-now) {
			t.Errorf("%+v step %d (cost %d): decision out of contract %+v, fullAt = now%+dms", l, i, step.cost, d, fullAt-now)
			return
		}
		if d.Allowed {
			st, fresh = next, false
		}
	}
}

// Limits at the edges of what Validate accepts stay within the contract.
func TestValidatedExtremesStaySane(t *testing.T) {
	for _, l := range []Limit{
		{Events: 1 << 53, Window: 1},
		{Events: 1 << 33, Window: 1 << 20},
		{Events: 1 << 13, Window: 1 << 20, Burst: 1 << 33},
		{Events: 1 << 53, Window: 1, Burst: 2},
		{Events: 1, Window: MaxRefill},
		{Events: 1, Window: 24 * hour, Burst: 1000},
		{Events: 10, Window: 99 * year, Burst: 10},
	} {
		checkSane(t, l)
	}
}

// Validate bounds Events (the refill rate in scaled units per ms) to 2^53,
// so ceilDiv never wraps: limits like `events 9223372036854775807 window 1ms`
// are refused at load instead of yielding negative or zero durations.
func TestHugeEventsAreRefused(t *testing.T) {
	for _, l := range []Limit{
		{Events: math.MaxInt64, Window: 1, Burst: 2},
		{Events: math.MaxInt64, Window: 1000, Burst: 1000},
		{Events: 1<<53 + 1, Window: 1},
	} {
		if err := l.Validate(); !errors.Is(err, ErrTooMany) {
			t.Errorf("%+v: Validate() = %v, want ErrTooMany", l, err)
		}
	}
	checkSane(t, Limit{Events: 1 << 53, Window: 1, Burst: 2})
}

// Decisions carry time.Duration (at most ~292 years), so Validate refuses a
// window or a full refill longer than MaxRefill (100 years); everything it
// admits yields non-negative durations.
func TestLongRefillDurations(t *testing.T) {
	for _, c := range []struct {
		events int64
		window time.Duration
		burst  int64
	}{
		{1, 24 * time.Hour, 200_000},          // 200000 days to refill fully
		{1, 8760 * time.Hour, 1000},           // 1000 years to refill fully
		{10, time.Duration(math.MaxInt64), 1}, // the longest window a Duration holds
		{1, 101 * 365 * 24 * time.Hour, 0},    // a window over 100 years
	} {
		if _, err := NewLimit(TokenBucket, c.events, c.window, c.burst); !errors.Is(err, ErrTooSlow) {
			t.Errorf("NewLimit(%d, %v, %d) = %v, want ErrTooSlow", c.events, c.window, c.burst, err)
		}
	}
	for _, c := range []struct {
		events int64
		window time.Duration
		burst  int64
	}{
		{1, 24 * time.Hour, 36_000},        // ~98.6 years to refill fully
		{10, 99 * 365 * 24 * time.Hour, 1}, // a 99-year window
	} {
		l, err := NewLimit(TokenBucket, c.events, c.window, c.burst)
		if err != nil {
			t.Fatalf("NewLimit(%d, %v, %d): %v", c.events, c.window, c.burst, err)
		}
		checkSane(t, l)
	}
}

func TestParseAlgorithm(t *testing.T) {
	for _, name := range []string{"", "token_bucket"} {
		if a, err := ParseAlgorithm(name); err != nil || a != TokenBucket {
			t.Errorf("ParseAlgorithm(%q) = %v, %v", name, a, err)
		}
	}
	if _, err := ParseAlgorithm("leaky"); err == nil {
		t.Errorf("ParseAlgorithm(leaky) accepted")
	}
	if TokenBucket.String() != "token_bucket" || Algorithm(9).String() != "algorithm(9)" {
		t.Errorf("String: %q %q", TokenBucket.String(), Algorithm(9).String())
	}
}

func TestStepDoesNotAllocate(t *testing.T) {
	l := Limit{Events: 7, Window: 1000, Burst: 3}
	st := State{Tokens: 1000, At: t0, Scale: 1000}
	now := t0
	var sink Decision
	allocs := testing.AllocsPerRun(1000, func() {
		now++
		d, next, _ := Step(st, false, l, now, 1)
		if d.Allowed {
			st = next
		}
		sink = d
	})
	if allocs != 0 {
		t.Fatalf("Step allocates %v times per call, want 0", allocs)
	}
	_ = sink
}

func BenchmarkStep(b *testing.B) {
	b.ReportAllocs()
	l := Limit{Events: 100, Window: 1000, Burst: 200}
	_, st, _ := Step(State{}, true, l, t0, 0)
	now := t0
	for b.Loop() {
		now++
		d, next, _ := Step(st, false, l, now, 1)
		if d.Allowed {
			st = next
		}
	}
}
