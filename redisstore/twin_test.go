package redisstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// The Go step function and its Lua twin (the test entry point of the very
// script production runs, with the time in ARGV[1]) must decide every step
// identically and store the same state. These tests run both on the same
// random sequences against a real Redis.

// twinSeed fixes the random sequences: a failure is reproducible.
const twinSeed = 0x5115CE

// twinZone is one zone's key as both twins see it.
type twinZone struct {
	key   string
	st    algorithms.State
	fresh bool
	raw   string // what Redis must hold; "" when the key must be absent
}

// twin runs steps on both twins and compares them.
type twin struct {
	t     *testing.T
	ctx   context.Context
	c     *redis.Client
	now   int64
	zones []*twinZone
	hist  []string
	steps int
	// counted by the penalty and refund twin (twin_penalty_test.go)
	penalties, refunded, noRefund, delays int
}

// twinScript is the test entry point of the decision script: its code,
// with the time in ARGV[1] (the zones' arguments follow), so the Lua twins
// run the same vectors as algorithms.Step.
var twinScript = redis.NewScript(luaTestTime + luaDefs + luaTestRun)

// runTwin runs twinScript on keys and returns its decisions, four integers
// per zone, without what it adds to a refusal for the deny cache (which
// TestLuaRefusalStates checks).
func runTwin(ctx context.Context, c redis.Scripter, keys []string, args ...any) ([]int64, error) {
	v, err := scriptValues(twinScript.Run(ctx, c, keys, args...))
	if err != nil {
		return nil, err
	}
	n := 4 * len(keys)
	if len(v) != n && len(v) != n+1 && len(v) != n+1+len(keys) {
		return nil, fmt.Errorf("the script returned %d values for %d zones", len(v), len(keys))
	}
	out := make([]int64, n)
	for i := range out {
		var ok bool
		if out[i], ok = v[i].(int64); !ok {
			return nil, fmt.Errorf("the script returned %T, want integers", v[i])
		}
	}
	return out, nil
}

func newTwin(t *testing.T, srv *redistest.Server, c *redis.Client, zones int) *twin {
	tw := &twin{t: t, ctx: testCtx(t), c: c, now: 1_700_000_000_000}
	for i := range zones {
		key := fmt.Sprintf("twin:%s:%d", t.Name(), i)
		srv.Do(t, "DEL", key)
		tw.zones = append(tw.zones, &twinZone{key: key, fresh: true})
	}
	return tw
}

type luaDecision struct {
	Allowed                     bool
	Remaining, RetryMs, ResetMs int64
}

// goView is d as the script replies it: an admission's retry-after is its
// wait (a delay zone's).
func goView(d algorithms.Decision) luaDecision {
	return luaDecision{Allowed: d.Allowed, Remaining: d.Remaining,
		RetryMs: d.RetryAfter.Milliseconds() + d.Delay.Milliseconds(), ResetMs: d.ResetAfter.Milliseconds()}
}

// stateString is what the Lua twin stores for st (encodeState):
// comparing it with what Redis holds checks the script's encoder byte for
// byte.
func stateString(st algorithms.State) string { return encodeState(st) }

func limitString(l algorithms.Limit) string {
	return fmt.Sprintf("%s %d/%dms burst %d", l.Algorithm, l.Events, l.Window, l.Burst)
}

