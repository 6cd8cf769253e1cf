package redisstore

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// The stored state's two forms (lua/common.lua, codec.go): the binary form,
// and the text form the script writes for an instant outside the binary
// range. The twins must agree across the range's edges and on any value
// Redis may hold, including ones the script never writes.

// The binary form's range of instants: binary in [binEpoch, binEnd), text
// outside.
const binEnd = binEpoch + binSpan

// formLimits are limits of every algorithm, fit for random steps.
func formLimits(t *testing.T) [][]algorithms.Limit {
	L := func(alg algorithms.Algorithm, events int64, window time.Duration, burst int64) algorithms.Limit {
		return limitOf(t, alg, events, window, burst)
	}
	TB, G, SW, FW, SL := algorithms.TokenBucket, algorithms.GCRA, algorithms.SlidingWindow, algorithms.FixedWindow, algorithms.SlidingLog
	return [][]algorithms.Limit{
		{L(TB, 7, time.Second, 0), L(TB, 10, time.Minute, 25), L(TB, 3, 7*time.Millisecond, 5), L(TB, 100000, time.Hour, 150000)},
		{L(G, 7, time.Second, 0), L(G, 13, 7*time.Second, 20), L(G, 983, time.Second, 5)},
		{L(SW, 7, time.Second, 0), L(SW, 13, 7*time.Second, 0), L(SW, 60, time.Minute, 0)},
		{L(FW, 7, time.Second, 0), L(FW, 2, 300*time.Millisecond, 0), L(FW, 50, time.Hour, 0)},
		{L(SL, 7, time.Second, 0), L(SL, 3, 7*time.Millisecond, 0)},
	}
}

// Across the edges of the binary range: sequences that start before its
// epoch (text) and enter it (binary), and that leave it at its end (text
// again); the twins agree on every step and the form switches exactly at
// the edges.
func TestLuaTwinBinaryRangeEdges(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	sets := formLimits(t)
	for _, edge := range []int64{binEpoch, binEnd} {
		for si, set := range sets {
			t.Run(fmt.Sprintf("%d/%s", edge, set[0].Algorithm), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(twinSeed, uint64(edge%1000+int64(si))))
				tw := newTwin(t, srv, c, 1)
				l := set[0]
				tw.now = edge - 3*l.Window - 50
				forms := map[bool]int{}
				for range 300 {
					adv := rng.Int64N(max(l.Window/20, 2))
					tw.step([]algorithms.Limit{l}, []int64{1}, adv)
					if raw := tw.zones[0].raw; raw != "" {
						st, _ := DecodeState(raw)
						binary := raw[0] >= 0x80
						if st.Alg != algorithms.SlidingLog && binary != (st.At >= binEpoch && st.At < binEnd) {
							t.Fatalf("state %+v stored as %q", st, raw)
						}
						forms[binary]++
					}
				}
				if set[0].Algorithm != algorithms.SlidingLog && (forms[true] == 0 || forms[false] == 0) {
					t.Fatalf("states stored: %d binary, %d text; want both", forms[true], forms[false])
				}
			})
		}
	}
}

// oddValue builds a value in the binary form's shape with the given field
// lengths; its fields hold small numbers (so a changed limit's rescaling
// stays exact in Lua) behind leading zeros, or, when big, a number of 2^53
// or more.
func oddValue(rng *rand.Rand, alg algorithms.Algorithm) string {
	n1 := rng.IntN(8)
	unit := rng.IntN(4)
	b := []byte{byte(0x80 | int(alg)<<5 | n1<<2 | unit)}
	n2 := 0
	if alg == algorithms.SlidingWindow {
		n2 = rng.IntN(9) // 8: malformed
		b = append(b, byte(n2))
	}
	// the instant: near the test's now, now and then anywhere
	at := int64(1_700_000_000_000) - binEpoch + rng.Int64N(2_000_000) - 1_000_000
	if rng.IntN(8) == 0 {
		at = rng.Int64N(1 << 40)
	}
	for i := 4; i >= 0; i-- {
		b = append(b, byte(at>>(8*i)))
	}
	field := func(n int) {
		for i := range n {
			switch {
			case i == 0 && n == 7 && rng.IntN(4) == 0:
				b = append(b, byte(0x20+rng.IntN(0xe0))) // 2^53 or more
			case i >= n-2:
				b = append(b, byte(rng.IntN(256)))
			default:
				b = append(b, 0)
			}
		}
	}
	field(n1)
	field(n2)
	last := rng.IntN(9) // 0 and 8: malformed
	switch r := rng.IntN(10); {
	case r == 0 && last == 7:
		b = append(b, 0, 0, 0x0f, 0xff, 0xff, 0xff, 0xff) // × an hour: 2^53 or more
	case r < 4:
		// a window of a limit below, in its unit
		b = append(b, []byte{0: 1, 1: 7, 2: 60, 3: 1}[unit])
	default:
		field(last)
	}
	return string(b)
}

