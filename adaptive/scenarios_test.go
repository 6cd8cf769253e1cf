package adaptive

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

// The scenarios of issue 36 on the testbed's virtual clock: a permanent
// latency shift either way, a noisy host, long responses and a route of
// cache hits beside costly misses. `make bench-adaptive` prints their
// tables (-testbed.table); docs/adaptive.md has them.

const (
	fast = testbedMedian
	slow = 4 * testbedMedian // capacity ÷ 4
)

// shiftPhases: 20 s at 0.5× on an upstream of median from, then its median
// moves to to for good: 0.5×, 0.8×, 2× and 0.5× of the new capacity, 20 s
// each; the refusals at half load counted from 10 s into the phase.
func shiftPhases(from, to time.Duration) []phase {
	return []phase{
		{name: "0.5x before", load: 0.5, len: 20 * time.Second, median: from},
		{name: "0.5x shifted", load: 0.5, len: 20 * time.Second, median: to, skip: 10 * time.Second},
		{name: "0.8x", load: 0.8, len: 20 * time.Second},
		{name: "2x", load: 2, len: 20 * time.Second},
		{name: "0.5x after", load: 0.5, len: 20 * time.Second, skip: 10 * time.Second},
	}
}

// The shift's phases by role.
const (
	shiftHalf, shiftOver, shiftAfter = 1, 3, 4
)

// bimodalPhases: the testbed's loads, 320/s (the issue's) among them.
var bimodalPhases = []phase{
	{name: "0.5x", load: 0.5, len: 20 * time.Second},
	{name: "1x", load: 1, len: 20 * time.Second},
	{name: "320/s", load: 320 / testbedCapacity(testbedSigma), len: 20 * time.Second},
	{name: "3x", load: 3, len: 30 * time.Second},
	{name: "0.5x after", load: 0.5, len: 20 * time.Second},
}

type scenario struct {
	name   string
	b      bed
	phases []phase
}

