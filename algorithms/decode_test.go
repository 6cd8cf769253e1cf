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

// The binary form (lua/common.lua), byte by byte: EncodeLua writes these
// values for these states and DecodeLua reads them back; TestLuaTwin* in
// redisstore check that the script writes and reads the same bytes.
func TestLuaBinaryForm(t *testing.T) {
	const at = 1700000000000 // binEpoch + 0x174876e800
	for _, tc := range []struct {
		raw string
		st  State
	}{
		// token bucket: 0x80 + 4 × (the debt's length) + unit; the instant;
		// the debt; the scale in its unit (here 1 minute)
		{"\x8a\x17\x48\x76\xe8\x00\xea\x60\x01", State{Alg: TokenBucket, Debt: 60000, At: at, Scale: 60000}},
		{"\x80\x17\x48\x76\xe8\x00\x05\xdc", State{Alg: TokenBucket, At: at, Scale: 1500}},
		{"\x9f\x00\x00\x00\x00\x00\x1f\xff\xff\xff\xff\xff\xff\x0d\x5d\xe0", State{Alg: TokenBucket, Debt: 1<<53 - 1, At: binEpoch, Scale: MaxRefill}},
		// gcra: 0xa0 + 4 × (the fraction's length) + unit; the instant;
		// the fraction; the unit count u
		{"\xa4\x17\x48\x76\xe9\xf4\x03\x07", State{Alg: GCRA, At: at + 500, Debt: 3, Scale: 7}},
		{"\xa1\x17\x48\x76\xe8\x00\x01", State{Alg: GCRA, At: at, Scale: 1000}},
		// sliding window: 0xc0 + 4 × (prev's length) + unit; cur's length;
		// the window's start; prev; cur; the window
		{"\xc6\x01\x17\x48\x76\x99\xe0\x02\x05\x01", State{Alg: SlidingWindow, Prev: 2, Debt: 5, At: at - 20000, Scale: 60000}},
		{"\xc1\x00\x17\x48\x76\xe8\x00\x01", State{Alg: SlidingWindow, At: at, Scale: 1000}},
		// fixed window: 0xe0 + 4 × (the count's length) + unit; the
		// window's start; the count; the window
		{"\xe7\x17\x48\x6a\xb3\x00\x04\x01", State{Alg: FixedWindow, Debt: 4, At: at - 800000, Scale: 3600000}},
		{"\xe8\xff\xff\xff\xff\xff\x01\x2c\x07", State{Alg: FixedWindow, Debt: 300, At: binEpoch + binSpan - 1, Scale: 7}},
	} {
		if got := EncodeLua(tc.st); got != tc.raw {
			t.Errorf("EncodeLua(%+v) = %q, want %q", tc.st, got, tc.raw)
		}
		if got, ok := DecodeLua(tc.raw); !ok || got != tc.st {
			t.Errorf("DecodeLua(%q) = %+v %v, want %+v", tc.raw, got, ok, tc.st)
		}
	}

	// Read, though never written: leading zeros; a scale of 0 (which Step
	// takes for no state, as the script does).
	for _, tc := range []struct {
		raw string
		st  State
	}{
		{"\x8e\x17\x48\x76\xe8\x00\x00\xea\x60\x00\x01", State{Alg: TokenBucket, Debt: 60000, At: at, Scale: 60000}},
		{"\x83\x17\x48\x76\xe8\x00\x95\x21\x7c\xb0", State{Alg: TokenBucket, At: at, Scale: 2501999792 * 3600000}},
		{"\x9c\x17\x48\x76\xe8\x00\x1f\xff\xff\xff\xff\xff\xff\x00", State{Alg: TokenBucket, Debt: 1<<53 - 1, At: at}},
	} {
		if got, ok := DecodeLua(tc.raw); !ok || got != tc.st {
			t.Errorf("DecodeLua(%q) = %+v %v, want %+v", tc.raw, got, ok, tc.st)
		}
	}

	// Malformed: no state.
	for _, raw := range []string{
		"\x80", "\x80\x17\x48\x76\xe8", "\x80\x17\x48\x76\xe8\x00", // no last field
		"\x8a\x17\x48\x76\xe8\x00\xea\x60",                         // the debt eats the last field
		"\x80\x17\x48\x76\xe8\x00\x00\x00\x00\x00\x00\x00\x00\x01", // a last field of 8 bytes
		"\x9c\x17\x48\x76\xe8\x00\x20\x00\x00\x00\x00\x00\x00\x01", // a count of 2^53
		"\x83\x17\x48\x76\xe8\x00\x95\x21\x7c\xb1",                 // a scale of 2^53 or more
		"\xc1", "\xc1\x08\x17\x48\x76\xe8\x00\x00\x00\x00\x00\x00\x00\x00\x01\x01", // cur's length 8
		"\xc5\x02\x17\x48\x76\xe8\x00\x01\x01\x01", // cur runs into the window
	} {
		if st, ok := DecodeLua(raw); ok {
			t.Errorf("DecodeLua(%q) = %+v, want no state", raw, st)
		}
	}

	// The binary form's range of instants; text outside it.
	for _, tc := range []struct {
		at     int64
		binary bool
	}{{binEpoch - 1, false}, {binEpoch, true}, {binEpoch + binSpan - 1, true}, {binEpoch + binSpan, false}, {-5, false}} {
		for _, st := range []State{{Alg: TokenBucket, Debt: 5, At: tc.at, Scale: 9}, {Alg: GCRA, At: tc.at, Scale: 1},
			{Alg: SlidingWindow, Prev: 1, At: tc.at, Scale: 7}, {Alg: FixedWindow, Debt: 2, At: tc.at, Scale: 1000}} {
			raw := EncodeLua(st)
			if (raw[0] >= 0x80) != tc.binary || raw != EncodeLuaText(st) && !tc.binary {
				t.Errorf("EncodeLua(%+v) = %q: binary %v, want %v", st, raw, raw[0] >= 0x80, tc.binary)
			}
			if got, ok := DecodeLua(raw); !ok || got != st {
				t.Errorf("DecodeLua(EncodeLua(%+v)) = %+v %v", st, got, ok)
			}
		}
	}
}

