package redisstore

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// The overrides' twins: the script reads a key's override beside its state
// (lua/take.lua) and decides as algorithms.StepOverride does. Random
// sequences for every algorithm, one zone and two (the all-or-nothing
// veto), with overrides set, changed, expired and removed between steps,
// against a real Redis: the decisions, the overridden capacity the reply
// carries and the stored states must match.
func TestLuaTwinOverrides(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	ctx := testCtx(t)
	L := func(alg algorithms.Algorithm, events int64, window time.Duration, burst int64) algorithms.Limit {
		return limitOf(t, alg, events, window, burst)
	}
	type set struct {
		zone algorithms.Limit
		ovs  []algorithms.Limit // the limits an override may set
	}
	sets := []set{
		{L(algorithms.TokenBucket, 5, time.Second, 0), []algorithms.Limit{L(algorithms.TokenBucket, 50, time.Second, 0), L(algorithms.TokenBucket, 1, time.Second, 0), L(algorithms.TokenBucket, 2, time.Minute, 7)}},
		{L(algorithms.GCRA, 5, time.Second, 3), []algorithms.Limit{L(algorithms.GCRA, 50, time.Second, 0), L(algorithms.GCRA, 1, time.Second, 0), L(algorithms.GCRA, 60, time.Minute, 10)}},
		{L(algorithms.FixedWindow, 5, time.Second, 0), []algorithms.Limit{L(algorithms.FixedWindow, 50, time.Second, 0), L(algorithms.FixedWindow, 1, time.Second, 0), L(algorithms.FixedWindow, 3, 300*time.Millisecond, 0)}},
		{L(algorithms.SlidingWindow, 5, time.Second, 0), []algorithms.Limit{L(algorithms.SlidingWindow, 50, time.Second, 0), L(algorithms.SlidingWindow, 1, time.Second, 0), L(algorithms.SlidingWindow, 9, 2*time.Second, 0)}},
		{L(algorithms.SlidingLog, 5, time.Second, 0), []algorithms.Limit{L(algorithms.SlidingLog, 50, time.Second, 0), L(algorithms.SlidingLog, 1, time.Second, 0), L(algorithms.SlidingLog, 3, 400*time.Millisecond, 0)}},
	}
	// a zone with a penalty and a delay (delay_after above some overrides'
	// capacity)
	pd := L(algorithms.TokenBucket, 5, time.Second, 4)
	pd.Penalty, pd.Delay, pd.DelayAfter = 700, 400, 3
	sets = append(sets, set{pd, []algorithms.Limit{L(algorithms.TokenBucket, 50, time.Second, 0), L(algorithms.TokenBucket, 1, time.Second, 2), L(algorithms.TokenBucket, 2, 300*time.Millisecond, 0)}})
	gd := L(algorithms.GCRA, 5, time.Second, 4)
	gd.Penalty, gd.Delay, gd.DelayAfter = 500, 300, 3
	sets = append(sets, set{gd, []algorithms.Limit{L(algorithms.GCRA, 50, time.Second, 0), L(algorithms.GCRA, 1, time.Second, 2), L(algorithms.GCRA, 2, 400*time.Millisecond, 0)}})
	const steps = 300
	checked := map[string]int{}
	for si, sa := range sets {
		for _, zones := range []int{1, 2} {
			t.Run(fmt.Sprintf("%d-%s/%d zones", si, sa.zone.Algorithm, zones), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(twinSeed, uint64(1000+10*si+zones)))
				tw := newTwin(t, srv, c, zones)
				ovs := make([]*algorithms.Override, zones)
				for range steps {
					tw.now += advance(rng, sa.zone)
					keys := make([]string, zones)
					args := []any{strconv.FormatInt(tw.now, 10)}
					reqs := make([]algorithms.Request, zones)
					for i, z := range tw.zones {
						keys[i] = z.key
						// change the override now and then: none, a limit, block, unlimited
						if rng.IntN(4) == 0 {
							ovs[i] = nil
							srv.Do(t, "DEL", z.key+":o")
							exp := tw.now + 1 + rng.Int64N(3000)
							switch k := rng.IntN(6); {
							case k == 0:
							case k == 1:
								ovs[i] = &algorithms.Override{Block: true, Expires: exp}
							case k == 2:
								ovs[i] = &algorithms.Override{Unlimited: true, Expires: exp}
							default:
								l := sa.ovs[rng.IntN(len(sa.ovs))]
								ovs[i] = &algorithms.Override{Events: l.Events, Window: l.Window, Burst: l.Burst, Expires: exp}
							}
							if ovs[i] != nil {
								if err := ovs[i].Check(sa.zone, tw.now); err != nil {
									t.Fatalf("override %+v: %v", *ovs[i], err)
								}
								// no PXAT: the twin's clock is not Redis's; the script's own expiry check ends it
								srv.Do(t, "SET", z.key+":o", encodeOverride(*ovs[i]))
							}
						}
						reqs[i] = algorithms.Request{Limit: sa.zone, Cost: cost(rng, sa.zone)}
						args = luaArgs(args, false, reqs[i])
					}
					tw.steps++
					tw.hist = append(tw.hist, fmt.Sprintf("step %d now=%d costs %v overrides %v", tw.steps, tw.now, costsOf(reqs), ovs))
					if len(tw.hist) > 12 {
						tw.hist = tw.hist[1:]
					}
					res, err := runTwin(ctx, c, keys, args...)
					if err != nil {
						t.Fatalf("%s\nscript: %v", tw.history(), err)
					}
					decs := make([]algorithms.Decision, zones)
					nexts := make([]algorithms.State, zones)
					writes := make([]bool, zones)
					all := true
					for i, z := range tw.zones {
						if o := ovs[i]; o != nil && o.Expires > tw.now {
							decs[i], nexts[i], _, writes[i] = algorithms.StepOverride(o, z.st, z.fresh, &reqs[i], tw.now, 0)
							checked[overrideKind(o)]++
						} else {
							decs[i], nexts[i], _ = algorithms.StepPending(z.st, z.fresh, &reqs[i], tw.now, 0)
							writes[i] = true
						}
						all = all && decs[i].Allowed
					}
					for i, z := range tw.zones {
						want := decs[i]
						if !all && want.Allowed && writes[i] {
							l := sa.zone
							if o := ovs[i]; o != nil && o.Expires > tw.now {
								l = o.Apply(l)
							}
							want, _, _ = algorithms.Step(z.st, z.fresh, l, tw.now, 0)
							want.Overridden = decs[i].Overridden
						}
						gotLimit, gotOv, a := sa.zone.Capacity(), false, res[4*i]
						if a >= 4 {
							gotLimit, gotOv, a = a/4-1, true, a%4
						}
						got := luaDecision{Allowed: a == 1, Remaining: res[4*i+1], RetryMs: res[4*i+2], ResetMs: res[4*i+3]}
						if got != goView(want) || gotOv != want.Overridden || gotLimit != want.Limit {
							t.Fatalf("%s\nzone %d: Lua %+v (overridden %v, limit %d), Go %+v", tw.history(), i, got, gotOv, gotLimit, want)
						}
						switch {
						case all && writes[i]:
							z.st, z.fresh, z.raw = nexts[i], false, stateString(nexts[i])
						case writes[i] && !decs[i].Allowed && algorithms.StartsPenalty(z.st, z.fresh, nexts[i]):
							// a refusal that starts the zone's penalty writes it, whatever the others decided
							z.st, z.fresh, z.raw = nexts[i], false, stateString(nexts[i])
						}
						raw, err := c.Get(ctx, z.key).Result()
						if err == redis.Nil {
							raw, err = "", nil
						}
						if err != nil || raw != z.raw {
							t.Fatalf("%s\nzone %d stored: Redis %q (%v), Go %q", tw.history(), i, raw, err, z.raw)
						}
					}
				}
			})
		}
	}
	for _, k := range []string{"limit", "block", "unlimited"} {
		if checked[k] < 50 {
			t.Errorf("only %d decisions under a %s override were compared", checked[k], k)
		}
	}
	t.Logf("decisions compared under overrides: %v", checked)
}

func overrideKind(o *algorithms.Override) string {
	switch {
	case o.Block:
		return "block"
	case o.Unlimited:
		return "unlimited"
	}
	return "limit"
}

func costsOf(reqs []algorithms.Request) []int64 {
	out := make([]int64, len(reqs))
	for i := range reqs {
		out[i] = reqs[i].Cost
	}
	return out
}
