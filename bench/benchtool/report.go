package main

// `benchtool report DIR`: the Markdown report of a results folder. Reading
// is in results.go, the numbers in stats.go, the budgets in budgets.go;
// this file only renders them.

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
)

func report(args []string) error {
	if len(args) != 1 {
		usage()
	}
	r, err := readResults(args[0])
	if err != nil {
		return err
	}
	w := bufio.NewWriter(os.Stdout)
	st := computeStats(r)
	renderReport(w, r, st, judgeBudgets(st, r.gobench, r.memKeys))
	return w.Flush()
}

// renderReport writes the report: the run's metadata, the throughput
// table, the per-round table, the budgets, the Go benchmarks, memory per
// key and the CPU profiles.
func renderReport(w io.Writer, r *results, st *stats, verdicts []verdict) {
	p := func(format string, a ...any) { fmt.Fprintf(w, format, a...) }

	p("# Sluice benchmark results\n\n")
	p("```\n%s```\n\n", r.meta)
	renderThroughput(p, st)
	renderRounds(p, st)
	renderDecide(p, st)
	p("## Budgets\n\n| budget | measured | verdict |\n|---|---|---|\n")
	for _, v := range verdicts {
		p("| %s | %s | %s |\n", v.budget, v.measured, verdictText[v.kind])
	}
	renderGoBench(p, r.gobench)
	if len(r.memKeys) > 0 {
		p("\n## Memory per tracked key (TestMemoryPerKey, TestRedisMemoryPerKey)\n\n")
		p("| store | algorithm | bytes/key |\n|---|---|--:|\n")
		for _, m := range r.memKeys {
			p("| %s | %s | %.0f |\n", m.store, m.alg, m.bytes)
		}
	}
	if len(r.profiles) > 0 {
		p("\n## CPU profiles of Caddy under load (top functions, cumulative)\n\n```\n%s```\n", r.profiles)
	}
}

// printer writes a formatted piece of the report.
type printer func(format string, a ...any)

