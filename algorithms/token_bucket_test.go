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

// ceilMsRat is ⌈x / rate⌉ in whole milliseconds (0 for x ≤ 0).
func ceilMsRat(x, rate *big.Rat) int64 {
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

// debtModel is the continuous token bucket in rationals, kept as the debt
// (tokens spent and not yet refilled): it refills at Events/Window tokens per
// ms down to 0 owed, and a key owing d has Capacity − d tokens left.
type debtModel struct {
	debt *big.Rat // tokens owed
	last int64
}

// step runs one request against the model under l at now and returns the
// expected decision and the debt to compare with the stored state. The model
// keeps the new debt only when commit is true and the request was allowed.
func (m *debtModel) step(l Limit, now, cost int64, commit bool) (Decision, *big.Rat) {
	capR := new(big.Rat).SetInt64(l.Capacity())
	rate := big.NewRat(l.Events, l.Window) // tokens per ms
	debt := new(big.Rat).Set(m.debt)
	if debt.Cmp(capR) > 0 { // a debt above the capacity is an empty bucket
		debt.Set(capR)
	}
	if now > m.last {
		el := new(big.Rat).SetInt64(now - m.last)
		debt.Sub(debt, el.Mul(el, rate))
		if debt.Sign() < 0 {
			debt.SetInt64(0)
		}
	}
	costR := new(big.Rat).SetInt64(cost)
	left := new(big.Rat).Sub(capR, debt)
	d := Decision{Limit: l.Capacity(), Allowed: cost <= l.Capacity() && left.Cmp(costR) >= 0}
	if d.Allowed {
		debt.Add(debt, costR)
		left.Sub(left, costR)
	} else if cost > l.Capacity() {
		d.RetryAfter = msDur(l.Window)
	} else {
		d.RetryAfter = msDur(ceilMsRat(new(big.Rat).Sub(costR, left), rate))
	}
	d.Remaining = new(big.Int).Quo(left.Num(), left.Denom()).Int64()
	d.ResetAfter = msDur(ceilMsRat(debt, rate))
	if commit && d.Allowed {
		m.debt, m.last = debt, max(now, m.last)
	}
	return d, debt
}

// checkStoredDebt fails unless next holds exactly debt tokens on l's scale.
func checkStoredDebt(t *testing.T, what string, l Limit, next State, debt *big.Rat) {
	t.Helper()
	want := new(big.Rat).Mul(debt, new(big.Rat).SetInt64(l.Window))
	if next.Scale != l.Window || !want.IsInt() || want.Num().Int64() != next.Debt {
		t.Fatalf("%s: stored %+v, want Debt %s on scale %d", what, next, want.RatString(), l.Window)
	}
}

// The integer model agrees exactly with a continuous model in rationals:
// tokens refill at Events/Window per ms, the debt never goes below 0 nor the
// tokens left above Capacity, and the stored Debt is exactly the debt owed,
// scaled by the window.
func TestMatchesRationalModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, l := range testLimits {
		m := debtModel{debt: new(big.Rat), last: t0}
		var st State
		fresh := true
		now := t0
		refusals := 0
		for i := 0; i < 2000; i++ {
			now += rng.Int64N(2*l.Window/max(l.Events, 1) + 2)
			cost := 1 + rng.Int64N(l.Capacity())
			want, debt := m.step(l, now, cost, true)

			d, next, fullAt := Step(st, fresh, l, now, cost)
			what := fmt.Sprintf("%+v step %d at +%dms cost %d", l, i, now-t0, cost)
			if d != want {
				t.Fatalf("%s: got %+v, want %+v", what, d, want)
			}
			if fullAt != now+want.ResetAfter.Milliseconds() {
				t.Fatalf("%s: fullAt = %d, want %d", what, fullAt, now+want.ResetAfter.Milliseconds())
			}
			checkStoredDebt(t, what, l, next, debt)
			if d.Allowed {
				st, fresh = next, false
			} else {
				refusals++
			}
		}
		if refusals == 0 {
			t.Fatalf("%+v: the sequence never refused; the test checked little", l)
		}
	}
}