// Values the script did not write, or not this way: another algorithm's,
// the text form with oddities its pattern accepts (leading zeros, a
// negative count), the binary form with leading zeros, malformed values of
// both forms. Lua
// and Go (DecodeState, then Step) must read each the same way: the same
// decision, the same stored state; a malformed value is no state.
func TestLuaTwinReadsOddValues(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	ctx := testCtx(t)
	rng := rand.New(rand.NewPCG(twinSeed, 7200))
	const now = int64(1_700_000_000_000)
	limits := []algorithms.Limit{
		limitOf(t, algorithms.TokenBucket, 5, time.Second, 8),
		limitOf(t, algorithms.GCRA, 7, 7*time.Second, 0),
		limitOf(t, algorithms.SlidingWindow, 9, time.Minute, 0),
		limitOf(t, algorithms.FixedWindow, 9, time.Hour, 0),
		limitOf(t, algorithms.TokenBucket, 3, time.Minute, 0),
	}
	text := []string{
		"0:0:1", "60000:1699999999000:60000", "-5:1700000000000:1000", "007:1700000000000:0060000",
		"4000:1700000000500:1000", "1:2:0", "1:2", "a:b:c", "1.5:2:60000", "60000:1:60000\n",
		"g1700000000500:3:7", "g1700000003000:0:1", "g-12:0:1", "g1:2",
		"s2:5:1699999980000:60000", "s9:9:1699999920000:1000", "s1:2:3",
		"f4:1699999200000:3600000", "f1:-60000:60000", "f-1:2:3",
		"l1699999999000,0,5*3", "", "garbage", "\x00\xff",
	}
	var values []string
	for range 300 {
		values = append(values, oddValue(rng, algorithms.Algorithm(rng.IntN(4))))
	}
	read := 0 // values Go reads as a state
	for _, raw := range append(text, values...) {
		if _, ok := DecodeState(raw); ok {
			read++
		}
		for _, l := range limits {
			for _, cost := range []int64{0, 1, 3} {
				key := "odd:" + strconv.Itoa(rng.IntN(1<<30))
				if raw != "" {
					srv.Do(t, "SET", key, raw, "PX", 60_000)
				}
				st, ok := DecodeState(raw)
				d, next, _ := algorithms.Step(st, !ok, l, now, cost)
				r := algorithms.Request{Limit: l, Cost: cost}
				res, err := runTwin(ctx, c, []string{key}, luaArgs([]any{now}, false, r)...)
				if err != nil {
					t.Fatalf("stored %q, %s cost %d: script: %v", raw, limitString(l), cost, err)
				}
				got := luaDecision{Allowed: res[0] == 1, Remaining: res[1], RetryMs: res[2], ResetMs: res[3]}
				if want := goView(d); got != want {
					t.Fatalf("stored %q (Go reads %+v, %v), %s cost %d: Lua %+v, Go %+v", raw, st, ok, limitString(l), cost, got, want)
				}
				want := raw
				if d.Allowed {
					want = encodeState(next)
				}
				if after := getRaw(t, c, key); after != want {
					t.Fatalf("stored %q (Go reads %+v, %v), %s cost %d: Redis holds %q, Go %q", raw, st, ok, limitString(l), cost, after, want)
				}
			}
		}
	}
	all := len(text) + len(values)
	t.Logf("%d values, %d read as a state and %d as none, each under %d limits and 3 costs", all, read, all-read, len(limits))
	if read < all/5 || all-read < all/5 {
		t.Fatalf("%d of %d values read as a state: the mix is too one-sided to test both", read, all)
	}
}
