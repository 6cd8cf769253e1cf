package redisstore

import (
	"math/rand/v2"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/caddy-sluice/algorithms"
)

// DecodeState reads each algorithm's stored form (as lua/*.lua writes it);
// TestPeekDecodesLuaState checks it against values the Lua twin actually
// wrote to a real Redis.
func TestDecodeState(t *testing.T) {
	for _, tc := range []struct {
		raw  string
		want algorithms.State
	}{
		{"3000:1700000000123:1000", algorithms.State{Alg: algorithms.TokenBucket, Debt: 3000, At: 1700000000123, Scale: 1000}},
		{"-5:-7:60000", algorithms.State{Alg: algorithms.TokenBucket, Debt: -5, At: -7, Scale: 60000}},
		{"0:0:1", algorithms.State{Alg: algorithms.TokenBucket, Scale: 1}},
		{"g1700000000500:3:7", algorithms.State{Alg: algorithms.GCRA, At: 1700000000500, Debt: 3, Scale: 7}},
		{"g-12:0:1", algorithms.State{Alg: algorithms.GCRA, At: -12, Scale: 1}},
		{"f4:1700000000000:60000", algorithms.State{Alg: algorithms.FixedWindow, Debt: 4, At: 1700000000000, Scale: 60000}},
		{"f1:-60000:60000", algorithms.State{Alg: algorithms.FixedWindow, Debt: 1, At: -60000, Scale: 60000}},
		{"s2:5:1700000000000:1000", algorithms.State{Alg: algorithms.SlidingWindow, Prev: 2, Debt: 5, At: 1700000000000, Scale: 1000}},
		{"l1700000000000", algorithms.State{Alg: algorithms.SlidingLog, Log: &algorithms.Log{Entries: []algorithms.LogEntry{}}}},
		{"l1700000000000,0,5*3,5", algorithms.State{Alg: algorithms.SlidingLog, Log: &algorithms.Log{Entries: []algorithms.LogEntry{
			{At: 1700000000000, Cost: 1}, {At: 1700000000005, Cost: 3}, {At: 1700000000005, Cost: 1}}}}},
		{"l-10,0*2", algorithms.State{Alg: algorithms.SlidingLog, Log: &algorithms.Log{Entries: []algorithms.LogEntry{{At: -10, Cost: 2}}}}},
	} {
		got, ok := DecodeState(tc.raw)
		if !ok || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("DecodeState(%q) = %+v %v, want %+v", tc.raw, got, ok, tc.want)
		}
		if ok && got.Log != nil && !reflect.DeepEqual(got.Log.Entries, tc.want.Log.Entries) {
			t.Errorf("DecodeState(%q) log %+v, want %+v", tc.raw, got.Log.Entries, tc.want.Log.Entries)
		}
	}
	// Values the script would not read as state either.
	for _, raw := range []string{
		"", "1:2", "1:2:3:4", "1:2:-3", "+1:2:3", "1 :2:3", "a:b:c", "1:2:3\n", "99999999999999999999:1:1",
		"g1:-2:3", "g1:2", "f-1:2:3", "f1:2:-3", "s1:2:3", "s-1:2:3:4", "s1:2:3:-4",
		"l", "lx", "l1,", "l1,a", "l1,2*", "l1,2*0", "l1,-2", "l1,2*-1", "l1,,2", "x1:2:3",
	} {
		if st, ok := DecodeState(raw); ok {
			t.Errorf("DecodeState(%q) = %+v, want no state", raw, st)
		}
	}
}

