package main

// The report's statistics: medians over the rounds, ratios to bare Caddy,
// CPU and allocations per request, the per-round view, and each target's
// check. NaN stands for "not measured" throughout.

import (
	"fmt"
	"math"
	"slices"
	"strings"
)

// stats is what the report says about a run, in numbers.
type stats struct {
	maxOther float64             // the quiet threshold, cores
	all      map[string][]sample // every run, per target
	used     map[string][]sample // the runs the medians use (quietRuns)
	rps      map[string]float64  // median req/s per target
	bare     float64             // bare Caddy's median req/s

	rows []targetRow // the throughput table: the targets with runs, in targets' order

	decide []decideRow // the target decide's table, in decideCases' order

	rounds   int        // the highest round number
	perRound []roundRow // every run, per round
	others   []float64  // other processes' cores during every run
}

// targetRow is one target's numbers in the throughput table.
type targetRow struct {
	target
	runs, allRuns int     // runs the medians use, of all runs
	rps, p50, p99 float64 // medians; latencies in µs
	ratio         float64 // median req/s over bare Caddy's
	// Caddy's CPU µs per request (median over the runs) and allocations
	// per request (over all runs), for HTTP targets; each base is bare
	// Caddy's, to show the difference to, NaN for bare Caddy itself.
	usPerReq, usBase           float64
	allocs, allocsBase         float64
	caddyCPU, redisCPU, genCPU float64 // cores, medians
	// calls is the decision scripts Redis ran per request (over all
	// runs), NaN when not measured.
	calls float64
	// redisUs is Redis's time per decision script (over the runs the
	// medians use), µs; NaN when not measured.
	redisUs float64
	// redisReq is Redis's CPU per request (its main thread's, median over
	// the runs), µs, for the targets with Redis; NaN for the others.
	redisReq float64
	check    string
}

// decideRow is one case of the target decide: the decision's and its
// floor's time per call inside Redis (usec_per_call; CPU: Redis's main
// thread), medians of the rounds, and the ratios of the two measured in
// the same round (medians).
type decideRow struct {
	kase, keys                 string
	runs                       int
	take, floor, ratio         float64
	takeCPU, floorCPU, cpuRate float64
}

// decideCases are the target decide's cases, as bench/run.sh names them.
var decideCases = []struct{ kase, keys, what string }{
	{"tb1", "hot", "1 zone token bucket, hot key"},
	{"tb1", "many", "1 zone token bucket, 100,000 keys"},
	{"gcra1", "hot", "1 zone GCRA, hot key"},
	{"gcra1", "many", "1 zone GCRA, 100,000 keys"},
	{"z3", "hot", "3 zones (TB, TB, SW), hot key"},
	{"z3", "many", "3 zones (TB, TB, SW), 100,000 keys"},
}

// roundRow is one target's runs, one cell per round (nil: none).
type roundRow struct {
	name  string
	cells []*roundCell
}

// roundCell is one run: req/s, its ratio to bare Caddy's run of the same
// round, and the cores other processes used meanwhile.
type roundCell struct{ rps, ratio, other float64 }