// runScenario runs sc for each contender over testbedSeeds, prints seed
// 1's phases (goodput, refused, from skip on where the phase skips, and
// the limit) to the table or the log, and returns the results by
// contender and seed.
func runScenario(t *testing.T, sc scenario, cs []contender) map[string][][]phaseResult {
	all := map[string][][]phaseResult{}
	for _, c := range cs {
		for _, seed := range testbedSeeds {
			all[c.name] = append(all[c.name], runBed(sc.b, sc.phases, c.mk, seed))
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n%s (seed %d; refused: from 10 s into the phase where it says so)\n| limiter |", sc.name, testbedSeeds[0])
	for _, ph := range sc.phases {
		fmt.Fprintf(&b, " %s |", ph.name)
	}
	b.WriteString("\n|---|" + strings.Repeat("---|", len(sc.phases)) + "\n")
	for _, c := range cs {
		fmt.Fprintf(&b, "| %s |", c.name)
		for i, r := range all[c.name][0] {
			ref, arr := r.refused, r.arrived
			if sc.phases[i].skip > 0 {
				ref, arr = r.refusedLate, r.arrivedLate
			}
			fmt.Fprintf(&b, " %.0f/s, %.2f%%", float64(r.good)/sc.phases[i].len.Seconds(), 100*float64(ref)/float64(max(arr, 1)))
			if len(r.limits) > 0 {
				fmt.Fprintf(&b, ", limit %.1f (%d-%d)", r.meanLimit(0), slices.Min(r.limits), slices.Max(r.limits))
			}
			b.WriteString(" |")
		}
		b.WriteString("\n")
	}
	if *testbedTable {
		fmt.Print(b.String())
	} else {
		t.Log(b.String())
	}
	return all
}

func defaultContender() contender {
	return contender{DefaultController, func() *Limiter {
		s, _ := Settings{}.Resolve()
		return NewLimiter(s)
	}}
}

func noLimit() contender { return contender{"no limit", nil} }

func fixed(n int64) contender {
	return contender{fmt.Sprintf("fixed %d", n), func() *Limiter {
		s, _ := Settings{Minimum: n, Maximum: n, Initial: n}.Resolve()
		return NewLimiter(s)
	}}
}

// lateRefused sums phase i's refusals from its skip on over the seeds,
// as a share of its arrivals then.
func lateRefused(runs [][]phaseResult, i int) float64 {
	ref, arr := 0, 0
	for _, res := range runs {
		ref += res[i].refusedLate
		arr += res[i].arrivedLate
	}
	return float64(ref) / float64(max(arr, 1))
}

// goodput is phase i's goodput per second over the capacity at median.
func goodput(r phaseResult, ph phase, median time.Duration) float64 {
	c := testbedCapacity(testbedSigma) * float64(testbedMedian) / float64(median)
	return float64(r.good) / ph.len.Seconds() / c
}

// TestTestbedShift: the upstream's median moves 50 → 200 ms for good, and
// 200 → 50 ms, on a quiet host and a noisy one (host). For the default
// controller, each seed: at 2× the new capacity the limit comes within
// ±25% of the knee within 20 s of the shift and goodput is at least 90% of
// the new capacity; at half the new capacity, fewer than 1% refused from
// 10 s after the shift and after the overload (over the seeds); and the
// limit never at its minimum below capacity.
func TestTestbedShift(t *testing.T) {
	for _, noisy := range []bool{false, true} {
		for _, sh := range [][2]time.Duration{{fast, slow}, {slow, fast}} {
			host := "quiet host"
			if noisy {
				host = "noisy host"
			}
			sc := scenario{fmt.Sprintf("shift %s → %s, %s", sh[0], sh[1], host), bed{sigma: testbedSigma, noisy: noisy}, shiftPhases(sh[0], sh[1])}
			all := runScenario(t, sc, []contender{noLimit(), fixed(10), defaultContender()})
			for s, seed := range testbedSeeds {
				res := all[DefaultController][s]
				over := res[shiftOver]
				settle := sc.phases[shiftHalf].len + sc.phases[shiftHalf+1].len + over.settle
				if over.settle < 0 || settle > 20*time.Second+sc.phases[shiftHalf].len+sc.phases[shiftHalf+1].len {
					t.Errorf("%s, seed %d: at 2x the limit came within ±25%% of the knee %s into the overload, want within 20 s", sc.name, seed, since(over.settle))
				}
				if g := goodput(over, sc.phases[shiftOver], sh[1]); g < 0.9 {
					t.Errorf("%s, seed %d: goodput at 2x %.0f%% of the new capacity, want at least 90%%", sc.name, seed, 100*g)
				}
				for _, i := range []int{shiftHalf, shiftHalf + 1, shiftAfter} {
					if m := slices.Min(res[i].limits); m <= DefaultMinimum {
						t.Errorf("%s, seed %d: at %s the limit fell to %d, its minimum", sc.name, seed, sc.phases[i].name, m)
					}
				}
			}
			for _, i := range []int{shiftHalf, shiftAfter} {
				if r := lateRefused(all[DefaultController], i); r >= 0.01 {
					t.Errorf("%s: %.2f%% refused at %s from 10 s on over the seeds, want under 1%%", sc.name, 100*r, sc.phases[i].name)
				}
			}
		}
	}
}

// TestTestbedNoisyHost: the testbed's phases on the noisy host. For the
// default controller: fewer than 1% refused at 0.5× and after the
// overload (over the seeds), the limit never at its minimum below
// capacity in any seed, and at 3× goodput at least 80% of the quiet
// host's capacity where no limit collapses.
func TestTestbedNoisyHost(t *testing.T) {
	sc := scenario{"the testbed on the noisy host", bed{sigma: testbedSigma, noisy: true}, testbedPhases}
	all := runScenario(t, sc, []contender{noLimit(), fixed(10), defaultContender()})
	for _, i := range []int{0, testbedDown} {
		refused, arrived := refusedOver(all[DefaultController], i)
		if float64(refused) >= 0.01*float64(arrived) {
			t.Errorf("%s at %s: %d of %d refused over the seeds, want under 1%%", sc.name, sc.phases[i].name, refused, arrived)
		}
	}
	for s, seed := range testbedSeeds {
		res := all[DefaultController][s]
		for _, i := range testbedBelow {
			if m := slices.Min(res[i].limits); m <= DefaultMinimum {
				t.Errorf("seed %d at %s: the limit fell to %d, its minimum", seed, sc.phases[i].name, m)
			}
		}
		if g := goodput(res[testbedOver], sc.phases[testbedOver], fast); g < 0.8 {
			t.Errorf("seed %d at 3x: goodput %.0f%% of the quiet host's capacity, want at least 80%%", seed, 100*g)
		}
		if g := goodput(all["no limit"][s][testbedOver], sc.phases[testbedOver], fast); g > 0.5 {
			t.Errorf("seed %d at 3x: no limit's goodput %.0f%%; the noisy host should collapse it", seed, 100*g)
		}
	}
}

// TestTestbedLongResponses: 2% of the requests are long responses (a
// first byte after a service time, then 10 s without a worker), for each
// policy of what the limit counts and measures of them. The goals for
// the policy the handler uses (longFree), each seed: goodput at 3× within
// 10% of the run without long responses, and fewer than 1% refused at
// 0.5× and after the overload over the seeds.
func TestTestbedLongResponses(t *testing.T) {
	none := runScenario(t, scenario{"no long responses", bed{sigma: testbedSigma}, testbedPhases}, []contender{defaultContender()})
	for _, p := range []struct {
		name  string
		longs longPolicy
	}{{"longFree: a long response gives its place back at its first byte, sampled there", longFree},
		{"longHold: it holds its place to its end, sampled at its first byte", longHold},
		{"longWhole: it holds its place to its end, sampled there", longWhole}} {
		sc := scenario{"2% long responses, " + p.name, bed{sigma: testbedSigma, long: 0.02, longs: p.longs}, testbedPhases}
		all := runScenario(t, sc, []contender{defaultContender()})
		if p.longs != longFree {
			continue
		}
		for s, seed := range testbedSeeds {
			g, g0 := all[DefaultController][s][testbedOver].good, none[DefaultController][s][testbedOver].good
			if float64(g) < 0.9*float64(g0) {
				t.Errorf("seed %d at 3x: goodput %d, want within 10%% of %d without long responses", seed, g, g0)
			}
		}
		for _, i := range []int{0, testbedDown} {
			refused, arrived := refusedOver(all[DefaultController], i)
			if float64(refused) >= 0.01*float64(arrived) {
				t.Errorf("%s at %s: %d of %d refused over the seeds, want under 1%%", sc.name, sc.phases[i].name, refused, arrived)
			}
		}
	}
}

// TestTestbedBimodal: a route of 80% cache hits (2 ms, no worker) and 20%
// misses (250 ms median on the workers). One limit for the route counts
// hits and misses alike; the zone keyed on the class of request (a limit
// each) must give goodput at least no limit's at every load, each seed,
// and at 3× at least 90% of the knee's (1×) goodput.
func TestTestbedBimodal(t *testing.T) {
	one := runScenario(t, scenario{"bimodal route, one limit", bed{sigma: testbedSigma, hits: 0.8}, bimodalPhases},
		[]contender{noLimit(), defaultContender()})
	keyed := runScenario(t, scenario{"bimodal route, a limit per class", bed{sigma: testbedSigma, hits: 0.8, classes: true}, bimodalPhases},
		[]contender{defaultContender()})
	_ = one
	for s, seed := range testbedSeeds {
		res := keyed[DefaultController][s]
		for i, r := range res {
			if n := all(one, "no limit", s, i); r.good < n {
				t.Errorf("seed %d at %s: goodput %d with a limit per class, no limit's %d", seed, bimodalPhases[i].name, r.good, n)
			}
		}
		knee := float64(res[1].good) / bimodalPhases[1].len.Seconds()
		if g := float64(res[3].good) / bimodalPhases[3].len.Seconds(); g < 0.9*knee {
			t.Errorf("seed %d at 3x: goodput %.0f/s, want at least 90%% of the knee's %.0f/s", seed, g, knee)
		}
	}
}

func all(runs map[string][][]phaseResult, name string, seed, i int) int { return runs[name][seed][i].good }

var _ = math.Abs