// The binary form (lua/common.lua), byte by byte: encodeState writes these
// values for these states and DecodeState reads them back; TestLuaTwin*
// check that the script writes and reads the same bytes.
func TestLuaBinaryForm(t *testing.T) {
	const at = 1700000000000 // binEpoch + 0x174876e800
	for _, tc := range []struct {
		raw string
		st  algorithms.State
	}{
		// token bucket: 0x80 + 4 × (the debt's length) + unit; the instant;
		// the debt; the scale in its unit (here 1 minute)
		{"\x8a\x17\x48\x76\xe8\x00\xea\x60\x01", algorithms.State{Alg: algorithms.TokenBucket, Debt: 60000, At: at, Scale: 60000}},
		{"\x80\x17\x48\x76\xe8\x00\x05\xdc", algorithms.State{Alg: algorithms.TokenBucket, At: at, Scale: 1500}},
		{"\x9f\x00\x00\x00\x00\x00\x1f\xff\xff\xff\xff\xff\xff\x0d\x5d\xe0", algorithms.State{Alg: algorithms.TokenBucket, Debt: 1<<53 - 1, At: binEpoch, Scale: algorithms.MaxRefill}},
		// gcra: 0xa0 + 4 × (the fraction's length) + unit; the instant;
		// the fraction; the unit count u
		{"\xa4\x17\x48\x76\xe9\xf4\x03\x07", algorithms.State{Alg: algorithms.GCRA, At: at + 500, Debt: 3, Scale: 7}},
		{"\xa1\x17\x48\x76\xe8\x00\x01", algorithms.State{Alg: algorithms.GCRA, At: at, Scale: 1000}},
		// sliding window: 0xc0 + 4 × (prev's length) + unit; cur's length;
		// the window's start; prev; cur; the window
		{"\xc6\x01\x17\x48\x76\x99\xe0\x02\x05\x01", algorithms.State{Alg: algorithms.SlidingWindow, Prev: 2, Debt: 5, At: at - 20000, Scale: 60000}},
		{"\xc1\x00\x17\x48\x76\xe8\x00\x01", algorithms.State{Alg: algorithms.SlidingWindow, At: at, Scale: 1000}},
		// fixed window: 0xe0 + 4 × (the count's length) + unit; the
		// window's start; the count; the window
		{"\xe7\x17\x48\x6a\xb3\x00\x04\x01", algorithms.State{Alg: algorithms.FixedWindow, Debt: 4, At: at - 800000, Scale: 3600000}},
		{"\xe8\xff\xff\xff\xff\xff\x01\x2c\x07", algorithms.State{Alg: algorithms.FixedWindow, Debt: 300, At: binEpoch + binSpan - 1, Scale: 7}},
	} {
		if got := encodeState(tc.st); got != tc.raw {
			t.Errorf("encodeState(%+v) = %q, want %q", tc.st, got, tc.raw)
		}
		if got, ok := DecodeState(tc.raw); !ok || got != tc.st {
			t.Errorf("DecodeState(%q) = %+v %v, want %+v", tc.raw, got, ok, tc.st)
		}
	}

	// Read, though never written: leading zeros; a scale of 0 (which Step
	// takes for no state, as the script does).
	for _, tc := range []struct {
		raw string
		st  algorithms.State
	}{
		{"\x8e\x17\x48\x76\xe8\x00\x00\xea\x60\x00\x01", algorithms.State{Alg: algorithms.TokenBucket, Debt: 60000, At: at, Scale: 60000}},
		{"\x83\x17\x48\x76\xe8\x00\x95\x21\x7c\xb0", algorithms.State{Alg: algorithms.TokenBucket, At: at, Scale: 2501999792 * 3600000}},
		{"\x9c\x17\x48\x76\xe8\x00\x1f\xff\xff\xff\xff\xff\xff\x00", algorithms.State{Alg: algorithms.TokenBucket, Debt: 1<<53 - 1, At: at}},
	} {
		if got, ok := DecodeState(tc.raw); !ok || got != tc.st {
			t.Errorf("DecodeState(%q) = %+v %v, want %+v", tc.raw, got, ok, tc.st)
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
		if st, ok := DecodeState(raw); ok {
			t.Errorf("DecodeState(%q) = %+v, want no state", raw, st)
		}
	}

	// The binary form's range of instants; text outside it.
	for _, tc := range []struct {
		at     int64
		binary bool
	}{{binEpoch - 1, false}, {binEpoch, true}, {binEpoch + binSpan - 1, true}, {binEpoch + binSpan, false}, {-5, false}} {
		for _, st := range []algorithms.State{{Alg: algorithms.TokenBucket, Debt: 5, At: tc.at, Scale: 9}, {Alg: algorithms.GCRA, At: tc.at, Scale: 1},
			{Alg: algorithms.SlidingWindow, Prev: 1, At: tc.at, Scale: 7}, {Alg: algorithms.FixedWindow, Debt: 2, At: tc.at, Scale: 1000}} {
			raw := encodeState(st)
			if (raw[0] >= 0x80) != tc.binary || raw != encodeText(st) && !tc.binary {
				t.Errorf("encodeState(%+v) = %q: binary %v, want %v", st, raw, raw[0] >= 0x80, tc.binary)
			}
			if got, ok := DecodeState(raw); !ok || got != st {
				t.Errorf("DecodeState(encodeState(%+v)) = %+v %v", st, got, ok)
			}
		}
	}
}

// Every state Step can return survives both forms; the binary one is at
// most 12 bytes (Redis's smallest string object) for limits of every
// algorithm with windows from milliseconds to days and bursts up to 10^6.
func TestLuaFormsRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 12))
	longest := map[algorithms.Algorithm]int{}
	var limits []algorithms.Limit
	for _, alg := range []algorithms.Algorithm{algorithms.TokenBucket, algorithms.GCRA} {
		for _, l := range [][3]int64{{7, 1000, 0}, {10, 60_000, 25}, {3, 7, 5}, {20, 1000, 3}, {13, 997, 13},
			{100_000, 3_600_000, 1_000_000}, {1, 86_400_000, 2}} {
			limits = append(limits, limitOf(t, alg, l[0], time.Duration(l[1])*time.Millisecond, l[2]))
		}
	}
	for _, alg := range []algorithms.Algorithm{algorithms.SlidingWindow, algorithms.FixedWindow, algorithms.SlidingLog} {
		for _, l := range [][2]int64{{1, 1000}, {10, 60_000}, {3, 7}, {13, 997}, {1000, 3_600_000}, {5, 86_400_000}} {
			limits = append(limits, limitOf(t, alg, l[0], time.Duration(l[1])*time.Millisecond, 0))
		}
	}
	for _, l := range limits {
		var st algorithms.State
		fresh := true
		now := int64(1_700_000_000_000)
		for range 300 {
			now += advance(rng, l)
			d, next, _ := algorithms.Step(st, fresh, l, now, 1+rng.Int64N(min(l.Capacity(), 3)))
			if !d.Allowed {
				continue
			}
			st, fresh = next, false
			for _, raw := range []string{encodeState(st), encodeText(st)} {
				got, ok := DecodeState(raw)
				if raw == "" && l.Algorithm == algorithms.SlidingLog && len(st.Log.Entries) == 0 {
					continue
				}
				if !ok || encodeText(got) != encodeText(st) || got.Log == nil && got != st {
					t.Fatalf("%s: %+v stored as %q, read back as %+v %v", limitString(l), st, raw, got, ok)
				}
			}
			if l.Algorithm != algorithms.SlidingLog {
				longest[l.Algorithm] = max(longest[l.Algorithm], len(encodeState(st)))
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

// The Go mirror of the script's writer (pack in lua/common.lua, and each
// algorithm's text form): production only reads values (DecodeState); the
// twin tests compare what Redis holds with it, byte for byte.

// encodeState returns the value the Lua twin (LuaScript) stores for st, which
// DecodeState reads back as st; "" for a sliding log without events (the
// script deletes the key). The token bucket, gcra, sliding and fixed window
// are stored in binary when their instant lies in [2020-09-13, 2055) and
// every count is between 0 and 2^53 (as every state Step returns), else in
// the text form (encodeText); the sliding log always in text.
func encodeState(st algorithms.State) string {
	if st.Penalized != 0 {
		// The penalty's prefix (lua/common.lua, penalized), then the
		// algorithm's value, if the state has one.
		x := st.Penalized
		p := string([]byte{'p', byte(x >> 40), byte(x >> 32), byte(x >> 24), byte(x >> 16), byte(x >> 8), byte(x)})
		rest := st
		rest.Penalized = 0
		if rest.Scale == 0 && rest.Log == nil {
			return p
		}
		return p + encodeState(rest)
	}
	var b []byte
	switch st.Alg {
	case algorithms.TokenBucket, algorithms.GCRA, algorithms.FixedWindow:
		b = appendBinary(nil, st.Alg, st.At, st.Debt, -1, st.Scale)
	case algorithms.SlidingWindow:
		if st.Debt >= 0 {
			b = appendBinary(nil, st.Alg, st.At, st.Prev, st.Debt, st.Scale)
		}
	}
	if b == nil {
		return encodeText(st)
	}
	return string(b)
}

// appendBinary appends the binary form of a state of algorithm alg: its
// instant at, counts f1 and f2 (f2 < 0: none, all but the sliding window)
// and the last field; it returns nil when the state has no binary form.
func appendBinary(b []byte, alg algorithms.Algorithm, at, f1, f2, last int64) []byte {
	x := at - binEpoch
	if x < 0 || x >= binSpan || f1 < 0 || f1 >= binExact || f2 >= binExact || last <= 0 || last >= binExact {
		return nil
	}
	k := 0
	for i := len(binUnits) - 1; i > 0; i-- {
		if last%binUnits[i] == 0 {
			k = i
			break
		}
	}
	n1 := byteLen(f1)
	b = append(b, 0x80|byte(alg)<<5|byte(n1)<<2|byte(k))
	if f2 >= 0 {
		b = append(b, byte(byteLen(f2)))
	}
	b = append(b, byte(x>>32), byte(x>>24), byte(x>>16), byte(x>>8), byte(x))
	b = appendBigEndian(b, f1)
	if f2 >= 0 {
		b = appendBigEndian(b, f2)
	}
	return appendBigEndian(b, last/binUnits[k])
}

// byteLen is the number of bytes of v ≥ 0 without leading zeros (0 for 0).
func byteLen(v int64) int {
	n := 0
	for ; v > 0; v >>= 8 {
		n++
	}
	return n
}

func appendBigEndian(b []byte, v int64) []byte {
	for i := byteLen(v) - 1; i >= 0; i-- {
		b = append(b, byte(v>>(8*i)))
	}
	return b
}

// encodeText returns the text form of st (see DecodeState), which the Lua
// twin writes for the sliding log and for an instant outside the binary
// form's range; "" for a sliding log without events.
func encodeText(st algorithms.State) string {
	i := func(v int64) string { return strconv.FormatInt(v, 10) }
	switch st.Alg {
	case algorithms.GCRA:
		return "g" + i(st.At) + ":" + i(st.Debt) + ":" + i(st.Scale)
	case algorithms.FixedWindow:
		return "f" + i(st.Debt) + ":" + i(st.At) + ":" + i(st.Scale)
	case algorithms.SlidingWindow:
		return "s" + i(st.Prev) + ":" + i(st.Debt) + ":" + i(st.At) + ":" + i(st.Scale)
	case algorithms.SlidingLog:
		if st.Log == nil || len(st.Log.Entries) == 0 {
			return ""
		}
		e := st.Log.Entries
		var b strings.Builder
		b.WriteString("l" + i(e[0].At))
		for _, x := range e {
			b.WriteString("," + i(x.At-e[0].At))
			if x.Cost != 1 {
				b.WriteString("*" + i(x.Cost))
			}
		}
		return b.String()
	}
	return i(st.Debt) + ":" + i(st.At) + ":" + i(st.Scale)
}
