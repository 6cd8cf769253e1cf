package algorithms

import (
	"math/rand/v2"
	"reflect"
	"testing"
)

// DecodeLua reads each algorithm's stored form (as lua/*.lua writes it);
// redisstore's TestPeekDecodesLuaState checks it against values the Lua
// twin actually wrote to a real Redis.
func TestDecodeLua(t *testing.T) {
	for _, tc := range []struct {
		raw  string
		want State
	}{
		{"3000:1700000000123:1000", State{Alg: TokenBucket, Debt: 3000, At: 1700000000123, Scale: 1000}},
		{"-5:-7:60000", State{Alg: TokenBucket, Debt: -5, At: -7, Scale: 60000}},
		{"0:0:1", State{Alg: TokenBucket, Scale: 1}},
		{"g1700000000500:3:7", State{Alg: GCRA, At: 1700000000500, Debt: 3, Scale: 7}},
		{"g-12:0:1", State{Alg: GCRA, At: -12, Scale: 1}},
		{"f4:1700000000000:60000", State{Alg: FixedWindow, Debt: 4, At: 1700000000000, Scale: 60000}},
		{"f1:-60000:60000", State{Alg: FixedWindow, Debt: 1, At: -60000, Scale: 60000}},
		{"s2:5:1700000000000:1000", State{Alg: SlidingWindow, Prev: 2, Debt: 5, At: 1700000000000, Scale: 1000}},
		{"l1700000000000", State{Alg: SlidingLog, Log: &Log{Entries: []LogEntry{}}}},
		{"l1700000000000,0,5*3,5", State{Alg: SlidingLog, Log: &Log{Entries: []LogEntry{
			{At: 1700000000000, Cost: 1}, {At: 1700000000005, Cost: 3}, {At: 1700000000005, Cost: 1}}}}},
		{"l-10,0*2", State{Alg: SlidingLog, Log: &Log{Entries: []LogEntry{{At: -10, Cost: 2}}}}},
	} {
		got, ok := DecodeLua(tc.raw)
		if !ok || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("DecodeLua(%q) = %+v %v, want %+v", tc.raw, got, ok, tc.want)
		}
		if ok && got.Log != nil && !reflect.DeepEqual(got.Log.Entries, tc.want.Log.Entries) {
			t.Errorf("DecodeLua(%q) log %+v, want %+v", tc.raw, got.Log.Entries, tc.want.Log.Entries)
		}
	}
	// Values the script would not read as state either.
	for _, raw := range []string{
		"", "1:2", "1:2:3:4", "1:2:-3", "+1:2:3", "1 :2:3", "a:b:c", "1:2:3\n", "99999999999999999999:1:1",
		"g1:-2:3", "g1:2", "f-1:2:3", "f1:2:-3", "s1:2:3", "s-1:2:3:4", "s1:2:3:-4",
		"l", "lx", "l1,", "l1,a", "l1,2*", "l1,2*0", "l1,-2", "l1,2*-1", "l1,,2", "x1:2:3",
	} {
		if st, ok := DecodeLua(raw); ok {
			t.Errorf("DecodeLua(%q) = %+v, want no state", raw, st)
		}
	}
}

// Peek charges nothing: the state it is given is left as it was, Remaining
// and ResetAfter are Step's at cost 0, and Allowed and RetryAfter are
// Step's for a request of cost 1.
func TestPeekIsStepWithoutCharge(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	for _, l := range allLimits {
		t.Run(name(l), func(t *testing.T) {
			var st State
			fresh := true
			now := int64(1_700_000_000_000)
			for i := 0; i < 300; i++ {
				now += gap(rng, l)
				var snapshot []LogEntry
				if st.Log != nil {
					snapshot = append(snapshot, st.Log.Entries...)
				}
				before := st
				got := Peek(st, fresh, l, now)
				if st != before || st.Log != nil && !reflect.DeepEqual(st.Log.Entries, snapshot) {
					t.Fatalf("step %d: Peek changed the state", i)
				}
				zero, _, _ := Step(st, fresh, l, now, 0)
				one, _, _ := Step(st, fresh, l, now, 1)
				want := Decision{Allowed: one.Allowed, Limit: zero.Limit, Remaining: zero.Remaining,
					RetryAfter: one.RetryAfter, ResetAfter: zero.ResetAfter}
				if got != want {
					t.Fatalf("step %d: Peek %+v, want %+v", i, got, want)
				}
				if got.Allowed != (got.Remaining >= 1) {
					t.Fatalf("step %d: Allowed %v with Remaining %d", i, got.Allowed, got.Remaining)
				}
				// Spend a random cost, as traffic would.
				c := 1 + rng.Int64N(min(l.Capacity(), 3))
				d, next, _ := Step(st, fresh, l, now, c)
				if d.Allowed {
					st, fresh = next, false
				}
			}
		})
	}
}
