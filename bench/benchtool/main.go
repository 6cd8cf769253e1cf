// Command benchtool is the Go half of the benchmark harness (bench/run.sh,
// `make bench`): the small jobs that are awkward in a shell script.
//
//	benchtool lua                 print the decision as an EVAL script (algorithms.LuaScript)
//	benchtool lualib              print the production decision library (algorithms.LuaLibrary)
//	benchtool luafn               print the name of its function (algorithms.LuaFunction)
//	benchtool ports N             print N free loopback TCP ports
//	benchtool wait URL SECONDS    wait until URL answers (any status)
//	benchtool snap ADMIN_URL      one line of counters from Caddy's admin endpoint:
//	                              Go heap mallocs and bytes (/debug/vars) and
//	                              Sluice's decision and store error counters (/metrics)
//	benchtool fetch URL FILE      save URL's body to FILE (a pprof profile)
//	benchtool cpu PID...          CPU ticks so far: the machine's busy and steal
//	                              time (/proc/stat) and the given processes' (/proc/PID/stat)
//	benchtool report DIR          the Markdown report of a run from DIR's raw files
//
// It uses only the standard library and the algorithms package.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/caddy-sluice/algorithms"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch args := os.Args[2:]; os.Args[1] {
	case "lua":
		_, err = io.WriteString(os.Stdout, algorithms.LuaScript)
	case "lualib":
		_, err = io.WriteString(os.Stdout, algorithms.LuaLibrary)
	case "luafn":
		_, err = io.WriteString(os.Stdout, algorithms.LuaFunction+"\n")
	case "ports":
		err = ports(args)
	case "wait":
		err = wait(args)
	case "snap":
		err = snap(args)
	case "fetch":
		err = fetch(args)
	case "cpu":
		err = cpu(args)
	case "report":
		err = report(args)
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchtool:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: benchtool lua | ports N | wait URL SECONDS | snap ADMIN_URL | fetch URL FILE | cpu PID... | report DIR")
	os.Exit(2)
}

// ports holds N listeners open at once (so the ports differ), then closes
// them and prints the ports.
func ports(args []string) error {
	if len(args) != 1 {
		usage()
	}
	n, err := strconv.Atoi(args[0])
	if err != nil || n < 1 {
		return fmt.Errorf("ports: bad count %q", args[0])
	}
	var out []string
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		defer l.Close()
		out = append(out, strconv.Itoa(l.Addr().(*net.TCPAddr).Port))
	}
	fmt.Println(strings.Join(out, " "))
	return nil
}