// computeStats derives the report's numbers from a results folder.
func computeStats(r *results) *stats {
	st := &stats{maxOther: r.maxOther, all: r.samples, used: quietRuns(r.samples, r.maxOther), rps: map[string]float64{}}
	for _, t := range targets {
		st.rps[t.name] = median(field(st.used[t.name], func(s sample) float64 { return s.rps }))
	}
	st.bare = st.rps["bare"]

	bareAllocs := math.NaN()
	if ss := st.used["bare"]; len(ss) > 0 {
		bareAllocs = allocsPerRequest(ss)
	}
	bareUs := median(field(st.used["bare"], usPerRequest))
	for _, t := range targets {
		ss := st.used[t.name]
		if len(ss) == 0 {
			continue
		}
		row := targetRow{target: t, runs: len(ss), allRuns: len(st.all[t.name]),
			rps: st.rps[t.name], ratio: st.rps[t.name] / st.bare,
			p50:      median(field(ss, func(s sample) float64 { return s.p50 })),
			p99:      median(field(ss, func(s sample) float64 { return s.p99 })),
			caddyCPU: median(field(ss, func(s sample) float64 { return s.caddyCPU })),
			redisCPU: median(field(ss, func(s sample) float64 { return s.redisCPU })),
			genCPU:   median(field(ss, func(s sample) float64 { return s.genCPU })),
			usPerReq: math.NaN(), usBase: math.NaN(), allocs: math.NaN(), allocsBase: math.NaN(), calls: math.NaN(), redisUs: math.NaN(), redisReq: math.NaN(),
			check: check(t, ss, r.conns)}
		if t.expect != "" { // an HTTP target
			row.calls = callsPerRequest(ss)
			row.allocs = allocsPerRequest(ss)
			row.usPerReq = median(field(ss, usPerRequest))
			if t.name != "bare" {
				row.allocsBase, row.usBase = bareAllocs, bareUs
			}
		}
		row.redisUs = usPerCall(ss)
		if t.expect != "" && strings.HasPrefix(t.name, "redis") {
			row.redisReq = median(field(ss, func(s sample) float64 { return s.redisCPU * 1e6 / s.rps }))
		}
		st.rows = append(st.rows, row)
	}

	st.decide = decideStats(r.decide)

	for _, ss := range st.all {
		for _, s := range ss {
			st.rounds = max(st.rounds, s.round)
		}
	}
	bareOf := map[int]float64{}
	for _, s := range st.all["bare"] {
		bareOf[s.round] = s.rps
	}
	for _, t := range targets {
		ss := st.all[t.name]
		if len(ss) == 0 {
			continue
		}
		row := roundRow{name: t.name, cells: make([]*roundCell, st.rounds)}
		for _, s := range ss {
			if s.round >= 1 && s.round <= st.rounds {
				row.cells[s.round-1] = &roundCell{rps: s.rps, ratio: s.rps / bareOf[s.round], other: s.otherCPU}
				st.others = append(st.others, s.otherCPU)
			}
		}
		st.perRound = append(st.perRound, row)
	}
	return st
}

// decideStats computes the target decide's table. One zone's floor is
// measured once (case tb1) and serves GCRA too.
func decideStats(runs []decideRun) []decideRow {
	type at struct {
		kase, keys, fn string
		round          int
	}
	by := map[at]decideRun{}
	for _, r := range runs {
		by[at{r.kase, r.keys, r.fn, r.round}] = r
	}
	var out []decideRow
	for _, c := range decideCases {
		fc := c.kase
		if fc == "gcra1" {
			fc = "tb1"
		}
		row := decideRow{kase: c.kase, keys: c.keys}
		var take, floor, ratio, takeCPU, floorCPU, cpuRatio []float64
		for _, r := range runs {
			if r.kase != c.kase || r.keys != c.keys || r.fn != "take" || r.calls <= 0 {
				continue
			}
			row.runs++
			t, tc := r.usec/r.calls, r.cpuUs/r.calls
			take, takeCPU = append(take, t), append(takeCPU, tc)
			if f, ok := by[at{fc, c.keys, "floor", r.round}]; ok && f.calls > 0 {
				fu, fcpu := f.usec/f.calls, f.cpuUs/f.calls
				floor, floorCPU = append(floor, fu), append(floorCPU, fcpu)
				ratio, cpuRatio = append(ratio, t/fu), append(cpuRatio, tc/fcpu)
			}
		}
		if row.runs == 0 {
			continue
		}
		row.take, row.floor, row.ratio = median(take), median(floor), median(ratio)
		row.takeCPU, row.floorCPU, row.cpuRate = median(takeCPU), median(floorCPU), median(cpuRatio)
		out = append(out, row)
	}
	return out
}

// decideRow returns the target decide's row of a case, nil if none.
func (st *stats) decideRow(kase, keys string) *decideRow {
	for i := range st.decide {
		if st.decide[i].kase == kase && st.decide[i].keys == keys {
			return &st.decide[i]
		}
	}
	return nil
}

// row returns the throughput row of target name, nil if it has none.
func (st *stats) row(name string) *targetRow {
	for i := range st.rows {
		if st.rows[i].name == name {
			return &st.rows[i]
		}
	}
	return nil
}