// renderThroughput is the HTTP throughput table and what its columns mean.
func renderThroughput(p printer, st *stats) {
	p("## HTTP throughput (medians of the rounds)\n\n")
	calls := slices.ContainsFunc(st.rows, func(t targetRow) bool { return !math.IsNaN(t.calls) })
	redisUs := slices.ContainsFunc(st.rows, func(t targetRow) bool { return !math.IsNaN(t.redisUs) })
	redisReq := slices.ContainsFunc(st.rows, func(t targetRow) bool { return !math.IsNaN(t.redisReq) })
	p("| target | req/s | p50 | p99 | × bare | rounds | Caddy CPU µs/req (Δ bare) | allocs/req (Δ bare) |")
	if calls {
		p(" Redis calls/req |")
	}
	if redisUs {
		p(" Redis µs/decision |")
	}
	if redisReq {
		p(" Redis CPU µs/req |")
	}
	p(" CPU cores: Caddy + Redis + load gen. | check |\n|---|--:|--:|--:|--:|--:|--:|--:|")
	if calls {
		p("--:|")
	}
	if redisUs {
		p("--:|")
	}
	if redisReq {
		p("--:|")
	}
	p("--:|---|\n")
	for _, t := range st.rows {
		cpu := "–"
		if !math.IsNaN(t.caddyCPU) {
			cpu = fmt.Sprintf("%.2f + %.2f + %.2f = %.2f", t.caddyCPU, t.redisCPU, t.genCPU, t.caddyCPU+t.redisCPU+t.genCPU)
		}
		p("| %s | %s | %s | %s | %.2f | %d/%d | %s | %s |", t.what, fmtRate(t.rps), fmtDur(t.p50), fmtDur(t.p99),
			t.ratio, t.runs, t.allRuns, fmtDelta(t.usPerReq, t.usBase), fmtDelta(t.allocs, t.allocsBase))
		if calls {
			p(" %s |", fmtCalls(t.calls))
		}
		if redisUs {
			p(" %s |", fmtUs(t.redisUs))
		}
		if redisReq {
			p(" %s |", fmtUs(t.redisReq))
		}
		p(" %s | %s |\n", cpu, t.check)
	}
	p("\n`× bare` is the target's median req/s over bare Caddy's median req/s. ")
	p("rounds: the rounds the medians use: those during which other processes of the machine used at most %.2f cores, when a target has two or more such rounds, otherwise all of them. ", st.maxOther)
	p("Caddy CPU µs/req: Caddy's CPU time per request (from /proc), and in brackets the difference to bare Caddy: the plugin's CPU cost per request, steadier than req/s on a shared machine. ")
	p("allocs/req: Go heap allocations in the Caddy process per request over all rounds (runtime Mallocs from /debug/vars), and in brackets the difference to bare Caddy: what the plugin adds per request in the real server. ")
	p("CPU: cores used during the run (medians of the rounds) by Caddy, Redis and the load generator (wrk or redis-benchmark); a sum near the machine's core count means the run was CPU-bound, well below it means it waited (round trips, locks). ")
	if calls {
		p("Redis calls/req: the decision scripts Redis ran (INFO commandstats: FCALL, EVALSHA, EVAL) per request over all rounds; below 1 when the deny cache or a local allowance answered without Redis. ")
	}
	if redisUs {
		p("Redis µs/decision: Redis's time inside the decision scripts per call (INFO commandstats, `usec` over `calls` of FCALL, FCALL_RO, EVALSHA and EVAL, reset by CONFIG RESETSTAT before each run), over the runs the medians use; it counts the time Redis waited for a core inside a call. ")
	}
	if redisReq {
		p("Redis CPU µs/req: the CPU time of Redis's main thread (INFO cpu) per request, median of the rounds: what a request costs the shared Redis, the script calls and the asynchronous mode's syncs alike (it includes Redis's own upkeep, about 0.02 cores idle). ")
	}
	p("check: the responses were what the target expects (200s, or 429s for the refusing targets) and Sluice's own counters show no store error and no failed-open decision (beyond the requests in flight when wrk stops, whose store calls are cancelled).\n\n")
}

// renderRounds is each round's req/s and the other load meanwhile.
func renderRounds(p printer, st *stats) {
	p("### Per round\n\nreq/s, × bare Caddy of the same round, and in brackets the CPU (cores) that other processes of the machine used meanwhile (not this run's Caddy, Redis or load generator).\n\n| target |")
	for r := 1; r <= st.rounds; r++ {
		p(" round %d |", r)
	}
	p("\n|---|")
	for range st.rounds {
		p("--:|")
	}
	p("\n")
	for _, row := range st.perRound {
		cells := make([]string, len(row.cells))
		for i, c := range row.cells {
			if c != nil {
				cells[i] = fmt.Sprintf("%s ×%.2f (%.2f)", fmtRate(c.rps), c.ratio, c.other)
			}
		}
		p("| %s | %s |\n", row.name, strings.Join(cells, " | "))
	}
	if len(st.others) > 0 {
		p("\nOther load: median %.2f, max %.2f cores.", median(st.others), slices.Max(st.others))
		if slices.Max(st.others) > 0.25 {
			p(" ⚠ The machine was not idle during some runs: read the ratios of those rounds with care.")
		}
		p("\n\n")
	}
}