func wait(args []string) error {
	if len(args) != 2 {
		usage()
	}
	secs, err := strconv.ParseFloat(args[1], 64)
	if err != nil {
		return err
	}
	client := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(time.Duration(secs * float64(time.Second)))
	for {
		resp, err := client.Get(args[0])
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not answer within %vs: %v", args[0], args[1], err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func fetch(args []string) error {
	if len(args) != 2 {
		usage()
	}
	resp, err := http.Get(args[0])
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", args[0], resp.Status)
	}
	f, err := os.Create(args[1])
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// cpu prints "busy steal T1 T2 ..." in clock ticks: the machine's busy
// time (user, nice, system, irq, softirq over all CPUs), its steal time, and
// the user+system time of each given process (0 for one that is gone).
func cpu(args []string) error {
	stat, err := os.ReadFile("/proc/stat")
	if err != nil {
		return err
	}
	line, _, _ := strings.Cut(string(stat), "\n")
	fs := strings.Fields(line) // cpu user nice system idle iowait irq softirq steal ...
	if len(fs) < 9 || fs[0] != "cpu" {
		return fmt.Errorf("/proc/stat: unexpected %q", line)
	}
	v := func(i int) uint64 { n, _ := strconv.ParseUint(fs[i], 10, 64); return n }
	out := []string{strconv.FormatUint(v(1)+v(2)+v(3)+v(6)+v(7), 10), fs[8]}
	for _, pid := range args {
		var ticks uint64
		if b, err := os.ReadFile("/proc/" + pid + "/stat"); err == nil {
			// Fields after the command name (which may hold spaces):
			// state is field 3, utime 14, stime 15.
			f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
			if len(f) > 12 {
				u, _ := strconv.ParseUint(f[11], 10, 64)
				s, _ := strconv.ParseUint(f[12], 10, 64)
				ticks = u + s
			}
		}
		out = append(out, strconv.FormatUint(ticks, 10))
	}
	fmt.Println(strings.Join(out, " "))
	return nil
}

// snap prints "mallocs=N bytes=N allowed=N refused=N failed=N store_errors=N".
func snap(args []string) error {
	if len(args) != 1 {
		usage()
	}
	base := strings.TrimRight(args[0], "/")
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get(base + "/debug/vars")
	if err != nil {
		return err
	}
	var vars struct {
		Memstats struct {
			Mallocs    uint64
			TotalAlloc uint64
		} `json:"memstats"`
	}
	err = json.NewDecoder(resp.Body).Decode(&vars)
	resp.Body.Close()
	if err != nil {
		return fmt.Errorf("/debug/vars: %v", err)
	}
	var allowed, refused, failed, storeErrs float64
	if resp, err := client.Get(base + "/metrics"); err == nil {
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			name, labels, value, ok := metricLine(line)
			if !ok {
				continue
			}
			switch name {
			case "caddy_rate_limit_decisions_total":
				switch {
				case strings.Contains(labels, `outcome="allowed"`):
					allowed += value
				case strings.Contains(labels, `outcome="refused"`):
					refused += value
				case strings.Contains(labels, `outcome="failed_`):
					failed += value
				}
			case "caddy_rate_limit_store_errors_total":
				storeErrs += value
			}
		}
		resp.Body.Close()
	}
	fmt.Printf("mallocs=%d bytes=%d allowed=%.0f refused=%.0f failed=%.0f store_errors=%.0f\n",
		vars.Memstats.Mallocs, vars.Memstats.TotalAlloc, allowed, refused, failed, storeErrs)
	return nil
}

// metricLine splits a Prometheus text-format sample line.
func metricLine(line string) (name, labels string, value float64, ok bool) {
	if line == "" || line[0] == '#' {
		return "", "", 0, false
	}
	sp := strings.LastIndexByte(line, ' ')
	if sp < 0 {
		return "", "", 0, false
	}
	v, err := strconv.ParseFloat(line[sp+1:], 64)
	if err != nil {
		return "", "", 0, false
	}
	head := line[:sp]
	if i := strings.IndexByte(head, '{'); i >= 0 {
		return head[:i], head[i:], v, true
	}
	return head, "", v, true
}

// ---- report ----

// sample is one measurement of one target in one round (a line of raw.tsv).
type sample struct {
	round      int
	target     string
	rps        float64
	p50, p99   float64 // microseconds
	requests   float64
	non2xx     float64 // responses with status >= 400
	sockErrs   float64
	mallocs    float64 // Go heap allocations in Caddy during the run
	allocBytes float64
	allowed    float64 // Sluice decisions during the run, all zones
	refused    float64
	failed     float64
	storeErrs  float64
	otherCPU   float64 // cores used by other processes of the machine meanwhile
	steal      float64 // cores stolen by the hypervisor meanwhile
	caddyCPU   float64 // cores used by Caddy, Redis and the load generator
	redisCPU   float64
	genCPU     float64
}

// target describes one row of the table.
type target struct {
	name, what string
	expect     string // "ok": 2xx expected; "429": refusals expected; "" (redis-benchmark)
}