// step advances the clock by adv ms and charges costs[i] to zone i under
// limits[i], in one script call (all-or-nothing, like production).
func (tw *twin) step(limits []algorithms.Limit, costs []int64, adv int64) {
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
		r := algorithms.Request{Limit: limits[i], Cost: costs[i]}
		args = luaArgs(args, false, r)
		before := "fresh"
		if !z.fresh {
			before = fmt.Sprintf("%q", stateString(z.st))
		}
		desc = append(desc, fmt.Sprintf("zone %d: limit %s cost %d state %s", i, limitString(limits[i]), costs[i], before))
	}
	line := fmt.Sprintf("step %d: +%dms now=%d; %s", tw.steps, adv, tw.now, strings.Join(desc, "; "))
	tw.hist = append(tw.hist, line)
	if len(tw.hist) > 12 {
		tw.hist = tw.hist[1:]
	}

	res, err := runTwin(tw.ctx, tw.c, keys, args...)
	if err != nil {
		t.Fatalf("%s\nscript: %v", tw.history(), err)
	}

	// Go: every zone steps; all allowed → all charged; otherwise nothing is
	// charged and an allowing zone reports its uncharged view (cost 0).
	decs := make([]algorithms.Decision, n)
	nexts := make([]algorithms.State, n)
	all := true
	for i, z := range tw.zones {
		decs[i], nexts[i], _ = algorithms.Step(z.st, z.fresh, limits[i], tw.now, costs[i])
		all = all && decs[i].Allowed
	}
	for i, z := range tw.zones {
		want := goView(decs[i])
		if !all && decs[i].Allowed {
			d0, _, _ := algorithms.Step(z.st, z.fresh, limits[i], tw.now, 0)
			want = goView(d0)
		}
		got := luaDecision{Allowed: res[4*i] == 1, Remaining: res[4*i+1], RetryMs: res[4*i+2], ResetMs: res[4*i+3]}
		if got != want {
			t.Fatalf("%s\nzone %d decision: Lua %+v, Go %+v", tw.history(), i, got, want)
		}
		if all {
			z.st, z.fresh, z.raw = nexts[i], false, stateString(nexts[i])
		}
	}

	pipe := tw.c.Pipeline()
	gets := make([]*redis.StringCmd, n)
	ttls := make([]*redis.DurationCmd, n)
	for i, z := range tw.zones {
		gets[i] = pipe.Get(tw.ctx, z.key)
		ttls[i] = pipe.PTTL(tw.ctx, z.key)
	}
	if _, err := pipe.Exec(tw.ctx); err != nil && err != redis.Nil {
		t.Fatalf("GET/PTTL: %v", err)
	}
	for i, z := range tw.zones {
		raw, err := gets[i].Result()
		if err == redis.Nil {
			raw = ""
		} else if err != nil {
			t.Fatalf("GET %s: %v", z.key, err)
		}
		if raw != z.raw {
			t.Fatalf("%s\nzone %d stored state: Redis %q, Go %q (all allowed: %v)", tw.history(), i, raw, z.raw, all)
		}
		// The Go decoder (the admin API's) reads back the state Go holds.
		if st, ok := DecodeState(raw); raw != "" && (!ok || encodeText(st) != encodeText(z.st)) {
			t.Fatalf("%s\nzone %d: DecodeState(%q) = %+v %v, want %+v", tw.history(), i, raw, st, ok, z.st)
		}
		if all {
			// Written now: PX = time to full + 1000ms margin, rounded up.
			want := KeyTTL(decs[i].ResetAfter).Milliseconds()
			got := ttls[i].Val().Milliseconds()
			if got > want || got < want-250 {
				t.Fatalf("%s\nzone %d PTTL %dms, want %dms (KeyTTL of reset-after %v)", tw.history(), i, got, want, decs[i].ResetAfter)
			}
		}
	}
}

func (tw *twin) history() string {
	return "last steps (seed " + strconv.Itoa(twinSeed) + "):\n  " + strings.Join(tw.hist, "\n  ")
}

// advance draws a time step suited to l: bursts, token-sized gaps, partial
// windows, long idles.
func advance(rng *rand.Rand, l algorithms.Limit) int64 {
	per := max((l.Window+l.Events-1)/l.Events, 1) // ms per token
	switch r := rng.IntN(100); {
	case r < 20:
		return rng.Int64N(4)
	case r < 60:
		return rng.Int64N(2*per + 1)
	case r < 85:
		return rng.Int64N(l.Window + 1)
	case r < 97:
		return l.Window + rng.Int64N(20*l.Window)
	default:
		return 100*max(l.Window, per*l.Capacity()) + rng.Int64N(1000)
	}
}

// cost draws a cost in 1..capacity+1, favouring small ones.
func cost(rng *rand.Rand, l algorithms.Limit) int64 {
	c := l.Capacity()
	switch r := rng.IntN(100); {
	case r < 60:
		return 1 + rng.Int64N(min(c, 3))
	case r < 92:
		return 1 + rng.Int64N(c+1)
	default:
		return c + rng.Int64N(2)
	}
}