// The same model with the limit changing between requests: the debt carries
// over to the new limit (capped at its capacity), so the tokens left are the
// new capacity minus what was spent. The limits share the window, so every
// quantity stays exact and the integer code must agree bit for bit.
func TestChangingLimitMatchesRationalModel(t *testing.T) {
	limits := []Limit{
		{Events: 1, Window: 1000},
		{Events: 7, Window: 1000},
		{Events: 10, Window: 1000},
		{Events: 5, Window: 1000, Burst: 20},
		{Events: 20, Window: 1000, Burst: 3},
		{Events: 3, Window: 1000, Burst: 11},
	}
	rng := rand.New(rand.NewPCG(5, 6))
	m := debtModel{debt: new(big.Rat), last: t0}
	var st State
	fresh := true
	now := t0
	refusals := 0
	for i := 0; i < 20000; i++ {
		l := limits[rng.IntN(len(limits))]
		now += rng.Int64N(300)
		cost := rng.Int64N(l.Capacity() + 2) // 0 .. capacity+1
		want, debt := m.step(l, now, cost, true)

		d, next, fullAt := Step(st, fresh, l, now, cost)
		what := fmt.Sprintf("%+v step %d at +%dms cost %d", l, i, now-t0, cost)
		if d != want {
			t.Fatalf("%s: got %+v, want %+v", what, d, want)
		}
		if fullAt != now+want.ResetAfter.Milliseconds() {
			t.Fatalf("%s: fullAt = %d, want %d", what, fullAt, now+want.ResetAfter.Milliseconds())
		}
		checkStoredDebt(t, what, l, next, debt)
		if d.Allowed {
			st, fresh = next, false
		} else {
			refusals++
		}
	}
	if refusals < 100 {
		t.Fatalf("only %d refusals; the test checked little", refusals)
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
			if next.Debt > capacity*l.Window || next.Debt < 0 {
				t.Fatalf("%+v gap %d: stored debt %d out of [0, %d]", l, gap, next.Debt, capacity*l.Window)
			}
			// The stored debt is what is owed after this request: exactly
			// one token if the bucket was full, and never less.
			if next.Debt < l.Window || (wantTok == capacity && next.Debt != l.Window) {
				t.Fatalf("%+v gap %d: stored debt %d, want %d (one token) or more when not full", l, gap, next.Debt, l.Window)
			}
			if d.ResetAfter < 0 || d.ResetAfter > msDur(ceilDivTest(capacity*l.Window, l.Events)) {
				t.Fatalf("%+v gap %d: ResetAfter %v", l, gap, d.ResetAfter)
			}
			if fullAt < now {
				t.Fatalf("%+v gap %d: fullAt %d before now %d (overflow?)", l, gap, fullAt, now)
			}
		}
		// A full bucket (nothing owed) stays exactly full however long it idles.
		full := State{Debt: 0, At: t0, Scale: l.Window}
		for _, gap := range gaps {
			d, next, _ := Step(full, false, l, t0+gap, 0)
			if d.Remaining != capacity || next.Debt != 0 || d.ResetAfter != 0 {
				t.Fatalf("%+v idle %d: full bucket became %+v / %+v", l, gap, d, next)
			}
		}
		// A stored state claiming a debt above the capacity counts as an
		// empty bucket (not a deeper one): it is back to full one full
		// refill later, not after paying the absurd debt off.
		over := State{Debt: math.MaxInt64, At: t0, Scale: l.Window}
		if d, next, _ := Step(over, false, l, t0, 0); d.Remaining != 0 || next.Debt != capacity*l.Window {
			t.Fatalf("%+v: corrupt state gave Remaining %d / Debt %d, want 0 / %d", l, d.Remaining, next.Debt, capacity*l.Window)
		}
		if d, _, _ := Step(over, false, l, t0+ceilDivTest(capacity*l.Window, l.Events), 0); d.Remaining != capacity {
			t.Fatalf("%+v: corrupt state gave Remaining %d one full refill later, want %d", l, d.Remaining, capacity)
		}
		if d, _, _ := Step(over, false, l, t0+year, 0); d.Remaining != capacity {
			t.Fatalf("%+v: corrupt state gave Remaining %d, want %d", l, d.Remaining, capacity)
		}
		// A negative debt is nothing owed: the capacity, and not more.
		under := State{Debt: math.MinInt64, At: t0, Scale: l.Window}
		if d, next, _ := Step(under, false, l, t0, 0); d.Remaining != capacity || next.Debt != 0 {
			t.Fatalf("%+v: negative debt gave %+v / %+v, want Remaining %d and Debt 0", l, d, next, capacity)
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

// A refusal consumes nothing: the state it returns holds exactly the debt
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
			if next.Debt != refilled.Debt || next.At != refilled.At || next.Scale != refilled.Scale {
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
			if next.Debt != 0 {
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
	if st.Debt != 10*1000 || st.At != at { // all 10 tokens owed
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
	if next.At != at || next.Debt != 10*1000 || fullAt != at+1000 {
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
		if d.Allowed || d.Remaining != 0 || next.Debt != 10*1000 || next.At != at {
			t.Fatalf("now=%d: %+v %+v", now, d, next)
		}
		if d.RetryAfter <= 0 || d.ResetAfter <= 0 {
			t.Fatalf("now=%d: non-positive times %+v", now, d)
		}
	}
	// With tokens left, a backwards clock may spend them but never adds any.
	half := State{Debt: 5000, At: at, Scale: 1000} // 5 of 10 owed
	d, next, _ = Step(half, false, l, at-10_000, 1)
	if !d.Allowed || d.Remaining != 4 || next.Debt != 6000 || next.At != at {
		t.Fatalf("spend under a backwards clock: %+v %+v", d, next)
	}
}

// spend drains cost tokens from a fresh key under l at t0 and returns the
// state, checking that the key now owes exactly cost tokens.
func spend(t *testing.T, l Limit, cost int64) State {
	t.Helper()
	d, st, _ := Step(State{}, true, l, t0, cost)
	if !d.Allowed || st != (State{Debt: cost * l.Window, At: t0, Scale: l.Window}) {
		t.Fatalf("spending %d under %+v: %+v %+v", cost, l, d, st)
	}
	return st
}

// The state is the debt, so a changed limit applies at once to what the key
// has spent: the tokens left are the new capacity minus the debt (a debt
// above the new capacity is an empty bucket), and a changed window carries
// the tokens owed over, not their scaled units.
func TestChangedLimitAppliesToExistingState(t *testing.T) {
	base := Limit{Events: 10, Window: 1000}
	type want struct {
		allowed          bool
		rem, retry, rest int64 // tokens, ms, ms
		debt, scale      int64 // the state returned
	}
	check := func(name string, st State, l Limit, now, cost int64, w want) {
		t.Helper()
		d, next, fullAt := Step(st, false, l, now, cost)
		wd := Decision{Allowed: w.allowed, Limit: l.Capacity(), Remaining: w.rem,
			RetryAfter: msDur(w.retry), ResetAfter: msDur(w.rest)}
		if d != wd {
			t.Errorf("%s: got %+v, want %+v", name, d, wd)
		}
		if ws := (State{Debt: w.debt, At: now, Scale: w.scale}); next != ws {
			t.Errorf("%s: stored %+v, want %+v", name, next, ws)
		}
		if fullAt != now+w.rest {
			t.Errorf("%s: fullAt now%+d, want now%+d", name, fullAt-now, w.rest)
		}
	}

	// A full bucket of 10 (nothing owed), then a lower burst of 4: 4 left.
	_, full, _ := Step(State{}, true, base, t0, 0)
	if full.Debt != 0 {
		t.Fatalf("full bucket owes %d", full.Debt)
	}
	check("full, burst lowered to 4", full, Limit{Events: 10, Window: 1000, Burst: 4}, t0, 1,
		want{true, 3, 0, 100, 1000, 1000})

	// Raise 3 -> 10 after 3 spent: the 7 not spent are there at once.
	three := Limit{Events: 3, Window: 1000}
	spent3 := spend(t, three, 3)
	if d, _, _ := Step(spent3, false, three, t0, 1); d.Allowed || d.Remaining != 0 {
		t.Fatalf("3 of 3 spent but not empty: %+v", d)
	}
	check("3 spent, raised to 10, cost 0", spent3, base, t0, 0,
		want{true, 7, 0, 300, 3000, 1000})
	check("3 spent, raised to 10, cost 1", spent3, base, t0, 1,
		want{true, 6, 0, 400, 4000, 1000})
	check("3 spent, raised to 10, cost 7", spent3, base, t0, 7,
		want{true, 0, 0, 1000, 10000, 1000})
	check("3 spent, raised to 10, cost 8", spent3, base, t0, 8,
		want{false, 7, 100, 300, 3000, 1000})
	// ... the same through the burst: 3/s with a bucket of 10.
	check("3 spent, burst raised to 10, cost 1", spent3, Limit{Events: 3, Window: 1000, Burst: 10}, t0, 1,
		want{true, 6, 0, 1334, 4000, 1000}) // 4000/3 = 1333.3
	// 2 tokens left of 10 (8 owed); a burst of 50 leaves 42.
	two := State{Debt: 8000, At: t0, Scale: 1000}
	check("8 owed, burst raised to 50", two, Limit{Events: 10, Window: 1000, Burst: 50}, t0, 0,
		want{true, 42, 0, 800, 8000, 1000})

	// Lower 10 -> 3 after 4 spent: the debt is capped at the new capacity
	// (an empty bucket), and the client waits for one token at the new rate.
	spent4 := spend(t, base, 4)
	check("4 spent, lowered to 3/s", spent4, three, t0, 1,
		want{false, 0, 334, 1000, 3000, 1000}) // 1000/3 = 333.3; 3000/3
	if d, _, _ := Step(spent4, false, three, t0+333, 1); d.Allowed {
		t.Errorf("4 spent, lowered to 3/s: allowed 1ms before Retry-After: %+v", d)
	}
	check("4 spent, lowered to 3/s, after Retry-After", spent4, three, t0+334, 1,
		want{true, 0, 0, 1000, 2998, 1000}) // 3000-1002 owed +1000 = 2998, /3 = 999.3
	// ... and through the burst: still 10/s, so one token is 100ms.
	burst3 := Limit{Events: 10, Window: 1000, Burst: 3}
	check("4 spent, burst lowered to 3", spent4, burst3, t0, 1,
		want{false, 0, 100, 300, 3000, 1000})
	check("4 spent, burst lowered to 3, 100ms later", spent4, burst3, t0+100, 1,
		want{true, 0, 0, 300, 3000, 1000})
	// The cap applies before the refill: 4 owed of 3 is 3 owed, so a
	// second later under 3/s the key is full again, not still 1 short.
	check("4 spent, lowered to 3/s, 1s later", spent4, three, t0+1000, 0,
		want{true, 3, 0, 0, 0, 1000})

	// Lower 10 -> 3 after 2 spent: 1 left.
	spent2 := spend(t, base, 2)
	check("2 spent, lowered to 3/s, cost 0", spent2, three, t0, 0,
		want{true, 1, 0, 667, 2000, 1000}) // 2000/3 = 666.7
	check("2 spent, lowered to 3/s, cost 1", spent2, three, t0, 1,
		want{true, 0, 0, 1000, 3000, 1000})
	check("2 spent, lowered to 3/s, cost 2", spent2, three, t0, 2,
		want{false, 1, 334, 667, 2000, 1000}) // 1 token short: 1000/3 = 333.3

	// A changed window carries the tokens owed over: 2.5 owed on a 1000ms
	// scale are 2.5 owed on a 2000ms one (5000 units), 7.5 left.
	owe25 := State{Debt: 2500, At: t0, Scale: 1000}
	slower := Limit{Events: 10, Window: 2000}
	check("2.5 owed, window 1000 -> 2000", owe25, slower, t0, 0,
		want{true, 7, 0, 500, 5000, 2000}) // 5000 units at 10/ms
	check("2.5 owed, window 1000 -> 2000, cost 7", owe25, slower, t0, 7,
		want{true, 0, 0, 1900, 19000, 2000})
	check("2.5 owed, window 1000 -> 2000, cost 8", owe25, slower, t0, 8,
		want{false, 7, 100, 500, 5000, 2000}) // 0.5 token short = 1000 units at 10/ms
	// ... and back: 5000 units on a 2000ms scale are 2500 on a 1000ms one.
	check("2.5 owed, window 2000 -> 1000", State{Debt: 5000, At: t0, Scale: 2000}, base, t0, 0,
		want{true, 7, 0, 250, 2500, 1000})
	// 6 tokens left of 10 (4 owed) on a 1000ms scale; a 2000ms window
	// keeps 6 left, and so does a 500ms one.
	six := State{Debt: 4000, At: t0, Scale: 1000}
	check("4 owed, window 1000 -> 2000", six, slower, t0, 1,
		want{true, 5, 0, 1000, 10000, 2000}) // 5 owed at 10 per 2s
	check("4 owed, window 1000 -> 500", six, Limit{Events: 10, Window: 500}, t0, 1,
		want{true, 5, 0, 250, 2500, 500})
	// A window change that also lowers the capacity caps after rescaling:
	// 7 owed (scale 1000) -> 14000 units on 2000ms, capped at 3×2000.
	check("7 owed, window 1000 -> 2000 and capacity 3", State{Debt: 7000, At: t0, Scale: 1000},
		Limit{Events: 3, Window: 2000}, t0, 0,
		want{true, 0, 0, 2000, 6000, 2000})

	// Rescaling a debt whose scaled value exceeds the new full capacity
	// caps it at the new full capacity (an empty bucket) ...
	bigDebt := State{Debt: 10 * (1 << 40), At: t0, Scale: 1 << 40} // 10 owed
	check("10 owed, rescaled to 3 per 1ms", bigDebt, Limit{Events: 3, Window: 1}, t0, 0,
		want{true, 0, 0, 1, 3, 1})
	// ... while a debt that fits carries over: 1 owed of 3.
	check("1 owed, rescaled to 3 per 1ms", State{Debt: 1 << 40, At: t0, Scale: 1 << 40},
		Limit{Events: 3, Window: 1}, t0, 0,
		want{true, 2, 0, 1, 1, 1})
	// An extreme rescale (the product would overflow 64 bits) caps rather
	// than wraps.
	huge := State{Debt: math.MaxInt64 / 2, At: t0, Scale: 1}
	hugeL := Limit{Events: 1, Window: 1 << 40, Burst: 5}
	check("overflowing rescale", huge, hugeL, t0, 0,
		want{true, 0, 0, 5 << 40, 5 << 40, 1 << 40})
	check("overflowing rescale, cost 1", huge, hugeL, t0, 1,
		want{false, 0, 1 << 40, 5 << 40, 5 << 40, 1 << 40})

	// An absurd stored debt is clamped to [0, full] without panic, on the
	// limit's own scale and through a rescale.
	for _, c := range []struct {
		debt, scale int64
		l           Limit
		left        int64 // tokens left
	}{
		{math.MaxInt64, 1000, base, 0},
		{math.MaxInt64, 1, base, 0},
		{math.MaxInt64, 2, base, 0},
		{math.MaxInt64, math.MaxInt64, base, 9}, // exactly 1 token owed: not absurd, and rescaled exactly
		{math.MaxInt64, 7, Limit{Events: 3, Window: 7, Burst: 11}, 0},
		{-1, 1000, base, 10},
		{math.MinInt64, 1000, base, 10},
		{math.MinInt64, 1, base, 10},
		{math.MinInt64, math.MaxInt64, Limit{Events: 3, Window: 7, Burst: 11}, 11},
	} {
		name := fmt.Sprintf("absurd debt %d on scale %d", c.debt, c.scale)
		owed := (c.l.Capacity() - c.left) * c.l.Window
		check(name, State{Debt: c.debt, At: t0, Scale: c.scale}, c.l, t0, 0,
			want{true, c.left, 0, ceilDivTest(owed, c.l.Events), owed, c.l.Window})
		// The clamped debt then refills normally.
		if d, _, _ := Step(State{Debt: c.debt, At: t0, Scale: c.scale}, false, c.l, t0+year, 1); !d.Allowed || d.Remaining != c.l.Capacity()-1 {
			t.Errorf("%s: a year later %+v, want Remaining %d", name, d, c.l.Capacity()-1)
		}
	}
}

// A window change rescales the debt to a new unit; when it does not divide
// exactly, the rounding must not favour the client: the tokens left after the
// change are never more than the tokens left before it (for the same
// capacity). Before the debt change this was "fractional tokens round down,
// never up" (2.5 tokens left on a 1000ms scale became 7 units on a 3ms one).
func TestWindowChangeNeverRoundsInTheClientsFavour(t *testing.T) {
	// 2.5 left of 10 (7.5 owed) on a 1000ms scale -> 10 per 3ms: 7.5 owed
	// are 22.5 units, which must count as 23 owed (7 left, 2.33 tokens),
	// not 22 (8 left, 2.67 tokens: a sixth of a token never spent back).
	frac := State{Debt: 7500, At: t0, Scale: 1000}
	d, next, _ := Step(frac, false, Limit{Events: 10, Window: 3}, t0, 0)
	if d.Remaining != 2 || next.Debt != 23 {
		t.Errorf("fractional rescale: %+v %+v, want Remaining 2 and Debt 23 (2500*3/1000 = 7.5 -> 7 units left)", d, next)
	}
	// Observable: 2.001 owed (7.999 left) on a 1000ms scale must not pay for
	// 8 tokens on a 3ms scale (6.003 units owed; 6 would leave exactly 24).
	d, next, _ = Step(State{Debt: 2001, At: t0, Scale: 1000}, false, Limit{Events: 10, Window: 3}, t0, 8)
	if d.Allowed {
		t.Errorf("7.999 tokens left paid for 8 after a window change: %+v %+v", d, next)
	}
	// Property: for random debts and windows, the tokens left after the
	// change (full − stored debt, in tokens) never exceed those before.
	rng := rand.New(rand.NewPCG(7, 8))
	for i := 0; i < 10000; i++ {
		capacity := 1 + rng.Int64N(50)
		from, to := 1+rng.Int64N(5000), 1+rng.Int64N(5000)
		debt := rng.Int64N(capacity*from + 1)
		l := Limit{Events: 1 + rng.Int64N(20), Window: to, Burst: capacity}
		_, next, _ := Step(State{Debt: debt, At: t0, Scale: from}, false, l, t0, 0)
		// left after / to <= left before / from, cross-multiplied.
		before := new(big.Int).Mul(big.NewInt(capacity*from-debt), big.NewInt(to))
		after := new(big.Int).Mul(big.NewInt(capacity*to-next.Debt), big.NewInt(from))
		if after.Cmp(before) > 0 {
			t.Fatalf("debt %d on scale %d -> %d on scale %d (capacity %d): %d/%d tokens left became %d/%d",
				debt, from, next.Debt, to, capacity, capacity*from-debt, from, capacity*to-next.Debt, to)
		}
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
		// capacity × window + events == 2^53 is the largest allowed.
		{Limit{Events: 1 << 20, Window: 1<<33 - 1, Burst: 1 << 20}, nil},
		{Limit{Events: 1<<20 + 1, Window: 1<<33 - 1, Burst: 1 << 20}, ErrTooWide},
		{Limit{Events: 1 << 33, Window: 1 << 20}, ErrTooWide}, // capacity × window alone is 2^53
		{Limit{Events: 1 << 13, Window: 1 << 20, Burst: 1<<33 - 1}, nil},
		{Limit{Events: 1 << 13, Window: 1 << 20, Burst: 1 << 33}, ErrTooWide},
		// A full refill longer than MaxRefill (100 years) is refused.
		{Limit{Events: 1, Window: 1 << 20, Burst: 1<<33 - 1}, ErrTooSlow},
		{Limit{Events: 1, Window: 1 << 20, Burst: 1<<33 + 1}, ErrTooWide},
		{Limit{Events: 1, Window: MaxRefill}, nil},
		{Limit{Events: 1, Window: MaxRefill + 1}, ErrTooSlow},
		{Limit{Events: 1, Window: 1<<53 + 1}, ErrTooWide},
		{Limit{Events: 3, Window: (1<<53)/3 + 1}, ErrTooWide}, // 3×w = 2^53+2 (not divisible)
		{Limit{Events: 3 << 20, Window: (1<<53)/(3<<20) - 1}, nil},
		{Limit{Events: 1 << 52, Window: 1}, nil},
		{Limit{Events: 1 << 53, Window: 1}, ErrTooWide},
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
		{Events: 1 << 52, Window: 1},
		{Events: 1 << 20, Window: 1<<33 - 1, Burst: 1 << 20},
		{Events: 1 << 13, Window: 1 << 20, Burst: 1<<33 - 1},
		{Events: 1<<53 - 2, Window: 1, Burst: 2},
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
	checkSane(t, Limit{Events: 1<<53 - 2, Window: 1, Burst: 2})
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
	st := State{Debt: 2000, At: t0, Scale: 1000} // 1 of 3 tokens left
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