// renderDecide is a decision inside Redis against its floor (target
// decide), if it ran.
func renderDecide(p printer, st *stats) {
	if len(st.decide) > 0 {
		p("## Inside Redis: a decision against its floor (target decide)\n\n")
		p("| case | rounds | decision µs | floor µs | decision / floor | decision CPU µs | floor CPU µs | CPU decision / floor |\n|---|--:|--:|--:|--:|--:|--:|--:|\n")
		for _, c := range decideCases {
			d := st.decideRow(c.kase, c.keys)
			if d == nil {
				continue
			}
			p("| %s | %d | %s | %s | %s | %s | %s | %s |\n", c.what, d.runs, fmtUs(d.take), fmtUs(d.floor), fmtRatio(d.ratio),
				fmtUs(d.takeCPU), fmtUs(d.floorCPU), fmtRatio(d.cpuRate))
		}
		p("\nredis-benchmark -P 16 of the production function (FCALL, one zone's or three zones' arguments as Caddy sends them) and of its floor (a Function doing TIME, and per zone GET and SET PX of a constant, on keys of its own, with the same arguments), one after the other in every round. µs: `usec_per_call` of INFO commandstats (reset before each run), which counts the time Redis waited for a core inside a call; CPU µs: Redis's main thread CPU per call (INFO cpu), which a busy machine does not inflate but which includes reading and writing the network. Medians of the rounds; the ratios are each round's decision over the same round's floor, medians. Hot key: 1e9 events a minute; 100,000 keys: 1000 events a day, filled before the rounds, so every visit reads and writes a live state.\n\n")
	}
}

// renderGoBench is the Go benchmarks' table, if any ran.
func renderGoBench(p printer, gobench []goBench) {
	if len(gobench) > 0 {
		p("\n## Go benchmarks (`go test -bench -benchmem`, one run each)\n\n")
		cpu := slices.ContainsFunc(gobench, func(b goBench) bool { return !math.IsNaN(b.cpuUs) })
		p("| package | benchmark | ns/op |")
		if cpu {
			p(" client CPU µs/op |")
		}
		p(" B/op | allocs/op |\n|---|---|--:|")
		if cpu {
			p("--:|")
		}
		p("--:|--:|\n")
		for _, b := range gobench {
			p("| %s | %s | %.1f |", b.pkg, b.name, b.ns)
			if cpu {
				if math.IsNaN(b.cpuUs) {
					p(" – |")
				} else {
					p(" %.2f |", b.cpuUs)
				}
			}
			if b.hasMem {
				p(" %.0f | %.0f |\n", b.bytesOp, b.allocsOp)
			} else {
				p(" – | – |\n")
			}
		}
		if cpu {
			p("\nclient CPU µs/op: the benchmark process's CPU time per operation (getrusage; Redis runs in its own process), steadier than ns/op on a shared machine.\n")
		}
	}
}

// verdictText is a verdict as the budgets table shows it.
var verdictText = map[verdictKind]string{met: "**met**", missed: "**missed**", notMeasured: "not measured"}

// fmtDelta renders a per-request number and, when base is known, its
// difference to it in brackets; "–" when the number is unknown.
func fmtDelta(v, base float64) string {
	if math.IsNaN(v) {
		return "–"
	}
	s := fmt.Sprintf("%.1f", v)
	if !math.IsNaN(base) {
		s += fmt.Sprintf(" (%+.1f)", v-base)
	}
	return s
}

// fmtUs renders µs per call, "–" when unknown.
func fmtUs(v float64) string {
	if math.IsNaN(v) {
		return "–"
	}
	return fmt.Sprintf("%.2f", v)
}

// fmtRatio renders a ratio, "–" when unknown.
func fmtRatio(v float64) string {
	if math.IsNaN(v) {
		return "–"
	}
	return fmt.Sprintf("×%.2f", v)
}

// fmtCalls renders Redis calls per request.
func fmtCalls(v float64) string {
	switch {
	case math.IsNaN(v):
		return "–"
	case v != 0 && v < 0.01:
		return fmt.Sprintf("%.4f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

func fmtDur(us float64) string {
	switch {
	case math.IsNaN(us):
		return "–"
	case us >= 1e6:
		return fmt.Sprintf("%.2f s", us/1e6)
	case us >= 1000:
		return fmt.Sprintf("%.2f ms", us/1000)
	default:
		return fmt.Sprintf("%.0f µs", us)
	}
}

func fmtRate(v float64) string {
	if math.IsNaN(v) {
		return "–"
	}
	return strconv.FormatFloat(math.Round(v), 'f', 0, 64)
}