func TestLuaTwinMatchesGo(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	L := func(events int64, window time.Duration, burst int64) algorithms.Limit {
		return limit(t, events, window, burst)
	}
	const steps = 400

	single := []struct {
		name string
		l    algorithms.Limit
	}{
		{"7 per 1000ms", L(7, time.Second, 0)},
		{"10 per min burst 25", L(10, time.Minute, 25)},
		{"3 per 7ms burst 5", L(3, 7*time.Millisecond, 5)},
		{"5 per s burst 2", L(5, time.Second, 2)},
		{"1 per day burst 3", L(1, 24*time.Hour, 3)},
		{"1000 per 1ms", L(1000, time.Millisecond, 0)},
		{"983 per s", L(983, time.Second, 0)},
		{"100000 per h burst 150000", L(100000, time.Hour, 150000)},
		{"13 per 7s burst 20", L(13, 7*time.Second, 20)},
	}
	total := 0
	for si, tc := range single {
		t.Run("single/"+tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(twinSeed, uint64(si)))
			tw := newTwin(t, srv, c, 1)
			for range steps {
				tw.step([]algorithms.Limit{tc.l}, []int64{cost(rng, tc.l)}, advance(rng, tc.l))
			}
			total += tw.steps
		})
	}

	// A changed limit mid-sequence: phases of the same window, then of
	// different windows (the debt is rescaled).
	phased := []struct {
		name   string
		limits []algorithms.Limit
	}{
		{"same window", []algorithms.Limit{L(7, time.Second, 0), L(3, time.Second, 10), L(20, time.Second, 5), L(7, time.Second, 0), L(1, time.Second, 1)}},
		{"different windows", []algorithms.Limit{L(1, time.Second, 0), L(60, time.Minute, 0), L(7, time.Second, 3), L(5, 7*time.Millisecond, 0),
			L(10, time.Hour, 4), L(3, 7*time.Millisecond, 9), L(7, time.Second, 0), L(17, 1500*time.Millisecond, 0), L(200, 200*time.Millisecond, 0)}},
	}
	for pi, tc := range phased {
		t.Run("changed limit/"+tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(twinSeed, uint64(100+pi)))
			tw := newTwin(t, srv, c, 1)
			for _, l := range tc.limits {
				for range 150 {
					tw.step([]algorithms.Limit{l}, []int64{cost(rng, l)}, advance(rng, l))
				}
			}
			total += tw.steps
		})
	}

	// The limit changes on almost every step, among different windows.
	t.Run("changed limit/every step", func(t *testing.T) {
		rng := rand.New(rand.NewPCG(twinSeed, 200))
		set := []algorithms.Limit{L(7, time.Second, 0), L(13, 7*time.Second, 20), L(2, 300*time.Millisecond, 0), L(60, time.Minute, 0)}
		tw := newTwin(t, srv, c, 1)
		for range steps {
			l := set[rng.IntN(len(set))]
			tw.step([]algorithms.Limit{l}, []int64{cost(rng, l)}, advance(rng, l))
		}
		total += tw.steps
	})

	// One realistic change, spelled out: 1 per second (burst 2) becomes 60
	// per minute (the same rate). The client took 1 at t0 and 1 at t0+930ms, so
	// it owes 1.070 tokens: 1070 units of scale 1000, which carry over as
	// exactly 1070×60000/1000 = 64200 units of scale 60000. Its next token
	// (cost 1, no time elapsed) leaves a debt of 124200: back to full in
	// ⌈124200/60⌉ = 2070ms.
	t.Run("changed limit/1 per s to 60 per min", func(t *testing.T) {
		tw := newTwin(t, srv, c, 1)
		perSec, perMin := L(1, time.Second, 2), L(60, time.Minute, 0)
		tw.step([]algorithms.Limit{perSec}, []int64{1}, 0)
		tw.step([]algorithms.Limit{perSec}, []int64{1}, 930)
		if got, _ := DecodeState(tw.zones[0].raw); got != (algorithms.State{Debt: 1070, At: 1700000000930, Scale: 1000}) {
			t.Fatalf("state after two takes %+v (%q)", got, tw.zones[0].raw)
		}
		tw.step([]algorithms.Limit{perMin}, []int64{1}, 0)
		total += tw.steps
	})

	// Several zones in one call: all-or-nothing, and a vetoed zone reports
	// its uncharged view.
	multi := []struct {
		name   string
		limits [][]algorithms.Limit // alternatives per zone; one drawn per step
	}{
		{"2 zones", [][]algorithms.Limit{{L(7, time.Second, 0)}, {L(3, 7*time.Millisecond, 5)}}},
		{"3 zones with changes", [][]algorithms.Limit{{L(10, time.Minute, 25), L(10, time.Minute, 5)}, {L(5, time.Second, 2)}, {L(7, time.Second, 0), L(60, time.Minute, 0)}}},
	}
	for mi, tc := range multi {
		t.Run("multi/"+tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(twinSeed, uint64(300+mi)))
			tw := newTwin(t, srv, c, len(tc.limits))
			for range steps {
				ls := make([]algorithms.Limit, len(tc.limits))
				costs := make([]int64, len(tc.limits))
				for i, alts := range tc.limits {
					ls[i] = alts[rng.IntN(len(alts))]
					costs[i] = cost(rng, ls[i])
					if rng.IntN(3) > 0 {
						costs[i] = 1 // keep most steps passable, so charges happen
					}
				}
				tw.step(ls, costs, advance(rng, ls[rng.IntN(len(ls))]))
			}
			total += tw.steps
		})
	}
	t.Logf("%d steps compared", total)
	if total < 3000 && !t.Failed() {
		t.Fatalf("only %d steps compared", total)
	}
}