var targets = []target{
	{"bare", "bare Caddy `respond`", "ok"},
	{"mem1", "memstore, 1 zone, never refusing", "ok"},
	{"mem3", "memstore, 3 zones, never refusing", "ok"},
	{"memdeny", "memstore, refusing everything", "429"},
	{"redis1", "Redis, 1 zone, never refusing", "ok"},
	{"redis3", "Redis, 3 zones, never refusing", "ok"},
	{"redisdeny", "Redis, refusing everything", "429"},
	{"rb_plain", "redis-benchmark FCALL (decision ceiling, -c50)", ""},
	{"rb_pipe", "redis-benchmark FCALL -P 16 (pipelined ceiling)", ""},
}

func readSamples(path string) (map[string][]sample, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string][]sample{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 5 || fs[0] == "round" {
			continue
		}
		num := func(i int) float64 {
			if i >= len(fs) {
				return math.NaN()
			}
			v, err := strconv.ParseFloat(fs[i], 64)
			if err != nil {
				return math.NaN()
			}
			return v
		}
		r, _ := strconv.Atoi(fs[0])
		s := sample{round: r, target: fs[1], rps: num(2), p50: num(3), p99: num(4), requests: num(5),
			non2xx: num(6), sockErrs: num(7), mallocs: num(8), allocBytes: num(9),
			allowed: num(10), refused: num(11), failed: num(12), storeErrs: num(13),
			otherCPU: num(14), steal: num(15), caddyCPU: num(16), redisCPU: num(17), genCPU: num(18)}
		out[s.target] = append(out[s.target], s)
	}
	return out, sc.Err()
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

// goBench is one line of `go test -bench` output.
type goBench struct {
	pkg, name             string
	ns, bytesOp, allocsOp float64
	hasMem                bool
}

// A benchmark's name opens its line; its result may come on a later line
// when the code under test logs in between (go test merges the streams).
var (
	benchName   = regexp.MustCompile(`^(Benchmark\S+)`)
	benchResult = regexp.MustCompile(`^\s*\d+\s+([\d.]+) ns/op(?:\s+([\d.]+) B/op\s+([\d.]+) allocs/op)?`)
)

func readGoBench(path string) ([]goBench, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []goBench
	pkg, pending := "", ""
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "pkg: ") {
			pkg = "." + strings.TrimPrefix(strings.TrimPrefix(line, "pkg: "), "github.com/sluicehq/caddy-sluice")
			continue
		}
		if m := benchName.FindStringSubmatch(line); m != nil {
			pending = m[1]
			line = strings.TrimPrefix(line, m[1])
		}
		m := benchResult.FindStringSubmatch(line)
		if m == nil || pending == "" {
			continue
		}
		b := goBench{pkg: pkg, name: pending}
		pending = ""
		b.ns, _ = strconv.ParseFloat(m[1], 64)
		if m[2] != "" {
			b.hasMem = true
			b.bytesOp, _ = strconv.ParseFloat(m[2], 64)
			b.allocsOp, _ = strconv.ParseFloat(m[3], 64)
		}
		out = append(out, b)
	}
	return out, sc.Err()
}

// memLine matches the memory-per-key tests' log lines.
var (
	memstoreLine = regexp.MustCompile(`^\s*\S+:\d+: (\S.*?)\s+(\d+) bytes/key`)
	redisLine    = regexp.MustCompile(`^\s*\S+:\d+: (\S.*?)\s+MEMORY USAGE \S+ SAMPLES 0 =\s*(\d+) bytes`)
)

type memKey struct {
	store, alg string
	bytes      float64
}

func readMemKeys(path string) ([]memKey, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []memKey
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if m := memstoreLine.FindStringSubmatch(line); m != nil {
			v, _ := strconv.ParseFloat(m[2], 64)
			out = append(out, memKey{"memstore", strings.TrimSpace(m[1]), v})
		} else if m := redisLine.FindStringSubmatch(line); m != nil {
			v, _ := strconv.ParseFloat(m[2], 64)
			out = append(out, memKey{"redis", strings.TrimSpace(m[1]), v})
		}
	}
	return out, sc.Err()
}

