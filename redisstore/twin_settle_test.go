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

// The settle, Go against Lua: random sequences of takes and settles of
// earlier charges to random amounts (none, less, more: into debt, far
// beyond the capacity), in any order, for every algorithm, with and
// without a penalty or a delay, through the test entry point of the
// production script. Every decision, every stored value (byte for byte)
// and every settle's TTL must agree with algorithms.Step and
// algorithms.Settle.
func TestLuaTwinSettles(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	type lim = algorithms.Limit
	L := func(alg algorithms.Algorithm, events int64, window time.Duration, burst int64) lim {
		return limitOf(t, alg, events, window, burst)
	}
	TB, G, SW, FW, SL := algorithms.TokenBucket, algorithms.GCRA, algorithms.SlidingWindow, algorithms.FixedWindow, algorithms.SlidingLog
	withPenalty := L(TB, 5, time.Second, 0)
	withPenalty.Penalty = 1500
	withDelay := L(G, 10, time.Second, 3)
	withDelay.Delay = 800
	cases := []struct {
		name  string
		limit lim
	}{
		{"token_bucket", L(TB, 5, time.Second, 0)},
		{"token_bucket 1000 per hour", L(TB, 1000, time.Hour, 0)},
		{"gcra", L(G, 7, 3*time.Second, 3)},
		{"sliding_window", L(SW, 5, time.Second, 0)},
		{"fixed_window", L(FW, 5, time.Second, 0)},
		{"sliding_log", L(SL, 6, time.Second, 0)},
		{"token_bucket penalty", withPenalty},
		{"gcra delay", withDelay},
	}
	total := 0
	for ci, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(twinSeed, uint64(9500+ci)))
			tw := newTwin(t, srv, c, 1)
			type charge struct{ cost, at int64 }
			var charges []charge
			settled := 0
			for step := range 400 {
				if len(charges) > 0 && rng.IntN(10) < 4 {
					k := rng.IntN(len(charges))
					ch := charges[k]
					charges = append(charges[:k], charges[k+1:]...)
					var actual int64
					switch r := rng.IntN(4); {
					case step > 380 && r == 0:
						// Far beyond, near the end (the key then stays
						// refused): the debt is bounded.
						actual = ch.cost + rng.Int64N(1<<50)
					case r == 0:
						actual = ch.cost
					case r == 1:
						actual = rng.Int64N(ch.cost + 1)
					default:
						actual = ch.cost + rng.Int64N(2*tc.limit.Capacity()+1)
					}
					if tw.settle(tc.limit, ch.cost, actual, ch.at, advance(rng, tc.limit)/4) {
						settled++
					}
					continue
				}
				costs := []int64{cost(rng, tc.limit)}
				decs := tw.penaltyStep([]lim{tc.limit}, costs, advance(rng, tc.limit)/2, rng.IntN(5) == 0)
				if decs[0].Allowed {
					charges = append(charges, charge{cost: costs[0], at: tw.now})
				}
			}
			total += tw.steps
			if settled < 20 {
				t.Fatalf("only %d settles wrote a state: the sequence exercised too little", settled)
			}
		})
	}
	t.Logf("%d steps compared", total)
}

// settle advances the clock by adv ms and settles a charge of cost, made
// at at, to actual in zone 0 under l; Lua must store what Settle returns,
// with a TTL of at least its reset-after. It reports whether a state was
// written.
func (tw *twin) settle(l algorithms.Limit, cost, actual, at, adv int64) bool {
	t := tw.t
	t.Helper()
	tw.steps++
	tw.now += adv
	z := tw.zones[0]
	tw.record(fmt.Sprintf("step %d: +%dms now=%d settle: %s cost %d to %d charged at %d state %q", tw.steps, adv, tw.now, limitString(l), cost, actual, at, z.raw))
	args := refundArgs([]any{strconv.FormatInt(tw.now, 10)}, algorithms.Refund{Limit: l, Cost: cost, At: at, Settle: true, Settled: actual})
	if _, err := runTwin(tw.ctx, tw.c, []string{z.key}, args...); err != nil {
		t.Fatalf("%s\nscript: %v", tw.history(), err)
	}
	next, fullAt, ok := algorithms.Settle(z.st, z.fresh, l, tw.now, cost, actual, at)
	if ok {
		z.st, z.fresh, z.raw = next, false, encodeState(next)
	}
	raw := getRaw(t, tw.c, z.key)
	if raw != z.raw {
		t.Fatalf("%s\nsettle: stored state: Redis %q, Go %q", tw.history(), raw, z.raw)
	}
	if ok && raw != "" && actual > cost {
		if got := pttl(t, tw.c, z.key); got < fullAt-tw.now {
			t.Fatalf("%s\nsettle: PTTL %dms, the key is full again only in %dms", tw.history(), got, fullAt-tw.now)
		}
	}
	return ok
}