// quietRuns returns, per target, the runs the medians use: those during
// which other processes of the machine used at most maxOther cores, when a
// target has at least two; all of its runs otherwise.
func quietRuns(all map[string][]sample, maxOther float64) map[string][]sample {
	out := map[string][]sample{}
	for name, ss := range all {
		var q []sample
		for _, s := range ss {
			if !(s.otherCPU > maxOther) {
				q = append(q, s)
			}
		}
		if len(q) >= 2 {
			out[name] = q
		} else {
			out[name] = ss
		}
	}
	return out
}

// usPerRequest is Caddy's CPU time per request during a run, in µs.
func usPerRequest(s sample) float64 { return s.caddyCPU * 1e6 / s.rps }

// callsPerRequest is the decision scripts Redis ran per request over runs
// (NaN when no run measured them).
func callsPerRequest(ss []sample) float64 {
	var calls, reqs float64
	for _, s := range ss {
		if !math.IsNaN(s.redisCalls) {
			calls += s.redisCalls
			reqs += s.requests
		}
	}
	if reqs == 0 {
		return math.NaN()
	}
	return calls / reqs
}

// usPerCall is Redis's time per decision script over runs, µs (NaN when no
// run measured it or Redis ran none).
func usPerCall(ss []sample) float64 {
	var usec, calls float64
	for _, s := range ss {
		if !math.IsNaN(s.redisUsec) && !math.IsNaN(s.redisCalls) {
			usec += s.redisUsec
			calls += s.redisCalls
		}
	}
	if calls == 0 {
		return math.NaN()
	}
	return usec / calls
}

// allocsPerRequest is Caddy's heap allocations per request over runs.
func allocsPerRequest(ss []sample) float64 {
	return sum(ss, func(s sample) float64 { return s.mallocs }) / sum(ss, func(s sample) float64 { return s.requests })
}

func median(xs []float64) float64 {
	var v []float64
	for _, x := range xs {
		if !math.IsNaN(x) {
			v = append(v, x)
		}
	}
	if len(v) == 0 {
		return math.NaN()
	}
	slices.Sort(v)
	if n := len(v); n%2 == 1 {
		return v[n/2]
	} else {
		return (v[n/2-1] + v[n/2]) / 2
	}
}

func field(ss []sample, f func(sample) float64) []float64 {
	out := make([]float64, len(ss))
	for i, s := range ss {
		out[i] = f(s)
	}
	return out
}

func sum(ss []sample, f func(sample) float64) (t float64) {
	for _, s := range ss {
		if v := f(s); !math.IsNaN(v) {
			t += v
		}
	}
	return t
}

// check summarises whether a target's responses and Sluice counters were as
// expected. conns is the load generator's connection count: when wrk stops,
// the requests still in flight are cancelled, and Sluice counts a
// cancelled store call as a store error that failed open; up to conns of
// those per run are that, not a fault.
func check(t target, ss []sample, conns float64) string {
	if t.expect == "" {
		return "–"
	}
	req := sum(ss, func(s sample) float64 { return s.requests })
	non2xx := sum(ss, func(s sample) float64 { return s.non2xx })
	sock := sum(ss, func(s sample) float64 { return s.sockErrs })
	var problems, notes []string
	switch t.expect {
	case "ok":
		if non2xx > 0 {
			problems = append(problems, fmt.Sprintf("%.0f non-2xx", non2xx))
		}
	case "429":
		if ok := req - non2xx; ok > 1*float64(len(ss)) {
			problems = append(problems, fmt.Sprintf("%.0f not refused", ok))
		}
	}
	if sock > 0 {
		problems = append(problems, fmt.Sprintf("%.0f socket errors", sock))
	}
	var cut, bad float64
	for _, s := range ss {
		if s.storeErrs > conns {
			bad += s.storeErrs
		} else {
			cut += s.storeErrs
		}
	}
	if bad > 0 {
		problems = append(problems, fmt.Sprintf("%.0f store errors, %.0f failed-open/closed zone decisions", bad+cut, sum(ss, func(s sample) float64 { return s.failed })))
	} else if cut > 0 {
		notes = append(notes, fmt.Sprintf("%.0f store calls cancelled when wrk stopped", cut))
	}
	out := "ok"
	if t.expect == "429" {
		out = "all 429"
	}
	if len(problems) > 0 {
		out = "⚠ " + strings.Join(problems, ", ")
	}
	if len(notes) > 0 {
		out += " (" + strings.Join(notes, ", ") + ")"
	}
	return out
}
