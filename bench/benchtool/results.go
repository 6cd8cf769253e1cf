package main

// Reading a results folder (bench/run.sh writes it): raw.tsv, meta.txt,
// gobench.txt, memkey.txt, profiles.txt.

import (
	"bufio"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

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
	// redisCalls is the decision scripts Redis ran (FCALL, EVALSHA, EVAL:
	// INFO commandstats) during the run; NaN when not measured.
	redisCalls float64
	// redisUsec is Redis's time inside them, µs (usec of INFO
	// commandstats); NaN when not measured.
	redisUsec float64
}

// target describes one row of the table.
type target struct {
	name, what string
	expect     string // "ok": 2xx expected; "429": refusals expected; "" (redis-benchmark)
}

var targets = []target{
	{"bare", "bare Caddy `respond`", "ok"},
	{"barek", "bare Caddy `respond`, a key per request (wrk-keys.lua)", "ok"},
	{"mem1", "memstore, 1 zone, never refusing", "ok"},
	{"mem3", "memstore, 3 zones, never refusing", "ok"},
	{"memconc", "memstore, 1 zone + a concurrency zone, never refusing", "ok"},
	{"memdeny", "memstore, refusing everything", "429"},
	{"redis1", "Redis, 1 zone, never refusing", "ok"},
	{"redis3", "Redis, 3 zones, never refusing", "ok"},
	{"redisconc", "Redis, 1 zone + a concurrency zone, never refusing", "ok"},
	{"redis1k", "Redis, 1 zone, many keys (a key per client)", "ok"},
	{"redis3k", "Redis, 3 zones, many keys", "ok"},
	{"redis1ka", "Redis, 1 zone, many keys, asynchronous (`sync 50ms`)", "ok"},
	{"redis3ka", "Redis, 3 zones, many keys, asynchronous (`sync 50ms`)", "ok"},
	{"redislocal", "Redis, 1 zone, one hot key, `local_allowance`", "ok"},
	{"redisdeny", "Redis, refusing everything", "429"},
	{"rb_plain", "redis-benchmark FCALL (decision ceiling, -c50)", ""},
	{"rb_pipe", "redis-benchmark FCALL -P 16 (pipelined ceiling)", ""},
}

// results is a results folder, read.
type results struct {
	meta     []byte              // meta.txt, printed as it is
	conns    float64             // wrk's -c (meta.txt), 50 if not found
	maxOther float64             // the quiet threshold in cores (meta.txt), 0.3 if not found
	samples  map[string][]sample // raw.tsv, per target
	gobench  []goBench           // gobench.txt, if any
	memKeys  []memKey            // memkey.txt, if any
	profiles []byte              // profiles.txt, if any
	decide   []decideRun         // decide.tsv, if any
}

// decideRun is one run of the target decide (a line of decide.tsv): the
// decision or its floor, one case and key space, in Redis.
type decideRun struct {
	round          int
	kase, keys, fn string  // tb1|gcra1|z3, hot|many, take|floor
	calls, usec    float64 // INFO commandstats
	cpuUs          float64 // Redis's main thread CPU over the run, µs
	other          float64 // cores other processes used meanwhile
}

var (
	metaConns    = regexp.MustCompile(`wrk -t\d+ -c(\d+)`)
	metaMaxOther = regexp.MustCompile(`other processes used at most ([\d.]+) cores`)
)

// readResults reads dir; only raw.tsv is required.
func readResults(dir string) (*results, error) {
	samples, err := readSamples(filepath.Join(dir, "raw.tsv"))
	if err != nil {
		return nil, err
	}
	r := &results{samples: samples, conns: 50, maxOther: 0.3}
	r.meta, _ = os.ReadFile(filepath.Join(dir, "meta.txt"))
	if m := metaConns.FindSubmatch(r.meta); m != nil {
		r.conns, _ = strconv.ParseFloat(string(m[1]), 64)
	}
	if m := metaMaxOther.FindSubmatch(r.meta); m != nil {
		r.maxOther, _ = strconv.ParseFloat(string(m[1]), 64)
	}
	r.gobench, _ = readGoBench(filepath.Join(dir, "gobench.txt"))
	r.memKeys, _ = readMemKeys(filepath.Join(dir, "memkey.txt"))
	r.profiles, _ = os.ReadFile(filepath.Join(dir, "profiles.txt"))
	r.decide, _ = readDecide(filepath.Join(dir, "decide.tsv"))
	return r, nil
}

func readSamples(path string) (map[string][]sample, error) {
	out := map[string][]sample{}
	err := readRows(path, 5, func(fs []string, num func(int) float64) {
		r, _ := strconv.Atoi(fs[0])
		s := sample{round: r, target: fs[1], rps: num(2), p50: num(3), p99: num(4), requests: num(5),
			non2xx: num(6), sockErrs: num(7), mallocs: num(8), allocBytes: num(9),
			allowed: num(10), refused: num(11), failed: num(12), storeErrs: num(13),
			otherCPU: num(14), steal: num(15), caddyCPU: num(16), redisCPU: num(17), genCPU: num(18), redisCalls: num(19),
			redisUsec: num(20)}
		out[s.target] = append(out[s.target], s)
	})
	return out, err
}

func readDecide(path string) ([]decideRun, error) {
	var out []decideRun
	err := readRows(path, 8, func(fs []string, num func(int) float64) {
		r, _ := strconv.Atoi(fs[0])
		out = append(out, decideRun{round: r, kase: fs[1], keys: fs[2], fn: fs[3],
			calls: num(4), usec: num(5), cpuUs: num(6), other: num(7)})
	})
	return out, err
}

// readRows calls row with the fields of each line of a table of
// whitespace-separated fields that has at least minFields fields, but its
// header (its first field "round"); num reads a field as a number (NaN
// when it is missing or not one).
func readRows(path string, minFields int, row func(fs []string, num func(int) float64)) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < minFields || fs[0] == "round" {
			continue
		}
		row(fs, func(i int) float64 {
			if i >= len(fs) {
				return math.NaN()
			}
			v, err := strconv.ParseFloat(fs[i], 64)
			if err != nil {
				return math.NaN()
			}
			return v
		})
	}
	return sc.Err()
}

// goBench is one line of `go test -bench` output.
type goBench struct {
	pkg, name             string
	ns, bytesOp, allocsOp float64
	hasMem                bool
	cpuUs                 float64 // the cpu-µs/op metric (redisstore's), NaN if none
}

// A benchmark's name opens its line; its result may come on a later line
// when the code under test logs in between (go test merges the streams).
// Metrics a benchmark reports itself come between ns/op and B/op.
var (
	benchName   = regexp.MustCompile(`^(Benchmark\S+)`)
	benchResult = regexp.MustCompile(`^\s*\d+\s+([\d.]+) ns/op`)
	benchMem    = regexp.MustCompile(`\s([\d.]+) B/op\s+([\d.]+) allocs/op`)
	benchCPU    = regexp.MustCompile(`\s([\d.]+) cpu-µs/op`)
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
		b := goBench{pkg: pkg, name: pending, cpuUs: math.NaN()}
		pending = ""
		b.ns, _ = strconv.ParseFloat(m[1], 64)
		if mm := benchMem.FindStringSubmatch(line); mm != nil {
			b.hasMem = true
			b.bytesOp, _ = strconv.ParseFloat(mm[1], 64)
			b.allocsOp, _ = strconv.ParseFloat(mm[2], 64)
		}
		if mc := benchCPU.FindStringSubmatch(line); mc != nil {
			b.cpuUs, _ = strconv.ParseFloat(mc[1], 64)
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