func report(args []string) error {
	if len(args) != 1 {
		usage()
	}
	dir := args[0]
	samples, err := readSamples(filepath.Join(dir, "raw.tsv"))
	if err != nil {
		return err
	}
	meta, _ := os.ReadFile(filepath.Join(dir, "meta.txt"))
	conns := 50.0
	if m := regexp.MustCompile(`wrk -t\d+ -c(\d+)`).FindSubmatch(meta); m != nil {
		conns, _ = strconv.ParseFloat(string(m[1]), 64)
	}
	maxOther := 0.3
	if m := regexp.MustCompile(`other processes used at most ([\d.]+) cores`).FindSubmatch(meta); m != nil {
		maxOther, _ = strconv.ParseFloat(string(m[1]), 64)
	}
	// The medians use the quiet runs (other processes of the machine used at
	// most maxOther cores meanwhile) when a target has at least two; all of
	// its runs otherwise.
	all := samples
	samples = map[string][]sample{}
	for name, ss := range all {
		var q []sample
		for _, s := range ss {
			if !(s.otherCPU > maxOther) {
				q = append(q, s)
			}
		}
		if len(q) >= 2 {
			samples[name] = q
		} else {
			samples[name] = ss
		}
	}
	w := bufio.NewWriter(os.Stdout)
	defer w.Flush()
	p := func(format string, a ...any) { fmt.Fprintf(w, format, a...) }

	p("# Sluice benchmark results\n\n")
	p("```\n%s```\n\n", meta)

	med := map[string]float64{}
	for _, t := range targets {
		med[t.name] = median(field(samples[t.name], func(s sample) float64 { return s.rps }))
	}
	bare := med["bare"]
	bareAllocs := math.NaN()
	if ss := samples["bare"]; len(ss) > 0 {
		bareAllocs = sum(ss, func(s sample) float64 { return s.mallocs }) / sum(ss, func(s sample) float64 { return s.requests })
	}

	usPerReq := func(s sample) float64 { return s.caddyCPU * 1e6 / s.rps }
	bareUs := median(field(samples["bare"], usPerReq))

	p("## HTTP throughput (medians of the rounds)\n\n")
	p("| target | req/s | p50 | p99 | × bare | rounds | Caddy CPU µs/req (Δ bare) | allocs/req (Δ bare) | CPU cores: Caddy + Redis + load gen. | check |\n")
	p("|---|--:|--:|--:|--:|--:|--:|--:|--:|---|\n")
	for _, t := range targets {
		ss := samples[t.name]
		if len(ss) == 0 {
			continue
		}
		ratio := med[t.name] / bare
		allocs := "–"
		if t.expect != "" {
			a := sum(ss, func(s sample) float64 { return s.mallocs }) / sum(ss, func(s sample) float64 { return s.requests })
			if !math.IsNaN(a) {
				allocs = fmt.Sprintf("%.1f", a)
				if t.name != "bare" && !math.IsNaN(bareAllocs) {
					allocs += fmt.Sprintf(" (%+.1f)", a-bareAllocs)
				}
			}
		}
		cpu := "–"
		if c := median(field(ss, func(s sample) float64 { return s.caddyCPU })); !math.IsNaN(c) {
			r := median(field(ss, func(s sample) float64 { return s.redisCPU }))
			g := median(field(ss, func(s sample) float64 { return s.genCPU }))
			cpu = fmt.Sprintf("%.2f + %.2f + %.2f = %.2f", c, r, g, c+r+g)
		}
		us := "–"
		if t.expect != "" {
			if v := median(field(ss, usPerReq)); !math.IsNaN(v) {
				us = fmt.Sprintf("%.1f", v)
				if t.name != "bare" && !math.IsNaN(bareUs) {
					us += fmt.Sprintf(" (%+.1f)", v-bareUs)
				}
			}
		}
		p("| %s | %s | %s | %s | %.2f | %d/%d | %s | %s | %s | %s |\n", t.what, fmtRate(med[t.name]),
			fmtDur(median(field(ss, func(s sample) float64 { return s.p50 }))),
			fmtDur(median(field(ss, func(s sample) float64 { return s.p99 }))),
			ratio, len(ss), len(all[t.name]), us, allocs, cpu, check(t, ss, conns))
	}
	p("\n`× bare` is the target's median req/s over bare Caddy's median req/s. ")
	p("rounds: the rounds the medians use: those during which other processes of the machine used at most %.2f cores, when a target has two or more such rounds, otherwise all of them. ", maxOther)
	p("Caddy CPU µs/req: Caddy's CPU time per request (from /proc), and in brackets the difference to bare Caddy: the plugin's CPU cost per request, steadier than req/s on a shared machine. ")
	p("allocs/req: Go heap allocations in the Caddy process per request over all rounds (runtime Mallocs from /debug/vars), and in brackets the difference to bare Caddy: what the plugin adds per request in the real server. ")
	p("CPU: cores used during the run (medians of the rounds) by Caddy, Redis and the load generator (wrk or redis-benchmark); a sum near the machine's core count means the run was CPU-bound, well below it means it waited (round trips, locks). ")
	p("check: the responses were what the target expects (200s, or 429s for the refusing targets) and Sluice's own counters show no store error and no failed-open decision (beyond the requests in flight when wrk stops, whose store calls are cancelled).\n\n")

	// Per round: req/s, and how busy the rest of the machine was meanwhile.
	rounds := 0
	for _, ss := range all {
		for _, s := range ss {
			rounds = max(rounds, s.round)
		}
	}
	p("### Per round\n\nreq/s, × bare Caddy of the same round, and in brackets the CPU (cores) that other processes of the machine used meanwhile (not this run's Caddy, Redis or load generator).\n\n| target |")
	for r := 1; r <= rounds; r++ {
		p(" round %d |", r)
	}
	p("\n|---|")
	for range rounds {
		p("--:|")
	}
	p("\n")
	bareOf := map[int]float64{}
	for _, s := range all["bare"] {
		bareOf[s.round] = s.rps
	}
	var others []float64
	for _, t := range targets {
		ss := all[t.name]
		if len(ss) == 0 {
			continue
		}
		cells := make([]string, rounds)
		for _, s := range ss {
			if s.round >= 1 && s.round <= rounds {
				cells[s.round-1] = fmt.Sprintf("%s ×%.2f (%.2f)", fmtRate(s.rps), s.rps/bareOf[s.round], s.otherCPU)
				others = append(others, s.otherCPU)
			}
		}
		p("| %s | %s |\n", t.name, strings.Join(cells, " | "))
	}
	if len(others) > 0 {
		p("\nOther load: median %.2f, max %.2f cores.", median(others), slices.Max(others))
		if slices.Max(others) > 0.25 {
			p(" ⚠ The machine was not idle during some runs: read the ratios of those rounds with care.")
		}
		p("\n\n")
	}

	// Budgets (issue 8, part 3).
	gb, _ := readGoBench(filepath.Join(dir, "gobench.txt"))
	mk, _ := readMemKeys(filepath.Join(dir, "memkey.txt"))
	p("## Budgets\n\n| budget | measured | verdict |\n|---|---|---|\n")
	budget := func(name, measured string, ok bool, known bool) {
		v := "**met**"
		switch {
		case !known:
			v = "not measured"
		case !ok:
			v = "**missed**"
		}
		p("| %s | %s | %s |\n", name, measured, v)
	}
	r := func(n string) float64 { return med[n] / bare }
	ratioBudget := func(name, tgt string, min float64) {
		v := r(tgt)
		if math.IsNaN(v) {
			budget(name, "–", false, false)
			return
		}
		budget(name, fmt.Sprintf("%.2f (%s of %s req/s; %+.0f%% vs budget)", v, fmtRate(med[tgt]), fmtRate(bare), (v/min-1)*100),
			v >= min, !math.IsNaN(v))
	}
	ratioBudget("memstore, 1 zone ≥ 0.95 × bare", "mem1", 0.95)
	ratioBudget("memstore, 3 zones ≥ 0.90 × bare", "mem3", 0.90)
	ratioBudget("Redis, 1 zone ≥ 0.65 × bare", "redis1", 0.65)
	{
		v := med["redis3"] / med["redis1"]
		if math.IsNaN(v) {
			budget("Redis, 3 zones ≈ 1 zone (≥ 0.95 × one zone)", "–", false, false)
		} else {
			budget("Redis, 3 zones ≈ 1 zone (≥ 0.95 × one zone)", fmt.Sprintf("%.2f × one zone (%s vs %s req/s)", v, fmtRate(med["redis3"]), fmtRate(med["redis1"])),
				v >= 0.95, true)
		}
	}
	for _, c := range [][3]string{{"memstore", "memdeny", "mem1"}, {"Redis", "redisdeny", "redis1"}} {
		v := med[c[1]] / med[c[2]]
		if math.IsNaN(v) {
			budget(fmt.Sprintf("refusals cheaper than allowing (%s)", c[0]), "–", false, false)
			continue
		}
		budget(fmt.Sprintf("refusals cheaper than allowing (%s)", c[0]),
			fmt.Sprintf("refusing %s req/s = %.2f × allowing %s req/s", fmtRate(med[c[1]]), v, fmtRate(med[c[2]])),
			v > 1, !math.IsNaN(v))
	}
	{
		found := false
		for _, b := range gb {
			if b.pkg == "." && strings.HasPrefix(b.name, "BenchmarkServeHTTPAllowed") && b.hasMem {
				budget("hot path ≤ 3 allocs/request (memstore, BenchmarkServeHTTPAllowed)",
					fmt.Sprintf("%.0f allocs/op, %.0f B/op, %.0f ns/op", b.allocsOp, b.bytesOp, b.ns), b.allocsOp <= 3, true)
				found = true
				break
			}
		}
		if !found {
			budget("hot path ≤ 3 allocs/request (memstore, BenchmarkServeHTTPAllowed)", "–", false, false)
		}
	}
	for _, c := range []struct {
		store string
		max   float64
	}{{"memstore", 128}, {"redis", 100}} {
		found := false
		for _, m := range mk {
			if m.store == c.store && m.alg == "token_bucket" {
				budget(fmt.Sprintf("memory per key ≤ %.0f B (%s, token bucket)", c.max, c.store),
					fmt.Sprintf("%.0f B (%+.0f B vs budget)", m.bytes, m.bytes-c.max), m.bytes <= c.max, true)
				found = true
			}
		}
		if !found {
			budget(fmt.Sprintf("memory per key ≤ %.0f B (%s, token bucket)", c.max, c.store), "–", false, false)
		}
	}

	if len(gb) > 0 {
		p("\n## Go benchmarks (`go test -bench -benchmem`, one run each)\n\n")
		p("| package | benchmark | ns/op | B/op | allocs/op |\n|---|---|--:|--:|--:|\n")
		for _, b := range gb {
			if b.hasMem {
				p("| %s | %s | %.1f | %.0f | %.0f |\n", b.pkg, b.name, b.ns, b.bytesOp, b.allocsOp)
			} else {
				p("| %s | %s | %.1f | – | – |\n", b.pkg, b.name, b.ns)
			}
		}
	}
	if len(mk) > 0 {
		p("\n## Memory per tracked key (TestMemoryPerKey, TestRedisMemoryPerKey)\n\n")
		p("| store | algorithm | bytes/key |\n|---|---|--:|\n")
		for _, m := range mk {
			p("| %s | %s | %.0f |\n", m.store, m.alg, m.bytes)
		}
	}
	if prof, err := os.ReadFile(filepath.Join(dir, "profiles.txt")); err == nil && len(prof) > 0 {
		p("\n## CPU profiles of Caddy under load (top functions, cumulative)\n\n```\n%s```\n", prof)
	}
	return nil
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
