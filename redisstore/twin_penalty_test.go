package redisstore

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// The penalty and the refund, Go against Lua: random sequences of takes
// (one zone, or two decided together, with and without penalties) and
// refunds of earlier charges (named by their instant, in any order), for
// every algorithm, through the test entry point of the production script.
// Every decision, every stored value (byte for byte) and every TTL a
// write sets must agree with algorithms.Step and algorithms.GiveBack.
func TestLuaTwinPenaltiesAndRefunds(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	type lim = algorithms.Limit
	P := func(l lim, penalty int64) lim { l.Penalty = penalty; return l }
	D := func(l lim, delay, after int64) lim { l.Delay, l.DelayAfter = delay, after; return l }
	L := func(alg algorithms.Algorithm, events int64, window time.Duration, burst int64) lim {
		return limitOf(t, alg, events, window, burst)
	}
	TB, G, SW, FW, SL := algorithms.TokenBucket, algorithms.GCRA, algorithms.SlidingWindow, algorithms.FixedWindow, algorithms.SlidingLog
	cases := []struct {
		name   string
		limits []lim // one per zone
	}{
		{"token_bucket penalty", []lim{P(L(TB, 3, time.Second, 0), 2500)}},
		{"token_bucket 1 per 10s penalty 2s", []lim{P(L(TB, 1, 10*time.Second, 2), 2000)}},
		{"gcra penalty", []lim{P(L(G, 7, 3*time.Second, 3), 4000)}},
		{"sliding_window penalty", []lim{P(L(SW, 5, time.Second, 0), 1500)}},
		{"fixed_window penalty", []lim{P(L(FW, 5, time.Second, 0), 700)}},
		{"sliding_log penalty", []lim{P(L(SL, 4, time.Second, 0), 1200)}},
		{"token_bucket refunds", []lim{L(TB, 5, time.Second, 0)}},
		{"gcra refunds", []lim{L(G, 5, time.Second, 0)}},
		{"sliding_window refunds", []lim{L(SW, 5, time.Second, 0)}},
		{"fixed_window refunds", []lim{L(FW, 5, time.Second, 0)}},
		{"sliding_log refunds", []lim{L(SL, 5, time.Second, 0)}},
		{"two zones, one with a penalty", []lim{P(L(TB, 4, time.Second, 0), 3000), L(SL, 6, 2*time.Second, 0)}},
		{"two zones, both with penalties", []lim{P(L(FW, 3, time.Second, 0), 800), P(L(G, 5, time.Second, 2), 1500)}},
		{"token_bucket delay", []lim{D(L(TB, 10, time.Second, 1), 3000, 0)}},
		{"token_bucket delay_after", []lim{D(L(TB, 10, time.Second, 5), 1000, 2)}},
		{"gcra delay", []lim{D(L(G, 7, 3*time.Second, 3), 2500, 0)}},
		{"gcra delay_after, penalty", []lim{P(D(L(G, 10, time.Second, 5), 800, 3), 1200)}},
		{"delay beside a sliding log", []lim{D(L(TB, 5, time.Second, 2), 1500, 1), L(SL, 20, 2*time.Second, 0)}},
	}
	total := 0
	for ci, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(twinSeed, uint64(9000+ci)))
			tw := newTwin(t, srv, c, len(tc.limits))
			type charge struct {
				zone       int
				cost, at   int64
				refundable bool
			}
			var charges []charge
			for range 500 {
				if len(charges) > 0 && rng.IntN(10) < 3 {
					k := rng.IntN(len(charges))
					ch := charges[k]
					charges = append(charges[:k], charges[k+1:]...)
					tw.refund(tc.limits[ch.zone], ch.zone, ch.cost, ch.at, advance(rng, tc.limits[ch.zone])/4)
					continue
				}
				costs := make([]int64, len(tc.limits))
				for i, l := range tc.limits {
					costs[i] = cost(rng, l)
				}
				adv := advance(rng, tc.limits[0]) / 2
				if tc.limits[0].Delay > 0 && rng.IntN(2) == 0 {
					adv = 0 // bursts, so that requests wait
				}
				decs := tw.penaltyStep(tc.limits, costs, adv, rng.IntN(5) == 0)
				for i, d := range decs {
					if d.Allowed && decsAllAllowed(decs) {
						charges = append(charges, charge{zone: i, cost: costs[i], at: tw.now})
					}
				}
			}
			total += tw.steps
			t.Logf("%d steps: %d penalties started, %d waits, %d refunds written, %d refunds with nothing to give back", tw.steps, tw.penalties, tw.delays, tw.refunded, tw.noRefund)
			if tw.refunded == 0 || tc.limits[0].Penalty > 0 && tw.penalties == 0 || tc.limits[0].Delay > 0 && tw.delays == 0 {
				t.Fatalf("the sequence exercised too little")
			}
		})
	}
	t.Logf("%d steps compared", total)
}

func decsAllAllowed(ds []algorithms.Decision) bool {
	for _, d := range ds {
		if !d.Allowed {
			return false
		}
	}
	return true
}

