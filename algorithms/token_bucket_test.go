package algorithms

// What the token bucket alone promises (token_bucket.go): its state is the
// debt, tokens spent and not yet refilled, kept exactly in integers scaled by
// the window; it agrees bit for bit with the continuous model in rationals,
// refills linearly, applies a changed limit to the debt, and never rounds a
// window change in the client's favour. The properties it shares with every
// algorithm are in properties_test.go.

import (
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
	"testing"
	"time"
)

// A refusal's RetryAfter is the deficit in tokens times the window over the
// rate, rounded up to the millisecond: checked by hand on a fresh bucket
// drained at one instant, for every cost.
func TestTokenBucketRetryAfterIsTheDeficitOverTheRate(t *testing.T) {
	for _, l := range testLimits {
		for _, cost := range costsFor(l) {
			capacity := l.Capacity()
			var st State
			fresh := true
			spent := int64(0)
			for {
				d, next, _ := Step(st, fresh, l, t0, cost)
				if !d.Allowed {
					left := capacity - spent
					want := ceilDivTest((cost-left)*l.Window, l.Events)
					if d.RetryAfter != msDur(want) {
						t.Errorf("%s cost %d, %d left: RetryAfter = %v, want %v", name(l), cost, left, d.RetryAfter, msDur(want))
					}
					break
				}
				spent += cost
				st, fresh = next, false
			}
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
func TestTokenBucketMatchesRationalModel(t *testing.T) {
	for li, l := range testLimits {
		t.Run(shape(l), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(3, uint64(4+li)))
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
				t.Fatalf("the sequence never refused; the test checked little")
			}
		})
	}
	// The limit changing between requests: the debt carries over to the new
	// limit (capped at its capacity), so the tokens left are the new
	// capacity minus what was spent. The limits share the window, so every
	// quantity stays exact and the integer code must agree bit for bit.
	t.Run("changing limit", func(t *testing.T) {
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
	})
}

// Hand-computed sequences. Store semantics: the state is kept only when the
// request is allowed.
func TestTokenBucketKnownSequences(t *testing.T) {
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

// A drained bucket refills linearly, Events per Window, up to its capacity
// and never more, whatever the gap (up to 2^61 ms); the stored debt is what
// is owed after the request, exactly one token when the bucket was full.
// (Bounds every algorithm keeps: TestIdleKeyNeverExceedsItsCapacity.)
func TestTokenBucketRefillsLinearlyUpToCapacity(t *testing.T) {
	gaps := []int64{1, 999, second, minute, hour, day, year, 10 * year, 1000 * year, 1 << 50, 1 << 61}
	for _, l := range testLimits {
		capacity := l.Capacity()
		st := drain(l, t0)
		for _, gap := range gaps {
			d, next, _ := Step(st, false, l, t0+gap, 1)
			if !d.Allowed {
				// Only possible for gaps shorter than one token's refill.
				if gap*l.Events >= l.Window {
					t.Fatalf("%+v gap %d: refused: %+v", l, gap, d)
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
			if next.Debt > capacity*l.Window || next.Debt < 0 {
				t.Fatalf("%+v gap %d: stored debt %d out of [0, %d]", l, gap, next.Debt, capacity*l.Window)
			}
			// The stored debt is what is owed after this request: exactly
			// one token if the bucket was full, and never less.
			if next.Debt < l.Window || (wantTok == capacity && next.Debt != l.Window) {
				t.Fatalf("%+v gap %d: stored debt %d, want %d (one token) or more when not full", l, gap, next.Debt, l.Window)
			}
			if d.ResetAfter > msDur(ceilDivTest(capacity*l.Window, l.Events)) {
				t.Fatalf("%+v gap %d: ResetAfter %v beyond a full refill", l, gap, d.ResetAfter)
			}
		}
		// A full bucket (nothing owed) keeps owing nothing however long it idles.
		full := State{Debt: 0, At: t0, Scale: l.Window}
		for _, gap := range gaps {
			if _, next, _ := Step(full, false, l, t0+gap, 0); next.Debt != 0 {
				t.Fatalf("%+v idle %d: a full bucket owes %+v", l, gap, next)
			}
		}
	}
}

// A stored debt outside [0, capacity] (a corrupt or foreign value) is
// clamped: above the capacity it is an empty bucket, not a deeper one (back
// to full one full refill later, not after paying the absurd debt off);
// below 0 it is nothing owed, the capacity and not more.
func TestTokenBucketClampsADebtOutOfRange(t *testing.T) {
	for _, l := range testLimits {
		capacity := l.Capacity()
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
		under := State{Debt: math.MinInt64, At: t0, Scale: l.Window}
		if d, next, _ := Step(under, false, l, t0, 0); d.Remaining != capacity || next.Debt != 0 {
			t.Fatalf("%+v: negative debt gave %+v / %+v, want Remaining %d and Debt 0", l, d, next, capacity)
		}
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
func TestTokenBucketChangedLimitAppliesToTheDebt(t *testing.T) {
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
func TestTokenBucketWindowChangeNeverRoundsInTheClientsFavour(t *testing.T) {
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

// A clock stepping back refills nothing until it catches up, and the times
// reported count the lag: 10 per second drained at `at`, asked 500ms
// earlier, is one token (100ms) plus the lag away. With tokens left, a
// backwards clock may spend them. (What every algorithm keeps:
// TestClockSteppingBackwardsNeverRefills.)
func TestTokenBucketBackwardsClockCountsTheLag(t *testing.T) {
	l := Limit{Events: 10, Window: 1000}
	at := t0 + 1000
	st := drain(l, at)
	if st.Debt != 10*1000 || st.At != at { // all 10 tokens owed
		t.Fatalf("drained state %+v", st)
	}
	d, next, fullAt := Step(st, false, l, at-500, 1)
	if d.RetryAfter != 600*time.Millisecond || d.ResetAfter != 1500*time.Millisecond {
		t.Fatalf("backwards clock: RetryAfter %v (want 600ms), ResetAfter %v (want 1.5s)", d.RetryAfter, d.ResetAfter)
	}
	if next.At != at || next.Debt != 10*1000 || fullAt != at+1000 {
		t.Fatalf("backwards clock moved the state: %+v fullAt %d", next, fullAt)
	}
	half := State{Debt: 5000, At: at, Scale: 1000} // 5 of 10 owed
	d, next, _ = Step(half, false, l, at-10_000, 1)
	if !d.Allowed || d.Remaining != 4 || next.Debt != 6000 || next.At != at {
		t.Fatalf("spend under a backwards clock: %+v %+v", d, next)
	}
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