// Every state Step can return survives both forms; the binary one is at
// most 12 bytes (Redis's smallest string object) for the limits of the
// property tests, which include windows of days and bursts of 10^6.
func TestLuaFormsRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 12))
	longest := map[Algorithm]int{}
	for _, l := range allLimits {
		var st State
		fresh := true
		now := int64(1_700_000_000_000)
		for range 300 {
			now += gap(rng, l)
			d, next, _ := Step(st, fresh, l, now, 1+rng.Int64N(min(l.Capacity(), 3)))
			if !d.Allowed {
				continue
			}
			st, fresh = next, false
			for _, raw := range []string{EncodeLua(st), EncodeLuaText(st)} {
				got, ok := DecodeLua(raw)
				if raw == "" && l.Algorithm == SlidingLog && len(st.Log.Entries) == 0 {
					continue
				}
				if !ok || EncodeLuaText(got) != EncodeLuaText(st) || got.Log == nil && got != st {
					t.Fatalf("%s: %+v stored as %q, read back as %+v %v", name(l), st, raw, got, ok)
				}
			}
			if l.Algorithm != SlidingLog {
				longest[l.Algorithm] = max(longest[l.Algorithm], len(EncodeLua(st)))
			}
		}
	}
	t.Logf("longest binary values: %v", longest)
	for alg, n := range longest {
		if n > 12 {
			t.Errorf("%s: a binary value of %d bytes", alg, n)
		}
	}
}

// The text form EncodeLuaText writes is the one older versions wrote (and
// DecodeLua reads): it reproduces their values.
func TestLuaTextFormUnchanged(t *testing.T) {
	for _, raw := range []string{"3000:1700000000123:1000", "0:-7:60000", "g1700000000500:3:7", "g-12:0:1",
		"f4:1700000000000:60000", "s2:5:1700000000000:1000", "l1700000000000,0,5*3,5", "l-10,0*2"} {
		st, ok := DecodeLua(raw)
		if got := EncodeLuaText(st); !ok || got != raw {
			t.Errorf("EncodeLuaText(DecodeLua(%q)) = %q", raw, got)
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