// penaltyStep advances the clock by adv ms and takes costs[i] from zone i
// under limits[i] in one script call, and checks Lua against Go: a zone's
// penalty starting is written whatever the other zones decide.
func (tw *twin) penaltyStep(limits []algorithms.Limit, costs []int64, adv int64, noDelay bool) []algorithms.Decision {
	t := tw.t
	t.Helper()
	tw.steps++
	tw.now += adv
	n := len(tw.zones)
	keys := make([]string, n)
	args := []any{strconv.FormatInt(tw.now, 10)}
	var desc []string
	for i, z := range tw.zones {
		keys[i] = z.key
		args = luaArgs(args, false, algorithms.Request{Limit: limits[i], Cost: costs[i], NoDelay: noDelay})
		desc = append(desc, fmt.Sprintf("zone %d: %s penalty %d delay %d/%d cost %d no delay %v state %q", i, limitString(limits[i]), limits[i].Penalty, limits[i].Delay, limits[i].DelayAfter, costs[i], noDelay, z.raw))
	}
	tw.record(fmt.Sprintf("step %d: +%dms now=%d take; %s", tw.steps, adv, tw.now, strings.Join(desc, "; ")))
	res, err := runTwin(tw.ctx, tw.c, keys, args...)
	if err != nil {
		t.Fatalf("%s\nscript: %v", tw.history(), err)
	}
	decs := make([]algorithms.Decision, n)
	nexts := make([]algorithms.State, n)
	all := true
	for i, z := range tw.zones {
		r := algorithms.Request{Limit: limits[i], Cost: costs[i], NoDelay: noDelay}
		decs[i], nexts[i], _ = algorithms.StepRequest(z.st, z.fresh, &r, tw.now)
		all = all && decs[i].Allowed
		if decs[i].Delay > 0 {
			tw.delays++
		}
	}
	written := make([]bool, n)
	for i, z := range tw.zones {
		want := decs[i]
		switch {
		case all:
			written[i] = true
		case !decs[i].Allowed:
			written[i] = algorithms.StartsPenalty(z.st, z.fresh, nexts[i])
		default:
			want, _, _ = algorithms.Step(z.st, z.fresh, limits[i], tw.now, 0)
		}
		got := luaDecision{Allowed: res[4*i] == 1, Remaining: res[4*i+1], RetryMs: res[4*i+2], ResetMs: res[4*i+3]}
		if got != goView(want) {
			t.Fatalf("%s\nzone %d decision: Lua %+v, Go %+v", tw.history(), i, got, goView(want))
		}
		if written[i] {
			if !decs[i].Allowed {
				tw.penalties++
			}
			z.st, z.fresh, z.raw = nexts[i], false, encodeState(nexts[i])
		}
	}
	for i, z := range tw.zones {
		raw := getRaw(t, tw.c, z.key)
		if raw != z.raw {
			t.Fatalf("%s\nzone %d stored state: Redis %q, Go %q (all allowed %v, written %v)", tw.history(), i, raw, z.raw, all, written[i])
		}
		if st, ok := DecodeState(raw); raw != "" && (!ok || encodeState(st) != raw) {
			t.Fatalf("%s\nzone %d: DecodeState(%q) = %+v %v, which encodes back as %q", tw.history(), i, raw, st, ok, encodeState(st))
		}
		if written[i] {
			want := KeyTTL(decs[i].ResetAfter).Milliseconds()
			if got := pttl(t, tw.c, z.key); got > want || got < want-250 {
				t.Fatalf("%s\nzone %d PTTL %dms, want %dms (KeyTTL of reset-after %v)", tw.history(), i, got, want, decs[i].ResetAfter)
			}
		}
	}
	if all {
		tw.record(fmt.Sprintf("  allowed: %v", decs))
	}
	return decs
}

// refund advances the clock by adv ms and gives back cost, charged at at,
// to zone i under l; Lua must store what GiveBack returns and keep the
// key's TTL.
func (tw *twin) refund(l algorithms.Limit, i int, cost, at, adv int64) {
	t := tw.t
	t.Helper()
	tw.steps++
	tw.now += adv
	z := tw.zones[i]
	tw.record(fmt.Sprintf("step %d: +%dms now=%d refund zone %d: %s cost %d charged at %d state %q", tw.steps, adv, tw.now, i, limitString(l), cost, at, z.raw))
	ttlBefore := pttl(t, tw.c, z.key)
	args := refundArgs([]any{strconv.FormatInt(tw.now, 10)}, algorithms.Refund{Limit: l, Cost: cost, At: at})
	if _, err := runTwin(tw.ctx, tw.c, []string{z.key}, args...); err != nil {
		t.Fatalf("%s\nscript: %v", tw.history(), err)
	}
	if next, _, ok := algorithms.GiveBack(z.st, z.fresh, l, tw.now, cost, at); ok {
		z.st, z.fresh, z.raw = next, false, encodeState(next)
		tw.refunded++
	} else {
		tw.noRefund++
	}
	raw := getRaw(t, tw.c, z.key)
	if raw != z.raw {
		t.Fatalf("%s\nrefund, zone %d stored state: Redis %q, Go %q", tw.history(), i, raw, z.raw)
	}
	if raw != "" {
		if got := pttl(t, tw.c, z.key); got > ttlBefore || got < ttlBefore-250 {
			t.Fatalf("%s\nrefund, zone %d: PTTL %dms, %dms before: the refund must keep the TTL", tw.history(), i, got, ttlBefore)
		}
	}
}

// record adds a line to the history a failure prints.
func (tw *twin) record(line string) {
	tw.hist = append(tw.hist, line)
	if len(tw.hist) > 16 {
		tw.hist = tw.hist[1:]
	}
}
